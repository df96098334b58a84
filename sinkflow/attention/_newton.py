"""Newton steps on Sinkhorn's dual, for the last digits of a solve to tolerance: the reduced
Newton system (dense, sparse or conjugate gradients by size) and the polishing rounds that stop
when they stop improving.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sinkflow._backend import exp_floor
from sinkflow.attention._log_steps import _colsum
from sinkflow.attention._solver import _max_over_batch

__all__ = []


_DENSE_NEWTON = 512  # n + m up to which the Newton system is solved densely (else sparse or CG)


def _dual_state(C, f, g, a, b, mask, high):
    """``K``, line sums, dual value, gradient and marginal error at ``(f, g)``; None on overflow."""
    T = C + f[..., :, None] + g[..., None, :]
    if mask is not None:
        T = T.masked_fill_(~mask, -math.inf)
    if bool((T > high).any()):
        return None
    K = T.clamp_min_(exp_floor(T.dtype)).exp_()
    if mask is not None:
        K = K.masked_fill_(~mask, 0.0)
    r, c = K.sum(-1), _colsum(a, K)
    dual = (a * f).sum(-1) + (b * g).sum(-1) - (a * r).sum(-1)
    row_gap = a * (1.0 - r) * (a > 0)
    grad = torch.cat([row_gap, (b - c) * (b > 0)], -1)
    err = torch.maximum(row_gap.abs().sum(-1), (c - b).abs().sum(-1))
    return K, r, c, dual, grad, err


def _newton_direction(K, a, r, c, grad):
    """Solve the Newton system of the dual, Jacobi-scaled and gauge-fixed.

    The negative Hessian is ``J = [[diag(a r), diag(a) K], [K^T diag(a), diag(c)]]``, the
    signless Laplacian of the bipartite graph weighted by the plan. With ``D = diag(J)``,
    ``D^{-1/2} J D^{-1/2} = I + [[0, B], [B^T, 0]]`` has unit diagonal and eigenvalues in
    ``[0, 2]``: tiny masses no longer make it ill-conditioned (unscaled, its condition number
    reached 1e20 on cold 1D problems). Its null vector ``D^{1/2} (1, -1)`` (the gauge
    ``(f + t, g - t)``, to which the gradient is orthogonal) is removed by adding ``u u^T``.
    What is left is governed by the plan's spectral gap ``1 - sigma_2``, the quantity that
    slows Sinkhorn itself; conjugate gradients need only its square root in iterations.
    """
    n, m = K.shape[-2:]
    d = torch.cat([a * r, c], -1)
    active = d > torch.finfo(d.dtype).tiny / torch.finfo(d.dtype).eps
    root = torch.where(active, d, torch.ones_like(d)).sqrt()
    s = torch.where(active, 1.0 / root, torch.zeros_like(d))
    B = (s[..., :n] * a)[..., :, None] * K * s[..., None, n:]
    sign = torch.cat([torch.ones_like(a), -torch.ones_like(c)], -1)
    u = torch.where(active, root, torch.zeros_like(d)) * sign
    u = u / u.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(d.dtype).tiny)
    ridge = 1e3 * torch.finfo(d.dtype).eps

    def apply(z):
        zf, zg = z[..., :n], z[..., n:]
        coupled = torch.cat([(B @ zg[..., None])[..., 0], (zf[..., None, :] @ B)[..., 0, :]], -1)
        return (1.0 + ridge) * z + coupled + u * (u * z).sum(-1, keepdim=True)

    rhs = s * grad
    if n + m <= _DENSE_NEWTON:
        eye = torch.eye(n + m, dtype=d.dtype, device=d.device)
        top = torch.cat([torch.zeros_like(B[..., :, :1]).expand(*B.shape[:-1], n), B], -1)
        bottom = torch.cat([B.transpose(-1, -2), torch.zeros_like(B[..., :1, :]).expand(*B.shape[:-2], m, m)], -1)
        J = (1.0 + ridge) * eye + torch.cat([top, bottom], -2) + u[..., :, None] * u[..., None, :]
        L, info = torch.linalg.cholesky_ex(J)
        if not bool(info.any()):
            return s * torch.cholesky_solve(rhs[..., None], L)[..., 0]
    sparse = _sparse_solve(B, rhs, d, active, ridge)
    if sparse is not None:
        return s * sparse
    return s * _conjugate_gradient(apply, rhs)


def _sparse_solve(B, rhs, d, active, ridge, drop=1e-10, max_fill=256):
    """Direct solve of the scaled system with ``B``'s entries below ``drop`` left out.

    At cold temperatures the plan is nearly sparse (a staircase in 1D), its graph a chain
    whose spectral gap is far too small for iterative solvers, while a sparse factorization
    costs about ``O(n + m)``. The gauge is fixed by pinning the variable of largest mass to
    zero (any solution differs from another by a gauge shift). Returns None when the kept
    matrix is not sparse (more than ``max_fill`` entries per line): then the plan is warm and
    conjugate gradients converge fast.
    """
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    n, m = B.shape[-2:]
    Bs = B.detach().cpu().reshape(-1, n, m)
    keep = Bs >= drop
    if int(keep.sum()) > max_fill * (n + m) * Bs.shape[0]:
        return None
    out = torch.zeros_like(rhs).reshape(-1, n + m)
    flat_rhs, flat_d, flat_active = (t.detach().cpu().reshape(-1, n + m) for t in (rhs, d, active))
    for k in range(Bs.shape[0]):
        i, j = torch.nonzero(keep[k], as_tuple=True)
        w = Bs[k, i, j].numpy()
        rows = np.concatenate([i.numpy(), j.numpy() + n, np.arange(n + m)])
        cols = np.concatenate([j.numpy() + n, i.numpy(), np.arange(n + m)])
        vals = np.concatenate([w, w, np.full(n + m, 1.0 + ridge)])
        J = sp.csc_matrix((vals, (rows, cols)), shape=(n + m, n + m))
        pin = int(torch.where(flat_active[k], flat_d[k], torch.zeros_like(flat_d[k])).argmax())
        free = np.flatnonzero(np.arange(n + m) != pin)
        z = spla.spsolve(J[free][:, free], flat_rhs[k].numpy()[free])
        if not np.all(np.isfinite(z)):
            return None
        out[k, torch.from_numpy(free)] = torch.from_numpy(z).to(out.dtype)
    return out.reshape(rhs.shape).to(rhs.device)


def _conjugate_gradient(apply, rhs, rtol=1e-8, max_iter=200):
    """Batched conjugate gradients for an SPD operator (one step size per batch entry)."""
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    p = r.clone()
    rs = (r * r).sum(-1, keepdim=True)
    stop = (rtol ** 2) * rs
    for _ in range(max_iter):
        if bool((rs <= stop).all()):
            break
        Ap = apply(p)
        curvature = (p * Ap).sum(-1, keepdim=True)
        alpha = torch.where(curvature > 0, rs / torch.where(curvature > 0, curvature, 1.0), 0.0)
        x = x + alpha * p
        r = r - alpha * Ap
        rs_new = (r * r).sum(-1, keepdim=True)
        p = r + torch.where(rs > 0, rs_new / torch.where(rs > 0, rs, 1.0), 0.0) * p
        rs = rs_new
    return x


def _newton_polish(C, scale, f, g, a, b, mask, tol, state, max_steps=30):
    """Damped Newton steps on the concave dual ``D(f, g) = <a, f> + <b, g> - sum_ij a_i K_ij``.

    Computed in float64 whatever the input dtype. The step solves the scaled, gauge-fixed
    system of :func:`_newton_direction`; a step is accepted when it satisfies Armijo's
    condition on ``D`` or lowers the marginal error (near the solution of a cold problem the
    dual's increase is below its rounding). Converges quadratically where plain Sinkhorn
    crawls (Brauer et al. 2017). Each step appends its marginal error to ``state``.
    Returns ``(f, g, improved)``.
    """
    work = torch.float64
    n, m = C.shape[-2:]
    C64 = C.detach().to(work) * scale
    a64, b64 = a.to(work), b.to(work)
    f64, g64 = f.detach().to(work), g.detach().to(work)
    high = math.log(torch.finfo(work).max) - math.log(n * m) - 1.0
    current = _dual_state(C64, f64, g64, a64, b64, mask, high)
    if current is None:
        return f, g, False
    start = float(_max_over_batch(current[-1]))
    for _ in range(max_steps):
        K, r, c, dual, grad, err = current
        worst = float(_max_over_batch(err))
        state["errors"].append(worst)
        state["scales"].append(scale)
        if worst <= tol:
            break
        step = _newton_direction(K, a64, r, c, grad)
        slope = (grad * step).sum(-1)
        del K
        accepted, t = None, 1.0
        for _ in range(40):
            trial = _dual_state(C64, f64 + t * step[..., :n], g64 + t * step[..., n:], a64, b64, mask, high)
            if trial is not None and (bool((trial[3] >= dual + 1e-4 * t * slope).all())
                                      or float(_max_over_batch(trial[-1])) < 0.9 * worst):
                accepted = trial
                break
            t *= 0.5
        if accepted is None:
            break
        f64, g64, current = f64 + t * step[..., :n], g64 + t * step[..., n:], accepted
    final = float(_max_over_batch(current[-1]))
    return f64.to(f.dtype), g64.to(g.dtype), final < start
