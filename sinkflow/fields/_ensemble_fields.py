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
  the one solver iterates on that cached kernel (:func:`~sinkflow.attention._symmetric_sinkhorn.solve_kernel`)
  (matrix-vector products and Newton's steps, warm started, each system leaving the iteration
  when it has converged; a CPU block in numpy); the plan :math:`\mathrm{diag}(1/s) E \mathrm{diag}(u)`
  is never formed, the velocity is :math:`E (u \odot V) / s`;
* on CPU every pass is numpy's (unless :func:`sinkflow.fast_paths` is off), on arrays that share the
  tensors' memory: the exponentials (2.2-2.5x faster than torch's ``exp`` on an AVX-512 AMD EPYC, float32
  and float64; on AVX2 about as fast in float32, slower in float64), the products with the
  values through numpy's ``matmul`` (about a third of torch's ``bmm`` time on stacks of small
  matrices, measured on 2,048 x 32 x 32), and the short passes over ``B x n x d`` arrays (the
  tangent projection and the retraction on the sphere, the integrator's ``X + h v``:
  :meth:`EnsembleField.moved`), where torch's elementwise operations took 3-7x numpy's time;
* the work arrays of an evaluation (scores, queries, values with their extra columns, products)
  are kept on the field and reused from step to step: a fresh array of a megabyte is fresh memory
  for the allocator, and touching its pages for the first time cost more than the pass itself
  (0.7 ms against 0.1 ms for one ``2,048 x 32 x 2`` dot product, measured).

