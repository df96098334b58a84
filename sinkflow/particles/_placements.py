r"""Where a residual attention layer normalizes: Post-LN, Pre-LN, Peri-LN, Mix-LN, nGPT and LN-scaling
(docs/theory/placements.md).

A :class:`Placement` is a small frozen object that :func:`sinkflow.simulate` composes with the attention
field (``norm=`` keyword): it says how one layer maps ``x`` to ``x_next`` given the attention field
:math:`A(x)_i = \sum_j K_{ij}(x) W_V x_j`, and which ODE is its continuous-depth model. ``N`` is the
normalization (``"sphere"``: :math:`x/|x|`, the papers' unit sphere; ``"rms"``: RMSNorm without affine
parameters, :math:`\sqrt d\, x/|x|`; ``"layer"``: LayerNorm without affine parameters,
:math:`\sqrt d\, (x - \bar x 1)/|x - \bar x 1|`).

=========  ===================================================  ==============================================
``norm``   layer (``integrator="euler"``, step ``h``)            continuous model (``integrator="rk4"``)
=========  ===================================================  ==============================================
post       :math:`x \leftarrow N(x + h A(x))`                    :math:`\dot x = P_x A(x)` on the sphere
pre        :math:`x \leftarrow x + h A(N(x))`                    :math:`\dot x = A(N(x))`
peri       :math:`x \leftarrow x + h N(A(N(x)))`                 :math:`\dot x = N(A(N(x)))`
mix        post for the first ``split`` of the layers, then pre   the same switch at the same time
ngpt       :math:`x \leftarrow N(x + \alpha h (N(A(x)) - x))`    :math:`\dot x = \alpha P_x N(A(x))`
lnscale    :math:`x \leftarrow x + h A(N(x)) / \sqrt{1 + l h}`   :math:`\dot x = A(N(x)) / \sqrt{1 + t}`
=========  ===================================================  ==============================================

``P_x = I - x x^T/|x|^2`` projects on the tangent space; ``l = 0, 1, ...`` counts the layers, so at
``h = 1`` LN-scaling divides layer ``l + 1`` by :math:`\sqrt{l + 1}`. Each layer is the explicit Euler step
of its continuous model (Post-LN and nGPT up to a retraction that agrees to first order), hence of order 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sinkflow._checks import check_choice, check_number
from sinkflow.fields._particle_field import advanced, tangent

__all__ = ["Placement", "placement", "PLACEMENTS", "PLACEMENT_NORMALIZATIONS", "PlacedField"]

#: The placements of the normalization (``norm=`` of :func:`sinkflow.simulate`).
PLACEMENTS = ("none", "post", "pre", "peri", "mix", "ngpt", "lnscale")
#: The normalizations ``N`` a placement may use.
PLACEMENT_NORMALIZATIONS = ("sphere", "rms", "layer")
#: Placements whose state lies on the normalized set (``x0`` must be normalized).
_ON_SPHERE = ("post", "ngpt", "mix")


@dataclass(frozen=True)
class Placement:
    r"""A normalization placement of a residual attention layer (module docstring; build one with :func:`placement`).

    Attributes
    ----------
    name : str
        One of :data:`PLACEMENTS`.
    normalization : {"sphere", "rms", "layer"}
        The map ``N``: :math:`x/|x|` (radius 1), RMSNorm :math:`\sqrt d\, x/|x|` or LayerNorm
        :math:`\sqrt d\, P_1 x/|P_1 x|` (:math:`P_1` removes the mean of the coordinates), both without
        affine parameters. A radius :math:`\sqrt d` multiplies the scores :math:`\beta \langle x_i, x_j\rangle`
        by ``d``: the effective inverse temperature is :math:`\beta d` (and the values are :math:`\sqrt d`
        times longer).
    split : float
        Mix-LN: the fraction of the layers (of ``steps``) run as Post-LN before switching to Pre-LN.
    alpha : float
        nGPT: its step is :math:`\alpha h` (at ``h = 1``, one unit of time a layer, :math:`\alpha` is nGPT's
        own step size); its continuous model :math:`\dot x = \alpha P_x N(A(x))`.
    """

    name: str
    normalization: str = "sphere"
    split: float = 0.25
    alpha: float = 1.0

    def normalize(self, X: torch.Tensor) -> torch.Tensor:
        """``N(X)`` row by row (the last dimension)."""
        if self.normalization == "layer":
            X = X - X.mean(-1, keepdim=True)
        unit = X / X.norm(dim=-1, keepdim=True)
        return unit if self.normalization == "sphere" else unit * math.sqrt(X.shape[-1])

    @property
    def on_sphere(self) -> bool:
        """Whether the flow starts on the normalized set (Post-LN, nGPT, Mix-LN)."""
        return self.name in _ON_SPHERE

    def switch(self, steps: int) -> int:
        """The first Pre-LN layer of a Mix-LN run of ``steps`` layers (``steps`` for the others: never)."""
        return math.floor(self.split * steps + 0.5) if self.name == "mix" else steps

    def phase(self, layer: int, switch: int) -> str:
        """The placement that layer ``layer`` (from 0) runs: Mix-LN's post or pre, else this one."""
        if self.name != "mix":
            return self.name
        return "post" if layer < switch else "pre"

    def tangent(self, v: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        r""":math:`P_Y v = v - \langle v, y\rangle y / |y|^2` row by row (``|y| = 1`` taken as exact on the unit
        sphere, as the sphere flow of :func:`sinkflow.simulate` does)."""
        if self.normalization == "sphere":
            return tangent(v, Y)  # as the sphere flow's field: bit for bit
        return v - (v * Y).sum(-1, keepdim=True) / (Y * Y).sum(-1, keepdim=True) * Y

    def velocity(self, attend, Y: torch.Tensor, layer: int, t, discrete: bool, switch: int):
        """The step direction at ``Y`` of layer ``layer`` (time ``t`` of the stage) and the field's evaluation.

        ``attend(Z)`` returns ``(A(Z), evaluation)``. ``discrete``: the practitioners' layer (Euler, the
        retraction of :meth:`retracts` applied after the step); else the continuous model.
        """
        name, N = self.phase(layer, switch), self.normalize
        if name == "post":
            v, ev = attend(Y)
            return (v if discrete else self.tangent(v, Y)), ev
        if name == "ngpt":
            v, ev = attend(Y)
            u = N(v)
            w = u - Y if discrete else self.tangent(u, Y)
            return (w if self.alpha == 1 else self.alpha * w), ev
        v, ev = attend(N(Y))
        if name == "peri":
            return N(v), ev
        if name == "lnscale":
            return v / torch.sqrt(1 + torch.as_tensor(t, dtype=v.dtype, device=v.device)), ev
        return v, ev  # pre

    def retracts(self, layer: int, switch: int) -> bool:
        """Whether a step of layer ``layer`` ends with ``N`` (Post-LN, nGPT, Mix-LN's post layers)."""
        return self.phase(layer, switch) in ("post", "ngpt")


def placement(name: str, *, normalization: str = "sphere", split: float = 0.25, alpha: float = 1.0) -> Placement:
    r"""A normalization placement for :func:`sinkflow.simulate`'s ``norm=`` (a name there means the defaults).

    Parameters
    ----------
    name : {"none", "post", "pre", "peri", "mix", "ngpt", "lnscale"}
        Post-LN :math:`x \leftarrow N(x + h A(x))`, Pre-LN :math:`x \leftarrow x + h A(N(x))`, Peri-LN
        :math:`x \leftarrow x + h N(A(N(x)))`, Mix-LN (Post-LN for the first ``split`` of the layers, then
        Pre-LN), nGPT :math:`x \leftarrow N(x + \alpha h(N(A(x)) - x))`,
        LN-scaling (Pre-LN with layer ``l`` scaled by :math:`1/\sqrt{1 + l h}`, ``l`` from 0), or none.
    normalization : {"sphere", "rms", "layer"}
        ``N``: the unit sphere :math:`x/|x|`; RMSNorm or LayerNorm without affine parameters (radius
        :math:`\sqrt d`: the scores, hence the effective :math:`\beta`, are ``d`` times larger).
    split : float
        Mix-LN's fraction of Post-LN layers, in [0, 1] (0.25 by default).
    alpha : float
        nGPT's step relative to ``h`` (> 0; 1 by default: nGPT moves as far as a Post-LN layer's step).

    Returns
    -------
    Placement

    Examples
    --------
    >>> import torch, sinkflow
    >>> p = sinkflow.placement("mix", split=0.5)
    >>> p.switch(10), p.phase(4, 5), p.phase(5, 5)
    (5, 'post', 'pre')
    >>> x = torch.tensor([[3.0, 4.0]])
    >>> sinkflow.placement("pre").normalize(x), sinkflow.placement("pre", normalization="rms").normalize(x)
    (tensor([[0.6000, 0.8000]]), tensor([[0.8485, 1.1314]]))
    """
    check_choice(name, "norm", PLACEMENTS)
    check_choice(normalization, "normalization", PLACEMENT_NORMALIZATIONS)
    if isinstance(split, bool) or not isinstance(split, (int, float)) or not 0 <= split <= 1:
        raise ValueError(f"split must be a number in [0, 1], got {split!r}")
    alpha = float(check_number(alpha, "alpha", positive=True))
    return Placement(name, normalization, float(split), alpha)


def as_placement(norm) -> Placement | None:
    """``norm=`` of :func:`sinkflow.simulate` checked: None (today's flow) or a :class:`Placement`."""
    if norm is None or isinstance(norm, Placement):
        return norm
    if not isinstance(norm, str):
        raise TypeError(f"norm must be None, a name in {PLACEMENTS} or a sinkflow.placement(...), got {norm!r}")
    return placement(norm)


class PlacedField:
    """An attention field (:class:`~sinkflow.particles.ParticleField` or an ensemble's) composed with a
    :class:`Placement`: what the integrators step with, the same ``velocity`` / ``moved`` interface.

    It counts its evaluations to know the layer and the stage (RK4's stages at :math:`t, t + h/2, t + h/2,
    t + h`); every other attribute is the wrapped field's.
    """

    _OFFSETS = {1: (0.0,), 4: (0.0, 0.5, 0.5, 1.0)}

    def __init__(self, field, placement: Placement, h, steps: int, discrete: bool):
        self.field, self.placement, self.h, self.discrete = field, placement, h, discrete
        self.switch = placement.switch(steps)
        self.evaluations = 0

    def __getattr__(self, name):
        if name == "field":
            raise AttributeError(name)
        return getattr(self.field, name)

    def velocity(self, Y: torch.Tensor):
        stages = self.field.stages
        layer, stage = divmod(self.evaluations, stages)
        self.evaluations += 1
        t = (layer + self._OFFSETS[stages][stage]) * self.h
        return self.placement.velocity(self.field.velocity, Y, layer, t, self.discrete, self.switch)

    def moved(self, X: torch.Tensor, v: torch.Tensor, h) -> torch.Tensor:
        layer = (self.evaluations - 1) // self.field.stages
        Y = advanced(X, v, h)  # as ParticleField.moved
        if not self.placement.retracts(layer, self.switch):
            return Y
        if self.placement.normalization == "sphere":
            return Y / torch.linalg.vector_norm(Y, dim=-1, keepdim=True)  # as ParticleField.retract: bit for bit
        return self.placement.normalize(Y)


def placed(field, placement: Placement | None, h, steps: int, integrator: str):
    """``field`` composed with ``placement`` (unchanged for None or ``"none"``)."""
    if placement is None or placement.name == "none":
        return field
    return PlacedField(field, placement, h, steps, discrete=integrator == "euler")


def check_placed_start(X: torch.Tensor, placement: Placement | None) -> None:
    """Post-LN, nGPT and Mix-LN start on the normalized set: ``N(x0) = x0``."""
    if placement is None or not placement.on_sphere:
        return
    X = X.detach()
    radius = 1.0 if placement.normalization == "sphere" else math.sqrt(X.shape[-1])
    Y = X.float() if X.dtype in (torch.float16, torch.bfloat16) else X
    gap = float((placement.normalize(Y) - Y).abs().max()) if X.numel() else 0.0
    tol = radius * max(1e-6, 8 * torch.finfo(X.dtype).eps)  # float16 / bfloat16 round a unit vector to ~eps
    if not math.isfinite(gap) or gap > tol:
        raise ValueError(f"x0 must be normalized for norm={placement.name!r} (N(x0) = x0 with normalization "
                         f"{placement.normalization!r}; off by {gap:.3g}): pass placement.normalize(x0)")
