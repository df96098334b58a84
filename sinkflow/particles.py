r"""Particle simulators: a residual attention layer is an explicit Euler step.

docs/theory/gradient_flows.md and docs/theory/sphere.md. Tokens :math:`x_i` move by

.. math:: x_i \leftarrow x_i + h \sum_j K_{ij}(X)\, W_V x_j

(:mod:`sinkflow.fields` defines :math:`K` for each attention kind); RK4 with the same
field is the continuous-depth reference. On the sphere (the layer-norm model of
Geshkovski et al.) the velocity is projected by :math:`P_x^\perp = I - x x^T` and
each step is followed by renormalization.

Monitors follow py-pde's trackers: quantities recorded along the run, every
``monitor_every`` steps, returned in :attr:`Trajectory.monitors`:

``"energy"``
    the energy of the flow: :math:`F^\infty` (sinkhorn), :math:`F^0` (unnormalized),
    :math:`F^\infty` as a common yardstick for softmax, the Gaussian analogue of :math:`F^0`
    (gaussian), :math:`E_\beta` on the sphere (which assumes :math:`Q = K = V = I`)
    (:mod:`sinkflow.energies`; evaluated with :math:`W = W_Q^T W_K / \tau`).
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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sinkflow._backend import check_finite, check_float, from_torch, to_torch
from sinkflow.energies import energy_0, energy_gaussian, energy_inf, energy_sphere
from sinkflow.fields import ATTENTIONS, attention_field, check_matrix, check_weights, dense_limit, single_thread_if_small

__all__ = ["simulate", "Trajectory", "random_particles", "cluster_statistics", "MONITORS"]

MONITORS = ("energy", "energy_inf", "energy_0", "marginal_errors", "clusters")
INTEGRATORS = ("euler", "rk4")
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
        Whether the field was evaluated block-wise (:mod:`sinkflow.lazy`).
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
    if int(n) < 1 or int(d) < 1:
        raise ValueError(f"n and d must be positive, got n={n}, d={d}")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((int(n), int(d)))
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
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


# ----------------------------------------------------------------------------------------
# the simulator


def simulate(x0, attention: str = "sinkhorn", W_Q=None, W_K=None, W_V=None, h: float = 0.1, steps: int = 100, *,
             n_iter=None, weights=None, integrator: str = "euler", manifold: str = "euclidean",
             temperature: float = 1.0, monitors=(), monitor_every: int = 1, save_every: int = 1,
             warm_start: bool | None = None, chunked: bool | None = None, tol: float = 1e-10,
             max_iter: int = 20_000, cluster_tol: float = 1e-3, progress: bool = False) -> Trajectory:
    r"""Simulate tokens moving under self-attention (a residual network of depth ``steps``).

    Parameters
    ----------
    x0 : array (n, d) or torch.Tensor
        Initial particles. numpy in -> numpy out; torch in -> torch out on the same
        device and dtype (CUDA works unchanged). Must be finite, floating (numpy defaults
        to float64), and on the unit sphere for ``manifold="sphere"``.
    attention : {"sinkhorn", "softmax", "unnormalized", "gaussian"}
        The kernel (:mod:`sinkflow.fields`).
    W_Q, W_K, W_V : arrays (d, d), optional
        Query, key and value matrices (identity by default); the scores are
        :math:`x_i^T W_Q^T W_K x_j / \tau`. The gradient-flow theorem holds for
        :math:`W = W_Q^T W_K / \tau` symmetric and :math:`W_V = W` (descent of the energy).
    h : float
        Step size (> 0); Euler with step ``h`` is a residual layer.
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
    monitors : iterable of str
        Any of ``"energy", "energy_inf", "energy_0", "marginal_errors", "clusters"``.
    monitor_every, save_every : int
        Record monitors / positions every so many steps (the last state is always kept).
    warm_start : bool, optional
        Start each Sinkhorn solve from the previous column potential (``init_g``). Default:
        True for ``n_iter=None`` (same fixed point, far fewer iterations), False for a
        fixed ``n_iter`` (each layer normalizes from scratch, as a Sinkformer does).
    chunked : bool, optional
        Evaluate the field block-wise (:mod:`sinkflow.lazy`, memory O(n) per block). Default:
        automatically when one ``n x n`` matrix would exceed 512 MiB.
    tol, max_iter : float, int
        Sinkhorn stopping rule for ``n_iter=None``.
    cluster_tol : float
        :math:`\delta` of the cluster monitor.
    progress : bool
        Show a tqdm progress bar.

    Returns
    -------
    Trajectory

    Raises
    ------
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

    numpy_out = not isinstance(x0, torch.Tensor)
    X = to_torch(x0, "x0")
    check_float(X, "x0")
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"x0 must have shape (n, d) with n, d >= 1, got {tuple(X.shape)}")
    check_finite(X, "x0")
    X = X.detach().clone()
    n, d = X.shape
    _check_choice(attention, "attention", ATTENTIONS)
    _check_choice(integrator, "integrator", INTEGRATORS)
    _check_choice(manifold, "manifold", MANIFOLDS)
    if isinstance(h, bool) or not isinstance(h, (int, float, np.floating, np.integer)) or not math.isfinite(h) or h <= 0:
        raise ValueError(f"step size h must be a finite number > 0, got {h!r}")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    if not (math.isfinite(float(temperature)) and float(temperature) > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if n_iter is not None and (isinstance(n_iter, bool) or not isinstance(n_iter, (int, np.integer)) or n_iter < 1):
        raise ValueError(f"n_iter must be a positive integer (Sinkhorn half-iterations) or None, got {n_iter!r}")
    for name, every in (("monitor_every", monitor_every), ("save_every", save_every)):
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise ValueError(f"{name} must be a positive integer, got {every!r}")
    monitors = tuple(monitors)
    for m in monitors:
        _check_choice(m, "each monitor", MONITORS)
    Wq, Wk, Wv = (check_matrix(M, name, d, X) for M, name in ((W_Q, "W_Q"), (W_K, "W_K"), (W_V, "W_V")))
    W = None if Wq is None and Wk is None else (Wq if Wq is not None else torch.eye(d, dtype=X.dtype, device=X.device)).T @ (
        Wk if Wk is not None else torch.eye(d, dtype=X.dtype, device=X.device))
    a = check_weights(weights, X)
    sphere = manifold == "sphere"
    if sphere:
        dev = float((X.norm(dim=1) - 1).abs().max())
        if dev > (1e-8 if X.dtype == torch.float64 else 1e-5):
            raise ValueError(f"manifold='sphere' needs x0 on the unit sphere (max | |x_i| - 1 | = {dev:.3g}); "
                             "normalize it, e.g. x0 / np.linalg.norm(x0, axis=1, keepdims=True)")
    if chunked is None:
        chunked = n > dense_limit(X.dtype)
    dense_monitors = [m for m in monitors if m != "marginal_errors"]
    if dense_monitors and n > MAX_MONITOR_N:
        raise ValueError(f"monitors {dense_monitors} evaluate n x n float64 matrices; n={n} is too large "
                         f"(n <= {MAX_MONITOR_N}); 'marginal_errors' works at any n")
    if warm_start is None:
        warm_start = n_iter is None
    tau = float(temperature)
    need_errors = "marginal_errors" in monitors
    state = {"g": None}

    def field_at(Y):
        ev = attention_field(Y, attention, W, Wv, n_iter=n_iter, weights=a, temperature=tau,
                             init_g=state["g"] if warm_start else None, tol=tol, max_iter=max_iter,
                             chunked=chunked, need_errors=need_errors)
        if ev.g is not None and warm_start:
            state["g"] = ev.g.detach()
        v = ev.velocity
        if sphere:
            v = v - (v * Y).sum(1, keepdim=True) * Y
        return v, ev

    def retract(Y):
        return Y / Y.norm(dim=1, keepdim=True) if sphere else Y

    # energy monitors use W / tau (the bilinear form of the scores)
    W_energy = ((W if W is not None else torch.eye(d, dtype=X.dtype, device=X.device)) / tau).to(torch.float64)

    def energy(kind, Y):
        Y = Y.detach().to(torch.float64)  # energies are theory checks: always float64
        if kind == "energy" and sphere:
            return float(energy_sphere(Y, 1.0 / tau, a64))
        if kind == "energy_0" or (kind == "energy" and attention in ("unnormalized",)):
            return float(energy_0(Y, W_energy, a64))
        if kind == "energy" and attention == "gaussian":
            return float(energy_gaussian(Y, W_energy, a64))
        return float(energy_inf(Y, W_energy, a64, tol=1e-12))

    a64 = None if a is None else a.to(torch.float64) / a.to(torch.float64).sum()
    records: dict[str, list] = {}
    mtimes: list[float] = []

    def record(k, Y, ev):
        mtimes.append(k * float(h))
        for m in monitors:
            if m == "marginal_errors":
                if ev is None:
                    _, ev = field_at(Y)
                records.setdefault("row_error", []).append(ev.row_error)
                records.setdefault("column_error", []).append(ev.column_error)
            elif m == "clusters":
                frac, count = cluster_statistics(Y, manifold=manifold, tol=cluster_tol)
                records.setdefault("cluster_fraction", []).append(frac)
                records.setdefault("cluster_count", []).append(count)
            else:
                records.setdefault(m, []).append(energy(m, Y))


    hh = float(h)
    with single_thread_if_small(n, X.device):
        saved = [X.clone()]
        times = [0.0]
        iters = np.zeros(steps, dtype=int)
        all_converged = True
        for k in progress_bar(range(steps), enabled=progress, desc=f"{attention} flow", unit="step"):
            v1, ev = field_at(X)
            it, conv = ev.n_iter, ev.converged
            if monitors and k % monitor_every == 0:
                record(k, X, ev)
            if integrator == "euler":
                X = retract(X + hh * v1)
            else:
                v2, e2 = field_at(retract(X + 0.5 * hh * v1))
                v3, e3 = field_at(retract(X + 0.5 * hh * v2))
                v4, e4 = field_at(retract(X + hh * v3))
                X = retract(X + (hh / 6) * (v1 + 2 * v2 + 2 * v3 + v4))
                it += e2.n_iter + e3.n_iter + e4.n_iter
                conv = conv and e2.converged and e3.converged and e4.converged
            iters[k] = it
            all_converged = all_converged and (conv or n_iter is not None)
            if not bool(torch.isfinite(X).all()):
                raise FloatingPointError(
                    f"the flow left the floating-point range at step {k + 1} (t = {(k + 1) * hh:g}); "
                    "the unnormalized kernel grows like exp(x^T W y): use a smaller h, fewer steps or a larger temperature")
            if (k + 1) % save_every == 0 or k + 1 == steps:
                saved.append(X.clone())
                times.append((k + 1) * hh)
        if monitors and (not mtimes or mtimes[-1] != steps * hh):
            record(steps, X, None)
        positions = torch.stack(saved)
        return Trajectory(
            times=np.array(times), positions=from_torch(positions, numpy_out),
            monitors={key: np.asarray(val, dtype=float) for key, val in records.items()},
            monitor_times=np.array(mtimes), sinkhorn_iterations=iters if attention == "sinkhorn" else np.zeros(steps, dtype=int),
            converged=bool(all_converged), attention=attention, integrator=integrator, manifold=manifold, h=hh,
            n_iter=None if n_iter is None else int(n_iter), temperature=tau,
            weights=from_torch(a, numpy_out), chunked=bool(chunked))
