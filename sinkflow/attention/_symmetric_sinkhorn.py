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

Both solves run on the one Sinkhorn solver (:mod:`sinkflow.attention._solver`), its stopping rule and
its :class:`~sinkflow.attention._solver.SolveReport`: to tolerance over :class:`SymmetricBall` (a whole
symmetric step per solver step), a fixed count of alternating half-iterations over
:class:`AlternatingScaling`. Both operators take numpy arrays or torch tensors; small CPU problems run in
numpy while :func:`sinkflow.fast_paths` are on (:func:`in_numpy`).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.special
import torch

from sinkflow._backend import fast_paths_enabled
from sinkflow.attention._solver import SolveReport, sinkhorn_solve

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

#: CPU problems with at most this many matrix entries in all run in numpy (while :func:`sinkflow.fast_paths`
#: are on): torch's per-operation overhead (~5 us) is several times numpy's at these sizes, and a solve is
#: ~40 small operations.
NUMPY_ENTRIES = 1 << 17

#: Half the float exponent range: sums below it are refreshed by :class:`AlternatingScaling`.
_SQRT_TINY = {dtype: math.sqrt(float(np.finfo(dtype).tiny)) for dtype in (np.dtype(np.float32), np.dtype(np.float64))}
_SQRT_TINY.update({torch.float32: _SQRT_TINY[np.dtype(np.float32)], torch.float64: _SQRT_TINY[np.dtype(np.float64)]})


@dataclass(frozen=True)
class SymmetricSolve:
    """A batched solve: matrices ``(..., n, n)``, potentials ``g`` ``(..., n)``, per-system
    ``iterations`` (int64 tensor), ``converged`` (bool tensor) and L1 ``column_error``, and the solver's
    ``report`` (iterations of the slowest system, the largest column error)."""

    attention: torch.Tensor
    g: torch.Tensor
    iterations: torch.Tensor
    converged: torch.Tensor
    column_error: torch.Tensor
    report: SolveReport | None = None


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


