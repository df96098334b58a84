"""What a call of :func:`sinkflow.simulate` asks for, checked once and grouped, and the one place that
chooses how its field is evaluated.

* :class:`SolverSettings`: the Sinkhorn solve inside each field evaluation (``n_iter``, ``tol``,
  ``max_iter``, ``warm_start``);
* :class:`EvaluationSettings`: what the caller asked of the evaluation (``chunked``, ``landmarks`` and
  their draw, ``causal``);
* :class:`Recording`: what is kept along the run (monitors, saved positions, the progress bar);
* :class:`FlowSettings`: the three above with the integrator and the manifold, built by
  :func:`checked_settings` from :func:`sinkflow.simulate`'s keywords (every check, each error naming
  its keyword), used alike by one system and by an ensemble;
* :func:`choose_path`: the evaluation path of one system (dense, block-wise, landmarks or harmonic)
  and why, an :class:`EvaluationPath` that the :class:`~sinkflow.particles.Trajectory` keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from sinkflow._backend import check_number, check_seed
from sinkflow._checks import check_choice
from sinkflow.fields._dense_fields import DENSE_BYTES_LIMIT, dense_limit
from sinkflow.fields._landmarks import LANDMARK_SAMPLINGS
from sinkflow.particles._integrators import INTEGRATORS
from sinkflow.particles._monitors import _as_monitor_names
from sinkflow.particles._placements import Placement, as_placement
from sinkflow.particles._trajectory import MANIFOLDS, _solver_tol

__all__ = ["SolverSettings", "EvaluationSettings", "Recording", "FlowSettings", "EvaluationPath",
           "checked_settings", "choose_path", "PATHS"]

#: The evaluation paths of one system's field (:func:`choose_path`); an ensemble adds ``"batched"``.
PATHS = ("dense", "block-wise", "landmarks", "harmonic")


@dataclass(frozen=True)
class SolverSettings:
    """The Sinkhorn solve inside each field evaluation: ``n_iter`` half-iterations, or to ``tol``
    (``None``: :func:`~sinkflow.particles.default_tol` of the particles' dtype) within ``max_iter``,
    warm-started from the previous evaluation's potential when ``warm_start``."""

    n_iter: int | None
    tol: float | None
    max_iter: int
    warm_start: bool

    def tol_for(self, dtype: torch.dtype) -> float:
        """The tolerance of a solve in ``dtype`` (never below what ``dtype`` reaches)."""
        return _solver_tol(self.tol, dtype)


@dataclass(frozen=True)
class EvaluationSettings:
    """What the caller asked of the field's evaluation (``None``: let :func:`choose_path` decide)."""

    chunked: bool | None
    landmarks: int | None
    landmark_seed: int
    landmark_sampling: str
    causal: bool


@dataclass(frozen=True)
class Recording:
    """What a run keeps: the monitors every ``monitor_every`` steps, the positions every ``save_every``."""

    monitors: tuple[str, ...]
    monitor_every: int
    save_every: int
    cluster_tol: float
    progress: bool | None


@dataclass(frozen=True)
class FlowSettings:
    """Everything of a :func:`sinkflow.simulate` call but the systems themselves, checked."""

    integrator: str
    manifold: str
    solver: SolverSettings
    evaluation: EvaluationSettings
    recording: Recording
    placement: Placement | None = None  # norm= of simulate (docs/theory/placements.md); None: today's flow

    @property
    def sphere(self) -> bool:
        return self.manifold == "sphere"

    @property
    def stages(self) -> int:
        """Field evaluations per integrator step."""
        return 4 if self.integrator == "rk4" else 1


@dataclass(frozen=True)
class EvaluationPath:
    """How a run evaluated its field, and why (:func:`choose_path`).

    ``name`` is one of :data:`PATHS` (``"batched"`` for the systems of an ensemble that ran as one
    tensor flow); ``reason`` says what decided it in words.
    """

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def _flag(value, name: str, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False{' or None' if allow_none else ''}, got {value!r}")
    return bool(value)


def checked_settings(*, integrator, manifold, n_iter, tol, max_iter, warm_start, chunked, landmarks, landmark_seed,
                     landmark_sampling, causal, monitors, monitor_every, save_every, cluster_tol,
                     progress, norm=None) -> FlowSettings:
    """:func:`sinkflow.simulate`'s keywords checked (each error names its keyword) and grouped.

    Examples
    --------
    >>> from sinkflow.particles._settings import checked_settings
    >>> s = checked_settings(integrator="rk4", manifold="sphere", n_iter=None, tol=None, max_iter=100,
    ...                      warm_start=None, chunked=None, landmarks=None, landmark_seed=0,
    ...                      landmark_sampling="farthest", causal=False, monitors="energy", monitor_every=1,
    ...                      save_every=1, cluster_tol=1e-3, progress=False)
    >>> s.solver.warm_start, s.stages, s.recording.monitors     # to tolerance: warm starts by default
    (True, 4, ('energy',))
    """
    check_choice(integrator, "integrator", INTEGRATORS)
    check_choice(manifold, "manifold", MANIFOLDS)
    check_choice(landmark_sampling, "landmark_sampling", LANDMARK_SAMPLINGS)
    n_iter = check_number(n_iter, "n_iter (Sinkhorn half-iterations)", integer=True, positive=True, allow_none=True)
    if tol is not None:
        tol = float(check_number(tol, "tol", positive=True))
    warm_start = n_iter is None if warm_start is None else _flag(warm_start, "warm_start")
    solver = SolverSettings(n_iter, tol, check_number(max_iter, "max_iter", integer=True, positive=True), warm_start)
    evaluation = EvaluationSettings(
        _flag(chunked, "chunked", allow_none=True),
        check_number(landmarks, "landmarks", integer=True, positive=True, allow_none=True),
        check_seed(landmark_seed, "landmark_seed"), landmark_sampling, _flag(causal, "causal"))
    recording = Recording(
        tuple(_as_monitor_names(monitors)), check_number(monitor_every, "monitor_every", integer=True, positive=True),
        check_number(save_every, "save_every", integer=True, positive=True),
        check_number(cluster_tol, "cluster_tol", positive=True), _flag(progress, "progress", allow_none=True))
    placement = as_placement(norm)
    if placement is not None and manifold != "euclidean":
        raise ValueError(f"norm={placement.name!r} places its own normalization: leave manifold='euclidean' "
                         f"(norm='post' is the practitioners' sphere flow), got manifold={manifold!r}")
    return FlowSettings(integrator, manifold, solver, evaluation, recording, placement)


def choose_path(n: int, dtype: torch.dtype, variant, evaluation: EvaluationSettings, tracks_grad: bool,
                harmonic: Callable[[], object]) -> tuple[EvaluationPath, object]:
    """The evaluation path of one system of ``n`` particles under ``variant``, and the harmonic kernel when
    that is the path.

    In this order: the caller's ``landmarks`` or ``chunked``; the exact harmonic field where it applies
    and is cheaper (``harmonic()`` returns its kernel, or None; never with gradients or a causal mask);
    the dense path for a variant given as a callable on dense scores (``variant.normalization`` None:
    nothing else can evaluate it); block-wise when one ``n x n`` matrix would exceed the dense budget;
    else dense. Gradients need the dense field: a path that is not dense raises a ``ValueError`` when
    ``tracks_grad``.

    Examples
    --------
    >>> import sinkflow, torch
    >>> from sinkflow.particles._settings import EvaluationSettings, choose_path
    >>> asked = EvaluationSettings(chunked=None, landmarks=None, landmark_seed=0, landmark_sampling="farthest",
    ...                            causal=False)
    >>> softmax = sinkflow.get_attention("softmax")
    >>> print(choose_path(64, torch.float64, softmax, asked, False, lambda: None)[0])
    dense (one n x n matrix fits the dense budget of 512 MiB)
    >>> print(choose_path(10**5, torch.float64, softmax, asked, False, lambda: None)[0])
    block-wise (one n x n matrix of n = 100000 would exceed the dense budget of 512 MiB)
    """
    kernel = None
    budget = f"the dense budget of {DENSE_BYTES_LIMIT // 2**20} MiB"
    if evaluation.landmarks is not None:
        path = EvaluationPath("landmarks", f"landmarks={evaluation.landmarks} asked for")
    elif evaluation.chunked is not None:
        name = "block-wise" if evaluation.chunked else "dense"
        path = EvaluationPath(name, f"chunked={evaluation.chunked} asked for")
    elif not (tracks_grad or evaluation.causal) and (kernel := harmonic()) is not None:
        path = EvaluationPath("harmonic", f"order {kernel.order}: rank {kernel.rank} is cheaper than n = {n}")
    elif variant.normalization is None:
        path = EvaluationPath("dense", f"attention {variant.name!r} is a callable on dense scores: only the dense "
                                       "path can evaluate it")
    elif n > dense_limit(dtype):
        path = EvaluationPath("block-wise", f"one n x n matrix of n = {n} would exceed {budget}")
    else:
        path = EvaluationPath("dense", f"one n x n matrix fits {budget}")
    if tracks_grad and path.name != "dense":
        raise ValueError("gradients through simulate need the dense evaluation (chunked=False, no landmarks); "
                         f"this run would be {path}")
    return path, kernel
