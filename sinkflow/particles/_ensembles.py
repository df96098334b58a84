"""Ensembles in :func:`sinkflow.simulate`: many independent systems in one call.

``x0`` of shape ``(..., n, d)``; ``temperature`` and ``h`` (scalars or arrays), ``W_Q``, ``W_K``,
``W_V`` (``(..., d, d)``) and ``weights`` (``(..., n)``) carry leading batch dimensions that
broadcast against those of ``x0``. Every system evolves as it would alone:

* the dense attentions (``"softmax"``, ``"sinkhorn"``, ``"unnormalized"``, ``"gaussian"``) run as one
  batched tensor flow; a batched Sinkhorn solve to tolerance stops each system when it converges
  (:mod:`sinkflow.attention._symmetric_sinkhorn`, for a symmetric positive semi-definite
  ``W_Q^T W_K``, the default identity included); SoftMax (of more than a few systems on the CPU:
  :data:`~sinkflow.fields._ensemble_fields.SMALL_ENSEMBLE`) and Sinkhorn to tolerance evaluate their
  field block by block in cache (:mod:`sinkflow.fields._ensemble_fields`);
* everything else (landmarks, block-wise fields, registered attentions, non-symmetric ``W`` to
  tolerance, gradients) runs system by system through the single-system flow.

A batch whose matrices would not fit the dense budget runs in chunks of systems.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import torch

from sinkflow._backend import broadcast_shapes, check_float, from_torch, leading
from sinkflow._progress import progress_bar
from sinkflow.fields._dense_fields import (
    DENSE_BYTES_LIMIT,
    check_matrix,
    check_weights,
    dense_limit,
    single_thread_if_small,
)
from sinkflow.fields._ensemble_fields import EnsembleField, takes_ensemble
from sinkflow.fields._particle_field import ParticleField
from sinkflow.particles._integrators import INTEGRATORS, _integrate
from sinkflow.particles._monitors import (
    MONITOR_FUNCTIONS,
    MonitorContext,
    MonitorRecords,
    _energy_kind,
    _Recorder,
)
from sinkflow.particles._placements import check_placed_start, placed
from sinkflow.particles._settings import EvaluationPath, FlowSettings
from sinkflow.particles._step_size import _check_step_size, _lipschitz, _symmetric_psd
from sinkflow.particles._system import _counting, run_system
from sinkflow.particles._trajectory import Trajectory, _check_positions

__all__ = ["is_ensemble", "simulate_ensemble"]


def _ndim(value) -> int:
    return value.ndim if isinstance(value, torch.Tensor) else np.ndim(value) if not isinstance(value, str) else 0


def is_ensemble(x0, W_Q, W_K, W_V, weights, temperature, h) -> bool:
    """Whether a :func:`sinkflow.simulate` call has leading batch dimensions anywhere."""
    return (_ndim(x0) > 2 or any(M is not None and _ndim(M) > 2 for M in (W_Q, W_K, W_V))
            or (weights is not None and _ndim(weights) > 1) or _ndim(temperature) > 0 or _ndim(h) > 0)


def _positive_per_system(value, name: str, like: torch.Tensor) -> torch.Tensor:
    """A float64 tensor of positive, finite values (one per system); errors name ``name``."""
    if type(value) in (float, int) and 0 < value < math.inf:  # one number: checked in Python, one tensor made
        return torch.tensor(float(value), dtype=torch.float64, device=like.device)
    if isinstance(value, (str, bytes, bool)) or (not isinstance(value, torch.Tensor)
                                                 and np.asarray(value).dtype.kind not in "iuf"):
        raise TypeError(f"{name} must be a real number or an array of them, got {value!r}")
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))  # keeps 0-d
    if t.dtype == torch.bool or t.is_complex() or not (t.is_floating_point() or t.dtype in
                                                        (torch.int8, torch.int16, torch.int32, torch.int64)):
        raise TypeError(f"{name} must be real numbers, got dtype {t.dtype}")
    t = t.detach().to(dtype=torch.float64, device=like.device)
    bad = ~(torch.isfinite(t) & (t > 0))
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must be positive and finite for every system; {name}{list(index)} = "
                         f"{float(t[index]):g}")
    return t


def _batch_shape(parts) -> tuple:
    """Broadcast the batch shapes ``[(name, shape), ...]``, naming the first that does not fit."""
    batch, seen = (), []
    for name, shape in parts:
        try:
            batch = broadcast_shapes(batch, shape)
        except RuntimeError:
            raise ValueError(f"the batch dimensions {tuple(shape)} of {name} do not broadcast against "
                             f"{tuple(batch)} (the batch of {', '.join(seen)})") from None
        seen.append(name)
    return tuple(batch)


def _flat(t, batch, tail):
    """``t`` broadcast to ``batch + tail`` and flattened to ``(B,) + tail`` (None stays None)."""
    if t is None:
        return None
    return t.expand(batch + tail).reshape((-1,) + tail)


def simulate_ensemble(x0, variant, W_Q, W_K, W_V, weights, temperature, h, steps: int,
                      settings: FlowSettings) -> Trajectory:
    """:func:`sinkflow.simulate` for a batch of systems (see the module docstring), its keywords checked
    into ``settings`` and its attention resolved to ``variant``."""
    X, numpy_out = leading(x0, "x0", W_Q, W_K, W_V, weights)
    check_float(X, "x0")
    if X.ndim < 2:
        raise ValueError(f"x0 must have shape (..., n, d), got {tuple(X.shape)}")
    n, d = X.shape[-2:]
    mats = {name: check_matrix(M, name, d, X, batched=True) for name, M in (("W_Q", W_Q), ("W_K", W_K), ("W_V", W_V))}
    a = check_weights(weights, X, batched=True)
    tau = _positive_per_system(temperature, "temperature", X)
    hs = _positive_per_system(h, "h", X)
    parts = [("x0", X.shape[:-2])] + [(k, M.shape[:-2]) for k, M in mats.items() if M is not None]
    parts += [("weights", a.shape[:-1])] if a is not None else []
    batch = _batch_shape(parts + [("temperature", tau.shape), ("h", hs.shape)])
    _check_positions(X, settings.manifold, batched=True)  # finite, and on the sphere for manifold="sphere"
    systems = _Systems(X, mats, a, tau, hs, batch)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (X, *mats.values()))
    why_not = "gradients are tracked" if grad else _not_batched(variant, systems, settings)
    if why_not is None:
        traj = _in_batches(systems, variant, steps, settings)
    else:
        traj = _system_by_system(systems, variant, steps, settings, why_not)
    return _shaped(traj, systems, numpy_out, tau.ndim > 0, hs.ndim > 0)


class _Systems:
    """The validated inputs of an ensemble, flattened to ``B`` systems."""

    def __init__(self, X, mats, a, tau, hs, batch):
        n, d = X.shape[-2:]
        self.batch, self.count = batch, math.prod(batch)
        self.X = _flat(X, batch, (n, d))
        self.mats = {k: _flat(M, batch, (d, d)) if M is not None and M.ndim > 2 else M for k, M in mats.items()}
        self.a = None if a is None else _flat(a, batch, (n,))
        self.tau, self.h = _flat(tau, batch, ()), _flat(hs, batch, ())

    def one(self, b: int) -> dict:
        """The inputs of system ``b`` as :func:`~sinkflow.particles._system.run_system` takes them."""

        def pick(M):
            return M if M is None or M.ndim == 2 else M[b]

        Wq, Wk, Wv = (pick(self.mats[k]) for k in ("W_Q", "W_K", "W_V"))
        return dict(X=self.X[b], Wq=Wq, Wk=Wk, Wv=Wv, a=None if self.a is None else self.a[b],
                    tau=float(self.tau[b]), h=float(self.h[b]))

    def part(self, lo: int, hi: int) -> _Systems:
        sub = object.__new__(_Systems)
        sub.batch, sub.count = (hi - lo,), hi - lo
        sub.X = self.X[lo:hi]
        sub.mats = {k: M if M is None or M.ndim == 2 else M[lo:hi] for k, M in self.mats.items()}
        sub.a = None if self.a is None else self.a[lo:hi]
        sub.tau, sub.h = self.tau[lo:hi], self.h[lo:hi]
        return sub


def _interaction(systems):
    Wq, Wk = systems.mats["W_Q"], systems.mats["W_K"]
    if Wq is None and Wk is None:
        return None
    eye = torch.eye(systems.X.shape[-1], dtype=systems.X.dtype, device=systems.X.device)
    return (Wq if Wq is not None else eye).mT @ (Wk if Wk is not None else eye)


def _not_batched(variant, systems, settings: FlowSettings) -> str | None:
    """Why the systems cannot run as one batched tensor flow (None when they can)."""
    asked, solver = settings.evaluation, settings.solver
    if not variant.batched:
        return f"attention {variant.name!r} is a callable on dense scores: it has no batched flow"
    if asked.causal or asked.landmarks is not None or asked.chunked:
        return "causal, landmarks or chunked asked for"
    if systems.X.shape[-2] > dense_limit(systems.X.dtype):
        return "one n x n matrix would exceed the dense budget"
    if variant.solver == "sinkhorn" and solver.n_iter is None and not _symmetric_psd(_interaction(systems)):
        return "Sinkhorn to tolerance with a W_Q^T W_K that is not symmetric positive semi-definite"
    return None


def _system_by_system(systems, variant, steps, settings: FlowSettings, why: str):
    """Each system through the single-system flow; the trajectories stacked."""
    quiet = replace(settings, recording=replace(settings.recording, progress=False))
    bar = progress_bar(range(systems.count), enabled=settings.recording.progress, desc="systems", unit="system")
    runs = [run_system(variant=variant, steps=steps, settings=quiet, **systems.one(b)) for b in bar]
    first = runs[0]

    def stack(key):
        return np.stack([getattr(r, key) for r in runs], axis=1)

    return replace(first, times=stack("times"), positions=torch.stack([torch.as_tensor(r.positions) for r in runs], 1),
                   monitors=MonitorRecords({k: np.stack([r.monitors[k] for r in runs], 1) for k in first.monitors}),
                   monitor_times=stack("monitor_times"), sinkhorn_iterations=stack("sinkhorn_iterations"),
                   converged=np.array([r.converged for r in runs]), temperature=systems.tau.cpu().numpy(),
                   h=systems.h.cpu().numpy(), weights=None if systems.a is None else systems.a,
                   evaluation=EvaluationPath(first.evaluation.name,
                                             f"system by system: {why}; the first system's: {first.evaluation.reason}"))


def _in_batches(systems, variant, steps, settings: FlowSettings):
    """The batched flow, in chunks of systems that fit the dense budget; the chunks concatenated."""
    n = systems.X.shape[-2]
    per_system = 6 * n * n * systems.X.element_size()  # the scores, the kernel and their temporaries
    size = max(1, min(systems.count, DENSE_BYTES_LIMIT // per_system))
    chunks = [_chunk(systems.part(lo, min(lo + size, systems.count)), variant, steps, settings)
              for lo in range(0, systems.count, size)]
    if len(chunks) == 1:
        return chunks[0]

    def cat(key, axis=1):
        return np.concatenate([getattr(c, key) for c in chunks], axis=axis)

    first = chunks[0]
    return replace(first, positions=torch.cat([c.positions for c in chunks], 1),
                   monitors=MonitorRecords({k: np.concatenate([c.monitors[k] for c in chunks], 1)
                                            for k in first.monitors}),
                   sinkhorn_iterations=cat("sinkhorn_iterations"), converged=cat("converged", 0),
                   times=cat("times"), monitor_times=cat("monitor_times"),
                   temperature=cat("temperature", 0), h=cat("h", 0), weights=systems.a)


def _chunk(systems, variant, steps, settings: FlowSettings):
    """One batched flow of ``systems`` (a :class:`Trajectory` with a flat batch dimension)."""
    X, solver, keep = systems.X.detach().clone(), settings.solver, settings.recording
    W = _interaction(systems)
    one_tau = bool((systems.tau == systems.tau[0]).all())
    tau = float(systems.tau[0]) if one_tau else 1.0
    W_scores = W if one_tau else _fold(W, systems)
    one_h = bool((systems.h == systems.h[0]).all())
    h = float(systems.h[0]) if one_h else systems.h.to(X.dtype)[:, None, None]
    _warn_step_size(X, W, systems, variant, settings.integrator)
    symmetric, errors = _symmetric_psd(W), "marginal_errors" in keep.monitors
    in_cache = takes_ensemble(variant, solver.n_iter, symmetric, errors, X)
    field = (EnsembleField if in_cache else ParticleField)(
        variant, W_scores, systems.mats["W_V"], solver.n_iter, systems.a, tau, solver.tol_for(X.dtype),
        solver.max_iter, False, None, solver.warm_start, settings.sphere, errors, symmetric=symmetric,
        stages=settings.stages)
    record = _EnsembleRecorder(keep.monitors, keep.monitor_every, _contexts(field, variant, W, systems, settings))
    check_placed_start(X, settings.placement)
    stepped = placed(field, settings.placement, h, steps, settings.integrator)  # norm=: the placement's layer
    with single_thread_if_small(X.shape[-2] * math.isqrt(systems.count), X.device):
        run = _integrate(stepped, X, INTEGRATORS[settings.integrator], h, steps, record, keep.save_every, keep.progress,
                         variant.name, *_counting(variant, solver.n_iter, not in_cache))
    hs = systems.h.cpu().numpy()
    monitor_steps = np.array(record.times)
    how = "evaluated block by block in cache" if in_cache else "dense"
    return Trajectory(
        times=run.steps[:, None] * hs, positions=run.positions,
        monitors=MonitorRecords({k: v.reshape(len(v), -1) for k, v in record.arrays().items()}),
        monitor_times=monitor_steps[:, None] * hs,
        sinkhorn_iterations=run.iterations if variant.normalization == "sinkhorn" else np.zeros_like(run.iterations),
        converged=np.broadcast_to(run.converged, (systems.count,)).copy(), attention=variant.name,
        integrator=settings.integrator, manifold=settings.manifold, h=hs, n_iter=solver.n_iter,
        temperature=systems.tau.cpu().numpy(), weights=systems.a,
        evaluation=EvaluationPath("batched", f"the systems as one tensor flow, {how}"), norm=settings.placement)


def _fold(W, systems):
    """Per-system temperatures folded into the bilinear form: ``W / tau`` (the scores at temperature 1)."""
    eye = torch.eye(systems.X.shape[-1], dtype=systems.X.dtype, device=systems.X.device)
    return (W if W is not None else eye) / systems.tau.to(systems.X.dtype)[:, None, None]


def _warn_step_size(X, W, systems, variant, integrator):
    """The single-system step-size warning, for the system whose ``h`` is largest against its limit."""

    if not variant.normalized and variant.approximates is None:
        return
    L = _lipschitz(X, W, systems.mats["W_V"], systems.tau.to(torch.float64))
    worst = int(torch.argmax(systems.h * L))
    W, Wv = (M if M is None or M.ndim == 2 else M[worst] for M in (W, systems.mats["W_V"]))
    _check_step_size(float(systems.h[worst]), X[worst], W, Wv, float(systems.tau[worst]), variant, integrator,
                     L=float(L[worst]))  # that system's scale, already computed


def _contexts(field, variant, W, systems, settings: FlowSettings):
    """The monitors' context of each system."""

    d, sphere = systems.X.shape[-1], settings.sphere
    kind = _energy_kind(variant, sphere)
    eye = torch.eye(d, dtype=torch.float64, device=systems.X.device)
    W64 = eye if W is None else W.detach().to(torch.float64)
    out = []
    for b in range(systems.count if settings.recording.monitors else 0):
        tau = float(systems.tau[b])
        a = None if systems.a is None else systems.a[b].detach().to(torch.float64)
        out.append(MonitorContext(SimpleNamespace(temperature=tau), kind, (W64 if W64.ndim == 2 else W64[b]) / tau,
                                  None if a is None else a / a.sum(), settings.manifold,
                                  settings.recording.cluster_tol))
    return field, out


