r"""Energies of attention flows and the checks that they are (or are not) gradient flows.

docs/theory/gradient_flows.md. For particles :math:`x_i` with weights :math:`a_i` (the measure
:math:`\mu = \sum_i a_i \delta_{x_i}`) and a bilinear form :math:`W` (temperature folded in):

- :func:`energy_0`: :math:`F^0(\mu) = -\tfrac12 \iint e^{x^T W y}\, d\mu\, d\mu`;
- :func:`energy_inf`: :math:`F^\infty(\mu) = \tfrac12 \mathrm{OT}_1(\mu, \mu)` with
  :math:`\mathrm{OT}_\varepsilon(\mu, \nu) = \min_{\pi \in \Pi(\mu, \nu)} \int c\, d\pi
  + \varepsilon \mathrm{KL}(\pi \,|\, \mu \otimes \nu)` and :math:`c(x, y) = -x^T W y`
  (:func:`entropic_ot`);
- :func:`energy_log_partition`: :math:`F^1(\mu) = -\tfrac12 \int \log Z_\mu\, d\mu`,
  :math:`Z_\mu(x) = \int e^{x^T W y} d\mu(y)`: the natural candidate for SoftMax, whose
  field is :math:`\nabla \log Z_\mu` but which is *not* a gradient flow of it (nor of
  anything: its Jacobian is not symmetric);
- :func:`energy_sphere`: :math:`E_\beta = \frac{1}{2\beta} \sum_{ij} a_i a_j e^{\beta \langle x_i, x_j\rangle}`
  (Geshkovski et al.; docs/theory/sphere.md).

Sign convention (verified in ``tests/particles/test_energies.py``)
--------------------------------------------------------
With :math:`W` symmetric and **values** :math:`W_V = +W`, the attention field is the
Wasserstein gradient *descent* direction:

.. math:: T(x_i) = \sum_j K_{ij} W x_j = -\frac{1}{a_i} \nabla_{x_i} F(\mu)

(``= -n grad F`` for uniform weights), for :math:`K^0` with :math:`F^0` and :math:`K^\infty`
with :math:`F^\infty`. Hence :math:`dF/dt = -\int |T|^2 d\mu \le 0`; with :math:`W_V = -W`
the energy increases. On the sphere the field with :math:`Q = K = V = I` and
:math:`Z_i = n` is :math:`n \nabla E_\beta` projected: gradient *ascent* of :math:`E_\beta`.

Gradients are taken by torch autograd in float64. :math:`F^\infty` is differentiated by the
envelope theorem: the dual objective is evaluated at the converged (detached) Sinkhorn
potentials, whose gradient in :math:`x` equals that of the optimal value (Danskin).
"""

from __future__ import annotations

import torch

from sinkflow._backend import check_finite, check_float, check_number, leading, to_torch
from sinkflow.attention._normalizations import solve_sinkhorn
from sinkflow.attention._scores import gaussian_scores
from sinkflow.attention._variants import get_attention
from sinkflow.fields._dense_fields import attention_field, check_matrix, check_weights, single_thread_if_small

__all__ = [
    "energy_0",
    "energy_gaussian",
    "energy_inf",
    "energy_log_partition",
    "energy_sphere",
    "entropic_ot",
    "gradient_flow_error",
    "jacobian_asymmetry",
]


# ----------------------------------------------------------------------------------------
# input handling


def _points(x, name="x", *others):
    """``x`` as a tensor and whether the result is numpy (no array input, ``others`` included, is torch)."""
    X, numpy_out = leading(x, name, *others)
    check_float(X, name)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"{name} must have shape (n, d) with n >= 1, got {tuple(X.shape)}")
    check_finite(X.detach(), name)
    return X, numpy_out


def _form(W, X, name="W"):
    Wt = check_matrix(W, name, X.shape[1], X)
    return torch.eye(X.shape[1], dtype=X.dtype, device=X.device) if Wt is None else Wt


