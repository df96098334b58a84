"""The Sinkhorn iteration: log-domain half-steps (rows, then columns), the loop that runs them
(in the kernel domain with absorption when no gradient is needed, see
:mod:`sinkflow.attention._kernel_sinkhorn`), and its differentiable unrolled form for a fixed
number of half-iterations.
"""

from __future__ import annotations

import math

import torch

from sinkflow._backend import branch_free, first_order
from sinkflow.attention._kernel_sinkhorn import _max_over_batch, _Monitor, iterate_kernel
from sinkflow.attention._log_steps import _col_step_log, _flush_limits, _row_step_log

__all__ = []


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
    if inplace and P0 is None and trace is None and _KERNEL_DOMAIN and not branch_free():  # (its checks sync)
        return iterate_kernel(C, scale, f, g, a, b, mask, n_half, tol, state, record, patience)
    limits = _flush_limits(C)
    active_rows, active_cols = a > 0, b > 0
    ones_r = active_rows.to(C.dtype)
    P = P0
    sums = None  # line sums of the current P along the next step's direction, if known
    f_ref, g_ref = f, g  # potentials at the last exponentiation
    done = 0
    mon = _Monitor(a, b, scale, tol, state, record, patience)
    err = torch.full((), math.inf, dtype=C.dtype, device=C.device)
    while done < n_half:
        omega = mon.omega
        row_step = state["next"] == "row"
        active = active_rows if row_step else active_cols
        need_log = P is None
        if not need_log:
            if sums is None:
                sums = P.sum(-1) if row_step else _colsum(a, P)
            need_log = _needs_log(sums, active, f - f_ref, g - g_ref, limits)
            state["fallbacks"] = state.get("fallbacks", 0) + int(need_log)
        if need_log:
            P = None  # release before the log step allocates
        if row_step:
            P, f, delta, ref = _row_half_step(C, scale, P, f, g, sums, active, mask, omega, inplace)
            f_ref, g_ref = (ref, g) if ref is not None else (f_ref, g_ref)
        else:
            P, g, delta, ref = _col_half_step(C, scale, P, f, g, a, b, sums, active, mask, omega, inplace)
            f_ref, g_ref = (f, ref) if ref is not None else (f_ref, g_ref)
        if trace is not None:
            trace.append((P, torch.exp(delta), row_step))
        done += 1
        state["count"] += 1
        state["next"] = "col" if row_step else "row"
        if not mon.wanted:
            sums = None  # no diagnostics wanted: the next step sums for itself
            continue
        sums, e = _marginal_error(P, a, b, ones_r, row_step)
        err, stop = mon.after(e, delta, row_step, n_half - done)
        if stop:
            break
    return P, f, g, err


def _needs_log(sums, active, df, dg, limits) -> bool:
    """One sync: is the smallest active line sum unsafe, or have flushed entries grown too much?"""
    if branch_free():  # no sync under torch.compile or torch.func: every step in the log domain
        return True
    checks = torch.stack([
        torch.where(active, sums, torch.full_like(sums, math.inf)).amin().detach(),
        (df.amax() + dg.amax()).detach(),
    ]).tolist()
    return checks[0] < limits[0] or checks[1] > limits[1]


def _row_half_step(C, scale, P, f, g, sums, active, mask, omega, inplace):
    """Rows to their marginals: ``(P, f, delta, f_full)``; ``f_full`` is the exponentiated
    potential when ``P`` was None (a log step), else None (a multiplicative step on ``sums``)."""
    f_full = None
    if P is None:
        P, f_full = _row_step_log(C, scale, g, mask)
        delta = f_full - f
        factor = torch.exp((omega - 1.0) * delta) if omega != 1.0 else None
    else:
        r = torch.where(active, sums, torch.ones_like(sums))
        delta = -torch.log(r)
        factor = torch.exp(omega * delta) if omega != 1.0 else 1.0 / r
    if factor is not None:
        P = P.mul_(factor[..., None]) if inplace else P * factor[..., None]
    return P, f + omega * delta, delta, f_full


def _col_half_step(C, scale, P, f, g, a, b, sums, active, mask, omega, inplace):
    """Columns to ``b``: ``(P, g, delta, g_full)``, as :func:`_row_half_step`."""
    g_full = None
    if P is None:
        P, g_full = _col_step_log(C, scale, f, a, b, mask)
        delta = g_full - g
        factor = torch.exp((omega - 1.0) * delta) if omega != 1.0 else None
    else:
        c = torch.where(active, sums, torch.ones_like(sums))
        delta = torch.where(active, torch.log(b) - torch.log(c), torch.zeros_like(c))
        factor = torch.exp(omega * delta)
    if factor is not None:
        P = P.mul_(factor[..., None, :]) if inplace else P * factor[..., None, :]
    return P, g + omega * delta, delta, g_full


def _marginal_error(P, a, b, ones_r, row_step):
    """Error of the marginal not just normalized, from the sums the next step needs anyway: ``(sums, error)``."""
    if row_step:
        sums = _colsum(a, P)
        return sums, (sums - b).abs().sum(-1)
    sums = P.sum(-1)
    return sums, (a * (sums - ones_r).abs()).sum(-1)


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
    @first_order
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


def _fixed_iterations(C, f, g, a, b, mask, n_iter, state, inplace, record):
    """Exactly ``n_iter`` half-iterations; under autograd with a hand-written backward."""
    if inplace or n_iter == 1 or branch_free():  # torch.compile, torch.func: plain autograd, log-domain steps
        P, f, g, _ = _iterate(C, 1.0, f, g, a, b, mask, n_iter, None, state, inplace, record)
        return P, f, g, state
    # Differentiable: the first (SoftMax) step by autograd, the rest hand-differentiated.
    f0, g0 = f, g
    P1, f, g, _ = _iterate(C, 1.0, f, g, a, b, mask, 1, None, state, False, record)
    P, f, g = _UnrolledSinkhorn.apply(P1, C.detach(), f.detach(), g.detach(), a, b, mask, n_iter - 1, state, record)
    if state.get("fallbacks"):
        # A log-domain step re-exponentiated C: differentiating through P alone would divide
        # by underflowed line sums. Redo the solve under plain autograd, from the same start.
        state = {"next": "row", "count": 0, "errors": [], "scales": [], "check": False, "accelerate": False}
        P, f, g, _ = _iterate(C, 1.0, f0, g0, a, b, mask, n_iter, None, state, False, record)
    return P, f, g, state
