r"""Distances between particles and reference densities, and convergence rates.

* :func:`wasserstein2`: :math:`W_2` between the empirical measure of particles and a
  reference. In 1D it is exact up to quadrature: the reference's quantile function
  is tabulated on a fine grid and compared with the sorted particles (numpy; importing POT
  costs more than the distance). In higher dimension POT's ``ot.emd2`` compares against
  reference samples; the result then has a
  finite-sample floor (reported: the same distance for fresh i.i.d. samples of the
  reference), below which no particle method can be told apart from sampling.
* :func:`moment_errors`: mean and covariance errors.
* :func:`kde_l1`: :math:`L^1` distance between a Gaussian KDE of the particles and the
  reference density on a grid.
* :func:`fit_loglog_slope`, :func:`convergence_study`: observed orders with spread over
  seeds.

References follow the protocol of :mod:`sinkflow.heat` (``dim``, ``pdf``, ``sample``,
``mean``, ``covariance``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sinkflow._checks import check_number, check_seed
from sinkflow._summary import Summarized, number, span

__all__ = ["W2Result", "wasserstein2", "grid_quantiles", "wasserstein2_to_grid", "MomentErrors", "moment_errors",
           "kde_l1",
           "fit_loglog_slope", "ConvergenceStudy", "convergence_study"]


def _particles(x, d=None) -> np.ndarray:
    x = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
    x = np.asarray(x, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"particles must have shape (n, d), got {x.shape}")
    if d is not None and x.shape[1] != d:
        raise ValueError(f"particles have dimension {x.shape[1]} but the reference has dimension {d}")
    if not np.all(np.isfinite(x)):
        raise ValueError("particles contain non-finite values")
    return x


#: The quantiles of the last few references (a figure compares many samples with each reference).
_QUANTILES: OrderedDict = OrderedDict()
_QUANTILES_KEPT = 32


def _reference_key(reference):
    """The values of a frozen dataclass reference as a hashable key; None for any other object
    (its quantiles are then not kept)."""
    if not dataclasses.is_dataclass(reference) or not reference.__dataclass_params__.frozen:
        return None
    key = [type(reference).__module__, type(reference).__qualname__]
    for field in dataclasses.fields(reference):
        value = getattr(reference, field.name)
        if isinstance(value, np.ndarray):
            key.append((value.dtype.str, value.shape, value.tobytes()))
        elif _plain(value) or (isinstance(value, tuple) and all(map(_plain, value))):
            key.append(value)
        else:
            return None
    return tuple(key)


def _plain(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _quantiles_1d(reference, m: int) -> np.ndarray:
    """:func:`_tabulated_quantiles`, kept for the last :data:`_QUANTILES_KEPT` references of equal
    values (read-only: the same array is handed out again)."""
    key = _reference_key(reference)
    if key is None:
        return _tabulated_quantiles(reference, m)
    key = (key, m)
    if key in _QUANTILES:
        _QUANTILES.move_to_end(key)
        return _QUANTILES[key]
    q = _tabulated_quantiles(reference, m)
    q.flags.writeable = False
    _QUANTILES[key] = q
    if len(_QUANTILES) > _QUANTILES_KEPT:
        _QUANTILES.popitem(last=False)
    return q


def _tabulated_quantiles(reference, m: int) -> np.ndarray:
    """Reference quantiles at u = (k + 1/2)/m, from the CDF tabulated on a fine grid."""
    mean = float(np.asarray(reference.mean()).ravel()[0])
    sd = math.sqrt(float(np.asarray(reference.covariance()).ravel()[0]))
    radius = getattr(reference, "radius", None)
    half = 1.0001 * radius if radius is not None else 14.0 * sd
    # Mixtures: cover every component's 14-sigma range too.
    if hasattr(reference, "means"):
        lo = min(mean - half, float((reference.means[:, 0] - 14 * np.sqrt(reference.covs[:, 0, 0])).min()))
        hi = max(mean + half, float((reference.means[:, 0] + 14 * np.sqrt(reference.covs[:, 0, 0])).max()))
    else:
        lo, hi = mean - half, mean + half
    grid = np.linspace(lo, hi, 40001)
    pdf = reference.pdf(grid[:, None])
    cdf = np.concatenate([[0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2 * np.diff(grid))])
    cdf /= cdf[-1]
    u = (np.arange(m) + 0.5) / m
    keep = np.concatenate([[True], np.diff(cdf) > 0])  # strictly increasing for interpolation
    return np.interp(u, cdf[keep], grid[keep])


def _empirical_w2_squared_1d(u: np.ndarray, v: np.ndarray) -> float:
    r""":math:`W_2^2` between the uniform empirical measures of two 1D samples, exactly:
    :math:`\int_0^1 |F_u^{-1}(t) - F_v^{-1}(t)|^2 dt`, both quantile functions being steps that
    change at the cumulative weights of either sample."""
    u, v = np.sort(u), np.sort(v)
    cu, cv = np.cumsum(np.full(u.size, 1.0 / u.size)), np.cumsum(np.full(v.size, 1.0 / v.size))
    levels = np.sort(np.concatenate([cu, cv]))  # the right end of each interval where both are constant
    qu = u[np.minimum(np.searchsorted(cu, levels), u.size - 1)]
    qv = v[np.minimum(np.searchsorted(cv, levels), v.size - 1)]
    return float((np.diff(levels, prepend=0.0) * (qu - qv) ** 2).sum())


@dataclass(frozen=True, repr=False)
class W2Result(Summarized):
    """A Wasserstein-2 distance with its context (its ``repr``: the value, the method, the floor).

    Attributes
    ----------
    value : float
        :math:`W_2` (not squared).
    floor : float or None
        The same distance for ``n`` fresh i.i.d. samples of the reference (one draw):
        the Monte-Carlo level of an exact sampler, when requested.
    method : str
        ``"quantile"`` (1D, exact up to quadrature) or ``"emd"`` (against samples).
    n_reference : int
        Number of reference quantiles or samples.
    """

    value: float
    floor: float | None
    method: str
    n_reference: int

    def _facts(self):
        head = f"W2 = {number(self.value)} ({self.method}, {self.n_reference} reference points)"
        return head, [[("Monte-Carlo floor", number(self.floor))]] if self.floor is not None else []


def wasserstein2(particles, reference, *, n_reference: int | None = None, floor: bool = False, seed=0) -> W2Result:
    r""":math:`W_2` between uniform-weight particles and a reference density.

    Parameters
    ----------
    particles : array or tensor (n, d) (or (n,) in 1D)
    reference : GaussianMixture, Barenblatt or any object with the reference protocol
    n_reference : int, optional
        1D: number of quantile nodes (default ``max(20 n, 20000)``; quadrature error
        :math:`O(1/m)`). d >= 2: number of reference samples for ``ot.emd2``
        (default ``max(n, 1000)``).
    floor : bool
        Also compute the finite-sample floor (fresh i.i.d. samples of size ``n``).
    seed : int
        Seed of the reference samples (d >= 2) and of the floor draw.

    Returns
    -------
    W2Result

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> g = sinkflow.GaussianMixture.gaussian([0.0], [[1.0]])
    >>> r = sinkflow.wasserstein2(g.sample(2000, seed=1) + 0.5, g)
    >>> bool(0.45 < r.value < 0.55)
    True
    """
    d = reference.dim
    x = _particles(particles, d)
    n = x.shape[0]
    n_reference = check_number(n_reference, "n_reference", integer=True, positive=True, allow_none=True)
    rng = np.random.default_rng(check_seed(seed))
    if d == 1:
        m = int(n_reference or max(20 * n, 20000))
        q = _quantiles_1d(reference, m)

        def dist(p):
            return math.sqrt(max(_empirical_w2_squared_1d(p[:, 0], q), 0.0))

        value = dist(x)
        fl = dist(reference.sample(n, rng)) if floor else None
        return W2Result(value, fl, "quantile", m)
    import ot

    m = int(n_reference or max(n, 1000))
    ref = reference.sample(m, rng)
    b = np.full(m, 1.0 / m)

    def dist(p):
        M = ot.dist(p, ref)  # squared Euclidean
        return math.sqrt(max(float(ot.emd2(np.full(len(p), 1.0 / len(p)), b, M, numItermax=10_000_000)), 0.0))

    value = dist(x)
    fl = dist(reference.sample(n, rng)) if floor else None
    return W2Result(value, fl, "emd", m)


@dataclass(frozen=True, repr=False)
class MomentErrors(Summarized):
    """Errors of the first two moments (its ``repr``: both, in one line).

    Attributes
    ----------
    mean : float
        :math:`|\\bar x - m|`.
    covariance : float
        Relative Frobenius error :math:`\\|\\hat\\Sigma - \\Sigma\\|_F / \\|\\Sigma\\|_F`.
    """

    mean: float
    covariance: float

    def _facts(self):
        return (f"mean error {number(self.mean)}, covariance error {number(self.covariance)} "
                "(relative Frobenius)"), []


def moment_errors(particles, reference=None, *, mean=None, covariance=None) -> MomentErrors:
    """Mean and relative covariance error of particles against a reference (or given moments).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> g = sinkflow.GaussianMixture.gaussian([0.0, 0.0], np.eye(2))
    >>> e = sinkflow.moment_errors(g.sample(20000, seed=0), g)
    >>> bool(e.covariance < 0.05 and e.mean < 0.05)
    True
    """
    if reference is not None:
        mean = reference.mean() if mean is None else mean
        covariance = reference.covariance() if covariance is None else covariance
    if mean is None or covariance is None:
        raise ValueError("give a reference or both mean and covariance")
    mean = np.atleast_1d(np.asarray(mean, dtype=float))
    covariance = np.atleast_2d(np.asarray(covariance, dtype=float))
    x = _particles(particles, mean.size)
    cov = np.atleast_2d(np.cov(x.T, bias=True))
    return MomentErrors(float(np.linalg.norm(x.mean(0) - mean)),
                        float(np.linalg.norm(cov - covariance) / np.linalg.norm(covariance)))


def kde_l1(particles, reference, axes: Sequence[np.ndarray], bandwidth: float | str | None = None) -> float:
    r""":math:`L^1` distance between a Gaussian KDE of the particles and the reference on a grid.

    Parameters
    ----------
    particles : (n, d), d in {1, 2}
    reference : object with ``pdf``
    axes : list of d uniform 1D arrays
        Grid on which :math:`\int|\hat\rho - \rho|` is approximated by a Riemann sum; it
        should cover the reference's mass.
    bandwidth : float or "scott" / "silverman", optional
        Passed to ``scipy.stats.gaussian_kde`` (Scott's rule by default). The KDE's own
        bias and variance set a floor that decreases like :math:`n^{-2/(d+4)}` for i.i.d.
        samples.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> g = sinkflow.GaussianMixture.gaussian([0.0], [[1.0]])
    >>> bool(sinkflow.kde_l1(g.sample(4000, seed=0), g, [np.linspace(-6, 6, 601)]) < 0.05)
    True
    """
    from scipy.stats import gaussian_kde

    d = reference.dim
    if d not in (1, 2) or len(axes) != d:
        raise ValueError(f"kde_l1 works on 1D and 2D grids with one axis per dimension (reference dim {d}, {len(axes)} "
                         "axes)")
    x = _particles(particles, d)
    axes = [np.asarray(a, dtype=float) for a in axes]
    pts = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, d)
    if isinstance(bandwidth, str):
        if bandwidth not in ("scott", "silverman"):
            raise ValueError(f"bandwidth must be a positive number, 'scott' or 'silverman', got {bandwidth!r}")
    elif bandwidth is not None:
        bandwidth = check_number(bandwidth, "bandwidth", positive=True)
    kde = gaussian_kde(x.T, bw_method=bandwidth)
    cell = float(np.prod([a[1] - a[0] for a in axes]))
    return float(np.abs(kde(pts.T) - reference.pdf(pts)).sum() * cell)


def fit_loglog_slope(x, y) -> tuple[float, float]:
    """Least-squares slope and intercept of ``log y`` against ``log x``.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.fit_loglog_slope([1, 2, 4], [3, 1.5, 0.75])[0].__round__(12)
    -1.0
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError("x and y must be 1D arrays of the same length >= 2")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("log-log fit needs positive values")
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope), float(intercept)


