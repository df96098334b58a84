"""The harmonic expansion of the attention kernel on the circle and :math:`S^2`, and its application.

:func:`harmonic_kernel` truncates the expansion to a tolerance, :class:`HarmonicKernel` evaluates it and
its features :math:`\\Phi` (``cos k theta, sin k theta`` on the circle, real spherical harmonics on
:math:`S^2`), and ``_Factored`` applies :math:`\\Phi \\Lambda \\Phi^T` block by block in a per-particle basis
(``_harmonic_bases.py``: on :math:`S^2` products of Fourier modes in both angles, by matrix products,
without forming the harmonics); the fields built on them are in ``_harmonic_fields.py`` (whose
docstring has the mathematics).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import special

from sinkflow._backend import check_number
from sinkflow._checks import check_choice
from sinkflow.fields._harmonic_bases import _CircleBasis, _mm, _sphere_degrees, _SphereBasis, _SphereFourierBasis

__all__ = ["HarmonicKernel", "harmonic_kernel"]

#: Particles and degrees from which the sphere's products run through non-uniform FFTs (their cost per
#: particle does not grow with the degree, the products' grows like its square; benchmarks/bench_harmonic.py).
FOURIER_MIN_N = 4096
FOURIER_MIN_ORDER = 24
_STORE_BYTES = 2**30  # bases of all particles kept between applications up to this size (1 GiB: n = 10^6 at beta = 32
# on the circle, at beta = 5 on S^2)
_BLOCK_BYTES = 2**22  # else recomputed block by block, each block's basis this large (2-8 MiB measured alike on S^2)
# Storing costs a first write to fresh memory (~2 us per 4 KiB page here), so a single application (two passes)
# recomputes them instead.


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
    fallback : HarmonicKernel or None
        Set on the kernels the fields choose themselves (:func:`sinkflow.harmonic_attention_field`,
        :func:`sinkflow.simulate`): this one is truncated for the row sums a configuration usually
        has, and ``fallback`` (for any configuration) evaluates the field wherever :meth:`certifies`
        says no. None: used as is.
    """

    d: int
    beta: float
    order: int
    coefficients: np.ndarray
    tail: float
    fallback: HarmonicKernel | None = None

    def certifies(self, tol: float, smallest_row: float) -> bool:
        r"""Whether the dropped kernel changes a field by at most ``tol`` when its rows sum to at least
        ``smallest_row``: the least :math:`(\tilde K a s)_i / \sum_j a_j s_j` over the particles, for column
        scaling ``s`` (1 for SoftMax). A row's sum and numerators move by at most ``tail`` times
        :math:`\sum_j a_j s_j` (``|x_j| = 1``), so its normalized field by ``2 tail / smallest_row`` (``tol / 2``
        here); Sinkhorn's scaling moves by as much (its Jacobian :math:`I + K` has eigenvalues in ``[1, 2]``)."""
        return self.tail <= tol * smallest_row / 4

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
        degrees = np.arange(self.order + 1)
        return special.eval_legendre(degrees, t[..., None]) @ ((2 * degrees + 1) * self.coefficients)

    def eigenvalues(self, like: torch.Tensor) -> torch.Tensor:
        """:math:`\\Lambda` of :math:`\\Phi \\Lambda \\Phi^T`, in the order of :meth:`features`."""
        c = torch.as_tensor(self.coefficients, dtype=like.dtype, device=like.device)
        if self.d == 2:
            twice = torch.cat([c[:1], 2 * c[1:]])
            return torch.cat([twice, twice])  # cos k theta, sin k theta (sin 0 = 0)
        return 4 * math.pi * c[torch.as_tensor(_sphere_degrees(self.order), device=like.device)]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """:math:`\\Phi^T`, shape ``(rank, n)``, at unit vectors ``x`` (n, d)."""
        basis = self.basis(x)
        return basis.harmonics(basis.block(x))

    def basis(self, like: torch.Tensor):
        """The per-particle basis the kernel is applied in (``_harmonic_bases.py``), for tensors like ``like``:
        on :math:`S^2` through non-uniform FFTs for many particles on the CPU (:data:`FOURIER_MIN_N`)."""
        if self.d == 2:
            return _CircleBasis(self.order)
        fourier = (like.shape[0] >= FOURIER_MIN_N and self.order >= FOURIER_MIN_ORDER and like.device.type == "cpu"
                   and like.dtype == torch.float64)
        return (_SphereFourierBasis if fourier else _SphereBasis)(self.order, like)


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


