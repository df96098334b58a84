r"""Sinkhorn half-iterations in the kernel domain, with absorption (the no-autograd path).

The matrix is kept as :math:`P = \mathrm{diag}(u)\, K\, \mathrm{diag}(v)` with
:math:`K = \exp(s C + f_0 + g_0)` from the last exponentiation and the scalings
:math:`u = e^{f - f_0}`, :math:`v = e^{g - g_0}` as vectors. A half-step is one matrix-vector
product with :math:`K` (a row step divides by :math:`K v`, a column step by :math:`K^T (a u)`)
instead of a reduction and a scaling pass over :math:`P`: it reads :math:`K` once. ``P`` is
formed once, at the end.

Stability (Schmitzer 2019, "stabilized sparse scaling algorithms"; POT's
``sinkhorn_stabilized``): when a scaling leaves :math:`[0, e^{\beta}]` the scalings are absorbed
into the log potentials and :math:`K` is exponentiated again, by the log-domain step of
:mod:`sinkflow.attention`. With :math:`\beta = \frac12 \log(\varepsilon / (3\, t\,
\max(n, m)))` (``t`` the smallest normal number, ``eps`` the machine epsilon) this bound is
both conditions the materialized loop checks: an entry of :math:`K` flushed to at most
:math:`e\, t` contributes at most :math:`e\, t\, e^{2\beta} \le \varepsilon / \max(n, m)` of a
unit line sum, so neither a small line sum nor grown-back flushed entries can matter beyond
rounding; and no scaling overflows. float32: :math:`e^{\beta} \approx 10^{15} / \sqrt{\max(n, m)}`,
float64: about :math:`10^{145}`.
"""

from __future__ import annotations

import math

import torch

from sinkflow.attention._log_steps import _col_step_log, _flush_limits, _row_step_log

_OMEGA_MAX = 1.9
_RATE_WINDOW = 25  # half-steps over which the convergence rate is read


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


def _predicted_steps(history, tol, window=None):
    """Half-steps still needed to reach ``tol`` at the rate read off the error history.

    Read every ``window`` half-steps from the best error of the last two windows (over-relaxed
    errors oscillate): ``inf`` when there was no progress at all (or the error is not a number,
    or ``tol <= 0``, which no geometric rate reaches), ``None`` between readings and when the
    earlier window holds no finite positive error to read a rate from (an error that overflowed
    to ``inf`` at the start of a stage); ``0`` when the error fell to 0 or underflowed the ratio.
    Only a finite rate strictly below 1 and two positive errors reach ``math.log``.
    """
    window = window or _RATE_WINDOW
    k = len(history)
    if k < 2 * window or k % window:
        return None
    now, before = min(history[-window:]), min(history[-2 * window:-window])
    if not (math.isfinite(before) and before > 0):
        return None
    if not now < before:  # no progress, or now is NaN / inf
        return math.inf
    if not (tol > 0):
        return math.inf
    ratio = now / before
    if ratio <= 0:  # now == 0, or a ratio below the smallest subnormal
        return 0.0
    # The log of the rate per half-step, not the log of its window-th root: a ratio within
    # 1e-15 of 1 has a root that rounds to 1 (log 0). now < before keeps the ratio below 1.
    log_rate = math.log(ratio) / window
    return max(0.0, (math.log(tol) - math.log(now)) / log_rate)


def _max_over_batch(e: torch.Tensor) -> torch.Tensor:
    return e.reshape(-1).amax() if e.ndim else e


class _Monitor:
    """Error bookkeeping after each half-step, shared by both loops: records, stops, adapts ``omega``.

    ``after`` takes the L1 error ``e`` of the marginal not just normalized (per batch entry) and
    the log factor ``delta`` of the step; returns ``(err, stop)``. ``omega`` is updated in place.
    """

    def __init__(self, a, b, scale, tol, state, record, patience):
        self.a, self.b, self.scale, self.tol, self.state = a, b, scale, tol, state
        self.record, self.patience = record, patience
        self.checking = tol is not None and state["check"]
        self.wanted = record or self.checking
        self.omega = 1.0
        self.history, self.stage_errors, self.limits = [], [], {"ceiling": _OMEGA_MAX}

    def after(self, e, delta, row_step, left):
        other = e
        if self.omega != 1.0:
            # Over-relaxed steps leave the marginal just treated off by exp((omega-1) delta) - 1.
            miss = torch.expm1((self.omega - 1.0) * delta).abs()
            e = torch.maximum(e, (self.a * miss).sum(-1) if row_step else (self.b * miss).sum(-1))
        err = _max_over_batch(e.detach())
        if self.record:
            self.state["errors"].append(err)
            self.state["scales"].append(self.scale)
        if not self.checking:
            return err, False
        value = float(err)
        if value <= self.tol:
            return err, True
        self.history.append(value)
        ahead = _predicted_steps(self.history, self.tol) if self.patience is not None else None
        if ahead is not None and ahead > min(self.patience, left):
            self.state["slow"] = True  # too slow for the patience, or for the budget left
            return err, True
        if self.state.get("accelerate"):
            # The rate is read off the other marginal's error alone: the residual of an
            # over-relaxed step scales with omega and would fake an increase.
            self.stage_errors.append(float(_max_over_batch(other.detach())))
            self.omega = _relaxation(self.stage_errors, self.omega, self.limits)
        return err, False


def _rows_times(K, v):
    """``K v`` over the last two dimensions (one read of ``K``)."""
    return torch.mv(K, v) if K.ndim == 2 else (K @ v.unsqueeze(-1)).squeeze(-1)


