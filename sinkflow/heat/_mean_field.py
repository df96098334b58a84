r"""The mean-field equation of an attention layer, solved on a grid (docs/theory/mean_field.md).

Particles of :func:`sinkflow.heat_flow` (or of :func:`sinkflow.simulate` on the circle) move
with a velocity that depends on the empirical measure only. Evaluated on a density instead,
it gives the mean-field (Vlasov) equation of the same layer,

.. math:: \partial_t\rho + \nabla\cdot(\rho\, v_\varepsilon[\rho]) = 0,

which sits between the particles (:math:`n\to\infty`, error :math:`O(n^{-1/2})`) and the
heat limit (:math:`\varepsilon\to 0`, error :math:`O(\varepsilon)`).

* ``manifold="euclidean"``: :math:`v_\varepsilon[\rho](x) = -\frac2\varepsilon\int K(x, y)(y - x)\rho(y)\,dy`
  with the kernels of :mod:`sinkflow.heat` (``"sinkhorn"``, ``"softmax_gaussian"``,
  ``"softmax_dot"``, ``"unnormalized"``), in 1D or 2D; the Gaussian kernel is applied one
  axis at a time (never a dense ``G^2 x G^2`` matrix).
* ``manifold="circle"``: :math:`v[\rho](\theta) = \int K(\theta, \varphi)\sin(\varphi - \theta)\rho(\varphi)\,d\varphi`
  with :math:`K \propto e^{\beta\cos(\theta - \varphi)}` normalized as in :func:`sinkflow.simulate`
  on the sphere with :math:`d = 2`, :math:`Q = K = V = I` (:mod:`sinkflow.heat`).

Schemes: finite volumes on cell centres; the velocity is evaluated exactly at the cell faces (the
kernel sums of the barycentric map, the Sinkhorn potential extended to any point by its row
normalization). On a line the default is semi-Lagrangian
(:mod:`sinkflow.heat._remap`): each cell receives the mass between the departure points of its
faces, traced back by the trapezoidal rule; mass is conserved to rounding and the density stays
non-negative for any step (no CFL condition), and the step is set by an error control. The
explicit scheme (``scheme="explicit"``, the default in 2D and on the circle) has upwind fluxes
with minmod-limited (MUSCL) reconstruction and Heun's method (SSP-RK2), with the CFL condition
:math:`h\sum_k \max|v_k|/\Delta x_k \le 1/2` enforced by sub-stepping. Boundary faces carry no flux
(periodic on the circle). Sinkhorn runs on the cell masses with the symmetric (geometric-mean)
iteration :math:`s \leftarrow \sqrt{s / K(s w)}`, which contracts by at least 1/2 per iteration
because the kernel is positive definite.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sinkflow._backend import check_finite, check_float, from_torch, to_torch
from sinkflow._checks import check_choice, check_number
from sinkflow._summary import Summarized, describe_array, number, shape_text
from sinkflow.heat._circle_field import circle_field
from sinkflow.heat._distances import equispaced_centres
from sinkflow.heat._grid_fields import EuclideanVelocity, default_tol
from sinkflow.heat._heat_velocity import NORMALIZATIONS as EUCLIDEAN_NORMALIZATIONS
from sinkflow.heat._heat_velocity import _check_eps
from sinkflow.heat._references import _check_time
from sinkflow.heat._remap import LOCAL_TOL, departure_points, full_face_velocity, remap, remap_step_limit

__all__ = ["mean_field_flow", "MeanFieldResult", "EUCLIDEAN_NORMALIZATIONS", "MANIFOLDS",
           "flux_divergence", "CFL"]

MANIFOLDS = ("euclidean", "circle")
#: Time schemes of :func:`mean_field_flow` (``"auto"``: semi-Lagrangian on a line, explicit elsewhere).
SCHEMES = ("auto", "semi_lagrangian", "explicit")
#: Courant number of each Heun stage: positivity of the limited upwind scheme needs <= 1/2.
CFL = 0.45
#: Largest relative deviation of the initial mass from 1.
MASS_TOL = 1e-4
#: Mass in the outer cells of a Euclidean grid above which the solver warns (the box is too small).
BOUNDARY_TOL = 1e-4


@dataclass(frozen=True, repr=False)
class MeanFieldResult(Summarized):
    """Densities of the mean-field equation at the requested times, with the solver's diagnostics.

    Its ``repr`` states the densities' shape, the equation and scheme, the steps and the
    diagnostics (mass, positivity, boundary; Sinkhorn convergence), never the densities.

    Attributes
    ----------
    times : numpy.ndarray
    grid : numpy.ndarray or tuple of numpy.ndarray
        The cell centres (angles on the circle), as given.
    densities : array, shape ``(len(times), *grid_shape)``
        Cell values, in the input's type and dtype.
    normalization, manifold : str
    scheme : str
        ``"semi_lagrangian"`` or ``"explicit"`` (the one used, ``"auto"`` resolved).
    eps, temperature : float or None
    n_steps : int
        Steps taken (each costs two velocity evaluations: a predictor and a corrector, or
        Heun's two stages).
    dt_max, dt_min : float
        Largest and smallest step used (steps are cut to the accuracy step of the layer, to the
        requested ``dt``, to the scheme's own condition, and to land on each output time).
    mass_error : float
        Largest ``|mass(t) - mass(0)|`` over the snapshots (rounding only).
    min_density : float
        Smallest cell value over the snapshots (>= 0 up to rounding).
    boundary_mass : float
        Largest mass in the outer cells of a Euclidean grid (0 on the circle): mass that
        reaches the box's edge is held there by the zero-flux boundary.
    sinkhorn_iterations : numpy.ndarray
        Symmetric Sinkhorn iterations of each step (both stages; zeros for the other kernels).
    max_marginal_error : float
        Largest L1 marginal error of the Sinkhorn plans on the grid.
    converged : bool
    """

    times: np.ndarray
    grid: Any
    densities: Any
    normalization: str
    manifold: str
    scheme: str
    eps: float | None
    temperature: float | None
    n_steps: int
    dt_max: float
    dt_min: float
    mass_error: float
    min_density: float
    boundary_mass: float
    sinkhorn_iterations: np.ndarray
    max_marginal_error: float
    converged: bool

    def _facts(self):
        head = (f"densities {shape_text(np.shape(self.densities))}, {describe_array(self.densities)}, "
                f"{self.normalization} on {self.manifold}, {self.scheme} scheme")
        times = np.asarray(self.times, dtype=float)
        run = [("t", f"{number(times[0])} to {number(times[-1])} ({times.size} snapshots)")]
        run += [(name, number(value)) for name, value in (("eps", self.eps), ("temperature", self.temperature))
                if value is not None]
        run.append(("steps", f"{self.n_steps} (dt {number(self.dt_min)} to {number(self.dt_max)})"))
        checks = [("mass error", number(self.mass_error)), ("min density", number(self.min_density)),
                  ("boundary mass", number(self.boundary_mass))]
        sinkhorn = []
        if np.size(self.sinkhorn_iterations) and np.any(self.sinkhorn_iterations):
            sinkhorn = [("Sinkhorn", "converged" if self.converged else "NOT converged"),
                        ("max marginal error", number(self.max_marginal_error)),
                        ("iterations per step", number(np.mean(self.sinkhorn_iterations)))]
        return head, [run, checks, sinkhorn]

    @property
    def final(self):
        """The density at the last time."""
        return self.densities[-1]


# ----------------------------------------------------------------------------------------
# finite volumes


def _minmod(a, b):
    return torch.where(a * b > 0, torch.sign(a) * torch.minimum(a.abs(), b.abs()), 0.0)


def flux_divergence(rho: torch.Tensor, v: torch.Tensor, axis: int, spacing: float, periodic: bool) -> torch.Tensor:
    r""":math:`-\partial_k(\rho v_k)` by limited upwind fluxes along ``axis``.

    ``v`` holds the velocity at the faces of that axis: the ``G - 1`` interior faces (boundary
    faces carry no flux), or the ``G`` faces :math:`i + 1/2` when ``periodic``. Minmod slopes
    keep each face value between the neighbouring cell values, so a forward Euler step with
    :math:`h \max|v| / \Delta x \le 1/2` keeps the density non-negative.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.heat import flux_divergence
    >>> rho = torch.tensor([0.0, 1.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    >>> d = flux_divergence(rho, torch.ones(4, dtype=torch.float64), 0, 1.0, periodic=False)
    >>> float(d.sum())   # zero-flux boundaries: the mass is kept
    0.0
    """
    r = torch.movedim(rho, axis, 0)
    vv = torch.movedim(v, axis, 0)
    if periodic:
        right_cells = torch.roll(r, -1, 0)
        slope = _minmod(r - torch.roll(r, 1, 0), right_cells - r)
        left = r + slope / 2
        right = right_cells - torch.roll(slope, -1, 0) / 2
        F = vv.clamp_min(0) * left + vv.clamp_max(0) * right  # face i + 1/2
        div = F - torch.roll(F, 1, 0)
    else:
        delta = r[1:] - r[:-1]
        slope = torch.zeros_like(r)
        slope[1:-1] = _minmod(delta[:-1], delta[1:])
        left = r[:-1] + slope[:-1] / 2
        right = r[1:] - slope[1:] / 2
        F = vv.clamp_min(0) * left + vv.clamp_max(0) * right
        zero = torch.zeros_like(F[:1])
        div = torch.cat([F, zero]) - torch.cat([zero, F])
    return torch.movedim(div, 0, axis) * (-1.0 / spacing)


def _rate(field, rho, w, s):
    """Right-hand side, Courant rate (sum_k max|v_k| / dx_k) and Sinkhorn diagnostics."""
    v, info = field(w, s)
    rhs = sum(flux_divergence(rho, vk, k, field.spacings[k], field.periodic) for k, vk in enumerate(v))
    courant = sum(float(vk.abs().max()) / dx for vk, dx in zip(v, field.spacings, strict=True))
    if not math.isfinite(courant):
        raise FloatingPointError(f"the {field.normalization} velocity left the floating range; "
                                 "use float64 or a smaller temperature / larger eps")
    return rhs, courant, info


class _Stats:
    def __init__(self):
        self.steps, self.iters, self.h = 0, [], []
        self.proposal = math.inf  # the semi-Lagrangian controller's next step
        self.max_err, self.converged = 0.0, True

    def add(self, h, *infos):
        self.steps += 1
        self.h.append(h)
        self.iters.append(sum(i[1] for i in infos))
        self.max_err = max([self.max_err] + [float(i[2]) for i in infos])
        self.converged = self.converged and all(i[3] for i in infos)


def _heun_step(field, rho, cell, h_cap, remaining, s, stats):
    """One SSP-RK2 step no longer than ``h_cap`` and ``remaining``, cut to the CFL condition."""
    rhs, courant, info = _rate(field, rho, rho * cell, s)
    h = min(h_cap, remaining, CFL / courant if courant > 0 else math.inf)
    while True:
        stage = rho + h * rhs
        rhs2, courant2, info2 = _rate(field, stage, stage * cell, info[0])
        if h * courant2 <= 0.5 or h < 1e-12 * max(remaining, 1e-300):
            break
        h = CFL / courant2  # the stage moved faster: retake the step shorter
    new = 0.5 * rho + 0.5 * (stage + h * rhs2)
    stats.add(h, info, info2)
    return new, h, info2[0]


def _face_velocity(field, rho, cell, s):
    """All ``G + 1`` face velocities in cells per unit time (zero at a line's ends), and the Sinkhorn diagnostics."""
    v, info = field(rho * cell, s)
    vf = full_face_velocity(v[0], field.periodic) / field.spacings[0]
    if not bool(torch.isfinite(vf).all()):
        raise FloatingPointError(f"the {field.normalization} velocity left the floating range; "
                                 "use float64 or a smaller temperature / larger eps")
    return vf, info


def _remap_step(field, rho, cell, h_cap, remaining, s, stats):
    """One semi-Lagrangian predictor-corrector step, its length set by the predictor-corrector difference.

    The step is no longer than ``h_cap``, ``remaining``, the faces' order condition and the
    controller's proposal; it is retaken shorter when two faces cross or the L1 difference of
    the (first-order) predictor and the (second-order) corrector exceeds :data:`LOCAL_TOL`.
    """
    periodic = field.periodic
    vn, info = _face_velocity(field, rho, cell, s)
    h = min(h_cap, remaining, remap_step_limit(vn, rho, first=stats.steps == 0), stats.proposal)
    if h < remaining < 1.5 * h:
        h = remaining / 2  # two even steps to the output time, not a sliver after a full one
    while True:
        pred = remap(rho, departure_points(vn, None, h, periodic), periodic)
        new = None
        if pred is not None:
            vs, info2 = _face_velocity(field, pred, cell, info[0])
            new = remap(rho, departure_points(vn, vs, h, periodic), periodic)
        if new is None:
            h /= 2  # two faces crossed: retake the step shorter
            continue
        err = float((pred - new).abs().sum()) * cell
        factor = 0.9 * math.sqrt(LOCAL_TOL / err) if err > 0 else 2.0
        if err <= LOCAL_TOL or h < 1e-12 * max(remaining, 1e-300):
            break
        h *= max(factor, 0.2)
    if h < remaining:  # a step cut to land on an output time says nothing about the next one
        stats.proposal = h * min(factor, 2.0)
    stats.add(h, info, info2)
    return new, h, info2[0]


def _integrate(field, rho0, cell, times, h_cap, scheme):
    """Steps of ``scheme`` through the output times; snapshots and diagnostics."""
    step = _remap_step if scheme == "semi_lagrangian" else _heun_step
    stats = _Stats()
    rho, t, s = rho0, 0.0, None
    snaps = []
    for target in times:
        while target - t > 1e-12 * max(1.0, target):
            rho, h, s = step(field, rho, cell, h_cap, target - t, s, stats)
            t = target if target - t - h <= 1e-12 * max(1.0, target) else t + h
        snaps.append(rho.clone())
    return torch.stack(snaps), stats


# ----------------------------------------------------------------------------------------
# input checks


def _check_density(density, shape):
    numpy_out = not isinstance(density, torch.Tensor)
    rho = to_torch(density, "density")
    check_float(rho, "density")
    if rho.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"density must be float32 or float64, got {rho.dtype} (convert it explicitly)")
    if tuple(rho.shape) != tuple(shape):
        raise ValueError(f"density must hold one value per cell of the grid, shape {tuple(shape)}, got "
                         f"{tuple(rho.shape)}")
    rho = rho.detach().clone()
    check_finite(rho, "density")
    if bool((rho < 0).any()):
        raise ValueError("density must be non-negative")
    return rho, numpy_out


def _check_mass(rho: torch.Tensor, cell: float) -> None:
    mass = float(rho.to(torch.float64).sum()) * cell
    if abs(mass - 1) > MASS_TOL:
        raise ValueError(f"density must integrate to 1 on the grid (sum of cell values x cell volume), got {mass:.6g}; "
                         "divide it by that sum (mass outside the grid is not modelled)")


def _check_times(times, dt) -> tuple[np.ndarray, float]:
    times = np.atleast_1d(np.asarray(times, dtype=float))
    if times.ndim != 1 or times.size == 0:
        raise ValueError("times must be a float or a 1D array of output times")
    for t in times:
        _check_time(t, "times")
    if np.any(np.diff(times) < 0):
        raise ValueError("times must be sorted increasingly")
    dt = check_number(dt, "dt (the largest step)", positive=True, allow_none=True)
    return times, (math.inf if dt is None else float(dt))


def _euclidean_field(grid, eps, normalization, rho_like, tol, max_iter):
    if normalization not in EUCLIDEAN_NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {EUCLIDEAN_NORMALIZATIONS} on the Euclidean side "
                         f"(the names of heat_flow), got {normalization!r}")
    if eps is None:
        raise ValueError("manifold='euclidean' needs eps (the kernel bandwidth squared of heat_flow)")
    eps = _check_eps(eps)
    pair = isinstance(grid, (tuple, list)) and len(grid) == 2 and np.ndim(grid[0]) == 1
    axes = ([equispaced_centres(y, f"grid[{k}]", min_size=8) for k, y in enumerate(grid)] if pair
            else [equispaced_centres(grid, "grid", min_size=8)])
    for k, y in enumerate(axes):
        if y[1] - y[0] > math.sqrt(eps) / 2:
            raise ValueError(f"the grid does not resolve the kernel: spacing {y[1] - y[0]:.3g} on axis {k} exceeds "
                             f"sqrt(eps)/2 = {math.sqrt(eps) / 2:.3g}; use more cells or a larger eps")
    like = dict(dtype=rho_like.dtype, device=rho_like.device)
    tol = default_tol(rho_like.dtype, eps) if tol is None else tol
    field = EuclideanVelocity([torch.as_tensor(y, **like) for y in axes], eps, normalization, tol, max_iter)
    return field, tuple(y.size for y in axes), (tuple(axes) if pair else axes[0])


def _boundary_mass(densities: torch.Tensor, cell: float) -> float:
    edge = torch.zeros_like(densities, dtype=torch.bool)
    for k in range(1, densities.ndim):
        idx = [slice(None)] * densities.ndim
        for end in (0, -1):
            idx[k] = end
            edge[tuple(idx)] = True
    return float((densities * edge).flatten(1).sum(1).max()) * cell


def _field(manifold, grid, eps, temperature, normalization, like, tol, max_iter):
    """The checked velocity field of ``manifold``, the grid's shape, and the grid as returned."""
    if manifold == "circle":
        if eps is not None:
            raise ValueError("manifold='circle' takes temperature (1/beta), not eps")
        return circle_field(grid, temperature, normalization, like, tol, max_iter)
    if temperature is not None:
        raise ValueError("manifold='euclidean' takes eps (as heat_flow), not temperature")
    return _euclidean_field(grid, eps, normalization, like, tol, max_iter)


def _resolve_scheme(scheme: str, field) -> str:
    """``"auto"``: semi-Lagrangian on a line, explicit in 2D (the remap is one-dimensional) and on the circle.

    On the circle the explicit CFL step is close to the accuracy step :data:`STEP` (the velocity
    is at most 1 there, no fast tails), so the remap's two interpolations per step cost more than
    the steps they save (measured: the default figure's 256 angles to t = 30, 616 remap steps in
    2.1 s against 1,179 explicit ones in 1.2 s).
    """
    one_d = len(field.spacings) == 1
    if scheme == "auto":
        return "semi_lagrangian" if one_d and not field.periodic else "explicit"
    if scheme == "semi_lagrangian" and not one_d:
        raise ValueError("scheme='semi_lagrangian' is one-dimensional (a line or the circle); "
                         "use scheme='explicit' (or 'auto') on a 2D grid")
    return scheme


def _step_cap(field, rho: torch.Tensor, scheme: str) -> float:
    """The accuracy step: the circle's :data:`STEP` scale; on a line the step of heat_flow (largest_safe_dt).

    ``eps / 2`` for the Gaussian kernels; SoftMax-dot moves at about ``var / eps**2``, so the
    semi-Lagrangian scheme (which has no CFL condition to cut it) takes ``eps**2 / (4 var)``
    there, as :func:`sinkflow.heat.largest_safe_dt` does for particles.
    """
    if field.periodic:
        return field.step_cap
    cap = field.eps / 2
    if scheme == "semi_lagrangian" and field.normalization == "softmax_dot":
        y = field.axes[0].to(torch.float64)
        w = rho.to(torch.float64) / rho.to(torch.float64).sum()
        var = float((w * y ** 2).sum() - (w * y).sum() ** 2)
        cap = min(cap, field.eps ** 2 / (4 * max(var, 1e-300)))
    return cap


def mean_field_flow(density, grid, times, *, normalization: str, eps: float | None = None,
                    temperature: float | None = None, manifold: str = "euclidean", dt: float | None = None,
                    tol: float | None = None, max_iter: int = 2000, scheme: str = "auto") -> MeanFieldResult:
    r"""Solve the mean-field equation :math:`\partial_t\rho + \nabla\cdot(\rho\, v[\rho]) = 0` of an attention layer.

    Parameters
    ----------
    density : array or tensor (float32 / float64)
        Cell values of the initial density on ``grid`` (integrating to 1: sum x cell volume).
    grid : array (G,) or pair of arrays (G1,), (G2,)
        Equispaced cell centres: 1D, or the two axes of a 2D grid (``density`` of shape
        ``(G1, G2)``, first index along ``grid[0]``). On the circle: ``G`` equispaced angles
        covering one turn (spacing ``2 pi / G``).
    times : float or increasing array of floats >= 0
        Output times.
    normalization : str
        Euclidean: ``"sinkhorn"``, ``"softmax_gaussian"``, ``"softmax_dot"``, ``"unnormalized"``
        (the rescaled layer of :func:`sinkflow.heat_flow`, same ``eps`` and clock, so its
        particles converge to this solution). Circle: ``"softmax"``, ``"unnormalized"``,
        ``"sinkhorn"`` (:func:`sinkflow.simulate` with ``manifold="sphere"``, ``d = 2``,
        :math:`Q = K = V = I`).
    eps : float
        Euclidean kernel bandwidth squared; the grid spacing must be at most ``sqrt(eps) / 2``.
    temperature : float
        Circle: :math:`\tau = 1/\beta` of the scores :math:`\beta\cos(\theta - \varphi)`; the
        spacing must be at most :math:`1/(2\sqrt\beta)`.
    manifold : {"euclidean", "circle"}
    dt : float, optional
        Largest step. The solver also cuts steps to ``eps / 2`` (the step of
        :func:`sinkflow.heat.largest_safe_dt`; on the circle 0.05 over the field's rate scale,
        :data:`sinkflow.heat.STEP`) and to its scheme's own condition (see ``scheme``), and
        reports the steps it took.
    tol, max_iter : Sinkhorn L1 marginal tolerance (default ``eps**2/100`` clipped to
        [1e-12, 1e-6], 1e-12 on the circle; floor 1e-5 in float32) and iteration budget per
        velocity evaluation.
    scheme : {"auto", "semi_lagrangian", "explicit"}
        ``"semi_lagrangian"`` (a line or the circle): the remap along characteristics, no CFL
        condition, steps by predictor-corrector error control (docs/theory/mean_field.md);
        ``"explicit"``: limited upwind fluxes and Heun, steps cut to the CFL condition (many
        more steps in 1D, where the tails' velocity is fast). ``"auto"``: semi-Lagrangian on a
        line, explicit in 2D and on the circle (where the CFL step is near the accuracy step).

    Returns
    -------
    MeanFieldResult
        ``densities`` has shape ``(len(times), *grid_shape)``, the type of ``density``.

    Raises
    ------
    ValueError
        Mass not 1, negative or non-finite density, a grid that is not equispaced or does not
        resolve the kernel, unknown normalization, manifold or scheme, missing ``eps`` /
        ``temperature``, ``scheme="semi_lagrangian"`` on a 2D grid.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> y = np.linspace(-7, 7, 281)
    >>> rho = np.exp(-y ** 2 / 2) / np.sqrt(2 * np.pi)
    >>> r = sinkflow.mean_field_flow(rho, y, [0.0, 0.5], normalization="sinkhorn", eps=0.1)
    >>> r.densities.shape, r.mass_error < 1e-12, r.min_density >= 0, r.converged, r.scheme
    ((2, 281), True, True, True, 'semi_lagrangian')
    >>> var = (r.final * y ** 2).sum() * (y[1] - y[0])   # heat: 1 + 2t, minus the O(eps) bias
    >>> bool(1.9 < var < 2.0)
    True
    """
    check_choice(manifold, "manifold", MANIFOLDS)
    check_choice(scheme, "scheme", SCHEMES)
    times, dt = _check_times(times, dt)
    max_iter = check_number(max_iter, "max_iter", integer=True, positive=True)
    tol = check_number(tol, "tol (Sinkhorn marginal tolerance)", positive=True, allow_none=True)
    probe = to_torch(density, "density")
    check_float(probe, "density")
    field, shape, grid_out = _field(manifold, grid, eps, temperature, normalization, probe, tol, max_iter)
    scheme = _resolve_scheme(scheme, field)
    rho, numpy_out = _check_density(density, shape)
    cell = math.prod(field.spacings)
    _check_mass(rho, cell)
    h_cap = min(dt, _step_cap(field, rho, scheme))
    densities, st = _integrate(field, rho, cell, times, h_cap, scheme)
    masses = densities.to(torch.float64).flatten(1).sum(1) * cell
    boundary = 0.0 if field.periodic else _boundary_mass(densities, cell)
    if boundary > BOUNDARY_TOL:
        warnings.warn(f"mass {boundary:.2g} reached the edge of the grid (held there by the zero-flux boundary); "
                      "widen the grid", RuntimeWarning, stacklevel=2)
    if not st.converged:
        warnings.warn(f"some Sinkhorn solves stopped at max_iter={max_iter} (largest marginal error "
                      f"{st.max_err:.2g} > tol={field.tol:g})", RuntimeWarning, stacklevel=2)
    return MeanFieldResult(times=times, grid=grid_out, densities=from_torch(densities, numpy_out),
                           normalization=normalization, manifold=manifold, scheme=scheme,
                           eps=getattr(field, "eps", None),
                           temperature=getattr(field, "temperature", None), n_steps=st.steps,
                           dt_max=max(st.h, default=0.0), dt_min=min(st.h, default=0.0),
                           mass_error=float((masses - masses[0]).abs().max()), min_density=float(densities.min()),
                           boundary_mass=boundary, sinkhorn_iterations=np.asarray(st.iters, dtype=int),
                           max_marginal_error=st.max_err, converged=st.converged)
