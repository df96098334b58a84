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

Small problems solve :math:`S` densely; larger ones by conjugate gradients (``S`` is symmetric
positive semi-definite), whose residual is checked. Memory: the backward keeps ``K``, ``a`` and
``b`` only, whatever the number of iterations (docs/theory/implicit.md).
"""

from __future__ import annotations

import warnings

import torch

from sinkflow.attention._result import SinkhornWarning

__all__: list[str] = []

_DENSE_MAX = 512  # columns up to which the Schur complement is solved densely
_CG_RTOL = 1e-10  # relative residual of conjugate gradients (float64; float32 uses sqrt(eps)-ish)

BACKWARDS = ("unrolled", "implicit")


def check_backward(backward):
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be 'unrolled' or 'implicit', got {backward!r}")
    return backward


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
    H = grad * K
    u, v = H.sum(-1), H.sum(-2)
    rhs = v - (K.transpose(-1, -2) @ u[..., None])[..., 0]
    rhs = torch.where(b > 0, rhs, torch.zeros_like(rhs))
    mu = _schur_solve(K, a, b, rhs)
    Kmu = (K @ mu[..., None])[..., 0]
    return K * (grad - (u - a * Kmu)[..., :, None] - a[..., :, None] * mu[..., None, :])


def implicit_jvp(K, a, b, dC):
    """The tangent of the converged map at ``K`` along ``dC``: ``dK = K (dC + df 1^T + 1 dg^T)``."""
    KdC = K * dC
    r1, r2 = -KdC.sum(-1), -(a[..., :, None] * KdC).sum(-2)
    rhs = r2 - (K.transpose(-1, -2) @ (a * r1)[..., None])[..., 0]
    rhs = torch.where(b > 0, rhs, torch.zeros_like(rhs))
    dg = _schur_solve(K, a, b, rhs)
    df = r1 - (K @ dg[..., None])[..., 0]
    return K * (dC + df[..., :, None] + dg[..., None, :])


class ImplicitSinkhorn(torch.autograd.Function):
    """Identity on the converged ``K`` in the forward; the implicit vjp (and jvp) with respect to ``C``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(C, K, a, b):
        return K.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, K, a, b = inputs
        a = torch.broadcast_to(a, K.shape[:-1])
        b = torch.broadcast_to(b, K.shape[:-2] + K.shape[-1:])
        ctx.save_for_backward(K, a, b)
        ctx.save_for_forward(K, a, b)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        K, a, b = ctx.saved_tensors
        return implicit_vjp(K, a, b, grad.to(K.dtype)), None, None, None

    @staticmethod
    def jvp(ctx, dC, dK, da, db):
        K, a, b = ctx.saved_tensors
        return implicit_jvp(K, a, b, dC.to(K.dtype))