class _Systems:
    """Bookkeeping of the systems of a batch (or of one system, without masks): which still
    iterate, their iteration counts and their last column errors."""

    def __init__(self, xp, w, warm):
        self.xp, self.batched = xp, w.ndim > 1
        if not self.batched:  # one system: Python numbers until the first read
            self.active, self.iterations, self.err = True, 0, 0.0 if warm else math.inf
            return
        self.active = xp.ones_like(w[..., 0]) > 0
        self.iterations = xp.zeros_like(w[..., 0])  # (not 0 * w: NaN where w is)
        self.err = self.iterations + (0.0 if warm else math.inf)  # a warm start counts as close

    def read(self, E, u, s, a, tol):
        """Record the column errors of ``K = diag(1/s) E diag(u)`` (from ``E^T (a / s)``, without
        forming ``K``) and stop the systems within ``tol`` or not a number; the error the solver reads:
        the largest of the systems still iterating, else of the stopped ones (NaN counted as 0)."""
        xp = self.xp
        e = xp.abs(u * _matvec(E.swapaxes(-1, -2), a / s) - a).sum(-1)
        if not self.batched:
            self.err, self.active = e, e > tol  # NaN compares False: a system that blew up stops
            return (e if e == e else 0.0) if xp is np else torch.nan_to_num(e, nan=0.0)
        self.err = xp.where(self.active, e, self.err)
        self.active = self.active & (self.err > tol)
        read = xp.where(self.err == self.err, self.err, 0.0 * self.err)
        return read.max() if xp is np else read.amax()

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
    a batched ``gesv`` of 32 x 32 systems; numpy arrays: one system the same
    form (:func:`_cholesky_newton`), a block of systems the same, one loop over its systems
    (:func:`_cholesky_newtons`)."""
    if isinstance(E, np.ndarray):
        return _cholesky_newton(E, u, s, F) if E.ndim == 2 else _cholesky_newtons(E, u, s, F)
    J = E.clone()
    J.diagonal(0, -2, -1).add_(s / u)
    L = torch.linalg.cholesky_ex(J)[0]
    return torch.cholesky_solve((s * F)[..., None], L)[..., 0] / u


def solve_symmetric(C: torch.Tensor, a: torch.Tensor, init_g: torch.Tensor | None, tol: float,
                    max_iter: int) -> SymmetricSolve:
    r"""Solve the symmetric problem of scores ``C`` (``(..., n, n)``) and marginals ``a`` to ``tol``.

    ``init_g`` (``(..., n)``, any gauge) warm-starts: for ``n <= NEWTON_N`` the first step is then
    Newton's, unchecked (from a flow's extrapolated potential it is the only one). None starts
    from the symmetric guess :math:`w = \tfrac12 (\log a - \log E 1)`. At most ``max_iter``
    iterations; systems still above ``tol`` (or whose iterates left the float range) report
    ``converged`` False. The one solver (:func:`~sinkflow.attention._solver.sinkhorn_solve`) runs
    :class:`SymmetricBall`; small CPU problems in numpy (:func:`in_numpy`).
    """
    args = [C, a.expand(C.shape[:-1]), init_g]
    small = in_numpy(C)
    if small:
        args = [None if t is None else t.detach().numpy() for t in args]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a blown-up system stops, not converged
        E, half = _kernel(args[0])
        op, report = solve_kernel(E, half, *args[1:], tol, max_iter)
        K = _row_normalized(E, op.u, op.s)[0]
    K, g, iterations, err = K, op.w - half, op.systems.iterations, op.systems.err
    if small:
        K, g, iterations, err = (torch.from_numpy(np.asarray(t)) for t in (K, g, iterations, err))
    iterations, err = torch.as_tensor(iterations, device=K.device), torch.as_tensor(err, device=K.device)
    return SymmetricSolve(K, g, iterations.to(torch.int64), err <= tol, err, report)  # NaN: not converged


def in_numpy(C) -> bool:
    """Whether the symmetric problem ``C`` runs in numpy: a CPU tensor of at most ``NUMPY_ENTRIES`` entries,
    while :func:`sinkflow.fast_paths` are on (torch's per-operation overhead is several times numpy's there)."""
    return C.device.type == "cpu" and C.numel() <= NUMPY_ENTRIES and fast_paths_enabled()


def solve_kernel(E, half, a, init_g, tol, max_iter):
    """The symmetric problem of kernel ``E = exp(D)`` and ``half = m / 2`` (:func:`_kernel`), numpy arrays or
    torch tensors alike, on the one solver: ``(operator, SolveReport)``. The operator holds the result: the
    plan ``diag(1 / s) E diag(u)`` (``op.u``, ``op.s``; not formed), ``op.w - half`` the potential ``g``, per
    system ``op.systems.iterations`` and the column error ``op.systems.err``. Call it under ``np.errstate`` as
    :func:`solve_symmetric` does.
    """
    op = SymmetricBall(E, half, a, tol, max_iter)
    warm_newton = init_g is not None and op.newton  # a warm start's first step is Newton's, unchecked
    _, report = sinkhorn_solve(op, None, init_g, tol=tol, max_iter=-(-max_iter // op.every), accelerate=False,
                               stall=False, read_start=not warm_newton)
    return op, op.report(report)


class SymmetricBall:
    r"""The kernel operator of the symmetric problem (module docstring): a whole symmetric step per step.

    The state is the potential :math:`w = g + m/2` (``potentials() = (None, g)``); a step is ``every``
    iterations (1 for ``n <= NEWTON_N``, whose error is read after each; else ``_CHECK_EVERY``) of the
    heavy ball, or Newton's steps once a system's error is below ``_NEWTON_FROM``. The error read after
    a step computes :math:`s = E e^w`, which the next step uses: one product per iteration. Batches are
    independent systems, frozen one by one (``_Systems``): each stops when its own column error is at
    most ``tol``, or is not a number (a system that blew up stops, not converged); the error the solver
    reads is the largest of those still iterating (of the stopped ones when none is), so the solver's
    one stopping rule stops when every system has stopped. numpy arrays or torch tensors alike.
    """

    domain = "log"
    rescalable = False
    differentiable = False
    check_every = 1

    def __init__(self, E, half, a, tol, max_iter):
        self.E, self.half, self.a, self.b, self.tol, self.max_iter = E, half, a, a, tol, max_iter
        self.xp = _xp(E)
        self.log_a = self.xp.log(a)
        self.newton = E.shape[-1] <= NEWTON_N
        self.every = 1 if self.newton else _CHECK_EVERY
        self.matvec = operator.matmul if self.xp is np and E.ndim == 2 else _matvec  # (as _matvec, no tests)

    def reset(self, scale, f, g):
        warm = g is not None
        self.w = g + self.half if warm else 0.5 * (self.log_a - self.xp.log(self.E.sum(-1)))
        self.previous, self.u, self.s, self.count = self.w, None, None, 0
        self.systems = _Systems(self.xp, self.w, warm and self.newton)

    def _sums(self):
        if self.s is None:
            self.u = self.xp.exp(self.w)
            self.s = self.matvec(self.E, self.u)
        return self.u, self.s

    def step(self, row, omega, fused):
        xp, systems, newton = self.xp, self.systems, self.newton
        if not systems.batched:
            return self._step_one()
        for _ in range(min(self.every, self.max_iter - self.count)):
            u, s = self._sums()
            w = self.w
            F = w + xp.log(s) - self.log_a
            close = systems.err < _NEWTON_FROM if newton else False
            if newton and bool(close.all()):
                step = _newton_step(self.E, u, s, F, systems.active if systems.batched else None)
                if not float(xp.abs(step).max()) <= _NEWTON_MAX:  # too far for Newton: a heavy-ball step
                    step = _newton_or_ball(xp, step, _GAMMA * F - _MOMENTUM * (w - self.previous))
            else:
                step = _GAMMA * F - _MOMENTUM * (w - self.previous)
                if newton and bool(close.any()):
                    newton_step = _newton_step(self.E, u, s, F, close & systems.active)
                    step = xp.where(close[..., None], _newton_or_ball(xp, newton_step, step), step)
            self.previous, self.w, self.s = w, systems.advanced(w, step), None
            self.count += 1

    def _step_one(self):
        """:meth:`step` of one system, without the batch's bookkeeping: the same iterates in half the
        operations (a particle step at n = 16-64 is a few dozen of them)."""
        xp, k = self.xp, min(self.every, self.max_iter - self.count)
        for _ in range(k):
            u, s = self._sums()
            w = self.w
            F = w + xp.log(s) - self.log_a
            step = None
            if self.newton and self.systems.err < _NEWTON_FROM:  # NaN compares False: the heavy ball
                step = _newton_solve(self.E, u, s, F)
                step = step if float(xp.abs(step).max()) <= _NEWTON_MAX else None  # too far for Newton
            if step is None:
                step = _GAMMA * F - _MOMENTUM * (w - self.previous)
            self.previous, self.w, self.s = w, w - step, None
        self.count += k
        self.systems.iterations = self.systems.iterations + k

    def error(self, row):
        u, s = self._sums()
        return self.systems.read(self.E, u, s, self.a, self.tol)

    def potentials(self):
        return None, self.w - self.half

    def finish(self):
        self._sums()
        return self  # the result: op.u, op.s, op.w - half, op.systems (solve_kernel)

    def report(self, solved):
        """The solver's report in iterations, with the largest column error of any system (NaN if one blew up)."""
        systems = self.systems
        worst = float(systems.err.max() if systems.batched else systems.err)
        count = int(systems.iterations.max() if systems.batched else systems.iterations)
        return SolveReport(count, worst, worst <= self.tol, solved.errors, solved.scales)


