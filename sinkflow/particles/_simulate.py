r"""Particle simulators: a residual attention layer is an explicit Euler step.

docs/theory/gradient_flows.md and docs/theory/sphere.md. Tokens :math:`x_i` move by

.. math:: x_i \leftarrow x_i + h \sum_j K_{ij}(X)\, W_V x_j

(:mod:`sinkflow.particles` defines :math:`K` for each attention kind); RK4 with the same
field is the continuous-depth reference. On the sphere (the layer-norm model of
Geshkovski et al.) the velocity is projected by :math:`P_x^\perp = I - x x^T` and
each step is followed by renormalization.

Monitors follow py-pde's trackers: quantities recorded along the run, every
``monitor_every`` steps, returned in :attr:`Trajectory.monitors`:

``"energy"``
    the energy of the flow: :math:`F^\infty` (sinkhorn), :math:`F^0` (unnormalized),
    :math:`F^\infty` as a common yardstick for softmax, the Gaussian analogue of :math:`F^0`
    (gaussian), :math:`E_\beta` on the sphere (which assumes :math:`Q = K = V = I`)
    (:mod:`sinkflow.particles`; evaluated with :math:`W = W_Q^T W_K / \tau`).
``"energy_inf"``, ``"energy_0"``
    :math:`F^\infty` or :math:`F^0` whatever the attention kind.
``"marginal_errors"``
    row and column marginal errors of the attention used at that state
    (keys ``"row_error"``, ``"column_error"``): how far from doubly stochastic.
``"clusters"``
    fraction of clustered pairs (:math:`\langle x_i, x_j\rangle > 1 - \delta` on the sphere,
    :math:`\|x_i - x_j\|^2 < 2\delta\, \overline{|x|^2}` in Euclidean space, :math:`\delta` =
    ``cluster_tol``) and the number of clusters (connected components of that relation);
    keys ``"cluster_fraction"``, ``"cluster_count"``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sinkflow._backend import check_finite, check_float, check_number, check_seed, from_torch, leading, to_torch
from sinkflow.particles._energies import energy_0, energy_gaussian, energy_inf, energy_sphere
from sinkflow.attention._variants import get_attention
from sinkflow.particles._dense_fields import attention_field, check_matrix, check_weights, dense_limit, single_thread_if_small
from sinkflow.particles._lowrank_fields import LANDMARK_SAMPLINGS, _flow_landmarks

__all__ = ["simulate", "Trajectory", "random_particles", "cluster_statistics", "MONITORS", "INTEGRATORS",
           "ParticleField", "euler_step", "rk4_step", "lipschitz_scale", "largest_safe_step", "default_tol"]

MANIFOLDS = ("euclidean", "sphere")
#: Energy and cluster monitors build n x n float64 matrices: allowed up to this n.
MAX_MONITOR_N = 8192


@dataclass(frozen=True)
class Trajectory:
    """A simulated particle flow.

    Attributes
    ----------
    times : numpy.ndarray (n_saved,)
        Times of the saved states (``k h``).
    positions : array (n_saved, n, d)
        Saved states, same type/device/dtype as ``x0`` (``n_saved = steps + 1`` with
        ``save_every=1``).
    monitors : dict[str, numpy.ndarray]
        Recorded quantities (see module docstring), one value per ``monitor_times``.
    monitor_times : numpy.ndarray
    sinkhorn_iterations : numpy.ndarray (steps,)
        Half-iterations used per step (all stages of RK4 summed); zeros without Sinkhorn.
    converged : bool
        Whether every run-to-tolerance Sinkhorn solve reached its tolerance.
    attention, integrator, manifold : str
    h : float
    n_iter : int or None
    temperature : float
    weights : array (n,) or None
    chunked : bool
        Whether the field was evaluated block-wise (:mod:`sinkflow.particles`).
    landmarks : int or None
        Number of landmarks of an approximate flow (:mod:`sinkflow.particles`).
    """

    times: np.ndarray
    positions: Any
    monitors: dict = field(default_factory=dict)
    monitor_times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sinkhorn_iterations: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    converged: bool = True
    attention: str = "sinkhorn"
    integrator: str = "euler"
    manifold: str = "euclidean"
    h: float = 0.1
    n_iter: int | None = None
    temperature: float = 1.0
    weights: Any = None
    chunked: bool = False
    landmarks: int | None = None

    @property
    def final(self):
        """The last saved state, ``positions[-1]``."""
        return self.positions[-1]

    @property
    def steps(self) -> int:
        return len(self.sinkhorn_iterations)


# ----------------------------------------------------------------------------------------
# helpers


def random_particles(n: int, d: int, *, seed=0, manifold: str = "euclidean", scale: float = 1.0, like=None):
    """Reproducible random initial particles.

    Gaussian :math:`\\mathcal{N}(0, \\mathrm{scale}^2 I_d)` in Euclidean space, uniform on
    the unit sphere :math:`S^{d-1}` for ``manifold="sphere"``.

    Parameters
    ----------
    n, d : int
        Number and dimension of the particles.
    seed : int or numpy.random.Generator
    manifold : {"euclidean", "sphere"}
    scale : float
        Standard deviation (Euclidean only).
    like : torch.Tensor, optional
        Return a tensor with this device and dtype (numpy float64 otherwise).

    Returns
    -------
    array (n, d)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x = sinkflow.random_particles(4, 3, seed=1, manifold="sphere")
    >>> bool(np.allclose(np.linalg.norm(x, axis=1), 1))
    True
    """
    if manifold not in MANIFOLDS:
        raise ValueError(f"manifold must be one of {MANIFOLDS}, got {manifold!r}")
    n = check_number(n, "n", integer=True, positive=True)
    d = check_number(d, "d", integer=True, positive=True)
    scale = check_number(scale, "scale", positive=True)
    rng = np.random.default_rng(check_seed(seed))
    x = rng.standard_normal((n, d))
    if manifold == "sphere":
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    else:
        x *= scale
    return x if like is None else torch.as_tensor(x, dtype=like.dtype, device=like.device)


def cluster_statistics(x, *, manifold: str = "sphere", tol: float = 1e-3):
    r"""Fraction of clustered pairs and number of clusters.

    Pairs :math:`i < j` are clustered when :math:`\langle x_i, x_j\rangle > 1 - \delta`
    (sphere) or :math:`\|x_i - x_j\|^2 < 2 \delta\, \mathrm{mean}_k |x_k|^2` (Euclidean);
    clusters are the connected components of this relation.

    Parameters
    ----------
    x : array (n, d)
    manifold : {"sphere", "euclidean"}
    tol : float
        :math:`\delta` (docs/theory/sphere.md uses 1e-3).

    Returns
    -------
    (float, int)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.cluster_statistics(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    (0.3333333333333333, 2)
    """
    from scipy.sparse.csgraph import connected_components

    tol = check_number(tol, "tol", positive=True)
    X = to_torch(x, "x").detach()
    n = X.shape[0]
    if manifold == "sphere":
        close = (X @ X.T) > 1 - tol
    else:
        sq = (X * X).sum(1)
        d2 = sq[:, None] + sq[None, :] - 2 * X @ X.T
        close = d2 < 2 * tol * float(sq.mean())
    close.fill_diagonal_(True)
    pairs = (int(close.sum()) - n) // 2
    frac = pairs / (n * (n - 1) / 2) if n > 1 else 1.0
    count, _ = connected_components(close.cpu().numpy(), directed=False)
    return float(frac), int(count)


def _check_choice(value, name, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def default_tol(dtype: torch.dtype) -> float:
    """Sinkhorn marginal tolerance of a flow in ``dtype``: 1e-10 in float64, else the solver's default.

    A marginal error sums ``n`` entries of relative rounding ``eps``; float32 cannot go
    much below ``1e-6`` (a float64-level ``tol`` would make every solve stop at its floor),
    see :func:`sinkflow.attention.default_tolerance`.

    Parameters
    ----------
    dtype : torch.dtype
        Floating dtype of the particles.

    Returns
    -------
    float

    Examples
    --------
    >>> import torch
    >>> from sinkflow.attention import default_tolerance
    >>> from sinkflow.particles import default_tol
    >>> default_tol(torch.float64)
    1e-10
    >>> default_tol(torch.float32) == default_tolerance(torch.float32) > default_tol(torch.float64)
    True
    """
    from sinkflow.attention._tolerances import default_tolerance

    return 1e-10 if dtype == torch.float64 else default_tolerance(dtype)


def _solver_tol(tol, dtype) -> float:
    floor = default_tol(dtype)
    if tol is None:
        return floor
    tol = float(check_number(tol, "tol", positive=True))
    if dtype != torch.float64 and tol < floor:
        warnings.warn(f"tol={tol:g} is below what {dtype} Sinkhorn solves reach; using {floor:.2g} "
                      "(pass float64 particles for tighter solves)", RuntimeWarning, stacklevel=3)
        return floor
    return tol


def lipschitz_scale(x: torch.Tensor, W: torch.Tensor | None, W_V: torch.Tensor | None, temperature: float) -> float:
    r"""Cheap estimate of the Lipschitz constant of a normalized attention field at ``x``.

    :math:`T(x_i) = \sum_j K_{ij} W_V x_j` with rows of :math:`K` summing to 1 moves by
    :math:`\|W_V\|` through the values and by :math:`\|W_V\| R \cdot 2\|W\| R / \tau` through
    the weights (:math:`\partial K_{ij}/\partial x_i` is a covariance of :math:`W x_j/\tau`
    over a row, bounded by the product of their spreads, :math:`R^2 = \mathrm{mean}_i |x_i|^2`):
    :math:`L \approx \|W_V\|_2 (1 + 2\|W\|_2 R^2/\tau)`. Explicit Euler with
    :math:`h L > 2` can overshoot (the stability limit of :math:`\dot y = -L y`).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.particles import lipschitz_scale
    >>> lipschitz_scale(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), None, None, 1.0)
    3.0
    """
    x = x.detach()
    R2 = float((x * x).sum(1).mean())
    norm = lambda M: 1.0 if M is None else float(torch.linalg.matrix_norm(M.detach().to(torch.float64), 2))
    return norm(W_V) * (1 + 2 * norm(W) * R2 / temperature)


# ----------------------------------------------------------------------------------------
# the field of one simulation, its integrators and monitors (py-pde's solvers and trackers)


@dataclass
class ParticleField:
    """The velocity field of one simulation: an attention variant and its options.

    ``velocity(Y)`` returns the (tangent) velocity and the :class:`~sinkflow.particles.FieldEvaluation`;
    Sinkhorn potentials are carried from one evaluation to the next when ``warm_start``.
    :func:`sinkflow.simulate` builds one per run from its checked arguments; the fields mirror
    its options (``W = W_Q^T W_K``, ``sphere`` for ``manifold="sphere"``, ``need_errors`` for the
    ``"marginal_errors"`` monitor). ``retract(Y)`` maps a state back to the manifold
    (renormalization on the sphere, the identity in Euclidean space).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.particles import ParticleField, default_tol
    >>> field = ParticleField("sinkhorn", W=None, W_V=None, n_iter=None, weights=None, temperature=1.0,
    ...                       tol=default_tol(torch.float64), max_iter=1000, chunked=False, landmarks=None,
    ...                       warm_start=True, sphere=False, need_errors=True)
    >>> X = torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> v, ev = field.velocity(X)
    >>> v.shape, ev.converged, ev.column_error < 1e-9, field.g is not None   # g: kept for the next call
    (torch.Size([6, 2]), True, True, True)
    >>> bool(torch.allclose(v.mean(0), X.mean(0)))   # doubly stochastic: the mean is kept
    True
    """

    attention: Any
    W: torch.Tensor | None
    W_V: torch.Tensor | None
    n_iter: int | None
    weights: torch.Tensor | None
    temperature: float
    tol: float
    max_iter: int
    chunked: bool
    landmarks: Any
    warm_start: bool
    sphere: bool
    need_errors: bool
    g: torch.Tensor | None = None

    def velocity(self, Y: torch.Tensor):
        ev = attention_field(Y, self.attention, self.W, self.W_V, n_iter=self.n_iter, weights=self.weights,
                             temperature=self.temperature, init_g=self.g if self.warm_start else None, tol=self.tol,
                             max_iter=self.max_iter, chunked=self.chunked, need_errors=self.need_errors,
                             landmarks=self.landmarks)
        if ev.g is not None and self.warm_start:
            self.g = ev.g.detach()
        v = ev.velocity
        if self.sphere:
            v = v - (v * Y).sum(1, keepdim=True) * Y
        return v, ev

    def retract(self, Y: torch.Tensor) -> torch.Tensor:
        return Y / Y.norm(dim=1, keepdim=True) if self.sphere else Y


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
    return field.retract(X + h * v), [ev]


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
    v2, e2 = field.velocity(field.retract(X + 0.5 * h * v1))
    v3, e3 = field.velocity(field.retract(X + 0.5 * h * v2))
    v4, e4 = field.velocity(field.retract(X + h * v3))
    return field.retract(X + (h / 6) * (v1 + 2 * v2 + 2 * v3 + v4)), [e1, e2, e3, e4]


#: Integrators by name: ``step(field, X, h) -> (X_next, evaluations)``.
INTEGRATORS = {"euler": euler_step, "rk4": rk4_step}


@dataclass
class MonitorContext:
    """What the monitors need besides the state: the energy's form, weights, options."""

    field: ParticleField
    energy_kind: str
    W_energy: torch.Tensor
    weights64: torch.Tensor | None
    manifold: str
    cluster_tol: float


