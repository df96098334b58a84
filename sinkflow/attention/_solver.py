r"""One Sinkhorn solver over kernel operators: the half-step loop, its stopping rule and its report.

A kernel operator (:class:`KernelOperator`) knows how its kernel is applied: a dense matrix kept
in the log domain or as scalings of an exponentiated one (:mod:`sinkflow.attention._operators`),
score blocks recomputed row block by row block (:mod:`sinkflow.fields._blockwise_fields`).
This module knows how Sinkhorn iterates over any of them:

* :func:`_half_steps` runs half-steps (a row step, then a column step, ...) and reads the marginal
  error every ``k`` half-steps (``operator.check_every``: 1 where the error is a by-product of the
  next step's sums, 2 where it comes fused with the row step only); reading it is the host sync the
  stopping rule pays. The monitor stops at ``tol``, adapts over-relaxation, and gives up early
  when the observed rate predicts more half-steps than ``patience`` or the budget left.
* :func:`_solve_to_tolerance` is the run to tolerance with the accelerations that work across
  operators: epsilon scaling (a schedule of score multipliers, for operators with
  ``rescalable``), over-relaxation, and Newton steps on the dual (for operators with a
  ``newton`` method) when a stage stalls. A warm start is the operator's starting potentials.
* :func:`sinkhorn_solve` is the entry: a fixed number of half-steps (lean: no error read unless
  ``report=True``) or to tolerance; it returns the operator's output and one :class:`SolveReport`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

__all__ = []


class KernelOperator(Protocol):
    r"""How a Sinkhorn kernel :math:`K_{ij} = e^{f_i + C_{ij} + g_j}` is applied (rows sum to 1, :math:`a^T K = b`).

    Leading dimensions of ``a`` and ``b`` are independent problems (batch, heads, ensemble
    members); errors are per problem and the solver reads their maximum.

    Attributes
    ----------
    domain : {"log", "scaling"}
        Where the operator keeps its state: log potentials and log-sum-exp steps, or
        multiplicative scalings of an exponentiated kernel (absorbed into log potentials when
        they leave a safe range). A kernel without a log domain (low-rank, harmonic) is "scaling".
    a, b : tensors (..., n) and (..., m)
        Row and column weights.
    check_every : int
        Half-steps between two error reads (1 or 2).
    rescalable : bool
        Whether :meth:`reset` accepts a score multiplier ``scale != 1`` (epsilon scaling).
    differentiable : bool
        Whether autograd follows the steps (then no Newton steps: the iterations are what is
        differentiated).

    Methods
    -------
    reset(scale, f, g)
        Start afresh (next step from the log potentials) on the scores ``scale * C``.
    step(row, omega, fused) -> delta or None
        One half-step over every leading dimension: rows to 1 (``row``) or columns to ``b``,
        over-relaxed by ``omega``. Returns the log factor of the step (needed when ``omega != 1``;
        an operator that cannot over-relax is solved with ``accelerate=False``). A symmetric
        operator (``a = b``, symmetric kernel) may take a whole symmetric step instead.
        ``fused`` says the step's by-products will be read (its error, or the final apply).
    error(row) -> tensor (...)
        L1 error of the marginal the step along ``row`` did not normalize, per problem
        (a by-product where the operator can; else one more pass).
    potentials() -> (f, g)
        The current state :meth:`reset` starts from: log potentials, or for an operator without
        them the scalings (the grid's symmetric operator: ``(None, s)``).
    finish()
        The operator's output (the matrix, or the values ``K V`` with the row sums in one pass).
    newton(scale, f, g, tol, state) -> (f, g, improved) (optional)
        Newton steps on the dual from ``(f, g)`` (plan products), each appending its error to
        ``state["errors"]``.
    """

    domain: str
    a: torch.Tensor
    b: torch.Tensor
    check_every: int
    rescalable: bool
    differentiable: bool

    def reset(self, scale: float, f: torch.Tensor, g: torch.Tensor) -> None: ...

    def step(self, row: bool, omega: float, fused: bool) -> torch.Tensor | None: ...

    def error(self, row: bool) -> torch.Tensor: ...

    def potentials(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    def finish(self) -> Any: ...


@dataclass
class SolveReport:
    """The solver's report: half-steps done, the last marginal error read, convergence, history.

    ``errors`` and ``scales`` hold one entry per error read (and per Newton step); ``stalled``
    is the error at which a stage gave up, if one did. :class:`~sinkflow.SinkhornResult` is
    built from it.
    """

    n_iter: int = 0
    marginal_error: float = math.inf
    converged: bool = False
    errors: list = field(default_factory=list)
    scales: list = field(default_factory=list)
    stalled: float | None = None


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
    """Error bookkeeping after each error read: records, stops, adapts ``omega`` (the one stopping rule).

    ``after`` takes the L1 error ``e`` of the marginal not just normalized (per problem) and
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
        if not isinstance(e, torch.Tensor):  # an operator on numpy arrays
            e = torch.as_tensor(e)
        other = e
        if self.omega != 1.0:
            # Over-relaxed steps leave the marginal just treated off by exp((omega-1) delta) - 1.
            miss = torch.expm1((self.omega - 1.0) * delta).abs()
            e = torch.maximum(e, (self.a * miss).sum(-1) if row_step else (self.b * miss).sum(-1))
        err = e if e.ndim == 0 and not e.requires_grad else _max_over_batch(e.detach())
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


def new_state(check, accelerate=False):
    """The solver's bookkeeping: next half-step, count, error history, what the monitor does."""
    return {"next": "row", "count": 0, "errors": [], "scales": [], "check": check, "accelerate": accelerate}


def _half_steps(op, scale, n_half, tol, state, record, patience=None, read_start=False):
    """Run ``n_half`` half-steps of ``op`` (or until ``tol``); the error is read every ``op.check_every``.

    ``state`` holds the half-step parity and counters across stages. With ``read_start`` the error
    of the start is read first (a warm start already within ``tol`` costs no step). Returns the
    last error read (a tensor; ``inf`` when none was).
    """
    if tol is not None and not record and patience is None and state["check"] and not state.get("accelerate"):
        return _plain_steps(op, n_half, tol, state, read_start)
    if tol is None and not record:  # the lean fixed count: no error read, no monitor
        row = state["next"] == "row"
        for done in range(1, int(n_half) + 1):
            op.step(row, 1.0, done == n_half)
            row = not row
        state["count"] += max(int(n_half), 0)
        state["next"] = "row" if row else "col"
        return math.inf
    mon = _Monitor(op.a, op.b, scale, tol, state, record, patience)
    k = op.check_every
    err = math.inf
    done = 0
    if read_start and mon.wanted:
        err, stop = mon.after(op.error(state["next"] != "row"), None, state["next"] != "row", n_half)
        if stop:
            return err
    step, error, wanted = op.step, op.error, mon.wanted  # (the loop of small kernels: no lookups per step)
    row = state["next"] == "row"
    while done < n_half:
        read = wanted and done % k == 0
        delta = step(row, mon.omega, read or done + 1 == n_half)
        done += 1
        if read:
            err, stop = mon.after(error(row), delta, row, n_half - done)
            if stop:
                row = not row
                break
        row = not row
    state["count"] += done
    state["next"] = "row" if row else "col"
    return err


def _plain_steps(op, n_half, tol, state, read_start):
    """:func:`_half_steps` with the stop test alone (no record, no rate to read, no relaxation: a few
    microseconds a read, for the small operators whose solve is a handful of steps): the error read every
    ``op.check_every`` half-steps (first the start's with ``read_start``), stop once it is at most ``tol``."""
    row, k, done, err = state["next"] == "row", op.check_every, 0, math.inf
    if read_start:
        err = _largest(op.error(not row))
        if float(err) <= tol:
            return err
    step, error = op.step, op.error
    while done < n_half:
        read = done % k == 0
        step(row, 1.0, read or done + 1 == n_half)
        done += 1
        if read:
            err = _largest(error(row))
            if float(err) <= tol:
                row = not row
                break
        row = not row
    state["count"] += done
    state["next"] = "row" if row else "col"
    return err


def _largest(e):
    """The error the stop test reads: a float as it is (an operator on numpy arrays), else the largest over
    the leading dimensions (a tensor)."""
    if not isinstance(e, torch.Tensor):
        return e
    return e if e.ndim == 0 and not e.requires_grad else _max_over_batch(e.detach())


_STAGE_TOL = 1e-3  # loosest tolerance of an intermediate epsilon-scaling stage


_PATIENCE = 400  # predicted half-steps to the tolerance beyond which a stage switches to Newton


_MIN_PATIENCE = 50  # ... for small problems, whose Newton step costs a few dozen half-steps (n = 32)


def _patience(m) -> int:
    """Half-steps a stage may still predict before Newton takes over: ``m`` for ``m`` keys, within
    ``[_MIN_PATIENCE, _PATIENCE]``. A Newton step solves an ``n x n`` system (``n^3``) where a
    half-step is a product (``n^2``); at small ``n`` both cost the same few calls."""
    return min(_PATIENCE, max(_MIN_PATIENCE, m))


_MAX_SPLITS = 8  # epsilon-scaling stages inserted at most after stalls


_NEWTON_ROUNDS = 4  # Newton rounds at most per stage (each ends when it stops improving)


def _stage_tolerance(tol, scale):
    """Tolerance of an intermediate epsilon-scaling stage at score multiplier ``scale`` < 1.

    Follows the scale: loose while the problem is warm (its solution is only a start), down
    to ``tol / scale`` near the end, so that the last stage starts where little is left.
    """
    return min(_STAGE_TOL, max(tol, tol / scale))


def _solve_stage(op, scale, f, g, tol, budget, state, newton):
    """Reach ``tol`` on the scores ``scale * C`` within ``budget`` half-iterations.

    Accelerated half-iterations first; when their rate predicts more than the patience
    further half-steps, Newton steps on the dual take over (``newton``: the operator has them
    and they are wanted), then half-iterations resume from the improved potentials (a log step
    first). Without Newton, or once it stops improving, a stage whose rate cannot reach ``tol``
    within the budget stops early (``state["stalled"]``). Returns the last error read.
    """
    start = state["count"]
    newton_rounds = _NEWTON_ROUNDS if not newton else 0
    while True:
        left = max(budget - (state["count"] - start), 1)
        state["slow"] = False
        patience = _patience(op.b.shape[-1]) if newton_rounds < _NEWTON_ROUNDS else math.inf
        op.reset(scale, f, g)
        err = _half_steps(op, scale, left, tol, state, True, patience=patience)
        if not state["slow"]:
            return float(err)
        if newton_rounds >= _NEWTON_ROUNDS:
            state["stalled"] = float(err)
            return float(err)
        newton_rounds += 1
        f, g = op.potentials()
        op.reset(scale, f, g)  # release the kernel before Newton allocates
        f, g, improved = op.newton(scale, f, g, tol, state)
        if not improved:
            newton_rounds = _NEWTON_ROUNDS
        state["next"] = "row"


def _solve_to_tolerance(op, f, g, tol, max_iter, state, schedule, newton):
    """Epsilon scaling over ``schedule``; every stage solved by :func:`_solve_stage`.

    A stage that stalls although its predecessor converged is retried from the
    predecessor's potentials with an intermediate score multiplier inserted (the geometric
    mean), at most ``_MAX_SPLITS`` times: the start was too far for Newton's region of fast
    convergence. The operator is left at the last stage's end (its output: ``op.finish()``).
    """
    scales = list(schedule)
    prev, k, splits = None, 0, 0
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
        _solve_stage(op, scale, f * ratio, g * ratio, stage_tol, budget, state, newton)
        if "stalled" in state and prev is not None and ratio > 1.1 and splits < _MAX_SPLITS:
            del state["stalled"]
            scales.insert(k, math.sqrt(prev * scale))
            splits += 1
            continue
        (f, g), prev, k = op.potentials(), scale, k + 1


def sinkhorn_solve(op, f, g, *, n_iter=None, tol=None, max_iter=2000, schedule=(1.0,), accelerate=True,
                   stall=True, read_start=False, report=False):
    """Sinkhorn on the kernel operator ``op`` from the log potentials ``(f, g)``: ``(output, SolveReport)``.

    ``n_iter`` half-steps (row step first, so ``g`` is the warm start): the lean entry, no error read
    unless ``report``; ``report.converged`` is then True unless a ``tol`` is given and the last error
    read exceeds it. With ``n_iter=None``: until the marginal error read is at most ``tol`` within
    ``max_iter`` half-steps. With ``accelerate``, over-relaxation, and Newton steps where ``op`` has
    them and is not differentiated; ``schedule`` of score multipliers (epsilon scaling, a
    ``rescalable`` operator); with ``stall``, stages stop early when their rate shows ``tol`` out of
    reach (``report.stalled``), else the plain loop runs to ``max_iter`` (reading the error of the
    start first with ``read_start``).
    """
    if n_iter is not None:
        state = new_state(check=False)
        op.reset(1.0, f, g)
        err = float(_half_steps(op, 1.0, int(n_iter), None, state, report))
        return op.finish(), fixed_report(state["count"], err, tol, _floats(state["errors"]), state["scales"])
    if len(schedule) > 1 and not op.rescalable:
        raise ValueError("epsilon scaling (a schedule of score multipliers) needs a rescalable operator")
    state = new_state(check=True, accelerate=accelerate)
    if stall:
        newton = accelerate and hasattr(op, "newton") and not op.differentiable
        _solve_to_tolerance(op, f, g, tol, max_iter, state, schedule, newton)
        err = float(state["errors"][-1]) if state["errors"] else math.inf
    else:
        op.reset(1.0, f, g)
        err = float(_half_steps(op, 1.0, int(max_iter), tol, state, False, read_start=read_start))
    out = op.finish()
    return out, SolveReport(state["count"], err, err <= tol, _floats(state["errors"]), state["scales"],
                            state.get("stalled"))


def fixed_report(n_iter, error=math.inf, tol=None, errors=None, scales=None) -> SolveReport:
    """The report of a fixed count of ``n_iter`` half-steps (the solver's lean entry, and the fused torch
    kernels that keep their own passes): converged unless a ``tol`` is given and the last ``error`` read
    exceeds it (``inf``: none read)."""
    return SolveReport(n_iter, error, True if tol is None else error <= tol, errors or [], scales or [])


def _failure_message(report, tol, max_iter, dtype):
    """Why a run to tolerance did not deliver ``tol`` (the text of its :class:`SinkhornWarning`)."""
    err = report.marginal_error
    if report.stalled is not None:
        why = (f"stopped after {report.n_iter} half-iterations: the error stalled at {report.stalled:.3g}, "
               "above tol")
    elif report.n_iter >= max_iter:
        why = f"stopped at max_iter={max_iter} half-iterations"
    else:
        why = "converged, but rounding the result to its dtype moved the marginals"
    return (f"Sinkhorn {why} (marginal error {err:.3g} > tol={tol:g}, {dtype}); loosen tol, raise max_iter, "
            "or use float64 scores.")


def _floats(errors):
    return [float(e) for e in errors]