@dataclass(frozen=True, repr=False)
class ConvergenceStudy(Summarized):
    """Errors over a parameter sweep and seeds, with the fitted log-log order.

    Its ``repr`` states the fitted slope with its interval, the sweep and the range of the errors.

    Attributes
    ----------
    values : numpy.ndarray (k,)
        Parameter values (eps, n, dt, ...).
    errors : numpy.ndarray (k, n_seeds)
    slope : float
        Slope of the fit of the seed-mean error (geometric mean) against ``values``.
    intercept : float
    seed_slopes : numpy.ndarray (n_seeds,)
        The slope fitted seed by seed.
    slope_ci : tuple of float
        Approximate 95% interval: mean seed slope +- 1.96 standard errors over seeds
        (degenerate with one seed).
    """

    values: np.ndarray
    errors: np.ndarray
    slope: float
    intercept: float
    seed_slopes: np.ndarray
    slope_ci: tuple

    @property
    def mean_errors(self) -> np.ndarray:
        return np.exp(np.log(self.errors).mean(1))

    def _facts(self):
        lo, hi = self.slope_ci
        values, errors = np.asarray(self.values), np.asarray(self.errors)
        head = (f"slope {number(self.slope)} (95% interval {number(lo)} to {number(hi)}) over "
                f"{values.size} values x {errors.shape[-1]} seeds")
        return head, [[("values", span(values)), ("seed-mean errors", span(self.mean_errors))]]