def _energy_monitor(kind: str):
    def monitor(Y, ev, ctx: MonitorContext) -> dict:
        Y = Y.detach().to(torch.float64)  # energies are theory checks: always float64
        which = ctx.energy_kind if kind == "energy" else kind
        a = ctx.weights64
        if which == "energy_sphere":
            value = energy_sphere(Y, 1.0 / ctx.field.temperature, a)
        elif which == "energy_0":
            value = energy_0(Y, ctx.W_energy, a)
        elif which == "energy_gaussian":
            value = energy_gaussian(Y, ctx.W_energy, a)
        else:
            value = energy_inf(Y, ctx.W_energy, a, tol=1e-12)
        return {kind: float(value)}

    return monitor


def _marginal_error_monitor(Y, ev, ctx: MonitorContext) -> dict:
    if ev is None:
        _, ev = ctx.field.velocity(Y)
    return {"row_error": ev.row_error, "column_error": ev.column_error}


def _cluster_monitor(Y, ev, ctx: MonitorContext) -> dict:
    frac, count = cluster_statistics(Y, manifold=ctx.manifold, tol=ctx.cluster_tol)
    return {"cluster_fraction": frac, "cluster_count": count}


#: Monitors by name: ``monitor(Y, evaluation_or_None, context) -> {key: value}``.
MONITOR_FUNCTIONS = {"energy": _energy_monitor("energy"), "energy_inf": _energy_monitor("energy_inf"),
                     "energy_0": _energy_monitor("energy_0"), "marginal_errors": _marginal_error_monitor,
                     "clusters": _cluster_monitor}
