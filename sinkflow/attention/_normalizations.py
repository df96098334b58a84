r"""Attention normalizations: SoftMax and log-stable Sinkhorn.

Notation (docs/theory/normalizations.md). Scores :math:`C` of shape ``(..., n, m)``, query weights
:math:`a` (``n``), key weights :math:`b` (``m``), uniform by default. Sinkhorn returns

.. math:: K_{ij} = \exp(f_i + C_{ij} + g_j), \qquad \sum_j K_{ij} = 1, \qquad \sum_i a_i K_{ij} = b_j,

so :math:`\pi = \mathrm{diag}(a) K` is the entropic optimal transport plan between
:math:`a` and :math:`b` for the cost :math:`-C` and regularization 1
(``ot.sinkhorn(a, b, -C, reg=1)``). For square uniform problems :math:`K` is doubly
stochastic. Half-iterations alternate a row step (``f``) and a column step (``g``),
starting with a row step from ``g = 0``: one half-iteration is exactly SoftMax.

How the solver stays stable and fast
------------------------------------
The potentials ``f, g`` live in the log domain and every step that could lose accuracy
is a log-sum-exp step. Between such steps the matrix :math:`K` itself is rescaled
multiplicatively (one reduction and one scaling pass instead of ``n m`` exponentials),
which is exact to rounding as long as (i) the marginal about to be divided is far above
the underflow threshold and (ii) entries that underflowed at the last exponentiation
cannot have grown back into relevance. Both are checked at every half-iteration; when
either fails the solver re-exponentiates from ``C + f + g`` (the absorption trick of
Schmitzer 2019). The result never contains NaN or inf, at any temperature. Without autograd
the rescaling is not even applied: the matrix is kept as ``diag(u) K diag(v)`` and each
half-step is one matrix-vector product with ``K`` (:mod:`sinkflow.attention`, within
1.3x of that kernel-domain floor, docs/performance.md); under autograd each half-step's matrix
is kept for the backward. A symmetric problem (square symmetric scores, ``a = b``) starts from
the symmetric fixed point's guess instead of the epsilon-scaling schedule.

Exponent arguments (after subtracting the line maximum) are clamped one unit above the
logarithm of the smallest normal number: float32 ``exp`` is ~9x slower on arguments below
-87 (docs/performance.md), and the clamp changes each entry by less than 3x the float's
smallest normal, far below the resolution of any line sum that is used.

Run-to-tolerance (``n_iter=None``) is accelerated three ways, all converging to the same
(unique) fixed point: epsilon scaling (the scores are multiplied by an increasing schedule
``s_0 < s_1 < ... < 1``, factor 4 between stages, warm-starting the scaled potentials, as
geomloss does; each stage solved to a tolerance that tightens with the multiplier);
over-relaxation with ``omega`` adapted to the observed rate; and Newton steps on the dual
whenever the observed rate predicts more than a few hundred further half-iterations. The
Newton system is Jacobi-scaled (tiny masses no longer make it singular) and gauge-fixed,
and solved densely for small problems, by a sparse factorization when the plan is nearly
sparse (cold problems, any size) and by conjugate gradients otherwise. A stage that stalls
is split in two. Measured on 40 x 40 Gaussian scores at tolerance 1e-9: scores x30 in 466
half-iterations (plain: 9,178); on POT's cold 1D test problem (100 bins, ``reg = 1e-3``)
in 544 half-iterations and 54 Newton steps, where the plain loop stalls at error 2e-3.

Precision: the default tolerance follows the dtype (:func:`default_tolerance`); float16 and
bfloat16 are solved in float32. A solve that cannot reach its tolerance says so (a
:class:`SinkhornWarning`, ``converged=False``) as soon as its rate shows it, instead of
spinning to ``max_iter``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sinkflow._backend import check_finite, check_float, check_number, exp_floor, from_torch, leading, to_torch
from sinkflow.attention._kernel_sinkhorn import _max_over_batch, _Monitor, iterate_kernel

__all__ = ["softmax", "sinkhorn", "solve_sinkhorn", "SinkhornResult", "SinkhornWarning", "default_tolerance",
           "attainable_error"]


class SinkhornWarning(UserWarning):
    """Issued when a run-to-tolerance solve cannot deliver ``tol``.

    Either up front (``tol`` below what the dtype can reach) or at the end (the error
    stalled, or ``max_iter`` ran out); the result then has ``converged=False``.
    """


@dataclass(frozen=True)
class SinkhornResult:
    """Everything a Sinkhorn solve knows, returned instead of printed.

    Attributes
    ----------
    attention : array, shape (..., n, m)
        The normalized matrix :math:`K` (rows sum to 1, :math:`a^T K = b`).
    f, g : arrays, shapes (..., n) and (..., m)
        Log potentials, :math:`K = \\exp(f_i + C_{ij} + g_j)`. Entries of queries (keys)
        excluded by the mask are 0.
    n_iter : int
        Half-iterations performed (all epsilon-scaling stages counted).
    converged : bool
        Whether ``marginal_error <= tol``.
    marginal_error : float
        Final :math:`\\max(\\sum_i a_i |\\sum_j K_{ij} - 1|, \\sum_j |\\sum_i a_i K_{ij} - b_j|)`,
        the largest over batch entries.
    errors : numpy.ndarray
        Marginal error after each half-iteration (the L1 error of the plan's column marginal
        after a row step, and vice versa; with over-relaxation the larger of both). Newton
        polishing steps, when they run, append one entry each.
    scales : numpy.ndarray
        Score multiplier of each half-iteration (all ones without epsilon scaling).
    tol : float
        The tolerance the convergence flag refers to.
    a, b : arrays
        The query and key weights used (after masking and renormalization).
    """

    attention: Any
    f: Any
    g: Any
    n_iter: int
    converged: bool
    marginal_error: float
    errors: np.ndarray
    scales: np.ndarray
    tol: float
    a: Any
    b: Any

    @property
    def plan(self):
        """The transport plan ``a_i K_ij`` (computed on demand)."""
        return self.a[..., :, None] * self.attention


# ----------------------------------------------------------------------------------------
# input checks


_MASK_HINT = "use a mask (True = admissible) to exclude entries"


def _prepare(scores, mask, a, b, init_g=None):
    if not isinstance(scores, torch.Tensor) and not np.issubdtype(np.asarray(scores).dtype, np.floating):
        raise TypeError(f"scores must have a floating dtype, got numpy {np.asarray(scores).dtype}; convert "
                        "explicitly (e.g. x.astype(float)) so precision is your choice.")
    C, numpy_out = leading(scores, "scores", mask, a, b, init_g)  # torch out if any input is torch
    check_float(C, "scores")
    if C.ndim < 2:
        raise ValueError(f"scores must have shape (..., n, m) with at least 2 dimensions, got shape {tuple(C.shape)}")
    n, m = C.shape[-2], C.shape[-1]
    if n == 0 or m == 0:
        raise ValueError(f"scores must be non-empty, got shape {tuple(C.shape)}")
    if mask is not None:
        mask = to_torch(mask, "mask").to(C.device)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be boolean (True = attend), got dtype {mask.dtype}")
        try:
            mask = torch.broadcast_to(mask, C.shape)
        except RuntimeError as err:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to scores {tuple(C.shape)}") from err
        check_finite(C.detach().masked_fill(~mask, 0.0), "scores (unmasked entries)", _MASK_HINT)
    else:
        check_finite(C.detach(), "scores", _MASK_HINT)
    a = _weights(a, n, C, "a", "queries")
    b = _weights(b, m, C, "b", "keys")
    return C, mask, a, b, numpy_out


def _weights(w, size, C, name, what):
    dtype = _compute_dtype(C.dtype)
    if w is None:
        return torch.full((size,), 1.0 / size, dtype=dtype, device=C.device)
    w = to_torch(w, name).to(device=C.device)
    check_float(w, name)
    if w.ndim == 0 or w.shape[-1] != size:
        raise ValueError(f"weights {name} must have last dimension {size} (one per {what}), got shape {tuple(w.shape)}")
    check_finite(w, name)
    if bool((w < 0).any()):
        raise ValueError(f"weights {name} must be non-negative")
    total = w.double().sum(-1)  # checked in the precision the weights were given in
    atol = 1e-10 if w.dtype == torch.float64 else max(1e-6, 4 * torch.finfo(w.dtype).eps)
    if not bool(torch.allclose(total, torch.ones_like(total), rtol=0, atol=atol)):
        raise ValueError(f"weights {name} must sum to 1 along the last dimension (sums: {total.detach().cpu().numpy()})")
    return w.to(dtype)


def _effective_weights(a, b, mask, shape):
    """Broadcast weights to the batch; queries (keys) with no admissible key (query) get 0."""
    batch = shape[:-2]
    try:
        a = torch.broadcast_to(a, batch + a.shape[-1:]).clone()
        b = torch.broadcast_to(b, batch + b.shape[-1:]).clone()
    except RuntimeError as err:
        raise ValueError(f"weights a {tuple(a.shape)} and b {tuple(b.shape)} must broadcast to the batch shape "
                         f"{tuple(batch)} of the scores {tuple(shape)}") from err
    if mask is not None:
        a = a * mask.any(-1)
        b = b * mask.any(-2)
        sa = a.sum(-1, keepdim=True)
        sb = b.sum(-1, keepdim=True)
        a = torch.where(sa > 0, a / torch.where(sa > 0, sa, 1), a)
        b = torch.where(sb > 0, b / torch.where(sb > 0, sb, 1), b)
    return a, b


def _exclude_empty_lines(mask, a, b):
    """The mask with every line of weight 0 (``a_i = 0`` or ``b_j = 0``) excluded, or ``mask`` itself.

    A line of weight 0 must be exactly empty and leave the other lines as if it were not
    there, from the first half-step on: the first row step (SoftMax) would otherwise spread
    mass onto a column of weight 0 and shift every row potential, and the multiplicative
    column step cannot take that mass back (its factor ``b_j / c_j`` is kept at 1 where
    ``b_j = 0``). Excluded like a masked line, it is absent from every step (log-domain,
    multiplicative, Newton, epsilon-scaling schedule) and from the gradients. One sync when
    no weight is zero.
    """
    if bool(torch.minimum(a.amin(), b.amin()) > 0):
        return mask
    keep = (a > 0)[..., :, None] & (b > 0)[..., None, :]
    return keep if mask is None else mask & keep


# ----------------------------------------------------------------------------------------
# numerical kernels


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
    if scale == 1.0 and not bool(g.detach().any()):
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
    g = torch.where(ok, torch.log(torch.where(ok, target, torch.ones_like(target))) - torch.log(c_safe) - mx, torch.zeros_like(c))
    return P, g.squeeze(-2)


def _colsum(a, P):
    """Weighted column sums ``a^T P`` over the last two dims, as a batched matrix product."""
    return (a.unsqueeze(-2) @ P).squeeze(-2)


#: Whether no-autograd solves iterate in the kernel domain (the tests switch it off to compare).
_KERNEL_DOMAIN = True


def _iterate(C, scale, f, g, a, b, mask, n_half, tol, state, inplace, record, P0=None, trace=None, patience=None):
    """Run ``n_half`` half-iterations (or until ``tol``) on the problem with scores ``scale * C``.

    ``state`` holds the half-step parity and counters across epsilon-scaling stages. With
    ``state["accelerate"]`` the steps are over-relaxed (``omega`` in [1, 2)), with ``omega``
    set from the observed plain rate (see ``sinkflow.attention._relaxation``).

    Without autograd (``inplace``) the half-steps run in the kernel domain, one matrix-vector
    product each (:func:`sinkflow.attention.iterate_kernel`). Under autograd every
    half-step's matrix is kept for the backward: then each costs one reduction and one scaling
    pass over ``P``, and the line sums that measure the error after a step are exactly those
    the next step divides by, so they are kept (``sums``) rather than recomputed.

    ``P0`` starts from a matrix consistent with ``(f, g)``; ``trace`` (a list) collects
    ``(P, line_factor, row_step)`` after each half-step for :class:`_UnrolledSinkhorn`.
    With ``patience``, the loop gives up early (``state["slow"] = True``) when the observed
    rate predicts more than ``patience`` further half-steps to reach ``tol``, or more than the
    budget left (see ``sinkflow.attention._predicted_steps``), so that the caller can
    switch to Newton steps or stop instead of spinning.
    """
    if inplace and P0 is None and trace is None and _KERNEL_DOMAIN:
        return iterate_kernel(C, scale, f, g, a, b, mask, n_half, tol, state, record, patience)
    dtype = C.dtype
    finfo = torch.finfo(dtype)
    n, m = C.shape[-2], C.shape[-1]
    # Flushed entries are at most e * tiny (see exp_floor). A line sum below `safe` may be
    # polluted by them beyond rounding: take a log step instead.
    safe = 3.0 * finfo.tiny / finfo.eps * max(n, m)
    # Flushed entries may since have grown by exp(growth); re-exponentiate before they matter.
    growth_limit = math.log(finfo.eps / (3.0 * finfo.tiny)) - math.log(max(n, m))
    active_rows = a > 0
    active_cols = b > 0
    ones_r = active_rows.to(dtype)
    P = P0
    sums = None  # line sums of the current P along the next step's direction, if known
    f_ref, g_ref = f, g  # potentials at the last exponentiation
    done = 0
    mon = _Monitor(a, b, scale, tol, state, record, patience)
    err = torch.full((), math.inf, dtype=dtype, device=C.device)
    while done < n_half:
        omega = mon.omega
        row_step = state["next"] == "row"
        active = active_rows if row_step else active_cols
        need_log = P is None
        if not need_log:
            if sums is None:
                sums = P.sum(-1) if row_step else _colsum(a, P)
            # One sync: smallest active line sum and how far flushed entries may have grown.
            checks = torch.stack([
                torch.where(active, sums, torch.full_like(sums, math.inf)).amin().detach(),
                ((f - f_ref).amax() + (g - g_ref).amax()).detach(),
            ]).tolist()
            need_log = checks[0] < safe or checks[1] > growth_limit
            state["fallbacks"] = state.get("fallbacks", 0) + int(need_log)
        if row_step:
            if need_log:
                P = None  # release before the log step allocates
                P, f_full = _row_step_log(C, scale, g, mask)
                delta = f_full - f
                f_ref, g_ref = f_full, g
                factor = torch.exp((omega - 1.0) * delta) if omega != 1.0 else None
            else:
                r = torch.where(active, sums, torch.ones_like(sums))
                delta = -torch.log(r)
                factor = torch.exp(omega * delta) if omega != 1.0 else 1.0 / r
            if factor is not None:
                P = P.mul_(factor[..., None]) if inplace else P * factor[..., None]
            f = f + omega * delta
        else:
            if need_log:
                P = None
                P, g_full = _col_step_log(C, scale, f, a, b, mask)
                delta = g_full - g
                f_ref, g_ref = f, g_full
                factor = torch.exp((omega - 1.0) * delta) if omega != 1.0 else None
            else:
                c = torch.where(active, sums, torch.ones_like(sums))
                delta = torch.where(active, torch.log(b) - torch.log(c), torch.zeros_like(c))
                factor = torch.exp(omega * delta)
            if factor is not None:
                P = P.mul_(factor[..., None, :]) if inplace else P * factor[..., None, :]
            g = g + omega * delta
        if trace is not None:
            trace.append((P, torch.exp(delta), row_step))
        done += 1
        state["count"] += 1
        state["next"] = "col" if row_step else "row"
        if not mon.wanted:
            sums = None  # no diagnostics wanted: the next step sums for itself
            continue
        # Error of the marginal not just normalized, from the sums the next step needs anyway.
        if row_step:
            sums = _colsum(a, P)
            e = (sums - b).abs().sum(-1)
        else:
            sums = P.sum(-1)
            e = (a * (sums - ones_r).abs()).sum(-1)
        err, stop = mon.after(e, delta, row_step, n_half - done)
        if stop:
            break
    return P, f, g, err


_STAGE_TOL = 1e-3  # loosest tolerance of an intermediate epsilon-scaling stage
_PATIENCE = 400  # predicted half-steps to the tolerance beyond which a stage switches to Newton
_MAX_SPLITS = 8  # epsilon-scaling stages inserted at most after stalls
_NEWTON_ROUNDS = 4  # Newton rounds at most per stage (each ends when it stops improving)
_DENSE_NEWTON = 512  # n + m up to which the Newton system is solved densely (else sparse or CG)


def _dual_state(C, f, g, a, b, mask, high):
    """``K``, line sums, dual value, gradient and marginal error at ``(f, g)``; None on overflow."""
    T = C + f[..., :, None] + g[..., None, :]
    if mask is not None:
        T = T.masked_fill_(~mask, -math.inf)
    if bool((T > high).any()):
        return None
    K = T.clamp_min_(exp_floor(T.dtype)).exp_()
    if mask is not None:
        K = K.masked_fill_(~mask, 0.0)
    r, c = K.sum(-1), _colsum(a, K)
    dual = (a * f).sum(-1) + (b * g).sum(-1) - (a * r).sum(-1)
    row_gap = a * (1.0 - r) * (a > 0)
    grad = torch.cat([row_gap, (b - c) * (b > 0)], -1)
    err = torch.maximum(row_gap.abs().sum(-1), (c - b).abs().sum(-1))
    return K, r, c, dual, grad, err


def _newton_direction(K, a, r, c, grad):
    """Solve the Newton system of the dual, Jacobi-scaled and gauge-fixed.

    The negative Hessian is ``J = [[diag(a r), diag(a) K], [K^T diag(a), diag(c)]]``, the
    signless Laplacian of the bipartite graph weighted by the plan. With ``D = diag(J)``,
    ``D^{-1/2} J D^{-1/2} = I + [[0, B], [B^T, 0]]`` has unit diagonal and eigenvalues in
    ``[0, 2]``: tiny masses no longer make it ill-conditioned (unscaled, its condition number
    reached 1e20 on cold 1D problems). Its null vector ``D^{1/2} (1, -1)`` (the gauge
    ``(f + t, g - t)``, to which the gradient is orthogonal) is removed by adding ``u u^T``.
    What is left is governed by the plan's spectral gap ``1 - sigma_2``, the quantity that
    slows Sinkhorn itself; conjugate gradients need only its square root in iterations.
    """
    n, m = K.shape[-2:]
    d = torch.cat([a * r, c], -1)
    active = d > torch.finfo(d.dtype).tiny / torch.finfo(d.dtype).eps
    root = torch.where(active, d, torch.ones_like(d)).sqrt()
    s = torch.where(active, 1.0 / root, torch.zeros_like(d))
    B = (s[..., :n] * a)[..., :, None] * K * s[..., None, n:]
    sign = torch.cat([torch.ones_like(a), -torch.ones_like(c)], -1)
    u = torch.where(active, root, torch.zeros_like(d)) * sign
    u = u / u.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(d.dtype).tiny)
    ridge = 1e3 * torch.finfo(d.dtype).eps

    def apply(z):
        zf, zg = z[..., :n], z[..., n:]
        coupled = torch.cat([(B @ zg[..., None])[..., 0], (zf[..., None, :] @ B)[..., 0, :]], -1)
        return (1.0 + ridge) * z + coupled + u * (u * z).sum(-1, keepdim=True)

    rhs = s * grad
    if n + m <= _DENSE_NEWTON:
        eye = torch.eye(n + m, dtype=d.dtype, device=d.device)
        top = torch.cat([torch.zeros_like(B[..., :, :1]).expand(*B.shape[:-1], n), B], -1)
        bottom = torch.cat([B.transpose(-1, -2), torch.zeros_like(B[..., :1, :]).expand(*B.shape[:-2], m, m)], -1)
        J = (1.0 + ridge) * eye + torch.cat([top, bottom], -2) + u[..., :, None] * u[..., None, :]
        L, info = torch.linalg.cholesky_ex(J)
        if not bool(info.any()):
            return s * torch.cholesky_solve(rhs[..., None], L)[..., 0]
    sparse = _sparse_solve(B, rhs, d, active, ridge)
    if sparse is not None:
        return s * sparse
    return s * _conjugate_gradient(apply, rhs)


def _sparse_solve(B, rhs, d, active, ridge, drop=1e-10, max_fill=256):
    """Direct solve of the scaled system with ``B``'s entries below ``drop`` left out.

    At cold temperatures the plan is nearly sparse (a staircase in 1D), its graph a chain
    whose spectral gap is far too small for iterative solvers, while a sparse factorization
    costs about ``O(n + m)``. The gauge is fixed by pinning the variable of largest mass to
    zero (any solution differs from another by a gauge shift). Returns None when the kept
    matrix is not sparse (more than ``max_fill`` entries per line): then the plan is warm and
    conjugate gradients converge fast.
    """
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    n, m = B.shape[-2:]
    Bs = B.detach().cpu().reshape(-1, n, m)
    keep = Bs >= drop
    if int(keep.sum()) > max_fill * (n + m) * Bs.shape[0]:
        return None
    out = torch.zeros_like(rhs).reshape(-1, n + m)
    flat_rhs, flat_d, flat_active = (t.detach().cpu().reshape(-1, n + m) for t in (rhs, d, active))
    for k in range(Bs.shape[0]):
        i, j = torch.nonzero(keep[k], as_tuple=True)
        w = Bs[k, i, j].numpy()
        rows = np.concatenate([i.numpy(), j.numpy() + n, np.arange(n + m)])
        cols = np.concatenate([j.numpy() + n, i.numpy(), np.arange(n + m)])
        vals = np.concatenate([w, w, np.full(n + m, 1.0 + ridge)])
        J = sp.csc_matrix((vals, (rows, cols)), shape=(n + m, n + m))
        pin = int(torch.where(flat_active[k], flat_d[k], torch.zeros_like(flat_d[k])).argmax())
        free = np.flatnonzero(np.arange(n + m) != pin)
        z = spla.spsolve(J[free][:, free], flat_rhs[k].numpy()[free])
        if not np.all(np.isfinite(z)):
            return None
        out[k, torch.from_numpy(free)] = torch.from_numpy(z).to(out.dtype)
    return out.reshape(rhs.shape).to(rhs.device)


def _conjugate_gradient(apply, rhs, rtol=1e-8, max_iter=200):
    """Batched conjugate gradients for an SPD operator (one step size per batch entry)."""
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    p = r.clone()
    rs = (r * r).sum(-1, keepdim=True)
    stop = (rtol ** 2) * rs
    for _ in range(max_iter):
        if bool((rs <= stop).all()):
            break
        Ap = apply(p)
        curvature = (p * Ap).sum(-1, keepdim=True)
        alpha = torch.where(curvature > 0, rs / torch.where(curvature > 0, curvature, 1.0), 0.0)
        x = x + alpha * p
        r = r - alpha * Ap
        rs_new = (r * r).sum(-1, keepdim=True)
        p = r + torch.where(rs > 0, rs_new / torch.where(rs > 0, rs, 1.0), 0.0) * p
        rs = rs_new
    return x


def _newton_polish(C, scale, f, g, a, b, mask, tol, state, max_steps=30):
    """Damped Newton steps on the concave dual ``D(f, g) = <a, f> + <b, g> - sum_ij a_i K_ij``.

    Computed in float64 whatever the input dtype. The step solves the scaled, gauge-fixed
    system of :func:`_newton_direction`; a step is accepted when it satisfies Armijo's
    condition on ``D`` or lowers the marginal error (near the solution of a cold problem the
    dual's increase is below its rounding). Converges quadratically where plain Sinkhorn
    crawls (Brauer et al. 2017). Each step appends its marginal error to ``state``.
    Returns ``(f, g, improved)``.
    """
    work = torch.float64
    n, m = C.shape[-2:]
    C64 = C.detach().to(work) * scale
    a64, b64 = a.to(work), b.to(work)
    f64, g64 = f.detach().to(work), g.detach().to(work)
    high = math.log(torch.finfo(work).max) - math.log(n * m) - 1.0
    current = _dual_state(C64, f64, g64, a64, b64, mask, high)
    if current is None:
        return f, g, False
    start = float(_max_over_batch(current[-1]))
    for _ in range(max_steps):
        K, r, c, dual, grad, err = current
        worst = float(_max_over_batch(err))
        state["errors"].append(worst)
        state["scales"].append(scale)
        if worst <= tol:
            break
        step = _newton_direction(K, a64, r, c, grad)
        slope = (grad * step).sum(-1)
        del K
        accepted, t = None, 1.0
        for _ in range(40):
            trial = _dual_state(C64, f64 + t * step[..., :n], g64 + t * step[..., n:], a64, b64, mask, high)
            if trial is not None and (bool((trial[3] >= dual + 1e-4 * t * slope).all())
                                      or float(_max_over_batch(trial[-1])) < 0.9 * worst):
                accepted = trial
                break
            t *= 0.5
        if accepted is None:
            break
        f64, g64, current = f64 + t * step[..., :n], g64 + t * step[..., n:], accepted
    final = float(_max_over_batch(current[-1]))
    return f64.to(f.dtype), g64.to(g.dtype), final < start


class _UnrolledSinkhorn(torch.autograd.Function):
    """Half-iterations 2..n_iter of a fixed-``n_iter`` solve, with a hand-written backward.

    Forward runs the same stable loop as :func:`_iterate`. Backward applies, from the last
    half-step to the first, the adjoint of a line normalization: for a row step
    ``P' = diag(1/r) P``, ``dP = (G - rowsum(G * P')) / r``; for a column step
    ``P' = P diag(b / c)``, ``dP = (G - a (colsum(G * P') / b)) * (b / c)``. Two passes per
    half-step instead of autograd's four to five (multiply, reduce, expand, add).
    """

    @staticmethod
    def forward(ctx, P1, C, f, g, a, b, mask, n_more, state, record):
        trace = []
        P, f, g, _ = _iterate(C, 1.0, f, g, a, b, mask, n_more, None, state, False, record, P0=P1, trace=trace)
        ctx.trace = trace
        ctx.save_for_backward(a, b)
        ctx.mark_non_differentiable(f, g)
        return P, f, g

    @staticmethod
    def backward(ctx, grad, _gf, _gg):
        a, b = ctx.saved_tensors
        b_inv = torch.where(b > 0, 1.0 / torch.where(b > 0, b, torch.ones_like(b)), torch.zeros_like(b))
        # The first half-step writes a fresh contiguous buffer (never the incoming gradient,
        # which autograd may share); later ones update it in place.
        fresh = True
        for P, factor, row_step in reversed(ctx.trace):
            if row_step:
                s = torch.linalg.vecdot(grad, P, dim=-1)[..., :, None]
                grad = torch.sub(grad.contiguous(), s) if fresh else grad.sub_(s)
                grad.mul_(factor[..., :, None])
            else:
                s = (torch.linalg.vecdot(grad, P, dim=-2) * b_inv)[..., None, :]
                grad = (torch.addcmul(grad.contiguous(), a[..., :, None], s, value=-1.0) if fresh
                        else grad.addcmul_(a[..., :, None], s, value=-1.0))
                grad.mul_(factor[..., None, :])
            fresh = False
        return grad, None, None, None, None, None, None, None, None, None


def _final_error(P, a, b):
    active_rows = (a > 0).to(P.dtype)
    row = (a * (P.sum(-1) - active_rows).abs()).sum(-1)
    col = (_colsum(a, P) - b).abs().sum(-1)
    return float(torch.maximum(_max_over_batch(row.detach()), _max_over_batch(col.detach())))


def _scaling_schedule(C, mask, factor=2.0, start_spread=8.0):
    """Score multipliers s_0 < ... < 1 so that the first stage has a score spread ~``start_spread``."""
    Cd = C.detach()
    if mask is not None:
        hi = Cd.masked_fill(~mask, -math.inf).amax()
        lo = Cd.masked_fill(~mask, math.inf).amin()
    else:
        hi, lo = Cd.amax(), Cd.amin()
    spread = float(hi - lo)
    if not math.isfinite(spread) or spread <= start_spread:
        return [1.0]
    k = math.ceil(math.log(spread / start_spread, factor))
    return [factor ** (-j) for j in range(k, 0, -1)] + [1.0]


_DEFAULT_TOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def _compute_dtype(dtype):
    """float16 and bfloat16 are solved in float32 (their exp and sums are too coarse)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def attainable_error(dtype, n, m=None):
    """Marginal error that rounding alone leaves in a Sinkhorn solve of size ``n x m``.

    About ``4 eps sqrt(max(n, m))`` in the dtype the solve is computed in (float32 for
    float16 and bfloat16 inputs); plus, for those, the rounding of the returned matrix,
    ``eps`` of the half dtype. Measured float32 floors were 0.1-0.9 ``eps sqrt(n)`` for
    n = 8 ... 2048.

    Examples
    --------
    >>> import torch, sinkflow.attention as N
    >>> N.attainable_error(torch.float32, 128) < 1e-5 < N.attainable_error(torch.float32, 10**5)
    True
    """
    dtype = _as_torch_dtype(dtype)
    m = n if m is None else m
    compute = _compute_dtype(dtype)
    floor = 4.0 * torch.finfo(compute).eps * math.sqrt(max(n, m))
    return floor + (torch.finfo(dtype).eps if compute != dtype else 0.0)


