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
Schmitzer 2019). The result never contains NaN or inf, at any temperature.

Exponent arguments (after subtracting the line maximum) are clamped one unit above the
logarithm of the smallest normal number: float32 ``exp`` is ~9x slower on arguments below
-87 (docs/performance.md), and the clamp changes each entry by less than 3x the float's
smallest normal, far below the resolution of any line sum that is used.

Run-to-tolerance (``n_iter=None``) is accelerated three ways, all converging to the same
(unique) fixed point: epsilon scaling (the scores are multiplied by an increasing schedule
``s_0 < s_1 < ... < 1``, warm-starting the scaled potentials, as geomloss does);
over-relaxation with ``omega`` adapted to the observed rate; and, for cold problems of
moderate size that still have not converged after a few hundred half-iterations, Newton
steps on the dual (quadratic convergence where the plain loop crawls). Measured on 40 x 40
Gaussian scores at tolerance 1e-9: scores x30 in 550 half-iterations (plain: 9,178), x1000
in 937 (plain: error 2e-5 after 100,000).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sinkflow._backend import check_finite, check_float, exp_floor, from_torch, to_torch

__all__ = ["softmax", "sinkhorn", "solve_sinkhorn", "SinkhornResult", "SinkhornWarning"]


class SinkhornWarning(UserWarning):
    """Issued when a run-to-tolerance solve stops at ``max_iter`` before reaching ``tol``."""


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


def _prepare(scores, mask, a, b):
    numpy_out = not isinstance(scores, torch.Tensor)
    C = to_torch(scores, "scores")
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
        check_finite(C.detach().masked_fill(~mask, 0.0), "scores (unmasked entries)")
    else:
        check_finite(C.detach(), "scores")
    a = _weights(a, n, C, "a", "queries")
    b = _weights(b, m, C, "b", "keys")
    return C, mask, a, b, numpy_out


def _weights(w, size, C, name, what):
    if w is None:
        return torch.full((size,), 1.0 / size, dtype=C.dtype, device=C.device)
    w = to_torch(w, name).to(device=C.device)
    check_float(w, name)
    w = w.to(C.dtype)
    if w.ndim == 0 or w.shape[-1] != size:
        raise ValueError(f"weights {name} must have last dimension {size} (one per {what}), got shape {tuple(w.shape)}")
    check_finite(w, name)
    if bool((w < 0).any()):
        raise ValueError(f"weights {name} must be non-negative")
    total = w.sum(-1)
    if not bool(torch.allclose(total, torch.ones_like(total), rtol=0, atol=1e-6 if w.dtype != torch.float64 else 1e-10)):
        raise ValueError(f"weights {name} must sum to 1 along the last dimension (sums: {total.detach().cpu().numpy()})")
    return w


def _effective_weights(a, b, mask, shape):
    """Broadcast weights to the batch; queries (keys) with no admissible key (query) get 0."""
    batch = shape[:-2]
    a = torch.broadcast_to(a, batch + a.shape[-1:]).clone()
    b = torch.broadcast_to(b, batch + b.shape[-1:]).clone()
    if mask is not None:
        a = a * mask.any(-1)
        b = b * mask.any(-2)
        sa = a.sum(-1, keepdim=True)
        sb = b.sum(-1, keepdim=True)
        a = torch.where(sa > 0, a / torch.where(sa > 0, sa, 1), a)
        b = torch.where(sb > 0, b / torch.where(sb > 0, sb, 1), b)
    return a, b


# ----------------------------------------------------------------------------------------
# numerical kernels


def _row_softmax(T, mask):
    """Row SoftMax of ``T`` (torch's fused kernel) and the log scaling ``f = -logsumexp``.

    ``f`` is read off the result, ``f_i = log max_j P_ij - max_j T_ij``, which costs two
    cheap reductions instead of a second pass of exponentials. Rows with no admissible
    entry are zero with ``f = 0``.
    """
    if mask is not None:
        T = T.masked_fill(~mask, -math.inf)
    P = torch.softmax(T, -1)
    mx = T.amax(-1)
    if mask is not None:
        empty = ~mask.any(-1)
        P = P.masked_fill(empty[..., None], 0.0)
        mx = mx.masked_fill(empty, 0.0)
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