MONITORS = tuple(MONITOR_FUNCTIONS)


def _energy_kind(variant, sphere: bool) -> str:
    """The energy whose descent the flow of this variant is checked against."""
    if sphere:
        return "energy_sphere"
    exact = variant.approximates or variant.name
    return {"unnormalized": "energy_0", "gaussian": "energy_gaussian"}.get(exact, "energy_inf")


class _Recorder:
    """Runs the monitors every ``every`` steps and collects their values."""

    def __init__(self, names, every: int, ctx: MonitorContext):
        self.functions = [MONITOR_FUNCTIONS[m] for m in names]
        self.every, self.ctx = every, ctx
        self.records: dict[str, list] = {}
        self.times: list[float] = []

    def __call__(self, k: int, t: float, Y, ev, force: bool = False):
        if not self.functions or (k % self.every and not force):
            return
        if self.times and self.times[-1] == t:
            return
        self.times.append(t)
        for fn in self.functions:
            for key, value in fn(Y, ev, self.ctx).items():
                self.records.setdefault(key, []).append(value)


def _as_monitor_names(monitors) -> tuple:
    if isinstance(monitors, str):
        monitors = (monitors,)
    names = tuple(monitors)
    for m in names:
        _check_choice(m, "each monitor", MONITORS)
    return names