def convergence_study(values, error: Callable[[float, int], float], seeds=(0, 1, 2)) -> ConvergenceStudy:
    """Evaluate ``error(value, seed)`` on a sweep and fit the observed order.

    Examples
    --------
    >>> import sinkflow
    >>> st = sinkflow.convergence_study([0.1, 0.2, 0.4], lambda e, s: 3 * e * (1 + 0.01 * s))
    >>> round(st.slope, 6), st.errors.shape
    (1.0, (3, 3))
    """
    values = np.asarray(values, dtype=float)
    seeds = list(seeds)
    if values.ndim != 1 or values.size < 2 or not seeds:
        raise ValueError("need at least two parameter values and one seed")
    errs = np.array([[float(error(v, s)) for s in seeds] for v in values])
    if np.any(~np.isfinite(errs)) or np.any(errs <= 0):
        raise ValueError("errors must be positive and finite for a log-log fit")
    mean = np.exp(np.log(errs).mean(1))
    slope, intercept = fit_loglog_slope(values, mean)
    seed_slopes = np.array([fit_loglog_slope(values, errs[:, k])[0] for k in range(len(seeds))])
    half = 1.96 * seed_slopes.std(ddof=1) / math.sqrt(len(seeds)) if len(seeds) > 1 else 0.0
    ci = (float(seed_slopes.mean() - half), float(seed_slopes.mean() + half))
    return ConvergenceStudy(values, errs, slope, intercept, seed_slopes, ci)


