"""The harmonic expansion of the attention kernel on the circle and :math:`S^2`, and its features.

:func:`harmonic_kernel` truncates the expansion to a tolerance, :class:`HarmonicKernel` evaluates it and
its features :math:`\\Phi` (``cos k theta, sin k theta`` on the circle, real spherical harmonics on
:math:`S^2`), and ``_Factored`` applies :math:`\\Phi \\Lambda \\Phi^T` block by block; the fields built on
them are in ``_harmonic_fields.py`` (whose docstring has the mathematics).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import special

from sinkflow._backend import check_number
from sinkflow._checks import check_choice

__all__ = ["HarmonicKernel", "harmonic_kernel"]

_STORE_BYTES = 2**30  # features of all particles kept between applications up to this size (1 GiB: n = 10^6 at beta = 32)
_BLOCK_BYTES = 2**22  # else recomputed block by block, each block's features this large
# Storing costs a first write to fresh memory (~2 us per 4 KiB page here: 44 ms for the 92 MB of n = 2*10^4, beta = 5
# on S^2, three times the features' arithmetic), so a single application (two passes) recomputes them instead.


@dataclass(frozen=True)
class HarmonicKernel:
    """The truncated harmonic expansion of :math:`e^{\\beta(\\langle x, y\\rangle - 1)}` (module docstring).

    Attributes
    ----------
    d : int
        2 (the circle) or 3 (the sphere :math:`S^2`).
    beta : float
        Inverse temperature.
    order : int
        Truncation order: :math:`K` on the circle (modes :math:`|k| \\le K`), :math:`L` on
        :math:`S^2` (degrees :math:`l \\le L`).
    coefficients : numpy.ndarray (order + 1,)
        :math:`\\tilde I_k(\\beta)` (circle) or :math:`\\tilde\\imath_l(\\beta)` (:math:`S^2`).
    tail : float
        Bound on the sup norm of the dropped kernel (at most ``tol * min_weight / 4``).
    """

    d: int
    beta: float
    order: int
    coefficients: np.ndarray
    tail: float

    @property
    def rank(self) -> int:
        """Features per particle: :math:`2K + 2` on the circle (:math:`\\cos k\\theta`, :math:`\\sin k\\theta`,
        ``k = 0..K``, one of them 0) or :math:`(L + 1)^2` on :math:`S^2`."""
        return 2 * self.order + 2 if self.d == 2 else (self.order + 1) ** 2

    def __call__(self, cosine):
        """The truncated kernel at :math:`\\langle x, y\\rangle` = ``cosine`` (numpy)."""
        t = np.clip(np.asarray(cosine, dtype=float), -1.0, 1.0)
        if self.d == 2:
            k = np.arange(self.order + 1)
            weights = np.where(k == 0, 1.0, 2.0) * self.coefficients
            return np.cos(np.multiply.outer(np.arccos(t), k)) @ weights
        l = np.arange(self.order + 1)
        return special.eval_legendre(l, t[..., None]) @ ((2 * l + 1) * self.coefficients)

    def eigenvalues(self, like: torch.Tensor) -> torch.Tensor:
        """:math:`\\Lambda` of :math:`\\Phi \\Lambda \\Phi^T`, in the order of :meth:`features`."""
        c = torch.as_tensor(self.coefficients, dtype=like.dtype, device=like.device)
        if self.d == 2:
            twice = torch.cat([c[:1], 2 * c[1:]])
            return torch.cat([twice, twice])  # cos k theta, sin k theta (sin 0 = 0)
        return 4 * math.pi * c[torch.as_tensor(_sphere_degrees(self.order), device=like.device)]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """:math:`\\Phi^T`, shape ``(rank, n)``, at unit vectors ``x`` (n, d)."""
        return self._features(x)

    def _features(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`features`, written into ``out`` (rank, n) when given (reused memory: no first writes)."""
        return _circle_features(x, self.order, out) if self.d == 2 else _sphere_features(x, self.order, out)


