r"""Clustering on the circle and the sphere: linear stability of the uniform state, and cluster counts.

docs/theory/mean_field.md. Tokens :math:`x = (\cos\theta, \sin\theta)` on the unit circle
under :func:`sinkflow.simulate` with ``manifold="sphere"``, :math:`Q = K = V = I` and
temperature :math:`1/\beta` move by :math:`\dot\theta_i = \sum_j K_{ij}\sin(\theta_j - \theta_i)`
with :math:`K_{ij} \propto a_j e^{\beta\cos(\theta_i - \theta_j)}` normalized by rows
(``"softmax"``), not at all (``"unnormalized"``) or doubly stochastically (``"sinkhorn"``).
On a density :math:`\rho` (w.r.t. :math:`d\theta`):

.. math:: v[\rho](\theta) = \int K_\rho(\theta, \varphi)\sin(\varphi - \theta)\,\rho(\varphi)\,d\varphi .

Around the uniform density :math:`1/(2\pi)` the mode :math:`\cos k\theta` grows at the rate

.. math:: \lambda_k = \frac{k^2 I_k(\beta)}{\beta}\,c_k, \qquad
   c_k = 1 \text{ (unnormalized)},\quad \frac{1}{I_0(\beta)} \text{ (softmax)},\quad
   \frac{1}{I_0(\beta) + I_k(\beta)} \text{ (sinkhorn)},

(:math:`I_k` the modified Bessel functions), and the fastest mode :math:`k^*(\beta)` predicts
how many clusters particles from a near-uniform start form before they merge.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.special import ive

from sinkflow._backend import from_torch, to_torch
from sinkflow._checks import check_number
from sinkflow.heat._circle_field import CIRCLE_NORMALIZATIONS, uniform_angles

__all__ = ["circle_growth_rate", "fastest_mode", "angular_density", "count_clusters", "circle_energy",
           "fourier_amplitude", "formation_time", "particle_cluster_count", "sphere_growth_rate"]


def circle_growth_rate(k, beta: float, normalization: str = "softmax"):
    r"""Linear growth rate :math:`\lambda_k` of :math:`\cos k\theta` around the uniform density.

    Parameters
    ----------
    k : int or array of int >= 1
    beta : float
        Inverse temperature (> 0).
    normalization : {"softmax", "unnormalized", "sinkhorn"}

    Returns
    -------
    float or numpy.ndarray
        :math:`k^2 I_k(\beta) c_k / \beta` with :math:`c_k` of the module docstring.

    Examples
    --------
    >>> from sinkflow.clustering import circle_growth_rate
    >>> rates = circle_growth_rate([1, 2, 3, 4, 5], 5.0)
    >>> int(rates.argmax()) + 1   # beta = 5: the 3-periodic mode grows fastest under SoftMax
    3
    """
    rate, beta = _scaled_rate(k, beta, normalization)
    k = np.asarray(k, dtype=float)
    if np.any((rate == 0) & (k > 0)):
        first = int(k[rate == 0].min()) if k.ndim else int(k)
        warnings.warn(f"circle_growth_rate: the rate of mode k={first} at beta={beta:g} underflows float64 (I_k(beta) "
                      f"below {np.finfo(float).tiny:.1e} e^beta) and is returned as 0; its true value is positive",
                      RuntimeWarning, stacklevel=2)
    if normalization == "unnormalized":
        if beta > _LOG_MAX:
            raise OverflowError("the unnormalized growth rate carries e^beta, beyond float64 for beta > "
                                f"{_LOG_MAX:.1f} (got {beta:g}); fastest_mode(beta, 'unnormalized') still ranks the "
                                "modes")
        rate = rate * math.exp(beta)
    return float(rate) if rate.ndim == 0 else rate


_LOG_MAX = math.log(np.finfo(float).max)  # 709.78: e^beta overflows float64 beyond
_BETA_MAX = 2.0 ** 30  # scipy.special.ive(k, beta) is NaN from here on (2^30 itself included)


def _scaled_rate(k, beta, normalization):
    """``(lambda_k, beta)`` checked, with the unnormalized rate divided by its common factor e^beta."""
    if normalization not in CIRCLE_NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {CIRCLE_NORMALIZATIONS}, got {normalization!r}")
    beta = float(check_number(beta, "beta", positive=True))
    k = _check_modes(k, "k", " (k = 0 is the mass, which does not grow)")
    if beta >= _BETA_MAX:
        raise ValueError(f"beta must be below 2^30 = {_BETA_MAX:.4g} (scipy.special.ive, the Bessel functions "
                         f"behind the rates, returns NaN from there on), got {beta:g}")
    if np.any(k >= _BETA_MAX):
        raise ValueError(f"k must be below 2^30 = {_BETA_MAX:.4g} (scipy.special.ive returns NaN for such orders; "
                         f"the rate of mode k has long underflowed to 0 there), got {float(np.max(k)):g}")
    ik = ive(k, beta)  # scaled by e^-beta: the ratios are exact
    if normalization == "unnormalized":
        return k ** 2 * ik / beta, beta
    i0 = ive(0, beta)
    return k ** 2 * ik / (i0 if normalization == "softmax" else i0 + ik) / beta, beta


def _check_modes(k, name: str, why: str = "") -> np.ndarray:
    """Mode numbers: integers >= 1 (a scalar or an array of them, of any integer or integral-float dtype), as floats."""
    arr = np.asarray(k)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a positive integer or an array of them, got {k!r:.80}")
    arr = arr.astype(float)
    if not np.isfinite(arr).all() or np.any(arr < 1) or np.any(arr != np.round(arr)):
        raise ValueError(f"{name} must be a positive integer{why}, got {k!r:.80}")
    return arr


def fastest_mode(beta: float, normalization: str = "softmax", k_max: int | None = None) -> int:
    r"""The mode :math:`k^*(\beta) = \arg\max_k \lambda_k` (:func:`circle_growth_rate`).

    Searched over :math:`1 \le k \le` ``k_max``, by default :math:`4\sqrt{\max(\beta, 1)} + 4`: beyond
    it the rates only fall (their maximum is near :math:`\sqrt{2\beta}`), so a larger ``k_max`` searches
    no further than the default.

    Examples
    --------
    >>> from sinkflow.clustering import fastest_mode
    >>> [fastest_mode(b) for b in (1.0, 5.0, 20.0)], fastest_mode(5.0, "sinkhorn")
    ([1, 3, 6], 4)
    """
    beta = float(check_number(beta, "beta", positive=True))
    default = int(4 * math.sqrt(min(max(beta, 1.0), _BETA_MAX))) + 4
    k_max = default if k_max is None else min(check_number(k_max, "k_max", integer=True, positive=True), default)
    rates = np.atleast_1d(_scaled_rate(np.arange(1, k_max + 1), beta, normalization)[0])  # any beta: no e^beta
    return int(np.argmax(rates)) + 1


def fourier_amplitude(density, k: int) -> float:
    r"""Amplitude :math:`\sqrt{a_k^2 + b_k^2}` of :math:`\cos(k\theta)` in a density on :func:`uniform_angles`.

    With :math:`\rho = \frac{1}{2\pi}(1 + \delta\cos k\theta)` it returns :math:`\delta / (2\pi)`.
    """
    rho = np.asarray(from_torch(to_torch(density, "density"), True), dtype=float)
    c = np.fft.rfft(rho)[k]
    return float(2 * abs(c) / rho.size)


def angular_density(theta, n_cells: int = 360, bandwidth: float = 0.05) -> np.ndarray:
    """Smoothed angular density of particle angles on :func:`uniform_angles` (periodic Gaussian, std ``bandwidth``)."""
    theta = np.mod(np.asarray(theta, dtype=float).ravel(), 2 * np.pi)
    hist = np.bincount((theta / (2 * np.pi) * n_cells).astype(int) % n_cells, minlength=n_cells).astype(float)
    return _smooth(hist / (theta.size * 2 * np.pi / n_cells), bandwidth)


def _smooth(rho: np.ndarray, bandwidth: float) -> np.ndarray:
    n = rho.size
    freq = np.fft.rfftfreq(n, d=1.0 / n)  # integer wave numbers
    return np.fft.irfft(np.fft.rfft(rho) * np.exp(-0.5 * (bandwidth * freq) ** 2), n)


def count_clusters(density, *, threshold: float = 3.0, bandwidth: float = 0.05) -> int:
    r"""Clusters of an angular density: local maxima of the smoothed density above ``threshold / (2 pi)``.

    The definition used for particles and for the mean-field densities alike: smooth the
    density on its (equispaced, periodic) cells with a Gaussian of std ``bandwidth`` (radians)
    and count the strict local maxima higher than ``threshold`` times the uniform density.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import angular_density, count_clusters
    >>> theta = np.concatenate([np.full(50, 0.5), np.full(50, 2.5), np.full(50, 4.5)])
    >>> count_clusters(angular_density(theta))
    3
    """
    rho = _smooth(np.asarray(from_torch(to_torch(density, "density"), True), dtype=float), bandwidth)
    left, right = np.roll(rho, 1), np.roll(rho, -1)
    peaks = (rho > left) & (rho >= right) & (rho > threshold / (2 * np.pi))
    return int(peaks.sum())


def circle_energy(density, beta: float) -> float:
    r""":math:`E_\beta = \frac{1}{2\beta}\iint e^{\beta\cos(\theta - \varphi)}\rho(\theta)\rho(\varphi)`
    on :func:`uniform_angles`.

    The mean-field counterpart of :func:`sinkflow.energy_sphere` (which SoftMax and the
    unnormalized kernel increase along the flow). The kernel on equispaced angles is circulant,
    so :math:`K w` is one FFT convolution, :math:`O(G \log G)` (no :math:`G \times G` matrix).

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import circle_energy
    >>> bool(np.isclose(circle_energy(np.full(64, 1 / (2 * np.pi)), 2.0), np.i0(2.0) / 4))   # uniform: I_0 / (2 beta)
    True
    """
    rho = np.asarray(from_torch(to_torch(density, "density"), True), dtype=float)
    w = rho * 2 * np.pi / rho.size
    theta = uniform_angles(rho.size)
    column = np.exp(beta * np.cos(theta - theta[0]))  # K_ij = column[(i - j) mod G]
    return float(w @ _circulant_apply(column, w) / (2 * beta))


def _circulant_apply(column: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``C a`` for the circulant matrix with first column ``column`` (:math:`C_{ij} = c_{(i - j) \bmod G}`),
    by the FFT."""
    return np.fft.irfft(np.fft.rfft(column) * np.fft.rfft(a), column.size)


