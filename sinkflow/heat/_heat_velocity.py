"""The velocity of the rescaled attention layer, whose flow tends to the heat (or porous-medium)
equation: the four layers (Sinkhorn, SoftMax with Gaussian or dot scores, the unnormalized
kernel) as attention variants with their scores, evaluated exactly or with landmarks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from sinkflow._backend import check_finite, check_float, check_number, from_torch, lift_half, to_torch
from sinkflow.attention._scores import dot_scores, gaussian_scores
from sinkflow.attention._variants import get_attention
from sinkflow.fields._dense_fields import attention_field
from sinkflow.fields._lowrank_fields import lowrank_attention_field

__all__ = ["NORMALIZATIONS", "HEAT_LAYERS", "heat_velocity"]


NORMALIZATIONS = ("sinkhorn", "softmax_gaussian", "softmax_dot", "unnormalized")


def _check_normalization(normalization: str) -> str:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    return normalization


def _check_eps(eps) -> float:
    return float(check_number(eps, "eps (kernel bandwidth squared)", positive=True))


def _positions(x0) -> tuple[torch.Tensor, bool]:
    numpy_out = not isinstance(x0, torch.Tensor)
    x = to_torch(x0, "x0")
    check_float(x, "x0")
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        raise ValueError(f"particle positions must have shape (n, d) with n >= 2, got {tuple(x.shape)}")
    check_finite(x.detach(), "x0")
    return x, numpy_out  # a tensor requiring grad keeps its graph (the flow is differentiable)


def _default_tol(x: torch.Tensor, tol, eps: float) -> float:
    """Sinkhorn tolerance tied to the bandwidth.

    Measured (1D mixtures, n = 800-2000): a marginal error ``tol`` perturbs the velocity by
    about ``3 tol / eps`` relative. The flow's own bias is ``eps / (4 s)`` relative
    (symbolic.sinkhorn_variance_rate_gaussian), so ``tol = eps^2 / 100`` keeps the solver's
    perturbation below the modelling error: about a tenth of it at moderate ``eps``, a
    quarter at ``eps = 0.01`` (measured 0.064 eps against 0.25 eps); clipped to
    [floor, 1e-4], the floor being the float32 log-domain accuracy (docs/performance.md) or
    1e-10 in float64.
    """
    if tol is not None:
        return float(check_number(tol, "tol", positive=True))
    floor = 1e-10 if x.dtype == torch.float64 else 2e-6
    return min(max(eps * eps / 100, floor), 1e-4)


#: The heat layer's own names: (attention variant, scores). Any other registered variant
#: (:func:`sinkflow.available_attentions`) runs on the Gaussian scores of this module.
HEAT_LAYERS = {"sinkhorn": ("sinkhorn", "gaussian"), "softmax_gaussian": ("softmax", "gaussian"),
               "softmax_dot": ("softmax", "dot"), "unnormalized": ("gaussian", "gaussian")}


@dataclass(frozen=True)
class _Layer:
    name: str
    variant: Any
    scores: str


def _heat_layer(normalization) -> _Layer:
    variant, scores = HEAT_LAYERS.get(normalization, (normalization, "gaussian"))
    try:
        variant = get_attention(variant)
    except ValueError:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS} or an attention variant "
                         f"(sinkflow.available_attentions()), got {normalization!r}") from None
    if variant.normalize is None and variant.approximates is None:
        raise ValueError(f"attention {variant.name!r} is output-only (models); the heat layer needs a normalize")
    return _Layer(getattr(normalization, "name", normalization), variant, scores)


def _symmetric_velocity(x: torch.Tensor, eps: float, layer: _Layer, g, tol, max_iter):
    """The Sinkhorn layer on its symmetric PSD kernel, by the particles' symmetric solver (one
    exponential pass, a few Newton or heavy-ball iterations from the warm start); None where that
    solver does not apply (a graph to keep, a user variant; half precision was lifted by :func:`_velocity`)."""
    variant = layer.variant
    if variant.solver != "sinkhorn" or (torch.is_grad_enabled() and x.requires_grad):
        return None
    ev = attention_field(x, dataclasses.replace(variant, scores=layer.scores), None, None, temperature=eps,
                         init_g=g, tol=tol, max_iter=max_iter, need_errors=True, symmetric=True)
    return ev.velocity, ev.attention.sum(1), (ev.g, ev.n_iter, max(ev.row_error, ev.column_error), ev.converged)


def _scores(x: torch.Tensor, eps: float, layer: _Layer) -> torch.Tensor:
    """The layer's scores of the particles with each other, in a fresh buffer."""
    return dot_scores(x, x, temperature=eps) if layer.scores == "dot" else gaussian_scores(x, x, temperature=eps)


