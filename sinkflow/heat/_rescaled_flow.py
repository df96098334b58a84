r"""Rescaled attention flows and their many-particle limits (docs/theory/heat_limit.md).

One attention layer, four normalizations. Tokens :math:`x_1..x_n\in\mathbb R^d`, scores with
:math:`W = I/\varepsilon`, values :math:`-(x_j - x_i)`, and continuous depth :math:`t`:

.. math:: \dot x_i = v_\varepsilon(x_i) = -\frac{2}{\varepsilon}\sum_j K_{ij}\,(x_j - x_i),

integrated with explicit Euler steps of size :math:`h \le dt`: each step is a residual
attention layer :math:`x_i \leftarrow x_i + \frac{2h}{\varepsilon}\sum_j K_{ij}(x_i - x_j)`, and time
:math:`t` takes :math:`t/h` layers. Only :math:`K` changes:

* ``"sinkhorn"``: :math:`K` doubly stochastic from the scores :math:`-|x_i-x_j|^2/(2\varepsilon)`.
  Limit: the heat equation :math:`\partial_t\rho = \Delta\rho`, because
  :math:`B_\varepsilon(x) = x + (\varepsilon/2)\nabla\log\rho(x) + O(\varepsilon^2)`.
* ``"softmax_gaussian"``: row SoftMax of the same scores. :math:`v = -2\nabla\log(\rho*G_\varepsilon)`
  (Tweedie, a smoothed score), so :math:`\partial_t\rho = 2\Delta\rho` as :math:`\varepsilon\to 0`.
* ``"softmax_dot"``: row SoftMax of :math:`\langle x_i, x_j\rangle/\varepsilon`. No limit:
  :math:`B - x` does not vanish, :math:`|v|\sim 1/\varepsilon` (for :math:`\mathcal N(m, s)` in 1D,
  :math:`B(x) = m + s x/\varepsilon`; the mean-field variance contracts toward :math:`\varepsilon`, and
  the particles to a cloud of size :math:`O(\sqrt\varepsilon)`).
* ``"unnormalized"``: :math:`K_{ij} = \frac1n (2\pi\varepsilon)^{-d/2} e^{-|x_i-x_j|^2/(2\varepsilon)}`.
  :math:`v = -2\nabla(\rho*G_\varepsilon)`, so :math:`\partial_t\rho = 2\nabla\cdot(\rho\nabla\rho)`
  (porous medium, exponent 2).

The scaling :math:`2/\varepsilon` is the one that makes the Sinkhorn layer a heat flow,
and it is kept for the contrasts so that only the normalization differs (the question
the Sinkformers paper asks). The contrasts' limits then carry a factor 2:
SoftMax with the Gaussian kernel diffuses twice as fast (its barycentric map is
:math:`x + \varepsilon\nabla\log(\rho*G_\varepsilon)`, "another constant"), and the
unnormalized kernel gives the porous-medium equation on the time scale :math:`2t`
(:math:`\partial_t\rho = 2\nabla\cdot(\rho\nabla\rho)`, docs/theory/heat_limit.md; velocity
scale :math:`1/\varepsilon` would drop the 2). :func:`heat_reference` returns
each limit with the right clock. Both identities
:math:`\sum_j K_{ij}(x_j-x_i) = \varepsilon\nabla\log(\rho_n*G_\varepsilon)(x_i)` (SoftMax)
and :math:`= \varepsilon\nabla(\rho_n*G_\varepsilon)(x_i)` (unnormalized) are exact for the
empirical measure :math:`\rho_n`.

Sinkhorn conserves the mean of the particles exactly (columns sum to 1); the other
normalizations do not.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sinkflow._backend import check_number, check_seed, from_torch
from sinkflow._summary import Summarized, describe_array, number
from sinkflow.fields._landmarks import LANDMARK_SAMPLINGS, _flow_landmarks
from sinkflow.heat._heat_velocity import _check_eps, _default_tol, _heat_layer, _positions, _velocity
from sinkflow.heat._references import _check_time

__all__ = ["HeatFlowResult", "heat_trajectory", "heat_flow", "largest_safe_dt"]


@dataclass(frozen=True, repr=False)
class HeatFlowResult(Summarized):
    """Snapshots of a rescaled attention flow.

    Its ``repr`` states the snapshots' shape, the normalization, :math:`\\varepsilon`, the steps and
    (for Sinkhorn) the convergence, worst marginal error and iterations, never the positions.

    Attributes
    ----------
    times : numpy.ndarray
        Snapshot times.
    positions : array (len(times), n, d)
        Particle positions at those times, in the input's type.
    normalization : str
    eps : float
    dt : float
        The largest Euler step used (each interval between snapshots is cut into equal
        steps no longer than the requested ``dt``).
    n_steps : int
    sinkhorn_iterations : numpy.ndarray
        Updates of the Sinkhorn potentials per step (zeros for the other normalizations), each one
        pass of matrix-vector products over the kernel: steps of the symmetric solver (heavy-ball
        or Newton, row and column potentials at once; the kernel is symmetric positive
        semi-definite), or half-iterations of the general alternating solver (the path of a tensor
        that requires grad, of half precision, of a landmark flow or of the general solver
        finishing an unconverged symmetric solve).
    max_marginal_error : float
        Largest Sinkhorn marginal error over the steps.
    converged : bool
        Whether every Sinkhorn solve reached ``tol``.
    """

    times: np.ndarray
    positions: Any
    normalization: str
    eps: float
    dt: float
    n_steps: int
    sinkhorn_iterations: np.ndarray
    max_marginal_error: float
    converged: bool

    @property
    def final(self):
        """Positions at the last snapshot time."""
        return self.positions[-1]

    def _facts(self):
        shape = np.shape(self.positions)
        times = np.asarray(self.times, dtype=float)
        head = (f"{shape[0]} snapshots x {shape[-2]} particles x {shape[-1]} coordinates, "
                f"{describe_array(self.positions)}, {self.normalization}")
        run = [("eps", number(self.eps)), ("t", f"{number(times[0])} to {number(times[-1])}"),
               ("steps", f"{self.n_steps} (dt <= {number(self.dt)})")]
        sinkhorn = []
        if self.normalization == "sinkhorn" or np.any(self.sinkhorn_iterations):
            sinkhorn = [("Sinkhorn", "converged" if self.converged else "NOT converged"),
                        ("max marginal error", number(self.max_marginal_error)),
                        ("iterations per step", number(np.mean(self.sinkhorn_iterations))
                         if np.size(self.sinkhorn_iterations) else "none")]
        return head, [run, sinkhorn]


def _check_steps(times, dt) -> tuple[np.ndarray, float]:
    times = np.atleast_1d(np.asarray(times.detach().cpu() if isinstance(times, torch.Tensor) else times))
    if times.dtype.kind not in "iuf":
        raise TypeError(f"times must be a real number or a 1D array of real numbers, got {times.dtype} values")
    times = times.astype(float)
    if times.ndim != 1 or times.size == 0:
        raise ValueError("times must be a float or a 1D array of floats")
    for t in times:
        _check_time(t)
    if np.any(np.diff(times) < 0):
        raise ValueError("times must be sorted increasingly")
    dt = float(check_number(dt, "dt", positive=True))
    if dt > times[-1] > 0:
        raise ValueError(f"dt = {dt} exceeds the final time t = {times[-1]}: choose dt <= t (the step is cut to fit t)")
    return times, dt


def largest_safe_dt(x, eps: float, normalization: str = "sinkhorn") -> float:
    r"""Largest Euler step for which the rescaled layer still follows its flow.

    Kernel layers (Gaussian scores): :math:`v_i = -\frac{2}{\varepsilon}(B_i - x_i)` with
    :math:`B_i` a :math:`K`-weighted mean of the particles. Two particles closer than
    :math:`\sqrt\varepsilon` repel at the rate :math:`2/\varepsilon` (for the pair,
    :math:`\dot r = \frac{2}{\varepsilon}(1 - K_{12} - K_{21}) r` with :math:`K_{ij}\to 1/2` when the
    kernel sees only the pair), the stiffest rate of the field; an explicit step follows it
    only when :math:`h \cdot 2/\varepsilon \le 1`: ``dt <= eps / 2``. ``"softmax_dot"`` moves at
    :math:`|v| \sim \mathrm{var}/\varepsilon^2`: ``dt <= eps**2 / (4 var)``.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> from sinkflow.heat import largest_safe_dt
    >>> largest_safe_dt(np.zeros((3, 1)), 0.1)
    0.05
    """
    eps = _check_eps(eps)
    if _heat_layer(normalization).scores == "dot":
        xt, _ = _positions(x)
        var = float(xt.detach().to(torch.float64).var(0).sum())
        return eps * eps / (4 * max(var, 1e-300))
    return eps / 2


def _unsafe_step_message(dt: float, safe: float, eps: float, normalization) -> str:
    """What the error and the warning about a large Euler step both say: the step, the limit, why."""
    if _heat_layer(normalization).scores == "gaussian":
        why = "eps/2: particles closer than sqrt(eps) repel at the rate 2/eps"
    else:
        why = "eps^2/(4 var): SoftMax-dot moves at about var/eps^2"
    return (f"dt={dt:g} exceeds the largest safe step dt = {safe:g} of normalization={normalization!r} at "
            f"eps={eps:g} ({why}; sinkflow.heat.largest_safe_dt)")


def _check_heat_step(x: torch.Tensor, eps: float, dt: float, normalization) -> None:
    """Refuse ``dt`` above twice :func:`largest_safe_dt` (kernel layers), warn above it; both name that limit."""
    safe = largest_safe_dt(x, eps, normalization)
    if dt > 2 * safe and _heat_layer(normalization).scores == "gaussian":
        raise ValueError(_unsafe_step_message(dt, safe, eps, normalization) + " by more than 2x: one Euler step "
                         "overshoots the closest particles, and the result would not be the heat flow")
    if dt > safe:
        warnings.warn(_unsafe_step_message(dt, safe, eps, normalization) + "; the flow may be inaccurate",
                      RuntimeWarning, stacklevel=3)


def _check_bandwidth_resolves_particles(x: torch.Tensor, eps: float, sample: int = 256) -> None:
    """Warn when the kernel sees no neighbours (eps far below the squared particle spacing): the particles freeze."""
    idx = torch.linspace(0, x.shape[0] - 1, min(sample, x.shape[0]), device=x.device).long()
    d2 = torch.cdist(x[idx].to(torch.float64), x.to(torch.float64)).square()
    nearest = d2.topk(2, dim=1, largest=False).values[:, 1]
    spacing = float(nearest.median())
    if eps * 10 < spacing:
        warnings.warn(f"eps={eps:g} is far below the squared particle spacing (median nearest-neighbour distance^2 = "
                      f"{spacing:.3g}): each particle's kernel sees almost only itself (neighbour weight < e^-5), so "
                      f"the particles barely move and this is not the heat flow; use eps >= {spacing / 10:.3g} or more "
                      "particles", RuntimeWarning, stacklevel=3)


def heat_trajectory(x0, times, eps: float, dt: float, normalization: str = "sinkhorn", *, tol: float | None = None,
                    max_iter: int = 5000, landmarks: int | None = None, landmark_sampling: str = "farthest",
                    landmark_seed: int = 0, progress: bool = False) -> HeatFlowResult:
    r"""Run the rescaled attention flow and keep snapshots at ``times``.

    Explicit Euler, :math:`x \leftarrow x + h\,v_\varepsilon(x)`, with each interval
    between snapshots cut into equal steps :math:`h \le dt`. Sinkhorn solves run to the
    marginal tolerance ``tol`` and are warm-started from the previous step's column
    potential (``init_g``); on the dense symmetric kernel (no graph to keep) by the particles'
    symmetric solver, so a step costs one exponential pass and a few matrix-vector products
    (measured: 1.6 potential updates per step at n = 1,000, eps = 0.05, where the alternating
    solver took 27 half-iterations; 12x faster in float64).

    Parameters
    ----------
    x0 : array or tensor (n, d)
        Initial particles (uniform weights).
    times : float or increasing array of floats >= 0
        Snapshot times (0 gives the initial positions).
    eps : float
        Bandwidth squared of the kernel :math:`e^{-|x-y|^2/(2\varepsilon)}`.
    dt : float
        Largest time step, ``0 < dt <= max(times)`` (any ``dt > 0`` when ``times`` is 0).
        :func:`largest_safe_dt` gives the bound (``eps / 2`` for the kernel layers,
        ``eps**2 / (4 var)`` for ``"softmax_dot"``): above it a ``RuntimeWarning``, above twice
        it a ``ValueError`` (kernel layers). A bandwidth far below the squared particle spacing
        (the particles cannot move) is warned about.
    normalization : str
        ``"sinkhorn"``, ``"softmax_gaussian"``, ``"softmax_dot"``, ``"unnormalized"``, or any
        attention variant of :mod:`sinkflow.attention` (on the Gaussian scores; ``"gaussian"``
        is ``"unnormalized"``).
    landmarks : int, optional
        Evaluate the kernel with ``m`` landmarks in ``O(n m)`` per step
        (:mod:`sinkflow.particles`: Nyström for Sinkhorn and SoftMax, ``m >= n`` exact;
        Skyformer's lifted Nyström for the unnormalized kernel, ``m >= 2n`` exact), chosen once
        from ``x0``.
    landmark_sampling : {"farthest", "uniform"}
        Greedy farthest points of ``x0`` (they cover the support, so no particle is far from
        every landmark) or uniform random particles (:func:`sinkflow.particles.landmark_indices`).
    landmark_seed : int
        Seed of the landmark draw (the first farthest point).
    tol, max_iter : Sinkhorn marginal tolerance and budget of potential updates per step. The
        default ``tol = eps**2 / 100`` (clipped to [1e-10, 1e-4], float32 floor 2e-6) keeps the
        velocity error (~``3 tol / eps`` relative) well below the O(eps) bias of the limit.
    progress : bool
        tqdm progress bar over the steps.

    Returns
    -------
    HeatFlowResult

    Raises
    ------
    TypeError
        A numeric parameter that is not a real number (a string, a bool), or a count that is not
        an integer (``max_iter``, ``landmarks``).
    ValueError
        eps <= 0, negative or unsorted times, dt <= 0 or dt > t, NaN, unknown normalization.
    FloatingPointError
        When the particles leave the floating range (explicit Euler unstable: reduce dt).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x0 = np.random.default_rng(0).normal(size=(200, 1))
    >>> res = sinkflow.heat_trajectory(x0, [0.0, 0.1], eps=0.1, dt=0.02)
    >>> res.positions.shape, res.converged
    ((2, 200, 1), True)
    """
    x, numpy_out = _positions(x0)
    eps = _check_eps(eps)
    layer = _heat_layer(normalization)
    times, dt = _check_steps(times, dt)
    max_iter = check_number(max_iter, "max_iter", integer=True, positive=True)
    landmarks = check_number(landmarks, "landmarks", integer=True, positive=True, allow_none=True)
    landmark_seed = check_seed(landmark_seed, "landmark_seed")
    if landmarks is not None and torch.is_grad_enabled() and x.requires_grad:
        raise ValueError("gradients through the heat flow need the dense evaluation (no landmarks)")
    if times[-1] > 0:
        _check_heat_step(x.detach(), eps, dt, normalization)
        _check_bandwidth_resolves_particles(x.detach(), eps)
    tol = _default_tol(x, tol, eps)
    if landmark_sampling not in LANDMARK_SAMPLINGS:
        raise ValueError(f"landmark_sampling must be one of {LANDMARK_SAMPLINGS}, got {landmark_sampling!r}")
    if landmarks is not None:  # drawn once: the approximate flow is an ODE of its own
        landmarks = _flow_landmarks(x, landmarks, layer.variant.landmark_method, None, eps, landmark_sampling,
                                    landmark_seed)
    from sinkflow._progress import progress_bar

    plans = []
    prev = 0.0
    for t in times:
        span = t - prev
        k = 0 if span <= 0 else int(math.ceil(span / dt - 1e-9))
        plans.append((k, span / k if k else 0.0))
        prev = t
    n_steps = sum(k for k, _ in plans)
    snaps = []
    iters = []
    max_err = 0.0
    converged = True
    g = g_prev = None
    h_prev = None
    h_max = 0.0
    with progress_bar(total=n_steps, enabled=progress, desc=f"{layer.name} flow", leave=False) as bar:
        for k, h in plans:
            for _ in range(k):
                # Warm start: the column potential moves smoothly with the particles, so a
                # linear extrapolation of the last two steps starts O(h^2) from the solution.
                g_init = g
                if g_prev is not None and h_prev:
                    g_init = g + (h / h_prev) * (g - g_prev)
                v, (g_new, it, err, ok) = _velocity(x, eps, layer, g_init, tol, max_iter, landmarks)
                g_prev, g, h_prev = g, g_new, h
                x = x + h * v
                if not bool(torch.isfinite(x).all()):
                    raise FloatingPointError(
                        f"{normalization} flow left the floating range after {len(iters) + 1} steps "
                        f"(explicit Euler unstable at dt={h:.3g}, eps={eps:.3g}); reduce dt")
                iters.append(it)
                max_err = max(max_err, float(err))
                converged = converged and bool(ok)
                h_max = max(h_max, h)
                bar.update()
            snaps.append(x.clone())
    if layer.variant.normalization == "sinkhorn" and not converged:
        warnings.warn(f"some Sinkhorn solves stopped at max_iter={max_iter} (largest marginal error {max_err:.2g} > "
                      f"tol={tol:g})",
                      RuntimeWarning, stacklevel=2)
    positions = from_torch(torch.stack(snaps), numpy_out)
    return HeatFlowResult(times=times, positions=positions, normalization=layer.name, eps=eps, dt=h_max or dt,
                          n_steps=n_steps, sinkhorn_iterations=np.asarray(iters, dtype=int),
                          max_marginal_error=max_err, converged=converged)


def heat_flow(x0, t: float, eps: float, dt: float, normalization: str = "sinkhorn", **kwargs):
    r"""Particle positions at time ``t`` of the rescaled attention flow (the heat-limit layer).

    With ``normalization="sinkhorn"`` the empirical measure of the result approximates the
    heat solution :math:`\rho_0 * G_{2t}` as :math:`n\to\infty`, :math:`\varepsilon\to 0`
    (with :math:`n` large enough for the bandwidth) and :math:`dt \to 0`. See the module
    docstring for the other normalizations and :func:`heat_reference` for their limits.

    Parameters
    ----------
    x0 : array or tensor (n, d)
        Initial particles.
    t : float
        Final time (>= 0; ``t = 0`` returns a copy of the start).
    eps : float
        Kernel bandwidth squared (> 0).
    dt : float
        Largest Euler step, ``0 < dt <= t``.
    normalization : {"sinkhorn", "softmax_gaussian", "softmax_dot", "unnormalized"}
    **kwargs
        ``tol``, ``max_iter``, ``landmarks``, ``landmark_sampling``, ``landmark_seed``, ``progress`` of
        :func:`heat_trajectory`.

    Returns
    -------
    positions : (n, d), same type (numpy / torch), dtype and device as ``x0``; a tensor that
        requires grad gives positions with an autograd graph (dense evaluation, no landmarks)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x0 = np.random.default_rng(0).normal(size=(400, 1))
    >>> x1 = sinkflow.heat_flow(x0, t=0.25, eps=0.05, dt=0.0125)
    >>> growth = x1.var() - x0.var()   # heat: variance grows by 2t = 0.5
    >>> bool(abs(growth - 0.5) < 0.05)
    True
    """
    return heat_trajectory(x0, [_check_time(t)], eps, dt, normalization, **kwargs).final


