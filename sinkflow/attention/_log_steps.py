"""Sinkhorn's half-steps in the log domain: a masked SoftMax of the scores with a potential, over
rows or over columns, that returns the matrix and the exact potential. Both dense operators
(:mod:`sinkflow.attention._operators`) use them: the log-domain one, and the kernel-domain one
whenever it re-exponentiates.
"""

from __future__ import annotations

import math

import torch

from sinkflow._backend import branch_free, exp_floor

__all__ = []


def _colsum(a, P):
    """Weighted column sums ``a^T P`` over the last two dims, as a batched matrix product."""
    return (a.unsqueeze(-2) @ P).squeeze(-2)


def _masked_softmax(T, mask):
    """Row SoftMax of ``T`` (torch's fused kernel) and ``T`` with inadmissible entries at -inf.

    A row with no admissible entry is zero (not NaN).
    """
    if mask is None:
        return torch.softmax(T, -1), T
    T = T.masked_fill(~mask, -math.inf)
    return torch.softmax(T, -1).masked_fill(~mask.any(-1, keepdim=True), 0.0), T


def _row_softmax(T, mask):
    """Row SoftMax of ``T`` and the log scaling ``f = -logsumexp``.

    ``f`` is read off the result, ``f_i = log max_j P_ij - max_j T_ij``, which costs two
    cheap reductions instead of a second pass of exponentials. Rows with no admissible
    entry are zero with ``f = 0``.
    """
    P, T = _masked_softmax(T, mask)
    mx = T.amax(-1)
    if mask is not None:
        mx = mx.masked_fill(~mask.any(-1), 0.0)
    pmax = P.amax(-1)
    f = torch.where(pmax > 0, torch.log(torch.where(pmax > 0, pmax, torch.ones_like(pmax))) - mx, torch.zeros_like(mx))
    return P, f


def _row_step_log(C, scale, g, mask):
    if scale == 1.0 and not branch_free() and not bool(g.detach().any()):  # (a sync: not under compile / torch.func)
        return _row_softmax(C, mask)  # cold start: SoftMax of the scores, no shifted copy
    T = torch.add(g[..., None, :], C, alpha=scale) if scale != 1.0 else C + g[..., None, :]
    return _row_softmax(T, mask)


def _col_step_log(C, scale, f, a, b, mask):
    """Column step in the log domain: ``g_j = log b_j - logsumexp_i(log a_i + s C_ij + f_i)``.

    Returns ``(P, g)``; columns with no admissible entry (or ``b_j = 0``) are zero, ``g_j = 0``.
    """
    T = torch.add(f[..., :, None], C, alpha=scale) if scale != 1.0 else C + f[..., :, None]
    if mask is not None:
        T = T.masked_fill_(~mask, -math.inf)  # T is a fresh buffer
    inplace = not T.requires_grad  # amax's backward needs T unmodified
    mx = T.amax(dim=-2, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    E = T.sub_(mx) if inplace else T - mx
    E = E.clamp_min_(exp_floor(T.dtype)).exp_() if inplace else E.clamp_min(exp_floor(T.dtype)).exp()
    if mask is not None:
        E = E.masked_fill_(~mask, 0.0) if inplace else E.masked_fill(~mask, 0.0)
    c = a.unsqueeze(-2) @ E  # weighted column sums as a matrix product: no n x m temporary
    target = b[..., None, :]
    ok = (c > 0) & (target > 0)
    c_safe = torch.where(ok, c, torch.ones_like(c))
    factor = torch.where(ok, target / c_safe, torch.zeros_like(c))
    P = E.mul_(factor) if inplace else E * factor
    g = torch.where(ok, torch.log(torch.where(ok, target, torch.ones_like(target))) - torch.log(c_safe) - mx,
                    torch.zeros_like(c))
    return P, g.squeeze(-2)


def _flush_limits(C) -> tuple[float, float]:
    """``(safe, growth_limit)`` for the multiplicative steps on ``C``'s dtype and shape.

    Flushed entries are at most e * tiny (see ``exp_floor``): a line sum below ``safe`` may
    be polluted by them beyond rounding, so take a log step instead. Flushed entries may since
    have grown by ``exp(growth)``: past ``growth_limit``, re-exponentiate before they matter.
    """
    finfo = torch.finfo(C.dtype)
    size = max(C.shape[-2], C.shape[-1])
    return 3.0 * finfo.tiny / finfo.eps * size, math.log(finfo.eps / (3.0 * finfo.tiny)) - math.log(size)
