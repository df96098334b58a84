r"""Reference solutions for the heat-diffusion limit (docs/theory/heat_limit.md).

Three exact references, all numpy and float64:

* :class:`GaussianMixture`: the heat equation :math:`\partial_t\rho = \Delta\rho` maps a
  mixture of Gaussians to the same mixture with every covariance increased by
  :math:`2tI` (:meth:`GaussianMixture.evolve`), because
  :math:`\rho_t = \rho_0 * G_{2t}` with :math:`G_s = \mathcal N(0, sI)`.
* :func:`solve_heat_grid`: the same convolution for an arbitrary initial density sampled
  on a uniform 1D or 2D grid, done exactly in Fourier space on a zero-padded periodic grid.
* :class:`Barenblatt`: the self-similar solution of the porous-medium equation
  :math:`\partial_t\rho = \nabla\cdot(\rho\nabla\rho)` (exponent :math:`m = 2`), the
  reference for the unnormalized kernel.

Every reference shares a small protocol used by :mod:`sinkflow.heat`:
``dim``, ``pdf(x)``, ``sample(n, seed)``, ``mean()``, ``covariance()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sinkflow._checks import check_number, check_seed
from sinkflow._summary import Summarized, number, shape_text

__all__ = ["GaussianMixture", "Barenblatt", "GridHeatSolution", "solve_heat_grid"]


def _check_time(t, name="t") -> float:
    t = float(check_number(t, name, allow_inf=True))
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"{name} must be a finite time >= 0 (the heat semigroup runs forward only), got {t}")
    return t


def _as_points(x, d: int) -> tuple[np.ndarray, bool]:
    """Points as an (n, d) float64 array; 1D input (n,) is allowed when d == 1."""
    x = np.asarray(x, dtype=float)
    flat = False
    if d == 1 and x.ndim == 1:
        x, flat = x[:, None], True
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"points must have shape (n, {d})" + (" or (n,)" if d == 1 else "") + f", got {x.shape}")
    return x, flat


@dataclass(frozen=True)
class GaussianMixture:
    r"""A mixture :math:`\rho = \sum_k w_k\,\mathcal N(m_k, \Sigma_k)` in :math:`\mathbb R^d`.

    Parameters
    ----------
    weights : array (k,)
        Non-negative, summing to 1.
    means : array (k, d)
    covs : array (k, d, d)
        Symmetric positive definite.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.heat import GaussianMixture
    >>> g = GaussianMixture.gaussian([0.0], [[1.0]])
    >>> float(g.evolve(0.5).covs[0, 0, 0])
    2.0
    >>> float(g.pdf(np.zeros((1, 1)))[0]).__round__(6)
    0.398942
    """

    weights: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    _chol: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        w = np.atleast_1d(np.asarray(self.weights, dtype=float))
        m = np.asarray(self.means, dtype=float)
        if m.ndim == 1:
            m = m[:, None] if w.size > 1 else m[None, :]
        c = np.asarray(self.covs, dtype=float)
        k, d = m.shape
        if c.ndim == 1 and d == 1:
            c = c[:, None, None]
        if w.shape != (k,) or c.shape != (k, d, d):
            raise ValueError(f"weights (k,), means (k, d), covs (k, d, d) must agree; got {w.shape}, {m.shape}, "
                             f"{c.shape}")
        if not (np.all(np.isfinite(w)) and np.all(np.isfinite(m)) and np.all(np.isfinite(c))):
            raise ValueError("mixture parameters must be finite")
        if np.any(w < 0) or not np.isclose(w.sum(), 1.0, rtol=0, atol=1e-10):
            raise ValueError(f"weights must be non-negative and sum to 1, got {w}")
        if not np.allclose(c, np.swapaxes(c, 1, 2), atol=1e-12):
            raise ValueError("covariances must be symmetric")
        try:
            chol = np.linalg.cholesky(c)
        except np.linalg.LinAlgError as err:
            raise ValueError("covariances must be positive definite") from err
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "means", m)
        object.__setattr__(self, "covs", c)
        object.__setattr__(self, "_chol", chol)

    @classmethod
    def gaussian(cls, mean, cov) -> GaussianMixture:
        """A single Gaussian :math:`\\mathcal N(m, \\Sigma)` as a one-component mixture."""
        mean = np.atleast_1d(np.asarray(mean, dtype=float))
        cov = np.atleast_2d(np.asarray(cov, dtype=float))
        return cls(np.ones(1), mean[None, :], cov[None])

    @classmethod
    def isotropic(cls, weights, means, variances) -> GaussianMixture:
        """Mixture with covariances ``variances[k] * I``."""
        means = np.asarray(means, dtype=float)
        if means.ndim == 1:
            means = means[:, None]
        k, d = means.shape
        v = np.broadcast_to(np.asarray(variances, dtype=float), (k,))
        return cls(np.asarray(weights, dtype=float), means, v[:, None, None] * np.eye(d))

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    def evolve(self, t: float) -> GaussianMixture:
        r"""The exact heat solution at time ``t``: every covariance plus :math:`2tI`."""
        t = _check_time(t)
        return GaussianMixture(self.weights, self.means, self.covs + 2.0 * t * np.eye(self.dim))

    def mean(self) -> np.ndarray:
        return self.weights @ self.means

    def covariance(self) -> np.ndarray:
        """Total covariance :math:`\\sum_k w_k(\\Sigma_k + m_k m_k^T) - m m^T`."""
        m = self.mean()
        second = np.einsum("k,kij->ij", self.weights, self.covs + np.einsum("ki,kj->kij", self.means, self.means))
        return second - np.outer(m, m)

    def _component_logpdf(self, x):
        d = self.dim
        diff = x[:, None, :] - self.means[None]  # (n, k, d)
        # Solve L z = diff per component (L lower Cholesky factor).
        z = np.stack([np.linalg.solve(self._chol[k], diff[:, k, :].T).T for k in range(len(self.weights))], axis=1)
        logdet = 2 * np.log(np.diagonal(self._chol, axis1=1, axis2=2)).sum(-1)
        return -0.5 * (z ** 2).sum(-1) - 0.5 * logdet[None] - 0.5 * d * math.log(2 * math.pi)

    def log_pdf(self, x) -> np.ndarray:
        """Log density at points ``x`` of shape (n, d) (or (n,) in 1D)."""
        x, _ = _as_points(x, self.dim)
        with np.errstate(divide="ignore"):
            lw = np.log(self.weights)
        a = self._component_logpdf(x) + lw[None]
        mx = a.max(1, keepdims=True)
        return (mx + np.log(np.exp(a - mx).sum(1, keepdims=True)))[:, 0]

    def pdf(self, x) -> np.ndarray:
        """Density at points ``x`` of shape (n, d) (or (n,) in 1D)."""
        return np.exp(self.log_pdf(x))

    def score(self, x) -> np.ndarray:
        r""":math:`\nabla\log\rho(x)`, shape like ``x``: posterior-weighted :math:`-\Sigma_k^{-1}(x - m_k)`."""
        x, flat = _as_points(x, self.dim)
        with np.errstate(divide="ignore"):
            a = self._component_logpdf(x) + np.log(self.weights)[None]
        post = np.exp(a - a.max(1, keepdims=True))
        post /= post.sum(1, keepdims=True)
        prec = np.linalg.inv(self.covs)
        comp = -np.einsum("kij,nkj->nki", prec, x[:, None, :] - self.means[None])
        s = np.einsum("nk,nki->ni", post, comp)
        return s[:, 0] if flat else s

    def sample(self, n: int, seed=None) -> np.ndarray:
        """``n`` i.i.d. samples, shape (n, d); ``seed`` an int or a numpy Generator."""
        n = check_number(n, "n", integer=True, positive=True)
        rng = np.random.default_rng(check_seed(seed))
        comp = rng.choice(len(self.weights), size=n, p=self.weights)
        z = rng.standard_normal((n, self.dim))
        return self.means[comp] + np.einsum("nij,nj->ni", self._chol[comp], z)


@dataclass(frozen=True)
class Barenblatt:
    r"""Barenblatt solution of :math:`\partial_t\rho = \nabla\cdot(\rho\nabla\rho)` in :math:`\mathbb R^d`.

    .. math:: \rho(x, t) = t^{-\alpha}\Big(A - \frac{|x - c|^2}{2(d+2)}\,t^{-2\alpha/d}\Big)_+,
       \qquad \alpha = \frac{d}{d+2},

    with :math:`A` fixed by the mass (constants derived and checked in
    :func:`sinkflow.heat.symbolic.barenblatt_solves_porous_medium`). ``time`` is the
    self-similar time (> 0); :meth:`evolve` advances it.

    Examples
    --------
    >>> from sinkflow.heat import Barenblatt
    >>> b = Barenblatt(dim=1, time=1.0)
    >>> round(b.radius, 6), round(b.evolve(7.0).radius / b.radius, 6)  # radius ~ t^(1/(d+2))
    (1.650964, 2.0)
    """

    dim: int = 1
    time: float = 1.0
    mass: float = 1.0
    center: tuple = ()

    def __post_init__(self):
        check_number(self.dim, "dim", integer=True, positive=True)
        check_number(self.time, "the self-similar time", positive=True)
        check_number(self.mass, "mass", positive=True)
        c = np.zeros(self.dim) if len(self.center) == 0 else np.asarray(self.center, dtype=float)
        if c.shape != (self.dim,):
            raise ValueError(f"center must have {self.dim} coordinates, got {c.shape}")
        object.__setattr__(self, "center", tuple(float(v) for v in c))

    @property
    def alpha(self) -> float:
        return self.dim / (self.dim + 2)

    @property
    def k(self) -> float:
        """Coefficient of :math:`|x|^2` in the profile: :math:`1/(2(d+2))`."""
        return 1.0 / (2 * (self.dim + 2))

    @property
    def A(self) -> float:
        r"""Height constant: mass :math:`= \frac{2}{d+2} V_d R_1^d A` with :math:`R_1^2 = A/k`."""
        d = self.dim
        log_vd = 0.5 * d * math.log(math.pi) - math.lgamma(d / 2 + 1)
        # M = 2/(d+2) V_d (A/k)^(d/2) A  =>  A^(1 + d/2) = M (d+2) / (2 V_d) k^(d/2)
        log_a = (math.log(self.mass * (d + 2) / 2) - log_vd + 0.5 * d * math.log(self.k)) / (1 + d / 2)
        return math.exp(log_a)

    @property
    def radius(self) -> float:
        """Support radius :math:`\\sqrt{A/k}\\, t^{\\alpha/d}`."""
        return math.sqrt(self.A / self.k) * self.time ** (self.alpha / self.dim)

    @property
    def height(self) -> float:
        return self.A * self.time ** (-self.alpha)

    def evolve(self, t: float) -> Barenblatt:
        """The solution ``t`` time units later."""
        t = _check_time(t)
        return Barenblatt(self.dim, self.time + t, self.mass, self.center)

    def pdf(self, x) -> np.ndarray:
        x, _ = _as_points(x, self.dim)
        r2 = ((x - np.asarray(self.center)) ** 2).sum(-1)
        return self.height * np.clip(1.0 - r2 / self.radius ** 2, 0.0, None)

    def mean(self) -> np.ndarray:
        return np.asarray(self.center)

    def covariance(self) -> np.ndarray:
        """``R^2/(d+4) I`` per unit mass (``|x|^2/R^2`` is Beta(d/2, 2) distributed)."""
        return self.radius ** 2 / (self.dim + 4) * np.eye(self.dim)

    def sample(self, n: int, seed=None) -> np.ndarray:
        """``n`` samples of the normalized profile, shape (n, d)."""
        n = check_number(n, "n", integer=True, positive=True)
        rng = np.random.default_rng(check_seed(seed))
        s = rng.beta(self.dim / 2, 2.0, size=n)
        u = rng.standard_normal((n, self.dim))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        return np.asarray(self.center) + self.radius * np.sqrt(s)[:, None] * u


@dataclass(frozen=True, repr=False)
class GridHeatSolution(Summarized):
    """Heat solution on a uniform grid, with its error control.

    Its ``repr`` states the grid, the times and the error controls (:attr:`error_bound` and its
    three terms), never the density.

    Attributes
    ----------
    axes : tuple of arrays
        Grid coordinates per dimension (the input grid; padding is cropped away).
    times : numpy.ndarray
        The requested times.
    density : numpy.ndarray, shape ``(len(times), *grid_shape)``
        :math:`\\rho_0 * G_{2t}` on the grid.
    periodization_error : float
        Upper bound on the mass that wraps around the padded periodic box (Gaussian tail
        of the kernel at the largest time beyond the padding).
    boundary_mass : float
        Mass of the initial density in the outermost grid cells (it should be negligible:
        the initial density is taken to vanish outside the grid).
    spectral_tail : float
        Relative size of the initial density's Fourier coefficients in the top tenth of
        the frequencies: a small value means the grid resolves the initial density, and
        the FFT multiplication is then exact to this order.
    sampling_error : float
        Estimated error from sampling the initial data on the grid (what a jump or a kink
        costs, which the three controls above miss), in the max norm relative to
        :math:`\\max|\\rho_0|`, largest over the times: for rough data (``spectral_tail``
        above 1e-6), twice the difference between this solve and the same solve from every
        other grid point; 0 for resolved data. Where the data is rough and the kernel
        narrower than twice the spacing, the trivial bound, with a warning.
    """

    axes: tuple
    times: np.ndarray
    density: np.ndarray
    periodization_error: float
    boundary_mass: float
    spectral_tail: float
    sampling_error: float = 0.0

    @property
    def error_bound(self) -> float:
        """A pessimistic total error indicator: the sum of the four controls.

        For data of height about 1 it bounds the max-norm error at the grid points (measured:
        box data, 1 on :math:`|x| \\le 1`, at :math:`t = 0.01` on 41 / 161 / 641 points of
        :math:`[-4, 4]`: 7.6 / 2.3 / 2.3 times the error, the coarsest through the trivial
        bound; smooth Gaussian data: about 1e-12, set by ``tol``, against errors of 1e-15).
        """
        return self.periodization_error + self.boundary_mass + self.spectral_tail + self.sampling_error

    def mesh(self) -> np.ndarray:
        """Grid points as an array of shape ``(*grid_shape, d)``."""
        return np.stack(np.meshgrid(*self.axes, indexing="ij"), axis=-1)

    def _facts(self):
        times = np.asarray(self.times, dtype=float)
        head = (f"density {shape_text(np.shape(self.density))} on a {len(self.axes)}-D grid, "
                f"t = {number(times.min())} to {number(times.max())} ({times.size} times)")
        return head, [[("error bound", number(self.error_bound)),
                       ("", f"periodization {number(self.periodization_error)} + boundary mass "
                            f"{number(self.boundary_mass)} + spectral tail {number(self.spectral_tail)}")]]


def _real_array(x, name: str) -> np.ndarray:
    """``x`` as a float64 array; TypeError naming ``name`` unless its entries are real numbers."""
    arr = np.asarray(x) if x is not None else np.asarray(None)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be real numbers, got {x!r:.60} (dtype {arr.dtype})")
    return arr.astype(float)


def _uniform_axis(ax, i) -> tuple[np.ndarray, float]:
    ax = _real_array(ax, f"grid axis {i}")
    if ax.ndim != 1 or ax.size < 8:
        raise ValueError(f"grid axis {i} must be a 1D array with at least 8 points, got shape {ax.shape}")
    if not np.isfinite(ax).all():
        raise ValueError(f"grid axis {i} must be finite")
    h = np.diff(ax)
    if not (np.all(h > 0) and np.allclose(h, h[0], rtol=1e-9, atol=0)):
        raise ValueError(f"grid axis {i} must be uniform and increasing")
    if not 1e-150 <= h[0] <= 1e150:  # the squared frequencies (pi / h)^2 and the squared lengths stay in float64
        raise ValueError(f"grid axis {i} has spacing {h[0]:g}, outside [1e-150, 1e150]: the solve squares the "
                         "frequencies pi / spacing and the grid's lengths, which would leave float64; rescale x and t")
    return ax, float(h[0])


def solve_heat_grid(initial: np.ndarray | Callable, axes: Sequence[np.ndarray], times, *,
                    tol: float = 1e-12) -> GridHeatSolution:
    r"""Solve :math:`\partial_t\rho = \Delta\rho` on :math:`\mathbb R^d` (d = 1, 2) for grid data.

    The solution is the convolution :math:`\rho_t = \rho_0 * G_{2t}`, computed exactly in
    Fourier space: the grid is zero-padded so that the kernel's tail beyond the padding
    has mass below ``tol`` (then the periodic convolution equals the free-space one up to
    ``tol``), and each Fourier mode is multiplied by :math:`e^{-|\xi|^2 t}`.

    Error control: the result reports (i) the periodization bound, (ii) the initial mass
    on the boundary cells (data that does not vanish at the edge of the grid is truncated),
    (iii) the spectral tail of the initial data (resolution), (iv) for rough data (a jump,
    a kink) the sampling error, estimated against the same solve from every other grid
    point (:attr:`GridHeatSolution.sampling_error`). For data resolved by the grid the
    method is spectrally accurate: the only error is the trigonometric interpolation of
    :math:`\rho_0`, which the heat multiplier damps further.

    The padding grows like :math:`\sqrt{t}`: a padded grid beyond :math:`2^{27}` points is
    refused before anything is allocated (``ValueError`` naming ``times`` and the grid).

    Parameters
    ----------
    initial : array of the grid's shape, or callable
        Initial density values on the grid, or a function of points of shape (N, d); real
        (complex values are refused: solve the real and imaginary parts separately).
    axes : sequence of 1 or 2 uniform increasing 1D arrays
        Grid coordinates.
    times : float or array of floats >= 0
    tol : float
        Periodization tolerance, sets the padding.

    Returns
    -------
    GridHeatSolution

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.heat import GaussianMixture, solve_heat_grid
    >>> g = GaussianMixture.gaussian([0.0], [[0.5]])
    >>> x = np.linspace(-8, 8, 401)
    >>> sol = solve_heat_grid(g.pdf, [x], [1.0])
    >>> bool(np.abs(sol.density[0] - g.evolve(1.0).pdf(x)).max() < 1e-10)
    True
    """
    axes = list(axes) if isinstance(axes, (list, tuple)) else [axes]
    d = len(axes)
    if d not in (1, 2):
        raise ValueError(f"the grid solver supports dimensions 1 and 2, got {d} axes; use GaussianMixture for closed "
                         "forms in any dimension")
    parsed = [_uniform_axis(ax, i) for i, ax in enumerate(axes)]
    axes = tuple(p[0] for p in parsed)
    steps = [p[1] for p in parsed]
    times = np.atleast_1d(_real_array(times, "times"))
    if times.ndim != 1 or times.size == 0:
        raise ValueError("times must be a float or a 1D array of floats")
    for t in times:
        _check_time(t, "each time")
    if not (0 < check_number(tol, "tol", positive=True) < 1):
        raise ValueError(f"tol must be in (0, 1), got {tol}")
    shape = tuple(ax.size for ax in axes)
    if callable(initial):
        pts = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, d)
        rho0 = np.asarray(initial(pts))
        what = "initial (its values on the grid)"
    else:
        rho0 = np.asarray(initial)
        what = "initial"
    if np.iscomplexobj(rho0) or rho0.dtype.kind not in "biuf":
        raise TypeError(f"{what} must be real, got dtype {rho0.dtype}: the heat solution of a complex density is "
                        "two real solves (real and imaginary parts) if you mean it")
    rho0 = rho0.astype(float).reshape(shape) if callable(initial) else rho0.astype(float)
    if rho0.shape != shape:
        raise ValueError(f"initial values must have the grid's shape {shape}, got {rho0.shape}")
    if not np.all(np.isfinite(rho0)):
        raise ValueError("initial density has non-finite values")
    cell = float(np.prod(steps))
    total = float(np.abs(rho0).sum() * cell) or 1.0
    edge = np.zeros(shape, dtype=bool)
    for i in range(d):
        idx = [slice(None)] * d
        idx[i] = [0, -1]
        edge[tuple(idx)] = True
    boundary_mass = float(np.abs(rho0[edge]).sum() * cell / total)
    # Padding: the kernel G_{2t} has per-axis standard deviation sqrt(2t); beyond z of them
    # its tail mass is erfc(z/sqrt 2) <= tol.
    from scipy.special import erfcinv

    z = float(math.sqrt(2) * erfcinv(tol / max(d, 1)))
    _check_padded_size(shape, steps, z, float(times.max()))
    periodization_error = float(d * math.erfc(z / math.sqrt(2)))
    out, spectral_tail = _fft_heat(rho0, steps, times, z)
    sampling_error = _sampling_error(rho0, steps, times, z, out, spectral_tail)
    return GridHeatSolution(axes=axes, times=times, density=out, periodization_error=periodization_error,
                            boundary_mass=boundary_mass, spectral_tail=spectral_tail, sampling_error=sampling_error)


#: Largest zero-padded grid :func:`solve_heat_grid` allocates (points): 2^27 float64 values are 1 GiB, and a
#: solve holds about six arrays of that size (the padded data, its spectrum, the multiplier, one time's result).
_MAX_PADDED_POINTS = 2 ** 27


def _pads(steps, z, tmax):
    return [int(math.ceil(z * math.sqrt(2 * tmax) / h)) + 1 for h in steps]


def _check_padded_size(shape, steps, z, tmax):
    """Refuse, before allocating, a padded grid beyond :data:`_MAX_PADDED_POINTS` (naming ``times`` and the grid)."""
    padded = [s + 2 * (math.ceil(z * math.sqrt(2.0) * math.sqrt(tmax) / h) + 1) if z * math.sqrt(tmax) / h < 1e150
              else math.inf for s, h in zip(shape, steps, strict=True)]  # floats past 1e150: no int of an infinity
    points = math.prod(padded)
    if points > _MAX_PADDED_POINTS:
        grid = " x ".join(f"{p:.3g}" for p in padded)
        raise ValueError(
            f"times: the largest time {tmax:g} needs the grid {shape} (spacing {', '.join(f'{h:g}' for h in steps)}) "
            f"zero-padded to {grid} points (about {points * 48 / 2**30:.3g} GiB), so that the heat kernel's tail "
            f"(width sqrt(2t) = {math.sqrt(2.0) * math.sqrt(tmax):.3g}) does not wrap around; refusing beyond "
            f"{_MAX_PADDED_POINTS:.3g} points. Take a shorter time, a coarser grid, or a closed form "
            "(GaussianMixture.evolve)")


def _fft_heat(rho0, steps, times, z):
    """``rho0 * G_{2t}`` on the grid for each time (zero-padded FFT), and the spectral tail of ``rho0``."""
    d = rho0.ndim
    pads = _pads(steps, z, float(times.max()))
    padded = np.pad(rho0, [(p, p) for p in pads])
    F = np.fft.rfftn(padded) if d > 1 else np.fft.rfft(padded)
    freqs = []
    for i, h in enumerate(steps):
        npad = padded.shape[i]
        freqs.append(2 * math.pi * (np.fft.rfftfreq(npad, h) if i == d - 1 else np.fft.fftfreq(npad, h)))
    xi2 = sum(np.meshgrid(*[f ** 2 for f in freqs], indexing="ij")) if d > 1 else freqs[0] ** 2
    absF = np.abs(F)
    top = np.sqrt(xi2) >= 0.9 * math.sqrt(xi2.max())
    spectral_tail = float(absF[top].max() / (absF.max() or 1.0))
    out = np.empty((times.size,) + rho0.shape)
    crop = tuple(slice(p, p + s) for p, s in zip(pads, rho0.shape, strict=True))
    for k, t in enumerate(times):
        G = F * np.exp(-xi2 * t)
        sol = np.fft.irfftn(G, s=padded.shape, axes=tuple(range(d))) if d > 1 else np.fft.irfft(G, n=padded.shape[0])
        out[k] = sol[crop]
    return out, spectral_tail


#: Spectral tail above which the data counts as rough (not resolved by the grid: a jump, a kink, a spike).
_ROUGH_TAIL = 1e-6


def _sampling_error(rho0, steps, times, z, out, spectral_tail):
    r"""Sampling error of rough grid data (a jump, a kink), relative to ``max |rho0|``, largest over ``times``.

    0 for data the grid resolves (``spectral_tail`` <= :data:`_ROUGH_TAIL`): they converge spectrally, and
    the spectral tail is their control.

    The same solve from every other grid point (each of the :math:`2^d` sub-lattices of twice the spacing)
    is compared with the solution at those points: with an error that at least halves with the spacing
    (first order, the rate of a jump; resolved data converge spectrally), the difference bounds the
    error of the fine solve, taken twice for the pre-asymptotic grids. Where the data is rough
    (``spectral_tail`` > :data:`_ROUGH_TAIL`) and the heat kernel, of width :math:`\sqrt{2t}`, is narrower
    than the sub-lattice spacing, the comparison says nothing: a warning, and the trivial bound
    :math:`(\max|\rho_t| + \max|\rho_0|) / \max|\rho_0|` (the exact solution obeys the maximum principle).
    """
    import itertools
    import warnings

    scale = float(np.abs(rho0).max())
    if scale == 0 or spectral_tail <= _ROUGH_TAIL:
        return 0.0  # resolved data converge spectrally: the spectral tail is their control
    worst, unresolved = 0.0, []
    for k, t in enumerate(times):
        if t == 0:
            continue  # the density is the data itself at the grid points
        if spectral_tail > _ROUGH_TAIL and 2 * max(steps) > math.sqrt(2 * t):
            unresolved.append(float(t))
            worst = max(worst, (float(np.abs(out[k]).max()) + scale) / scale)
    coarse = [2 * h for h in steps]
    for offset in itertools.product((0, 1), repeat=rho0.ndim):
        sub = tuple(slice(o, None, 2) for o in offset)
        coarse_out, _ = _fft_heat(rho0[sub], coarse, times, z)
        diff = np.abs(coarse_out - out[(slice(None),) + sub]).reshape(times.size, -1).max(axis=1)
        worst = max(worst, 2 * float(diff.max()) / scale)
    if unresolved:
        warnings.warn(f"solve_heat_grid: the initial data is rough on this grid (spectral tail {spectral_tail:.2g}) "
                      f"and the heat kernel at t = {min(unresolved):g} (width sqrt(2t) = "
                      f"{math.sqrt(2 * min(unresolved)):.3g}) is narrower than twice the grid spacing "
                      f"{max(steps):.3g}: the sampling error cannot be estimated there, and error_bound falls back to "
                      "the trivial bound (max|rho_t| + max|rho_0|) / max|rho_0|; refine the grid", UserWarning,
                      stacklevel=3)
    return worst
