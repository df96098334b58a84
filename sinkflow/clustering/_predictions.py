r"""Where and how many clusters particles on the circle form: the linear prediction from the initial
configuration, and the experiment of Bruno, Pasqualotto and Agazzi (ICLR 2025) that checks it.

docs/theory/clustering.md. From a near-uniform start the fastest mode :math:`k^*(\beta)` of
:func:`~sinkflow.clustering.circle_growth_rate` grows from its initial amplitude
:math:`\mu_k(0) = \frac1N \sum_i e^{ik\theta_i(0)}`; the density perturbation is
:math:`\propto \mathrm{Re}(\overline{\mu_k(0)} e^{ik\theta}) = |\mu_k(0)| \cos(k\theta - \arg\mu_k(0))`,
so the clusters sit near :math:`(\arg \mu_k(0) + 2\pi j)/k`, :math:`j = 0..k-1`
(:func:`predict_clusters`). Every mode starts from noise of size :math:`N^{-1/2}`, so when two rates
nearly tie the mode that wins is the one with the larger amplified amplitude
:math:`|\mu_k(0)|\, e^{\lambda_k T}` at the formation time :math:`T` (``seeded_count``), which
:math:`k^*` ignores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sinkflow._backend import from_torch, to_torch
from sinkflow._checks import check_choice, check_number
from sinkflow._summary import Summarized, number
from sinkflow.clustering._linear_theory import (
    _smooth,
    angular_density,
    circle_growth_rate,
    fastest_mode,
    formation_time,
)
from sinkflow.heat._circle_field import CIRCLE_NORMALIZATIONS, uniform_angles

__all__ = ["ClusterPrediction", "predict_clusters", "cluster_positions", "position_error", "plateau_clusters",
           "sphere_plateau_clusters", "mode_history", "cluster_centers", "sphere_mode_maxima"]


@dataclass(frozen=True, repr=False)
class ClusterPrediction(Summarized):
    """Result of :func:`predict_clusters`.

    Its ``repr`` states the predicted count, the seeded count, the formation time and the
    positions (the first few, in radians).

    Attributes
    ----------
    count : int
        :math:`k^*(\\beta)`, the fastest-growing mode.
    positions : numpy.ndarray (count,)
        :math:`(\\arg\\mu_{k^*}(0) + 2\\pi j)/k^*` in :math:`[0, 2\\pi)`, increasing.
    amplitude : float
        :math:`|\\mu_{k^*}(0)|`.
    formation_time : float
        :math:`\\log(N^{1/2}) / \\lambda_{k^*}` (:func:`~sinkflow.clustering.formation_time`).
    seeded_count : int
        :math:`\\arg\\max_k |\\mu_k(0)|\\, e^{\\lambda_k T}`: the mode ahead at the formation time
        from this start (initial amplitudes count, not only rates).
    """

    count: int
    positions: np.ndarray
    amplitude: float
    formation_time: float
    seeded_count: int

    def _facts(self):
        shown = ", ".join(number(p) for p in self.positions[:6]) + (", ..." if len(self.positions) > 6 else "")
        seeded = "the same" if self.seeded_count == self.count else f"{self.seeded_count} (initial amplitudes count)"
        return f"k* = {self.count} clusters on the circle", [
            [("seeded count", seeded), ("formation time", number(self.formation_time)),
             ("amplitude |mu_k*(0)|", number(self.amplitude))],
            [("positions (rad)", shown)],
        ]


def _angles(x) -> np.ndarray:
    arr = np.asarray(from_torch(to_torch(x, "x0"), True), dtype=float)
    if arr.ndim == 2 and arr.shape[1] == 2:
        return np.arctan2(arr[:, 1], arr[:, 0])
    if arr.ndim == 1:
        return arr
    raise ValueError(f"x0 must be angles (n,) or points on the circle (n, 2), got shape {arr.shape}")


def predict_clusters(x0, beta: float, normalization: str = "softmax") -> ClusterPrediction:
    r"""Predicted number and positions of the clusters that particles on the circle form.

    Parameters
    ----------
    x0 : array (n,) of angles or (n, 2) of points on the circle
        Initial configuration (near uniform).
    beta : float
        Inverse temperature (> 0).
    normalization : {"softmax", "sinkhorn", "unnormalized"}

    Returns
    -------
    ClusterPrediction

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import predict_clusters
    >>> theta = np.random.default_rng(0).uniform(0, 2 * np.pi, 20_000)
    >>> p = predict_clusters(theta, 5.0)
    >>> p.count, p.positions.shape, bool(np.allclose(np.diff(p.positions), 2 * np.pi / 3))
    (3, (3,), True)
    """
    theta = _angles(x0)
    if theta.size < 2:
        raise ValueError("x0 must hold at least 2 particles")
    beta = float(check_number(beta, "beta", positive=True))
    check_choice(normalization, "normalization", CIRCLE_NORMALIZATIONS)
    k = fastest_mode(beta, normalization)
    T = formation_time(beta, theta.size, normalization)
    modes = np.arange(1, max(2 * k, k + 4) + 1)
    mu = np.exp(1j * np.outer(modes, theta)).mean(1)
    score = np.log(np.abs(mu)) + circle_growth_rate(modes, beta, normalization) * T
    positions = np.sort(np.mod((np.angle(mu[k - 1]) + 2 * np.pi * np.arange(k)) / k, 2 * np.pi))
    return ClusterPrediction(k, positions, float(abs(mu[k - 1])), float(T), int(modes[np.argmax(score)]))


def cluster_positions(x, *, threshold: float = 3.0, bandwidth: float = 0.05) -> np.ndarray:
    """Angles of the clusters of particles on the circle, increasing in :math:`[0, 2\\pi)`.

    The clusters of :func:`~sinkflow.clustering.count_clusters` (peaks of the smoothed angular
    density above ``threshold`` times uniform); each position is the circular mean of the particles
    nearest that peak.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import cluster_positions
    >>> theta = np.concatenate([np.full(50, 0.5), np.full(50, 2.5) + np.linspace(-0.01, 0.01, 50)])
    >>> np.round(cluster_positions(theta), 6)
    array([0.5, 2.5])
    """
    theta = np.mod(_angles(x), 2 * np.pi)
    rho = _smooth(angular_density(theta), bandwidth)
    left, right = np.roll(rho, 1), np.roll(rho, -1)
    peaks = uniform_angles(rho.size)[(rho > left) & (rho >= right) & (rho > threshold / (2 * np.pi))]
    if peaks.size == 0:
        return peaks
    nearest = np.argmin(np.abs(np.angle(np.exp(1j * (theta[:, None] - peaks[None, :])))), 1)
    means = [np.angle(np.exp(1j * theta[nearest == c]).mean()) for c in range(peaks.size)]
    return np.sort(np.mod(means, 2 * np.pi))


def _components(x, radius: float):
    """``(count, labels)``: connected components of the graph of pairs closer than ``radius`` (chordal)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    pairs = cKDTree(x).query_pairs(radius, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(len(x), len(x)))
    return connected_components(graph, directed=False)


