r"""Implicit gradients of the converged Sinkhorn map (``backward="implicit"``).

The forward runs the solver without autograd (kernel domain, epsilon scaling, Newton steps);
the backward differentiates the first-order conditions of the balanced problem instead of the
iterations. With :math:`K_{ij} = \exp(f_i + C_{ij} + g_j)` on admissible pairs, the
conditions are :math:`\sum_j K_{ij} = 1` (active rows) and :math:`\sum_i a_i K_{ij} = b_j`
(active columns). For an upstream gradient :math:`\bar G = \partial L / \partial K`, let
:math:`H = \bar G \circ K`, :math:`u = H 1`, :math:`v = H^T 1`. The adjoint of the potentials
solves the Schur complement (the row potential eliminated)

.. math:: S \mu = v - K^T u, \qquad S = \operatorname{diag}(b) - K^T \operatorname{diag}(a) K,

whose kernel is the gauge :math:`\mu \to \mu + c 1` (``S 1 = b - K^T a = 0``); it is removed by
the rank-one term :math:`\beta\, b b^T / \|b\|^2`, which leaves the solution of the consistent
system unchanged (the right-hand side sums to 0) and fixes :math:`\langle b, \mu\rangle = 0`.
Then

.. math:: \frac{\partial L}{\partial C} = K \circ \big(\bar G - (u - a \circ K\mu) 1^T - a \mu^T\big).

The weights enter the column conditions only, so :math:`\partial L / \partial b = \mu` and
:math:`\partial L / \partial a = -K\mu`, the gradients of the map extended off the simplex by scale
invariance (:math:`\langle a, \partial L/\partial a\rangle = \langle b, \partial L/\partial b\rangle = 0`).
Forward mode solves the same system for the tangent of ``g``.

Small problems solve :math:`S` densely; larger ones by conjugate gradients (``S`` is symmetric
positive semi-definite), whose residual is checked. Memory: the backward keeps ``K``, ``a`` and
``b`` only, whatever the number of iterations (docs/theory/implicit.md). The backward is made of
differentiable operations on the saved output, so a double backward (``create_graph=True``) gives
the exact second derivatives of the converged map.
"""

from __future__ import annotations

import warnings

import torch

from sinkflow._backend import storage_free
from sinkflow.attention._result import SinkhornWarning

__all__: list[str] = []

_DENSE_MAX = 512  # columns up to which the Schur complement is solved densely
_CG_RTOL = 1e-10  # relative residual of conjugate gradients (float64; float32 uses sqrt(eps)-ish)

BACKWARDS = ("unrolled", "implicit")


def check_backward(backward):
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be 'unrolled' or 'implicit', got {backward!r}")
    return backward


def forward_mode_only(*tensors) -> bool:
    """Whether the inputs are differentiated in forward mode only: under ``torch.func.jvp`` or ``jacfwd``
    (inputs a transform wrapped, with no reverse-mode graph to build: nothing requires grad, as under
    ``grad``, ``vjp`` or ``jacrev`` it would) or carrying a ``torch.autograd.forward_ad`` tangent. A run to
    tolerance then takes the implicit tangent (the converged map's): the unrolled one would follow the
    differentiable iterations, without Newton steps (they would drop the tangent). Only public API is asked
    (a wrapped tensor's ``data_ptr()`` raises: :func:`sinkflow._backend.storage_free`); a ``vmap`` alone
    takes the same forward, and a run to tolerance under it was refused before this point."""
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if torch.compiler.is_compiling() or torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False  # a reverse-mode graph (autograd, torch.func.grad / vjp / jacrev), or a trace
    from torch.autograd import forward_ad

    if any(forward_ad.unpack_dual(t).tangent is not None for t in tensors):
        return True
    return storage_free(*tensors)


def _regularized_apply(K, a, b, beta, x):
    """``(S + beta b b^T / |b|^2) x`` with inactive columns (``b_j = 0``) on the identity."""
    Kx = (K @ x[..., None])[..., 0]
    Sx = b * x - (K.transpose(-1, -2) @ (a * Kx)[..., None])[..., 0]
    Sx = torch.where(b > 0, Sx, x)
    bb = (b * b).sum(-1, keepdim=True)
    return Sx + beta * b * (b * x).sum(-1, keepdim=True) / bb


def _schur_solve(K, a, b, rhs):
    """Solve ``S mu = rhs`` on the complement of the gauge; dense for small ``m``, else CG."""
    m = K.shape[-1]
    beta = b.amax(-1, keepdim=True)
    if m <= _DENSE_MAX:
        S = torch.diag_embed(b) - K.transpose(-1, -2) @ (a[..., :, None] * K)
        inactive = (b <= 0).to(K.dtype)
        S = S + torch.diag_embed(inactive)
        S = S + beta[..., None] * b[..., :, None] * b[..., None, :] / (b * b).sum(-1)[..., None, None]
        return torch.linalg.solve(S, rhs[..., None])[..., 0]
    return _conjugate_gradients(lambda x: _regularized_apply(K, a, b, beta, x), rhs, K.dtype)


