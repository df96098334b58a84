r"""Sinkhorn of a symmetric positive semi-definite problem (a particle flow's), lean and batched.

docs/theory/normalizations.md. For scores :math:`C_{ij} = x_i^T W x_j / \tau` with :math:`W`
symmetric positive semi-definite and equal marginals :math:`a = b`, write
:math:`C_{ij} = \tfrac12 m_i + \tfrac12 m_j + D_{ij}` with :math:`m = \operatorname{diag} C`, so
:math:`D_{ij} = -\|x_i - x_j\|_W^2 / (2\tau) \le 0` and :math:`E = e^D` is a Gaussian kernel matrix:
symmetric, positive semi-definite, unit diagonal. The plan of the solution is symmetric, and
:math:`K_{ij} = e^{f_i + C_{ij} + g_j}` is the row SoftMax of :math:`C + g` for the potential
:math:`w = g + m/2` that solves

.. math:: F(w)_i = w_i + \log (E e^w)_i - \log a_i = 0

(then :math:`f = g - \log a` and the columns sum to ``a`` as well). Its Jacobian is
:math:`I + K`, with :math:`K` similar to the PSD matrix
:math:`\mathrm{diag}(\sqrt{u/s})\, E\, \mathrm{diag}(\sqrt{u/s})` (:math:`u = e^w`, :math:`s = E u`) of
eigenvalues in :math:`[0, 1]`: near the solution the relaxed step :math:`w \leftarrow w - \tfrac23 F(w)`
contracts the error by 3 whatever the temperature, and Polyak's heavy ball
:math:`w \leftarrow w - \gamma F(w) + \mu (w - w_{\text{prev}})`, tuned to the spectrum
:math:`[1, 2]` of :math:`I + K`, by 6. From the symmetric start :math:`w = \tfrac12 (\log a - \log E 1)`
9-13 iterations reach 1e-10 (measured on the circle and in the plane, temperatures 0.01-1,
n = 16-256, cold or warm), where the alternating half-iterations took 60-180 per particle step
of a warm-started flow (docs/performance.md).

Only one ``n x n`` exponential pass per solve (``E``); every iteration is a matrix-vector product.
Batches (leading dimensions) are independent systems: each one stops when its own marginal
error is below ``tol`` and is left untouched afterwards, so a system's result does not depend on
the others in its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.special
import torch

__all__ = []

#: Relaxation and momentum of the iteration: Polyak's heavy ball for a spectrum of I + K in [1, 2]
#: (rate (sqrt 2 - 1) / (sqrt 2 + 1) = 0.17 per iteration near the solution, 0.33 for the plain
#: relaxed step ``w - (2/3) F``).
_GAMMA = 4.0 / (1.0 + math.sqrt(2.0)) ** 2
_MOMENTUM = ((math.sqrt(2.0) - 1.0) / (math.sqrt(2.0) + 1.0)) ** 2
_CHECK_EVERY = 2  # heavy-ball iterations between two convergence checks (the same for every backend and batch)

#: Largest ``n`` finished by Newton's steps (a dense ``n x n`` solve each, 1-2 of them); above,
#: heavy-ball steps alone (matrix-vector products). A function of ``n`` only, so that a system
#: takes the same steps alone or in any batch.
NEWTON_N = 96
_NEWTON_FROM = 1e-2  # marginal error below which Newton's steps take over
_NEWTON_MAX = 1.0  # largest change of a potential a Newton step may make (else the start was too far)

#: CPU problems with at most this many matrix entries in all run in numpy: torch's per-operation
#: overhead (~5 us) is several times numpy's at these sizes, and a solve is ~40 small operations.
NUMPY_ENTRIES = 1 << 17

#: Half the float exponent range: sums below it are refreshed by :func:`_alternate`.
_SQRT_TINY = {dtype: math.sqrt(float(np.finfo(dtype).tiny)) for dtype in (np.dtype(np.float32), np.dtype(np.float64))}
_SQRT_TINY.update({torch.float32: _SQRT_TINY[np.dtype(np.float32)], torch.float64: _SQRT_TINY[np.dtype(np.float64)]})


@dataclass(frozen=True)
class SymmetricSolve:
    """A batched solve: matrices ``(..., n, n)``, potentials ``g`` ``(..., n)``, per-system
    ``iterations`` (int64 tensor), ``converged`` (bool tensor) and L1 ``column_error``."""

    attention: torch.Tensor
    g: torch.Tensor
    iterations: torch.Tensor
    converged: torch.Tensor
    column_error: torch.Tensor


def _kernel(C):
    """``E = exp(D)`` and ``m / 2`` (``D <= 0`` up to rounding: clipped, so no entry exceeds 1)."""
    half = 0.5 * C.diagonal(0, -2, -1)
    D = C - half[..., :, None]
    D -= half[..., None, :]
    if isinstance(D, np.ndarray):
        return np.exp(np.minimum(D, 0.0, out=D), out=D), half
    return D.clamp_max_(0.0).exp_(), half


def _xp(t):
    return np if isinstance(t, np.ndarray) else torch


def _matvec(E, v):
    if E.ndim == 2 and isinstance(E, np.ndarray):
        return E @ v  # numpy's gemv: the same sums as the batched form, in one call
    return (E @ v[..., None])[..., 0]


def _newton_or_ball(xp, newton, ball):
    """Newton's step where it moves no potential by more than ``_NEWTON_MAX``, the heavy-ball step elsewhere."""
    size = xp.abs(newton)
    near = (size.max(-1) if xp is np else size.amax(-1)) <= _NEWTON_MAX  # NaN compares False
    return xp.where(near[..., None], newton, ball)


