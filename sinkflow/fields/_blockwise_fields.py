r"""Attention on particle positions without ever holding an ``n x n`` matrix.

For a particle step only the velocity :math:`v_i = \sum_j K_{ij} V_j` is needed, never
:math:`K` itself. Scores :math:`C_{ij} = x_i^T W x_j / \tau` (or Gaussian scores) are
recomputed block of rows by block of rows, and every reduction over a full row or
column is a log-sum-exp accumulated online across blocks, so peak memory is
``O(block_rows * n)`` instead of ``O(n^2)``: ``n = 100000`` in ``d = 2`` fits in well
under 2 GiB.

The iteration is the one Sinkhorn solver of :mod:`sinkflow.attention._solver`, over a second
kernel operator (:class:`_BlockwiseOperator`): the dense operators keep ``K`` between
half-iterations (one exponential per solve), which is impossible without ``n x n`` storage;
here each half-iteration re-exponentiates a block, and the row step is fused with the
velocity and the weighted column sums, so the error is read after row steps only. The fixed
point and the half-iteration convention are the same (row step first, from ``g = init_g``;
``K = exp(f_i + C_ij + g_j)``, rows sum to 1, ``a^T K = b``), and the tests compare both on
small problems.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from sinkflow._backend import (
    check_finite,
    check_float,
    check_number,
    exp_,
    exp_floor,
    from_torch,
    leading,
    numpy_exp_applies,
    to_torch,
)
from sinkflow.attention._solver import sinkhorn_solve

__all__ = ["LazyField", "lazy_attention_field", "DEFAULT_BLOCK_BYTES", "cache_block_bytes"]

def cache_block_bytes(fallback: int = 2**20) -> int:
    """Memory budget of a block of rows whose score buffer fits the per-core L2: three times it.

    The few passes over such a block after its product run in cache; far larger blocks make
    the step memory-bound (n = 6,000, float32, one thread: 64 MiB blocks 6.3x the floor of the
    exponentials, 1-4 MiB blocks 2.1-2.2x, see docs/performance.md). The landmark factor is
    built in blocks of this budget; the exact step's default (``DEFAULT_BLOCK_BYTES``) is at
    least 12 MiB, which amortizes each block's calls. Read from
    ``/sys/devices/system/cpu/cpu0/cache``, else ``os.sysconf("SC_LEVEL2_CACHE_SIZE")``, else
    ``fallback`` bytes of L2.

    Examples
    --------
    >>> from sinkflow.particles import cache_block_bytes
    >>> cache_block_bytes() >= 3 * 2**15
    True
    """
    return 3 * (_l2_bytes() or int(fallback))


def _l2_bytes() -> int | None:
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(root)):
            path = os.path.join(root, entry)
            with open(os.path.join(path, "level")) as fh:
                level = fh.read().strip()
            with open(os.path.join(path, "type")) as fh:
                kind = fh.read().strip()
            if level == "2" and kind in ("Unified", "Data"):
                with open(os.path.join(path, "size")) as fh:
                    text = fh.read().strip().upper()
                unit = {"K": 2**10, "M": 2**20}.get(text[-1:], 1)
                return int(text.rstrip("KM")) * unit
    except (OSError, ValueError):
        pass
    try:
        size = os.sysconf("SC_LEVEL2_CACHE_SIZE")
        return size if size > 0 else None
    except (ValueError, OSError, AttributeError):
        return None


#: Least budget of the default block: a score buffer of 2^20 float32 entries (4 MiB). A block costs about a
#: dozen calls (~30 us) besides its passes (~1 ns an entry, numpy's exp included), so smaller blocks lose
#: 10-40% to the calls once ``exp`` is fast: at n = 20,000 (CPU time) an L2-sized buffer (13 rows) ran
#: 1.95-2.24x the exp floor and this one 1.77-1.94x (docs/performance.md, *Large n: block-wise and landmark
#: steps*).
MIN_DEFAULT_BLOCK_BYTES = 3 * 2**22

#: Memory per block of rows (counted as three score buffers), in bytes: :func:`cache_block_bytes`, at least
#: ``MIN_DEFAULT_BLOCK_BYTES``.
DEFAULT_BLOCK_BYTES = max(cache_block_bytes(), MIN_DEFAULT_BLOCK_BYTES)

_NORMALIZATIONS = ("none", "row", "sinkhorn")
_SCORES = ("dot", "gaussian")


@dataclass(frozen=True)
class LazyField:
    """Result of :func:`lazy_attention_field`.

    Attributes
    ----------
    velocity : array (n, p)
        :math:`\\sum_j K_{ij} V_j`.
    f, g : arrays (n,)
        Log potentials (``K = exp(f_i + C_ij + g_j)``); zeros where unused.
    n_iter : int
        Half-iterations performed (0 without normalization, 1 for SoftMax).
    row_error, column_error : float
        :math:`\\sum_i a_i |\\sum_j K_{ij} - 1|` and :math:`\\sum_j |\\sum_i a_i K_{ij} - b_j|`.
    converged : bool
        For ``n_iter=None``: whether the marginal error reached ``tol``; otherwise True.
    """

    velocity: Any
    f: Any
    g: Any
    n_iter: int
    row_error: float
    column_error: float
    converged: bool


class _BlockScores:
    """Rows ``i0:i1`` of the score matrix plus line biases, recomputed on demand as one product.

    ``C_ij = <l_i, r_j>`` with ``l_i = [x_i W / tau]``, ``r_j = [x_j]`` (dot scores) or, for Gaussian
    scores ``-||x_i - x_j||_W^2 / (2 tau)``, ``l_i = [x_i W / tau, -|x_i|_W^2 / (2 tau), 1]`` and
    ``r_j = [x_j, 1, -|x_j|_W^2 / (2 tau)]``; one more coordinate carries a row bias. A block of
    ``bias_i + C_ij + col_j`` is then a single ``addmm`` pass instead of four to seven.
    """

    def __init__(self, x, W, temperature, kind, log_b):
        xw = (x @ W if W is not None else x) / temperature  # rows of x W / tau, so C = (x W / tau) x^T
        one = torch.ones_like(x[:, :1])
        left, right = [xw], [x]
        if kind == "gaussian":  # -||x_i - x_j||_W^2 / 2 = <x_i, W x_j> - |x_i|^2/2 - |x_j|^2/2
            half_sq = 0.5 * (xw * x).sum(-1, keepdim=True)
            left, right = [xw, -half_sq, one], [x, one, -half_sq]
        self.left = torch.cat(left + [one], 1)  # last column: the row bias, see factors
        self.right = torch.cat(right + [one], 1).T.contiguous()
        zero = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
        self.log_b = zero if log_b is None else log_b  # added to every row (column weights in the kernel)
        # |C_ij| <= |l_i| |r_j| (Cauchy-Schwarz on the score columns): a lower bound of every exponent
        self.left_norm = torch.linalg.vector_norm(self.left[:, :-1].detach(), dim=1)
        self.right_max = float(torch.linalg.vector_norm(self.right[:-1].detach(), dim=0).max()) if x.shape[0] else 0.0
        self.buffer = None  # one block's scores, reused (out= products) unless autograd follows the inputs
        self.reuse = not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, W, log_b)))

    def factors(self, row_bias=None):
        """Left factor with ``row_bias`` (n,) in its last column (0 when None)."""
        left = self.left.clone()
        left[:, -1] = 0.0 if row_bias is None else row_bias
        return left

    def column_bias(self, g=None):
        """``log_b + g``: the column bias of :meth:`block`."""
        return self.log_b if g is None else self.log_b + g

    def block(self, left, i0, i1, bias):
        """``row_bias_i + C_ij + bias_j`` for rows ``i0:i1``: one buffer overwritten block after block (a fresh
        one under autograd). No fresh allocation per block: one buffer that stays warm, no page faults."""
        if not self.reuse:
            return torch.addmm(bias, left[i0:i1], self.right)
        if self.buffer is None or self.buffer.shape[0] < i1 - i0:
            self.buffer = torch.empty((i1 - i0, self.right.shape[1]), dtype=left.dtype, device=left.device)
        return torch.addmm(bias, left[i0:i1], self.right, out=self.buffer[:i1 - i0])

    def clamp_free(self, left, bias, rows, floor) -> list[bool]:
        """For each block of ``rows`` rows: is every exponent ``left_i[-1] + C_ij + bias_j`` provably above
        ``floor``? Then its clamp pass is skipped (one sync per half-iteration)."""
        lower = left[:, -1].detach() - self.left_norm * self.right_max + float(bias.min())
        n = lower.shape[0]
        pad = lower.new_full((-n % rows,), math.inf)
        return (torch.cat([lower, pad]).view(-1, rows).amin(1) > floor).tolist()


class _Passes:
    """One pass over the row blocks per half-iteration, each block a few passes over one reused buffer.

    A row step after a column step shifts the block by the previous ``f`` (whose column step
    bounded every entry ``exp(f_i + C_ij + g_j) <= b_j / a_i``) and a column step by the
    ``g`` of the row step before it (entries ``<= 1``): no maximum pass, no online rescaling.
    A line sum below ``safe`` (where flushed entries could matter) or not finite, or weights
    too uneven for the row bound, takes the max-subtracted form instead.
    """

    def __init__(self, S, V, a, rows):
        self.S, self.a, self.rows = S, a, rows
        self.log_a = torch.log(a)
        # Values and a column of ones (the row sums come with the velocity), stored column by column:
        # E @ V with V row-major and few columns is a slow skinny product (measured 5x a pass of exp)
        self.V1 = torch.cat([V, torch.ones_like(V[:, :1])], 1).T.contiguous()
        finfo = torch.finfo(V.dtype)
        self.lt = math.log(finfo.tiny)
        self.floor = exp_floor(V.dtype)  # a block whose exponents all lie above it needs no clamp
        n = a.shape[0]
        self.safe = 3.0 * finfo.tiny / finfo.eps * n
        spread = float(self.log_a.max() - self.log_a.min()) if n else 0.0
        self.row_shift_ok = spread < 0.5 * math.log(finfo.max)
        self.numpy_exp = numpy_exp_applies(S.left, S.right, self.V1, self.log_a)  # decided once per field

    def _times_values(self, E):
        """``E @ [V, 1]``: one matrix-vector product per column for few columns (2-5x faster), else one product."""
        if self.V1.shape[0] <= 4:
            return torch.stack([torch.mv(E, v) for v in self.V1], 1)
        return (self.V1 @ E.T).T

    def _blocks(self):
        n = self.a.shape[0]
        return ((i0, min(n, i0 + self.rows)) for i0 in range(0, n, self.rows))

    def _exp(self, T, clamp):
        """``exp`` of a block in place; arguments below the exp floor clamped there first when ``clamp``."""
        return exp_(T.clamp_min_(self.lt) if clamp else T, self.numpy_exp)

    def row(self, g, f_prev=None, full=True):
        """Row normalization: new ``f``, and with ``full`` the velocity and weighted column sums (else None:
        a row step that is not the last of a fixed count needs its row sums only)."""
        S, n, p = self.S, self.a.shape[0], self.V1.shape[0] - 1
        shifted = f_prev is not None and self.row_shift_ok
        left, left0 = (S.factors(f_prev) if shifted else None), S.factors()
        bias = S.column_bias(g)
        free = S.clamp_free(left, bias, self.rows, self.floor) if shifted else None
        f_new = torch.empty_like(self.a)
        vel = torch.empty((n, p), dtype=self.a.dtype, device=self.a.device) if full else None
        col = torch.zeros_like(self.a) if full else None
        for b, (i0, i1) in enumerate(self._blocks()):
            R = E = None
            if shifted:
                E = self._exp(S.block(left, i0, i1, bias), not free[b])
                R = self._times_values(E) if full else E.sum(1, keepdim=True)
                if self._safe_sums(R[:, -1]):
                    f_new[i0:i1] = f_prev[i0:i1] - torch.log(R[:, -1])
                else:
                    R = None
            if R is None:
                T = S.block(left0, i0, i1, bias)
                m = T.amax(1, keepdim=True)
                E = self._exp(T.sub_(m), True)
                R = self._times_values(E) if full else E.sum(1, keepdim=True)
                f_new[i0:i1] = -(m.squeeze(1) + torch.log(R[:, -1]))
            if full:
                s = R[:, p]
                vel[i0:i1] = R[:, :p] / s[:, None]
                col.addmv_(E.T, self.a[i0:i1] / s)
        return f_new, vel, col

    def _safe_sums(self, s) -> bool:
        """One sync: are all line sums finite and at least ``safe`` (no NaN, no underflow)?"""
        return bool(((s >= self.safe) & torch.isfinite(s)).all())

    def column(self, f, g_prev):
        """Column step ``g_j = log b_j - logsumexp_i(log a_i + f_i + C_ij)``, shifted by the previous ``g``."""
        left = self.S.factors(self.log_a + f)
        bias = self.S.column_bias(g_prev)
        free = self.S.clamp_free(left, bias, self.rows, self.floor)
        s = torch.zeros_like(self.a)
        for b, (i0, i1) in enumerate(self._blocks()):
            s += self._exp(self.S.block(left, i0, i1, bias), not free[b]).sum(0)
        if self._safe_sums(s):
            return self.log_a - torch.log(s) + g_prev
        return self._column_exact(left)

    def _column_exact(self, left):
        """The column step with an online maximum (log-sum-exp across blocks): any line sum."""
        m = torch.full_like(self.a, -math.inf)
        s = torch.zeros_like(self.a)
        bias = self.S.column_bias()
        for i0, i1 in self._blocks():
            T = self.S.block(left, i0, i1, bias)
            m_new = torch.maximum(m, T.amax(0))
            s = s * torch.exp(m - m_new) + exp_(T.sub_(m_new[None, :]).clamp_min_(self.lt), self.numpy_exp).sum(0)
            m = m_new
        return self.log_a - (m + torch.log(s))

    def apply(self, f, g):
        """``K = exp(f_i + C_ij + g_j)`` applied without renormalizing: velocity, row sums, weighted column sums."""
        left, bias = self.S.factors(f), self.S.column_bias(g)
        n, p = self.a.shape[0], self.V1.shape[0] - 1
        R = torch.empty((n, p + 1), dtype=self.a.dtype, device=self.a.device)
        col = torch.zeros_like(self.a)
        free = self.S.clamp_free(left, bias, self.rows, self.floor)
        for b, (i0, i1) in enumerate(self._blocks()):
            E = self._exp(self.S.block(left, i0, i1, bias), not free[b])
            R[i0:i1] = self._times_values(E)
            col.addmv_(E.T, self.a[i0:i1])
        return R[:, :p], R[:, p], col


def lazy_attention_field(x, V=None, W=None, *, normalization="sinkhorn", scores="dot", temperature=1.0,
                         n_iter=None, weights=None, init_g=None, tol=1e-9, max_iter=2000,
                         block_bytes=DEFAULT_BLOCK_BYTES) -> LazyField:
    r"""Velocity of attention on particles, block by block (memory ``O(n)`` per row block).

    Parameters
    ----------
    x : array (n, d)
        Particle positions (queries and keys).
    V : array (n, p), optional
        Values, one per particle (``x`` by default).
    W : array (d, d), optional
        Bilinear form of the scores (identity by default).
    normalization : {"sinkhorn", "row", "none"}
        ``"row"`` is SoftMax, ``"none"`` the unnormalized kernel :math:`a_j e^{C_{ij}}`.
    scores : {"dot", "gaussian"}
        :math:`x_i^T W x_j / \tau` or :math:`-\|x_i - x_j\|_W^2 / (2\tau)`.
    temperature : float
        :math:`\tau > 0`.
    n_iter : int or None
        Sinkhorn half-iterations (``None``: until the marginal error is below ``tol``).
    weights : array (n,), optional
        Particle weights :math:`a` (uniform by default); the kernel is
        :math:`a_j e^{C_{ij}}` and Sinkhorn targets ``b = a``.
    init_g : array (n,), optional
        Warm start of the column potential, as in :func:`sinkflow.solve_sinkhorn`.
    tol, max_iter : float, int
        Stopping rule for ``n_iter=None`` (checked after each row step).
    block_bytes : int
        Memory budget of one block of score rows (counted as three buffers of the block);
        by default three times the L2 cache (:func:`cache_block_bytes`), at least 12 MiB.

    Returns
    -------
    LazyField

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> from sinkflow.particles import lazy_attention_field
    >>> x = np.random.default_rng(0).normal(size=(50, 2))
    >>> res = lazy_attention_field(x, block_bytes=800)   # blocks of 2 rows
    >>> K = sinkflow.sinkhorn(x @ x.T, tol=1e-12)
    >>> bool(np.allclose(res.velocity, K @ x, atol=1e-8))
    True
    """
    X, Vt, Wt, a, log_b, numpy_out = _field_inputs(x, V, W, weights, init_g, normalization, scores)
    temperature = check_number(temperature, "temperature", positive=True)
    check_number(n_iter, "n_iter (half-iterations)", integer=True, positive=True, allow_none=True)
    check_number(tol, "tol", positive=True)
    check_number(max_iter, "max_iter", integer=True, positive=True)
    n = X.shape[0]
    if normalization == "sinkhorn" and not bool((a > 0).all()):
        return _without_empty(X, Vt, a, init_g, numpy_out, lambda keep, g0: lazy_attention_field(
            X[keep], Vt[keep], Wt, normalization=normalization, scores=scores, temperature=temperature,
            n_iter=n_iter, weights=a[keep], init_g=g0, tol=tol, max_iter=max_iter, block_bytes=block_bytes))
    rows = max(1, int(block_bytes) // (3 * n * X.element_size()))
    passes = _Passes(_BlockScores(X, Wt, float(temperature), scores, log_b), Vt, a, rows)
    zeros = torch.zeros(n, dtype=X.dtype, device=X.device)
    if normalization == "none":
        vel, row_sums, col = passes.apply(zeros, zeros)
        # no normalization: report how far the kernel is from stochastic, for the monitors
        return LazyField(from_torch(vel, numpy_out), from_torch(zeros, numpy_out), from_torch(zeros, numpy_out),
                         0, float((a * (row_sums - 1).abs()).sum()), float((col - a).abs().sum()), True)
    g = zeros.clone() if init_g is None else to_torch(init_g, "init_g", like=X).reshape(n).clone()
    op = _BlockwiseOperator(passes, a)
    if normalization == "row" or n_iter is not None:
        out, report = sinkhorn_solve(op, None, g, n_iter=1 if normalization == "row" else int(n_iter))
    else:
        out, report = sinkhorn_solve(op, None, g, tol=float(tol), max_iter=int(max_iter), accelerate=False,
                                     stall=False)
    vel, f, g, row_err, col_err = out
    done, converged = report.n_iter, report.converged
    return LazyField(from_torch(vel, numpy_out), from_torch(f, numpy_out), from_torch(g, numpy_out),
                     done, row_err, col_err, bool(converged))


def _field_inputs(x, V, W, weights, init_g, normalization, scores):
    """Checked tensors ``(X, V, W, a, log_b, numpy_out)``: positions, values, the query-key matrix, the
    weights, the log column weights the scores carry (None when uniform weights cancel) and the output type."""
    X, numpy_out = leading(x, "x", V, W, weights, init_g)  # torch out if any input is torch
    check_float(X, "x")
    if X.ndim != 2:
        raise ValueError(f"x must have shape (n, d), got {tuple(X.shape)}")
    check_finite(X, "x")
    n = X.shape[0]
    Vt = X if V is None else to_torch(V, "V", like=X)
    if Vt.ndim != 2 or Vt.shape[0] != n:
        raise ValueError(f"V must have shape ({n}, p), got {tuple(Vt.shape)}")
    Wt = None if W is None else to_torch(W, "W", like=X)
    if Wt is not None and Wt.shape != (X.shape[1], X.shape[1]):
        raise ValueError(f"W must have shape ({X.shape[1]}, {X.shape[1]}), got {tuple(Wt.shape)}")
    if normalization not in _NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {_NORMALIZATIONS}, got {normalization!r}")
    if scores not in _SCORES:
        raise ValueError(f"scores must be one of {_SCORES}, got {scores!r}")
    if weights is None:
        a = torch.full((n,), 1.0 / n, dtype=X.dtype, device=X.device)
        # a uniform column weight cancels in every normalization but "none"
        return X, Vt, Wt, a, (torch.log(a) if normalization == "none" else None), numpy_out
    a = to_torch(weights, "weights", like=X)
    if a.shape != (n,):
        raise ValueError(f"weights must have shape ({n},), got {tuple(a.shape)}")
    return X, Vt, Wt, a, torch.log(a), numpy_out


class _BlockwiseOperator:
    """The kernel operator of :func:`lazy_attention_field` over :class:`_Passes` (one problem, ``b = a``).

    Log domain, no score multiplier, no over-relaxation. A row step is fused with the velocity
    and the weighted column sums when its by-products are read (``fused``), so the error is read
    every second half-step, after the row steps; :meth:`finish` returns ``(velocity, f, g, row
    error, column error)``, applying ``K = exp(f + C + g)`` once more only after a column step.
    """

    domain = "log"
    rescalable = False
    differentiable = False
    check_every = 2

    def __init__(self, passes, a):
        self.passes, self.a, self.b = passes, a, a

    def reset(self, scale, f, g):
        self.f, self.g, self.vel, self.col = f, g, None, None

    def step(self, row, omega, fused):
        if omega != 1.0:
            raise ValueError(f"the block-wise operator does not over-relax, got omega={omega}")
        if row:  # fused with the velocity of this K when it may be the last step or its error is read
            self.f, self.vel, self.col = self.passes.row(self.g, self.f, full=fused)
        else:
            self.g, self.vel, self.col = self.passes.column(self.f, self.g), None, None
        return None

    def error(self, row):
        if row and self.col is not None:
            return (self.col - self.a).abs().sum()
        _, row_sums, col = self.passes.apply(self.f, self.g)  # not a by-product: one more pass
        return (col - self.a).abs().sum() if row else (self.a * (row_sums - 1).abs()).sum()

    def potentials(self):
        return self.f, self.g

    def finish(self):
        if self.vel is not None:  # the last step normalized rows exactly (up to rounding)
            return self.vel, self.f, self.g, 0.0, float((self.col - self.a).abs().sum())
        vel, row_sums, col = self.passes.apply(self.f, self.g)  # ended on a column step: apply K as it is
        return vel, self.f, self.g, float((self.a * (row_sums - 1).abs()).sum()), float((col - self.a).abs().sum())


def _without_empty(X, V, a, init_g, numpy_out, solve):
    """Sinkhorn with particles of weight 0 as empty lines: solved without them, their rows (velocity,
    ``f``, ``g``) 0. Their columns carry no mass and their rows would not change the others."""
    keep = a > 0
    g0 = None if init_g is None else to_torch(init_g, "init_g", like=X).reshape(-1)[keep]
    sub = solve(keep, g0)
    vel = V.new_zeros(V.shape)
    vel[keep] = sub.velocity
    f, g = X.new_zeros(a.shape), X.new_zeros(a.shape)
    f[keep], g[keep] = sub.f, sub.g
    return LazyField(from_torch(vel, numpy_out), from_torch(f, numpy_out), from_torch(g, numpy_out), sub.n_iter,
                     sub.row_error, sub.column_error, sub.converged)