def _interaction_matrix(Wq, Wk, d, like):
    if Wq is None and Wk is None:
        return None
    eye = torch.eye(d, dtype=like.dtype, device=like.device)
    return (Wq if Wq is not None else eye).T @ (Wk if Wk is not None else eye)


def largest_safe_step(x0, attention="sinkhorn", W_Q=None, W_K=None, W_V=None, *, temperature: float = 1.0,
                      integrator: str = "euler") -> float:
    r"""Largest step ``h`` that :func:`simulate` accepts without its overshoot warning.

    ``2 / L`` for Euler and ``2.78 / L`` for RK4 (their stability limits on
    :math:`\dot y = -L y`), with :math:`L` the estimate :func:`lipschitz_scale` at ``x0``;
    ``inf`` for the unnormalized kernel, which has no useful global scale. The warning of
    :func:`simulate` quotes this number.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.particles import largest_safe_step
    >>> x0 = np.array([[1.0, 0.0], [0.0, 1.0]])      # R^2 = 1, W = I: L = 1 + 2 / tau
    >>> largest_safe_step(x0, "softmax", temperature=0.5)
    0.4
    """
    X = to_torch(x0, "x0")
    check_float(X, "x0")
    if X.ndim != 2:
        raise ValueError(f"x0 must have shape (n, d), got {tuple(X.shape)}")
    _check_choice(integrator, "integrator", INTEGRATORS)
    Wq, Wk, Wv = (check_matrix(M, name, X.shape[1], X) for M, name in ((W_Q, "W_Q"), (W_K, "W_K"), (W_V, "W_V")))
    return _safe_step(X, _interaction_matrix(Wq, Wk, X.shape[1], X), Wv, float(temperature),
                      get_attention(attention), integrator)