_POTRF = {np.dtype(np.float64): (scipy.linalg.lapack.dpotrf, scipy.linalg.lapack.dpotrs),
          np.dtype(np.float32): (scipy.linalg.lapack.spotrf, scipy.linalg.lapack.spotrs)}


def _cholesky_newton(E, u, s, F):
    r"""Newton's step :math:`(I + K)^{-1} F` of one numpy system by the symmetric positive definite form of
    :func:`_newton_solve` (LAPACK's ``potrf`` and ``potrs`` directly: 0.6x the time of ``gesv`` on ``I + K``
    at n = 64); NaN where the factorization fails (a system whose iterates left the float range)."""
    potrf, potrs = _POTRF[E.dtype]
    J = E.copy()
    J.flat[:: E.shape[0] + 1] += s / u
    L, info = potrf(J, lower=1, clean=0, overwrite_a=1)  # symmetric: its C order is its Fortran order
    if info:
        return np.full_like(F, math.nan)
    return potrs(L, s * F, lower=1, overwrite_b=1)[0] / u


def _cholesky_newtons(E, u, s, F):
    """:func:`_cholesky_newton` of each system of a numpy batch, in one loop over LAPACK's ``potrf`` and
    ``potrs`` (the same bits as alone; 0.8x the time of a batched ``gesv`` on ``I + K``, 2,048 systems of
    n = 32, where numpy's batched ``potrf`` rounds differently at n = 96); NaN where a factorization fails."""
    n = E.shape[-1]
    potrf, potrs = _POTRF[E.dtype]
    J_T = E.swapaxes(-1, -2).reshape((-1, n, n)).copy()  # each J in Fortran order (E is symmetric up to rounding)
    J_T.reshape((len(J_T), -1))[:, :: n + 1] += (s / u).reshape((-1, n))
    steps = (s * F).reshape((-1, n))
    for one, rhs in zip(J_T, steps, strict=True):
        L, info = potrf(one.T, lower=1, clean=0, overwrite_a=1)
        rhs[:] = math.nan if info else potrs(L, rhs, lower=1, overwrite_b=1)[0]
    return steps.reshape(F.shape) / u


def _row_normalized(E, u, s=None):
    """``K = diag(1 / E u) E diag(u)`` (rows sum to 1) and ``s = E u`` (computed unless given)."""
    s = _matvec(E, u) if s is None else s
    return E * (u[..., None, :] / s[..., :, None]), s