def _weights(weights, X, name="weights"):
    a = check_weights(weights, X, name)
    return torch.full((X.shape[0],), 1.0 / X.shape[0], dtype=X.dtype, device=X.device) if a is None else a


def _scalar(t: torch.Tensor, numpy_out: bool):
    return float(t) if numpy_out else t


def require_symmetric(W: torch.Tensor, what: str) -> None:
    """Raise if ``W`` is not symmetric: the gradient-flow theorem needs it."""
    scale = float(W.detach().abs().max()) or 1.0
    if float((W.detach() - W.detach().T).abs().max()) > 1e-12 * scale * W.shape[0]:
        raise ValueError(
            f"{what} needs a symmetric W (and values W_V = W): the theorem T = -grad dF/dmu "
            "(Sinkformers, docs/theory/gradient_flows.md) differentiates x^T W y in both arguments, which gives "
            "(W + W^T)/2, so only for W = W^T is the attention field a gradient; symmetrize W first, "
            "e.g. (W + W.T) / 2.")


# ----------------------------------------------------------------------------------------
# energies


def energy_0(x, W=None, weights=None):
    r"""Unnormalized energy :math:`F^0(\mu) = -\tfrac12 \sum_{ij} a_i a_j e^{x_i^T W x_j}`.

    Parameters
    ----------
    x : array (n, d)
        Particles.
    W : array (d, d), optional
        Bilinear form (identity by default; fold a temperature in as ``W / tau``).
    weights : array (n,), optional
        Positive weights summing to 1 (uniform by default).

    Returns
    -------
    float (numpy input) or 0-d tensor (torch input, differentiable)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.energy_0(np.zeros((3, 2)))
    -0.5
    """
    X, numpy_out = _points(x, "x", W, weights)
    Wt, a = _form(W, X), _weights(weights, X)
    return _scalar(-0.5 * _pair_mass(X @ Wt @ X.T, a), numpy_out)


def energy_gaussian(x, W=None, weights=None):
    r"""Gaussian-kernel energy :math:`-\tfrac12 \sum_{ij} a_i a_j e^{-\|x_i - x_j\|_W^2 / 2}`.

    The analogue of :math:`F^0` for Skyformer's kernel (the ``"energy"`` monitor of the
    ``"gaussian"`` attention kind). Its gradient flow has values :math:`W(x_j - x_i)`, not
    :math:`W x_j`, so the attention field is not exactly its gradient.

    Parameters
    ----------
    x, W, weights
        As in :func:`energy_0` (``W`` symmetric positive semi-definite).

    Returns
    -------
    float or 0-d tensor

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.energy_gaussian(np.zeros((3, 2)))
    -0.5
    """
    X, numpy_out = _points(x, "x", W, weights)
    Wt, a = _form(W, X), _weights(weights, X)
    return _scalar(-0.5 * _pair_mass(gaussian_scores(X, X, Wt), a), numpy_out)


def _pair_mass(S, a):
    r""":math:`\sum_{ij} a_i a_j e^{S_{ij}}`, log-sum-exp stable."""
    la = torch.log(a)
    return torch.exp(torch.logsumexp((S + la[:, None] + la[None, :]).reshape(-1), 0))


def energy_log_partition(x, W=None, weights=None):
    r"""SoftMax's candidate energy :math:`F^1(\mu) = -\tfrac12 \sum_i a_i \log \sum_j a_j e^{x_i^T W x_j}`.

    The SoftMax field is :math:`\nabla_x \log Z_\mu(x)`, the first term of this functional's
    first variation; the second term (the derivative through :math:`\mu` inside
    :math:`Z_\mu`) does not match, so SoftMax is not a gradient flow of :math:`F^1`
    (:func:`gradient_flow_error` measures by how much).

    Parameters
    ----------
    x, W, weights
        As in :func:`energy_0`.

    Returns
    -------
    float or 0-d tensor

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.energy_log_partition(np.zeros((3, 2)))
    -0.0
    """
    X, numpy_out = _points(x, "x", W, weights)
    Wt, a = _form(W, X), _weights(weights, X)
    C = X @ Wt @ X.T + torch.log(a)[None, :]
    return _scalar(-0.5 * (a * torch.logsumexp(C, 1)).sum(), numpy_out)