def _max_over_batch(e: torch.Tensor) -> torch.Tensor:
    return e.reshape(-1).amax() if e.ndim else e


def _iterate(C, scale, f, g, a, b, mask, n_half, tol, state, inplace, record, P0=None, trace=None):
    """Run ``n_half`` half-iterations (or until ``tol``) on the problem with scores ``scale * C``.

    ``state`` holds the half-step parity and counters across epsilon-scaling stages. With
    ``state["accelerate"]`` the steps are over-relaxed (``omega`` in [1, 2)), with ``omega``
    set from the observed plain rate (see :func:`_relaxation`).

    Each half-step costs one reduction and one scaling pass over ``P``: the line sums that
    measure the error after a step are exactly those the next step divides by, so they are
    kept (``sums``) rather than recomputed.

    ``P0`` starts from a matrix consistent with ``(f, g)``; ``trace`` (a list) collects
    ``(P, line_factor, row_step)`` after each half-step for :class:`_UnrolledSinkhorn`.
    """
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
    omega = 1.0
    stage_errors = []
    limits = {"ceiling": _OMEGA_MAX}
    err = torch.full((), math.inf, dtype=dtype, device=C.device)
    while done < n_half:
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
        if not (record or (tol is not None and state["check"])):
            sums = None  # no diagnostics wanted: the next step sums for itself
            continue
        # Error of the marginal not just normalized, from the sums the next step needs anyway.
        if row_step:
            sums = _colsum(a, P)
            e = (sums - b).abs().sum(-1)
        else:
            sums = P.sum(-1)
            e = (a * (sums - ones_r).abs()).sum(-1)
        other = e
        if omega != 1.0:
            # Over-relaxed steps leave the marginal just treated off by exp((omega-1) delta) - 1.
            miss = torch.expm1((omega - 1.0) * delta).abs()
            e = torch.maximum(e, (a * miss).sum(-1) if row_step else (b * miss).sum(-1))
        err = _max_over_batch(e.detach())
        if record:
            state["errors"].append(err)
            state["scales"].append(scale)
        if tol is not None and state["check"]:
            value = float(err)
            if value <= tol:
                break
            if state.get("accelerate"):
                # The rate is read off the other marginal's error alone: the residual of an
                # over-relaxed step scales with omega and would fake an increase.
                stage_errors.append(float(_max_over_batch(other.detach())))
                omega = _relaxation(stage_errors, omega, limits)
    return P, f, g, err


_OMEGA_MAX = 1.9
_STAGE_TOL = 1e-3  # marginal error at which an intermediate epsilon-scaling stage stops
_STAGE_BUDGET = 200  # half-iterations at most per intermediate stage


def _relaxation(errors, omega, limits, window=20):
    """Over-relaxation parameter for the next half-steps (Thibault et al. 2017; Lehmann et al. 2021).

    Every ``window`` half-steps the current rate per full iteration ``rho`` is read off the
    error history. With relaxation ``omega`` the slowest plain mode ``theta`` contracts at about
    ``1 - omega (1 - theta)``, so ``theta ~ 1 - (1 - rho) / omega``; the locally optimal choice
    is ``omega = 2 / (1 + sqrt(1 - theta))``. If the error did not decrease over the window,
    ``omega`` falls back halfway to 1 and the value that failed becomes a ceiling (lowered a
    little each time), so ``omega`` settles below the largest stable value instead of
    oscillating around it.
    """
    k = len(errors)
    if k < window or k % window:
        return omega
    now, before = errors[-1], errors[-window]
    if omega > 1.0 and now >= before:
        limits["ceiling"] = 1.0 + 0.9 * (omega - 1.0)
        omega = 1.0 + 0.5 * (omega - 1.0)
        return 1.0 if omega < 1.02 else omega
    rho = (now / before) ** (2.0 / (window - 1)) if before > 0 else 0.0
    theta = 1.0 - (1.0 - rho) / omega
    if theta <= 0.5:  # fast enough: keep the current steps
        return omega
    target = 2.0 / (1.0 + math.sqrt(max(1.0 - theta, 1e-8)))
    return max(omega, min(_OMEGA_MAX, limits["ceiling"], target))


