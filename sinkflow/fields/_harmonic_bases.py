r"""Per-particle bases of the harmonic kernels (``_harmonic_kernels.py``) and the kernel's products with them.

**Circle.** The basis is the features :math:`\Phi^T` themselves: :math:`\cos k\theta, \sin k\theta`, the
real and imaginary parts of :math:`(x_1 + i x_2)^k`.

**Sphere.** :math:`Y_{lm} = \nu_m \bar P_{lm}(\cos\theta)\, \mathrm{Re}/\mathrm{Im}\, e^{im\varphi}`
(:math:`\nu_0 = 1`, :math:`\nu_m = \sqrt2`), and :math:`\bar P_{lm}(\cos\theta)` is a trigonometric
polynomial of degree :math:`l` in :math:`\theta`: a cosine series for even :math:`m`, a sine series for
odd :math:`m` (:math:`\sin^m\theta` times a polynomial in :math:`\cos\theta`), with coefficients
:math:`D_{m,lk}` bounded like :math:`\bar P_{lm}` itself. So every harmonic of degree :math:`\le L` is a
fixed combination of the products :math:`\Theta_k E_g` of two small bases per particle:
:math:`\Theta` = :math:`\cos k\theta` (for even :math:`m`) or :math:`\sin k\theta` (odd :math:`m`),
:math:`k \le L`, and :math:`E` = :math:`\cos m\varphi, \sin m\varphi` of the orders of that parity,
both powers of a unit complex number (:math:`z + i\rho` and :math:`(x_1 + i x_2)/\rho`,
:math:`\rho = \sqrt{x_1^2 + x_2^2}`). Moments :math:`\sum_j w_j \Theta_k(x_j) E_g(x_j)` are then one
matrix product per parity (rows :math:`k`, columns :math:`g`) and the kernel's sums at the particles
another, followed by a sum over :math:`k` of :math:`\Theta_k` times the result: the products are twice
the harmonics (:math:`\approx 2(L+1)^2`) but run at BLAS speed, with two elementwise passes over
:math:`4(L+1)` rows instead of a recurrence over all :math:`(L+1)^2` harmonics. :math:`D` maps these
moments to and from the harmonics (a batched product over the orders). It is computed once per
:math:`L`, by FFT of the standard normalized recurrence on a grid of :math:`\theta`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

__all__: list[str] = []


def _power_rows(u: torch.Tensor, v: torch.Tensor, m: int, C: torch.Tensor, S: torch.Tensor) -> None:
    """Real and imaginary parts of :math:`w^k = (u + iv)^k`, ``k = 0..m``, written into rows of ``C`` and ``S``.

    By blocks: rows ``k .. 2k - 2`` are :math:`w^{k-1}` times rows ``1 .. k - 1`` (four in-place
    operations a block, ~log2(m) blocks; every entry a product of at most ~log2(m) rounded factors).
    """
    C[0], S[0] = 1.0, 0.0
    if m >= 1:
        C[1], S[1] = u, v
    k = 2
    while k <= m:
        j = min(k - 1, m + 1 - k)
        c, s = C[k - 1], S[k - 1]
        torch.mul(C[1:j + 1], c, out=C[k:k + j]).addcmul_(S[1:j + 1], s, value=-1.0)
        torch.mul(S[1:j + 1], c, out=S[k:k + j]).addcmul_(C[1:j + 1], s)
        k += j


def _circle_features(x: torch.Tensor, K: int, F: torch.Tensor | None = None) -> torch.Tensor:
    """Rows :math:`\\cos k\\theta` (``k = 0..K``) then :math:`\\sin k\\theta` (``k = 0..K``, the first a row of zeros),
    written into ``F`` when given."""
    F = x.new_empty((2 * K + 2, x.shape[0])) if F is None else F
    _power_rows(x[:, 0], x[:, 1], K, F[:K + 1], F[K + 1:])
    return F


def _mm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``A @ B`` for a short ``A`` (a few rows): on the CPU through numpy's BLAS, with one
    matrix-vector product per row up to two rows, several times faster than torch's products at
    these shapes (benchmarks/bench_harmonic.py, docs/performance.md)."""
    if A.device.type != "cpu":
        return A @ B
    An, Bn = A.numpy(), B.numpy()
    if An.shape[0] <= 2:
        return torch.from_numpy(np.stack([row @ Bn for row in An]))
    return torch.from_numpy(An @ Bn)


