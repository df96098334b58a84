r"""Attention fields on particles with ``m`` landmarks: ``O(n m)`` time and memory per step.

Every built-in kernel is a Gaussian kernel up to diagonal factors. With :math:`W` symmetric
positive semi-definite and :math:`G_{ij} = e^{-\|x_i - x_j\|_W^2 / (2\tau)}`,

.. math:: a_j e^{x_i^T W x_j / \tau} = e^{r_i}\, G_{ij}\, p_j, \qquad
          r_i = \frac{\|x_i\|_W^2}{2\tau}, \quad p_j = a_j e^{\|x_j\|_W^2 / (2\tau)},

and every normalization that starts with a row step (SoftMax, Sinkhorn) ignores the left
factor :math:`e^{r_i}`. So one positive semi-definite matrix :math:`G` carries all of
them, and its Nyström approximation :math:`\tilde G = L A^+ L^T`
(:math:`L = G_{:,J}`, :math:`A = G_{J,J}`, ``m`` landmark indices :math:`J`) gives
:math:`\tilde G v` in :math:`O(n m)`.

Sinkhorn on the factorization (Altschuler, Bach, Rudi and Niles-Weed 2019): the scalings
:math:`u` (rows) and :math:`w` (columns) of :math:`K = \mathrm{diag}(u)\, \tilde G\, \mathrm{diag}(p w)`
alternate :math:`u = 1 / \tilde G(p w)` and :math:`w = a / (p\, \tilde G(a u))`, each a
product with :math:`\tilde G` (Nyström, not positive random features: Nyström is exact
when every point is a landmark, needs no feature dimension of its own, and shares the
landmark machinery and the spectral error bound of Skyformer; positive features keep
:math:`\tilde G > 0` but converge in the number of features only at the Monte-Carlo rate
and never become exact). Nyström entries can be negative, and a particle far from every
landmark gets an approximate mass :math:`(\tilde G v)_i \approx 0` of either sign, which makes
the scaling undefined. Outcome: the solve is redone once with the exact diagonal restored,
:math:`\tilde G + \mathrm{diag}(1 - \tilde G_{ii})` (still positive semi-definite, below
:math:`G`; such a particle keeps its own weight, as in the exact kernel); if a mass is still
not positive, :class:`NystromPositivityError` is raised (never a NaN) with the remedy: more
landmarks, or a larger temperature (a wider kernel is better approximated).

Landmark choices: ``"nystrom"`` takes ``m`` distinct points among the ``n`` particles
(``m >= n``: all of them, exact); ``"lifted"`` is Skyformer's lifted kernel of the stacked
queries and keys, here ``[x; x]``: ``m`` of the ``2n`` stacked points (``m >= 2n``: all,
exact). Which points: ``sampling="farthest"`` (the default of the flows) is greedy
farthest-point (k-center) sampling in the kernel's coordinates (:func:`gaussian_coordinates`,
the metric of :math:`W / \tau`) from a seeded start, :func:`farthest_point_indices`;
``"uniform"`` draws them at random (Skyformer's theorem). Coverage matters because the row
:math:`\tilde G_{i\cdot}` of a particle is a combination of the kernel columns of the landmarks:
a particle several bandwidths from every landmark gets :math:`L_i \approx 0` and an approximate
mass :math:`\approx 0` of either sign. Uniform draws follow the density, so the tails of a
Gaussian cloud are left uncovered (``heat_flow`` of 2000 normal points, ``eps = 0.05``, failed
for ``m`` = 64, 128, 256); the greedy choice bounds the distance of every particle to its nearest
landmark by the covering radius, at most twice the best possible with ``m`` points. It costs
at most ``O(n m d)`` once per flow (0.1-0.2 s at ``n = 10^6``, ``m = 256``, ``d = 2``, one thread), and
``m >= n`` still makes every particle a landmark (distinct points: the lifted kernel of
``[x; x]`` is then exact too).

Each Sinkhorn half-iteration is one pass over the rows of a factor of :math:`\tilde G`. With
:math:`A^+ = H H^T` (``H`` is ``m x r``, ``r`` the numerical rank of ``A``: eigenvalues above the
pseudo-inverse cutoff, padded with zero columns to a multiple of 8, which BLAS runs 2.5x faster),
:math:`\tilde G = B B^T` with :math:`B = L H`; a smooth kernel has ``r << m`` (the benchmark cloud
of ``benchmarks/bench_particles.py``: ``r = 23`` of ``m = 256`` farthest points, 10 of 256 uniform
ones). ``B`` is formed once per field (``n m`` exponentials, in blocks of rows sized from the L2
cache) and kept, as :math:`B^T`, when it fits ``CACHE_BYTES``
(256 MiB), else each pass recomputes the blocks
:math:`L_b` (memory ``O(m^2 + block)``). A pass over a kept ``B`` reads it once, in cache-sized chunks,
and carries the masses alone (matrix-vector products), except the pass that computes the velocity.
Where the time of a step goes (the factor, the passes, the farthest-point choice): docs/performance.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from sinkflow._backend import exp_, exp_floor, numpy_exp_applies, squared_norms
from sinkflow.attention._inverses import _pinv_rtol
from sinkflow.attention._kernelized import _kernel
from sinkflow.attention._nystrom import nystromformer_attention
from sinkflow.fields._blockwise_fields import cache_block_bytes
from sinkflow.fields._landmarks import gaussian_coordinates, landmark_indices

__all__ = ["NystromPositivityError", "LowRankField", "lowrank_attention_field"]

#: Memory of one block of kernel rows (bytes), counted as two ``rows x m`` buffers: three times the
#: L2 cache (:func:`sinkflow.particles.cache_block_bytes`), so a block stays in cache between its
#: product, its exp and the product with ``A^{+1/2}``; also the size of a chunk of a kept factor's pass.
BLOCK_BYTES = cache_block_bytes()
#: The factor ``B = L A^{+1/2}`` (``n x r``) is kept between passes when it takes at most this many bytes.
CACHE_BYTES = 256 * 2**20


class NystromPositivityError(ValueError):
    """The Nyström approximation gave a row or column a non-positive kernel mass."""


@dataclass(frozen=True)
class LowRankField:
    r"""Result of :func:`lowrank_attention_field` (fields as :class:`sinkflow.particles.LazyField`).

    Attributes
    ----------
    velocity : torch.Tensor (n, p)
        The velocity :math:`\sum_j K_{ij} V_j`.
    g : torch.Tensor (n,) or None
        Log column scaling of the normalization (pass it as ``init_g`` to warm-start the next
        call); None for ``normalization="none"`` and segment means.
    n_iter : int
        Half-iterations done (passes over the factor).
    row_error, column_error : float
        Weighted marginal errors; ``column_error`` is NaN when it was not measured.
    converged : bool

    Examples
    --------
    >>> import torch
    >>> from sinkflow.particles import lowrank_attention_field
    >>> x = torch.randn(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> field = lowrank_attention_field(x, x, 8)   # a LowRankField
    >>> field.velocity.shape, field.g.shape, field.converged
    (torch.Size([30, 2]), torch.Size([30]), True)
    """

    velocity: torch.Tensor
    g: torch.Tensor | None
    n_iter: int
    row_error: float
    column_error: float
    converged: bool


class _NystromKernel:
    r"""Nyström :math:`\tilde G = L A^+ L^T = B B^T` of the Gaussian kernel of ``z``, applied block by block.

    :math:`B = L A^{+1/2}` is ``n x r`` with ``r`` the numerical rank of the landmark block ``A``
    (eigenvalues above the pseudo-inverse cutoff), often far below ``m`` for a smooth kernel
    (``r = 23`` of ``m = 256`` for the benchmark cloud). When ``B`` fits in ``CACHE_BYTES`` it is
    formed once and each pass is two thin products; otherwise each pass recomputes the blocks
    :math:`L_b` (``m`` exponentials per row) and :meth:`project` applies :math:`A^+`.
    """

    def __init__(self, z: torch.Tensor, idx: torch.Tensor, block_bytes: int = BLOCK_BYTES):
        self.z = z
        self.zJ = z[idx.to(z.device)]
        m = self.zJ.shape[0]
        lam, vec = torch.linalg.eigh(_kernel(self.zJ, self.zJ, z.shape[-1]))
        keep = lam > _pinv_rtol(z.dtype) * float(lam.abs().max())  # the cutoff of nystrom's pinv
        half = vec[:, keep] * lam[keep].rsqrt()  # A^+ = half half^T
        # zero columns up to a multiple of 8: B B^T is unchanged, and BLAS runs the build product
        # (n x m times m x r) 2.5x faster at r = 24 than at r = 23 (the benchmark cloud's rank)
        self.half = torch.cat([half, half.new_zeros(m, -half.shape[1] % 8)], 1)
        self.rows = max(1, int(block_bytes) // (2 * m * z.element_size()))
        self.block_bytes = int(block_bytes)
        self.floor = exp_floor(z.dtype)
        self.floor_value = float(torch.tensor(self.floor, dtype=z.dtype).exp())
        # exp(-|u - v|^2 / 2) = exp(<[u, -|u|^2/2, 1], [v, 1, -|v|^2/2]>) on unit-bandwidth points:
        # one matrix product and one in-place exp per block (gaussian_kernel's bandwidth is p^(1/4)),
        # centred so that the expansion does not cancel (a cloud far from the origin)
        n, p = z.shape
        self.left = torch.empty((n, p + 2), dtype=z.dtype, device=z.device)  # filled in place: no n x 2 temporaries
        u = torch.sub(z, z.mean(0), out=self.left[:, :p]).mul_(p ** -0.25)
        sq = squared_norms(u)
        # every exponent is >= -(2 R)^2 / 2 with R = max |u_i|: when that stays above the floor (and a
        # unit of rounding), no entry is clamped and the two clamp passes over the n x m block are skipped
        self.clamp = 2.0 * float(sq.max()) > -self.floor - 1.0
        torch.mul(sq, -0.5, out=self.left[:, p])
        self.left[:, p + 1] = 1.0
        uJ = u[idx.to(z.device)]
        self.right = torch.cat([uJ, torch.ones_like(uJ[:, :1]), -0.5 * squared_norms(uJ)[:, None]], 1).T.contiguous()
        self.numpy_exp = numpy_exp_applies(z, self.left, self.right)  # decided once per kernel
        self.buffer = torch.empty((min(n, self.rows), m), dtype=z.dtype, device=z.device)
        self.factor = None  # B^T (r x n) when kept: its product is the form BLAS runs fastest, ~15% over B
        if n * self.half.shape[1] * z.element_size() <= CACHE_BYTES:
            factor = torch.empty((self.half.shape[1], n), dtype=z.dtype, device=z.device)
            half_t = self.half.T.contiguous()
            for i0 in range(0, n, self.rows):
                i1 = min(n, i0 + self.rows)
                torch.mm(half_t, self._rows(i0, i1).T, out=factor[:, i0:i1])
            self.factor, self.buffer = factor, None
        self.diagonal = None  # exact-diagonal correction 1 - G~_ii, see restore_diagonal
        self.last_in = None

    def _rows(self, i0, i1):
        """Rows ``i0:i1`` of ``L`` (recomputed in the one buffer)."""
        out = self.buffer[:i1 - i0]  # no allocation: fresh 16 MiB buffers cost page faults
        torch.mm(self.left[i0:i1], self.right, out=out)
        if not self.clamp:
            return exp_(out, self.numpy_exp)
        # float32 exp is ~20x slower below its floor (-87): clamp there, then shift so that the clamped
        # entries are exactly 0 (a particle far from every landmark must get no mass, see restore_diagonal)
        return exp_(out.clamp_(self.floor, 0.0), self.numpy_exp).sub_(self.floor_value)

    def project(self, acc):
        """The middle factor between one pass's ``F^T Y`` and the next pass: ``I`` for ``B``, ``A^+`` for ``L``."""
        return acc if self.factor is not None else self.half @ (self.half.T @ acc)

    def restore_diagonal(self) -> None:
        r"""Use :math:`\tilde G + \mathrm{diag}(1 - \tilde G_{ii})`: the exact diagonal :math:`G_{ii} = 1`.

        The Nyström residual :math:`G - \tilde G` is positive semi-definite, so the added
        diagonal is non-negative; a particle far from every landmark (:math:`\tilde G_{i\cdot}
        \approx 0`, its mass lost to rounding or negative) keeps its own weight, as in the
        exact kernel. :math:`\tilde G_{ii} = |B_i|^2`: one extra pass.
        """
        n = self.z.shape[0]
        diag = torch.empty(n, dtype=self.z.dtype, device=self.z.device)
        for i0 in range(0, n, self.rows):
            i1 = min(n, i0 + self.rows)
            Bb = self.factor[:, i0:i1].T if self.factor is not None else self._rows(i0, i1) @ self.half
            diag[i0:i1] = (Bb * Bb).sum(1)
        self.diagonal = (1.0 - diag).clamp_min_(0.0)

    def sweep(self, T, step):
        """For each row block ``b``: ``Y_b = step(i0, i1, (G~ Y_prev)_b)`` with ``(G~ Y_prev)_b = F_b @ T``
        (plus the restored diagonal times the previous sweep's ``Y``); returns ``sum_b F_b^T Y_b``
        (``F`` = ``B`` or ``L``; ``T = project(previous return)``)."""
        if self.factor is not None:
            return self._sweep_kept(T, step)
        acc = None
        n = self.z.shape[0]
        keep = self.diagonal is not None
        new_in = None
        for i0 in range(0, n, self.rows):
            i1 = min(n, i0 + self.rows)
            Lb = self._rows(i0, i1)
            out = None if T is None else Lb @ T
            if out is not None and keep:
                out += self.diagonal[i0:i1, None] * self.last_in[i0:i1]
            Y = step(i0, i1, out)
            if Y is not None:
                acc = Lb.T @ Y if acc is None else acc.addmm_(Lb.T, Y)
                if keep:
                    new_in = torch.empty((n, Y.shape[1]), dtype=Y.dtype, device=Y.device) if new_in is None else new_in
                    new_in[i0:i1] = Y
        self.last_in = new_in
        return acc

    def _sweep_kept(self, T, step):
        """:meth:`sweep` with the kept factor (``B^T``), in chunks of rows that stay in cache between the two
        products of a pass (``B`` is read once from memory per pass: single-core memory bandwidth is what
        the passes cost): ``F_b T`` as ``(T^T B^T_b)^T``, ``B^T_b Y_b`` one matrix-vector product per column
        (2-3x faster than BLAS's three-column forms, column-major ``Y`` faster still)."""
        Bt, acc, keep = self.factor, None, self.diagonal is not None
        n = Bt.shape[1]
        # the restored diagonal reads the previous sweep's Y of every row: one chunk then
        chunk = n if keep else max(1, self.block_bytes // (Bt.shape[0] * Bt.element_size()))
        for i0 in range(0, n, chunk):
            Bc = Bt[:, i0:i0 + chunk]
            out = None if T is None else (T.T @ Bc).T
            if out is not None and keep:
                out = out + self.diagonal[:, None] * self.last_in
            Y = step(i0, i0 + Bc.shape[1], out)
            self.last_in = Y if keep else None
            if Y is not None:
                part = torch.stack([torch.mv(Bc, y) for y in Y.unbind(1)], 1)
                acc = part if acc is None else acc.add_(part)
        return acc


def _positive(s: torch.Tensor, what: str, m: int) -> torch.Tensor:
    if s.numel() and float(s.min()) <= 0:  # one reduction a pass; the count only for the message
        bad = int((s <= 0).sum())
        raise NystromPositivityError(
            f"the Nyström approximation with {m} landmarks gives {bad} {what} a non-positive kernel mass "
            "(its entries can be negative), so the normalization is undefined; use more landmarks "
            "(m >= n is exact) or a larger temperature")
    return s


def _log_prior(z, weights, scores):
    r"""log of the column factors p_j and the row factors r_i (see the module docstring), from the points
    ``z`` of :func:`gaussian_coordinates`: :math:`x^T W x / (2\tau) = |z|^2 / (2 \sqrt{p})` (no ``x W``
    product, whose two-column form BLAS runs slowly)."""
    n, p = z.shape
    log_a = torch.full((n,), -math.log(n), dtype=z.dtype, device=z.device) if weights is None else torch.log(weights)
    if scores == "gaussian":
        return log_a, None
    half_sq = torch.linalg.vector_norm(z, dim=1).square_().mul_(0.5 / math.sqrt(p))
    return log_a + half_sq, half_sq


def _unnormalized(K: _NystromKernel, V, log_p, r, a):
    """e^{r_i} sum_j G~_ij p_j [1, V_j]: velocity and row error."""
    shift = float(log_p.max())
    p = torch.exp(log_p - shift)
    acc = K.sweep(None, lambda i0, i1, _: p[i0:i1, None] * torch.cat([torch.ones_like(V[i0:i1, :1]), V[i0:i1]], 1))
    out = torch.empty((V.shape[0], V.shape[1] + 1), dtype=V.dtype, device=V.device)

    def apply(i0, i1, LT):
        out[i0:i1] = LT
        return None

    K.sweep(K.project(acc), apply)
    left = shift if r is None else r + shift
    out = out * torch.exp(torch.as_tensor(left, dtype=V.dtype, device=V.device)).reshape(-1, 1)
    row_err = float((a * (out[:, 0] - 1).abs()).sum())
    return LowRankField(out[:, 1:], None, 0, row_err, math.nan, True)


def _apply_scaled(K: _NystromKernel, acc, u, vel, a) -> float:
    """``vel = diag(u) G~ diag(p w) V`` from the last column pass's ``acc``; returns the weighted row error."""
    row_sum = torch.empty_like(u)

    def apply(i0, i1, out):
        torch.mul(u[i0:i1], out[:, 0], out=row_sum[i0:i1])
        torch.mul(u[i0:i1, None], out[:, 1:], out=vel[i0:i1])  # in place: a temporary in out's layout, copied, took 3x
        return None

    K.sweep(K.project(acc), apply)
    return float((a * (row_sum - 1).abs()).sum())


def _scaled(K: _NystromKernel, V, log_p, a, n_iter, tol, max_iter, init_g):
    """Row / Sinkhorn scaling of diag(u) G~ diag(p w), one pass per half-iteration."""
    n, m = V.shape[0], K.zJ.shape[0]
    log_pw = log_p if init_g is None else log_p + init_g
    shift = float(log_pw.max())
    pw = torch.exp(log_pw - shift)  # p w up to a constant, which every scaling absorbs
    p = torch.exp(log_p - shift)
    u = torch.empty(n, dtype=V.dtype, device=V.device)
    vel = torch.empty_like(V)
    fixed = 1 if n_iter == 1 else n_iter
    budget, tol_check = (int(fixed), None) if fixed is not None else (int(max_iter), tol)
    # Only the pass that computes the velocity needs the values: the last row step (odd budget) or the
    # final application, fed by the output of half-iteration `wide` (-1: the first sweep). The other
    # passes carry the masses alone, matrix-vector products. With a tolerance any row step may be the last.
    stats = {"col": math.inf, "k": -1, "wide": None if tol_check is not None else budget - 1 - budget % 2}

    def columns_in(i0, i1, _):
        if stats["wide"] not in (None, stats["k"]):
            return pw[i0:i1, None]
        return torch.cat([pw[None, i0:i1], pw[None, i0:i1] * V[i0:i1].T]).T  # column-major

    # Particles of weight 0 are empty lines (row and column): their masses are never divided by
    # (they may be non-positive), their row scaling is 0 (no velocity) and their column stays 0.
    empty = a <= 0 if bool((a <= 0).any()) else None

    def masses(i0, i1, out, what):
        s = out[:, 0]
        if empty is not None:
            s = torch.where(empty[i0:i1], torch.ones_like(s), s)
        return _positive(s, what, m)

    def row_step(i0, i1, out):
        s = masses(i0, i1, out, "rows")
        torch.reciprocal(s, out=u[i0:i1])  # in place: n-vector temporaries cost as much as the products
        if empty is not None:
            u[i0:i1].masked_fill_(empty[i0:i1], 0.0)
        if out.shape[1] > 1:
            torch.mul(out[:, 1:], u[i0:i1, None], out=vel[i0:i1])
        return (a[i0:i1] * u[i0:i1])[:, None]

    def column_step(i0, i1, out):
        s = masses(i0, i1, out, "columns")
        if tol_check is not None:  # a fixed count reports no column error: no pass over it
            stats["col"] += float(torch.addcmul(a[i0:i1], pw[i0:i1], s, value=-1.0).norm(1))
        torch.div(a[i0:i1], s, out=pw[i0:i1])
        return columns_in(i0, i1, None)

    acc = K.sweep(None, columns_in)
    done, converged, last_row = 0, tol_check is None, False
    while done < budget:
        stats["k"] = done
        if done % 2 == 0:
            acc = K.sweep(K.project(acc), row_step)
            last_row = True
        else:
            stats["col"] = 0.0
            acc = K.sweep(K.project(acc), column_step)
            last_row = False
            if tol_check is not None and stats["col"] <= tol_check:
                converged, last_row = True, True  # the velocity of the checked row step is kept
                done += 1
                break
        done += 1
    # ended on a column step (or stopped after its check): apply without renormalizing
    row_err = 0.0 if last_row else _apply_scaled(K, acc, u, vel, a)
    g = torch.log(pw.clamp_min(torch.finfo(V.dtype).tiny)) - torch.log(p.clamp_min(torch.finfo(V.dtype).tiny))
    # the column error is measured by a column pass: known for the state it checked
    col_err = stats["col"] if tol_check is not None else math.nan
    return LowRankField(vel, g, done, row_err, col_err, bool(converged))


def lowrank_attention_field(x: torch.Tensor, V: torch.Tensor, landmarks, *, normalization: str = "sinkhorn",
                            scores: str = "dot", method: str = "nystrom", W: torch.Tensor | None = None,
                            temperature: float = 1.0, weights: torch.Tensor | None = None, n_iter=None,
                            tol: float = 1e-9, max_iter: int = 2000, init_g=None, generator=0,
                            sampling: str = "farthest", block_bytes: int = BLOCK_BYTES) -> LowRankField:
    r"""Velocity :math:`\sum_j K_{ij} V_j` of landmark-approximated attention on particles.

    Parameters
    ----------
    x : torch.Tensor (n, d)
        Positions (queries and keys).
    V : torch.Tensor (n, p)
        Values.
    landmarks : int or index tensor
        A count (drawn with :func:`landmark_indices`) or the indices into ``x``.
    normalization : {"sinkhorn", "row", "none"}
    scores : {"dot", "gaussian"}
        :math:`x_i^T W x_j / \tau` or :math:`-\|x_i - x_j\|_W^2 / (2\tau)`.
    method : {"nystrom", "lifted", "segment_means"}
        Landmark scheme (see the module docstring); ``"segment_means"`` is Nyströmformer's
        approximation of SoftMax (uniform weights, ``normalization="row"``, dot scores).
    W, temperature, weights, n_iter, tol, max_iter, init_g
        As in :func:`sinkflow.particles.lazy_attention_field` (``init_g``: the ``g`` of a previous call).
    generator : seed for drawing a landmark count.
    sampling : {"farthest", "uniform"}
        How a landmark count is drawn (:func:`landmark_indices`; farthest points cover the support).

    Returns
    -------
    LowRankField

    Raises
    ------
    NystromPositivityError
        When a normalization meets a non-positive approximate row or column mass.
    ValueError
        When ``x`` is not ``(n, d)`` with ``n >= 1``.

    Notes
    -----
    The passes over the factor work in place, so the velocity carries no autograd graph (inputs
    that require grad are read, not differentiated; :func:`sinkflow.particles.lazy_attention_field`
    differentiates). float16 / bfloat16 input is computed in float32 and the velocity returned in
    the input's dtype.

    Examples
    --------
    >>> import torch, sinkflow
    >>> from sinkflow.particles import lowrank_attention_field
    >>> x = torch.randn(40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> exact = sinkflow.sinkhorn(x @ x.T, tol=1e-12) @ x
    >>> approx = lowrank_attention_field(x, x, 40, tol=1e-12).velocity   # every point a landmark
    >>> bool(torch.allclose(approx, exact, atol=1e-6))
    True
    """
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"x must be (n, d) with at least one particle, got shape {tuple(x.shape)}")
    if x.dtype in (torch.float16, torch.bfloat16):  # no CPU eigh in half precision: float32 inside

        def f32(t):
            return t if t is None or not t.is_floating_point() else t.float()

        r = lowrank_attention_field(x.float(), V.float(), landmarks, normalization=normalization, scores=scores,
                                    method=method, W=f32(W), temperature=temperature, weights=f32(weights),
                                    n_iter=n_iter, tol=tol, max_iter=max_iter, init_g=f32(init_g),
                                    generator=generator, sampling=sampling, block_bytes=block_bytes)
        return replace(r, velocity=r.velocity.to(x.dtype))
    with torch.no_grad():  # in-place passes (products with out=): no autograd graph
        return _lowrank_field(x, V, landmarks, normalization, scores, method, W, temperature, weights, n_iter,
                              tol, max_iter, init_g, generator, sampling, block_bytes)


def _lowrank_field(x, V, landmarks, normalization, scores, method, W, temperature, weights, n_iter, tol,
                   max_iter, init_g, generator, sampling, block_bytes) -> LowRankField:
    """:func:`lowrank_attention_field` on checked float32 / float64 input."""
    n = x.shape[0]
    if method == "segment_means":
        if weights is not None and not bool(torch.allclose(weights, weights.new_full((n,), 1.0 / n))):
            raise ValueError("Nyströmformer's segment means cannot carry particle weights; use uniform weights")
        q = (x if W is None else x @ W) * (math.sqrt(x.shape[1]) / temperature)
        out = nystromformer_attention(q, x, V, min(int(landmarks), n), inverse="pinv")
        return LowRankField(out, None, 1, 0.0, math.nan, True)
    z = gaussian_coordinates(x, W, temperature)
    idx = landmarks if isinstance(landmarks, torch.Tensor) else landmark_indices(n, landmarks, method, generator,
                                                                                 sampling=sampling, points=z)
    K = _NystromKernel(z, idx, block_bytes)
    log_p, r = _log_prior(z, weights, scores)
    a = torch.full((n,), 1.0 / n, dtype=x.dtype, device=x.device) if weights is None else weights
    if normalization == "none":
        return _unnormalized(K, V, log_p, r, a)
    n_iter = 1 if normalization == "row" else n_iter
    try:
        return _scaled(K, V, log_p, a, n_iter, tol, max_iter, init_g)
    except NystromPositivityError:
        K.restore_diagonal()  # the clear outcome: exact self-weights, then an error only if still undefined
        return _scaled(K, V, log_p, a, n_iter, tol, max_iter, init_g)