def energy_sphere(x, beta=1.0, weights=None):
    r"""Interaction energy on the sphere
    :math:`E_\beta = \frac{1}{2\beta} \sum_{ij} a_i a_j e^{\beta \langle x_i, x_j\rangle}`.

    With uniform weights this is :math:`\frac{1}{2\beta n^2}\sum_{ij} e^{\beta\langle x_i, x_j\rangle}`
    (docs/theory/sphere.md); the unnormalized flow on the sphere is its projected gradient ascent.

    Parameters
    ----------
    x : array (n, d)
        Points (on the unit sphere for the theory; not enforced here).
    beta : float
        Inverse temperature :math:`\beta > 0`.
    weights : array (n,), optional

    Returns
    -------
    float or 0-d tensor

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x = np.array([[1.0, 0.0], [1.0, 0.0]])   # one cluster: E = e^beta / (2 beta)
    >>> bool(np.isclose(sinkflow.energy_sphere(x, beta=2.0), np.exp(2.0) / 4))
    True
    """
    beta = check_number(beta, "beta", positive=True)
    X, numpy_out = _points(x, "x", weights)
    a = _weights(weights, X)
    return _scalar(_pair_mass(float(beta) * (X @ X.T), a) / (2 * float(beta)), numpy_out)


def entropic_ot(x, y, W=None, a=None, b=None, *, tol=1e-12, max_iter=50_000):
    r"""Entropic optimal transport value :math:`\mathrm{OT}_1(\mu, \nu)` for the cost :math:`-x^T W y`.

    .. math:: \mathrm{OT}_1(\mu, \nu) = \min_{\pi \in \Pi(a, b)} \sum_{ij} \pi_{ij} c_{ij}
              + \sum_{ij} \pi_{ij} \log \frac{\pi_{ij}}{a_i b_j}

    (regularization :math:`\varepsilon = 1` and KL to the product measure, so the value
    is not POT's ``sinkhorn2``, which returns only :math:`\sum \pi c`). Computed with
    :func:`sinkflow.solve_sinkhorn` and returned as the dual value
    :math:`\sum_i a_i u_i + \sum_j b_j v_j` at the converged potentials, written so that
    autograd gives the exact gradient in ``x`` and ``y`` (envelope theorem).

    Parameters
    ----------
    x : array (n, d), y : array (m, d)
        Supports of :math:`\mu` and :math:`\nu`.
    W : array (d, d), optional
        Bilinear form (identity by default).
    a, b : arrays (n,), (m,), optional
        Weights (uniform by default).
    tol, max_iter
        Sinkhorn stopping rule (marginal error, half-iterations).

    Returns
    -------
    float or 0-d tensor

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> one = np.array([[1.0, 2.0]])          # a Dirac: the only plan, cost -|x|^2, KL 0
    >>> float(sinkflow.entropic_ot(one, one))
    -5.0
    """
    X, numpy_out = _points(x, "x", y, W, a, b)
    Y = to_torch(y, "y", like=X)
    if Y.ndim != 2 or Y.shape[1] != X.shape[1]:
        raise ValueError(f"y must have shape (m, {X.shape[1]}), got {tuple(Y.shape)}")
    check_finite(Y.detach(), "y")
    Wt = _form(W, X)
    a_ = _weights(a, X, "a")
    b_ = _weights(b, Y, "b")
    C = X @ Wt @ Y.T
    res = solve_sinkhorn(C.detach(), None, tol, max_iter, a=a_, b=b_, warn=True)
    # pi_ij = a_i K_ij = a_i b_j exp(u_i + v_j + C_ij) with u = f, v = g - log b
    u, v = res.f, res.g - torch.log(b_)
    lab = torch.log(a_)[:, None] + torch.log(b_)[None, :]
    mass = torch.exp(torch.logsumexp((u[:, None] + v[None, :] + C + lab).reshape(-1), 0))
    value = (a_ * u).sum() + (b_ * v).sum() - mass + 1  # dual objective; mass == 1 at the optimum
    return _scalar(value.to(X.dtype), numpy_out)  # float16 / bfloat16 potentials come back in float32