def harmonic_kernel(temperature: float, d: int, tol: float = 1e-10, min_weight: float = 1.0) -> HarmonicKernel:
    """The harmonic expansion of the attention kernel on the circle (``d = 2``) or :math:`S^2` (``d = 3``).

    Parameters
    ----------
    temperature : float
        :math:`\\tau = 1/\\beta > 0`.
    d : {2, 3}
        Ambient dimension.
    tol : float
        Accuracy of the field (> 0): the order is the smallest with dropped terms summing to at
        most ``tol * min_weight / 4``.
    min_weight : float
        Smallest particle weight (``1/n`` for uniform weights), in (0, 1].

    Returns
    -------
    HarmonicKernel

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.particles import harmonic_kernel
    >>> ker = harmonic_kernel(1 / 5.0, 2, tol=1e-10, min_weight=1e-3)
    >>> ker.order, ker.rank, bool(ker.tail <= 1e-13 / 4)
    (21, 44, True)
    >>> t = np.linspace(-1, 1, 7)
    >>> bool(np.abs(ker(t) - np.exp(5.0 * (t - 1))).max() <= ker.tail + 1e-15)
    True
    """
    beta = 1.0 / float(check_number(temperature, "temperature", positive=True))
    d = check_number(d, "d", integer=True, positive=True)
    check_choice(d, "d (2: the circle, 3: the sphere S^2)", (2, 3))
    tol = float(check_number(tol, "tol", positive=True))
    min_weight = float(check_number(min_weight, "min_weight", positive=True))
    if min_weight > 1:
        raise ValueError(f"min_weight must be in (0, 1] (a particle weight), got {min_weight!r}")
    budget = tol * min_weight / 4
    k_max = int(beta + 12 * math.sqrt(beta * max(1.0, -math.log(budget))) + 40)
    k = np.arange(k_max + 1, dtype=float)
    if d == 2:
        coef = special.ive(k, beta)
        terms = np.where(k == 0, 1.0, 2.0) * coef
    else:
        coef = math.sqrt(math.pi / (2 * beta)) * special.ive(k + 0.5, beta)
        terms = (2 * k + 1) * coef
    tails = np.concatenate([np.cumsum(terms[::-1])[::-1][1:], [0.0]])  # tails[K] = sum_{k > K} terms
    order = int(np.argmax(tails <= budget))
    return HarmonicKernel(int(d), beta, order, coef[:order + 1].copy(), float(tails[order]))


def _power_rows(u: torch.Tensor, v: torch.Tensor, m: int, C: torch.Tensor, S: torch.Tensor) -> None:
    """Real and imaginary parts of :math:`(u + iv)^k`, ``k = 0..m``, written into rows of ``C`` and ``S``.

    By doubling (:math:`w^{k+j} = w^k w^j`, each block of rows from the ones before it): every entry
    is a product of at most ~log2(m) rounded factors, written in place (no complex tensors, no copies).
    """
    C[0], S[0] = 1.0, 0.0
    if m >= 1:
        C[1], S[1] = u, v
    k = 2
    while k <= m:
        ck = C[k - 1] * u - S[k - 1] * v  # w^k
        sk = S[k - 1] * u + C[k - 1] * v
        j = min(k, m + 1 - k)
        torch.mul(C[:j], ck, out=C[k:k + j]).addcmul_(S[:j], sk, value=-1.0)
        torch.mul(S[:j], ck, out=S[k:k + j]).addcmul_(C[:j], sk)
        k += j


def _circle_features(x: torch.Tensor, K: int, F: torch.Tensor | None = None) -> torch.Tensor:
    """Rows :math:`\\cos k\\theta` (``k = 0..K``) then :math:`\\sin k\\theta` (``k = 0..K``, the first a row of zeros),
    written into ``F`` when given."""
    F = x.new_empty((2 * K + 2, x.shape[0])) if F is None else F
    _power_rows(x[:, 0], x[:, 1], K, F[:K + 1], F[K + 1:])
    return F


def _sphere_degrees(L: int) -> np.ndarray:
    r"""Degree :math:`l` of each row of :func:`_sphere_features` (step :math:`s = l - m` by step)."""
    return np.concatenate([np.concatenate([[s], np.repeat(np.arange(1, L - s + 1) + s, 2)]) for s in range(L + 1)])


