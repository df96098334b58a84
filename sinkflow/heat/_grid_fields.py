r"""Velocity fields of attention on grids: the kernels of sinkflow.heat, Sinkhorn on cell masses.

:class:`EuclideanVelocity` evaluates the rescaled heat layer of :mod:`sinkflow.heat` on a
density at the cell faces (1D, or 2D with the separable Gaussian kernel applied one axis at a
time); :func:`symmetric_sinkhorn_scaling` solves the Sinkhorn problem of a density with itself
(docs/theory/mean_field.md). The circle's field is :class:`sinkflow.heat.CircleVelocity`.
"""

from __future__ import annotations

import math

import torch

from sinkflow.attention._solver import sinkhorn_solve

__all__ = ["symmetric_sinkhorn_scaling", "default_tol", "separable_apply", "EuclideanVelocity"]

# ----------------------------------------------------------------------------------------
# Sinkhorn on a grid


def symmetric_sinkhorn_scaling(apply, w: torch.Tensor, s0=None, *, tol: float = 1e-10, max_iter: int = 1000):
    r"""Symmetric Sinkhorn scaling :math:`s` with :math:`s_i (K(s w))_i = 1` wherever :math:`w_i > 0`.

    The plan :math:`\pi_{ij} = w_i s_i K_{ij} s_j w_j` then has both marginals :math:`w`. The
    iteration :math:`s \leftarrow \sqrt{s / K(s w)}` is the average of a row and a column step
    in the log domain; linearized, it maps an error :math:`\delta` to :math:`(I - M)\delta / 2`
    with :math:`M` the (positive semi-definite, stochastic) normalized plan, so it contracts
    by at least 1/2 per iteration for a positive definite kernel, whatever the bandwidth.

    Runs on the one Sinkhorn solver (:mod:`sinkflow.attention._solver`) over a symmetric
    scaling-domain operator (one whole symmetric step per iteration); ``iterations`` counts those steps.

    Parameters
    ----------
    apply : callable
        ``apply(a)`` returns :math:`K a` at the cell centres (a symmetric positive kernel).
    w : tensor
        Cell masses (non-negative).
    s0 : tensor, optional
        Warm start (default :math:`1/\sqrt{K w}`, also used where ``s0`` is not positive but
        ``w`` is: a cell the support gained).
    tol : float
        Stop when the L1 marginal error :math:`\sum_i w_i |s_i (K s w)_i - 1|` is below ``tol``.
    max_iter : int

    Returns
    -------
    s, iterations, marginal error, converged

    Examples
    --------
    >>> import torch
    >>> from sinkflow.heat import symmetric_sinkhorn_scaling
    >>> y = torch.linspace(-3, 3, 61, dtype=torch.float64)
    >>> K = torch.exp(-(y[:, None] - y[None]) ** 2 / 0.2)
    >>> w = torch.exp(-y ** 2 / 2); w = w / w.sum()
    >>> s, it, err, ok = symmetric_sinkhorn_scaling(lambda a: K @ a, w, tol=1e-12)
    >>> plan = (w * s)[:, None] * K * (s * w)[None]
    >>> ok, bool(torch.allclose(plan.sum(0), w, atol=1e-12)), it < 60
    (True, True, True)
    """
    support = w > 0
    if s0 is None:
        s = torch.where(support, apply(w).rsqrt(), 0.0)
    else:  # cells the support gained since the warm start (s = 0 is a fixed point): start them cold
        gained = support & ~(s0 > 0)
        s = torch.where(gained, apply(w).rsqrt(), s0) if bool(gained.any()) else s0
    (_, s), report = sinkhorn_solve(_SymmetricScaling(apply, w, support), None, s, tol=tol, max_iter=max_iter,
                                    accelerate=False, stall=False, read_start=True)
    return s, report.n_iter, report.marginal_error, report.converged


class _SymmetricScaling:
    """The kernel operator of :func:`symmetric_sinkhorn_scaling`: a whole symmetric step per step.

    Scaling domain (the kernel is only applied, ``apply(a) = K a``); the state is the scaling ``s``
    (``potentials() = (None, s)``). The error read after a step computes ``K (s w)``, which the
    next step divides by: one product per step, as many as steps plus one.
    """

    domain = "scaling"
    rescalable = False
    differentiable = False
    check_every = 1

    def __init__(self, apply, w, support=None):
        self.apply, self.a, self.b, self.support = apply, w, w, (w > 0) if support is None else support

    def reset(self, scale, f, s):
        self.s, self.Ks = s, None

    def step(self, row, omega, fused):
        Ks = self.apply(self.s * self.a) if self.Ks is None else self.Ks
        self.s, self.Ks = torch.where(self.support, torch.sqrt(self.s / Ks), 0.0), None

    def error(self, row):
        self.Ks = self.apply(self.s * self.a)
        return (self.a * (self.s * self.Ks - 1).abs()).sum()

    def potentials(self):
        return None, self.s

    def finish(self):
        return None, self.s