def energy_inf(x, W=None, weights=None, *, tol=1e-12):
    r"""Sinkhorn energy :math:`F^\infty(\mu) = \tfrac12 \mathrm{OT}_1(\mu, \mu)`, cost :math:`-x^T W y`.

    Parameters
    ----------
    x, W, weights
        As in :func:`energy_0`.
    tol : float
        Marginal error of the Sinkhorn solve.

    Returns
    -------
    float or 0-d tensor (differentiable, exact gradient by the envelope theorem)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x = np.random.default_rng(0).normal(size=(5, 2))
    >>> F = sinkflow.energy_inf(x)
    >>> bool(np.isclose(F, 0.5 * sinkflow.entropic_ot(x, x)))
    True
    """
    X, numpy_out = _points(x, "x", W, weights)
    return _scalar(0.5 * entropic_ot(X, X, W, weights, weights, tol=tol), numpy_out)


# ----------------------------------------------------------------------------------------
# gradient-flow checks

_ENERGY_OF = {"sinkhorn": energy_inf, "unnormalized": energy_0, "softmax": energy_log_partition}


def _field_fn(attention, Wt, a, n_iter, weights_given, Vt=None):
    def T(X):
        return attention_field(X, attention, Wt, Wt if Vt is None else Vt, n_iter=n_iter,
                               weights=a if weights_given else None, tol=1e-13, max_iter=100_000).velocity
    return T


def gradient_flow_error(x, attention="sinkhorn", W=None, weights=None, *, W_V=None) -> float:
    r"""Relative error between the attention field and :math:`-\frac{1}{a_i}\nabla_{x_i} F`.

    .. math:: \mathrm{err} = \frac{\| T + \mathrm{diag}(a)^{-1} \nabla F \|_F}{\| T \|_F},
              \qquad T(x_i) = \sum_j K_{ij} W_V x_j \quad (W_V = W \text{ by default})

    with :math:`F = F^\infty` for ``"sinkhorn"`` (run to convergence, tol 1e-13),
    :math:`F^0` for ``"unnormalized"`` and the candidate :math:`F^1` for ``"softmax"``
    (large error: SoftMax is not a gradient flow). Float64, gradient by torch autograd.

    Parameters
    ----------
    x : array (n, d)
    attention : {"sinkhorn", "unnormalized", "softmax"}
    W : array (d, d), optional
        Symmetric bilinear form (identity by default); the values are :math:`W_V = W` unless ``W_V`` is given.
    weights : array (n,), optional
    W_V : array (d, d), optional
        Another value matrix, to measure how far its field is from the gradient of the same
        :math:`F`: the error is then :math:`\|K (W_V - W) x\| / \|K W_V x\|` (0 for :math:`W_V = W`,
        :math:`|c - 1|/|c|` for :math:`W_V = cW`, a time change of the gradient flow;
        docs/theory/value_geometry.md).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``W`` is not symmetric (the theorem needs it), or for an attention kind with no
        energy here (``"gaussian"``).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x = np.random.default_rng(0).normal(size=(10, 2))
    >>> sinkflow.gradient_flow_error(x, "unnormalized") < 1e-12
    True
    >>> round(sinkflow.gradient_flow_error(x, "sinkhorn", W_V=[[1.0, 1.0], [-1.0, 1.0]]), 3)  # not a gradient
    0.707
    """
    if attention not in _ENERGY_OF:
        raise ValueError(f"gradient_flow_error compares with an energy for attention in {tuple(_ENERGY_OF)}, got "
                         f"{attention!r}")
    X0, _ = _points(x)
    X = X0.detach().to(torch.float64).clone().requires_grad_(True)
    Wt = _form(W, X).detach()
    require_symmetric(Wt, "gradient_flow_error")
    Vt = None if W_V is None else _form(W_V, X.detach(), "W_V").detach()
    a = _weights(weights, X.detach())
    with single_thread_if_small(X.shape[0], X.device):
        F = _ENERGY_OF[attention](X, Wt, a)
        (grad,) = torch.autograd.grad(F, X)
        with torch.no_grad():
            T = _field_fn(attention, Wt, a, None, weights is not None, Vt)(X.detach())
    return float(torch.linalg.norm(T + grad / a[:, None]) / torch.linalg.norm(T))