def _safe_step(X, W, Wv, tau, variant, integrator) -> float:
    if not variant.normalized and variant.approximates is None:
        return math.inf  # unnormalized kernels grow like exp(R^2): no useful global scale
    return (2.0 if integrator == "euler" else 2.78) / lipschitz_scale(X, W, Wv, tau)


def _check_step_size(h, X, W, Wv, tau, variant, integrator):
    h = check_number(h, "h", positive=True)
    limit = _safe_step(X, W, Wv, tau, variant, integrator)
    if h > limit:
        warnings.warn(f"step h={float(h):g} exceeds the largest safe step h = {limit:.3g} of attention="
                      f"{variant.name!r} ({integrator}) at temperature={tau:g} (2/L for Euler, 2.78/L for RK4, with "
                      f"the Lipschitz estimate L ~ {2.0 / limit if integrator == 'euler' else 2.78 / limit:.3g} of "
                      "sinkflow.particles.lipschitz_scale; sinkflow.particles.largest_safe_step): the steps may "
                      "overshoot", RuntimeWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------
# the simulator


def simulate(x0, attention="sinkhorn", W_Q=None, W_K=None, W_V=None, h: float = 0.1, steps: int = 100, *,
             n_iter=None, weights=None, integrator: str = "euler", manifold: str = "euclidean",
             temperature: float = 1.0, monitors=(), monitor_every: int = 1, save_every: int = 1,
             warm_start: bool | None = None, chunked: bool | None = None, landmarks: int | None = None,
             landmark_seed: int = 0, landmark_sampling: str = "farthest", tol: float | None = None,
             max_iter: int = 20_000, cluster_tol: float = 1e-3, progress: bool = False) -> Trajectory:
    r"""Simulate tokens moving under self-attention (a residual network of depth ``steps``).

    Parameters
    ----------
    x0 : array (n, d) or torch.Tensor
        Initial particles. numpy in -> numpy out; torch in (``x0`` or any of ``W_Q``, ``W_K``,
        ``W_V``, ``weights``) -> torch out on that tensor's device and dtype (CUDA works
        unchanged; float16 / bfloat16 landmark fields are computed in float32). Must be finite, floating (numpy defaults
        to float64), and on the unit sphere for ``manifold="sphere"``. A torch ``x0`` (or
        ``W_Q``, ``W_K``, ``W_V``) that requires grad gives positions with an autograd graph
        (dense evaluation only).
    attention : str or AttentionVariant
        ``"sinkhorn"``, ``"softmax"``, ``"unnormalized"``, ``"gaussian"``, ``"skyformer"``,
        ``"nystromformer"`` or any name added with :func:`sinkflow.register_attention`
        (:mod:`sinkflow.attention`).
    W_Q, W_K, W_V : arrays (d, d), optional
        Query, key and value matrices (identity by default); the scores are
        :math:`x_i^T W_Q^T W_K x_j / \tau`. The gradient-flow theorem holds for
        :math:`W = W_Q^T W_K / \tau` symmetric and :math:`W_V = W` (descent of the energy).
    h : float
        Step size (> 0); Euler with step ``h`` is a residual layer. A ``RuntimeWarning``
        names the largest safe value when ``h`` exceeds the field's stability scale
        (:func:`lipschitz_scale`, normalized attentions).
    steps : int
        Number of steps (>= 0).
    n_iter : int or None
        Sinkhorn half-iterations per field evaluation; ``None`` runs to ``tol``.
    weights : array (n,), optional
        Positive particle weights summing to 1 (the empirical measure); uniform by default.
        Conserved by the flow (mass moves with the particles).
    integrator : {"euler", "rk4"}
    manifold : {"euclidean", "sphere"}
    temperature : float
        :math:`\tau > 0` (:math:`\beta = 1/\tau` on the sphere).
    monitors : str or iterable of str
        Any of ``"energy", "energy_inf", "energy_0", "marginal_errors", "clusters"``.
    monitor_every, save_every : int
        Record monitors / positions every so many steps (the last state is always kept).
    warm_start : bool, optional
        Start each Sinkhorn solve from the previous column potential (``init_g``). Default:
        True for ``n_iter=None`` (same fixed point, far fewer iterations), False for a
        fixed ``n_iter`` (each layer normalizes from scratch, as a Sinkformer does).
    chunked : bool, optional
        Evaluate the field block-wise (:mod:`sinkflow.particles`, memory O(n) per block). Default:
        automatically when one ``n x n`` matrix would exceed 512 MiB.
    landmarks : int, optional
        Approximate the attention with ``m`` landmarks in ``O(n m)`` per step
        (:mod:`sinkflow.particles`): Nyström for ``"sinkhorn"``, ``"softmax"``,
        ``"unnormalized"``, Skyformer's lifted Nyström for ``"gaussian"`` / ``"skyformer"``,
        segment means for ``"nystromformer"``. ``m >= n`` (``2n`` lifted) is exact. Needs a
        symmetric positive semi-definite ``W_Q^T W_K``.
    landmark_seed : int
        Seed of the landmark draw (done once: the approximate flow is an ODE of its own).
    landmark_sampling : {"farthest", "uniform"}
        Greedy farthest points of ``x0`` in the kernel's metric (cover the support: no particle
        far from every landmark) or uniform random particles
        (:func:`sinkflow.particles.landmark_indices`).
    tol, max_iter : float, int
        Sinkhorn stopping rule for ``n_iter=None``; ``tol`` defaults to :func:`default_tol`
        of the particles' dtype (1e-10 in float64, 1e-5 in float32).
    cluster_tol : float
        :math:`\delta` of the cluster monitor.
    progress : bool
        Show a tqdm progress bar.

    Returns
    -------
    Trajectory

    Raises
    ------
    TypeError
        A numeric parameter that is not a real number (a string, a bool), or a count that is not
        an integer (``steps``, ``n_iter``, ``landmarks``, ...).
    ValueError
        Non-finite ``x0``, ``h <= 0``, ``steps < 0``, wrong shapes of the matrices or the
        weights, weights not summing to 1, points off the sphere, unknown options.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x0 = sinkflow.random_particles(8, 2, seed=0)
    >>> traj = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=10, monitors=["energy"])
    >>> traj.positions.shape, float(traj.times[-1])
    ((11, 8, 2), 0.5)
    >>> bool(np.all(np.diff(traj.monitors["energy"]) <= 0))   # F^inf decreases (W_V = W = I)
    True
    """
    from sinkflow._progress import progress_bar

    X, numpy_out = leading(x0, "x0", W_Q, W_K, W_V, weights)
    check_float(X, "x0")
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"x0 must have shape (n, d) with n, d >= 1, got {tuple(X.shape)}")
    check_finite(X.detach(), "x0")
    n, d = X.shape
    variant = get_attention(attention)
    _check_choice(integrator, "integrator", INTEGRATORS)
    _check_choice(manifold, "manifold", MANIFOLDS)
    _check_choice(landmark_sampling, "landmark_sampling", LANDMARK_SAMPLINGS)
    steps = check_number(steps, "steps", integer=True, positive=True, allow_zero=True)
    temperature = check_number(temperature, "temperature", positive=True)
    n_iter = check_number(n_iter, "n_iter (Sinkhorn half-iterations)", integer=True, positive=True, allow_none=True)
    monitor_every = check_number(monitor_every, "monitor_every", integer=True, positive=True)
    save_every = check_number(save_every, "save_every", integer=True, positive=True)
    landmarks = check_number(landmarks, "landmarks", integer=True, positive=True, allow_none=True)
    landmark_seed = check_seed(landmark_seed, "landmark_seed")
    max_iter = check_number(max_iter, "max_iter", integer=True, positive=True)
    cluster_tol = check_number(cluster_tol, "cluster_tol", positive=True)
    monitors = _as_monitor_names(monitors)
    Wq, Wk, Wv = (check_matrix(M, name, d, X) for M, name in ((W_Q, "W_Q"), (W_K, "W_K"), (W_V, "W_V")))
    W = _interaction_matrix(Wq, Wk, d, X)
    a = check_weights(weights, X)
    tracks_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (X, Wq, Wk, Wv))
    X = X.clone() if tracks_grad else X.detach().clone()
    sphere = manifold == "sphere"
    if sphere:
        dev = float((X.detach().norm(dim=1) - 1).abs().max())
        if dev > (1e-8 if X.dtype == torch.float64 else 1e-5):
            raise ValueError(f"manifold='sphere' needs x0 on the unit sphere (max | |x_i| - 1 | = {dev:.3g}); "
                             "normalize it, e.g. x0 / np.linalg.norm(x0, axis=1, keepdims=True)")
    if chunked is None:
        chunked = n > dense_limit(X.dtype) and landmarks is None
    if tracks_grad and (chunked or landmarks is not None):
        raise ValueError("gradients through simulate need the dense evaluation (chunked=False, no landmarks)")
    dense_monitors = [m for m in monitors if m != "marginal_errors"]
    if dense_monitors and n > MAX_MONITOR_N:
        raise ValueError(f"monitors {dense_monitors} evaluate n x n float64 matrices; n={n} is too large "
                         f"(n <= {MAX_MONITOR_N}); 'marginal_errors' works at any n")
    tau = float(temperature)
    _check_step_size(h, X, W, Wv, tau, variant, integrator)
    hh = float(h)
    if landmarks is not None:
        landmarks = _flow_landmarks(X, landmarks, variant.landmark_method, W, tau, landmark_sampling, landmark_seed)
    field = ParticleField(variant, W, Wv, n_iter, a, tau, _solver_tol(tol, X.dtype), max_iter, bool(chunked), landmarks,
                          n_iter is None if warm_start is None else bool(warm_start), sphere,
                          "marginal_errors" in monitors)
    # energy monitors use W / tau (the bilinear form of the scores)
    W_energy = ((W if W is not None else torch.eye(d, dtype=X.dtype, device=X.device)) / tau).detach().to(torch.float64)
    a64 = None if a is None else a.detach().to(torch.float64) / a.detach().to(torch.float64).sum()
    record = _Recorder(monitors, monitor_every,
                       MonitorContext(field, _energy_kind(variant, sphere), W_energy, a64, manifold, cluster_tol))
    step = INTEGRATORS[integrator]
    with single_thread_if_small(n, X.device):
        saved, times = [X.clone()], [0.0]
        iters = np.zeros(steps, dtype=int)
        all_converged = True
        for k in progress_bar(range(steps), enabled=progress, desc=f"{variant.name} flow", unit="step"):
            X_next, evs = step(field, X, hh)
            record(k, k * hh, X, evs[0])
            X = X_next
            iters[k] = sum(ev.n_iter for ev in evs)
            all_converged = all_converged and (all(ev.converged for ev in evs) or n_iter is not None)
            if not bool(torch.isfinite(X.detach()).all()):
                raise FloatingPointError(
                    f"the flow left the floating-point range at step {k + 1} (t = {(k + 1) * hh:g}); "
                    "the unnormalized kernel grows like exp(x^T W y): use a smaller h, fewer steps or a larger temperature")
            if (k + 1) % save_every == 0 or k + 1 == steps:
                saved.append(X.clone())
                times.append((k + 1) * hh)
        record(steps, steps * hh, X, None, force=True)
        positions = torch.stack(saved)
        return Trajectory(
            times=np.array(times), positions=from_torch(positions, numpy_out),
            monitors={key: np.asarray(val, dtype=float) for key, val in record.records.items()},
            monitor_times=np.array(record.times),
            sinkhorn_iterations=iters if variant.normalization == "sinkhorn" else np.zeros(steps, dtype=int),
            converged=bool(all_converged), attention=variant.name, integrator=integrator, manifold=manifold, h=hh,
            n_iter=None if n_iter is None else int(n_iter), temperature=tau,
            weights=from_torch(a, numpy_out), chunked=bool(chunked),
            landmarks=None if landmarks is None else int(landmarks.numel() if isinstance(landmarks, torch.Tensor) else landmarks))