def formation_time(beta: float, n: int, normalization: str = "softmax") -> float:
    r"""Time for the fastest mode to grow from the i.i.d. noise level :math:`n^{-1/2}` to O(1):
    :math:`\log\sqrt n / \lambda_{k^*}`.

    ``n`` is the number of particles (an integer >= 1: the Fourier amplitudes of ``n`` i.i.d. uniform
    angles are of order :math:`n^{-1/2}`; ``n = 1`` gives 0).

    Examples
    --------
    >>> from sinkflow.clustering import formation_time
    >>> round(formation_time(5.0, 256), 3)
    4.061
    """
    n = check_number(n, "n", integer=True, positive=True)
    k = fastest_mode(beta, normalization)
    return math.log(math.sqrt(n)) / circle_growth_rate(k, beta, normalization)


def particle_cluster_count(beta: float, seed, n: int = 256, normalization: str = "softmax", *,
                           h: float = 0.05, plateau: float = 2.0):
    r"""Clusters that ``n`` i.i.d. uniform particles on the circle form, counted at the metastable plateau.

    The particles run under :func:`sinkflow.simulate` (``manifold="sphere"``, :math:`d = 2`,
    temperature :math:`1/\beta`, Euler step ``h``, capped at
    :func:`sinkflow.particles.largest_safe_step` where a cold start needs a shorter one) up to ``plateau`` times
    :func:`formation_time`, and their clusters are counted by :func:`count_clusters` of
    :func:`angular_density`. Compare with :func:`fastest_mode`.

    Parameters
    ----------
    beta : float
        Inverse temperature.
    seed : int or sequence of int
        Seed of the start; a sequence counts one run per seed. Runs that share their step (the
        cap depends on the start) advance together as one ensemble, each as it would alone.
    n : int
        Particles.
    normalization : {"softmax", "sinkhorn", "unnormalized"}
    h : float
        Euler step, before the cap.
    plateau : float
        The count is read at ``plateau`` times the formation time.

    Returns
    -------
    int, or numpy.ndarray of int with one count per seed

    Examples
    --------
    >>> from sinkflow.clustering import particle_cluster_count, fastest_mode
    >>> particle_cluster_count(8.0, seed=1), fastest_mode(8.0)
    (4, 4)
    >>> particle_cluster_count(8.0, seed=[1, 2])
    array([4, 4])
    """
    import sinkflow

    seeds = np.asarray(seed)
    if seeds.ndim > 1 or seeds.dtype.kind not in "iu":
        raise ValueError(f"seed must be an int or a sequence of ints, got {seed!r}")
    starts = [_uniform_circle_start(int(s), int(n)) for s in seeds.reshape(-1)]
    horizon, steps_of = plateau * formation_time(beta, n, normalization), {}  # (h, steps) -> indices of the starts
    for i, x0 in enumerate(starts):
        h_i = min(float(h), sinkflow.particles.largest_safe_step(x0, normalization, temperature=1 / beta))
        steps_of.setdefault((h_i, int(round(horizon / h_i))), []).append(i)
    counts = np.empty(len(starts), dtype=int)
    for (h_i, steps), idx in steps_of.items():
        x = sinkflow.simulate(np.stack([starts[i] for i in idx]), normalization, h=h_i, steps=steps,
                              manifold="sphere", temperature=1 / beta, save_every=max(steps, 1)).final
        counts[idx] = [count_clusters(angular_density(np.arctan2(xi[:, 1], xi[:, 0]))) for xi in x]
    return int(counts[0]) if seeds.ndim == 0 else counts


