r"""Sinkhorn attention that is causal in information: row :math:`i` from the balanced plan of the prefix.

Causal Sinkhorn (``"sinkhorn"`` under a causal mask, docs/theory/causal.md) scales its columns with
sums over every query, so the attention of token :math:`i` depends on later tokens. The variant
``"sinkhorn_prefix"`` solves one problem per prefix instead: row :math:`i` of its matrix is row
:math:`i` of the Sinkhorn plan of tokens :math:`1..i` alone (scores :math:`C_{[1..i],[1..i]}`,
the mask restricted to them, query weights renormalized on the prefix and key targets those of
uniform attention under that mask), so it depends on tokens :math:`1..i` only, whatever follows.
Entries :math:`j > i` are 0 whatever the mask: the variant is causal by construction.

Cost: :math:`n` problems instead of one, of sizes :math:`1, 2, \dots, n`. They are solved as one
batched problem of shape ``(n, n, n)`` (prefix :math:`i` is problem :math:`i` with rows and columns
beyond :math:`i` masked, empty lines of weight 0 that the solver excludes): one call, each
half-iteration vectorized, :math:`n^3` memory and work per half-iteration instead of :math:`n^2`,
the iterations those of the slowest prefix. A flow warm-starts all prefixes from the previous step
(the ``(n, n)`` potentials are returned as ``g``).
"""

from __future__ import annotations

import torch

from sinkflow.attention._marginals import uniform_attention_marginal
from sinkflow.attention._normalizations import solve_sinkhorn
from sinkflow.attention._variants import AttentionVariant, Normalized, _add

__all__ = ["prefix_sinkhorn"]


def _prefix_masks(n: int, mask, device) -> torch.Tensor:
    """``(n, n, n)``: problem ``i`` admits ``(r, c)`` with ``c <= r <= i`` (and the mask's entry)."""
    idx = torch.arange(n, device=device)
    inside = idx[None, :] <= idx[:, None]  # (prefix i, token r): r <= i
    M = inside[:, :, None] & inside[:, None, :] & (idx[None, :, None] >= idx[None, None, :])  # causal within it
    return M if mask is None else M & mask.unsqueeze(-3)


def prefix_sinkhorn(scores: torch.Tensor, n_iter=None, tol=None, max_iter: int = 20_000, *, mask=None, weights=None,
                    init_g=None) -> Normalized:
    r"""Sinkhorn attention causal in information: row :math:`i` from the balanced plan of tokens ``1..i``.

    Parameters
    ----------
    scores : torch.Tensor, shape (..., n, n)
        Square scores of ``n`` tokens in their causal order.
    n_iter : int or None
        Half-iterations of every prefix problem (cold start); None solves each to ``tol``.
    tol, max_iter
        As :func:`sinkflow.solve_sinkhorn` (the tolerance every prefix problem meets).
    mask : bool tensor broadcastable to (..., n, n), optional
        Further restricts the admissible pairs; entries above the diagonal are excluded whatever it says.
    weights : tensor (..., n), optional
        Token weights (particle masses), renormalized on each prefix; uniform by default.
    init_g : tensor (..., n, n), optional
        Warm start: the potentials ``g`` of a previous call (prefix ``i`` in row ``i``).

    Returns
    -------
    Normalized
        ``attention`` (..., n, n), lower triangular; ``g`` (..., n, n) the prefix problems' column
        potentials; ``n_iter`` the half-iterations of the batched solve; ``converged`` and
        ``marginal_error`` (the worst prefix).

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
    if mask is not None:
        mask = torch.broadcast_to(mask.to(scores.device), scores.shape)
    M = _prefix_masks(n, mask, scores.device)  # (..., n, n, n)
    C = scores.unsqueeze(-3).expand(*scores.shape[:-2], n, n, n)
    batch = M.shape[:-2]
    w = (torch.full((n,), 1.0 / n, dtype=scores.dtype, device=scores.device) if weights is None
         else weights.to(scores.dtype))
    idx = torch.arange(n, device=scores.device)
    a = w.unsqueeze(-2) * (idx[None, :] <= idx[:, None]).to(w.dtype)  # problem i: the weights of tokens 0..i
    a = torch.broadcast_to(a, batch + (n,))
    b = uniform_attention_marginal(M, a, a)  # key targets of uniform attention on each prefix
    a, b = _normalized(a), _normalized(b)  # a problem with no admissible pair: all lines empty, any weights
    res = solve_sinkhorn(C, n_iter, tol, max_iter, mask=M, a=a, b=b, init_g=init_g, warn=False)
    K = res.attention.diagonal(0, -3, -2).transpose(-1, -2)  # row i of problem i
    return Normalized(K, res.g, res.n_iter, res.converged, float(res.marginal_error))


def _normalized(w):
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, 1.0), 1.0 / w.shape[-1])


def _prefix_normalize(C, *, n_iter=None, mask=None, weights=None, tol=1e-9, max_iter=20_000, init_g=None):
    if init_g is not None and tuple(init_g.shape[-2:]) != tuple(C.shape[-2:]):
        init_g = None  # a potential of another variant (or of another size): cold start
    return prefix_sinkhorn(C, n_iter, tol, max_iter, mask=mask, weights=weights, init_g=init_g)


_add(AttentionVariant("sinkhorn_prefix", _prefix_normalize, "dot", None))