def _as_array(x) -> np.ndarray:
    """numpy or torch (any device) as a float64 numpy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=float)


def equispaced_centres(grid, name: str = "grid", *, min_size: int = 2, spacing: float | None = None,
                       hint: str = "") -> np.ndarray:
    """Equispaced, increasing cell centres as a float64 array (numpy or torch in), or a ValueError naming ``name``.

    ``spacing``: the spacing they must have (the circle's ``2 pi / G``); default their mean.
    ``hint`` ends the error message (what a valid grid looks like).

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.heat._distances import equispaced_centres
    >>> equispaced_centres([0.5, 1.5, 2.5]).tolist()
    [0.5, 1.5, 2.5]
    >>> equispaced_centres([0.0, 1.0, 3.0])
    Traceback (most recent call last):
    ...
    ValueError: grid must hold equispaced, increasing cell centres (finite-volume cells of one width)
    """
    y = _as_array(grid)
    if y.ndim != 1 or y.size < min_size:
        raise ValueError(f"{name} must be a 1D array of at least {min_size} cell centres, got shape {y.shape}")
    d = np.diff(y)
    h = float(d.mean()) if spacing is None else float(spacing)
    if not (np.all(np.isfinite(y)) and d.min() > 0 and np.all(np.abs(d - h) <= 1e-6 * h)):
        raise ValueError(f"{name} must hold equispaced, increasing cell "
                         f"centres{hint or ' (finite-volume cells of one width)'}")
    return y


def _grid_cdf(density, grid) -> tuple[np.ndarray, np.ndarray]:
    """The normalized CDF of a cell density at the cell edges, and those edges (the quantile function's nodes)."""
    rho = _as_array(density)
    y = equispaced_centres(grid)
    h = y[1] - y[0]
    cdf = np.concatenate([[0.0], np.cumsum(rho * h)])
    return cdf / cdf[-1], np.concatenate([[y[0] - h / 2], y + h / 2])


def grid_quantiles(density, grid, u) -> np.ndarray:
    """Quantiles of a 1D cell density (constant on each cell), at levels ``u`` in [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.heat import grid_quantiles
    >>> y = np.linspace(0.05, 0.95, 10)            # ten cells of [0, 1]
    >>> grid_quantiles(np.ones(10), y, [0.0, 0.25, 1.0]).round(12).tolist()
    [0.0, 0.25, 1.0]
    """
    cdf, edges = _grid_cdf(density, grid)
    return np.interp(np.asarray(u, dtype=float), cdf, edges)


def wasserstein2_to_grid(particles, density, grid) -> float:
    r""":math:`W_2` between 1D particles (uniform weights) and a cell density on ``grid``, exactly.

    :math:`W_2^2 = \int_0^1 |x_{(\lceil nu \rceil)} - Q(u)|^2 du` with the particles sorted and
    :math:`Q` the quantile function of the density (piecewise linear: the density is constant
    on each cell); the integral is summed exactly between the breakpoints of both.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.heat import wasserstein2_to_grid
    >>> y = np.linspace(0.005, 0.995, 100)
    >>> round(wasserstein2_to_grid([0.5], np.ones(100), y) ** 2, 12)   # variance of U(0, 1)
    0.083333333333
    """
    x = np.sort(_as_array(particles).ravel())
    n = x.size
    cdf, edges = _grid_cdf(density, grid)
    u = np.unique(np.concatenate([cdf, np.arange(n + 1) / n]))  # the breakpoints of both quantile functions
    q = np.interp(u, cdf, edges)
    xi = x[np.minimum((n * (u[1:] + u[:-1]) / 2).astype(int), n - 1)]
    a, b = xi - q[:-1], xi - q[1:]
    return float(np.sqrt((np.diff(u) * (a * a + a * b + b * b) / 3).sum()))
