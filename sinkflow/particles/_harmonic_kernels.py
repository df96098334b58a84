"""The harmonic expansion of the attention kernel on the circle and :math:`S^2`, and its features.

:func:`harmonic_kernel` truncates the expansion to a tolerance, :class:`HarmonicKernel` evaluates it and
its features :math:`\\Phi` (``cos k theta, sin k theta`` on the circle, real spherical harmonics on
:math:`S^2`), and ``_Factored`` applies :math:`\\Phi \\Lambda \\Phi^T` block by block; the fields built on
them are in ``_harmonic_fields.py`` (whose docstring has the mathematics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import special

from sinkflow._backend import check_number
from sinkflow._checks import check_choice

__all__ = ["HarmonicKernel", "harmonic_kernel"]

_STORE_BYTES = 2**28  # features of all particles kept between applications below this size
_BLOCK_BYTES = 2**22  # else recomputed block by block, each block's features this large


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
        counts = torch.arange(1, 2 * self.order + 2, 2, device=like.device)  # 2l + 1 harmonics of degree l
        return (4 * math.pi * c).repeat_interleave(counts)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """:math:`\\Phi^T`, shape ``(rank, n)``, at unit vectors ``x`` (n, d)."""
        return _circle_features(x, self.order) if self.d == 2 else _sphere_features(x, self.order)


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


def _circle_features(x: torch.Tensor, K: int) -> torch.Tensor:
    """Rows :math:`\\cos k\\theta` (``k = 0..K``) then :math:`\\sin k\\theta` (``k = 0..K``, the first a row of zeros)."""
    F = torch.empty((2 * K + 2, x.shape[0]), dtype=x.dtype, device=x.device)
    _power_rows(x[:, 0], x[:, 1], K, F[:K + 1], F[K + 1:])
    return F


def _sphere_features(x: torch.Tensor, L: int) -> torch.Tensor:
    """Real orthonormal spherical harmonics :math:`Y_{lm}(x)`, degree by degree (``(L+1)^2`` rows).

    :math:`Y_{lm} = \\bar P_{lm}(z)\\, \\sqrt2\\, \\mathrm{Re}/\\mathrm{Im}\\, e^{im\\phi}` with
    :math:`\\bar P_{lm} = \\sin^m\\theta\\; Q_{lm}(z)`: the sine powers ride in :math:`(x_1 + i x_2)^m`, and
    :math:`Q_{lm}` runs the fully normalized recurrence in :math:`l` for all :math:`m` at once.
    """
    n, z = x.shape[0], x[:, 2]
    re, im = x.new_empty((L + 1, n)), x.new_empty((L + 1, n))
    _power_rows(x[:, 0], x[:, 1], L, re, im)
    re.mul_(math.sqrt(2)), im.mul_(math.sqrt(2))
    F = x.new_empty(((L + 1) ** 2, n))
    F[0] = 1 / math.sqrt(4 * math.pi)
    Q_prev2, Q_prev = None, F[:1]
    for l in range(1, L + 1):
        Q = x.new_empty((l + 1, n))
        if l >= 2:
            m = torch.arange(l - 1, dtype=x.dtype, device=x.device)[:, None]
            a = torch.sqrt((4.0 * l * l - 1) / (l * l - m * m))
            b = torch.sqrt(((l - 1.0) ** 2 - m * m) / (4.0 * (l - 1) ** 2 - 1))
            Q[:l - 1] = a * (z * Q_prev[:l - 1] - b * Q_prev2[:l - 1])
        Q[l - 1] = math.sqrt(2 * l + 1) * z * Q_prev[l - 1]
        Q[l] = math.sqrt((2 * l + 1) / (2 * l)) * Q_prev[l - 1]
        off = l * l
        F[off] = Q[0]
        torch.mul(Q[1:], re[1:l + 1], out=F[off + 1:off + l + 1])
        torch.mul(Q[1:], im[1:l + 1], out=F[off + l + 1:off + 2 * l + 1])
        Q_prev2, Q_prev = Q_prev, Q
    return F


class _Factored:
    """:math:`\\tilde K = \\Phi \\Lambda \\Phi^T` applied block by block (features kept when small)."""

    def __init__(self, kernel: HarmonicKernel, X: torch.Tensor):
        self.kernel, self.X, n = kernel, X, X.shape[0]
        self.lam = kernel.eigenvalues(X)[:, None]
        rows = max(1, _BLOCK_BYTES // (8 * kernel.rank))
        self.blocks = [(i0, min(n, i0 + rows)) for i0 in range(0, n, rows)]
        self.stored = kernel.features(X) if 8 * n * kernel.rank <= _STORE_BYTES else None

    def _features(self, i0, i1):
        return self.stored[:, i0:i1] if self.stored is not None else self.kernel.features(self.X[i0:i1])

    def moments(self, Wt: torch.Tensor) -> torch.Tensor:
        """:math:`\\Phi^T W`, shape ``(rank, c)``."""
        M = Wt.new_zeros((self.kernel.rank, Wt.shape[1]))
        for i0, i1 in self.blocks:
            M.addmm_(self._features(i0, i1), Wt[i0:i1])
        return M

    def sweep(self, M: torch.Tensor, step) -> torch.Tensor | None:
        """Rows ``(K W)[i0:i1] = Phi_b Lambda M`` handed to ``step(i0, i1, rows)``; the blocks ``step``
        returns (the next weights) are accumulated into the next moments (None when it returns None)."""
        LM, M_next = self.lam * M, None
        for i0, i1 in self.blocks:
            F = self._features(i0, i1)
            W_next = step(i0, i1, (LM.T @ F).T)  # (n_b, c): this side is the fast product
            if W_next is not None:
                M_next = M.new_zeros(M.shape) if M_next is None else M_next
                M_next.addmm_(F, W_next)
        return M_next