class _EnsembleRecorder(_Recorder):
    """Monitors of every system of a batch: each record is an array over the systems."""

    def __init__(self, names, every, contexts):
        self.field, contexts = contexts
        super().__init__(names, every, contexts)

    def values(self, Y, ev) -> dict:

        if ev is None and MONITOR_FUNCTIONS["marginal_errors"] in self.functions:
            _, ev = self.field.velocity(Y)
        rows = []
        for b, ctx in enumerate(self.ctx):
            one = None if ev is None else SimpleNamespace(row_error=float(_at(ev.row_error, b)),
                                                          column_error=float(_at(ev.column_error, b)))
            rows.append({k: v for fn in self.functions for k, v in fn(Y[b], one, ctx).items()})
        return {k: np.array([r[k] for r in rows]) for k in rows[0]}


def _at(value, b):
    return value[b] if isinstance(value, torch.Tensor) and value.ndim else value


def _shaped(traj, systems, numpy_out, tau_batched, h_batched):
    """The flat batch of a trajectory reshaped to the ensemble's batch shape."""
    batch = systems.batch

    def per_time(v):
        return v.reshape(v.shape[:1] + batch + v.shape[2:])

    def times(v):
        return per_time(v) if h_batched else v[:, 0]  # one time axis for a common h

    weights = None if systems.a is None else systems.a.reshape(batch + systems.a.shape[-1:])
    return replace(
        traj, positions=from_torch(per_time(traj.positions), numpy_out), times=times(traj.times),
        monitors=MonitorRecords({k: per_time(v) for k, v in traj.monitors.items()}),
        monitor_times=times(traj.monitor_times),
        sinkhorn_iterations=per_time(traj.sinkhorn_iterations), converged=np.asarray(traj.converged).reshape(batch),
        temperature=np.asarray(traj.temperature).reshape(batch) if tau_batched else float(systems.tau[0]),
        h=np.asarray(traj.h).reshape(batch) if h_batched else float(systems.h[0]),
        weights=from_torch(weights, numpy_out))