class _CircleBasis:
    """The circle's features as the basis: moments :math:`\\Phi^T W`, sums :math:`\\Phi N`."""

    def __init__(self, K: int):
        self.K = K
        self.width = 2 * K + 2  # values per particle

    def block(self, x, buffer=None):
        return _circle_features(x, self.K,
                                None if buffer is None else buffer[:self.width * len(x)].view(self.width, -1))

    def zeros(self, cols, like):
        return like.new_zeros((self.width, cols))

    def add_moments(self, acc, F, W):
        acc += _mm(W.T, F.T).T

    def apply(self, F, N):
        return _mm(N.T, F).T

    def to_harmonics(self, acc):
        return acc

    def from_harmonics(self, M):
        return M

    def rows(self, F, rows, out=None):
        return F[rows] if out is None else torch.index_select(F, 0, rows, out=out)

    def harmonics(self, F, out=None):
        """All the harmonics at the block's particles, ``(rank, n)`` (the block itself, or copied into ``out``)."""
        return F if out is None else out.copy_(F)

    def position_zeros(self, like):
        return self.zeros(3, like)  # [w, w x1, w x2]

    def add_positions(self, acc, F, w, x):
        self.add_moments(acc, F, torch.cat([w[:, None], w[:, None] * x], 1))

    def positions_to_harmonics(self, acc):
        return acc


def _sphere_degrees(L: int) -> np.ndarray:
    r"""Degree :math:`l` of each harmonic row: step :math:`s = l - m` by step, within a step
    ``m = 0, cos 1, sin 1, cos 2, sin 2, ...``."""
    return np.concatenate([np.concatenate([[s], np.repeat(np.arange(1, L - s + 1) + s, 2)]) for s in range(L + 1)])


def _sphere_row(L: int, degree: int, m: int, sine: int) -> int:
    """Row of :math:`Y_{lm}` (its ``sin m phi`` part when ``sine``) in the order of :func:`_sphere_degrees`."""
    s = degree - m
    return s * (2 * L + 2 - s) + (0 if m == 0 else 2 * m - 1 + sine)


def _legendre_fourier(L: int) -> np.ndarray:
    r""":math:`D_{m,lk}`, shape ``(L+1, L+1, L+1)``: :math:`\nu_m \bar P_{lm}(\cos\theta) = \sum_k D_{m,lk}
    \cos k\theta` (even :math:`m`) or :math:`\sin k\theta` (odd :math:`m`), zero unless :math:`m \le l`,
    :math:`k \le l` and :math:`k \equiv l \pmod 2`.

    The fully normalized recurrence :math:`\bar P_{mm} = q_m \sin^m\theta`, :math:`\bar P_{m+1,m} =
    \sqrt{2m+3}\cos\theta\, \bar P_{mm}`, :math:`\bar P_{lm} = a_{lm}(\cos\theta\, \bar P_{l-1,m} -
    \bar P_{l-2,m} / a_{l-1,m})`, :math:`a_{lm} = \sqrt{(4l^2-1)/(l^2-m^2)}`, on :math:`4(L+1)` points
    of the whole circle (signed :math:`\sin\theta`: even or odd functions), then an FFT (exact: degree < half
    the points).
    """
    points = 4 * (L + 1)
    theta = 2 * np.pi * np.arange(points) / points
    sin, cos = np.sin(theta), np.cos(theta)
    degrees = np.arange(L + 1)
    keep = (degrees[None, :] <= degrees[:, None]) & ((degrees[:, None] - degrees[None, :]) % 2 == 0)  # [l, k]
    out = np.zeros((L + 1, L + 1, L + 1))
    diagonal = np.full(points, 1 / math.sqrt(4 * math.pi))
    for m in range(L + 1):
        if m:
            diagonal = diagonal * math.sqrt((2 * m + 1) / (2 * m)) * sin
        P = np.zeros((L + 1, points))
        P[m] = diagonal * (math.sqrt(2) if m else 1.0)
        if m < L:
            P[m + 1] = math.sqrt(2 * m + 3) * cos * P[m]
        for d in range(m + 2, L + 1):
            a, a_prev = (math.sqrt((4 * e * e - 1) / (e * e - m * m)) for e in (d, d - 1))
            P[d] = a * (cos * P[d - 1] - P[d - 2] / a_prev)
        X = np.fft.rfft(P, axis=1)[:, :L + 1] * (2 / points)
        X[:, 0] /= 2
        out[m] = np.where(keep, X.real if m % 2 == 0 else -X.imag, 0.0)
    return out


