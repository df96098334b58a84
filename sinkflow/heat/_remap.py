r"""The semi-Lagrangian (remap) step of the mean-field equation on a line or the circle.

docs/theory/mean_field.md. The continuity equation moves mass along the characteristics
:math:`\dot X = v(X, t)`: the mass of a cell at :math:`t + h` is the mass that lay, at
:math:`t`, between the departure points of its two faces. With a non-negative piecewise-linear
reconstruction of the density (minmod slopes) and departure points in increasing order, each
new cell mass is an integral of a non-negative function over an interval, and the intervals
tile the domain:

* mass is conserved to rounding (the intervals partition the box, or one turn of the circle);
* the density stays non-negative for any step (no CFL condition: a cell may receive mass from
  many cells away), as long as the faces keep their order, i.e.
  :math:`h \max_x \partial_x v < 1` (backward characteristics of an expanding flow converge);
* departure points by the trapezoidal rule along the characteristic, with the velocity at
  :math:`t + h` from a first-order predictor: second order in time, and second order in space
  where the limiter is inactive.
"""

from __future__ import annotations

import math

import torch

__all__ = ["minmod_slopes", "remap_cells", "remap", "departure_points", "interpolate_faces", "full_face_velocity",
           "remap_step_limit", "MAX_STRETCH", "ACCURACY", "LOCAL_TOL"]

#: Largest :math:`h \max_x \partial_x v` of a step: the Euler predictor's departure faces draw
#: together by at most this fraction of a cell (1 would let two of them meet).
MAX_STRETCH = 0.9
#: Largest :math:`h \lambda` of the first step, :math:`\lambda` the mass-weighted root mean square
#: of :math:`\partial_x v` (the rate at which the flow deforms the density where the mass is).
ACCURACY = 0.05
#: Largest L1 difference between the Euler predictor and the trapezoidal corrector of an accepted
#: step (the local error of the predictor, :math:`O(h^2)`); later steps follow it.
LOCAL_TOL = 1e-3


def minmod_slopes(rho: torch.Tensor, periodic: bool) -> torch.Tensor:
    """Minmod slopes of cell values (per cell width); zero in the two outer cells of a line."""
    if periodic:
        left, right = rho - torch.roll(rho, 1), torch.roll(rho, -1) - rho
    else:
        d = rho[1:] - rho[:-1]
        zero = torch.zeros_like(rho[:1])
        left, right = torch.cat([zero, d]), torch.cat([d, zero])
    return torch.where(left * right > 0, torch.sign(left) * torch.minimum(left.abs(), right.abs()), 0.0)