def _uniform_circle_start(seed: int, n: int) -> np.ndarray:
    theta = np.random.default_rng(seed).uniform(0, 2 * np.pi, n)
    return np.stack([np.cos(theta), np.sin(theta)], 1)


def sphere_growth_rate(l, beta: float, normalization: str = "softmax"):  # noqa: E741  # public parameter name
    r"""Linear growth rate of the zonal harmonic :math:`P_l(\langle x, e\rangle)` around the uniform law on :math:`S^2`.

    The sphere in :math:`d = 3` (:func:`sinkflow.simulate`, ``manifold="sphere"``, :math:`Q = K = V = I`):
    by Funk-Hecke,
    :math:`\int_{S^2} e^{\beta\langle x, y\rangle} P_l(\langle y, e\rangle)\, d\sigma(y)
    = 4\pi\, i_l(\beta)\, P_l(\langle x, e\rangle)`
    (:math:`i_l` the modified spherical Bessel function), the velocity is the surface gradient of
    :math:`\beta^{-1}\int e^{\beta\langle x, y\rangle} d\rho`, and :math:`-\Delta_{S^2} P_l = l(l+1) P_l`, so

    .. math:: \lambda_l = \frac{l(l+1)\, i_l(\beta)}{\beta}\, c_l,\qquad
       c_l = 1,\ \frac{1}{i_0(\beta)},\ \frac{1}{i_0(\beta) + i_l(\beta)}

    for the unnormalized, SoftMax and Sinkhorn kernels (the circle's :math:`k^2 I_k` with
    :math:`l(l+1)\, i_l`).

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import sphere_growth_rate
    >>> int(np.argmax(sphere_growth_rate(np.arange(1, 8), 5.0))) + 1   # fastest harmonic at beta = 5
    3
    """
    from scipy.special import spherical_in

    if normalization not in CIRCLE_NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {CIRCLE_NORMALIZATIONS}, got {normalization!r}")
    beta = float(check_number(beta, "beta", positive=True))
    degree = _check_modes(l, "l")
    with np.errstate(over="ignore", invalid="ignore"):
        il, i0 = spherical_in(degree.astype(int), beta), spherical_in(0, beta)
        c = {"unnormalized": 1.0, "softmax": 1 / i0, "sinkhorn": 1 / (i0 + il)}[normalization]
        rate = degree * (degree + 1) * il * c / beta
    if not np.isfinite(rate).all():
        raise OverflowError(f"sphere_growth_rate: the Bessel functions i_l(beta) overflow float64 at beta={beta:g} "
                            "(past about 700)")
    return float(rate) if rate.ndim == 0 else rate