_NEWTON_AFTER = 400  # half-iterations of the last stage before Newton polishing is tried
_NEWTON_MAX_SIZE = 2048  # n + m up to which the dense Newton system is solved


def _newton_eligible(C, accelerate, inplace):
    n, m = C.shape[-2:]
    return accelerate and inplace and n + m <= _NEWTON_MAX_SIZE


def _newton_polish(C, f, g, a, b, mask, tol, state, max_steps=50):
    """Newton steps on the concave dual ``D(f, g) = <a, f> + <b, g> - sum_ij a_i exp(f_i + C_ij + g_j)``.

    Its Hessian is ``-J`` with ``J = [[diag(a r), diag(a) K], [K^T diag(a), diag(c)]]``
    (``r``, ``c`` the row sums and weighted column sums of ``K``); ``J`` is singular along the
    gauge ``(f + t, g - t)`` to which the gradient is orthogonal, so ``J + v v^T`` (``v`` the
    normalized gauge direction) is solved instead. Armijo backtracking keeps ``D`` increasing.
    Converges quadratically near the solution, where plain Sinkhorn crawls at cold
    temperature (Brauer et al. 2017). Each step appends its marginal error to ``state``.
    """
    n, m = C.shape[-2:]
    dtype = C.dtype
    act = torch.cat([a > 0, b > 0], -1)
    v = torch.cat([torch.ones(n, dtype=dtype, device=C.device), -torch.ones(m, dtype=dtype, device=C.device)])
    v = v / math.sqrt(n + m)
    high = math.log(torch.finfo(dtype).max) - math.log(n * m) - 1.0

    def evaluate(f, g):
        T = C + f[..., :, None] + g[..., None, :]
        if mask is not None:
            T = T.masked_fill(~mask, -math.inf)
        if bool((T > high).any()):
            return None
        K = T.clamp_min(exp_floor(dtype)).exp()
        if mask is not None:
            K = K.masked_fill(~mask, 0.0)
        r = K.sum(-1)
        c = _colsum(a, K)
        dual = (a * f).sum(-1) + (b * g).sum(-1) - (a * r).sum(-1)
        grad = torch.cat([a * (1 - r) * (a > 0), (b - c) * (b > 0)], -1)
        return K, r, c, dual, grad

    current = evaluate(f, g)
    if current is None:
        return f, g
    for _ in range(max_steps):
        K, r, c, dual, grad = current
        err = torch.maximum((a * (r - (a > 0).to(dtype)).abs()).sum(-1), (c - b).abs().sum(-1))
        err = _max_over_batch(err)
        state["errors"].append(err)
        state["scales"].append(1.0)
        if float(err) <= tol:
            break
        aK = a[..., :, None] * K
        top = torch.cat([torch.diag_embed(a * r), aK], -1)
        bottom = torch.cat([aK.transpose(-1, -2), torch.diag_embed(c)], -1)
        J = torch.cat([top, bottom], -2) + v[:, None] * v[None, :]
        J = J + torch.diag_embed((~act).to(dtype))  # excluded queries/keys: identity rows
        try:
            step = torch.linalg.solve(J, grad.unsqueeze(-1)).squeeze(-1)
        except RuntimeError:  # singular despite the gauge fix: stop polishing
            break
        df, dg = step[..., :n], step[..., n:]
        slope = (grad * step).sum(-1)
        t, accepted = 1.0, None
        for _ in range(30):
            trial = evaluate(f + t * df, g + t * dg)
            if trial is not None and bool((trial[3] >= dual + 1e-4 * t * slope).all()):
                accepted = trial
                break
            t *= 0.5
        if accepted is None:
            break
        f, g, current = f + t * df, g + t * dg, accepted
    return f, g


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
    P, _ = _row_softmax(C, mask)
    return from_torch(P, numpy_out)


