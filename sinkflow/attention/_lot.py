r"""LOT attention: two entropic transport problems glued through a pivot of ``r`` tokens.

Shahbazi, Thrash, Bai, Hamm, NaderiAlizadeh, Kolouri, "LOTFormer: doubly-stochastic linear
attention via low-rank optimal transport", 2025, arXiv:2509.23436. Queries are coupled to a
pivot measure of ``r`` atoms (uniform weights here), the pivot to the keys, and the two plans
are glued through the pivot:

.. math:: K = K^{(1)} K^{(2)}, \qquad K^{(1)} = \mathrm{Sinkhorn}(C^{QZ}) \in \mathbb R^{n \times r},
          \quad K^{(2)} = \mathrm{Sinkhorn}(C^{ZK}) \in \mathbb R^{r \times n},

with :math:`K^{(1)}` rows summing to 1 and columns to :math:`n/r`, :math:`K^{(2)}` rows to 1 and
columns to :math:`r/n` (:func:`sinkflow.solve_sinkhorn` with uniform marginals): rows of
:math:`K` sum to :math:`K^{(1)} K^{(2)} 1 = 1`, columns to :math:`\tfrac nr \cdot \tfrac rn = 1`, so
:math:`K` is doubly stochastic to the inner solver's tolerance and has rank at most ``r``
(:math:`O(n r)` to apply to values without forming it).

The paper's pivot is ``r`` learned points. A variant here has no parameters and receives a
score matrix, so the pivot is ``r`` of the tokens themselves (evenly spaced indices): the
query-to-pivot scores are the columns :math:`C_{:, J}`, the pivot-to-key scores the rows
:math:`C_{J, :}` (the pivot token as a query), which is consistent for self-attention (particle
flows, the heat layer, self-attention in models). Choosing tokens by index is not
permutation-equivariant; docs/theory/doubly_stochastic_variants.md says what that costs.
"""

from __future__ import annotations

import torch

from sinkflow._checks import check_number
from sinkflow.attention._normalizations import solve_sinkhorn
from sinkflow.attention._variants import AttentionVariant, Normalized, _add, compute_dtype

__all__ = ["lot_attention", "LOT_RANK"]

#: The pivot size of the registered ``"lot"`` variant.
LOT_RANK = 16


def _pivots(n: int, rank: int, device) -> torch.Tensor:
    return torch.unique(torch.linspace(0, n - 1, min(rank, n), device=device).round().long())


def _glue(C, rank, pivots, n_iter, tol, max_iter):
    J = _pivots(C.shape[-1], rank, C.device) if pivots is None else torch.as_tensor(pivots, device=C.device)
    first = solve_sinkhorn(C[..., :, J], n_iter, tol, max_iter, warn=False)
    second = solve_sinkhorn(C[..., J, :], n_iter, tol, max_iter, warn=False)
    K = first.attention @ second.attention
    error = max(float(torch.as_tensor(r.marginal_error).max()) for r in (first, second))
    converged = bool(torch.as_tensor(first.converged).all()) and bool(torch.as_tensor(second.converged).all())
    return Normalized(K, None, int(torch.as_tensor(first.n_iter).max()) + int(torch.as_tensor(second.n_iter).max()),
                      converged, error)


def lot_attention(scores: torch.Tensor, rank: int = LOT_RANK, *, pivots=None, n_iter: int | None = None,
                  tol: float | None = None, max_iter: int = 20_000) -> torch.Tensor:
    r"""LOTFormer's glued plan :math:`K^{(1)} K^{(2)}` of self-attention scores, pivot = ``rank`` tokens.

    Parameters
    ----------
    scores : torch.Tensor, shape (..., n, n)
        Self-attention scores :math:`C` (row ``i``: token ``i`` as a query, column ``j``: as a key).
    rank : int
        Pivot size ``r`` (``min(rank, n)`` evenly spaced tokens).
    pivots : index tensor (r,), optional
        The pivot tokens, instead of evenly spaced ones.
    n_iter, tol, max_iter
        The inner Sinkhorn solves (:func:`sinkflow.solve_sinkhorn`): ``n_iter=None`` solves each
        to ``tol`` (its default per dtype).

    Returns
    -------
    torch.Tensor, shape (..., n, n)
        Rank at most ``r``, doubly stochastic to the inner tolerance; in the scores' dtype
        (computed in float32 at least).

    Examples
    --------
    >>> import torch, sinkflow
    >>> C = torch.randn(2, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> K = sinkflow.lot_attention(C, rank=3, tol=1e-12)
    >>> float((K.sum(-1) - 1).abs().max()) < 1e-10, float((K.sum(-2) - 1).abs().max()) < 1e-10
    (True, True)
    >>> int(torch.linalg.matrix_rank(K[0]))
    3
    """
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch tensor, got {type(scores).__name__}")
    if scores.ndim < 2 or scores.shape[-1] != scores.shape[-2]:
        raise ValueError(f"scores must be square self-attention scores (..., n, n) (the pivot tokens are both "
                         f"queries and keys), got {tuple(scores.shape)}")
    rank = check_number(rank, "rank", integer=True, positive=True)
    dtype = compute_dtype(scores)
    with torch.autocast(device_type=scores.device.type, enabled=False):
        K = _glue(scores.to(dtype), rank, pivots, n_iter, tol, max_iter).attention
    return K.to(scores.dtype)


def _lot(C, *, n_iter=None, mask=None, weights=None, tol=None, max_iter=20_000, init_g=None):
    if mask is not None and not bool(torch.as_tensor(mask).all()):
        raise NotImplementedError("attention 'lot' takes no mask (the pivot tokens are chosen among all tokens); "
                                  "pass mask=None")
    if weights is not None:
        raise NotImplementedError("attention 'lot' has uniform marginals only; pass weights=None")
    if C.shape[-1] != C.shape[-2]:
        raise ValueError(f"attention 'lot' needs square self-attention scores, got {tuple(C.shape)}")
    return _glue(C, LOT_RANK, None, n_iter, tol, max_iter if max_iter is not None else 20_000)


_add(AttentionVariant("lot", _lot, "dot"))
