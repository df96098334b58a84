r"""The mean-field velocity of attention on the circle, on a grid of equal cells.

docs/theory/mean_field.md. Tokens :math:`x = (\cos\theta, \sin\theta)` on the unit circle with
:math:`Q = K = V = I` and temperature :math:`1/\beta` move by
:math:`\dot\theta_i = \sum_j K_{ij}\sin(\theta_j - \theta_i)`, with
:math:`K_{ij} \propto a_j e^{\beta\cos(\theta_i - \theta_j)}` normalized by rows (``"softmax"``),
not at all (``"unnormalized"``) or doubly stochastically (``"sinkhorn"``). On a density
:math:`\rho` (w.r.t. :math:`d\theta`):

.. math:: v[\rho](\theta) = \int K_\rho(\theta, \varphi)\sin(\varphi - \theta)\,\rho(\varphi)\,d\varphi ,

evaluated here at the faces of :func:`uniform_angles` cells for :func:`sinkflow.mean_field_flow`.
Its linear stability and the clusters it forms are in :mod:`sinkflow.clustering`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.special import ive

from sinkflow._checks import check_number
from sinkflow.heat._distances import equispaced_centres
from sinkflow.heat._grid_fields import default_tol, symmetric_sinkhorn_scaling

__all__ = ["CIRCLE_NORMALIZATIONS", "CircleVelocity", "circle_field", "uniform_angles", "STEP"]

#: The normalizations of the attention dynamics on the circle (the names :func:`sinkflow.simulate` takes).
CIRCLE_NORMALIZATIONS = ("softmax", "unnormalized", "sinkhorn")

#: Largest step on the circle, in units of the field's time scale (1 for SoftMax and Sinkhorn).
STEP = 0.05


def uniform_angles(n_cells: int) -> np.ndarray:
    """Cell centres :math:`2\\pi (i + 1/2) / G` of ``G`` equal cells on the circle."""
    return 2 * np.pi * (np.arange(n_cells) + 0.5) / n_cells


class CircleVelocity:
    """Face velocities :math:`v[\\rho](\\theta_{i+1/2})` on ``G`` equal cells of the circle (periodic)."""

    periodic = True

    def __init__(self, theta: torch.Tensor, beta: float, normalization: str, tol: float, max_iter: int):
        self.beta, self.temperature, self.normalization = beta, 1.0 / beta, normalization
        self.tol, self.max_iter = tol, max_iter
        # accuracy step: the normalized fields attract to a cluster at rate <= 1 and grow modes at
        # rates <= 2/e; the unnormalized field is I_0(beta) times faster
        self.step_cap = STEP / (float(ive(0, beta)) * math.exp(beta) if normalization == "unnormalized" else 1.0)
        h = float(theta[1] - theta[0])
        self.spacings = [h]
        faces = theta + h / 2
        # e^{beta (cos - 1)} <= 1: no overflow; the factor e^beta returns only for "unnormalized"
        self.centre = torch.exp(beta * (torch.cos(theta[:, None] - theta[None]) - 1))
        diff = theta[None] - faces[:, None]
        self.face = torch.exp(beta * (torch.cos(diff) - 1))
        self.face_sin = self.face * torch.sin(diff)

    def kernel(self, a):
        return self.centre @ a

    def __call__(self, w: torch.Tensor, s=None):
        info = (None, 0, 0.0, True)
        a = w
        if self.normalization == "sinkhorn":
            info = symmetric_sinkhorn_scaling(self.kernel, w, s, tol=self.tol, max_iter=self.max_iter)
            a = w * info[0]
        drift = self.face_sin @ a
        if self.normalization == "unnormalized":
            return [drift * math.exp(self.beta)], info
        mass = self.face @ a
        return [torch.where(mass > 0, drift / mass.clamp_min(torch.finfo(a.dtype).tiny), 0.0)], info


def _check_circle_grid(grid) -> np.ndarray:
    theta = np.asarray(grid.detach().cpu() if hasattr(grid, "detach") else grid, dtype=float)
    h = 2 * np.pi / max(theta.size, 1)
    return equispaced_centres(theta, "the circle grid", min_size=8, spacing=h,
                              hint=f" (angles) covering one turn (spacing 2 pi / G = {h:.6g}), e.g. "
                                   "sinkflow.heat.uniform_angles(G)")


def circle_field(grid, temperature, normalization: str, like: torch.Tensor, tol, max_iter):
    """Checked :class:`CircleVelocity` for :func:`sinkflow.mean_field_flow` (internal)."""
    if normalization not in CIRCLE_NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {CIRCLE_NORMALIZATIONS} on the circle "
                         f"(the names of simulate), got {normalization!r}")
    if temperature is None:
        raise ValueError("manifold='circle' needs temperature (tau = 1/beta of the scores beta cos(theta - phi))")
    beta = 1.0 / float(check_number(temperature, "temperature", positive=True))
    theta = _check_circle_grid(grid)
    if 2 * np.pi / theta.size > 0.5 / math.sqrt(beta):
        raise ValueError(f"the grid does not resolve the kernel e^(beta cos): spacing {2 * np.pi / theta.size:.3g} "
                         f"exceeds 1/(2 sqrt(beta)) = {0.5 / math.sqrt(beta):.3g}; use at least "
                         f"{math.ceil(4 * np.pi * math.sqrt(beta))} angles")
    tol = default_tol(like.dtype, None) if tol is None else float(tol)
    field = CircleVelocity(torch.as_tensor(theta, dtype=like.dtype, device=like.device), beta, normalization, tol,
                           max_iter)
    return field, (theta.size,), theta