def solve_symmetric(C: torch.Tensor, a: torch.Tensor, init_g: torch.Tensor | None, tol: float,
                    max_iter: int) -> SymmetricSolve:
    r"""Solve the symmetric problem of scores ``C`` (``(..., n, n)``) and marginals ``a`` to ``tol``.

    ``init_g`` (``(..., n)``, any gauge) warm-starts: for ``n <= NEWTON_N`` the first step is then
    Newton's, unchecked (from a flow's extrapolated potential it is the only one). None starts
    from the symmetric guess :math:`w = \tfrac12 (\log a - \log E 1)`. At most ``max_iter``
    iterations; systems still above ``tol`` (or whose iterates left the float range) report
    ``converged`` False.
    """
    small = C.device.type == "cpu" and C.numel() <= NUMPY_ENTRIES
    args = [C, a.expand(C.shape[:-1]), init_g]
    if small:
        args = [None if t is None else t.detach().numpy() for t in args]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a blown-up system stops, not converged
        K, g, iterations, err = _iterate(*args, tol, max_iter)
    if small:
        K, g, iterations, err = (torch.from_numpy(np.asarray(t)) for t in (K, g, iterations, err))
    return SymmetricSolve(K, g, iterations.to(torch.int64), err <= tol, err)  # NaN: not converged


class _Systems:
    """Bookkeeping of the systems of a batch (or of one system, without masks): which still
    iterate, their iteration counts and their last column errors."""

    def __init__(self, xp, w, warm):
        self.xp, self.batched = xp, w.ndim > 1
        self.active = xp.ones_like(w[..., 0]) > 0
        self.iterations = 0 * w[..., 0]
        self.err = self.iterations + (0.0 if warm else math.inf)  # a warm start counts as close

    def done(self, E, u, s, a, tol) -> bool:
        """Record the column errors of ``K = diag(1/s) E diag(u)`` (from ``E^T (a / s)``, without
        forming ``K``); whether every system has converged (one sync)."""
        e = self.xp.abs(u * _matvec(E.swapaxes(-1, -2), a / s) - a).sum(-1)
        if not self.batched:
            self.err, self.active = e, e > tol  # NaN compares False: a system that blew up stops
            return not bool(self.active)
        self.err = self.xp.where(self.active, e, self.err)
        self.active = self.active & (self.err > tol)
        return not bool(self.active.any())

    def advanced(self, w, step):
        self.iterations = self.iterations + self.active
        return self.xp.where(self.active[..., None], w - step, w) if self.batched else w - step


def _newton_step(E, u, s, F, rows):
    """Newton's step ``(I + K)^{-1} F`` of the systems ``rows`` of a batch (all for None), zero
    elsewhere: a converged system costs no dense solve, and each system's step is its own solve."""
    if rows is None or bool(rows.all()):
        return _newton_solve(E, u, s, F)
    step = 0 * F
    if bool(rows.any()):
        step[rows] = _newton_solve(E[rows], u[rows], s[rows], F[rows])
    return step


def _newton_solve(E, u, s, F):
    r"""``(I + K)^{-1} F``. Torch tensors take the symmetric positive definite form
    :math:`(I + K)^{-1} F = \mathrm{diag}(1/u) (E + \mathrm{diag}(s/u))^{-1} (s F)` (``E`` PSD,
    ``s / u >= 1``): a Cholesky factorization, no pivoting, no ``K``, about half the cost of
    a batched ``gesv`` of 32 x 32 systems; numpy arrays: one system (:func:`solve_one`'s step) the same
    form (:func:`_cholesky_newton`), a block of systems the same, one loop over its systems
    (:func:`_cholesky_newtons`)."""
    if isinstance(E, np.ndarray):
        return _cholesky_newton(E, u, s, F) if E.ndim == 2 else _cholesky_newtons(E, u, s, F)
    J = E.clone()
    J.diagonal(0, -2, -1).add_(s / u)
    L = torch.linalg.cholesky_ex(J)[0]
    return torch.cholesky_solve((s * F)[..., None], L)[..., 0] / u


def _iterate(C, a, init_g, tol, max_iter):
    """The iteration on numpy arrays or torch tensors alike: ``(K, g, iterations, column_error)``."""
    E, half = _kernel(C)
    (u, s), g, iterations, err = iterate_kernel(E, half, a, init_g, tol, max_iter)
    return _row_normalized(E, u, s)[0], g, iterations, err