def _softmax_velocity(x: torch.Tensor, eps: float, layer: _Layer):
    """A SoftMax layer without its normalized matrix: ``E = exp(C - max_j C_ij)`` in the scores' buffer,
    then ``K x = (E x) / (E 1)`` from one product with ``[x, 1]`` (one n x n pass fewer, and no second
    n x n allocation); None under autograd (the graph of :func:`sinkflow.softmax` is kept) or for another
    layer."""
    if layer.variant.solver != "row" or (torch.is_grad_enabled() and x.requires_grad):
        return None
    C = _scores(x, eps, layer)
    E = C.sub_(C.amax(1, keepdim=True)).exp_()  # C is a fresh buffer
    P = E @ torch.cat([x, torch.ones_like(x[:, :1])], 1)
    return P[:, :-1] / P[:, -1:], torch.ones_like(x[:, 0]), (None, 1, 0.0, True)


def _kernel_velocity(x: torch.Tensor, eps: float, layer: _Layer, g, tol, max_iter):
    """Dense: K [1, x] and Sinkhorn diagnostics."""
    fast = _symmetric_velocity(x, eps, layer, g, tol, max_iter)
    if fast is None:
        fast = _softmax_velocity(x, eps, layer)
    if fast is not None:
        return fast
    n = x.shape[0]
    C = _scores(x, eps, layer)
    variant = layer.variant
    if variant.approximates is not None:
        raise ValueError(f"attention {variant.name!r} approximates {variant.approximates!r} with landmarks; pass "
                         "landmarks=m")
    if variant.normalization == "sinkhorn" and g is None:
        # Cold start from the symmetric approximation K_ij ~ G_ij / sqrt((G1)_i (G1)_j):
        # measured 20x fewer iterations than epsilon scaling (n = 2000, eps = 0.02-0.05).
        g = -0.5 * torch.logsumexp(C, dim=-1)
    if not variant.normalized:
        C = C.sub_(math.log(n))  # kernel a_j e^{C_ij}, a_j = 1/n (C is a fresh buffer)
    res = variant.normalize(C, n_iter=None, tol=tol, max_iter=max_iter, init_g=g)
    K = res.attention
    return K @ x, K.sum(1), (res.g, res.n_iter, res.marginal_error, res.converged)


def _landmark_velocity(x, eps, layer: _Layer, g, tol, max_iter, landmarks):
    variant = layer.variant
    V = torch.cat([torch.ones_like(x[:, :1]), x], 1)
    r = lowrank_attention_field(x, V, landmarks, normalization=variant.normalization, scores=layer.scores,
                                method=variant.landmark_method, temperature=eps, tol=tol, max_iter=max_iter, init_g=g)
    err = r.column_error if variant.normalization == "sinkhorn" else 0.0
    return r.velocity[:, 1:], r.velocity[:, 0], (r.g, r.n_iter, err, r.converged)


def _velocity(x: torch.Tensor, eps: float, layer: _Layer, g=None, tol=1e-6, max_iter=5000, landmarks=None):
    """Velocity (n, d) and Sinkhorn diagnostics (g, potential updates, marginal error, converged).

    float16 / bfloat16 particles are computed in float32 (half scores |x|^2 / (2 eps) would carry
    errors of several percent into the kernel; torch has no half eigh for landmarks), and the
    velocity is returned in their dtype.
    """
    out_dtype = x.dtype
    x, g = lift_half(x, g)
    if landmarks is None:
        Kx, mass, info = _kernel_velocity(x, eps, layer, g, tol, max_iter)
    else:
        Kx, mass, info = _landmark_velocity(x, eps, layer, g, tol, max_iter, landmarks)
    if layer.variant.normalization == "none":  # the heat layer's kernel density (2 pi eps)^(-d/2)
        scale = (2 * math.pi * eps) ** (-x.shape[1] / 2)
        Kx, mass = Kx * scale, mass * scale
    # sum_j K_ij (x_j - x_i), written without an (n, n, d) temporary
    drift = Kx - mass[:, None] * x
    return drift.mul_(-2.0 / eps).to(out_dtype), info


def heat_velocity(x, eps: float, normalization: str = "sinkhorn", *, tol: float | None = None):
    r"""The rescaled attention velocity :math:`-\frac{2}{\varepsilon}\sum_j K_{ij}(x_j - x_i)`.

    Parameters
    ----------
    x : array or tensor (n, d)
        Particle positions (floating dtype; float64 for theory checks).
    eps : float
        Kernel bandwidth squared, :math:`W = I/\varepsilon`.
    normalization : {"sinkhorn", "softmax_gaussian", "softmax_dot", "unnormalized"}
    tol : float, optional
        Sinkhorn marginal tolerance (default ``eps**2 / 100`` clipped to [1e-10, 1e-4];
        the float32 floor is 2e-6).

    Returns
    -------
    v : same type as ``x``, shape (n, d)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x = np.random.default_rng(0).normal(size=(50, 2))
    >>> v = sinkflow.heat_velocity(x, 0.3, tol=1e-10)
    >>> bool(np.abs(v.mean(0)).max() < 1e-8)  # Sinkhorn conserves the mean (up to tol)
    True
    >>> bool(np.abs(sinkflow.heat_velocity(x, 0.3, "softmax_gaussian").mean(0)).max() > 1e-3)
    True
    """
    xt, numpy_out = _positions(x)
    v, _ = _velocity(xt, _check_eps(eps), _heat_layer(normalization), tol=_default_tol(xt, tol, eps))
    return from_torch(v, numpy_out)