def _range_sums(rho: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r""":math:`\sum_{a \le j < b} \rho_j` (``a <= b``), from whichever end keeps the relative precision of tails."""
    zero = torch.zeros_like(rho[:1])
    left = torch.cat([zero, torch.cumsum(rho, 0)])  # left[j] = sum_{i < j}
    right = torch.cat([torch.flip(torch.cumsum(torch.flip(rho, (0,)), 0), (0,)), zero])  # right[j] = sum_{i >= j}
    la, lb, ra, rb = left[a], left[b], right[a], right[b]
    return torch.where(lb <= ra, lb - la, ra - rb).clamp_min(0)


def remap_cells(rho: torch.Tensor, slope: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    r"""Integrals of the reconstruction :math:`\rho_j + \sigma_j (\xi - 1/2)` between consecutive points ``u``.

    ``u`` are positions in cell units (cell ``j`` covers ``[j, j + 1)``), non-decreasing and
    inside ``[0, len(rho)]``; the result has ``len(u) - 1`` entries, each a sum of non-negative
    terms (a partial first cell, whole cells, a partial last cell).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.heat._remap import remap_cells
    >>> rho = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    >>> remap_cells(rho, torch.zeros(3, dtype=torch.float64), torch.tensor([0.0, 0.5, 2.5, 3.0])).tolist()
    [0.5, 4.0, 1.5]
    """
    n = rho.numel()
    j = torch.floor(u).long().clamp(0, n - 1)
    xi = u - j
    lo_j, hi_j, lo_xi, hi_xi = j[:-1], j[1:], xi[:-1], xi[1:]

    def part(k, a, b):  # int_a^b of cell k's linear reconstruction; >= 0 for a <= b
        return (b - a) * (rho[k] + slope[k] * ((a + b - 1) / 2))

    same = lo_j == hi_j
    one = torch.ones_like(lo_xi)
    split = part(lo_j, lo_xi, one) + _range_sums(rho, (lo_j + 1).clamp_max(n), hi_j.clamp_min(lo_j + 1)) \
        + part(hi_j, torch.zeros_like(hi_xi), hi_xi)
    return torch.where(same, part(lo_j, lo_xi, hi_xi), split).clamp_min(0)


def full_face_velocity(v: torch.Tensor, periodic: bool) -> torch.Tensor:
    """The ``G + 1`` faces ``0 .. G`` of ``G`` cells: zero at a line's two ends; face ``G`` = face 0 on the circle.

    A line's field gives the ``G - 1`` interior faces; the circle's gives face ``i + 1/2`` of
    cell ``i`` (face ``i + 1`` here) for each cell.
    """
    if periodic:
        return torch.cat([v[-1:], v])
    zero = torch.zeros_like(v[:1])
    return torch.cat([zero, v, zero])


def remap_step_limit(vf: torch.Tensor, rho: torch.Tensor, first: bool = True) -> float:
    r"""Largest step for face velocities ``vf`` (cells per unit time): :data:`MAX_STRETCH`, and
    :data:`ACCURACY` if ``first``.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.heat._remap import remap_step_limit
    >>> remap_step_limit(torch.linspace(0, 4, 5, dtype=torch.float64), torch.ones(4, dtype=torch.float64))  # v' = 1
    0.05
    """
    dv = vf[1:] - vf[:-1]
    stretch = float(dv.max())
    if not first:
        return MAX_STRETCH / stretch if stretch > 0 else math.inf
    w = rho / rho.sum()
    rate = float((w * dv * dv).sum()) ** 0.5
    return min(MAX_STRETCH / stretch if stretch > 0 else math.inf, ACCURACY / rate if rate > 0 else math.inf)


def interpolate_faces(vf: torch.Tensor, u: torch.Tensor, periodic: bool) -> torch.Tensor:
    """Linear interpolation of face values ``vf`` (faces at ``0 .. G`` in cell units) at positions ``u``."""
    g = vf.numel() - 1
    u = torch.remainder(u, g) if periodic else u.clamp(0, g)
    k = torch.floor(u).long().clamp(0, g - 1)
    frac = u - k
    return vf[k] * (1 - frac) + vf[k + 1] * frac


def departure_points(v_now: torch.Tensor, v_next: torch.Tensor | None, h: float, periodic: bool) -> torch.Tensor:
    r"""Departure points of the faces ``0 .. G`` over a step ``h``, in cell units (velocities in cells per unit time).

    With ``v_next`` None: Euler, :math:`X = x - h v^n(x)`. Otherwise the trapezoidal rule along
    the backward characteristic, :math:`X = x - \frac h2\big(v^{n+1}(x) + v^n(x - h v^{n+1}(x))\big)`.
    """
    x = torch.arange(v_now.numel(), dtype=v_now.dtype, device=v_now.device)
    if v_next is None:
        return x - h * v_now
    foot = x - h * v_next
    return x - h / 2 * (v_next + interpolate_faces(v_now, foot, periodic))


def remap(rho: torch.Tensor, u: torch.Tensor, periodic: bool) -> torch.Tensor | None:
    """New cell values from departure points ``u`` of the faces, or None if two faces crossed.

    On a line ``u`` is clamped to the box (the outer faces stay put: no flux). On the circle the
    cells are laid out three turns long, so that departure points up to one turn away are inside.
    """
    g = rho.numel()
    steps = u[1:] - u[:-1]
    if bool((steps < -1e-9).any()):
        return None
    slope = minmod_slopes(rho, periodic)
    if periodic:
        if float(u.max() - u.min()) >= 2 * g:
            return None
        shift = torch.floor(u[0] / g) * g - g  # u - shift starts in the middle turn
        u, rho, slope = u - shift, rho.repeat(3), slope.repeat(3)
        u = u.clamp(0, 3 * g)
    else:
        u = u.clamp(0, g)
    return remap_cells(rho, slope, torch.cummax(u, 0).values)