def iterate_kernel(E, half, a, init_g, tol, max_iter):
    """The iteration from the kernel ``E = exp(D)`` and ``half = m / 2`` (:func:`_kernel`), on numpy
    arrays or torch tensors alike: ``((u, s), g, iterations, column_error)``, the plan being
    ``diag(1 / s) E diag(u)`` (not formed). Call it under ``np.errstate`` as :func:`solve_symmetric` does.

    Heavy-ball steps, checked every ``_CHECK_EVERY`` iterations; for ``n <= NEWTON_N`` checked at
    every iteration and replaced by Newton's steps once a system's error is below ``_NEWTON_FROM``.
    """
    xp = _xp(E)
    log_a = xp.log(a)
    warm = init_g is not None
    w = init_g + half if warm else 0.5 * (log_a - xp.log(E.sum(-1)))
    newton = E.shape[-1] <= NEWTON_N
    every = 1 if newton else _CHECK_EVERY
    systems = _Systems(xp, w, warm and newton)
    previous = w
    for k in range(max_iter + 1):
        u = xp.exp(w)
        s = _matvec(E, u)
        if (k % every == 0 or k == max_iter) and (k or not (warm and newton)):
            if systems.done(E, u, s, a, tol) or k == max_iter:
                break
        F = w + xp.log(s) - log_a
        close = systems.err < _NEWTON_FROM if newton else False
        if newton and bool(close.all()):
            step = _newton_step(E, u, s, F, systems.active if systems.batched else None)
            if not float(xp.abs(step).max()) <= _NEWTON_MAX:  # too far for Newton: a heavy-ball step
                step = _newton_or_ball(xp, step, _GAMMA * F - _MOMENTUM * (w - previous))
        else:
            step = _GAMMA * F - _MOMENTUM * (w - previous)
            if newton and bool(close.any()):
                newton_step = _newton_step(E, u, s, F, close & systems.active)
                step = xp.where(close[..., None], _newton_or_ball(xp, newton_step, step), step)
        previous = w
        w = systems.advanced(w, step)
    return (u, s), w - half, systems.iterations, systems.err


def solve_one(C: np.ndarray, a: np.ndarray, init_g: np.ndarray | None, tol: float, max_iter: int):
    """:func:`solve_symmetric` for one small system in numpy, without its batch bookkeeping: the
    same iterates, checks and stopping rule (tested equal), in half its operations. Returns numpy
    ``(K, g, iterations, column_error)`` (a float error; NaN for a system that blew up). Call it
    under ``np.errstate(over="ignore", invalid="ignore", divide="ignore")``.
    """
    n = C.shape[-1]
    E, half = _kernel(C)
    log_a = np.log(a)
    warm, newton = init_g is not None, n <= NEWTON_N
    w = init_g + half if warm else 0.5 * (log_a - np.log(E.sum(-1)))
    every = 1 if newton else _CHECK_EVERY
    err, iterations, previous = (0.0 if warm and newton else math.inf), 0, w
    for k in range(max_iter + 1):
        u = np.exp(w)
        s = E @ u
        if (k % every == 0 or k == max_iter) and (k or not (warm and newton)):
            err = float(np.abs(u * (E.T @ (a / s)) - a).sum())
            if not err > tol or k == max_iter:  # NaN stops too
                break
        F = w + np.log(s) - log_a
        step = None
        if newton and err < _NEWTON_FROM:
            step = _cholesky_newton(E, u, s, F)
            step = step if float(np.abs(step).max()) <= _NEWTON_MAX else None
        if step is None:
            step = _GAMMA * F - _MOMENTUM * (w - previous)
        previous, w, iterations = w, w - step, iterations + 1
    return E * (u / s[:, None]), w - half, iterations, err