def _conjugate_gradients(apply, rhs, dtype, max_iter=None):
    rtol = _CG_RTOL if dtype == torch.float64 else 1e-5
    max_iter = max_iter or 10 * rhs.shape[-1]
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    p = r.clone()
    rr = (r * r).sum(-1, keepdim=True)
    target = (rtol ** 2) * rr.clamp_min(torch.finfo(dtype).tiny)
    for _ in range(max_iter):
        if bool((rr <= target).all()):
            return x
        Ap = apply(p)
        alpha = rr / (p * Ap).sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = (r * r).sum(-1, keepdim=True)
        p = r + (rr_new / rr.clamp_min(torch.finfo(dtype).tiny)) * p
        rr = rr_new
    warnings.warn(f"implicit Sinkhorn backward: conjugate gradients did not reach relative residual {rtol:g} "
                  f"in {max_iter} iterations (reached {float((rr / target).amax().sqrt()) * rtol:.3g}); "
                  "the gradient is approximate", SinkhornWarning, stacklevel=4)
    return x


def implicit_vjp(K, a, b, grad):
    """``dL/dC`` of the converged map at ``K`` for the upstream gradient ``grad`` (all in one dtype)."""
    return implicit_vjp_all(K, a, b, grad, weights=False)[0]


def implicit_vjp_all(K, a, b, grad, weights=True):
    """``(dL/dC, dL/da, dL/db)`` of the converged map at ``K`` (the last two None unless ``weights``).

    The weights enter the column conditions only: a perturbation ``(da, db)`` adds ``db - K^T da``
    to the right-hand side of the Schur system, so with ``mu`` the adjoint of the column potential
    ``dL/db = mu`` and ``dL/da = -K mu``. The map is extended off the simplex by scale invariance,
    ``K(a, b) = K(a / sum(a), b / sum(b))``; hence both are projected to ``<a, dL/da> = <b, dL/db> = 0``
    (the gauge fix ``<b, mu> = 0`` already gives it), and lines of weight 0 get 0.
    """
    H = grad * K
    u, v = H.sum(-1), H.sum(-2)
    rhs = v - (K.transpose(-1, -2) @ u[..., None])[..., 0]
    rhs = torch.where(b > 0, rhs, torch.zeros_like(rhs))
    mu = _schur_solve(K, a, b, rhs)
    Kmu = (K @ mu[..., None])[..., 0]
    dC = K * (grad - (u - a * Kmu)[..., :, None] - a[..., :, None] * mu[..., None, :])
    if not weights:
        return dC, None, None
    return dC, _project_adjoint(-Kmu, a), _project_adjoint(mu, b)


def _project_adjoint(grad, w):
    """The adjoint of ``dw -> dw - w sum(dw)`` (scale invariance) on the lines of positive weight, 0 elsewhere."""
    grad = torch.where(w > 0, grad, torch.zeros_like(grad))
    return torch.where(w > 0, grad - (w * grad).sum(-1, keepdim=True), torch.zeros_like(grad))


def _project_tangent(dw, w):
    """``dw - w sum(dw)`` on the lines of positive weight (a tangent of the simplex; scale invariance)."""
    dw = torch.where(w > 0, dw, torch.zeros_like(dw))
    return dw - w * dw.sum(-1, keepdim=True)


def implicit_jvp(K, a, b, dC, da=None, db=None):
    """The tangent of the converged map at ``K`` along ``(dC, da, db)``: ``dK = K (dC + df 1^T + 1 dg^T)``
    (``dC``, ``da``, ``db`` may be None: no tangent)."""
    KdC = K * dC if dC is not None else torch.zeros_like(K)
    r1, r2 = -KdC.sum(-1), -(a[..., :, None] * KdC).sum(-2)
    rhs = r2 - (K.transpose(-1, -2) @ (a * r1)[..., None])[..., 0]
    if db is not None:
        rhs = rhs + _project_tangent(db, b)
    if da is not None:
        rhs = rhs - (K.transpose(-1, -2) @ _project_tangent(da, a)[..., None])[..., 0]
    rhs = torch.where(b > 0, rhs, torch.zeros_like(rhs))
    dg = _schur_solve(K, a, b, rhs)
    df = r1 - (K @ dg[..., None])[..., 0]
    dK = K * (df[..., :, None] + dg[..., None, :])
    return dK if dC is None else dK + KdC


class ImplicitSinkhorn(torch.autograd.Function):
    """Identity on the converged ``K`` in the forward; the implicit vjp and jvp with respect to ``C``, ``a``, ``b``.

    The backward is written in differentiable operations of the saved output: under ``create_graph=True``
    autograd differentiates it through this Function again, which gives the exact second derivatives
    of the converged map (the vjp is an explicit function of ``K(C, a, b)``, ``a``, ``b``).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(C, K, a, b):
        return K.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, K, a, b = inputs
        ctx.shapes = (a.shape, b.shape)
        a = torch.broadcast_to(a, K.shape[:-1])
        b = torch.broadcast_to(b, K.shape[:-2] + K.shape[-1:])
        ctx.save_for_backward(output, a, b)  # the output: a double backward differentiates through it
        ctx.save_for_forward(K, a, b)

    @staticmethod
    def backward(ctx, grad):
        K, a, b = ctx.saved_tensors
        weights = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
        dC, da, db = implicit_vjp_all(K, a, b, grad.to(K.dtype), weights)
        da = da.sum_to_size(ctx.shapes[0]) if ctx.needs_input_grad[2] else None
        db = db.sum_to_size(ctx.shapes[1]) if ctx.needs_input_grad[3] else None
        return dC, None, da, db

    @staticmethod
    def jvp(ctx, dC, dK, da, db):
        K, a, b = ctx.saved_tensors
        dC, da, db = (None if t is None else t.to(K.dtype) for t in (dC, da, db))
        return implicit_jvp(K, a, b, dC, da, db)