def _orders(L: int, p: int) -> int:
    """How many orders ``m = p, p + 2, ...`` up to ``L``."""
    return (L - p) // 2 + 1


@dataclass(frozen=True)
class _SpherePlan:
    """Per parity ``p`` of the orders: ``D[p]``, shape ``(2h, L+1 [l], L+1 [k])``, for the columns
    ``g = 2j + s`` of :math:`E_p` (``cos m phi`` (s = 0), ``sin m phi`` (s = 1), ``m = 2j + p <= L``); the
    harmonic rows at positions ``flat[p]`` (``g (L+1) + l``) are ``rows[p]`` (order of :func:`_sphere_degrees`);
    ``parity`` and ``position``: those of each harmonic row."""

    D: tuple
    flat: tuple
    rows: tuple
    parity: torch.Tensor
    position: torch.Tensor


@functools.lru_cache(maxsize=16)
def _sphere_plan(L: int, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> _SpherePlan:
    coefficients = _legendre_fourier(L)
    parity, position = np.zeros((L + 1) ** 2, dtype=np.int64), np.zeros((L + 1) ** 2, dtype=np.int64)
    D, flat, rows = [], [], []
    for p in (0, 1):
        Dp, fp, rp = np.zeros((2 * _orders(L, p), L + 1, L + 1)), [], []
        for g in range(len(Dp)):
            m, sine = 2 * (g // 2) + p, g % 2
            if m == 0 and sine:
                continue
            Dp[g] = coefficients[m]
            fp += [g * (L + 1) + degree for degree in range(m, L + 1)]
            rp += [_sphere_row(L, degree, m, sine) for degree in range(m, L + 1)]
        parity[rp], position[rp] = p, fp
        D.append(torch.tensor(Dp, dtype=dtype, device=device))
        flat.append(torch.tensor(fp, device=device))
        rows.append(torch.tensor(rp, device=device))
    return _SpherePlan(tuple(D), tuple(flat), tuple(rows), torch.tensor(parity, device=device),
                       torch.tensor(position, device=device))


class _SphereBasis:
    """The product basis of :math:`S^2` (module docstring) up to degree ``L + 1`` (one more for
    :meth:`add_positions`). A block is ``(Theta, E)``, shapes ``(2, L+2, n)`` (``cos k theta``, ``sin k theta``)
    and ``(2, 2h, n)`` (parity ``p`` of the order first, then ``g = 2j + s`` for ``cos`` / ``sin (2j + p) phi``);
    moments of ``c`` columns are per parity ``(c (L+1), 2 orders(L, p))``."""

    def __init__(self, L: int, like: torch.Tensor):
        self.L, self.plan = L, _sphere_plan(L, like.dtype, like.device)
        self.half = _orders(L + 1, 0)  # orders per parity up to L + 1 (the odd ones padded to as many)
        self.values = 2 * (L + 2) + 4 * self.half  # values per particle
        self.width = self.values  # what a block holds per particle
        self._work = None

    def _workspace(self, shape, like):
        """A tensor of ``shape`` in one reused buffer (fresh memory costs page faults: 2-3x the products)."""
        size = math.prod(shape)
        if self._work is None or self._work.numel() < size:
            self._work = like.new_empty(size)
        return self._work[:size].view(shape)

    def block(self, x, buffer=None):
        n, L, h = x.shape[0], self.L, self.half
        out = x.new_empty(self.values * n) if buffer is None else buffer[:self.values * n]
        T, E = out[:2 * (L + 2) * n].view(2, L + 2, n), out[2 * (L + 2) * n:].view(2, h, 2, n)
        x1, x2, z = x.T.contiguous()
        rho = torch.hypot(x1, x2)
        inv = rho.clamp_min(torch.finfo(x.dtype).tiny).reciprocal_()  # at a pole x1 = x2 = 0: E = (1, 0, 0, ...)
        c1, s1 = x1 * inv, x2 * inv  # not in place: for one particle x.T.contiguous() is x itself
        _power_rows(z, rho, L + 1, T[0], T[1])  # cos k theta, sin k theta
        c2 = c1 * c1
        c2.addcmul_(s1, s1, value=-1.0)
        _power_rows(c2, 2 * c1 * s1, h - 1, E[0, :, 0], E[0, :, 1])  # orders 0, 2, 4, ...
        torch.mul(E[0, :, 0], c1, out=E[1, :, 0]).addcmul_(E[0, :, 1], s1, value=-1.0)  # orders 1, 3, 5, ...
        torch.mul(E[0, :, 1], c1, out=E[1, :, 1]).addcmul_(E[0, :, 0], s1)
        return T, E.view(2, 2 * h, n)

    def _columns(self, p):
        return 2 * _orders(self.L, p)

    def zeros(self, cols, like):
        return [like.new_zeros((cols * (self.L + 1), self._columns(p))) for p in (0, 1)]

    def add_moments(self, acc, block, W):
        T, E = block
        X, Wt = self._workspace((W.shape[1], self.L + 1, T.shape[2]), T), W.T.contiguous()
        for p in (0, 1):
            torch.mul(Wt[:, None, :], T[p, :self.L + 1], out=X)
            acc[p].addmm_(X.view(-1, T.shape[2]), E[p, :self._columns(p)].T)

    def apply(self, block, N):
        """The sums :math:`\\sum_{k,g} \\Theta_k E_g N_{c,k,g}` at the block's particles, shape ``(n, c)``, in the
        workspace (valid until the next product)."""
        T, E = block
        c, n = N[0].shape[0] // (self.L + 1), T.shape[2]
        work = self._workspace(((2 + self.L + 1) * c * n,), T)
        sums, H = work[:2 * c * n].view(2, c, n), work[2 * c * n:].view(c * (self.L + 1), n)
        for p in (0, 1):
            torch.mm(N[p], E[p, :self._columns(p)], out=H)
            torch.sum(H.view(c, self.L + 1, n).mul_(T[p, :self.L + 1]), 1, out=sums[p])
        return sums[0].add_(sums[1]).T

    def to_harmonics(self, acc):
        cols = acc[0].shape[0] // (self.L + 1)
        M = acc[0].new_empty(((self.L + 1) ** 2, cols))
        for p in (0, 1):
            Y = torch.bmm(self.plan.D[p], acc[p].view(cols, self.L + 1, -1).permute(2, 1, 0))  # (g, l, c)
            M[self.plan.rows[p]] = Y.reshape(-1, cols)[self.plan.flat[p]]
        return M

    def from_harmonics(self, M):
        cols, N = M.shape[1], []
        for p in (0, 1):
            Z = M.new_zeros((self._columns(p) * (self.L + 1), cols))
            Z[self.plan.flat[p]] = M[self.plan.rows[p]]
            A = torch.bmm(self.plan.D[p].transpose(1, 2), Z.view(-1, self.L + 1, cols))  # (g, k, c)
            N.append(A.permute(2, 1, 0).reshape(cols * (self.L + 1), -1))
        return N

    def part(self, block, j0, j1):
        """Particles ``j0:j1`` of a block."""
        return tuple(t[..., j0:j1] for t in block)

    def rows(self, block, rows, out=None):
        """The harmonics ``rows`` (indices, :func:`_sphere_degrees` order) at the block's particles (into ``out``)."""
        T, E = block
        out = T.new_empty((len(rows), T.shape[2])) if out is None else out
        for p in (0, 1):
            where = torch.nonzero(self.plan.parity[rows] == p)[:, 0]
            position = self.plan.position[rows[where]]
            Q, Eg = self._workspace((2, len(where), T.shape[2]), T)
            torch.mm(self.plan.D[p].view(-1, self.L + 1)[position], T[p, :self.L + 1], out=Q)
            out[where] = Q.mul_(torch.index_select(E[p], 0, position // (self.L + 1), out=Eg))
        return out

    def harmonics(self, block, out=None):
        """All the harmonics at the block's particles, ``((L+1)^2, n)`` (into ``out``)."""
        return self.rows(block, torch.arange((self.L + 1) ** 2, device=block[0].device), out)

    def position_zeros(self, like):
        return [like.new_zeros((self.L + 2, 2 * self.half)) for _ in (0, 1)]

    def add_positions(self, acc, block, w, x):
        """Accumulates the moments of ``w`` alone up to degree ``L + 1``: those of ``[w, w x]`` to ``L`` follow."""
        T, E = block
        X = self._workspace(T.shape[1:], T)
        for p in (0, 1):
            acc[p].addmm_(torch.mul(T[p], w, out=X), E[p].T)

    def positions_to_harmonics(self, acc):
        r""":math:`\Phi^T [w, w x]` from the moments of ``w`` to degree ``L + 1``: with :math:`G_{km} = \sum_j w_j
        \Theta_k e^{im\varphi}` (complex), :math:`z \cos k\theta = (\cos(k+1)\theta + \cos(k-1)\theta)/2` (same
        for sine), :math:`\sin\theta \cos k\theta = (\sin(k+1)\theta - \sin(k-1)\theta)/2`, :math:`\sin\theta
        \sin k\theta = (\cos(k-1)\theta - \cos(k+1)\theta)/2` and
        :math:`x_1 \pm i x_2 = \sin\theta e^{\pm i\varphi}`."""
        L = self.L
        G = torch.empty((L + 2, 2 * self.half), dtype=torch.complex128 if acc[0].dtype == torch.float64
                        else torch.complex64, device=acc[0].device)
        for p in (0, 1):
            G[:, p::2] = torch.view_as_complex(acc[p].view(L + 2, self.half, 2))
        G = G[:, :L + 2]  # orders 0 .. L + 1
        sign = torch.ones(L + 2, dtype=acc[0].dtype, device=acc[0].device)
        sign[1::2] = -1.0  # cos or sin k theta: even or odd in theta
        G = torch.cat([(sign * G[1])[None], G])  # rows k = -1 .. L + 1
        up, down = G[2:], G[:-2]  # k + 1 and k - 1 for k = 0 .. L
        z = (up + down)[:, :L + 1] / 2
        raised = sign[:L + 1] * (up - down)[:, 1:] / 2  # sum_j w (x1 + i x2) Theta_k e^{im phi}, m = 0 .. L
        lowered = sign[1:L + 1] * (up - down)[:, :L] / 2  # ... (x1 - i x2), m = 1 .. L
        lowered = torch.cat([raised[:, :1].conj(), lowered], 1)  # m = 0: e^{-i phi} = conj(e^{i phi})
        columns = [G[1:L + 2, :L + 1], (raised + lowered) / 2, (raised - lowered) / 2j, z]
        M = torch.stack(columns)  # (4, k, m)
        out = [torch.view_as_real(M[:, :, p::2].contiguous()).reshape(4 * (L + 1), -1) for p in (0, 1)]
        return self.to_harmonics(out)


def _sphere_features(x: torch.Tensor, L: int) -> torch.Tensor:
    r"""Real orthonormal spherical harmonics :math:`Y_{lm}(x)`, ``((L+1)^2, n)``, rows in
    :func:`_sphere_degrees` order."""
    basis = _SphereBasis(L, x)
    return basis.harmonics(basis.block(x))


#: Requested accuracy of the non-uniform FFTs, relative to the sums of the moduli of the weights and
#: coefficients (finufft's).
FOURIER_EPS = 1e-14


def _fourier_threads() -> int:
    """The non-uniform FFTs' threads: torch's (one inside :func:`sinkflow.simulate`'s small-problem scope)."""
    return max(1, torch.get_num_threads())


class _SphereFourierBasis(_SphereBasis):
    r"""The product basis of :math:`S^2` applied by non-uniform FFTs (``finufft``): every product
    :math:`\Theta_k E_g` is a trigonometric polynomial in :math:`(\theta, \varphi)` of degree :math:`\le L + 1`
    in each, so the moments :math:`\sum_j w_j e^{i(k\theta_j + m\varphi_j)}` (type 1) and the sums
    :math:`\sum_{k,m} c_{km} e^{i(k\theta + m\varphi)}` at the particles (type 2) cost ``O(n)`` spreading to a
    small grid (:data:`FOURIER_EPS`) instead of ``O(n L^2)`` products; the rest (:math:`D`, the harmonics,
    the Gram rows of Newton's step) is :class:`_SphereBasis`'s. A block is ``(x, angles)``: the unit
    vectors (a view) and their :math:`(\theta, \varphi)`, ``(2, n)``."""

    def __init__(self, L: int, like: torch.Tensor):
        super().__init__(L, like)
        self.width = 2  # a block holds the two angles per particle

    def block(self, x, buffer=None):
        n = x.shape[0]
        angles = (x.new_empty(2 * n) if buffer is None else buffer[:2 * n]).view(2, n)
        torch.atan2(torch.hypot(x[:, 0], x[:, 1]), x[:, 2], out=angles[0])  # theta in [0, pi]
        torch.atan2(x[:, 1], x[:, 0], out=angles[1])  # phi (0 at a pole)
        return x, angles

    def _grid(self, angles, W, degree):
        r""":math:`G_c[k, m] = \sum_j W_{jc} e^{i(k\theta_j + m\varphi_j)}`, ``|k|, |m| <= degree``, shape
        ``(c, 2 degree + 1, 2 degree + 1)``."""
        import finufft

        theta, phi = (a.numpy() for a in angles)
        strengths = np.ascontiguousarray(W.numpy().T).astype(np.complex128)
        modes = 2 * degree + 1
        return finufft.nufft2d1(theta, phi, strengths, (modes, modes), eps=FOURIER_EPS, isign=1,
                                nthreads=_fourier_threads())

    def _accumulate(self, acc, G, degree, columns):
        """Add the product moments of the grid ``G`` (degrees ``k <= degree``) into ``acc``, whose parity ``p``
        has ``columns(p)`` orders."""
        c, up, down = G.shape[0], G[:, degree:], G[:, degree::-1]  # k = 0..degree and -k
        for p, sums in ((0, (up + down) / 2), (1, (up - down) / 2j)):
            count = _orders(degree, p)
            Z = sums[:, :, degree + p:degree + p + 2 * count:2]  # orders m = p, p + 2, ...
            acc[p].view(c, degree + 1, columns(p), 2)[:, :, :count] += torch.from_numpy(np.stack([Z.real, Z.imag], -1))

    def add_moments(self, acc, block, W):
        self._accumulate(acc, self._grid(block[1], W, self.L), self.L, lambda p: _orders(self.L, p))

    def add_positions(self, acc, block, w, x):
        self._accumulate(acc, self._grid(block[1], w[:, None], self.L + 1), self.L + 1, lambda p: self.half)

    def apply(self, block, N):
        import finufft

        L, c = self.L, N[0].shape[0] // (self.L + 1)
        coef = np.zeros((c, 2 * L + 1, 2 * L + 1), dtype=np.complex128)
        for p, factor in ((0, 0.5), (1, -0.5j)):
            count = _orders(L, p)
            Z = N[p].numpy().reshape(c, L + 1, count, 2)
            z = factor * (Z[..., 0] - 1j * Z[..., 1])  # cos m phi a + sin m phi b = Re(e^{im phi} (a - ib))
            orders = slice(L + p, L + p + 2 * count, 2)
            coef[:, L:, orders] += z
            coef[:, L::-1, orders] += z if p == 0 else -z
        coef = (coef + coef[:, ::-1, ::-1].conj()) / 2  # the same real parts, now real sums: two fields a transform
        if c % 2:
            coef = np.concatenate([coef, np.zeros_like(coef[:1])])
        theta, phi = (a.numpy() for a in block[1])
        sums = finufft.nufft2d2(theta, phi, coef[0::2] + 1j * coef[1::2], eps=FOURIER_EPS, isign=1,
                                nthreads=_fourier_threads())
        sums = np.stack([sums.real, sums.imag], 1).reshape(-1, sums.shape[-1])[:c]
        return torch.from_numpy(np.ascontiguousarray(sums.T))

    def part(self, block, j0, j1):
        return block[0][j0:j1], block[1][:, j0:j1]

    def rows(self, block, rows, out=None):
        return _SphereBasis.rows(self, _SphereBasis.block(self, block[0]), rows, out)