def fixed_symmetric(C: torch.Tensor, a: torch.Tensor, n_iter: int, init_g: torch.Tensor | None):
    """``n_iter`` alternating half-iterations (row first) on the kernel :math:`a_j e^{C_{ij}}` (the
    flow's), in the kernel domain with one exponential pass: ``(K, g)``, ``g`` the column potential
    of those scores (:func:`_alternate`; exact to rounding at any spread of the particles).
    """
    small = C.device.type == "cpu" and C.numel() <= NUMPY_ENTRIES
    args = [C, a.expand(C.shape[:-1]), init_g]
    if small:
        args = [None if t is None else t.detach().numpy() for t in args]
    K, g = _alternate(*args, n_iter)
    return (torch.from_numpy(K), torch.from_numpy(g)) if small else (K, g)


def _alternate(C, a, init_g, n_iter):
    r"""The fixed count on numpy arrays or torch tensors alike (batched): ``(K, g)``.

    ``K = diag(u) G diag(v)`` with :math:`G_{ij} = e^{C_{ij} + \alpha_i + \beta_j}`, starting from
    :math:`\beta = \log a + g_0` and the row maxima :math:`\alpha_i = -\max_j (C_{ij} + \beta_j)`
    of the first (SoftMax) step: ``G <= 1`` with a 1 in every row, and a row step sets
    ``u = 1 / (G v)``, a column step ``v = a / (G^T (a u))``. Where a half-step's sums fall below
    ``sqrt(tiny)`` (a column that every row outweighs by more than half the float exponent range:
    particles spread far in R^d), those lines alone are refreshed from the scores
    (:func:`_refresh_lines`), so the scalings stay in range and the result is exact to rounding
    at any spread, for one exponential pass plus a pass over the refreshed lines.
    """
    xp = _xp(C)
    log_a = xp.log(a)
    beta = log_a + (0.0 if init_g is None else init_g)
    T = C + beta[..., None, :]
    alpha = -(T.max(-1) if xp is np else T.amax(-1))
    T += alpha[..., :, None]
    G = np.exp(T, out=T) if xp is np else T.exp_()
    low = _SQRT_TINY[C.dtype]
    u, v = None, None  # v = 1
    for k in range(n_iter):
        if k % 2 == 0:
            s = G.sum(-1) if v is None else _matvec(G, v)  # the first sums are >= 1: a 1 in every row
            if v is not None and not _all_above(s, low):
                bad = ~(s >= low)  # NaN included
                _refresh_lines(C, G, alpha, beta, xp.log(v), xp.zeros_like(s), bad)
                s[bad] = 1.0
            u = 1.0 / s
        else:
            c = _matvec(G.swapaxes(-1, -2), a * u)
            if not _all_above(c, low):
                bad = ~(c >= low)
                _refresh_lines(C.swapaxes(-1, -2), G.swapaxes(-1, -2), beta, alpha, xp.log(a * u), log_a, bad)
                c[bad] = a[bad]
            v = a / c
    K = G * u[..., :, None]
    if v is None:
        return K, beta - log_a
    K *= v[..., None, :]
    return K, beta + xp.log(v) - log_a


def _all_above(t, low) -> bool:
    """Whether every entry of ``t`` is at least ``low`` (False for NaN); one sync."""
    return bool((t.min() if isinstance(t, np.ndarray) else t.amin()) >= low)


def _refresh_lines(C, G, own, other, log_scale, target, bad):
    r"""Rows ``bad`` (a boolean mask ``(..., n)``) of ``G = exp(C + own_i + other_j)`` computed again
    from the scores, in place: ``own`` of those rows is set in the log domain so that their scaled
    sums :math:`\sum_j G_{ij} e^{\text{log\_scale}_j}` equal :math:`e^{\text{target}_i}`. Pass
    transposed views of ``C`` and ``G`` (and the roles of the shifts swapped) for columns.
    """
    xp = _xp(C)

    def expand(t):
        return np.broadcast_to(t[..., None, :], C.shape) if xp is np else t[..., None, :].expand(C.shape)

    lines = C[bad] + expand(other)[bad]
    scaled = lines + expand(log_scale)[bad]
    lse = scipy.special.logsumexp(scaled, axis=-1) if xp is np else torch.logsumexp(scaled, -1)
    own[bad] = target[bad] - lse
    G[bad] = xp.exp(lines + own[bad][:, None])