def cluster_centers(x, *, radius: float = 0.05, min_fraction: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """Clusters of unit vectors as ``(centers (k, d), masses (k,))``, each particle counted with its
    nearest center (masses sum to 1).

    On the circle (``d = 2``) the clusters of :func:`cluster_positions`; on a sphere the connected
    components of the pairs closer than ``radius`` (chordal) holding at least ``min_fraction`` of the
    particles, each centered at its normalized mean (as :func:`sphere_plateau_clusters` counts them).

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import cluster_centers
    >>> x = np.repeat([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], [30, 10], axis=0)
    >>> centers, masses = cluster_centers(x)
    >>> centers.tolist(), masses.tolist()
    ([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], [0.75, 0.25])
    """
    X = np.asarray(x, dtype=float)
    if X.ndim != 2 or X.shape[1] < 2:
        raise ValueError(f"x must be unit vectors (n, d), d >= 2, got shape {X.shape}")
    if X.shape[1] == 2:
        angles = cluster_positions(X)
        centers = np.stack([np.cos(angles), np.sin(angles)], 1)
    else:
        _, labels = _components(X, radius)
        keep = np.flatnonzero(np.bincount(labels) >= min_fraction * len(X))
        means = np.array([X[labels == c].mean(0) for c in keep]).reshape(-1, X.shape[1])
        centers = means / np.linalg.norm(means, axis=1, keepdims=True)
    if centers.shape[0] == 0:
        return centers, np.zeros(0)
    nearest = np.argmax(X @ centers.T, 1)
    return centers, np.bincount(nearest, minlength=centers.shape[0]) / len(X)


def position_error(measured, predicted) -> float:
    """Largest circular distance between matched clusters (both sorted; the best cyclic matching),
    NaN when the counts differ.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import position_error
    >>> round(position_error([0.1, 2.2, 4.3], [6.2, 2.0, 4.2]), 3)
    0.2
    """
    m, p = np.sort(np.asarray(measured, float)), np.sort(np.asarray(predicted, float))
    if m.size != p.size or m.size == 0:
        return math.nan
    dist = [np.abs(np.angle(np.exp(1j * (m - np.roll(p, s))))).max() for s in range(p.size)]
    return float(min(dist))


def plateau_clusters(beta: float, seed: int, n: int = 20_000, normalization: str = "softmax", *,
                     h: float = 0.1, plateau: float = 2.0, tol: float = 1e-10) -> dict:
    r"""One run of the experiment: ``n`` i.i.d. uniform particles, their prediction, and their clusters
    at the formation time and at ``plateau`` times it.

    :func:`sinkflow.simulate` on the circle (``manifold="sphere"``, ``d = 2``, float64, Euler step
    ``h`` capped at :func:`sinkflow.particles.largest_safe_step`; the exact harmonic field above a
    few hundred particles, Sinkhorn solved to ``tol``).

    Returns
    -------
    dict
        ``beta, seed, n, normalization, predicted`` (:math:`k^*`), ``seeded`` (the amplified-amplitude
        count), ``count`` (measured at the plateau), ``error`` (:func:`position_error`, NaN when the
        counts differ), ``count_formation`` and ``error_formation`` (the same at the formation time),
        ``time`` (the plateau time), ``formation_time``, ``predicted_positions``, ``positions``.
    """
    from sinkflow.particles import largest_safe_step, simulate

    theta = np.random.default_rng(seed).uniform(0, 2 * np.pi, int(n))
    x0 = np.stack([np.cos(theta), np.sin(theta)], 1)
    pred = predict_clusters(theta, beta, normalization)
    h = min(float(h), largest_safe_step(x0, normalization, temperature=1 / beta))
    at_formation = max(1, int(round(pred.formation_time / h)))
    steps = int(round(plateau * at_formation))
    traj = simulate(x0, normalization, h=h, steps=steps, manifold="sphere", temperature=1 / beta, tol=tol,
                    save_every=at_formation)
    early, found = cluster_positions(traj.positions[1]), cluster_positions(traj.final)
    return dict(beta=float(beta), seed=int(seed), n=int(n), normalization=normalization, predicted=pred.count,
                seeded=pred.seeded_count, count=int(found.size), error=position_error(found, pred.positions),
                count_formation=int(early.size), error_formation=position_error(early, pred.positions),
                time=steps * h, formation_time=at_formation * h, predicted_positions=pred.positions.tolist(),
                positions=found.tolist())


def sphere_plateau_clusters(beta: float, seed: int, n: int = 10_000, normalization: str = "softmax", *,
                            h: float = 0.1, plateau: float = 2.0, radius: float = 0.05, tol: float = 1e-8) -> dict:
    r"""Clusters of ``n`` i.i.d. uniform particles on :math:`S^2` at ``plateau`` times the formation time
    :math:`\log\sqrt n / \max_l \lambda_l` (:func:`~sinkflow.clustering.sphere_growth_rate`).

    Clusters are the connected components of the graph of pairs closer than ``radius`` (chordal)
    holding at least 1% of the particles. Returns ``beta, seed, n, normalization, l_star`` (the fastest
    zonal degree), ``mode_maxima`` (the maxima of its part of the initial measure,
    :func:`sphere_mode_maxima`), ``count``, ``sizes`` and ``time``.
    """
    from sinkflow.clustering._linear_theory import sphere_growth_rate
    from sinkflow.particles import largest_safe_step, random_particles, simulate

    x0 = random_particles(int(n), 3, seed=seed, manifold="sphere")
    degrees = np.arange(1, int(4 * math.sqrt(max(beta, 1.0))) + 6)
    rates = sphere_growth_rate(degrees, beta, normalization)
    h = min(float(h), largest_safe_step(x0, normalization, temperature=1 / beta))
    steps = int(round(plateau * math.log(math.sqrt(n)) / rates.max() / h))
    x = simulate(x0, normalization, h=h, steps=steps, manifold="sphere", temperature=1 / beta, tol=tol,
                 save_every=max(steps, 1)).final
    sizes = np.sort(np.bincount(_components(x, radius)[1]))[::-1]
    sizes = sizes[sizes >= 0.01 * len(x)]
    return dict(beta=float(beta), seed=int(seed), n=int(n), normalization=normalization,
                l_star=int(degrees[np.argmax(rates)]),
                mode_maxima=len(sphere_mode_maxima(x0, degrees[np.argmax(rates)])),
                count=int(sizes.size), sizes=sizes.tolist(), time=steps * h)


def mode_history(beta: float, seed: int, n: int = 20_000, normalization: str = "softmax", *, modes: int = 12,
                 h: float = 0.1, plateau: float = 2.0, samples: int = 40, tol: float = 1e-6) -> dict:
    r"""The race between the modes in one run: :math:`|\mu_k(t)|`, :math:`k = 1..` ``modes``, and the
    cluster count, at ``samples`` times up to ``plateau`` times the formation time, from ``n`` i.i.d.
    uniform angles (as :func:`plateau_clusters`).

    Returns ``beta, seed, n, normalization, times, amplitudes`` (``samples + 1`` rows of ``modes``),
    ``counts``, ``rates`` (:func:`~sinkflow.clustering.circle_growth_rate` of each mode) and
    ``formation_time``.

    Examples
    --------
    >>> from sinkflow.clustering import mode_history
    >>> r = mode_history(5.0, 0, n=600, modes=4, samples=4)
    >>> len(r["times"]), len(r["amplitudes"][0]), r["counts"][-1] >= 1
    (5, 4, True)
    """
    from sinkflow.particles import largest_safe_step, simulate

    theta = np.random.default_rng(seed).uniform(0, 2 * np.pi, int(n))
    x0 = np.stack([np.cos(theta), np.sin(theta)], 1)
    t_f = formation_time(beta, theta.size, normalization)
    h = min(float(h), largest_safe_step(x0, normalization, temperature=1 / beta))
    stride = max(1, int(round(plateau * t_f / h / samples)))
    traj = simulate(x0, normalization, h=h, steps=stride * samples, manifold="sphere", temperature=1 / beta, tol=tol,
                    save_every=stride)
    angles = np.arctan2(traj.positions[..., 1], traj.positions[..., 0])
    k = np.arange(1, int(modes) + 1)
    amplitudes = np.abs(np.exp(1j * k[None, :, None] * angles[:, None, :]).mean(2))
    return dict(beta=float(beta), seed=int(seed), n=int(n), normalization=normalization, times=traj.times.tolist(),
                amplitudes=amplitudes.tolist(), counts=[int(cluster_positions(a).size) for a in angles],
                rates=circle_growth_rate(k, beta, normalization).tolist(), formation_time=float(t_f))


def sphere_mode_maxima(x0, degree: int, *, grid: int = 4000) -> np.ndarray:
    r"""Local maxima of the degree-``degree`` part of the empirical measure of points on :math:`S^2`.

    By the addition theorem that part is :math:`f_l(y) = \frac{2l+1}{4\pi N}\sum_i P_l(\langle y, x_i\rangle)`;
    the zonal linear theory (:func:`~sinkflow.clustering.sphere_growth_rate`) amplifies it as a whole, so
    its maxima are where the clusters of the fastest degree form. Evaluated on a Fibonacci grid of
    ``grid`` points, a maximum being a grid point above its 8 nearest neighbours. Returns the maxima
    ``(k, 3)``, highest first.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import sphere_mode_maxima
    >>> octahedron = np.concatenate([np.eye(3), -np.eye(3)])
    >>> len(sphere_mode_maxima(octahedron, 4))   # x^4 + y^4 + z^4 - 3/5 peaks at the 6 vertices
    6
    """
    from scipy.spatial import cKDTree
    from scipy.special import eval_legendre

    X = np.asarray(x0, dtype=float)
    if X.ndim != 2 or X.shape[1] != 3:
        raise ValueError(f"x0 must be points on S^2, shape (n, 3), got {X.shape}")
    degree = int(check_number(degree, "degree", integer=True, positive=True))
    i = np.arange(int(grid)) + 0.5
    z, phi = 1 - 2 * i / grid, math.pi * (1 + math.sqrt(5)) * i
    Y = np.stack([np.sqrt(1 - z * z) * np.cos(phi), np.sqrt(1 - z * z) * np.sin(phi), z], 1)
    f = np.concatenate([eval_legendre(degree, c @ X.T).sum(1) for c in np.array_split(Y, max(1, grid // 500))])
    neighbours = cKDTree(Y).query(Y, 9)[1][:, 1:]
    peaks = np.flatnonzero((f[:, None] > f[neighbours]).all(1))
    return Y[peaks[np.argsort(-f[peaks])]]
