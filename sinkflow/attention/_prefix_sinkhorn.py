r"""Sinkhorn attention that is causal in information: row :math:`i` from the balanced plan of the prefix.

Causal Sinkhorn (``"sinkhorn"`` under a causal mask, docs/theory/causal.md) scales its columns with
sums over every query, so the attention of token :math:`i` depends on later tokens. The variant
``"sinkhorn_prefix"`` solves one problem per prefix instead: row :math:`i` of its matrix is row
:math:`i` of the Sinkhorn plan of tokens :math:`1..i` alone (scores :math:`C_{[1..i],[1..i]}`,
the mask restricted to them, query weights renormalized on the prefix and key targets those of
uniform attention under that mask), so it depends on tokens :math:`1..i` only, whatever follows.
Entries :math:`j > i` are 0 whatever the mask: the variant is causal by construction.

Cost: :math:`n` problems instead of one, of sizes :math:`1, 2, \dots, n`: about :math:`n^3/3` entries
per half-iteration in all against :math:`n^2`, and :math:`n` solver calls. Run to tolerance, prefix
:math:`i + 1` starts from the potentials of prefix :math:`i` (the key potentials of the tokens they
share, 0 for the new one): 2.2-2.5x fewer half-iterations in total than cold starts at n = 32-128
(docs/theory/causal.md). A flow warm-starts every prefix from the previous step (the ``(n, n)``
potentials are returned as ``g``, prefix :math:`i` in row :math:`i`). One batched ``(n, n, n)`` solve
of all prefixes was tried and measured slower from n = 64 on (every prefix waits for the slowest).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sinkflow.attention._marginals import uniform_attention_marginal
from sinkflow.attention._normalizations import solve_sinkhorn
from sinkflow.attention._variants import AttentionVariant, Normalized, _add

__all__ = ["prefix_sinkhorn"]


def prefix_sinkhorn(scores: torch.Tensor, n_iter=None, tol=None, max_iter: int = 20_000, *, mask=None, weights=None,
                    init_g=None, warm_start: bool = True) -> Normalized:
    r"""Sinkhorn attention causal in information: row :math:`i` from the balanced plan of tokens ``1..i``.

    Parameters
    ----------
    scores : torch.Tensor, shape (..., n, n)
        Square scores of ``n`` tokens in their causal order.
    n_iter : int or None
        Half-iterations of every prefix problem, each from a cold start (the result of prefix ``i`` is
        then :func:`sinkflow.sinkhorn` on it); None solves each to ``tol``.
    tol, max_iter
        As :func:`sinkflow.solve_sinkhorn` (the tolerance every prefix problem meets).
    mask : bool tensor broadcastable to (..., n, n), optional
        Further restricts the admissible pairs; entries above the diagonal are excluded whatever it says.
    weights : tensor (..., n), optional
        Token weights (particle masses), renormalized on each prefix; uniform by default.
    init_g : tensor (..., n, n), optional
        Warm start (``n_iter=None``): the ``g`` of a previous call, prefix ``i``'s potentials in row ``i``.
    warm_start : bool
        With ``n_iter=None`` and no ``init_g``: start prefix ``i + 1`` from prefix ``i``'s potentials
        (the same fixed point, 2.2-2.5x fewer half-iterations in total at n = 32-128).

    Returns
    -------
    Normalized
        ``attention`` (..., n, n), lower triangular; ``g`` (..., n, n) the prefixes' column potentials
        (row ``i``: prefix ``i``, zero beyond ``i``); ``n_iter`` the half-iterations of all the prefix solves;
        ``converged`` and ``marginal_error`` (the worst prefix).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.attention import prefix_sinkhorn, solve_sinkhorn
    >>> C = torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> K = prefix_sinkhorn(C).attention
    >>> P3 = solve_sinkhorn(C[:3, :3], mask=torch.ones(3, 3, dtype=torch.bool).tril()).attention
    >>> bool(torch.allclose(K[2, :3], P3[2], atol=1e-8)), float(K[2, 3:].abs().max())   # row 3: prefix 1..3's plan
    (True, 0.0)
    """
    if not isinstance(scores, torch.Tensor) or scores.ndim < 2 or scores.shape[-1] != scores.shape[-2]:
        raise ValueError(f"scores must be a square (..., n, n) tensor of tokens in causal order, got "
                         f"{getattr(scores, 'shape', type(scores))}")
    n = scores.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
    mask = causal if mask is None else torch.broadcast_to(mask.to(scores.device), scores.shape) & causal
    w = (torch.full((n,), 1.0 / n, dtype=scores.dtype, device=scores.device) if weights is None
         else weights.to(scores.dtype))
    rows, potentials, count, converged, error, g = [], [], 0, True, 0.0, None
    for i in range(n):
        C, M = scores[..., :i + 1, :i + 1], mask[..., :i + 1, :i + 1]
        a = _normalized(w[..., :i + 1])
        b = _normalized(uniform_attention_marginal(torch.broadcast_to(M, C.shape), a, a))  # uniform attention's
        start = None
        if n_iter is None and init_g is not None:
            start = init_g[..., i, :i + 1]
        elif n_iter is None and warm_start and g is not None:
            start = torch.cat([g, g.new_zeros(g.shape[:-1] + (1,))], -1)
        res = solve_sinkhorn(C, n_iter, tol, max_iter, mask=M, a=a, b=b, init_g=start, warn=False)
        g = res.g.detach()
        rows.append(F.pad(res.attention[..., i, :], (0, n - i - 1)))
        potentials.append(F.pad(g, (0, n - i - 1)))
        count, converged = count + res.n_iter, converged and res.converged
        error = max(error, float(res.marginal_error))
    return Normalized(torch.stack(rows, -2), torch.stack(potentials, -2), count, converged, error)


def _normalized(w):
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, 1.0), 1.0 / w.shape[-1])


def _prefix_normalize(C, *, n_iter=None, mask=None, weights=None, tol=1e-9, max_iter=20_000, init_g=None):
    if init_g is not None and tuple(init_g.shape[-2:]) != tuple(C.shape[-2:]):
        init_g = None  # a potential of another variant (or of another size): cold start
    return prefix_sinkhorn(C, n_iter, tol, max_iter, mask=mask, weights=weights, init_g=init_g)


_add(AttentionVariant("sinkhorn_prefix", _prefix_normalize, "dot", None))
