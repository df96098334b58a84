r"""The dense field of an ensemble of small systems, block by block (docs/performance.md).

For thousands of systems of a few dozen particles a field evaluation is a few passes over the
``B x n x n`` scores, and only the exponentials are arithmetic; :class:`EnsembleField` takes the
other passes out or into cache:

* the systems go in blocks of at most :data:`BLOCK_ENTRIES` matrix entries (1 MiB in float64; on
  an accelerator the whole batch is one block), so a block's scores stay in a core's L2 cache
  (1-2 MiB on current x86 server cores) from their product through the exponentials to the
  product with the values, in one reused buffer;
* SoftMax: the temperature is folded into the queries (``n d`` work, not ``n^2``), the
  exponentials are taken in place, and the values carry a column of ones, so one product gives
  the numerators and the row sums at once and only the ``n x d`` result is divided. For a
  symmetric positive semi-definite ``W``, Cauchy-Schwarz bounds every score by the largest
  diagonal one, :math:`|C_{ij}| \le \sqrt{C_{ii} C_{jj}} \le \max_k C_{kk}`: where that is at most
  :data:`UNSHIFTED_MAX` (half the exponent range) the exponentials need no shift, every entry
  lying in :math:`[\sqrt{\text{tiny}}, 1/\sqrt{\text{tiny}}]` (on the sphere with ``W = I``:
  :math:`\beta = 1/\tau \le 354` in float64, 43 in float32); other systems (and any other ``W``)
  subtract their row maxima, as ``torch.softmax`` does;
* Sinkhorn to tolerance (a symmetric PSD ``W``): the Gaussian form of the scores,
  :math:`D_{ij} = C_{ij} - C_{ii}/2 - C_{jj}/2 \le 0`, comes from the same product (two more
  coordinates), its exponentials :math:`E = e^D` are taken in place, and
  :func:`~sinkflow.attention._symmetric_sinkhorn.iterate_kernel` iterates on that cached kernel
  (matrix-vector products and Newton's steps, warm started, each system leaving the iteration
  when it has converged; a CPU block in numpy); the plan :math:`\mathrm{diag}(1/s) E \mathrm{diag}(u)`
  is never formed, the velocity is :math:`E (u \odot V) / s`;
* on CPU the exponentials are numpy's (2.2-2.5x faster than torch's ``exp`` on an AVX-512 AMD
  EPYC, float32 and float64), and the products with the values are taken as ``V^T K^T`` (``d x n``
  times ``n x n``) through numpy's ``matmul``: about a third of torch's ``bmm`` time on stacks of
  small matrices (measured on 2,048 x 32 x 32).

Each system's result is its own, bit for bit whatever its block: nothing in a block mixes systems,
and the Sinkhorn solve stops each system at its own tolerance (:mod:`sinkflow.particles._ensembles`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from sinkflow.attention._symmetric_sinkhorn import NUMPY_ENTRIES, iterate_kernel
from sinkflow.attention._variants import _sinkhorn, _softmax
from sinkflow.particles._dense_fields import SYMMETRIC_BUDGET, FieldEvaluation, _general_fallback
from sinkflow.particles._integrators import ParticleField

__all__ = ["BLOCK_ENTRIES", "EnsembleField", "UNSHIFTED_MAX", "takes_ensemble"]

#: Matrix entries of one block of systems (the bound of the numpy path of the symmetric solver).
BLOCK_ENTRIES = NUMPY_ENTRIES

#: Largest diagonal score of a SoftMax system whose exponentials are taken without a shift: half the
#: exponent range of the dtype (every entry then lies within [sqrt(tiny), 1 / sqrt(tiny)]).
UNSHIFTED_MAX = {dtype: -0.5 * math.log(torch.finfo(dtype).tiny) for dtype in (torch.float32, torch.float64)}


def takes_ensemble(variant, n_iter, symmetric: bool, need_errors: bool, X: torch.Tensor) -> bool:
    """Whether :class:`EnsembleField` evaluates this batched flow: SoftMax, or Sinkhorn to tolerance
    with a symmetric PSD ``W``; dot-product scores, float32 / float64, no marginal-error monitor."""
    if variant.scores != "dot" or need_errors or X.dtype not in UNSHIFTED_MAX or X.shape[-2] ** 2 > BLOCK_ENTRIES:
        return False
    return variant.normalize is _softmax or (variant.normalize is _sinkhorn and n_iter is None and symmetric)


@dataclass
class EnsembleField(ParticleField):
    """A :class:`ParticleField` of a batch ``(B, n, d)`` evaluated block by block (module docstring)."""

    _scores: torch.Tensor | None = None  # the reused block buffer

    def evaluate(self, Y: torch.Tensor, init_g: torch.Tensor | None) -> FieldEvaluation:
        V = Y if self.W_V is None else Y @ self.W_V.mT
        q = Y if self.W is None else Y @ self.W
        q = q * (1.0 / self.temperature) if self.temperature != 1.0 else q
        if self.attention.normalize is _softmax:
            return self._softmax(Y, q, V)
        return self._sinkhorn(Y, q, V, init_g)

    def _blocks(self, Y):
        """Slices of at most ``BLOCK_ENTRIES`` entries (one block on an accelerator) and the scores buffer."""
        B, n = Y.shape[:2]
        size = max(1, min(B, BLOCK_ENTRIES // (n * n))) if _in_numpy(Y) else B
        if self._scores is None or self._scores.shape != (size, n, n) or self._scores.dtype != Y.dtype:
            self._scores = torch.empty(size, n, n, dtype=Y.dtype, device=Y.device)
        return [slice(lo, min(lo + size, B)) for lo in range(0, B, size)], self._scores

    def _softmax(self, Y, q, V) -> FieldEvaluation:
        B, n, d = Y.shape
        V_one = _with_ones(V)  # values and a column of ones: the numerators and the row sums at once
        if self.weights is not None:
            V_one = V_one * self.weights[..., None]
        P = torch.empty(B, n, d + 1, dtype=Y.dtype, device=Y.device)  # K [V, 1], written as (K [V, 1])^T
        blocks, buffer = self._blocks(Y)
        large = _large(q, Y, self.symmetric)
        for rows in blocks:
            S = _matmul(q[rows], Y[rows].mT, buffer[: rows.stop - rows.start])
            if large is not None and bool(large[rows].any()):  # those systems' rows less their maxima
                S.sub_(torch.where(large[rows, None, None], S.amax(-1, keepdim=True), 0.0))
            _matmul(V_one[rows].mT, _exp_(S).mT, P[rows].mT)
        velocity = P[..., :d] / P[..., d:]
        return FieldEvaluation(velocity, None, None, 1, True, math.nan, math.nan)

    def tangent(self, v: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        return v - _dot(v, Y)[..., None] * Y

    def retract(self, Y: torch.Tensor) -> torch.Tensor:
        return Y / _dot(Y, Y).sqrt_()[..., None] if self.sphere else Y

    def _sinkhorn(self, Y, q, V, init_g) -> FieldEvaluation:
        B, n, d = Y.shape
        a = self.weights if self.weights is not None else torch.full((B, n), 1.0 / n, dtype=Y.dtype, device=Y.device)
        a, half = a.expand(B, n), 0.5 * _dot(q, Y)
        g, count = torch.empty(B, n, dtype=Y.dtype, device=Y.device), torch.empty(B, dtype=torch.int64, device=Y.device)
        converged = torch.empty(B, dtype=torch.bool, device=Y.device)
        P = torch.empty(B, n, d, dtype=Y.dtype, device=Y.device)
        q_half, Y_half = torch.cat([q, -half[..., None], _ones(Y)], -1), torch.cat([Y, _ones(Y), -half[..., None]], -1)
        blocks, buffer = self._blocks(Y)
        for rows in blocks:  # D = C - m_i / 2 - m_j / 2 <= 0 from one product, E = exp(D) in place
            E = _exp_(_matmul(q_half[rows], Y_half[rows].mT, buffer[: rows.stop - rows.start]))
            (u, s), g[rows], count[rows], err = _solve(E, half[rows], a[rows], None if init_g is None else init_g[rows],
                                                      self.tol, min(self.max_iter, SYMMETRIC_BUDGET))
            converged[rows] = err <= self.tol  # NaN: not converged
            uV = (u[..., None] * V[rows]).mT
            if bool(converged[rows].all()):
                _matmul(uV, E.mT, P[rows].mT)
                P[rows] /= s[..., None]
            else:  # the general solver finishes the systems the symmetric one left (as alone)
                K, g[rows], count[rows], converged[rows] = _general_fallback(
                    q[rows] @ Y[rows].mT, a[rows], self.tol, self.max_iter,
                    E * (u[..., None, :] / s[..., :, None]), g[rows], count[rows], converged[rows])
                _matmul(V[rows].mT, K.mT, P[rows].mT)
        return FieldEvaluation(P, None, g, count, converged, math.nan, math.nan)


def _ones(t):
    return torch.ones(t.shape[:-1] + (1,), dtype=t.dtype, device=t.device)


def _with_ones(t):
    return torch.cat([t, _ones(t)], -1)


def _solve(E, half, a, init_g, tol, max_iter):
    """:func:`~sinkflow.attention._symmetric_sinkhorn.iterate_kernel` on torch tensors, a CPU block in numpy:
    ``((u, s), g, iterations, column_error)`` as tensors."""
    cpu = _in_numpy(E)
    args = [None if t is None else t.numpy() if cpu else t for t in (E, half, a, init_g)]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a blown-up system stops, not converged
        (u, s), g, iterations, err = iterate_kernel(*args, tol, max_iter)
    wrap = (lambda t: torch.from_numpy(np.asarray(t))) if cpu else (lambda t: t)
    return (wrap(u), wrap(s)), wrap(g), wrap(iterations), wrap(err)


def _large(q, Y, symmetric):
    """The systems whose SoftMax rows must subtract their maxima (a boolean tensor), or None: all
    for a ``W`` that is not symmetric PSD, else those with a diagonal score above ``UNSHIFTED_MAX``
    (module docstring)."""
    if not symmetric:
        return torch.ones(Y.shape[0], dtype=torch.bool, device=Y.device)
    large = _dot(q, Y).amax(-1) > UNSHIFTED_MAX[Y.dtype]  # max_i C_ii of each system; NaN: the flow's check stops it
    return large if bool(large.any()) else None


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(-1)`` for a short last dimension, a column at a time (torch's reduction over
    2-3 entries costs ~8x these passes, measured on 2,048 x 32 x 2)."""
    if a.shape[-1] > 8:
        return (a * b).sum(-1)
    out = a[..., 0] * b[..., 0]
    for k in range(1, a.shape[-1]):
        out.addcmul_(a[..., k], b[..., k])
    return out


def _matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = a @ b`` over a batch; CPU tensors through numpy's ``matmul`` (module docstring)."""
    if _in_numpy(out):
        np.matmul(a.numpy(), b.numpy(), out=out.numpy())
        return out
    return out.copy_(a @ b)  # out may be a transposed view


def _exp_(t: torch.Tensor) -> torch.Tensor:
    """``t.exp_()``; on CPU numpy's ``exp`` (module docstring; within 0.7 ulp in float64, 2.5 ulp in
    float32, measured on [-40, 40])."""
    if _in_numpy(t):
        np.exp(t.numpy(), out=t.numpy())
        return t
    return t.exp_()


def _in_numpy(t: torch.Tensor) -> bool:
    """Whether ``t``'s blocks run through numpy (CPU); on an accelerator one block runs in torch."""
    return t.device.type == "cpu"