def mean_row_sum(beta: float, d: int) -> float:
    r"""The least mean row sum :math:`a^T \tilde K a` of any configuration: the uniform measure's,
    :math:`\tilde I_0(\beta)` on the circle and :math:`\tilde\imath_0(\beta) = (1 - e^{-2\beta}) / (2\beta)`
    on :math:`S^2` (the other eigenvalues of the kernel are nonnegative, and only the constant harmonic has
    a moment under the uniform measure)."""
    if d == 2:
        return float(special.ive(0, beta))
    return float(-np.expm1(-2 * beta) / (2 * beta))


def likely_kernel(temperature: float, d: int, tol: float = 1e-10, min_weight: float = 1.0) -> HarmonicKernel:
    """The kernel the fields choose: truncated for row sums down to a quarter of :func:`mean_row_sum` (a
    uniform start's smallest rows are within ~30% of the mean at N = 2*10^4, clustered ones larger), with
    :func:`harmonic_kernel`'s guaranteed truncation as its ``fallback`` (where :meth:`HarmonicKernel.certifies`
    fails: a straggler far from every other particle). Measured on S^2 at beta = 32: L = 46 for 50 at
    N = 2*10^4, for 53 at 10^6 (0.85x and 0.76x the harmonics)."""
    safe = harmonic_kernel(temperature, d, tol, min_weight)
    return _cut_for(safe, tol, mean_row_sum(safe.beta, d) / 4)


def retruncated(kernel: HarmonicKernel, tol: float, smallest_row: float) -> HarmonicKernel:
    """The kernel for rows down to half ``smallest_row`` (a row ``kernel`` did not certify), with ``kernel``'s
    fallback; the fallback itself when that truncation would be no shorter."""
    return _cut_for(kernel.fallback, tol, smallest_row / 2)


def _cut_for(safe: HarmonicKernel, tol: float, floor: float) -> HarmonicKernel:
    """The truncation for rows down to ``floor``, with ``safe`` as its fallback; ``safe`` itself when that
    truncation is no shorter (a floor at or below the smallest weight) or ``floor`` is not in (0, 1] (NaN:
    a blown-up field)."""
    if not 0 < floor <= 1:
        return safe
    shorter = harmonic_kernel(1 / safe.beta, safe.d, tol, floor)
    return safe if shorter.order >= safe.order else dataclasses.replace(shorter, fallback=safe)


