r"""How doubly stochastic is an attention matrix, and how fast does Sinkhorn get there.

Measures (docs/theory/normalizations.md and docs/theory/training.md): marginal errors, sorted column sums, KL to the
Sinkhorn projection; the Birkhoff-Hopf contraction bound :math:`\tanh(\Delta/4)^2` per
full iteration, the asymptotic rate :math:`\sigma_2(P)^2` (Knight 2008) and the rate
observed in an error history.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from sinkflow._backend import check_float, check_number, from_torch, leading, lift_half, to_torch
from sinkflow._summary import Summarized, as_numpy, describe_array, number, shape_text

__all__ = [
    "MarginalErrors",
    "marginal_errors",
    "sorted_column_sums",
    "kl_to_sinkhorn",
    "hilbert_diameter",
    "birkhoff_hopf_rate",
    "asymptotic_rate",
    "observed_rate",
]


class MarginalErrors(NamedTuple):
    """Row and column marginal errors (arrays over the batch dimensions).

    ``row = sum_i a_i |sum_j K_ij - 1|`` and ``column = sum_j |sum_i a_i K_ij - b_j|``;
    with uniform weights on a square matrix, ``column`` is the mean of
    ``|column sum - 1|``.

    The ``repr`` of one matrix's errors is the plain ``MarginalErrors(row=..., column=...)``; over a
    batch it summarizes (batch shape, largest and mean errors), never printing the arrays.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.marginal_errors(np.full((4, 3, 3), 1 / 3))
    <MarginalErrors> over a batch of 4, numpy float64
      row: max 0, mean 0; column: max 0, mean 0
    """

    row: object
    column: object

    def _facts(self):
        if np.ndim(self.row) == 0:
            return "of one matrix", [[("row", number(self.row)), ("column", number(self.column))]]
        head = f"over a batch of {shape_text(np.shape(self.row))}, {describe_array(self.row)}"
        row, column = as_numpy(self.row), as_numpy(self.column)
        return head, [[("row", f"max {number(row.max())}, mean {number(row.mean())}"),
                       ("column", f"max {number(column.max())}, mean {number(column.mean())}")]]

    def __repr__(self) -> str:
        if np.ndim(self.row) == 0:
            return f"MarginalErrors(row={self.row!r}, column={self.column!r})"
        return Summarized.__repr__(self)

    _lines = Summarized._lines
    _summary_hint = None
    _html_extra = Summarized._html_extra
    _repr_html_ = Summarized._repr_html_


def _matrix(K, name="K", *others):
    t, numpy_out = leading(K, name, *others)  # torch out if any input (weights included) is torch
    check_float(t, name)
    if t.ndim < 2:
        raise ValueError(f"{name} must have shape (..., n, m), got {tuple(t.shape)}")
    return t, numpy_out


def marginal_errors(K, a=None, b=None) -> MarginalErrors:
    """Marginal errors of an attention matrix against weights ``a`` (queries) and ``b`` (keys).

    Parameters
    ----------
    K : array (..., n, m)
    a, b : arrays (n,) and (m,), optional
        Uniform by default.

    Returns
    -------
    MarginalErrors
        ``(row, column)``, each of shape ``K.shape[:-2]`` (floats for a single matrix).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.marginal_errors(np.array([[1.0, 0.0], [1.0, 0.0]]))
    MarginalErrors(row=0.0, column=1.0)
    """
    t, numpy_out = _matrix(K, "K", a, b)
    n, m = t.shape[-2:]
    a = torch.full((n,), 1.0 / n, dtype=t.dtype, device=t.device) if a is None else to_torch(a, "a", like=t)
    b = torch.full((m,), 1.0 / m, dtype=t.dtype, device=t.device) if b is None else to_torch(b, "b", like=t)
    row = (a * (t.sum(-1) - 1).abs()).sum(-1)
    col = ((a.unsqueeze(-2) @ t).squeeze(-2) - b).abs().sum(-1)
    if numpy_out:
        row, col = row.numpy(), col.numpy()
        if row.ndim == 0:
            row, col = float(row), float(col)
    return MarginalErrors(row, col)


def sorted_column_sums(K):
    """Column sums of ``K`` sorted in increasing order (the Sinkformers RQ1 plot), shape (..., m)."""
    t, numpy_out = _matrix(K)
    return from_torch(t.sum(-2).sort(-1).values, numpy_out)


def kl_to_sinkhorn(K, tol: float = 1e-9):
    r"""KL divergence from a row-stochastic ``K`` to its Sinkhorn (Birkhoff) projection ``S``.

    Returns :math:`\frac1n \sum_{ij} \big(K_{ij} \log(K_{ij}/S_{ij}) - K_{ij} + S_{ij}\big)`, the
    mean row KL, with ``S = sinkhorn(log K)`` (zero entries of ``K`` stay excluded). The
    generalized form (the last two terms cancel when both rows sum to 1) is never negative:
    the plain sum fell below 0 by the projection's own marginal error (-3e-8 on converged
    float32 Sinkhorn attention). Zero iff ``K`` is already doubly stochastic.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> float(sinkflow.kl_to_sinkhorn(np.full((3, 3), 1 / 3))) < 1e-12
    True
    """
    from sinkflow.attention._normalizations import solve_sinkhorn

    t, numpy_out = _matrix(K)
    if bool((t < 0).any()):
        raise ValueError("K must be non-negative")
    support = t > 0
    logK = torch.where(support, t, torch.ones_like(t)).log()
    S = solve_sinkhorn(logK, tol=tol, mask=support, warn=False).attention
    ratio = torch.where(support, t / torch.where(support, S, torch.ones_like(S)), torch.ones_like(t))
    kl = (t * ratio.log() - t + S).sum((-1, -2)) / t.shape[-2]
    return from_torch(kl, numpy_out) if not numpy_out or kl.ndim else float(kl)


def hilbert_diameter(scores):
    r"""Projective (Hilbert) diameter :math:`\Delta` of ``exp(scores)``.

    :math:`\Delta = \max_{i,k}[\max_j (C_{ij} - C_{kj}) - \min_l (C_{il} - C_{kl})]`,
    computed in ``O(n^2 m)`` with chunking over ``i``.
    """
    C, _ = _matrix(scores, "scores")
    C = C.detach()
    best = torch.full(C.shape[:-2], -torch.inf, dtype=C.dtype, device=C.device)
    n = C.shape[-2]
    chunk = max(1, int(2**24 // max(1, n * C.shape[-1])))
    for s in range(0, n, chunk):
        D = C[..., s:s + chunk, None, :] - C[..., None, :, :]  # (..., c, n, m)
        spread = (D.amax(-1) - D.amin(-1)).amax((-1, -2))
        best = torch.maximum(best, spread)
    return best


def birkhoff_hopf_rate(scores):
    r"""Birkhoff-Hopf bound on the contraction of Sinkhorn per full iteration.

    :math:`\lambda^2` with :math:`\lambda = \tanh(\Delta/4)` (Hilbert metric contraction of
    the kernel ``exp(scores)``). Guaranteed but loose; compare :func:`asymptotic_rate`.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> float(sinkflow.birkhoff_hopf_rate(np.zeros((3, 3))))  # rank one: converges at once
    0.0
    """
    C, numpy_out = _matrix(scores, "scores")
    lam = torch.tanh(hilbert_diameter(C) / 4)
    r = lam**2
    return float(r) if numpy_out and r.ndim == 0 else from_torch(r, numpy_out)


def asymptotic_rate(P, a=None, b=None):
    r"""Asymptotic Sinkhorn rate per full iteration, :math:`\sigma_2(M)^2` (Knight 2008).

    ``P`` is the converged matrix (rows sum to 1, ``a^T P = b``) and
    :math:`M = \mathrm{diag}(\sqrt a) P \mathrm{diag}(1/\sqrt b)`, whose top singular value
    is 1; for uniform square problems ``M`` is ``P`` itself.
    """
    t, numpy_out = _matrix(P, "P", a, b)
    n, m = t.shape[-2:]
    a = torch.full((n,), 1.0 / n, dtype=t.dtype, device=t.device) if a is None else to_torch(a, "a", like=t)
    b = torch.full((m,), 1.0 / m, dtype=t.dtype, device=t.device) if b is None else to_torch(b, "b", like=t)
    M = a.sqrt()[..., :, None] * t / b.sqrt()[..., None, :]
    s = torch.linalg.svdvals(lift_half(M)[0]).to(t.dtype)  # no half svd in torch: float32
    r = s[..., 1] ** 2 if min(n, m) > 1 else torch.zeros(t.shape[:-2], dtype=t.dtype, device=t.device)
    return float(r) if numpy_out and r.ndim == 0 else from_torch(r, numpy_out)


def observed_rate(errors, tail: float = 0.5, floor: float = 1e-13) -> float:
    """Geometric rate per full iteration (2 half-iterations) fitted to an error history.

    Uses the errors recorded after row steps (every other entry), keeps the last
    ``tail`` fraction above ``floor`` (rounding noise) and fits a line to log error.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> round(sinkflow.observed_rate(0.5 ** np.arange(40)), 6)  # halves every half-iteration
    0.25
    """
    tail = check_number(tail, "tail", positive=True)
    floor = check_number(floor, "floor", positive=True, allow_zero=True)
    if tail > 1:
        raise ValueError(f"tail must be a fraction in (0, 1], got {tail!r}")
    e = np.asarray(errors, dtype=float)[::2]
    e = e[np.isfinite(e) & (e > floor)]
    if e.size < 3:
        raise ValueError("need at least 3 row-step errors above the floor to fit a rate")
    start = int(len(e) * (1 - tail))
    e = e[min(start, len(e) - 3):]
    slope = np.polyfit(np.arange(len(e)), np.log(e), 1)[0]
    return float(np.exp(slope))
