"""How large a step a particle flow takes safely: a Lipschitz scale of the attention field,
the largest step without overshoot for Euler and RK4, and the warning when a step exceeds it.
"""

from __future__ import annotations

import math

import torch

from sinkflow._backend import check_float, check_number, squared_norms, to_torch
from sinkflow._checks import check_choice, warn_caller
from sinkflow.attention._variants import get_attention
from sinkflow.fields._dense_fields import check_matrix
from sinkflow.particles._integrators import INTEGRATORS

__all__ = ["lipschitz_scale", "largest_safe_step"]


def lipschitz_scale(x: torch.Tensor, W: torch.Tensor | None, W_V: torch.Tensor | None, temperature: float) -> float:
    r"""Cheap estimate of the Lipschitz constant of a normalized attention field at ``x``.

    :math:`T(x_i) = \sum_j K_{ij} W_V x_j` with rows of :math:`K` summing to 1 moves by
    :math:`\|W_V\|` through the values and by :math:`\|W_V\| R \cdot 2\|W\| R / \tau` through
    the weights (:math:`\partial K_{ij}/\partial x_i` is a covariance of :math:`W x_j/\tau`
    over a row, bounded by the product of their spreads, :math:`R^2 = \mathrm{mean}_i |x_i|^2`):
    :math:`L \approx \|W_V\|_2 (1 + 2\|W\|_2 R^2/\tau)`. Explicit Euler with
    :math:`h L > 2` can overshoot (the stability limit of :math:`\dot y = -L y`).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.particles import lipschitz_scale
    >>> lipschitz_scale(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), None, None, 1.0)
    3.0
    """
    x = x.detach().to(torch.float64)
    R2 = float((x * x).sum()) / max(x.shape[0], 1)  # mean_i |x_i|^2 of one system; the rest in Python floats
    return float(_norm(W_V)) * (1 + 2 * float(_norm(W)) * R2 / temperature)


def _lipschitz(x, W, W_V, temperature):
    """:func:`lipschitz_scale` of each system of a batch ``x`` (``(..., n, d)``), as a float64 tensor."""
    R2 = squared_norms(x.detach().to(torch.float64)).mean(-1)
    return _norm(W_V) * (1 + 2 * _norm(W) * R2 / temperature)


def _norm(M):
    """The spectral norm of ``M`` (``(..., d, d)``) in float64; 1.0 for None (the identity)."""
    return 1.0 if M is None else torch.linalg.matrix_norm(M.detach().to(torch.float64), 2)


def _interaction_matrix(Wq, Wk, d, like):
    if Wq is None and Wk is None:
        return None
    eye = torch.eye(d, dtype=like.dtype, device=like.device)
    return (Wq if Wq is not None else eye).T @ (Wk if Wk is not None else eye)


def largest_safe_step(x0, attention="sinkhorn", W_Q=None, W_K=None, W_V=None, *, temperature: float = 1.0,
                      integrator: str = "euler") -> float:
    r"""Largest step ``h`` that :func:`simulate` accepts without its overshoot warning.

    ``2 / L`` for Euler and ``2.78 / L`` for RK4 (their stability limits on
    :math:`\dot y = -L y`), with :math:`L` the estimate :func:`lipschitz_scale` at ``x0``;
    ``inf`` for the unnormalized kernel, which has no useful global scale. The warning of
    :func:`simulate` quotes this number.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.particles import largest_safe_step
    >>> x0 = np.array([[1.0, 0.0], [0.0, 1.0]])      # R^2 = 1, W = I: L = 1 + 2 / tau
    >>> largest_safe_step(x0, "softmax", temperature=0.5)
    0.4
    """
    X = to_torch(x0, "x0")
    check_float(X, "x0")
    if X.ndim != 2:
        raise ValueError(f"x0 must have shape (n, d), got {tuple(X.shape)}")
    check_choice(integrator, "integrator", INTEGRATORS)
    Wq, Wk, Wv = (check_matrix(M, name, X.shape[1], X) for M, name in ((W_Q, "W_Q"), (W_K, "W_K"), (W_V, "W_V")))
    return _safe_step(X, _interaction_matrix(Wq, Wk, X.shape[1], X), Wv, float(temperature),
                      get_attention(attention), integrator)


def _safe_step(X, W, Wv, tau, variant, integrator) -> float:
    if not variant.normalized and variant.approximates is None:
        return math.inf  # unnormalized kernels grow like exp(R^2): no useful global scale
    return (2.0 if integrator == "euler" else 2.78) / lipschitz_scale(X, W, Wv, tau)


def _check_step_size(h, X, W, Wv, tau, variant, integrator, L=None):
    """The warning when ``h`` exceeds the largest safe step at ``X`` (``L``: its Lipschitz scale, when known)."""
    h = check_number(h, "h", positive=True)
    if L is None or (not variant.normalized and variant.approximates is None):
        limit = _safe_step(X, W, Wv, tau, variant, integrator)
    else:
        limit = (2.0 if integrator == "euler" else 2.78) / L
    if h > limit:
        warn_caller(f"step h={float(h):g} exceeds the largest safe step h = {limit:.3g} of attention="
                      f"{variant.name!r} ({integrator}) at temperature={tau:g} (2/L for Euler, 2.78/L for RK4, with "
                      f"the Lipschitz estimate L ~ {2.0 / limit if integrator == 'euler' else 2.78 / limit:.3g} of "
                      "sinkflow.particles.lipschitz_scale; sinkflow.particles.largest_safe_step): the steps may "
                      "overshoot", RuntimeWarning)


def _symmetric_psd(W) -> bool:
    """Whether ``W`` (``(..., d, d)``, None = identity) is symmetric to rounding and positive semi-definite."""
    if W is None:
        return True
    Wd = W.detach()
    eps = 8 * torch.finfo(Wd.dtype).eps * max(float(Wd.abs().amax()), 1e-300)
    if float((Wd - Wd.mT).abs().amax()) > eps:
        return False
    return bool((torch.linalg.eigvalsh(Wd.to(torch.float64)).amin() >= -eps * Wd.shape[-1]).item())
