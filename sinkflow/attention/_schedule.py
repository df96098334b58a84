"""Sinkhorn to tolerance: epsilon scaling (a schedule of stages from a spread-out start to the
scores themselves), the symmetric fixed point's start that skips it, the stage tolerances and
budgets, and the switch to Newton steps when a stage stalls.
"""

from __future__ import annotations

import math

import torch

from sinkflow.attention._newton import _newton_polish
from sinkflow.attention._sinkhorn_steps import _iterate

__all__ = []


_STAGE_TOL = 1e-3  # loosest tolerance of an intermediate epsilon-scaling stage


_PATIENCE = 400  # predicted half-steps to the tolerance beyond which a stage switches to Newton


_MIN_PATIENCE = 50  # ... for small problems, whose Newton step costs a few dozen half-steps (n = 32)


def _patience(C) -> int:
    """Half-steps a stage may still predict before Newton takes over: ``n`` for ``n`` keys, within
    ``[_MIN_PATIENCE, _PATIENCE]``. A Newton step solves an ``n x n`` system (``n^3``) where a
    half-step is a product (``n^2``); at small ``n`` both cost the same few calls."""
    return min(_PATIENCE, max(_MIN_PATIENCE, C.shape[-1]))


_MAX_SPLITS = 8  # epsilon-scaling stages inserted at most after stalls


_NEWTON_ROUNDS = 4  # Newton rounds at most per stage (each ends when it stops improving)


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
        patience = _patience(C) if newton_rounds < _NEWTON_ROUNDS else math.inf
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