def jacobian_asymmetry(x, attention="sinkhorn", W=None, n_iter=None, weights=None) -> float:
    r"""Asymmetry :math:`\|J - J^T\|_F / \|J\|_F` of the particle-field Jacobian.

    :math:`J` is the ``(n d) x (n d)`` block matrix :math:`J_{(i,\cdot),(j,\cdot)} = \partial T(x_i) / \partial x_j`
    of :math:`T(x_i) = \sum_j K_{ij} W x_j` (``torch.autograd.functional.jacobian`` through the
    Sinkhorn iterations, float64). A gradient field :math:`T = -n \nabla F` has
    :math:`J = -n \nabla^2 F` symmetric: this is ~1e-10 for :math:`K^0` and :math:`K^\infty`
    and O(0.1) for SoftMax (docs/theory/gradient_flows.md). Uniform weights make ``J`` symmetric for a
    gradient flow; with other weights ``diag(a) J`` is the symmetric one, which is what is
    measured then.

    Parameters
    ----------
    x : array (n, d)
    attention : {"sinkhorn", "softmax", "unnormalized"} or another registered variant
        Any variant that forms its matrix from dot-product scores (``"orthostochastic"``,
        ``"lot"``; docs/theory/doubly_stochastic_variants.md measures them).
    W : array (d, d), optional
        Symmetric bilinear form; values :math:`W_V = W`.
    n_iter : int or None
        Sinkhorn half-iterations (``None``: converged, tol 1e-13); ``1`` is SoftMax.
    weights : array (n,), optional

    Returns
    -------
    float

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x = np.random.default_rng(0).normal(size=(6, 2))
    >>> sinkflow.jacobian_asymmetry(x, "sinkhorn") < 1e-8 < 1e-2 < sinkflow.jacobian_asymmetry(x, "softmax")
    True
    """
    variant = get_attention(attention)
    if variant.normalize is None or variant.scores != "dot":
        raise ValueError(f"attention must be a registered variant that forms its matrix from dot-product scores "
                         f"('sinkhorn', 'softmax', 'unnormalized', 'orthostochastic', 'lot', ...), got {attention!r}")
    X0, _ = _points(x)
    X = X0.detach().to(torch.float64)
    Wt = _form(W, X).detach()
    require_symmetric(Wt, "jacobian_asymmetry")
    a = _weights(weights, X)
    n, d = X.shape
    T = _field_fn(attention, Wt, a, n_iter, weights is not None)
    with single_thread_if_small(n, X.device):
        J = torch.autograd.functional.jacobian(lambda z: T(z.reshape(n, d)).reshape(-1), X.reshape(-1))
    J = J * a.repeat_interleave(d)[:, None] * n  # diag(a) J, scaled so uniform weights leave J unchanged
    return float(torch.linalg.norm(J - J.T) / torch.linalg.norm(J))