Each system's result is its own, bit for bit whatever its block: nothing in a block mixes systems,
and the Sinkhorn solve stops each system at its own tolerance (:mod:`sinkflow.particles._ensembles`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from sinkflow._backend import fast_paths_enabled
from sinkflow.attention._symmetric_sinkhorn import NUMPY_ENTRIES, solve_kernel
from sinkflow.fields._dense_fields import SYMMETRIC_BUDGET, FieldEvaluation, _general_fallback
from sinkflow.fields._particle_field import ParticleField

__all__ = ["BLOCK_ENTRIES", "EnsembleField", "SMALL_ENSEMBLE", "UNSHIFTED_MAX", "takes_ensemble"]

#: Matrix entries of one block of systems (the bound of the numpy path of the symmetric solver).
BLOCK_ENTRIES = NUMPY_ENTRIES

#: Largest diagonal score of a SoftMax system whose exponentials are taken without a shift: half the
#: exponent range of the dtype (every entry then lies within [sqrt(tiny), 1 / sqrt(tiny)]).
UNSHIFTED_MAX = {dtype: -0.5 * math.log(torch.finfo(dtype).tiny) for dtype in (torch.float32, torch.float64)}
UNSHIFTED_MAX.update({np.dtype(np.float32): UNSHIFTED_MAX[torch.float32],
                      np.dtype(np.float64): UNSHIFTED_MAX[torch.float64]})


#: A CPU SoftMax batch of at most this many systems goes through the batched torch field rather than
#: :class:`EnsembleField`: numpy's cheaper products on stacks of small matrices pay for its extra passes only
#: from a few dozen systems on (measured, one thread, 50-step ``simulate`` calls, least-disturbed of 12: at
#: 8 x 16, 8 x 64, 16 x 32, 16 x 64 the torch field took 0.54-0.84x the time on the circle and 0.50-0.58x in R^2;
#: at 32 x 16 and 64 x 16 on the circle 1.03x and 1.04x). Sinkhorn to tolerance stays in :class:`EnsembleField`
#: at every size (0.78-0.83x the torch field's time at 8 x 16 to 64 x 16).
SMALL_ENSEMBLE = 16


def takes_ensemble(variant, n_iter, symmetric: bool, need_errors: bool, X: torch.Tensor) -> bool:
    """Whether :class:`EnsembleField` evaluates this batched flow ``X`` (``(B, n, d)``): SoftMax (of more than
    :data:`SMALL_ENSEMBLE` systems on the CPU), or Sinkhorn to tolerance with a symmetric PSD ``W``; dot-product
    scores, float32 / float64, no marginal-error monitor. Decided once per run, from these sizes."""
    if variant.scores != "dot" or need_errors or X.dtype not in UNSHIFTED_MAX or X.shape[-2] ** 2 > BLOCK_ENTRIES:
        return False
    if variant.solver == "row":
        return X.device.type != "cpu" or math.prod(X.shape[:-2]) > SMALL_ENSEMBLE
    return variant.solver == "sinkhorn" and n_iter is None and symmetric


@dataclass
class EnsembleField(ParticleField):
    """A :class:`ParticleField` of a batch ``(B, n, d)`` evaluated block by block (module docstring)."""

    _work: dict = field(default_factory=dict)  # reused buffers by name (module docstring)

    def evaluate(self, Y: torch.Tensor, init_g: torch.Tensor | None) -> FieldEvaluation:
        V = Y if self.W_V is None else Y @ self.W_V.mT
        q = Y if self.W is None else Y @ self.W
        Y, q, V, weights, init_g = (_host(t) for t in (Y, q, V, self.weights, init_g))
        if self.temperature != 1.0:
            q = _product(q, 1.0 / self.temperature, self._buffer("queries", q, q.shape))
        if self.attention.solver == "row":
            return self._softmax(Y, q, V, weights)
        return self._sinkhorn(Y, q, V, weights, init_g)

    def _buffer(self, name, like, shape):
        """The reused array ``name`` of ``shape`` and ``like``'s dtype (allocated when either changes)."""
        buffer = self._work.get(name)
        if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype or type(buffer) is not type(like):
            buffer = self._work[name] = _empty(like, shape)
        return buffer

    def _transposed(self, name, t):
        """The batch of transposed matrices of ``t``: a C-order copy in the buffer ``name`` for numpy
        (numpy's batched product with a transposed view took 2x the time of the copy and the product,
        2,048 x 32 x 2), a view in torch."""
        if not isinstance(t, np.ndarray):
            return _T(t)
        out = self._buffer(name, t, (*t.shape[:-2], t.shape[-1], t.shape[-2]))
        np.copyto(out, _T(t))
        return out

    def _blocks(self, Y):
        """Slices of at most ``BLOCK_ENTRIES`` entries (one block on an accelerator) and the scores buffer."""
        B, n = Y.shape[:2]
        size = max(1, min(B, BLOCK_ENTRIES // (n * n))) if isinstance(Y, np.ndarray) else B
        return [slice(lo, min(lo + size, B)) for lo in range(0, B, size)], self._buffer("scores", Y, (size, n, n))

    def _softmax(self, Y, q, V, weights) -> FieldEvaluation:
        B, n, d = Y.shape
        V_one = _columns(V, (1.0,), self._buffer("values", Y, (B, n, d + 1)))  # the numerators and row sums at once
        if weights is not None:
            V_one *= weights[..., None]
        P = self._buffer("products", Y, (B, n, d + 1))  # K [V, 1]
        blocks, buffer = self._blocks(Y)
        large = self._large(q, Y)
        keys = self._transposed("keys", Y)
        for rows in blocks:
            S = _matmul(q[rows], keys[rows], buffer[: rows.stop - rows.start])
            if large is not None and bool(large[rows].any()):  # those systems' rows less their maxima
                S -= _where(large[rows, None, None], _row_max(S), 0.0)
            _matmul(_exp_(S), V_one[rows], P[rows])
        return FieldEvaluation(_tensor(_divided(P[..., :d], P[..., d:])), None, None, 1, True, math.nan, math.nan)

    def _sinkhorn(self, Y, q, V, weights, init_g) -> FieldEvaluation:
        B, n, d = Y.shape
        a = _expand(weights, (B, n)) if weights is not None else self._buffer("marginals", Y, (B, n))
        if weights is None:
            a[...] = 1.0 / n
        half = self._dot(q, Y)[..., 0]
        half *= 0.5
        g, count, converged = _empty(Y, (B, n)), _empty(Y, (B,), "int64"), _empty(Y, (B,), "bool")
        P = self._buffer("products", Y, (B, n, d + 1))  # the velocities' numerators and (last) denominators
        P[..., d] = 1.0
        q_half = _columns(q, (-half, 1.0), self._buffer("queries_half", Y, (B, n, d + 2)))
        Y_half = _columns(Y, (1.0, -half), self._buffer("keys_half", Y, (B, n, d + 2)))
        blocks, buffer = self._blocks(Y)
        keys = self._transposed("keys_half_t", Y_half)
        for rows in blocks:  # D = C - m_i / 2 - m_j / 2 <= 0 from one product, E = exp(D) in place
            E = _exp_(_matmul(q_half[rows], keys[rows], buffer[: rows.stop - rows.start]))
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a blown-up system: not converged
                init = None if init_g is None else init_g[rows]
                op, _ = solve_kernel(E, half[rows], a[rows], init, self.tol, min(self.max_iter, SYMMETRIC_BUDGET))
            u, s, g[rows], count[rows] = op.u, op.s, op.w - half[rows], op.systems.iterations
            converged[rows] = op.systems.err <= self.tol  # NaN: not converged
            if bool(converged[rows].all()):
                _matmul(E, u[..., None] * V[rows], P[rows, :, :d])
                P[rows, :, d] = s
            else:  # the general solver finishes the systems the symmetric one left (as alone)
                self._finish(q[rows] @ _T(Y[rows]), a[rows], E * (u[..., None, :] / s[..., :, None]), V[rows],
                             P[rows, :, :d], (g[rows], count[rows], converged[rows]))
        velocity = _divided(P[..., :d], P[..., d:])
        return FieldEvaluation(_tensor(velocity), None, _tensor(g), _tensor(count), _tensor(converged), math.nan,
                               math.nan)

    def _finish(self, C, a, K, V, P, results):
        """:func:`_general_fallback` on a block's unconverged systems, written into ``P`` and ``results``."""
        K, *solved = _general_fallback(_tensor(C), _tensor(a), self.tol, self.max_iter, _tensor(K),
                                       *(_tensor(r) for r in results))
        for out, value in zip(results, solved, strict=True):
            out[...] = _host(value)
        _matmul(_host(K), V, P)

    def tangent(self, v: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        vh, Yh = _host(v), _host(Y)
        out = _by_column(_product, Yh, self._dot(vh, Yh), _empty(Yh, Yh.shape))
        return _tensor(_sub(vh, out, out))

    def retract(self, Y: torch.Tensor) -> torch.Tensor:
        return _tensor(self._normalized(_host(Y) * 1.0)) if self.sphere else Y

    def moved(self, X: torch.Tensor, v: torch.Tensor, h) -> torch.Tensor:
        out = _host(v) * _host(h)
        out += _host(X)
        return _tensor(self._normalized(out) if self.sphere else out)

    def _normalized(self, t):
        """``t`` with its rows (last dimension) divided by their norms, in place."""
        return _by_column(_divide, t, _sqrt(self._dot(t, t)), t)

    def _dot(self, a, b):
        """``(a * b).sum(-1, keepdims=True)`` for a short last dimension: the products in a reused
        buffer, summed in place column by column (a reduction over 2-3 entries costs several times
        these passes, in torch ~8x, measured on 2,048 x 32 x 2); a view of the buffer."""
        if a.shape[-1] > 8:
            return (a * b).sum(-1, keepdims=True) if isinstance(a, np.ndarray) else (a * b).sum(-1, keepdim=True)
        products = _product(a, b, self._buffer("dots", a, a.shape))
        for k in range(1, a.shape[-1]):
            products[..., :1] += products[..., k : k + 1]
        return products[..., :1]

    def _large(self, q, Y):
        """The systems whose SoftMax rows must subtract their maxima (a boolean array), or None: all
        for a ``W`` that is not symmetric PSD, else those with a diagonal score above ``UNSHIFTED_MAX``
        (module docstring)."""
        if not self.symmetric:
            return _full(Y, Y.shape[:1], 1.0) > 0
        if isinstance(Y, np.ndarray) and _abs_max(q) * _abs_max(Y) * Y.shape[-1] <= UNSHIFTED_MAX[Y.dtype]:
            return None  # q_i . y_i <= |q_i| |y_i| <= d max|q| max|y| (four reductions, not a product pass)
        diagonal = self._dot(q, Y)[..., 0]
        large = (diagonal.max(-1) if isinstance(Y, np.ndarray) else diagonal.amax(-1)) > UNSHIFTED_MAX[Y.dtype]
        return large if bool(large.any()) else None  # max_i C_ii of each system; NaN: the flow's check stops it


def _abs_max(t: np.ndarray) -> float:
    return max(float(t.max()), -float(t.min()))


def _host(t):
    """A CPU tensor as a numpy array (a view; accelerators' tensors stay as they are; None stays None)."""
    return t.numpy() if isinstance(t, torch.Tensor) and _in_numpy(t) else t


def _tensor(t):
    return torch.from_numpy(t) if isinstance(t, np.ndarray) else t


def _T(t):
    """The batch of transposed matrices (a view)."""
    return t.swapaxes(-1, -2)


def _empty(like, shape, dtype=None):
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype=like.dtype if dtype is None else dtype)
    return torch.empty(shape, dtype=like.dtype if dtype is None else getattr(torch, dtype), device=like.device)


def _full(like, shape, value):
    out = _empty(like, shape)
    out[...] = value
    return out


def _expand(t, shape):
    return np.broadcast_to(t, shape) if isinstance(t, np.ndarray) else t.expand(shape)


#: A last dimension up to which numpy passes go column by column (:func:`_columns`, :func:`_by_column`).
_FEW = 8


def _columns(t, columns, out):
    """``t`` (``(..., d)``) with the given columns (scalars or ``(...)`` arrays) appended, written into ``out``
    (numpy: column by column, 4x faster than one strided assignment on 2,048 x 32 x 2)."""
    d = t.shape[-1]
    if isinstance(t, np.ndarray) and d <= _FEW:
        for k in range(d):
            out[..., k] = t[..., k]
    else:
        out[..., :d] = t
    for k, column in enumerate(columns, d):
        out[..., k] = column
    return out


def _by_column(ufunc, a, column, out):
    """``ufunc(a, column)`` for ``a`` of shape ``(..., d)`` and ``column`` of shape ``(..., 1)``, into ``out``.
    numpy goes column by column for a short last dimension: its broadcast of ``column`` over a last axis of
    2 took 3-6x the time (2,048 x 32 x 2)."""
    if not isinstance(a, np.ndarray) or a.shape[-1] > _FEW:
        return ufunc(a, column, out=out)
    for k in range(a.shape[-1]):
        ufunc(a[..., k], column[..., 0], out=out[..., k])
    return out


def _divide(a, b, out):
    return np.divide(a, b, out=out) if isinstance(out, np.ndarray) else torch.div(a, b, out=out)


def _divided(a, b):
    """``a / b`` in a new C-order array (``a``, ``b``: column slices of the products; the flow's state
    would keep a strided layout)."""
    if isinstance(a, np.ndarray):
        return _by_column(_divide, a, b, np.empty(a.shape, dtype=a.dtype))
    return (a / b).contiguous()


def _where(condition, a, b):
    return np.where(condition, a, b) if isinstance(condition, np.ndarray) else torch.where(condition, a, b)


def _row_max(S):
    return S.max(-1, keepdims=True) if isinstance(S, np.ndarray) else S.amax(-1, keepdim=True)


def _sqrt(t):
    return np.sqrt(t, out=t) if isinstance(t, np.ndarray) else t.sqrt_()


def _sub(a, b, out):
    return np.subtract(a, b, out=out) if isinstance(out, np.ndarray) else torch.sub(a, b, out=out)


def _product(a, b, out=None):
    if out is None:
        return a * b
    return np.multiply(a, b, out=out) if isinstance(out, np.ndarray) else torch.mul(a, b, out=out)


def _matmul(a, b, out):
    """``out = a @ b`` over a batch (numpy arrays through numpy's ``matmul``: module docstring)."""
    if isinstance(out, np.ndarray):
        return np.matmul(a, b, out=out)
    return out.copy_(a @ b)  # out may be a strided slice (the products' first d columns)


def _exp_(t):
    """``t`` exponentiated in place (numpy on CPU: module docstring; within 0.7 ulp in float64, 2.5 ulp
    in float32, measured on [-40, 40])."""
    return np.exp(t, out=t) if isinstance(t, np.ndarray) else t.exp_()


def _in_numpy(t: torch.Tensor) -> bool:
    """Whether ``t``'s blocks run through numpy: on the CPU with the speed tricks on (:func:`sinkflow.fast_paths`;
    1.4-1.8x on an ensemble's Sinkhorn ``simulate``, ``benchmarks/bench_tricks.py``); otherwise torch's
    operations, one block on an accelerator."""
    return t.device.type == "cpu" and fast_paths_enabled()