def fixed_symmetric(C: torch.Tensor, a: torch.Tensor, n_iter: int, init_g: torch.Tensor | None):
    """``n_iter`` alternating half-iterations (row first) on the kernel :math:`a_j e^{C_{ij}}` (the
    flow's), in the kernel domain with one exponential pass: ``(K, g)``, ``g`` the column potential
    of those scores (:class:`AlternatingScaling` on the solver's fixed-count entry; exact to rounding
    at any spread of the particles). Small CPU problems in numpy (:func:`in_numpy`).
    """
    small = in_numpy(C)
    args = [C, a.expand(C.shape[:-1]), init_g]
    if small:
        args = [None if t is None else t.detach().numpy() for t in args]
    K, g = fixed_count(*args, n_iter)
    return (torch.from_numpy(K), torch.from_numpy(g)) if small else (K, g)


def fixed_count(C, a, init_g, n_iter, report=False):
    """``n_iter`` half-iterations of :class:`AlternatingScaling` on the solver's lean fixed-count entry,
    numpy arrays or torch tensors alike: ``(K, g)``, and the :class:`SolveReport` with ``report``
    (the errors then read after every half-step)."""
    (K, g), solved = sinkhorn_solve(AlternatingScaling(C, a), None, init_g, n_iter=n_iter, report=report)
    return ((K, g), solved) if report else (K, g)


