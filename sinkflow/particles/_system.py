"""The flow of one system: checked inputs and :class:`~sinkflow.particles._settings.FlowSettings` in,
a :class:`~sinkflow.particles.Trajectory` out. :func:`sinkflow.simulate` runs it for one system, an
ensemble for each system its batched flow cannot take.

The evaluation path is chosen once, before the first step (:func:`~sinkflow.particles._settings.choose_path`),
and kept on the trajectory (``Trajectory.evaluation``).
"""

from __future__ import annotations

import numpy as np
import torch

from sinkflow._backend import from_torch
from sinkflow.fields._causal import causal_mask
from sinkflow.fields._dense_fields import single_thread_if_small
from sinkflow.fields._harmonic_fields import HarmonicParticleField, harmonic_choice
from sinkflow.fields._landmarks import _flow_landmarks
from sinkflow.fields._particle_field import ParticleField
from sinkflow.particles._integrators import CHECK_EVERY, INTEGRATORS, _integrate
from sinkflow.particles._monitors import MAX_MONITOR_N, MonitorContext, _energy_kind, _Recorder
from sinkflow.particles._placements import check_placed_start, placed
from sinkflow.particles._settings import FlowSettings, choose_path
from sinkflow.particles._step_size import _check_step_size, _interaction_matrix, _symmetric_psd
from sinkflow.particles._trajectory import Trajectory

__all__ = ["run_system"]


def run_system(X: torch.Tensor, variant, Wq, Wk, Wv, a, tau: float, h, steps: int, settings: FlowSettings,
               numpy_out: bool = False) -> Trajectory:
    """``steps`` steps of the flow of one system from ``X`` (``(n, d)``, checked, on its manifold), with
    checked matrices (None for the identity), weights ``a`` (None: uniform) and temperature ``tau``."""
    n, d = X.shape
    solver, asked, keep = settings.solver, settings.evaluation, settings.recording
    tol = solver.tol_for(X.dtype)
    W = _interaction_matrix(Wq, Wk, d, X)
    tracks_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (X, Wq, Wk, Wv))
    X = X.clone() if tracks_grad else X.detach().clone()
    path, kernel = choose_path(n, X.dtype, variant, asked, tracks_grad, lambda: harmonic_choice(
        X, variant, W, Wv, a, tau, tol, settings.sphere, asked.landmarks))
    _check_monitors_fit(keep.monitors, n)
    _check_step_size(h, X, W, Wv, tau, variant, settings.integrator)
    landmarks = None if asked.landmarks is None else _flow_landmarks(
        X, asked.landmarks, variant.landmark_method, W, tau, asked.landmark_sampling, asked.landmark_seed)
    field = ParticleField(variant, W, Wv, solver.n_iter, a, tau, tol, solver.max_iter, path.name == "block-wise",
                          landmarks, solver.warm_start, settings.sphere, "marginal_errors" in keep.monitors,
                          symmetric=_symmetric_psd(W), stages=settings.stages,
                          mask=causal_mask(n, X.device) if asked.causal else None)
    field = field if kernel is None else HarmonicParticleField.wrap(field, kernel)
    record = _Recorder(keep.monitors, keep.monitor_every, _monitor_context(field, variant, W, a, tau, d, X, settings))
    check_placed_start(X, settings.placement)
    stepped = placed(field, settings.placement, float(h), steps, settings.integrator)  # norm=: the placement's layer
    with single_thread_if_small(n, X.device):
        run = _integrate(stepped, X, INTEGRATORS[settings.integrator], float(h), steps, record, keep.save_every,
                         keep.progress, variant.name, *_counting(variant, solver.n_iter, path.name == "dense"))
    return Trajectory(
        times=run.steps * float(h), positions=from_torch(run.positions, numpy_out), monitors=record.arrays(),
        monitor_times=np.array(record.times) * float(h),
        sinkhorn_iterations=run.iterations if variant.normalization == "sinkhorn" else np.zeros(steps, dtype=int),
        converged=run.converged, attention=variant.name, integrator=settings.integrator, manifold=settings.manifold,
        h=float(h), n_iter=solver.n_iter, temperature=tau, weights=from_torch(a, numpy_out),
        chunked=path.name == "block-wise", landmarks=_landmark_count(landmarks),
        harmonic_order=None if kernel is None else kernel.order, evaluation=path, norm=settings.placement)


def _landmark_count(landmarks) -> int | None:
    """How many landmarks a flow used: its indices (Nyström methods) or its count."""
    if landmarks is None:
        return None
    return int(landmarks.numel() if isinstance(landmarks, torch.Tensor) else landmarks)


def _counting(variant, n_iter, dense: bool) -> tuple[bool, int]:
    """Whether every field evaluation of a run takes the same iterations and reports convergence (a fixed
    ``n_iter``, or sinkflow's own SoftMax and :math:`e^C`: one pass), and how many steps apart its states are
    checked for NaN and inf (:data:`~sinkflow.particles._integrators.CHECK_EVERY` for such a ``dense`` field,
    one system's or a batch's, where a non-finite state costs no more than a finite one and raises nothing, else
    every step)."""
    fixed = n_iter is not None or variant.solver in ("row", "none")
    return fixed, CHECK_EVERY if fixed and dense else 1


def _monitor_context(field, variant, W, a, tau, d, X, settings) -> MonitorContext | None:
    """What the monitors need (None without monitors): the energies use ``W / tau`` (the bilinear form of the
    scores) in float64."""
    if not settings.recording.monitors:
        return None
    W_energy = ((W if W is not None else torch.eye(d, dtype=X.dtype, device=X.device)) / tau).detach()
    a64 = None if a is None else a.detach().to(torch.float64) / a.detach().to(torch.float64).sum()
    return MonitorContext(field, _energy_kind(variant, settings.sphere), W_energy.to(torch.float64), a64,
                          settings.manifold, settings.recording.cluster_tol)


def _check_monitors_fit(monitors, n):
    dense_monitors = [m for m in monitors if m != "marginal_errors"]
    if dense_monitors and n > MAX_MONITOR_N:
        raise ValueError(f"monitors {dense_monitors} evaluate n x n float64 matrices; n={n} is too large "
                         f"(n <= {MAX_MONITOR_N}); 'marginal_errors' works at any n")
