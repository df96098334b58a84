"""Integrators of particle flows: the explicit Euler and RK4 steps that :func:`sinkflow.simulate`
takes on a :class:`~sinkflow.fields.ParticleField`. A residual attention layer is one Euler step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sinkflow.fields._particle_field import ParticleField

__all__ = ["euler_step", "rk4_step", "INTEGRATORS"]


def euler_step(field: ParticleField, X: torch.Tensor, h: float):
    """One explicit Euler step (a residual layer); returns the new state and the evaluations.

    Parameters
    ----------
    field : ParticleField
    X : torch.Tensor (n, d)
        State.
    h : float
        Step size.

    Returns
    -------
    (torch.Tensor (n, d), list of FieldEvaluation)
        ``retract(X + h v(X))`` and the one evaluation of the field.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.particles import ParticleField, euler_step
    >>> field = ParticleField("softmax", W=None, W_V=None, n_iter=None, weights=None, temperature=1.0,
    ...                       tol=1e-10, max_iter=1000, chunked=False, landmarks=None, warm_start=False,
    ...                       sphere=True, need_errors=False)
    >>> X = torch.nn.functional.normalize(torch.randn(5, 3, dtype=torch.float64,
    ...                                               generator=torch.Generator().manual_seed(0)), dim=1)
    >>> Y, evs = euler_step(field, X, 0.1)
    >>> Y.shape, len(evs), bool(torch.allclose(Y.norm(dim=1), torch.ones(5, dtype=torch.float64)))  # on the sphere
    (torch.Size([5, 3]), 1, True)
    >>> v, _ = field.velocity(X)   # projected on the tangent spaces
    >>> bool(torch.allclose((v * X).sum(1), torch.zeros(5, dtype=torch.float64), atol=1e-12))
    True
    >>> bool(torch.allclose(Y, field.retract(X + 0.1 * v)))
    True
    """
    v, ev = field.velocity(X)
    return field.moved(X, v, h), [ev]


def rk4_step(field: ParticleField, X: torch.Tensor, h: float):
    """One classical Runge-Kutta step (the continuous-depth reference).

    Parameters
    ----------
    field : ParticleField
    X : torch.Tensor (n, d)
        State.
    h : float
        Step size.

    Returns
    -------
    (torch.Tensor (n, d), list of FieldEvaluation)
        The new state and the four evaluations of the field.

    Examples
    --------
    >>> import torch, sinkflow
    >>> from sinkflow.particles import ParticleField, default_tol, rk4_step
    >>> X = torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> field = ParticleField("sinkhorn", W=None, W_V=None, n_iter=None, weights=None, temperature=1.0,
    ...                       tol=default_tol(X.dtype), max_iter=20_000, chunked=False, landmarks=None,
    ...                       warm_start=True, sphere=False, need_errors=False)
    >>> Y, evs = rk4_step(field, X, 0.1)
    >>> len(evs)
    4
    >>> ref = sinkflow.simulate(X, "sinkhorn", h=0.1, steps=1, integrator="rk4").final   # the same step
    >>> bool(torch.allclose(Y, ref))
    True
    """
    v1, e1 = field.velocity(X)
    v2, e2 = field.velocity(field.moved(X, v1, 0.5 * h))
    v3, e3 = field.velocity(field.moved(X, v2, 0.5 * h))
    v4, e4 = field.velocity(field.moved(X, v3, h))
    return field.moved(X, v1 + 2 * v2 + 2 * v3 + v4, h / 6), [e1, e2, e3, e4]


#: Integrators by name: ``step(field, X, h) -> (X_next, evaluations)``.
INTEGRATORS = {"euler": euler_step, "rk4": rk4_step}


@dataclass(frozen=True)
class _Run:
    steps: np.ndarray  # step indices of the saved positions
    positions: torch.Tensor
    iterations: np.ndarray  # (steps, systems...) solver iterations per step
    converged: Any  # bool, or a bool array per system


def _per_system(value):
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value


def _integrate(field, X, step, h, steps, record, save_every, progress, name, fixed_count, check_every=1) -> _Run:
    """``steps`` integrator steps of size ``h`` from ``X``, monitored, every ``save_every``-th position kept.

    ``X`` may hold a batch of systems (``(B, n, d)``, ``h`` a float or a ``(B, 1, 1)`` tensor):
    iteration counts and convergence are then per system. ``fixed_count``: the field's iterations (and so
    its cost) do not depend on the state, and it reports no convergence to track.

    What depends only on the call's settings (whether monitors run, the progress bar, where each position
    is saved, how the states are checked for finiteness) is decided before the first step, which is the
    integrator's tensor operations and little else. A run that saves every state and runs no monitors
    checks the saved states for NaN and inf every ``check_every`` steps (:data:`CHECK_EVERY` for a dense
    field of a fixed count: a non-finite state costs no more than a finite one there, and evaluates to NaN
    without an error), in one pass; the first non-finite state is found among them, and the error names
    its step all the same. Otherwise every state is checked as it comes.

    A run of Euler steps of a fixed count without monitors takes its steps after the first through the field's
    :meth:`~sinkflow.fields.ParticleField.euler_stepper` where it has one: the step's tensor operations, written
    straight into the saved positions, the same iteration count for every step.
    """
    kept = [0, *range(save_every, steps + 1, save_every)]
    kept += [steps] if kept[-1] != steps else []
    # one preallocated tensor: a list of clones stacked at the end copied every position twice
    # (1.3 ms a step for 2,048 x 32 x 2 saved every step) and held it twice; autograd's in-place copy keeps
    # the graph of a position that has one
    positions = torch.empty((len(kept), *X.shape), dtype=X.dtype, device=X.device)
    positions[0].copy_(X)
    slot = {k: i for i, k in enumerate(kept)}  # step -> row of positions
    tally = _Tally(X.shape[:-2], fixed_count)
    monitored = bool(record.functions)
    check = _Checks(positions, h, every=check_every if save_every == 1 and not monitored else 1)
    ticks = iter(_steps(steps, progress, name))
    for k in ticks:
        X_next, evs = step(field, X, h)
        if monitored:
            record(k, X, evs[0])
        X = X_next
        tally.add(evs)
        row = slot.get(k + 1)
        if row is not None:
            positions[row].copy_(X)
        check(k, X)
        if k == 0:  # the first step chose the field's evaluation: the others may be its operations only
            stepper = _lean_stepper(field, step, h, fixed_count, monitored)
            if stepper is not None:
                X = _lean_steps(stepper, X, ticks, slot, positions, check)
    check.last(steps, X)
    record(steps, X, None, force=True)
    return _Run(np.array(kept), positions, *tally.results(steps))


def _lean_stepper(field, step, h, fixed_count: bool, monitored: bool):
    """The field's Euler step reduced to its operations (:meth:`~sinkflow.fields.ParticleField.euler_stepper`) for
    Euler steps of a fixed count without monitors; else None (also for a field composed with a placement, whose
    class has none of its own: it forwards other attributes to its field)."""
    if step is not euler_step or not fixed_count or monitored or not hasattr(type(field), "euler_stepper"):
        return None
    return field.euler_stepper(h)


def _lean_steps(stepper, X, ticks, slot, positions, check):
    """The steps ``ticks`` left to a run through ``stepper``, each state written straight into its row of
    ``positions`` where it is saved; the last state."""
    for k in ticks:
        row = slot.get(k + 1)
        X = stepper(X, None if row is None else positions[row])
        check(k, X)
    return X


#: Steps between two finiteness checks of a dense run of a fixed count that saves every state (:func:`_integrate`).
CHECK_EVERY = 16


class _Tally:
    """The solver iterations of every step and the convergence of the run (per system for a batch)."""

    def __init__(self, batch, fixed_count: bool):
        self.batch, self.fixed_count = tuple(batch), fixed_count
        self.counts, self.converged = [], np.ones(self.batch, dtype=bool)

    def add(self, evs):
        if self.batch:  # arrays per system, copied (a field may reuse its arrays)
            self.counts.append(sum(_per_system(ev.n_iter) for ev in evs))
        else:  # Python numbers, made an array at the end
            self.counts.append(evs[0].n_iter if len(evs) == 1 else sum(ev.n_iter for ev in evs))
        if not self.fixed_count:
            for ev in evs:
                if ev.converged is not True:
                    self.converged &= _per_system(ev.converged)

    def results(self, steps: int):
        if len(self.counts) < steps:  # the lean steps report nothing: their count is the fixed one
            self.counts += [self.counts[-1]] * (steps - len(self.counts))
        if not self.batch:
            iterations = np.array(self.counts, dtype=int).reshape(steps)  # Python ints (or 0-d tensors)
        else:
            iterations = np.zeros((steps,) + self.batch, dtype=int)
            for k, count in enumerate(self.counts):
                iterations[k] = count
        converged = self.converged
        return iterations, converged if converged.ndim else bool(converged)


class _Checks:
    """The finiteness check of a run's states: every step, or every ``every`` steps on the saved states (all
    of them, ``positions``) in one pass, in numpy for a CPU float tensor (a tenth of torch's time on an
    ensemble's 2,048 x 32 x 2 positions, half of it at one system's)."""

    def __init__(self, positions: torch.Tensor, h, every: int):
        self.h, self.every, self.done = h, every, 0  # states 0..done checked
        in_numpy = positions.device.type == "cpu" and positions.dtype in (torch.float32, torch.float64)
        self.saved = positions.detach().numpy() if in_numpy else None
        if self.saved is None:
            self.every = 1

    def __call__(self, k: int, X: torch.Tensor):
        if self.every == 1:
            if not self._finite(X):
                _left_the_range(X, k, self.h)
        elif (k + 1) % self.every == 0:
            self.last(k + 1, X)

    def last(self, steps: int, X: torch.Tensor):
        """Check the saved states up to ``steps`` (the end of the run)."""
        if self.every == 1 or steps == self.done:
            return
        block = self.saved[self.done + 1 : steps + 1]
        if not np.isfinite(block).all():
            first = self.done + 1 + int(np.flatnonzero(~np.isfinite(block).reshape(len(block), -1).all(1))[0])
            _left_the_range(torch.from_numpy(self.saved[first]), first - 1, self.h)
        self.done = steps

    def _finite(self, X: torch.Tensor) -> bool:
        if self.saved is not None:
            return bool(np.isfinite(X.detach().numpy()).all())
        return bool(torch.isfinite(X.detach()).all())


def _steps(steps: int, progress, name: str):
    """The step indices, through a progress bar unless ``progress`` is False (no bar to build or update)."""
    if progress is False:
        return range(steps)
    from sinkflow._progress import progress_bar

    return progress_bar(range(steps), enabled=progress, desc=f"{name} flow", unit="step")


def _left_the_range(X, k, h):
    where, t = "", (k + 1) * h
    if X.ndim > 2:
        bad = (~torch.isfinite(X.detach())).flatten(1).any(1).nonzero().flatten().tolist()
        where = f" in system {bad[0]} (of the flattened batch; {len(bad)} systems in all)"
        t = (k + 1) * float(h.flatten()[bad[0]]) if isinstance(h, torch.Tensor) else t
    raise FloatingPointError(
        f"the flow left the floating-point range at step {k + 1} (t = {t:g}){where}; "
        "the unnormalized kernel grows like exp(x^T W y): use a smaller h, fewer steps or a larger temperature")