class AlternatingScaling:
    r"""The kernel operator of a fixed count on the kernel :math:`a_j e^{C_{ij}}`: numpy arrays or torch tensors.

    ``K = diag(u) G diag(v)`` with :math:`G_{ij} = e^{C_{ij} + \alpha_i + \beta_j}`, starting from
    :math:`\beta = \log a + g_0` and the row maxima :math:`\alpha_i = -\max_j (C_{ij} + \beta_j)`
    of the first (SoftMax) step: ``G <= 1`` with a 1 in every row, and a row step sets
    ``u = 1 / (G v)``, a column step ``v = a / (G^T (a u))``. Where a half-step's sums fall below
    ``sqrt(tiny)`` (a column that every row outweighs by more than half the float exponent range:
    particles spread far in R^d), those lines alone are refreshed from the scores
    (:func:`_refresh_lines`), so the scalings stay in range and the result is exact to rounding
    at any spread, for one exponential pass plus a pass over the refreshed lines.
    """

    domain = "scaling"
    rescalable = False
    differentiable = False
    check_every = 1

    def __init__(self, C, a):
        self.C, self.a, self.b = C, a, a
        self.xp = _xp(C)
        self.log_a = self.xp.log(a)
        self.low = _SQRT_TINY[C.dtype]

    def reset(self, scale, f, g):
        xp = self.xp
        self.beta = self.log_a + (0.0 if g is None else g)
        T = self.C + self.beta[..., None, :]
        self.alpha = -(T.max(-1) if xp is np else T.amax(-1))
        T += self.alpha[..., :, None]
        self.G = np.exp(T, out=T) if xp is np else T.exp_()
        self.u, self.v = None, None  # v = 1

    def step(self, row, omega, fused):
        C, G, a, xp, low = self.C, self.G, self.a, self.xp, self.low
        if row:
            v = self.v
            s = G.sum(-1) if v is None else _matvec(G, v)  # the first sums are >= 1: a 1 in every row
            if v is not None and not _all_above(s, low):
                bad = ~(s >= low)  # NaN included
                _refresh_lines(C, G, self.alpha, self.beta, xp.log(v), xp.zeros_like(s), bad)
                s[bad] = 1.0
            self.u = 1.0 / s
        else:
            c = _matvec(G.swapaxes(-1, -2), a * self.u)
            if not _all_above(c, low):
                bad = ~(c >= low)
                _refresh_lines(C.swapaxes(-1, -2), G.swapaxes(-1, -2), self.beta, self.alpha, xp.log(a * self.u),
                               self.log_a, bad)
                c[bad] = a[bad]
            self.v = a / c

    def error(self, row):
        """L1 error of the marginal the last half-step left (columns after a row step, else rows)."""
        u = self.u
        v = 1.0 if self.v is None else self.v
        if row:
            return self.xp.abs(v * _matvec(self.G.swapaxes(-1, -2), self.a * u) - self.a).sum(-1)
        return (self.a * self.xp.abs(u * _matvec(self.G, v) - 1.0)).sum(-1)

    def potentials(self):
        return None, self.beta - self.log_a if self.v is None else self.beta + self.xp.log(self.v) - self.log_a

    def finish(self):
        K = self.G * self.u[..., :, None]
        if self.v is None:
            return K, self.beta - self.log_a
        K *= self.v[..., None, :]
        return K, self.beta + self.xp.log(self.v) - self.log_a

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