def default_tolerance(dtype, n=1, m=None):
    """Default ``tol`` of :func:`solve_sinkhorn` for scores of ``dtype`` and size ``n x m``.

    ============  ==========
    dtype         tolerance
    ============  ==========
    float64       1e-9
    float32       1e-5
    float16       1e-3
    bfloat16      1e-2
    ============  ==========

    raised to :func:`attainable_error` for very large problems.

    Examples
    --------
    >>> import torch, sinkflow.attention as N
    >>> N.default_tolerance(torch.float64), N.default_tolerance(torch.float32)
    (1e-09, 1e-05)
    """
    dtype = _as_torch_dtype(dtype)
    if dtype not in _DEFAULT_TOL:
        raise TypeError(f"Sinkhorn supports float16, bfloat16, float32 and float64 scores, got {dtype}")
    return max(_DEFAULT_TOL[dtype], attainable_error(dtype, n, m))


def _as_torch_dtype(dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch.from_numpy(np.zeros(0, dtype=np.dtype(dtype))).dtype


def _resolve_tolerance(tol, dtype, shape, warn):
    n, m = shape[-2], shape[-1]
    if tol is None:
        return default_tolerance(dtype, n, m)
    tol = check_number(tol, "tol", positive=True, allow_zero=True)
    if tol == 0:
        return 0.0  # POT's stopThr=0: no stopping test, max_iter half-iterations
    floor = attainable_error(dtype, n, m)
    if tol < floor:
        if warn:
            warnings.warn(
                f"tol={tol:g} is below the marginal error {dtype} can reach for {n} x {m} scores "
                f"(about {floor:.1g}); solving to {floor:.1g} instead. Pass float64 scores for tighter "
                "solutions.", SinkhornWarning, stacklevel=3)
        return floor
    return float(tol)


def _symmetric_start(C, mask, a, b, rtol=1e-6):
    r"""The natural start of a symmetric problem, or None when the problem is not symmetric.

    Square scores equal to their transpose (to ``rtol`` of their range; the start is only a
    guess), a symmetric mask (or none) and ``a = b``: the solution's plan is symmetric,
    :math:`a_i K_{ij} = e^{h_i + C_{ij} + h_j}` with :math:`e^{h_i} \sum_j e^{C_{ij} + h_j} = a_i`,
    and for a kernel concentrated near the diagonal :math:`h_j \approx h_i` gives
    :math:`g_j = h_j \approx \frac12 (\log b_j - \operatorname{logsumexp}_i C_{ji})`. From it no
    epsilon-scaling schedule is needed: measured on Gaussian scores of 300-2,000 normal points
    (1D and 2D, temperatures 0.005-0.02) 51-376 half-iterations and 0-3 Newton steps instead of
    269-512 and 0-13, 1.3-30x less time (docs/performance.md).
    """
    n, m = C.shape[-2:]
    if n != m or not torch.equal(a, b) or (mask is not None and not torch.equal(mask, mask.mT)):
        return None
    Cd = C.detach()
    T = Cd if mask is None else Cd.masked_fill(~mask, 0.0)
    scale = rtol * max(float(T.abs().amax()), 1.0)
    if float((T - T.mT).abs().amax()) > scale:
        return None
    # The guess is for kernels concentrated near the diagonal: C_ii + C_jj - 2 C_ij >= 0 (a squared
    # distance, whatever diagonal scaling). Random symmetric scores fail it; there the start saved
    # half-iterations but cost more Newton steps (x1000: 101 + 44 instead of 382 + 17, 2.4x the time).
    d = torch.diagonal(T, dim1=-2, dim2=-1)
    if float((d.unsqueeze(-1) + d.unsqueeze(-2) - 2.0 * T).amin()) < -scale:
        return None
    if mask is not None:
        T = Cd.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(T, dim=-1)
    ok = (b > 0) & torch.isfinite(lse)
    return torch.where(ok, 0.5 * (torch.log(torch.where(ok, b, torch.ones_like(b))) - torch.where(ok, lse, 0.0)),
                       torch.zeros_like(b))


def _check_counts(n_iter, max_iter):
    check_number(n_iter, "n_iter (half-iterations)", integer=True, positive=True, allow_none=True)
    check_number(max_iter, "max_iter", integer=True, positive=True)


def _initial_g(init_g, C):
    g = torch.zeros(C.shape[:-2] + C.shape[-1:], dtype=C.dtype, device=C.device)
    if init_g is None:
        return g
    g0 = to_torch(init_g, "init_g", like=C).detach()
    check_finite(g0, "init_g")
    try:
        return (g + g0).contiguous()
    except RuntimeError as err:
        raise ValueError(f"init_g of shape {tuple(g0.shape)} does not broadcast to {tuple(g.shape)}") from err


def _fixed_iterations(C, f, g, a, b, mask, n_iter, state, inplace, record):
    """Exactly ``n_iter`` half-iterations; under autograd with a hand-written backward."""
    if inplace or n_iter == 1:
        P, f, g, _ = _iterate(C, 1.0, f, g, a, b, mask, n_iter, None, state, inplace, record)
        return P, f, g, state
    # Differentiable: the first (SoftMax) step by autograd, the rest hand-differentiated.
    P1, f, g, _ = _iterate(C, 1.0, f, g, a, b, mask, 1, None, state, False, record)
    P, f, g = _UnrolledSinkhorn.apply(P1, C.detach(), f.detach(), g.detach(), a, b, mask, n_iter - 1, state, record)
    if state.get("fallbacks"):
        # A log-domain step re-exponentiated C: differentiating through P alone would divide
        # by underflowed line sums. Redo the solve under plain autograd.
        state = {"next": "row", "count": 0, "errors": [], "scales": [], "check": False, "accelerate": False}
        f, g = torch.zeros_like(f), torch.zeros_like(g)
        P, f, g, _ = _iterate(C, 1.0, f, g, a, b, mask, n_iter, None, state, False, record)
    return P, f, g, state


def _failure_message(state, err, tol, max_iter, dtype):
    if "stalled" in state:
        why = (f"stopped after {state['count']} half-iterations: the error stalled at {state['stalled']:.3g}, "
               "above tol")
    elif state["count"] >= max_iter:
        why = f"stopped at max_iter={max_iter} half-iterations"
    else:
        why = "converged, but rounding the result to its dtype moved the marginals"
    return (f"Sinkhorn {why} (marginal error {err:.3g} > tol={tol:g}, {dtype}); loosen tol, raise max_iter, "
            "or use float64 scores.")


def _stage_tolerance(tol, scale):
    """Tolerance of an intermediate epsilon-scaling stage at score multiplier ``scale`` < 1.

    Follows the scale: loose while the problem is warm (its solution is only a start), down
    to ``tol / scale`` near the end, so that the last stage starts where little is left.
    """
    return min(_STAGE_TOL, max(tol, tol / scale))


def _solve_stage(C, scale, f, g, a, b, mask, tol, budget, state, inplace):
    """Reach ``tol`` on the scores ``scale * C`` within ``budget`` half-iterations.

    Accelerated half-iterations first; when their rate predicts more than ``_PATIENCE``
    further half-steps, Newton steps on the dual take over, then half-iterations resume from
    the improved potentials (a log step first). Newton is left out under autograd (the
    iterations are what is differentiated), for the plain loop (``epsilon_scaling=False``)
    and once it stops improving; without it, a stage
    whose rate cannot reach ``tol`` within the budget stops early (``state["stalled"]``).
    """
    start = state["count"]
    newton_rounds = 0 if inplace and state["accelerate"] else _NEWTON_ROUNDS
    while True:
        left = max(budget - (state["count"] - start), 1)
        state["slow"] = False
        patience = _PATIENCE if newton_rounds < _NEWTON_ROUNDS else math.inf
        P, f, g, err = _iterate(C, scale, f, g, a, b, mask, left, tol, state, inplace, True, patience=patience)
        if not state["slow"]:
            return P, f, g, float(err)
        if newton_rounds >= _NEWTON_ROUNDS:
            state["stalled"] = float(err)
            return P, f, g, float(err)
        newton_rounds += 1
        P = None  # release before Newton allocates
        f, g, improved = _newton_polish(C, scale, f, g, a, b, mask, tol, state)
        if not improved:
            newton_rounds = _NEWTON_ROUNDS
        state["next"] = "row"


def _solve_to_tolerance(C, f, g, a, b, mask, tol, max_iter, state, inplace, schedule):
    """Epsilon scaling over ``schedule``; every stage solved by :func:`_solve_stage`.

    A stage that stalls although its predecessor converged is retried from the
    predecessor's potentials with an intermediate score multiplier inserted (the geometric
    mean), at most ``_MAX_SPLITS`` times: the start was too far for Newton's region of fast
    convergence.
    """
    scales = list(schedule)
    prev, P, k, splits = None, None, 0, 0
    while k < len(scales):
        scale = scales[k]
        ratio = 1.0 if prev is None else scale / prev
        last = k == len(scales) - 1
        left = max_iter - state["count"]
        # Intermediate stages take at most half of what is left; the last takes the rest (at
        # least one half-step, so that the result belongs to the unscaled scores).
        budget = max(left, 1) if last else (left - 1) // 2
        if budget < 1:
            k += 1
            continue
        stage_tol = tol if last else _stage_tolerance(tol, scale)
        state["next"] = "row"
        state.pop("stalled", None)
        P, f_k, g_k, _ = _solve_stage(C, scale, f * ratio, g * ratio, a, b, mask, stage_tol, budget, state, inplace)
        if "stalled" in state and prev is not None and ratio > 1.1 and splits < _MAX_SPLITS:
            del state["stalled"]
            scales.insert(k, math.sqrt(prev * scale))
            splits += 1
            continue
        f, g, prev, k = f_k, g_k, scale, k + 1
    return P, f, g


# ----------------------------------------------------------------------------------------
# public API


def softmax(scores, mask=None):
    """Row-stochastic SoftMax normalization, max-subtracted (never overflows).

    Parameters
    ----------
    scores : array_like or torch.Tensor, shape (..., n, m)
        Attention scores (logits), floating dtype.
    mask : bool array, broadcastable to ``scores``, optional
        ``True`` where a query may attend to a key. A query with no admissible key gets
        a zero row (never NaN).

    Returns
    -------
    K : same type, dtype and device as ``scores``
        ``K[..., i, j] = exp(C_ij) / sum_j exp(C_ij)``.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> K = sinkflow.softmax(np.array([[0.0, np.log(3.0)]]))
    >>> K.round(3)
    array([[0.25, 0.75]])
    """
    C, mask, _, _, numpy_out = _prepare(scores, mask, None, None)
    return from_torch(_masked_softmax(C, mask)[0], numpy_out)


def solve_sinkhorn(scores, n_iter=None, tol=None, max_iter=20_000, *, mask=None, a=None, b=None,
                   init_g=None, epsilon_scaling=True, warn=True, _diagnostics=True) -> SinkhornResult:
    r"""Sinkhorn normalization with the full result (potentials, errors, convergence).

    Parameters
    ----------
    scores : array_like or torch.Tensor, shape (..., n, m)
        Scores :math:`C`; leading dimensions (batch, heads) are independent problems.
    n_iter : int or None
        Number of half-iterations (row, column, row, ...). ``1`` is SoftMax exactly.
        ``None`` iterates until the marginal error is below ``tol`` (with epsilon scaling).
    tol : float or None
        Target marginal error (L1 norm of the plan's marginal deviation, see
        :class:`SinkhornResult`). ``None`` takes :func:`default_tolerance` of the scores'
        dtype and size (float64: 1e-9, float32: 1e-5, float16: 1e-3, bfloat16: 1e-2). A
        ``tol`` below what the dtype can reach (:func:`attainable_error`) is raised to it,
        with a :class:`SinkhornWarning` up front. With a fixed ``n_iter`` it only sets
        ``converged``. ``tol=0`` (POT's ``stopThr=0``) disables the stopping test: exactly
        ``max_iter`` half-iterations of the plain alternating loop (POT's ``numItermax``
        counts row-column pairs, so ``max_iter = 2 * numItermax``), no warning, and
        ``converged`` is True only if the marginal error is exactly 0.
    max_iter : int
        Budget of half-iterations for ``n_iter=None``. When it runs out, or earlier when the
        observed rate shows it cannot be met (a stall), ``converged`` is False and a
        :class:`SinkhornWarning` says why.
    mask : bool array broadcastable to ``scores``, optional
        ``True`` = admissible pair. Excluded entries are exactly 0; a query with no
        admissible key gets a zero row and weight 0 (the others are renormalized),
        likewise for keys. Key padding therefore gives the ``m - pads`` real keys weight
        ``1 / (m - pads)`` each: after a column step (even ``n_iter``) their columns sum to
        ``n / (m - pads)``. The Sinkformers NLP code keeps ``1 / m`` for every key, so its
        columns sum to 1: multiply by ``(m - pads) / n`` to compare (rows agree after odd
        ``n_iter``).
    a, b : arrays of shape (..., n) and (..., m), optional
        Query and key weights (non-negative, summing to 1 in their own precision);
        uniform by default. A query (key) of weight 0 gets an exactly zero row (column),
        potential 0 and no gradient, and the rest is the solution without it, at every
        ``n_iter`` and at the same cost to tolerance (it is excluded as by the mask).
    init_g : array (..., m), optional
        Warm start for the column potential ``g`` (e.g. the previous step of a particle
        flow). The first half-iteration is a row step from it; with ``n_iter=None`` a warm
        start skips the epsilon-scaling schedule (not the other accelerations). Changes the
        result of a fixed ``n_iter``.
    epsilon_scaling : bool
        Accelerate ``n_iter=None``: epsilon scaling, over-relaxation and Newton steps on the
        dual (same fixed point, far fewer iterations at cold temperature). ``False`` runs the
        plain alternating loop (still stopping early on a stall).
    warn : bool
        Whether to issue :class:`SinkhornWarning` (unreachable ``tol``, stall, budget).

    Returns
    -------
    SinkhornResult
        Arrays in the input's type (numpy in, numpy out; torch keeps device and dtype).
        float16 and bfloat16 scores are solved in float32 and the results rounded back;
        ``marginal_error`` is that of the rounded matrix.

    Notes
    -----
    Differentiation: with torch inputs that require grad, the iterations are unrolled
    (out-of-place) and autograd differentiates through them, as a Sinkformer layer does
    (Newton steps are then not used).

    Precision: the marginal error of a float32 solve floors near ``eps sqrt(n)`` (rounding
    of the line sums), so float32 defaults to ``tol = 1e-5``; ask for float64 inputs for
    tighter solutions.

    Cold problems (scores spanning 1e4 and more, e.g. ``-M / reg`` for small ``reg``)
    converge through epsilon scaling with Newton steps once the half-iterations slow down:
    POT's 1D test problem (two Gaussian histograms on 100 bins, squared-distance cost)
    reaches 1e-9 at ``reg = 1e-3``, where plain iterations stall near 2e-3.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> C = np.random.default_rng(0).normal(size=(5, 5))
    >>> res = sinkflow.solve_sinkhorn(C)
    >>> res.converged, bool(np.allclose(res.attention.sum(0), 1))
    (True, True)
    """
    C, mask, a, b, numpy_out = _prepare(scores, mask, a, b, init_g)
    out_dtype = C.dtype
    C = C.to(_compute_dtype(out_dtype))
    _check_counts(n_iter, max_iter)
    tol = _resolve_tolerance(tol, out_dtype, C.shape, warn and n_iter is None)
    run_out = n_iter is None and tol == 0  # tol=0: exactly max_iter half-iterations, no stopping test
    n_iter, warn = (max_iter, False) if run_out else (n_iter, warn)
    a, b = _effective_weights(a, b, mask, C.shape)
    mask = _exclude_empty_lines(mask, a, b)
    inplace = not (torch.is_grad_enabled() and (C.requires_grad or a.requires_grad or b.requires_grad))
    f = torch.zeros(C.shape[:-1], dtype=C.dtype, device=C.device)
    g = _initial_g(init_g, C)
    state = {"next": "row", "count": 0, "errors": [], "scales": [], "check": n_iter is None,
             "accelerate": n_iter is None and epsilon_scaling}
    if n_iter is not None:
        P, f, g, state = _fixed_iterations(C, f, g, a, b, mask, int(n_iter), state, inplace, _diagnostics)
    else:
        start = _symmetric_start(C, mask, a, b) if init_g is None and epsilon_scaling else None
        g = g if start is None else start
        # A warm start is already near the solution: no annealing, but the same acceleration.
        # Newton steps bridge larger jumps in the multiplier than half-iterations alone.
        schedule = (_scaling_schedule(C, mask, factor=4.0 if inplace else 2.0)
                    if epsilon_scaling and init_g is None and start is None else [1.0])
        # Rounding a half-precision result back costs up to eps / 2 of marginal error.
        inner_tol = tol - 0.5 * torch.finfo(out_dtype).eps if out_dtype != C.dtype else tol
        P, f, g = _solve_to_tolerance(C, f, g, a, b, mask, inner_tol, max_iter, state, inplace, schedule)
    P = P.to(out_dtype)
    # sinkhorn() with a fixed n_iter only wants the matrix: no diagnostic passes.
    err = _final_error(P.to(C.dtype), a, b) if _diagnostics else math.nan
    converged = err <= tol
    if n_iter is None and not converged and warn:
        warnings.warn(_failure_message(state, err, tol, max_iter, out_dtype), SinkhornWarning, stacklevel=2)
    # Potentials of excluded queries / keys are reported as 0.
    f = torch.where(a > 0, f, torch.zeros_like(f))
    g = torch.where(b > 0, g, torch.zeros_like(g))
    errors = np.array([float(e) for e in state["errors"]])
    return SinkhornResult(
        attention=from_torch(P, numpy_out), f=from_torch(f, numpy_out), g=from_torch(g, numpy_out),
        n_iter=state["count"], converged=bool(converged), marginal_error=err, errors=errors,
        scales=np.array(state["scales"], dtype=float), tol=float(tol),
        a=from_torch(a, numpy_out), b=from_torch(b, numpy_out))


def sinkhorn(scores, n_iter=None, tol=None, max_iter=20_000, *, mask=None, a=None, b=None):
    """Sinkhorn attention: alternate row and column normalizations of ``exp(scores)``.

    Same arguments as :func:`solve_sinkhorn`; returns only the normalized matrix. Use
    :func:`solve_sinkhorn` for potentials, iteration counts and the convergence flag.

    Parameters
    ----------
    scores : array_like or torch.Tensor, shape (..., n, m)
    n_iter : int or None
        Half-iterations; ``1`` equals :func:`softmax`, ``None`` runs to ``tol``.
    tol, max_iter, mask, a, b
        See :func:`solve_sinkhorn`.

    Returns
    -------
    K : same type, dtype and device as ``scores``, shape (..., n, m)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> C = np.random.default_rng(0).normal(size=(4, 4))
    >>> K = sinkflow.sinkhorn(C)
    >>> np.allclose(K.sum(1), 1) and np.allclose(K.sum(0), 1)
    True
    >>> np.array_equal(sinkflow.sinkhorn(C, n_iter=1), sinkflow.softmax(C))
    True
    """
    return solve_sinkhorn(scores, n_iter, tol, max_iter, mask=mask, a=a, b=b, _diagnostics=n_iter is None).attention
