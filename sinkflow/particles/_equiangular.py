r"""The equiangular reduction of attention dynamics (docs/theory/placements.md).

With :math:`Q = K = V = I`, uniform weights and no mask, ``n`` tokens whose pairwise inner products of
directions all equal :math:`\rho` (and whose norms all equal :math:`r`) stay so under every placement of
:mod:`sinkflow.particles._placements`: the attention matrix is :math:`a I + b (E - I)` (:math:`E = 1 1^T`,
``a`` on the diagonal, ``b`` off it), symmetric with equal row sums (so Sinkhorn is SoftMax), and the
field maps the rows of :math:`X = M \Theta_0` with :math:`M = \alpha I + \beta E` to rows of the same form.
The flow therefore lives on the two coordinates :math:`(\alpha, \beta)` of :math:`M`, a *linear* image of
the particles: explicit Euler and RK4 on :math:`(\alpha, \beta)` are the particles' steps exactly (to
rounding), and :math:`\rho`, :math:`r` are read off the Gram matrix :math:`M G_0 M`,
:math:`G_0 = (1 - \rho_0) I + \rho_0 E`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from sinkflow._checks import check_choice, check_number
from sinkflow._summary import Summarized, number
from sinkflow.particles._placements import Placement, as_placement

__all__ = ["equiangular_flow", "equiangular_start", "EquiangularFlow", "EQUIANGULAR_ATTENTIONS"]

#: Attentions whose equiangular reduction :func:`equiangular_flow` knows.
EQUIANGULAR_ATTENTIONS = ("softmax", "sinkhorn", "unnormalized")


def _check_rho0(n: int, rho0) -> float:
    rho0 = float(check_number(rho0, "rho0"))
    if not -1.0 / (n - 1) < rho0 < 1:
        raise ValueError(f"rho0 must lie in (-1/(n-1), 1) = ({-1 / (n - 1):.6g}, 1) for n = {n}, got {rho0}")
    return rho0


def equiangular_start(n: int, d: int, rho0: float, *, like=None):
    r"""``n`` unit vectors of :math:`R^d` with all pairwise inner products :math:`\rho_0`.

    The rows of the Cholesky factor of :math:`(1 - \rho_0) I + \rho_0 1 1^T`, padded with zeros to ``d``
    columns. :math:`\rho_0 = -1/(n-1)` (the regular simplex, an unstable equilibrium) and
    :math:`\rho_0 = 1` are excluded.

    Parameters
    ----------
    n, d : int
        Number and dimension of the particles (``2 <= n <= d``).
    rho0 : float
        In :math:`(-1/(n-1), 1)`.
    like : torch.Tensor, optional
        Return a tensor with this device and dtype (numpy float64 otherwise).

    Returns
    -------
    array (n, d)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x = sinkflow.equiangular_start(4, 5, 0.3)
    >>> G = x @ x.T
    >>> bool(np.allclose(np.diag(G), 1)), bool(np.allclose(G[~np.eye(4, dtype=bool)], 0.3))
    (True, True)
    """
    n = check_number(n, "n", integer=True, positive=True)
    d = check_number(d, "d", integer=True, positive=True)
    if n < 2 or d < n:
        raise ValueError(f"equiangular starts need 2 <= n <= d, got n = {n}, d = {d}")
    rho0 = _check_rho0(n, rho0)
    L = np.linalg.cholesky((1 - rho0) * np.eye(n) + rho0 * np.ones((n, n)))
    x = np.zeros((n, d))
    x[:, :n] = L
    return x if like is None else torch.as_tensor(x, dtype=like.dtype, device=like.device)


@dataclass(frozen=True, repr=False)
class EquiangularFlow(Summarized):
    r"""The reduced flow of :func:`equiangular_flow`.

    Attributes
    ----------
    times : numpy.ndarray (steps + 1,)
    rho : numpy.ndarray (steps + 1,)
        The common inner product of the directions :math:`\theta_i = x_i / |x_i|`.
    r : numpy.ndarray (steps + 1,)
        The common norm :math:`|x_i|` (1 throughout for Post-LN and nGPT).
    coefficients : numpy.ndarray (steps + 1, 2)
        :math:`(\alpha, \beta)`: :math:`x_i = \alpha \theta^0_i + \beta \sum_j \theta^0_j` (the particles from
        :func:`equiangular_start`).
    n : int
    beta : float
        Inverse temperature.
    attention, norm, integrator : str
    h : float
    """

    times: np.ndarray
    rho: np.ndarray
    r: np.ndarray
    coefficients: np.ndarray
    n: int
    beta: float
    attention: str
    norm: str
    integrator: str
    h: float

    def _facts(self):
        head = f"{self.n} equiangular tokens, {self.attention}, norm {self.norm}"
        return head, [[("beta", number(self.beta)), ("integrator", self.integrator), ("h", number(self.h)),
                       ("t", f"0 to {number(self.times[-1])}")],
                      [("rho", f"{number(self.rho[0], 4)} -> {number(self.rho[-1], 6)}"),
                       ("r", f"{number(self.r[0], 4)} -> {number(self.r[-1], 6)}")]]


class _Reduced:
    """The field of the equiangular flow on the coefficients ``(p, q)`` of ``p I + q E``."""

    def __init__(self, n: int, rho0: float, beta: float, attention: str, placement: Placement, discrete: bool,
                 switch: int):
        self.n, self.beta, self.attention, self.placement = n, beta, attention, placement
        self.discrete, self.switch = discrete, switch
        self.G0 = (1.0 - rho0, rho0)

    def mul(self, A, B):
        """``(p1 I + q1 E)(p2 I + q2 E)`` (``E^2 = n E``)."""
        return A[0] * B[0], A[0] * B[1] + A[1] * B[0] + self.n * A[1] * B[1]

    def inner(self, A, B) -> float:
        """The common inner product of a row of ``A Theta_0`` with the same row of ``B Theta_0``."""
        p, q = self.mul(self.mul(A, self.G0), B)
        return p + q

    def gram(self, M):
        """``(diagonal, off-diagonal)`` of the Gram matrix of the rows of ``M Theta_0``."""
        p, q = self.mul(self.mul(M, self.G0), M)
        return p + q, q

    def normalize(self, M):
        s = math.sqrt(self.inner(M, M))
        return M[0] / s, M[1] / s

    def attend(self, M):
        """``A(Z) Z`` for ``Z = M Theta_0``: the attention matrix ``a I + b (E - I)`` times ``M``."""
        diag, off = self.gram(M)
        sd, so = self.beta * diag, self.beta * off
        if self.attention == "unnormalized":
            a, b = math.exp(sd) / self.n, math.exp(so) / self.n
        else:  # SoftMax; Sinkhorn is the same matrix (symmetric, equal row sums)
            top = max(sd, so)
            ed, eo = math.exp(sd - top), math.exp(so - top)
            a, b = ed / (ed + (self.n - 1) * eo), eo / (ed + (self.n - 1) * eo)
        return self.mul((a - b, b), M)

    def tangent(self, V, M):
        c = self.inner(V, M)
        return V[0] - c * M[0], V[1] - c * M[1]

    def velocity(self, M, layer: int, t: float):
        name = self.placement.phase(layer, self.switch)
        if name == "none":
            return self.attend(M)
        if name == "post":
            V = self.attend(M)
            return V if self.discrete else self.tangent(V, M)
        if name == "ngpt":
            U = self.normalize(self.attend(M))
            W = (U[0] - M[0], U[1] - M[1]) if self.discrete else self.tangent(U, M)
            return W[0] * self.placement.alpha, W[1] * self.placement.alpha
        V = self.attend(self.normalize(M))
        if name == "peri":
            return self.normalize(V)
        if name == "lnscale":
            s = 1 / math.sqrt(1 + t)
            return V[0] * s, V[1] * s
        return V  # pre

    def moved(self, M, V, h, layer):
        Y = (M[0] + h * V[0], M[1] + h * V[1])
        return self.normalize(Y) if self.placement.retracts(layer, self.switch) else Y


def equiangular_flow(n: int, rho0: float, *, beta: float = 1.0, attention: str = "softmax", norm="post",
                     T: float = 1.0, h: float = 0.01, integrator: str = "rk4") -> EquiangularFlow:
    r"""The equiangular reduction: :math:`\rho(t)` (and :math:`r(t)`) of ``n`` tokens started equiangular.

    Tokens :math:`x_i = r \theta_i` with :math:`\langle \theta_i, \theta_j\rangle = \rho` for all
    :math:`i \ne j` stay equiangular under :func:`sinkflow.simulate` with :math:`Q = K = V = I`, uniform
    weights and no mask, for every placement ``norm``. Integrated on the two coefficients of the particles
    in the basis of the start (module docstring), so that ``integrator`` and ``h`` are the particles' own:
    particles from :func:`equiangular_start` run by ``simulate(..., integrator=integrator, h=h, norm=norm)``
    follow it to rounding. The closed systems (docs/theory/placements.md), with ``a`` and ``b`` the diagonal
    and off-diagonal attention weights: Post-LN :math:`\dot\rho = 2b(1-\rho)(1+(n-1)\rho)`; Pre-LN the same
    over :math:`r` with :math:`\dot r = a + (n-1) b\rho`; Peri-LN those over :math:`m = |A_i|`; nGPT
    Post-LN's over :math:`m`; LN-scaling Pre-LN's over :math:`\sqrt{1 + t}`.

    Parameters
    ----------
    n : int
        Number of tokens (>= 2).
    rho0 : float
        Initial common inner product, in :math:`(-1/(n-1), 1)`.
    beta : float
        Inverse temperature :math:`\beta = 1/\tau` (> 0; the papers' unit sphere, ``normalization="sphere"``).
    attention : {"softmax", "sinkhorn", "unnormalized"}
        SoftMax and Sinkhorn give the same flow; unnormalized :math:`a = e^{\beta r^2}/n`,
        :math:`b = e^{\beta r^2\rho}/n` (stiff: RK4 needs :math:`h \lesssim 0.1 e^{-\beta}`).
    norm : str or Placement
        ``"post"`` (the sphere flow), ``"pre"``, ``"peri"``, ``"mix"``, ``"ngpt"``, ``"lnscale"`` or ``"none"``
        (:func:`sinkflow.placement`; only the unit-sphere normalization).
    T, h : float
        Horizon and step (``round(T / h)`` steps).
    integrator : {"rk4", "euler"}
        RK4 integrates the continuous model; Euler is the practitioners' layer, step ``h``.

    Returns
    -------
    EquiangularFlow

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> post = sinkflow.equiangular_flow(6, 0.0, beta=2.0, norm="post", T=8.0)
    >>> pre = sinkflow.equiangular_flow(6, 0.0, beta=2.0, norm="pre", T=8.0)
    >>> bool(1 - post.rho[-1] < 1e-4 < 1 - pre.rho[-1])    # exponential against polynomial clustering
    True
    >>> peri = sinkflow.equiangular_flow(6, 0.0, beta=2.0, norm="peri", T=1.0)
    >>> round(float(peri.rho[-1]), 3), round(float(sinkflow.equiangular_flow(6, 0.0, beta=2.0, norm="pre").rho[-1]), 3)
    (0.284, 0.178)
    """
    n = check_number(n, "n", integer=True, positive=True)
    if n < 2:
        raise ValueError(f"n must be at least 2, got {n}")
    rho0 = _check_rho0(n, rho0)
    beta = float(check_number(beta, "beta", positive=True))
    check_choice(attention, "attention", EQUIANGULAR_ATTENTIONS)
    check_choice(integrator, "integrator", ("rk4", "euler"))
    placement = as_placement(norm)
    placement = Placement("none") if placement is None else placement
    if placement.normalization != "sphere":
        raise ValueError(f"equiangular_flow takes the unit-sphere normalization (an RMSNorm or LayerNorm radius "
                         f"sqrt(d) is beta * d), got normalization={placement.normalization!r}")
    T, h = float(check_number(T, "T", positive=True, allow_zero=True)), float(check_number(h, "h", positive=True))
    steps = round(T / h)
    field = _Reduced(n, rho0, beta, attention, placement, integrator == "euler", placement.switch(steps))
    M = (1.0, 0.0)
    coefficients = [M]
    for k in range(steps):
        t = k * h
        if integrator == "euler":
            M = field.moved(M, field.velocity(M, k, t), h, k)
        else:
            k1 = field.velocity(M, k, t)
            k2 = field.velocity(field.moved(M, k1, 0.5 * h, k), k, t + 0.5 * h)
            k3 = field.velocity(field.moved(M, k2, 0.5 * h, k), k, t + 0.5 * h)
            k4 = field.velocity(field.moved(M, k3, h, k), k, t + h)
            M = field.moved(M, tuple(a + 2 * b + 2 * c + d for a, b, c, d in zip(k1, k2, k3, k4, strict=True)),
                            h / 6, k)
        if not all(math.isfinite(c) for c in M):
            raise FloatingPointError(f"the equiangular flow left the floating-point range at step {k + 1} "
                                     f"(t = {(k + 1) * h:g}); use a smaller h or beta")
        coefficients.append(M)
    coefficients = np.array(coefficients)
    grams = np.array([field.gram(tuple(M)) for M in coefficients])
    return EquiangularFlow(times=np.arange(steps + 1) * h, rho=grams[:, 1] / grams[:, 0], r=np.sqrt(grams[:, 0]),
                           coefficients=coefficients, n=n, beta=beta, attention=attention, norm=placement.name,
                           integrator=integrator, h=h)