def default_tol(dtype: torch.dtype, eps: float | None) -> float:
    """Sinkhorn tolerance: ``eps**2 / 100`` (as :func:`sinkflow.heat_flow`) clipped to [floor, 1e-6].

    The floor is 1e-12 in float64, 1e-5 in float32 (the float32 marginal error of a sum of
    ~1e3 cells).
    """
    floor = 1e-12 if dtype == torch.float64 else 1e-5
    if eps is None:
        return floor
    return min(max(eps * eps / 100, floor), max(floor, 1e-6))


# ----------------------------------------------------------------------------------------
# The Euclidean velocity (1D and 2D, separable Gaussian kernel)


def separable_apply(a: torch.Tensor, mats) -> torch.Tensor:
    """Apply one matrix per axis: ``(M_0 x M_1 x ...) a`` without forming the Kronecker product."""
    for k, M in enumerate(mats):
        a = torch.movedim(torch.tensordot(M, a, dims=([1], [k])), 0, k)
    return a


def _log_separable_apply(log_a: torch.Tensor, log_mats) -> torch.Tensor:
    """``log((e^{L_0} x e^{L_1} x ...) e^{log_a})``, one stable logsumexp per axis."""
    for k, L in enumerate(log_mats):
        moved = torch.movedim(log_a, k, 0)
        shape = (L.shape[0], L.shape[1]) + (1,) * (moved.ndim - 1)
        log_a = torch.movedim(torch.logsumexp(L.reshape(shape) + moved[None], dim=1), 0, k)
    return log_a


class EuclideanVelocity:
    """Face velocities of the rescaled heat layer of :mod:`sinkflow.heat` on a density.

    ``axes`` are the cell centres of each axis (1 or 2 tensors), ``eps`` the bandwidth squared.
    Calling it with the cell masses ``w`` (and a Sinkhorn warm start) returns, for each axis,
    the velocity component at the interior faces of that axis, and the Sinkhorn diagnostics.
    """

    periodic = False

    def __init__(self, axes, eps: float, normalization: str, tol: float, max_iter: int):
        self.axes, self.eps, self.normalization = axes, eps, normalization
        self.tol, self.max_iter = tol, max_iter
        self.faces = [(y[1:] + y[:-1]) / 2 for y in axes]
        self.spacings = [float(y[1] - y[0]) for y in axes]
        if normalization == "softmax_dot":  # log-domain tilt e^{x y / eps}
            self.centre = [y[:, None] * y[None] / eps for y in axes]
            self.face = [f[:, None] * y[None] / eps for f, y in zip(self.faces, axes, strict=True)]
        else:
            self.centre = [torch.exp(-(y[:, None] - y[None]) ** 2 / (2 * eps)) for y in axes]
            self.face = [torch.exp(-(f[:, None] - y[None]) ** 2 / (2 * eps))
                         for f, y in zip(self.faces, axes, strict=True)]
        # the kernel times (y - x) at the faces: B - x without cancellation
        self.face_offset = [K * (y[None] - f[:, None]) for K, f, y in zip(self.face, self.faces, axes, strict=True)]

    def kernel(self, a):
        return separable_apply(a, self.centre)

    def __call__(self, w: torch.Tensor, s=None):
        info = (None, 0, 0.0, True)
        if self.normalization == "softmax_dot":
            return self._dot(w), info
        a = w
        if self.normalization == "sinkhorn":
            info = symmetric_sinkhorn_scaling(self.kernel, w, s, tol=self.tol, max_iter=self.max_iter)
            a = w * info[0]
        out = []
        for k in range(len(self.axes)):
            mats = list(self.centre)
            mats[k] = self.face_offset[k]
            drift = separable_apply(a, mats)  # int K(x, y) (y_k - x_k) a(y) dy at the faces of axis k
            if self.normalization == "unnormalized":
                drift = drift * (2 * math.pi * self.eps) ** (-len(self.axes) / 2)
            else:
                mats[k] = self.face[k]
                mass = separable_apply(a, mats)
                drift = torch.where(mass > 0, drift / mass.clamp_min(torch.finfo(a.dtype).tiny), 0.0)
            out.append(drift * (-2.0 / self.eps))
        return out, info

    def _dot(self, w):
        log_w = torch.log(w)  # -inf off the support
        out = []
        for k, y in enumerate(self.axes):
            mats = list(self.centre)
            mats[k] = self.face[k]
            log_mass = _log_separable_apply(log_w, mats)
            shift = float(y.min()) - 1.0  # y - shift > 0: the first moment in the log domain
            shape = [1] * w.ndim
            shape[k] = -1
            log_moment = _log_separable_apply(log_w + torch.log(y - shift).reshape(shape), mats)
            f = self.faces[k].reshape([-1 if j == k else 1 for j in range(w.ndim)])
            B = torch.exp(log_moment - log_mass) + shift
            drift = torch.where(torch.isfinite(log_mass), B - f, 0.0)
            out.append(drift * (-2.0 / self.eps))
        return out
