r"""Exact fast attention fields on the circle and on the sphere :math:`S^2` (docs/theory/clustering.md).

With :math:`Q = K = V = I` and :math:`\beta = 1/\tau` the kernel of attention on the unit sphere
depends on :math:`\langle x, y\rangle` only. Scaled by :math:`e^{-\beta}` (no overflow at any
:math:`\beta`; the factor cancels in SoftMax and Sinkhorn) it expands in harmonics:

.. math::

    \text{circle:}\quad e^{\beta(\cos t - 1)} = \sum_{k \in \mathbb{Z}} \tilde I_k(\beta)\, e^{ikt},
    \qquad
    S^2:\quad e^{\beta(\langle x, y\rangle - 1)} = \sum_{l \ge 0} (2l+1)\, \tilde\imath_l(\beta)\, P_l(\langle x, y\rangle),

with :math:`\tilde I_k = e^{-\beta} I_k` (``scipy.special.ive``, Jacobi-Anger) and
:math:`\tilde\imath_l = e^{-\beta} i_l = \sqrt{\pi/(2\beta)}\, \tilde I_{l+1/2}` (Funk-Hecke), and the
addition theorem :math:`P_l(\langle x, y\rangle) = \frac{4\pi}{2l+1}\sum_m Y_{lm}(x) Y_{lm}(y)` (real
harmonics). Truncated at order :math:`K` (:math:`L`), the kernel is :math:`\Phi \Lambda \Phi^T` with
:math:`r = 2K+2` (:math:`(L+1)^2`) features per particle, so applying it to a vector costs
:math:`O(n r)` instead of :math:`O(n^2)`: SoftMax is one application, Sinkhorn one per iteration.

**Truncation.** The order is the smallest whose dropped terms sum (a sup-norm bound of the dropped
kernel: :math:`|e^{ikt}|, |P_l| \le 1`) to at most ``tol * min_i a_i / 4``. A row sum is at least
the particle's own term :math:`a_i`, so every SoftMax velocity is within ``tol`` of the exact one,
whatever the configuration; the Sinkhorn field is checked against the dense one in the tests.

**Sinkhorn.** ``n_iter=None`` solves the symmetric scaling :math:`u_i (\tilde K a u)_i = 1`
(:math:`K^\infty_{ij} = u_i \tilde K_{ij} a_j u_j`, the fixed point of the alternating iteration,
rows normalized at the end). As :math:`\tilde K = \Phi\Lambda\Phi^T`, :math:`u = 1/(\Phi\Lambda x)` with
:math:`x = \Phi^T(a u)`: the scaling is the fixed point of the moment map
:math:`H(x) = \Phi^T\big(a / (\Phi\Lambda x)\big)` in :math:`r` dimensions. Its Jacobian is
:math:`-G\Lambda`, :math:`G = \Phi^T \mathrm{diag}(a u^2)\, \Phi`, whose nonzero eigenvalues are those of
:math:`P = K^\infty` (in :math:`[0, 1]`; 1 for the scaling :math:`x \to cx`), and they fall with
:math:`\Lambda`: only the leading modes are slow. Newton's step on the modes :math:`R` of eigenvalue above
``_NEWTON_RATIO`` of the largest (at most ``_NEWTON_MAX``): :math:`x \leftarrow H(x) + t`,
:math:`t_R = (I + G_{RR}\Lambda_R)^{-1} f_R - f_R` (:math:`f = H(x) - x`), the plain step on the others;
:math:`G_{RR}` costs :math:`n |R|^2`, formed on the first iteration and again while the marginal error
is above ``_NEWTON_FAR`` or an iteration gains less than 10x. One kernel application per iteration
(matrix-vector products: the sums of the current iterate, for its marginal error, and of the next
point; the moments of the next); the field's numerators ride along in the last sweep when the last
two errors predict convergence, else one more application computes them: 5 applications from a
warm start in a flow to 1e-10 (11-15 for the heavy ball on :math:`\log u` before), 8-11 cold. A fixed
``n_iter`` runs the alternating half-iterations of :func:`sinkflow.solve_sinkhorn` (row step first),
one application each.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from sinkflow._backend import check_finite, check_float, check_number, from_torch, leading, to_torch
from sinkflow._checks import check_choice
from sinkflow.particles._dense_fields import FieldEvaluation, check_weights
from sinkflow.particles._harmonic_kernels import HarmonicKernel, _Factored, harmonic_kernel
from sinkflow.particles._integrators import ParticleField

__all__ = ["HarmonicField", "harmonic_attention_field", "HarmonicParticleField", "harmonic_choice", "HARMONIC_MIN_N"]

#: Below this many particles :func:`sinkflow.simulate` keeps the dense field (a few ms either way).
HARMONIC_MIN_N = 512
_NORMALIZATIONS = {"softmax": "row", "sinkhorn": "sinkhorn"}
_COST_RATIO = 2  # the harmonic field replaces the dense one when rank * _COST_RATIO <= n (benchmarks/bench_harmonic.py)
_NEWTON_RATIO = 1e-2  # Newton's block: the modes of eigenvalue above this fraction of the largest
_NEWTON_MAX = 400  # and at most this many (its Gram matrix costs n * rows^2)
_NEWTON_FAR = 1e-3  # marginal error above which the Jacobian is formed anew at every step


@dataclass(frozen=True)
class HarmonicField:
    """Result of :func:`harmonic_attention_field`.

    Attributes
    ----------
    velocity : array (n, d)
        :math:`\\sum_j K_{ij} x_j` (not projected on the tangent spaces).
    g : array (n,) or None
        Log scaling of the Sinkhorn solve (:math:`\\log u`, or the last column scaling for a fixed
        ``n_iter``), the warm start of the next solve; None for SoftMax.
    n_iter : int
        Kernel applications of the Sinkhorn solve, a separate pass for the field's numerators
        included (1 for SoftMax).
    converged : bool
    row_error, column_error : float
        Marginal errors (NaN unless ``need_errors``).
    kernel : HarmonicKernel
    """

    velocity: Any
    g: Any
    n_iter: int
    converged: bool
    row_error: float
    column_error: float
    kernel: HarmonicKernel


def harmonic_attention_field(x, attention: str = "softmax", *, temperature: float = 1.0, weights=None,
                             n_iter: int | None = None, tol: float = 1e-10, max_iter: int = 20_000, init_g=None,
                             need_errors: bool = False, kernel: HarmonicKernel | None = None) -> HarmonicField:
    r"""SoftMax or Sinkhorn attention field of unit vectors on the circle or :math:`S^2` in :math:`O(n r)`.

    Exact up to ``tol`` (the truncation, module docstring): equal to the dense field of
    :func:`sinkflow.simulate` with :math:`Q = K = V = I` and scores :math:`\langle x_i, x_j\rangle/\tau`.

    Parameters
    ----------
    x : array (n, 2) or (n, 3)
        Unit vectors (float; computed in float64, returned in ``x``'s dtype).
    attention : {"softmax", "sinkhorn"}
    temperature : float
        :math:`\tau = 1/\beta`.
    weights : array (n,), optional
        Positive particle weights summing to 1 (uniform by default).
    n_iter : int or None
        Sinkhorn half-iterations (None: to ``tol``, by the symmetric iteration).
    tol : float
        Accuracy of the truncation and Sinkhorn's marginal tolerance.
    max_iter : int
        Most kernel applications of a Sinkhorn solve to ``tol``.
    init_g : array (n,), optional
        Warm start (``g`` of a previous call).
    need_errors : bool
        Measure the marginal errors (one more application for Sinkhorn).
    kernel : HarmonicKernel, optional
        A precomputed :func:`harmonic_kernel` (its ``beta`` must be ``1/temperature``).

    Returns
    -------
    HarmonicField

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> from sinkflow.particles import harmonic_attention_field
    >>> x = sinkflow.random_particles(600, 2, seed=0, manifold="sphere")
    >>> fast = harmonic_attention_field(x, "softmax", temperature=0.2)
    >>> K = sinkflow.softmax(x @ x.T / 0.2)
    >>> bool(np.abs(fast.velocity - K @ x).max() < 1e-10), fast.kernel.order
    (True, 21)
    """
    X, numpy_out = leading(x, "x", weights, init_g)
    check_float(X, "x")
    if X.ndim != 2 or X.shape[1] not in (2, 3) or X.shape[0] < 1:
        raise ValueError(f"x must have shape (n, 2) or (n, 3) (the circle or S^2), got {tuple(X.shape)}")
    check_finite(X, "x")
    if float((X.norm(dim=1) - 1).abs().max()) > (1e-8 if X.dtype == torch.float64 else 1e-5):
        raise ValueError("x must be unit vectors (points of the circle or the sphere)")
    check_choice(attention, "attention", tuple(_NORMALIZATIONS))
    n_iter = check_number(n_iter, "n_iter", integer=True, positive=True, allow_none=True)
    max_iter = check_number(max_iter, "max_iter", integer=True, positive=True)
    X64 = X.to(torch.float64)
    a = check_weights(weights, X64)
    a = torch.full((X.shape[0],), 1.0 / X.shape[0], dtype=torch.float64, device=X.device) if a is None else a
    if kernel is None:
        kernel = harmonic_kernel(temperature, X.shape[1], tol, float(a.min()))
    elif not isinstance(kernel, HarmonicKernel) or kernel.d != X.shape[1] or not math.isclose(kernel.beta, 1 / temperature):
        raise ValueError("kernel must be a harmonic_kernel of this temperature and dimension")
    g0 = None if init_g is None else to_torch(init_g, "init_g", like=X64).reshape(-1)
    out = _evaluate(kernel, X64, a, _NORMALIZATIONS[attention], n_iter, float(tol), int(max_iter), g0,
                    bool(need_errors))
    return HarmonicField(from_torch(out.velocity.to(X.dtype), numpy_out), from_torch(out.g, numpy_out), out.n_iter,
                         out.converged, out.row_error, out.column_error, kernel)


def _evaluate(kernel, X, a, normalization, n_iter, tol, max_iter, g0, need_errors) -> FieldEvaluation:
    """The field of ``kernel`` at the particles ``X`` (float64 tensors) as a :class:`FieldEvaluation` (no
    ``attention``); the features are kept between applications unless there is only one on :math:`S^2`
    (there storing them costs more than forming them twice; on the circle less at beta = 5)."""
    single = normalization == "row" or n_iter == 1
    F = _Factored(kernel, X, keep=not single or need_errors or kernel.d == 2)
    if single:
        vel, row_sums = _rows(F, a, torch.ones_like(a) if g0 is None or normalization == "row" else torch.exp(g0))
        col = _column_error(F, a, row_sums, torch.ones_like(a)) if need_errors else math.nan
        return FieldEvaluation(vel, None, None, 1, True, 0.0 if need_errors else math.nan, col)
    if n_iter is None:
        return _symmetric_sinkhorn(F, a, g0, tol, max_iter, need_errors)
    return _alternating_sinkhorn(F, a, g0, n_iter, need_errors)


def _values(X, w):
    """The weights ``[w, w x]`` whose kernel application gives row sums and numerators."""
    return torch.cat([w[:, None], w[:, None] * X], 1)


def _rows(F, a, s):
    """Row-normalized field of the kernel with column scaling ``s``: velocity and row sums of ``K diag(a s)``."""
    vel, sums = torch.empty_like(F.X), torch.empty_like(a)

    def step(i0, i1, R):
        sums[i0:i1] = R[:, 0]
        vel[i0:i1] = R[:, 1:] / R[:, :1]

    F.sweep(F.position_moments(a * s), step)
    return vel, sums


def _column_error(F, a, row_sums, s):
    """:math:`\\sum_j |\\sum_i a_i K_{ij} - a_j|` for rows normalized, :math:`K_{ij} = \\tilde K_{ij} a_j s_j / r_i`."""
    total = torch.zeros((), dtype=a.dtype, device=a.device)
    M = F.moments((a / row_sums)[:, None])

    def step(i0, i1, R):
        nonlocal total
        total = total + (a[i0:i1] * s[i0:i1] * R[:, 0] - a[i0:i1]).abs().sum()

    F.sweep(M, step)
    return float(total)


def _symmetric_sinkhorn(F, a, g0, tol, max_iter, need_errors) -> FieldEvaluation:
    """The symmetric scaling by the moment map with Newton's correction on its leading modes (module docstring).

    Sweep ``j`` evaluates, block by block, the kernel sums of the current iterate ``u`` (moments
    ``P``; its marginal error) and of the next point ``x = P + t`` (``t``: the Newton correction,
    nonzero on the leading modes only), and accumulates the moments of ``u_next = 1 / (Phi Lambda x)``:
    one kernel application per iteration, features used once. The Jacobian's leading block is
    formed on the first sweep and again whenever an iteration gains less than 10x. The numerators of
    the field ride along (moments of ``a u x``) only once the last two errors predict that ``u_next``
    converges; else one more application computes them for the converged ``u``.
    """
    u = torch.ones_like(a) if g0 is None else torch.exp(g0)
    P = F.moments((a * u)[:, None])
    lam, errs, ready = F.lam[:, 0], [], False
    rows = _newton_rows(lam)
    t, E, u_next, vel = torch.zeros_like(P), torch.empty_like(a), torch.empty_like(a), torch.empty_like(F.X)
    done, err, previous, jacobian = 0, math.inf, math.inf, None
    while done < max_iter:
        done += 1
        carry = len(errs) >= 2 and errs[-1] ** 3 <= tol * errs[-2] ** 2  # err * (its gain)^2 <= tol
        state = {"err": 0.0, "positive": True}

        def step(i0, i1, R):
            E[i0:i1] = R[:, 0]
            state["err"] += float((a[i0:i1] * (u[i0:i1] * R[:, 0] - 1).abs()).sum())
            if R.shape[1] > 2:  # P carries the numerators
                vel[i0:i1] = R[:, 1:-1] / R[:, :1]
            state["positive"] &= bool((R[:, -1] > 0).all())
            torch.reciprocal(R[:, -1], out=u_next[i0:i1])
            w = a[i0:i1] * u_next[i0:i1]
            return _values(F.X[i0:i1], w) if carry else w[:, None]

        P_next = F.sweep(torch.cat([P, P[:, :1] + t], 1), step)
        err = state["err"]
        errs.append(err)
        if err <= tol or not math.isfinite(err):
            ready = P.shape[1] > 1
            break
        if not state["positive"]:  # the corrected point went too far: the plain step from u
            t.zero_()
            torch.reciprocal(E, out=u_next)
            P_next, jacobian = F.moments((a * u_next)[:, None]), None
        refresh = jacobian is None or err > _NEWTON_FAR or err > 0.1 * previous  # far, or the last step gained < 10x
        previous, f = err, P_next[:, :1] - P[:, :1] - t  # f = H(x) - x
        if refresh:
            G = F.gram(rows, a * u_next * u_next)
            jacobian = torch.linalg.lu_factor(torch.eye(len(rows), dtype=G.dtype) + G * lam[rows][None, :])
            previous = math.inf  # the next iterate was not stepped with this one: no verdict on it
        t = torch.zeros_like(f)
        t[rows] = torch.linalg.lu_solve(*jacobian, f[rows]) - f[rows]
        u, u_next, P = u_next, u, P_next
    vel, sums = (vel, E) if ready else _rows(F, a, u)
    col = _column_error(F, a, sums, u) if need_errors else math.nan
    return FieldEvaluation(vel, None, torch.log(u), done + (not ready), err <= tol, 0.0 if need_errors else math.nan,
                           col)


def _newton_rows(lam: torch.Tensor) -> torch.Tensor:
    """The leading modes (eigenvalue above :data:`_NEWTON_RATIO` of the largest, at most :data:`_NEWTON_MAX`)."""
    order = torch.argsort(lam, descending=True)
    count = min(_NEWTON_MAX, int((lam > _NEWTON_RATIO * lam.max()).sum()))
    return torch.sort(order[:count]).values


def _alternating_sinkhorn(F, a, g0, n_iter, need_errors) -> FieldEvaluation:
    """``n_iter`` half-iterations, row step first from the column scaling ``exp(g0)`` (1 by default):
    :math:`K = \\mathrm{diag}(\\alpha) \\tilde K \\mathrm{diag}(a \\gamma)`, :math:`\\alpha = 1/\\tilde K(a\\gamma)`,
    :math:`\\gamma = 1/\\tilde K(a\\alpha)`."""
    gamma, alpha = (torch.ones_like(a) if g0 is None else torch.exp(g0)), None
    for t in range(1, n_iter):  # all but the last half-step
        if t % 2:
            alpha = 1 / _apply_sums(F, a, gamma)
        else:
            gamma = 1 / _apply_sums(F, a, alpha)
    if n_iter % 2:  # the last step normalizes the rows: fused with the velocity
        vel, sums = _rows(F, a, gamma)
        col = _column_error(F, a, sums, gamma) if need_errors else math.nan
        return FieldEvaluation(vel, None, torch.log(gamma), n_iter, True, 0.0 if need_errors else math.nan, col)
    gamma = 1 / _apply_sums(F, a, alpha)  # ended on a column step: K applied as it is
    vel, sums = _rows(F, a, gamma)
    row_sums = alpha * sums
    row = float((a * (row_sums - 1).abs()).sum()) if need_errors else math.nan
    col = _column_error(F, a, 1 / alpha, gamma) if need_errors else math.nan
    return FieldEvaluation(vel * row_sums[:, None], None, torch.log(gamma), n_iter, True, row, col)


def _apply_sums(F, a, s):
    """:math:`\\tilde K (a s)`."""
    out = torch.empty_like(a)

    def step(i0, i1, R):
        out[i0:i1] = R[:, 0]

    F.sweep(F.moments((a * s)[:, None]), step)
    return out


@dataclass
class HarmonicParticleField(ParticleField):
    """A :class:`~sinkflow.particles.ParticleField` on the circle or :math:`S^2` evaluated by
    :func:`harmonic_attention_field` (``kernel`` set); ``g`` carries the Sinkhorn scaling."""

    kernel: HarmonicKernel | None = None

    def velocity(self, Y: torch.Tensor):
        variant = self.attention if isinstance(self.attention, str) else self.attention.name
        a = self.weights
        a = torch.full((Y.shape[0],), 1.0 / Y.shape[0], dtype=torch.float64, device=Y.device) if a is None else a.to(torch.float64)
        ev = _evaluate(self.kernel, Y.detach().to(torch.float64), a, _NORMALIZATIONS[variant], self.n_iter,
                       self.tol, self.max_iter, self.g if self.warm_start else None, self.need_errors)
        if ev.g is not None and self.warm_start:
            self.g = ev.g
        v = ev.velocity.to(Y.dtype)
        v = v - (v * Y).sum(1, keepdim=True) * Y
        return v, FieldEvaluation(v, None, ev.g, ev.n_iter, ev.converged, ev.row_error, ev.column_error)

    @classmethod
    def wrap(cls, field: ParticleField, kernel: HarmonicKernel) -> "HarmonicParticleField":
        """``field`` (its options, its state) evaluated through ``kernel``."""
        return cls(**{f.name: getattr(field, f.name) for f in dataclasses.fields(ParticleField)}, kernel=kernel)


def harmonic_choice(X: torch.Tensor, variant, W, W_V, weights, temperature: float, tol: float, sphere: bool,
                    landmarks) -> HarmonicKernel | None:
    """The kernel of the harmonic field when :func:`sinkflow.simulate` should use it, else None.

    It applies on ``manifold="sphere"`` in ``d = 2`` or ``3`` with SoftMax or Sinkhorn, identity
    ``W = W_Q^T W_K`` and ``W_V`` (None or exactly the identity), no landmarks, at least
    :data:`HARMONIC_MIN_N` particles, and is used when cheaper: ``rank * 2 <= n`` (a dense
    application costs ~``n^2`` exponentials, a harmonic one ~``n * rank`` products).
    """
    n, d = X.shape
    if not sphere or landmarks is not None or d not in (2, 3) or n < HARMONIC_MIN_N:
        return None
    if getattr(variant, "name", variant) not in _NORMALIZATIONS:
        return None
    eye = torch.eye(d, dtype=X.dtype, device=X.device)
    if any(M is not None and not torch.equal(M.detach(), eye) for M in (W, W_V)):
        return None
    min_weight = 1.0 / n if weights is None else float(weights.detach().min())
    kernel = harmonic_kernel(temperature, d, tol, min_weight)
    return kernel if kernel.rank * _COST_RATIO <= n else None