def _times_cols(w, K):
    """``w^T K`` over the last two dimensions."""
    return torch.mv(K.T, w) if K.ndim == 2 else (w.unsqueeze(-2) @ K).squeeze(-2)


def _new_scaling(x, sums, target, omega, active):
    """Scaling ``x`` of a line after its step: ``target / sums``, over-relaxed ``x (target / (x sums))^omega``.

    ``sums`` are the line sums of ``K`` against the other scaling, so the matrix's line sums are
    ``x sums``. Returns ``(new, delta)`` with ``delta = log(target / (x sums))`` (None for
    ``omega = 1``); lines with ``active`` False keep scaling 0.
    """
    delta = None
    if omega == 1.0:
        new = target / sums if isinstance(target, torch.Tensor) else sums.reciprocal()
    else:
        delta = torch.log(target / (x * sums)) if isinstance(target, torch.Tensor) else -torch.log(x * sums)
        new = x * torch.exp(omega * delta)
    if active is not None:
        new = new.masked_fill_(~active, 0.0)
        if delta is not None:
            delta = delta.masked_fill_(~active, 0.0)
    return new, delta


def iterate_kernel(C, scale, f, g, a, b, mask, n_half, tol, state, record, patience=None):
    """Run ``n_half`` half-iterations (or until ``tol``) in the kernel domain; see the module docstring.

    Same contract as the materialized loop of :mod:`sinkflow.attention` (``_iterate``) for
    no-autograd solves: returns ``(P, f, g, err)``, ``P`` a fresh buffer.
    """
    bound = math.exp(0.5 * _flush_limits(C)[1])  # half the growth the multiplicative steps may take
    rows_on, cols_on = a > 0, b > 0
    every = bool(torch.minimum(a.amin(), b.amin()) > 0)  # one sync: every line has weight
    active_r, active_c = (None, None) if every else (rows_on, cols_on)
    ones_r = rows_on.to(C.dtype)
    mon = _Monitor(a, b, scale, tol, state, record, patience)
    K = u = v = sums = None
    f0, g0 = f, g
    top = {"row": math.inf, "col": math.inf}  # largest scaling of rows and columns
    done, err = 0, torch.full((), math.inf, dtype=C.dtype, device=C.device)
    while done < n_half:
        row_step = state["next"] == "row"
        new = None
        if K is not None:
            if sums is None:
                sums = _rows_times(K, v) if row_step else _times_cols(a * u, K)
            x = u if row_step else v
            new, delta = _new_scaling(x, sums, 1.0 if row_step else b, mon.omega, active_r if row_step else active_c)
            largest = float(new.amax())
            if not (largest <= bound and largest * top["col" if row_step else "row"] <= bound * bound):
                new = None  # absorb: re-exponentiate from the log potentials
            state["fallbacks"] = state.get("fallbacks", 0) + int(new is None)
        if new is None:
            K = None  # release before the log step allocates
            K, u, v, f0, g0, delta = _exponentiate(C, scale, f0, g0, u, v, a, b, mask, row_step, mon.omega,
                                                   None if every else (rows_on, cols_on))
            top = {"row": float(u.amax()), "col": 1.0} if row_step else {"row": 1.0, "col": float(v.amax())}
        elif row_step:
            u, top["row"] = new, largest
        else:
            v, top["col"] = new, largest
        done += 1
        state["count"] += 1
        state["next"] = "col" if row_step else "row"
        sums = None
        if not mon.wanted:
            continue
        # Error of the marginal not just normalized, from the sums the next step needs anyway.
        if row_step:
            sums = _times_cols(a * u, K)
            e = (sums * v - b).abs().sum(-1)
        else:
            sums = _rows_times(K, v)
            e = (a * (sums * u - ones_r).abs()).sum(-1)
        err, stop = mon.after(e, delta, row_step, n_half - done)
        if stop:
            break
    f, g = _absorbed(f0, g0, u, v, rows_on, cols_on)
    P = K.mul_(u.unsqueeze(-1)).mul_(v.unsqueeze(-2))
    return P, f, g, err


def _exponentiate(C, scale, f0, g0, u, v, a, b, mask, row_step, omega, lines):
    """Absorb the scalings into the potentials and take a log-domain step: ``(K, u, v, f0, g0, delta)``.

    ``lines`` is ``(rows_on, cols_on)`` when some line has weight 0, else None.
    """
    rows_on, cols_on = lines if lines is not None else (a > 0, b > 0)
    f, g = _absorbed(f0, g0, u, v, rows_on, cols_on)
    if row_step:
        K, full = _row_step_log(C, scale, g, mask)
        delta, f0, g0 = full - f, full, g
    else:
        K, full = _col_step_log(C, scale, f, a, b, mask)
        delta, f0, g0 = full - g, f, full
    # Subnormal entries (SoftMax leaves them, the column factor makes them) slow every product with
    # K several times and are below what a line sum resolves: zero them.
    K = torch.nn.functional.threshold_(K, torch.finfo(K.dtype).tiny, 0.0)
    new = torch.exp((omega - 1.0) * delta) if omega != 1.0 else torch.ones_like(delta)
    if lines is not None:
        new = new.masked_fill_(~(rows_on if row_step else cols_on), 0.0)
    u, v = (new, torch.ones_like(g)) if row_step else (torch.ones_like(f), new)
    return K, u, v, f0, g0, delta


def _absorbed(f0, g0, u, v, rows_on, cols_on):
    """Log potentials ``f0 + log u``, ``g0 + log v`` (unchanged on lines of weight 0)."""
    if u is None:
        return f0, g0
    f = f0 + torch.where(rows_on, u, torch.ones_like(u)).log_()
    g = g0 + torch.where(cols_on, v, torch.ones_like(v)).log_()
    return f, g