@functools.lru_cache(maxsize=16)
def _sphere_steps(L: int, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"):
    r"""Per step :math:`s = l - m \ge 1`: its first row, those of the two steps before it, and the recurrence
    coefficients of its rows (m = 0, then 1, 1, 2, 2, ...) as columns, and the normalization of :math:`\bar Q_{mm}`.

    :math:`\bar Q_{m+1,m} = \sqrt{2m+3}\, z\, \bar Q_{mm}` and
    :math:`\bar Q_{lm} = a_{lm} z \bar Q_{l-1,m} - a_{lm} b_{lm} \bar Q_{l-2,m}` (fully normalized).
    """
    offsets = np.concatenate([[0], np.cumsum(2 * (L - np.arange(L + 1)) + 1)]).tolist()

    def column(values):
        return torch.tensor(values, dtype=dtype, device=device)[:, None]

    steps = []
    for s in range(1, L + 1):
        m = np.concatenate([[0.0], np.repeat(np.arange(1.0, L - s + 1), 2)])
        l = m + s
        if s == 1:
            steps.append((offsets[s], offsets[s - 1], 0, column(np.sqrt(2 * m + 3)), None))
            continue
        a = np.sqrt((4 * l * l - 1) / (l * l - m * m))
        ab = a * np.sqrt(((l - 1) ** 2 - m * m) / (4 * (l - 1) ** 2 - 1))
        steps.append((offsets[s], offsets[s - 1], offsets[s - 2], column(a), column(ab)))
    q = np.cumprod(np.concatenate([[1 / math.sqrt(4 * math.pi)], np.sqrt((2 * np.arange(1, L + 1) + 1.0)
                                                                          / (2 * np.arange(1, L + 1)))]))
    return tuple(steps), float(q[0]), column(q[1:] * math.sqrt(2))


def _sphere_features(x: torch.Tensor, L: int, F: torch.Tensor | None = None) -> torch.Tensor:
    r"""Real orthonormal spherical harmonics :math:`Y_{lm}(x)` (``(L+1)^2`` rows, degrees :func:`_sphere_degrees`).

    :math:`Y_{lm} = \bar Q_{lm}(z)\, \sqrt2\, \mathrm{Re}/\mathrm{Im}\,(x_1 + i x_2)^m` (:math:`\bar P_{lm} =
    \sin^m\theta\, \bar Q_{lm}`): the recurrence in :math:`l` is linear, so it runs on the products
    themselves, all orders :math:`m` at once. Rows go by step :math:`s = l - m`; within a step
    ``cos m=0, cos 1, sin 1, cos 2, sin 2, ...``, so the rows a step needs from the two before it are
    their first rows (one contiguous slice each, three in-place products per step). Written into ``F`` when given.
    """
    n, z = x.shape[0], x[:, 2].contiguous()
    steps, q0, norm = _sphere_steps(L, x.dtype, x.device)
    F = x.new_empty(((L + 1) ** 2, n)) if F is None else F
    first = F[:2 * L + 1]  # s = 0: Y_mm
    re, im = x.new_empty((L + 1, n)), x.new_empty((L + 1, n))
    _power_rows(x[:, 0], x[:, 1], L, re, im)
    first[0] = q0
    torch.mul(re[1:], norm, out=first[1::2])
    torch.mul(im[1:], norm, out=first[2::2])
    for start, prev, before, a, ab in steps:
        rows = a.shape[0]
        out = F[start:start + rows]
        torch.mul(F[prev:prev + rows], z, out=out).mul_(a)
        if ab is not None:
            out.addcmul_(F[before:before + rows], ab, value=-1.0)
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


class _Factored:
    """:math:`\\tilde K = \\Phi \\Lambda \\Phi^T` applied block by block (features kept when small and
    ``keep``: more than one application to come)."""

    def __init__(self, kernel: HarmonicKernel, X: torch.Tensor, keep: bool = True):
        self.kernel, self.X, n = kernel, X, X.shape[0]
        self.lam = kernel.eigenvalues(X)[:, None]
        rows = max(1, _BLOCK_BYTES // (8 * kernel.rank))
        self.blocks = [(i0, min(n, i0 + rows)) for i0 in range(0, n, rows)]
        store = keep and 8 * n * kernel.rank <= _STORE_BYTES
        self.stored = [kernel.features(X[i0:i1]) for i0, i1 in self.blocks] if store else None
        self.buffer = None if store else X.new_empty(kernel.rank * rows)  # one block's features, reused

    def _features(self, b, i0, i1):
        if self.stored is not None:
            return self.stored[b]
        return self.kernel._features(self.X[i0:i1], self.buffer[:self.kernel.rank * (i1 - i0)].view(-1, i1 - i0))

    def moments(self, Wt: torch.Tensor) -> torch.Tensor:
        """:math:`\\Phi^T W`, shape ``(rank, c)``, for ``Wt`` = :math:`W` ``(n, c)``."""
        M = Wt.new_zeros((self.kernel.rank, Wt.shape[1]))
        for b, (i0, i1) in enumerate(self.blocks):
            M += _mm(Wt[i0:i1].T, self._features(b, i0, i1).T).T
        return M

    def gram(self, rows: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """:math:`\\Phi_R^T \\mathrm{diag}(s)\\, \\Phi_R` over the feature rows ``R`` = ``rows``."""
        G = s.new_zeros((len(rows), len(rows)))
        for b, (i0, i1) in enumerate(self.blocks):
            F = self._features(b, i0, i1)[rows]
            G += _mm(F * s[i0:i1], F.T)
        return G

    def sweep(self, M: torch.Tensor, step) -> torch.Tensor | None:
        """Rows ``(K W)[i0:i1] = Phi_b Lambda M`` handed to ``step(i0, i1, rows)``; the blocks ``step``
        returns (the next weights) are accumulated into the next moments (None when it returns None)."""
        LM, M_next = self.lam * M, None
        for b, (i0, i1) in enumerate(self.blocks):
            F = self._features(b, i0, i1)
            W_next = step(i0, i1, _mm(LM.T, F).T)  # (n_b, c): this side is the fast product
            if W_next is not None:
                M_next = M.new_zeros((M.shape[0], W_next.shape[1])) if M_next is None else M_next
                M_next += _mm(W_next.T, F.T).T
        return M_next