def solve_sinkhorn(scores, n_iter=None, tol=1e-9, max_iter=20_000, *, mask=None, a=None, b=None,
                   init_g=None, epsilon_scaling=True, warn=True, _diagnostics=True) -> SinkhornResult:
    r"""Sinkhorn normalization with the full result (potentials, errors, convergence).

    Parameters
    ----------
    scores : array_like or torch.Tensor, shape (..., n, m)
        Scores :math:`C`; leading dimensions (batch, heads) are independent problems.
    n_iter : int or None
        Number of half-iterations (row, column, row, ...). ``1`` is SoftMax exactly.
        ``None`` iterates until the marginal error is below ``tol`` (with epsilon scaling).
    tol : float
        Target marginal error (L1 norm of the plan's marginal deviation, see
        :class:`SinkhornResult`). With a fixed ``n_iter`` it only sets ``converged``.
    max_iter : int
        Budget of half-iterations for ``n_iter=None``; a :class:`SinkhornWarning` is
        issued (and ``converged`` is False) when it runs out.
    mask : bool array broadcastable to ``scores``, optional
        ``True`` = admissible pair. Excluded entries are exactly 0; a query with no
        admissible key gets a zero row and weight 0 (the others are renormalized),
        likewise for keys.
    a, b : arrays of shape (..., n) and (..., m), optional
        Query and key weights (non-negative, summing to 1); uniform by default.
    init_g : array (..., m), optional
        Warm start for the column potential ``g`` (e.g. the previous step of a particle
        flow). The first half-iteration is a row step from it; with ``n_iter=None`` a warm
        start skips the epsilon-scaling schedule (not the other accelerations). Changes the
        result of a fixed ``n_iter``.
    epsilon_scaling : bool
        Accelerate ``n_iter=None``: epsilon scaling, over-relaxation and Newton polishing
        (same fixed point, far fewer iterations at cold temperature). ``False`` runs the
        plain alternating loop.
    warn : bool
        Whether to warn when ``max_iter`` is reached before ``tol``.

    Returns
    -------
    SinkhornResult
        Arrays in the input's type (numpy in, numpy out; torch keeps device and dtype).

    Notes
    -----
    Differentiation: with torch inputs that require grad, the iterations are unrolled
    (out-of-place) and autograd differentiates through them, as a Sinkformer layer does.
    Troubleshooting: at very cold temperatures in float32 the marginal error floors near
    1e-7; use float64 or a looser ``tol``.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> C = np.random.default_rng(0).normal(size=(5, 5))
    >>> res = sinkflow.solve_sinkhorn(C)
    >>> res.converged, bool(np.allclose(res.attention.sum(0), 1))
    (True, True)
    """
    C, mask, a, b, numpy_out = _prepare(scores, mask, a, b)
    if n_iter is not None:
        if isinstance(n_iter, bool) or not isinstance(n_iter, (int, np.integer)) or n_iter < 1:
            raise ValueError(f"n_iter must be a positive integer (half-iterations) or None, got {n_iter!r}")
    if not (tol > 0):
        raise ValueError(f"tol must be positive, got {tol}")
    if not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    a, b = _effective_weights(a, b, mask, C.shape)
    inplace = not (torch.is_grad_enabled() and C.requires_grad)
    f = torch.zeros(C.shape[:-1], dtype=C.dtype, device=C.device)
    g = torch.zeros(C.shape[:-2] + C.shape[-1:], dtype=C.dtype, device=C.device)
    warm = False
    if init_g is not None:
        g0 = to_torch(init_g, "init_g", like=C).detach()
        check_finite(g0, "init_g")
        try:
            g = (g + g0).contiguous()
        except RuntimeError as err:
            raise ValueError(f"init_g of shape {tuple(g0.shape)} does not broadcast to {tuple(g.shape)}") from err
        warm = True
    state = {"next": "row", "count": 0, "errors": [], "scales": [], "check": n_iter is None,
             "accelerate": n_iter is None and epsilon_scaling}
    if n_iter is not None:
        if inplace or int(n_iter) == 1:
            P, f, g, _ = _iterate(C, 1.0, f, g, a, b, mask, int(n_iter), None, state, inplace, _diagnostics)
        else:  # differentiable: the first (SoftMax) step by autograd, the rest hand-differentiated
            P1, f, g, _ = _iterate(C, 1.0, f, g, a, b, mask, 1, None, state, False, _diagnostics)
            P, f, g = _UnrolledSinkhorn.apply(P1, C.detach(), f.detach(), g.detach(), a, b, mask,
                                              int(n_iter) - 1, state, _diagnostics)
            if state.get("fallbacks"):
                # A log-domain step re-exponentiated C: differentiating through P alone would
                # divide by underflowed line sums. Redo the solve under plain autograd.
                state = {"next": "row", "count": 0, "errors": [], "scales": [], "check": False, "accelerate": False}
                f, g = torch.zeros_like(f), torch.zeros_like(g)
                P, f, g, _ = _iterate(C, 1.0, f, g, a, b, mask, int(n_iter), None, state, False, _diagnostics)
    else:
        # A warm start is already near the solution: no annealing, but the same acceleration.
        schedule = _scaling_schedule(C, mask) if epsilon_scaling and not warm else [1.0]
        prev = None
        for k, s in enumerate(schedule):
            if prev is not None:
                f, g = f * (s / prev), g * (s / prev)
                state["next"] = "row"
            last = k == len(schedule) - 1
            # Intermediate stages take at most half of what is left; the last takes the rest.
            budget = max_iter - state["count"] if last else min(_STAGE_BUDGET, (max_iter - state["count"]) // 2)
            if budget < 1:
                continue
            stage_tol = tol if last else max(tol, _STAGE_TOL)
            if last and _newton_eligible(C, epsilon_scaling, inplace) and budget > _NEWTON_AFTER:
                # Cold problems: if the accelerated loop has not converged after a while,
                # polish with Newton steps on the dual, then finish with half-iterations.
                P, f, g, err_t = _iterate(C, s, f, g, a, b, mask, _NEWTON_AFTER, stage_tol, state, inplace, True)
                if float(err_t) > tol:
                    P = None
                    f, g = _newton_polish(C, f, g, a, b, mask, tol, state)
                    state["next"] = "row"
                    budget = max(1, max_iter - state["count"])
                    P, f, g, _ = _iterate(C, s, f, g, a, b, mask, budget, stage_tol, state, inplace, True)
            else:
                P, f, g, _ = _iterate(C, s, f, g, a, b, mask, budget, stage_tol, state, inplace, True)
            prev = s
    # sinkhorn() with a fixed n_iter only wants the matrix: no diagnostic passes.
    err = _final_error(P, a, b) if _diagnostics else math.nan
    converged = err <= tol
    if n_iter is None and not converged and warn:
        warnings.warn(
            f"Sinkhorn stopped at max_iter={max_iter} half-iterations with marginal error {err:.3g} > tol={tol:g}; "
            "raise max_iter, loosen tol, or use float64.", SinkhornWarning, stacklevel=2)
    # Potentials of excluded queries / keys are reported as 0.
    f = torch.where(a > 0, f, torch.zeros_like(f))
    g = torch.where(b > 0, g, torch.zeros_like(g))
    errors = np.array([float(e) for e in state["errors"]])
    result = SinkhornResult(
        attention=from_torch(P, numpy_out), f=from_torch(f, numpy_out), g=from_torch(g, numpy_out),
        n_iter=state["count"], converged=bool(converged), marginal_error=err, errors=errors,
        scales=np.array(state["scales"], dtype=float), tol=float(tol),
        a=from_torch(a, numpy_out), b=from_torch(b, numpy_out))
    return result


def sinkhorn(scores, n_iter=None, tol=1e-9, max_iter=20_000, *, mask=None, a=None, b=None):
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