class _Factored:
    """:math:`\\tilde K = \\Phi \\Lambda \\Phi^T` applied block by block in the kernel's basis (its blocks kept
    when small and ``keep``: more than one application to come). Moments are in the harmonics
    (``rank`` rows, the order of :meth:`HarmonicKernel.eigenvalues`)."""

    def __init__(self, kernel: HarmonicKernel, X: torch.Tensor, keep: bool = True):
        self.kernel, self.X, n = kernel, X, X.shape[0]
        self.lam = kernel.eigenvalues(X)[:, None]
        self.basis = kernel.basis(X)
        rows = max(1, _BLOCK_BYTES // (8 * self.basis.width))
        self.blocks = [(i0, min(n, i0 + rows)) for i0 in range(0, n, rows)]
        store = keep and 8 * n * self.basis.width <= _STORE_BYTES
        self.stored = [self.basis.block(X[i0:i1]) for i0, i1 in self.blocks] if store else None
        self.buffer = None if store else X.new_empty(self.basis.width * rows)  # one block's basis, reused

    def _block(self, b, i0, i1):
        return self.stored[b] if self.stored is not None else self.basis.block(self.X[i0:i1], self.buffer)

    def harmonics(self, b, i0, i1, out=None):
        """The harmonics :math:`\\Phi^T` of block ``b`` (rows ``i0:i1``), ``(rank, i1 - i0)``, into ``out`` if given
        (else possibly the block's own memory)."""
        return self.basis.harmonics(self._block(b, i0, i1), out)

    def moments(self, Wt: torch.Tensor) -> torch.Tensor:
        """:math:`\\Phi^T W`, shape ``(rank, c)``, for ``Wt`` = :math:`W` ``(n, c)``."""
        acc = self.basis.zeros(Wt.shape[1], Wt)
        for b, (i0, i1) in enumerate(self.blocks):
            self.basis.add_moments(acc, self._block(b, i0, i1), Wt[i0:i1])
        return self.basis.to_harmonics(acc)

    def position_moments(self, w: torch.Tensor) -> torch.Tensor:
        """:math:`\\Phi^T [w, w x]`, shape ``(rank, 1 + d)``: the moments whose kernel sums are the row sums and
        the numerators of a field (on :math:`S^2` from those of ``w`` alone, one degree higher)."""
        acc = self.basis.position_zeros(w)
        for b, (i0, i1) in enumerate(self.blocks):
            self.basis.add_positions(acc, self._block(b, i0, i1), w[i0:i1], self.X[i0:i1])
        return self.basis.positions_to_harmonics(acc)

    def gram(self, rows: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """:math:`\\Phi_R^T \\mathrm{diag}(s)\\, \\Phi_R` over the feature rows ``R`` = ``rows``, for ``s >= 0``, by
        pieces of the blocks whose rows take at most a block's bytes."""
        G, root = s.new_zeros((len(rows), len(rows))), s.sqrt()
        span = min(self.blocks[0][1] - self.blocks[0][0], max(1, _BLOCK_BYTES // (8 * len(rows))))
        buffer = s.new_empty(len(rows) * span)
        for b, (i0, i1) in enumerate(self.blocks):
            block = self._block(b, i0, i1)
            for j0 in range(0, i1 - i0, span):
                j1 = min(i1 - i0, j0 + span)
                piece = block if j1 - j0 == i1 - i0 else self.basis.part(block, j0, j1)
                F = self.basis.rows(piece, rows, out=buffer[:len(rows) * (j1 - j0)].view(len(rows), -1))
                F.mul_(root[i0 + j0:i0 + j1])
                G += _mm(F, F.T)
        return G

    def sweep(self, M: torch.Tensor, step, positions: bool = False) -> torch.Tensor | None:
        """Rows ``(K W)[i0:i1] = Phi_b Lambda M`` handed to ``step(i0, i1, rows)``; the blocks ``step``
        returns (the next weights) are accumulated into the next moments (None when it returns None):
        when ``positions``, one column ``w`` whose moments are those of ``[w, w x]`` (:meth:`position_moments`)."""
        N, acc = self.basis.from_harmonics(self.lam * M), None
        for b, (i0, i1) in enumerate(self.blocks):
            block = self._block(b, i0, i1)
            W_next = step(i0, i1, self.basis.apply(block, N))
            if W_next is None:
                continue
            if positions:
                acc = self.basis.position_zeros(W_next) if acc is None else acc
                self.basis.add_positions(acc, block, W_next[:, 0], self.X[i0:i1])
            else:
                acc = self.basis.zeros(W_next.shape[1], W_next) if acc is None else acc
                self.basis.add_moments(acc, block, W_next)
        if acc is None:
            return None
        return self.basis.positions_to_harmonics(acc) if positions else self.basis.to_harmonics(acc)
