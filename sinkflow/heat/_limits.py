"""The equations the rescaled layers tend to, and their references: the time factor of each
layer, the exact heat or porous-medium solution at time t, and the barycentric map of a density
on a grid (the velocity of the mean field, whose eps -> 0 limit is the heat flow).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sinkflow._summary import Summarized, number
from sinkflow.attention._normalizations import softmax, solve_sinkhorn
from sinkflow.attention._scores import dot_scores, gaussian_scores
from sinkflow.heat._heat_velocity import _check_eps, _check_normalization
from sinkflow.heat._references import Barenblatt, GaussianMixture, _check_time

__all__ = ["LIMIT_EQUATIONS", "limit_time_factor", "heat_reference", "BarycentricMapResult", "barycentric_map"]


#: The many-particle limit of each normalization under the layer of this module.
LIMIT_EQUATIONS = {
    "sinkhorn": r"$\partial_t\rho = \Delta\rho$",
    "softmax_gaussian": r"$\partial_t\rho = 2\Delta\rho$ (smoothed score at finite $\varepsilon$)",
    "softmax_dot": "no limit (velocity ~ 1/eps)",
    "unnormalized": r"$\partial_t\rho = 2\nabla\cdot(\rho\nabla\rho)$",
}


_TIME_FACTOR = {"sinkhorn": 1.0, "softmax_gaussian": 2.0, "softmax_dot": None, "unnormalized": 2.0}


def limit_time_factor(normalization: str) -> float | None:
    """Clock of each normalization's limit equation (see :data:`LIMIT_EQUATIONS`); None: no limit.

    The flow of ``normalization`` at time ``t`` approaches its limit equation's solution at
    time ``factor * t`` (:func:`heat_reference` applies it).

    Parameters
    ----------
    normalization : {"sinkhorn", "softmax_gaussian", "softmax_dot", "unnormalized"}

    Returns
    -------
    float or None
        The time factor; None for ``"softmax_dot"``, which has no many-particle limit.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> from sinkflow.heat import limit_time_factor
    >>> limit_time_factor("sinkhorn"), limit_time_factor("softmax_gaussian"), limit_time_factor("softmax_dot")
    (1.0, 2.0, None)
    >>> g = sinkflow.GaussianMixture.gaussian([0.0], [[1.0]])
    >>> softmax = sinkflow.heat_reference(g, 0.5, "softmax_gaussian")   # the heat equation on a faster clock
    >>> heat = sinkflow.heat_reference(g, limit_time_factor("softmax_gaussian") * 0.5, "sinkhorn")
    >>> bool(np.allclose(softmax.covs, heat.covs))
    True
    """
    return _TIME_FACTOR[_check_normalization(normalization)]


def heat_reference(initial, t: float, normalization: str = "sinkhorn"):
    """The many-particle limit matching :func:`heat_flow` at time ``t``.

    Parameters
    ----------
    initial : GaussianMixture or Barenblatt
        Law of the initial particles.
    t : float
        Time (>= 0).
    normalization : str
        ``"sinkhorn"``: the heat solution (mixture with covariances + 2tI).
        ``"softmax_gaussian"``: the heat solution at time ``2t`` (the eps -> 0 limit).
        ``"unnormalized"``: the Barenblatt solution advanced by ``2t`` (closed form only
        from a Barenblatt start). ``"softmax_dot"`` has no limit (ValueError).

    Returns
    -------
    GaussianMixture or Barenblatt

    Examples
    --------
    >>> import sinkflow
    >>> g = sinkflow.GaussianMixture.gaussian([0.0], [[1.0]])
    >>> float(sinkflow.heat_reference(g, 0.5, "softmax_gaussian").covs[0, 0, 0])
    3.0
    """
    t = _check_time(t)
    factor = limit_time_factor(normalization)
    if factor is None:
        raise ValueError("softmax_dot has no many-particle limit: B(x) - x does not vanish as eps -> 0 "
                         "(docs/theory/heat_limit.md)")
    if normalization == "unnormalized":
        if not isinstance(initial, Barenblatt):
            raise ValueError("the porous-medium limit has a closed form only from a Barenblatt start; "
                             "pass a Barenblatt")
        return initial.evolve(factor * t)
    if not isinstance(initial, GaussianMixture):
        raise ValueError(f"the heat limit of {normalization!r} has a closed form from a GaussianMixture start; "
                         "for other densities use sinkflow.heat.solve_heat_grid")
    return initial.evolve(factor * t)


@dataclass(frozen=True, repr=False)
class BarycentricMapResult(Summarized):
    r"""Barycentric map of a density on a 1D grid, rescaled to compare with its limit.

    Its ``repr`` states the normalization, :math:`\varepsilon`, the grid and the interior error.

    Attributes
    ----------
    grid : numpy.ndarray (m,)
    rescaled : numpy.ndarray (m,)
        ``(B_eps(x) - x) / scale`` (for ``"unnormalized"``: :math:`\sum_j K(x, y_j)(y_j - x)/\varepsilon`).
    target : numpy.ndarray (m,)
        The limit: :math:`\partial_x\log\rho` (:math:`\partial_x\rho` for ``"unnormalized"``).
    scale : float
        :math:`\varepsilon/2` for Sinkhorn, :math:`\varepsilon` otherwise.
    interior : numpy.ndarray of bool
        Points where the comparison is meaningful (density above 1e-3 of its maximum).
    error : float
        Largest ``|rescaled - target|`` on the interior.
    """

    grid: np.ndarray
    rescaled: np.ndarray
    target: np.ndarray
    scale: float
    interior: np.ndarray
    error: float
    eps: float
    normalization: str

    def _facts(self):
        head = (f"{self.normalization}, eps {number(self.eps)}: on {np.size(self.grid)} grid points "
                f"({int(np.count_nonzero(self.interior))} interior)")
        return head, [[("error", f"max |rescaled - target| = {number(self.error)} on the interior"),
                       ("scale", number(self.scale))]]


def barycentric_map(density, grid, eps: float, normalization: str = "sinkhorn", *,
                    tol: float = 1e-9) -> BarycentricMapResult:
    r"""Check :math:`B_\varepsilon(x) = x + (\varepsilon/2)\nabla\log\rho(x) + O(\varepsilon^2)` on a 1D grid.

    The density is discretized on ``grid`` (weights :math:`\propto\rho(y_j)`), the kernel
    :math:`e^{-|x-y|^2/(2\varepsilon)}` normalized by ``normalization`` with those weights,
    and :math:`B_\varepsilon(x_i) = \sum_j K_{ij} y_j`. The grid must resolve the kernel
    (spacing well below :math:`\sqrt\varepsilon`) and cover the density's tails.

    Parameters
    ----------
    density : GaussianMixture (1D) or object with ``pdf`` (and optionally ``score``)
    grid : array (m,)
        Uniform grid.
    eps : float
    normalization : {"sinkhorn", "softmax_gaussian", "softmax_dot", "unnormalized"}
    tol : float
        Sinkhorn tolerance (the map's error from it is ~``3 tol / eps`` relative).

    Returns
    -------
    BarycentricMapResult

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> rho = sinkflow.GaussianMixture.gaussian([0.0], [[1.0]])
    >>> r = sinkflow.barycentric_map(rho, np.linspace(-7, 7, 141), eps=0.05)
    >>> bool(r.error < 0.1)   # (B - x)/(eps/2) ~ -x, error O(eps)
    True
    """
    eps = _check_eps(eps)
    normalization = _check_normalization(normalization)
    y = np.asarray(grid, dtype=float)
    if y.ndim != 1 or y.size < 8:
        raise ValueError(f"grid must be a 1D array of at least 8 points, got shape {y.shape}")
    if getattr(density, "dim", 1) != 1:
        raise ValueError("barycentric_map works on 1D densities")
    rho = np.asarray(density.pdf(y[:, None]), dtype=float)
    if np.any(rho < 0) or not np.any(rho > 0):
        raise ValueError("density must be non-negative and not identically zero on the grid")
    w = rho / rho.sum()
    Y = y[:, None]
    if normalization == "softmax_dot":
        C = dot_scores(Y, Y, temperature=eps)
    else:
        C = gaussian_scores(Y, Y, temperature=eps)
    with np.errstate(divide="ignore"):
        logw = np.log(w)
    if normalization == "sinkhorn":
        # K_ij = w_j k_eps(y_i, y_j): rows sum to 1, sum_i w_i K_ij = w_j
        # symmetric cold start (as in the flows): e^{g_j} ~ sqrt(w_j / local kernel mass)
        g0 = 0.5 * (np.log(np.maximum(w, 1e-300)) - np.logaddexp.reduce(C, axis=1))
        K = solve_sinkhorn(C, tol=tol, a=w, b=w, init_g=g0, warn=False).attention
    elif normalization == "unnormalized":
        # Riemann sum of int G_eps(x - y) (y - x) rho(y) dy
        K = np.exp(C) * (2 * math.pi * eps) ** -0.5 * rho[None, :] * (y[1] - y[0])
    else:
        K = softmax(C + logw[None, :])
    drift = K @ y - K.sum(1) * y
    if normalization == "unnormalized":
        scale = eps
        h = 1e-5
        target = (density.pdf((y + h)[:, None]) - density.pdf((y - h)[:, None])) / (2 * h)
    else:
        scale = eps / 2 if normalization == "sinkhorn" else eps
        if hasattr(density, "score"):
            target = np.asarray(density.score(y[:, None]))[:, 0]
        else:
            target = np.gradient(np.log(np.maximum(rho, 1e-300)), y)
    rescaled = drift / scale
    interior = rho >= 1e-3 * rho.max()
    error = float(np.abs(rescaled - target)[interior].max())
    return BarycentricMapResult(grid=y, rescaled=rescaled, target=target, scale=scale, interior=interior,
                                error=error, eps=eps, normalization=normalization)
