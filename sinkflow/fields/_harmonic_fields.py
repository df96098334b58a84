r"""Exact fast attention fields on the circle and on the sphere :math:`S^2` (docs/theory/clustering.md).

With :math:`Q = K = V = I` and :math:`\beta = 1/\tau` the kernel of attention on the unit sphere
depends on :math:`\langle x, y\rangle` only. Scaled by :math:`e^{-\beta}` (no overflow at any
:math:`\beta`; the factor cancels in SoftMax and Sinkhorn) it expands in harmonics:

.. math::

    \text{circle:}\quad e^{\beta(\cos t - 1)} = \sum_{k \in \mathbb{Z}} \tilde I_k(\beta)\, e^{ikt},
    \qquad
    S^2:\quad e^{\beta(\langle x, y\rangle - 1)}
    = \sum_{l \ge 0} (2l+1)\, \tilde\imath_l(\beta)\, P_l(\langle x, y\rangle),

with :math:`\tilde I_k = e^{-\beta} I_k` (``scipy.special.ive``, Jacobi-Anger) and
:math:`\tilde\imath_l = e^{-\beta} i_l = \sqrt{\pi/(2\beta)}\, \tilde I_{l+1/2}` (Funk-Hecke), and the
addition theorem :math:`P_l(\langle x, y\rangle) = \frac{4\pi}{2l+1}\sum_m Y_{lm}(x) Y_{lm}(y)` (real
harmonics). Truncated at order :math:`K` (:math:`L`), the kernel is :math:`\Phi \Lambda \Phi^T` with
:math:`r = 2K+2` (:math:`(L+1)^2`) features per particle, so applying it to a vector costs
:math:`O(n r)` instead of :math:`O(n^2)`: SoftMax is one application, Sinkhorn one per iteration.

**Truncation.** The order is the smallest whose dropped terms sum (a sup-norm bound of the dropped
kernel: :math:`|e^{ikt}|, |P_l| \le 1`) to at most ``tol * min_i a_i / 4``. A row sum is at least
the particle's own term :math:`a_i`, so every SoftMax velocity is within ``tol`` of the exact one,
whatever the configuration; the Sinkhorn field is checked against the dense one in the tests. The
fields chosen here (no ``kernel`` given) truncate for rows down to a quarter of the least mean row sum
(:func:`~sinkflow.fields._harmonic_kernels.likely_kernel`) and certify each evaluation by its smallest
row (:meth:`HarmonicKernel.certifies`), else evaluate it again with the guaranteed truncation.

**Sinkhorn.** ``n_iter=None`` solves the symmetric scaling :math:`u_i (\tilde K a u)_i = 1`
(:math:`K^\infty_{ij} = u_i \tilde K_{ij} a_j u_j`, the fixed point of the alternating iteration,
rows normalized at the end). As :math:`\tilde K = \Phi\Lambda\Phi^T`, :math:`u = 1/(\Phi\Lambda x)` with
:math:`x = \Phi^T(a u)`: the scaling is the fixed point of the moment map
:math:`H(x) = \Phi^T\big(a / (\Phi\Lambda x)\big)` in :math:`r` dimensions. Its Jacobian is
:math:`-G\Lambda`, :math:`G = \Phi^T \mathrm{diag}(a u^2)\, \Phi`, whose nonzero eigenvalues are those of
:math:`P = K^\infty` (in :math:`[0, 1]`; 1 for the scaling :math:`x \to cx`), and they fall with
:math:`\Lambda`: only the leading modes are slow. Newton's step on the modes :math:`R` of eigenvalue above
``_NEWTON_RATIO`` of the largest (at most ``_NEWTON_MAX``; ``_harmonic_solvers.py``): :math:`x \leftarrow H(x) + t`,
:math:`t_R = (I + G_{RR}\Lambda_R)^{-1} f_R - f_R` (:math:`f = H(x) - x`), the plain step on the others.
On the circle :math:`G_{RR}` is gathered from the moments of :math:`a u^2` (products of
:math:`\cos, \sin` are sums of them) and formed at every iteration; on :math:`S^2` it costs
:math:`n |R|^2`, formed on the first iteration and again while the marginal error is above
``_NEWTON_FAR`` or a corrected iteration gains less than 10x; in a flow a solve starts from the
last solve's inverse (the particles moved little between solves). The start is scaled to
:math:`(au)^T\tilde K(au) = 1` (as the fixed point is: the plain step leaves that mode alone). One
sweep of the features per iteration, by cache-sized block: the sums of the current iterate (its
marginal error) and of the next point, then the moments of the next; the field's numerators ride
along when the next is predicted to converge (in a flow: by the previous solve's count), and a sweep
predicted last skips the moments. In a flow, warm-started from the extrapolation of the last three
scalings, a solve to 1e-10 takes 3 applications on the circle and on :math:`S^2` (there from the
6th-7th step), the field's included (5 before, 11-15 by the heavy ball on :math:`\log u`), 5-8 cold. A fixed
``n_iter`` runs the alternating half-iterations of :func:`sinkflow.solve_sinkhorn` (row step first),
one application each.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sinkflow._backend import check_finite, check_float, check_number, from_torch, leading, to_torch
from sinkflow._checks import check_choice
from sinkflow.attention._variants import get_attention
from sinkflow.fields._dense_fields import FieldEvaluation, check_weights
from sinkflow.fields._harmonic_kernels import HarmonicKernel, _Factored, likely_kernel, retruncated
from sinkflow.fields._harmonic_solvers import alternating_sinkhorn, passes, symmetric_sinkhorn
from sinkflow.fields._particle_field import ParticleField, _appended

__all__ = ["HarmonicField", "harmonic_attention_field", "HarmonicParticleField", "harmonic_choice", "HARMONIC_MIN_N"]

#: Below this many particles :func:`sinkflow.simulate` keeps the dense field (a few ms either way).
HARMONIC_MIN_N = 512
_NORMALIZATIONS = {"softmax": "row", "sinkhorn": "sinkhorn"}
_COST_RATIO = 2  # the harmonic field replaces the dense one when rank * _COST_RATIO <= n (benchmarks/bench_harmonic.py)


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
        The truncation that evaluated the field: the likely one, or its ``fallback`` where the likely
        one did not certify the field's smallest row (a particle far from all the others).
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
        A precomputed :func:`harmonic_kernel` (its ``beta`` must be ``1/temperature``), used as it is. By
        default the likely truncation (rows down to a quarter of the mean row sum), certified at
        each evaluation, with the guaranteed one (rows down to the smallest weight) as its fallback.

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
    (True, 19)
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
        kernel = likely_kernel(temperature, X.shape[1], tol, float(a.min()))
    elif (not isinstance(kernel, HarmonicKernel) or kernel.d != X.shape[1]
          or not math.isclose(kernel.beta, 1 / temperature)):
        raise ValueError("kernel must be a harmonic_kernel of this temperature and dimension")
    g0 = None if init_g is None else to_torch(init_g, "init_g", like=X64).reshape(-1)
    out, following = _evaluate(kernel, X64, a, _NORMALIZATIONS[attention], n_iter, float(tol), int(max_iter), g0,
                               bool(need_errors))
    kernel = kernel if following is kernel or kernel.fallback is None else kernel.fallback
    return HarmonicField(from_torch(out.velocity.to(X.dtype), numpy_out), from_torch(out.g, numpy_out), out.n_iter,
                         out.converged, out.row_error, out.column_error, kernel)


def _evaluate(kernel, X, a, normalization, n_iter, tol, max_iter, g0, need_errors,
              memory=None) -> tuple[FieldEvaluation, HarmonicKernel]:
    """The field of ``kernel`` at the particles ``X`` (float64 tensors) as a :class:`FieldEvaluation` (no
    ``attention``; ``memory``: a dict a flow keeps between the solves of one stage), and the kernel for the
    next evaluation. Where ``kernel`` does not certify the field's smallest row
    (:meth:`HarmonicKernel.certifies`) its ``fallback`` evaluates the field, and the next kernel is cut for
    half that row (:func:`~sinkflow.fields._harmonic_kernels.retruncated`: a flow whose stragglers stay
    pays the second evaluation once); a fixed ``n_iter`` of Sinkhorn always takes the fallback (its
    iterates' rows go unchecked)."""
    if kernel.fallback is not None and normalization == "sinkhorn" and n_iter not in (None, 1):
        kernel = kernel.fallback
    ev, smallest_row = _evaluate_with(kernel, X, a, normalization, n_iter, tol, max_iter, g0, need_errors,
                                      None if memory is None else memory.setdefault(kernel.order, {}))
    if kernel.fallback is None or kernel.certifies(tol, smallest_row):
        return ev, kernel
    ev, _ = _evaluate(kernel.fallback, X, a, normalization, n_iter, tol, max_iter, g0, need_errors, memory)
    return ev, retruncated(kernel, tol, smallest_row)


def _evaluate_with(kernel, X, a, normalization, n_iter, tol, max_iter, g0, need_errors, memory):
    """:func:`_evaluate` by ``kernel`` alone, and the smallest row of the field (:meth:`HarmonicKernel.certifies`;
    NaN for a fixed ``n_iter`` of Sinkhorn). The harmonics are kept between applications unless there is
    only one on :math:`S^2` (there storing them costs more than forming them twice; on the circle less at
    beta = 5); one application on :math:`S^2` runs in the product basis (:meth:`_Factored.position_moments`),
    without forming the harmonics."""
    single = normalization == "row" or n_iter == 1
    if single and kernel.d == 3 and not need_errors:
        start = torch.ones_like(a) if g0 is None or normalization == "row" else torch.exp(g0)
        velocity, smallest = _basis_field(_Factored(kernel, X, keep=False), a * start)
        return (FieldEvaluation(velocity, None, None, 1, True, math.nan, math.nan),
                smallest / float((a * start).sum()))
    keep = not single or need_errors or kernel.d == 2
    P = passes(_Factored(kernel, X, keep=keep and kernel.d == 3), a, keep)
    xp = P.xp
    s = xp.ones_like(P.a) if g0 is None or normalization == "row" else xp.exp(P.array(g0))
    row = col = smallest = math.nan
    if single:
        velocity, sums = P.field(s)
        row, col = (0.0, P.column_error(sums, s)) if need_errors else (row, col)
        g, applications, converged = None, 1, True
    elif n_iter is None:
        velocity, sums, s, applications, converged, _ = symmetric_sinkhorn(P, s, tol, max_iter, memory)
        row, col = (0.0, P.column_error(sums, s)) if need_errors else (row, col)
        g = xp.log(s)
    else:
        velocity, s, row, col = alternating_sinkhorn(P, s, n_iter, need_errors)
        g, applications, converged = xp.log(s), n_iter, True
    if n_iter is None or single:
        smallest = float(sums.min()) / float((P.a * s).sum())
    velocity = torch.from_numpy(np.ascontiguousarray(velocity.T)) if P.numpy else velocity.T.contiguous()
    g = g if g is None or not P.numpy else torch.from_numpy(g)
    return FieldEvaluation(velocity, None, g, applications, converged, row, col), smallest


def _basis_field(F: _Factored, w: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Row-normalized field of the kernel with column weights ``w`` (``(n, d)``), by one sweep of the basis,
    and its smallest row sum."""
    velocity, smallest = torch.empty_like(F.X), []

    def step(i0, i1, R):
        torch.div(R[:, 1:], R[:, :1], out=velocity[i0:i1])
        smallest.append(float(R[:, 0].min()))

    F.sweep(F.position_moments(w), step)
    return velocity, min(smallest)


@dataclass
class HarmonicParticleField(ParticleField):
    """A :class:`~sinkflow.particles.ParticleField` on the circle or :math:`S^2` evaluated by
    :func:`harmonic_attention_field` (``kernel`` set); ``g`` carries the Sinkhorn scaling."""

    kernel: HarmonicKernel | None = None
    memory: dict = dataclasses.field(default_factory=dict)  # per stage: what the last solve learned

    def velocity(self, Y: torch.Tensor):
        normalization = get_attention(self.attention).solver
        stage = self.calls % self.stages
        self.calls += 1
        a = self.weights
        if a is None:
            a = torch.full((Y.shape[0],), 1.0 / Y.shape[0], dtype=torch.float64, device=Y.device)
        else:
            a = a.to(torch.float64)
        extrapolate = self.symmetric and self.n_iter is None and self.warm_start
        zero = torch.zeros((), dtype=torch.float64, device=Y.device)  # the scaling's w is its g (no score diagonal)
        ev, self.kernel = _evaluate(self.kernel, Y.detach().to(torch.float64), a, normalization,
                                    self.n_iter, self.tol, self.max_iter,
                                    self._start(stage, zero if extrapolate else None),
                                    self.need_errors, self.memory.setdefault(stage, {}) if self.warm_start else None)
        if ev.g is not None and self.warm_start:
            self.g = ev.g
            if extrapolate:
                self.history[stage] = _appended(self.history.get(stage), self.g, zero)
        v = self.tangent(ev.velocity.to(Y.dtype), Y)
        return v, FieldEvaluation(v, None, ev.g, ev.n_iter, ev.converged, ev.row_error, ev.column_error)

    @classmethod
    def wrap(cls, field: ParticleField, kernel: HarmonicKernel) -> HarmonicParticleField:
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
    if not get_attention(variant).harmonic:
        return None
    eye = torch.eye(d, dtype=X.dtype, device=X.device)
    if any(M is not None and not torch.equal(M.detach(), eye) for M in (W, W_V)):
        return None
    min_weight = 1.0 / n if weights is None else float(weights.detach().min())
    kernel = likely_kernel(temperature, d, tol, min_weight)
    return kernel if kernel.rank * _COST_RATIO <= n else None
