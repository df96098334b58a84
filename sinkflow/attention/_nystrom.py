r"""Kernelized (Gaussian) attention and its Nyström approximations (docs/theory/nystrom.md).

Skyformer replaces SoftMax by the Gaussian kernel of bandwidth :math:`p^{1/4}`,

.. math:: C_{ij} = \kappa(q_i, k_j) = \exp\bigl(-\|q_i - k_j\|^2 / (2\sqrt{p})\bigr),

(equivalently: queries and keys scaled by :math:`p^{-1/4}`, unit bandwidth) and outputs
:math:`C V` without normalization. :math:`C` is not symmetric, so it is *lifted* to the
PSD matrix :math:`\bar C = \kappa(X, X)` of the :math:`N = n_q + n_k` stacked points
:math:`X = [Q; K]`; :math:`C` is its top-right block. Nyström with landmark indices
:math:`J \subset \{1..N\}` gives

.. math:: \tilde{\bar C} = \bar C_{:,J}\, \bar C_{J,J}^{+}\, \bar C_{J,:}, \qquad
          \tilde C V = \kappa(Q, X_J) \bigl(\bar C_{J,J}^{+} (\kappa(X_J, K) V)\bigr),

computed in :math:`O(n m p + m^3)` time and :math:`O(n m)` memory, never forming
:math:`\tilde C`. The practical variant replaces the pseudo-inverse by a few
Newton–Schulz-type iterations on :math:`D^{-1/2}(M + \gamma I)D^{-1/2}`.

The Nyströmformer baseline (Xiong et al. 2021) applies Nyström to the three SoftMax
blocks built from segment-mean landmarks; the Gaussian landmark block is far better
conditioned than the SoftMax one (Skyformer's stability argument; see
:func:`landmark_block`).

Every function accepts numpy arrays or torch tensors batched over leading dimensions
(heads) on any device; numpy in gives numpy out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sinkflow._backend import (
    HALF_DTYPES,
    broadcast_shapes,
    check_float,
    check_number,
    exp_floor,
    from_torch,
    lift_half,
    require,
    to_torch,
)
from sinkflow._summary import Summarized, describe_array, shape_text
from sinkflow.attention._inverses import (
    _check_convergence,
    _check_gamma,
    _check_inverse,
    _check_iter,
    _check_scale,
    _check_tol,
    _core,
    _newton_schulz,
    _pinv_rtol,
)
from sinkflow.attention._kernelized import _check_pair, _check_values, _kernel, _stack
from sinkflow.attention._normalizations import softmax
from sinkflow.attention._scores import dot_scores

__all__ = ["sample_landmarks", "NystromFactors", "nystrom_factors", "nystrom_matrix", "nystrom_attention",
           "segment_means", "nystromformer_factors", "nystromformer_matrix", "nystromformer_attention",
           "landmark_block"]


# --------------------------------------------------------------------------- kernels
class _GaussianBlock(torch.autograd.Function):
    r"""The kernel block :math:`\kappa(X, Y)` with a one-pass backward.

    Forward as :func:`sinkflow.attention._kernelized._kernel` (the product :math:`XY^T`, then the
    squared distances, their scale, the exp floor and exp, in place on that one buffer). Backward
    from the block alone: with :math:`W = G \odot \kappa`,
    :math:`\partial X = (W Y - \mathrm{rowsum}(W) X)/\sqrt p` and
    :math:`\partial Y = (W^T X - \mathrm{colsum}(W) Y)/\sqrt p`: one product with the block and
    two matrix products, where autograd's chain of the seven elementwise steps saved and replayed
    as many ``n x m`` buffers. The clamps' zero gradients (distances rounded below 0, arguments
    below the exp floor) are not replayed: there the terms are below ``|x - y|`` times the
    block, i.e. rounding (or ``exp(floor)``, ~1e-38).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, y, tau):
        y = x if y is None else y  # None: the block of x with itself (one input, as torch.compile wants)
        xx, yy = (x * x).sum(-1), (y * y).sum(-1)
        s = x @ y.transpose(-1, -2)
        s = s.mul_(-2.0).add_(xx[..., :, None]).add_(yy[..., None, :]).clamp_min_(0).mul_(-0.5 / tau)
        return s.clamp_min_(exp_floor(s.dtype)).exp_()

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y, tau = inputs
        ctx.save_for_backward(x, y, output)
        ctx.tau = tau

    @staticmethod
    def backward(ctx, grad):
        x, y, block = ctx.saved_tensors
        w = grad * block
        if y is None:  # both slots are x
            return (w @ x + w.transpose(-1, -2) @ x - (w.sum(-1) + w.sum(-2))[..., None] * x) / ctx.tau, None, None
        dx = dy = None
        if ctx.needs_input_grad[0]:
            dx = ((w @ y - w.sum(-1, keepdim=True) * x) / ctx.tau).sum_to_size(x.shape)
        if ctx.needs_input_grad[1]:
            dy = ((w.transpose(-1, -2) @ x - w.sum(-2)[..., None] * y) / ctx.tau).sum_to_size(y.shape)
        return dx, dy, None


def _kernel_block(x, y, p):
    """Skyformer's Gaussian kernel block ``exp(-|x - y|^2 / (2 sqrt p))`` (torch), its backward in one pass."""
    tau = math.sqrt(p)
    if torch.is_grad_enabled() and (x.requires_grad or y.requires_grad):
        return _GaussianBlock.apply(x, None if y is x else y, tau)
    return _GaussianBlock.forward(x, y, tau)


# --------------------------------------------------------------------------- landmarks
def _as_count(m, name="landmarks") -> int:
    return check_number(m, name, integer=True, positive=True)


def sample_landmarks(n_points: int, m: int, *, replace: bool = True, generator=None, batch_shape=(), device=None):
    r"""Draw landmark indices uniformly from ``range(n_points)``.

    Parameters
    ----------
    n_points : int
        Number of candidate points :math:`N` (``n_q + n_k`` for the lifted kernel).
    m : int
        Number of landmarks, ``>= 1`` (``<= n_points`` without replacement).
    replace : bool
        With replacement (the theorem's sampling, default) or distinct indices.
    generator : int, numpy.random.Generator or torch.Generator, optional
        Source of randomness; an int is a seed. ``None`` draws fresh OS entropy.
    batch_shape : tuple
        Independent draws per batch entry (head); the result has shape ``batch_shape + (m,)``.
    device : torch.device, optional
        When given (or with a torch generator) a torch int64 tensor is returned,
        otherwise a numpy int64 array.

    Examples
    --------
    >>> import sinkflow
    >>> idx = sinkflow.sample_landmarks(10, 4, generator=0)
    >>> idx.shape, bool((idx >= 0).all() and (idx < 10).all())
    ((4,), True)
    >>> sorted(sinkflow.sample_landmarks(3, 3, replace=False, generator=1).tolist())
    [0, 1, 2]
    """
    n_points = check_number(n_points, "n_points", integer=True, positive=True)
    m = _as_count(m)
    if not replace and m > n_points:
        raise ValueError(f"cannot draw m = {m} distinct landmarks from {n_points} points; use replace=True or m <= "
                         f"{n_points}")
    batch_shape = tuple(check_number(b, "batch_shape entries", integer=True, positive=True, allow_zero=True)
                        for b in batch_shape)
    size = batch_shape + (m,)
    if isinstance(generator, torch.Generator):
        dev = generator.device
        if replace:
            idx = torch.randint(0, n_points, size, generator=generator, device=dev)
        else:
            keys = torch.rand(batch_shape + (n_points,), generator=generator, device=dev)
            idx = keys.argsort(dim=-1)[..., :m]
        return idx.to(device) if device is not None else idx
    if generator is None or isinstance(generator, (int, np.integer)):
        generator = np.random.default_rng(generator)
    if not isinstance(generator, np.random.Generator):
        raise TypeError("generator must be None, an int seed, numpy.random.Generator or torch.Generator, got "
                        f"{type(generator).__name__}")
    if replace:
        idx = generator.integers(0, n_points, size=size)
    else:
        idx = generator.permuted(np.broadcast_to(np.arange(n_points), batch_shape + (n_points,)), axis=-1)[..., :m]
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    return torch.from_numpy(idx).to(device) if device is not None else idx


def _landmark_indices(landmarks, n_points, batch_shape, device, replace, generator):
    """Indices (torch int64 on ``device``) from a count (sampled) or given indices (validated)."""
    count = landmarks.ndim == 0 if isinstance(landmarks, torch.Tensor) else np.ndim(landmarks) == 0
    if count or not isinstance(landmarks, (list, tuple, np.ndarray, torch.Tensor)):
        return sample_landmarks(n_points, landmarks, replace=replace, generator=generator,
                                batch_shape=batch_shape, device=device)
    idx = to_torch(landmarks, "landmarks").to(device)
    if idx.is_floating_point() or idx.dtype == torch.bool:
        raise TypeError(f"landmark indices must be integers, got {idx.dtype}")
    idx = idx.long()
    if idx.ndim < 1 or idx.shape[-1] < 1:
        raise ValueError(f"need at least one landmark index, got shape {tuple(idx.shape)}")
    require(((idx >= 0) & (idx < n_points)).all(), ValueError, f"landmark indices must lie in [0, {n_points})")
    if not replace and idx.shape[-1] > 1:
        s = idx.sort(dim=-1).values
        require((s[..., 1:] != s[..., :-1]).all(), ValueError, "landmark indices repeat but replace=False was asked")
    return idx


def _gather_rows(x, idx):
    """x (..., N, p), idx (..., m) -> (..., m, p) with broadcasting over batch."""
    shape = broadcast_shapes(x.shape[:-2], idx.shape[:-1])
    x = x.expand(*shape, *x.shape[-2:])
    idx = idx.expand(*shape, idx.shape[-1])
    return torch.gather(x, -2, idx[..., None].expand(*idx.shape, x.shape[-1]))


# --------------------------------------------------------------------------- inverses


# --------------------------------------------------------------------------- Skyformer Nyström
@dataclass(frozen=True, repr=False)
class NystromFactors(Summarized):
    r"""Low-rank factors :math:`\tilde C = L\, W\, R` of a Nyström approximation.

    Its ``repr`` gives the factors' shapes, the rank ``m``, the inverse and the landmarks (indices
    or segment means), never their entries.

    Attributes
    ----------
    left : array (..., n_q, m)
        :math:`L = \kappa(Q, X_J)` (or the SoftMax block :math:`F` for Nyströmformer).
    core : array (..., m, m)
        :math:`W`, the (pseudo-/approximate) inverse of the landmark block.
    right : array (..., m, n_k)
        :math:`R = \kappa(X_J, K)`.
    indices : array (..., m) or None
        Landmark indices into :math:`[Q; K]` (``None`` for segment-mean landmarks).
    inverse : str
        ``"pinv"`` or ``"iterative"``.
    """

    left: Any
    core: Any
    right: Any
    indices: Any
    inverse: str

    def matrix(self):
        """Form :math:`\\tilde C = L W R` (O(n^2 m); for analysis only)."""
        return self.left @ (self.core @ self.right)

    def apply(self, V):
        """:math:`\\tilde C V = L (W (R V))` in O(n m d_v + m^2 d_v)."""
        return self.left @ (self.core @ (self.right @ V))

    def row_sums(self):
        r"""Row sums :math:`\tilde C \mathbf 1 = L (W (R \mathbf 1))`, shape (..., n_q), in O(n m + m^2).

        Nyströmformer approximates SoftMax, whose rows sum to 1: ``abs(F.row_sums() - 1).max()`` is
        its row-sum error (zero only for the exact case). Skyformer approximates the *unnormalized*
        Gaussian kernel :math:`C`, whose rows have no fixed sum: compare with the exact
        :math:`C \mathbf 1` (``kernelized_attention(Q, K, ones)``, O(n^2 p)).

        Examples
        --------
        >>> import numpy as np, sinkflow
        >>> rng = np.random.default_rng(0)
        >>> Q, K = rng.normal(size=(2, 32, 4))
        >>> F = sinkflow.nystromformer_factors(Q, K, 8)
        >>> bool(np.allclose(F.row_sums(), F.matrix().sum(-1)))
        True
        """
        return (self.left @ (self.core @ self.right.sum(-1, keepdims=True)))[..., 0]

    def _facts(self):
        left, right = tuple(self.left.shape), tuple(self.right.shape)
        batch = f" (batch {shape_text(left[:-2])})" if len(left) > 2 else ""
        head = (f"m = {left[-1]} landmarks: factors of a {left[-2]} x {right[-1]} matrix{batch}, "
                f"{describe_array(self.left)}")
        landmarks = "segment means" if self.indices is None else f"indices {shape_text(self.indices.shape)}"
        return head, [[("left", shape_text(left)), ("core", shape_text(self.core.shape)), ("right", shape_text(right))],
                      [("inverse", self.inverse), ("landmarks", landmarks)]]


def _skyformer_torch(q, k, landmarks, inverse, n_iter, gamma, replace, generator, lift, init="official", tol=None):
    """Factors in float32 for float16 / bfloat16 inputs (torch has no half pinv; its rounding would set the cutoff)."""
    _check_inverse(inverse)
    q, k = lift_half(q, k)
    n_q, n_k, p = q.shape[-2], k.shape[-2], q.shape[-1]
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2])
    if lift:
        x = _stack(q, k)
        idx = _landmark_indices(landmarks, n_q + n_k, batch, q.device, replace, generator)
        xj = _gather_rows(x, idx)
        left, block, right = _kernel_block(q, xj, p), _kernel_block(xj, xj, p), _kernel_block(xj, k, p)
        core = _core(block, inverse, n_iter, gamma, symmetric=True, init=init, tol=tol)
    else:
        # Uniform Nyström on the unlifted (non-symmetric) kernel: columns K_J, rows Q_J.
        if n_q != n_k:
            raise ValueError(f"the unlifted Nyström needs n_q == n_k, got {n_q} and {n_k}")
        idx = _landmark_indices(landmarks, n_q, batch, q.device, replace, generator)
        qj, kj = _gather_rows(q, idx), _gather_rows(k, idx)
        left, block, right = _kernel_block(q, kj, p), _kernel_block(qj, kj, p), _kernel_block(qj, k, p)
        core = _core(block, inverse, n_iter, gamma, symmetric=False, tol=tol)
    return left, core, right, idx


def nystrom_factors(Q, K, landmarks, *, inverse: str = "pinv", n_iter: int = 6, gamma: float = 0.1,
                    replace: bool = True, generator=None, lift: bool = True, init: str = "official",
                    tol: float | None = None) -> NystromFactors:
    r"""Skyformer's lifted Nyström factors :math:`\tilde C = \kappa(Q, X_J)\, W\, \kappa(X_J, K)`.

    Parameters
    ----------
    Q : array (..., n_q, p)
    K : array (..., n_k, p)
    landmarks : int or int array (..., m)
        A count ``m`` (indices drawn uniformly over the ``N = n_q + n_k`` stacked points,
        independently per batch entry) or the indices themselves.
    inverse : {"pinv", "iterative"}
        ``W = pinv(Cbar_JJ)`` (the theorem's estimator; eigenvalues below ``sqrt(eps)`` times the
        largest are dropped, as rounding noise of the kernel entries) or Skyformer's
        :func:`iterative_inverse` of ``Cbar_JJ + gamma I``.
    n_iter, gamma : int, float
        Iterations and ridge of the iterative inverse.
    init : {"official", "norms"}
        Start of the iterative inverse (see :func:`iterative_inverse`); Skyformer's own by default.
    tol : float, optional
        Check the iterative inverse's residual against ``tol`` and warn (:class:`NystromWarning`)
        above it (see :func:`iterative_inverse`); ``None`` (default) checks nothing.
    replace : bool
        Sample with replacement (default, as in the theorem).
    generator : int, numpy.random.Generator or torch.Generator, optional
        Randomness for the landmark draw (see :func:`sample_landmarks`).
    lift : bool
        ``False`` gives the uniform Nyström on the unlifted kernel instead:
        :math:`\kappa(Q, K_J)\, \kappa(Q_J, K_J)^{+}\, \kappa(Q_J, K)` with ``J`` in ``range(n)``.

    Notes
    -----
    Bandwidth: queries and keys are scaled by :math:`p^{-1/4}` for head dimension ``p``.
    Skyformer's official code hard-codes :math:`32^{-1/4}` whatever the head dimension (its
    models use ``p = 32``); for another ``p``, multiply ``Q`` and ``K`` by
    :math:`(p / 32)^{1/4}` to reproduce it. Its iterative inverse, ridge 0.1 and row-sum
    normalization are reproduced exactly (``inverse="iterative"``, ``init="official"``).

    Returns
    -------
    NystromFactors
        torch if ``Q`` or ``K`` is (float16 / bfloat16 computed in float32, returned in their
        dtype), numpy otherwise.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> rng = np.random.default_rng(0)
    >>> Q, K = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
    >>> F = sinkflow.nystrom_factors(Q, K, np.arange(12))   # all 12 points: exact
    >>> bool(np.allclose(F.matrix(), sinkflow.kernelized_attention_matrix(Q, K)))
    True
    """
    q, k, numpy_out = _check_pair(Q, K)
    left, core, right, idx = _skyformer_torch(q, k, landmarks, inverse, _check_iter(n_iter), _check_gamma(gamma),
                                              replace, generator, lift, init, _check_tol(tol))
    left, core, right = (t.to(q.dtype) for t in (left, core, right))
    return NystromFactors(*(from_torch(t, numpy_out) for t in (left, core, right, idx)), inverse)


def nystrom_matrix(Q, K, landmarks, **kwargs):
    r"""Form :math:`\tilde C` (O(n^2 m), for analysis); keywords as :func:`nystrom_factors`.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.nystrom_matrix(np.zeros((3, 2)), np.zeros((3, 2)), 2, generator=0).round(6)
    array([[1., 1., 1.],
           [1., 1., 1.],
           [1., 1., 1.]])
    """
    dtype = next((t.dtype for t in (Q, K) if isinstance(t, torch.Tensor)), None)
    if dtype in HALF_DTYPES:  # formed in float32: half factors lose the cancellations of L W R
        return nystrom_factors(*lift_half(Q, K), landmarks, **kwargs).matrix().to(dtype)
    return nystrom_factors(Q, K, landmarks, **kwargs).matrix()


def nystrom_attention(Q, K, V, landmarks, *, inverse: str = "pinv", n_iter: int = 6, gamma: float = 0.1,
                      replace: bool = True, generator=None, lift: bool = True, init: str = "official",
                      tol: float | None = None, renormalize: bool = False):
    r"""Skyformer attention :math:`\tilde C V` in O(n m p + m^3), never forming :math:`\tilde C`.

    Parameters as in :func:`nystrom_factors`; ``V`` has shape (..., n_k, d_v).
    ``renormalize=True`` divides each output row by the row sum :math:`\tilde C \mathbf 1`
    (one more column through the same three products): the result then approximates the
    row-normalized Gaussian attention :math:`\mathrm{diag}(C\mathbf 1)^{-1} C V`, no longer
    Skyformer's unnormalized :math:`C V`. A row whose approximate sum is near zero or negative
    (possible: :math:`\tilde C` can have negative entries) is amplified or flipped.

    Returns
    -------
    array (..., n_q, d_v)
        torch if any of ``Q``, ``K``, ``V`` is (its device and dtype), numpy otherwise; memory
        O(n m) besides the inputs.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> rng = np.random.default_rng(0)
    >>> Q, K, V = rng.normal(size=(3, 64, 8)) / 2
    >>> approx = sinkflow.nystrom_attention(Q, K, V, 64, generator=0)
    >>> exact = sinkflow.kernelized_attention(Q, K, V)
    >>> bool(np.linalg.norm(approx - exact) < 0.2 * np.linalg.norm(exact))
    True
    """
    q, k, numpy_out = _check_pair(Q, K, V=V)
    v = _check_values(V, k)
    left, core, right, _ = _skyformer_torch(q, k, landmarks, inverse, _check_iter(n_iter), _check_gamma(gamma),
                                            replace, generator, lift, init, _check_tol(tol))
    v = v.to(left.dtype)
    if renormalize:
        return from_torch(_renormalized(left, core, right, v).to(q.dtype), numpy_out)
    return from_torch((left @ (core @ (right @ v))).to(q.dtype), numpy_out)


def _renormalized(left, core, right, v):
    """:math:`L W R V` with each row divided by its sum :math:`L W R 1`: the ones column rides along with ``V``."""
    ones = torch.ones(*v.shape[:-1], 1, dtype=v.dtype, device=v.device)
    both = left @ (core @ (right @ torch.cat([v, ones.expand(*v.shape[:-1], 1)], -1)))
    return both[..., :-1] / both[..., -1:]


# --------------------------------------------------------------------------- Nyströmformer
def segment_means(X, m: int):
    r"""Means of ``m`` contiguous segments of nearly equal length along axis -2.

    Segment ``s`` holds the tokens ``i`` with ``floor(i m / n) = s``.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.segment_means(np.arange(6.0)[:, None], 3).ravel()
    array([0.5, 2.5, 4.5])
    """
    numpy_out = not isinstance(X, torch.Tensor)
    x = to_torch(X, "X")
    check_float(x, "X")
    m = _as_count(m)
    n = x.shape[-2]
    if m > n:
        raise ValueError(f"cannot form {m} segment means from {n} tokens")
    seg = torch.arange(n, device=x.device) * m // n
    sums = torch.zeros(*x.shape[:-2], m, x.shape[-1], dtype=x.dtype, device=x.device).index_add_(-2, seg, x)
    starts = (torch.arange(m + 1, device=x.device) * n + m - 1) // m  # first token of each segment: ceil(s n / m)
    counts = (starts[1:] - starts[:-1]).to(x.dtype)
    return from_torch(sums / counts[:, None], numpy_out)


def _nystromformer_torch(q, k, m, inverse, n_iter, init_scale="head", tol=None):
    _check_inverse(inverse)
    _check_scale(init_scale)
    m = _as_count(m)
    tau = math.sqrt(q.shape[-1])
    if m >= min(q.shape[-2], k.shape[-2]):
        # As the official code: as many landmarks as tokens means exact SoftMax attention
        # (the segment means are the tokens; an iterative inverse would only add error).
        exact = softmax(dot_scores(q, k, temperature=tau))
        eye = torch.eye(k.shape[-2], dtype=exact.dtype, device=exact.device)
        return exact, eye, eye
    qm, km = segment_means(q, m), segment_means(k, m)
    left = softmax(dot_scores(q, km, temperature=tau))
    block = softmax(dot_scores(qm, km, temperature=tau))
    right = softmax(dot_scores(qm, k, temperature=tau))
    if inverse == "pinv":
        return left, torch.linalg.pinv(block, rtol=_pinv_rtol(block.dtype)), right
    core = _newton_schulz(block, n_iter, "norms", init_scale)
    _check_convergence(block, core, n_iter, tol, "Nyströmformer's iterative inverse")
    return left, core, right


def nystromformer_factors(Q, K, landmarks: int, *, inverse: str = "iterative", n_iter: int = 6,
                          init_scale: str = "head", tol: float | None = None) -> NystromFactors:
    r"""Nyströmformer's factors of SoftMax attention, :math:`F\, W\, B` (Xiong et al. 2021).

    :math:`\tilde Q, \tilde K` are segment means (:func:`segment_means`),
    :math:`F = \mathrm{softmax}(Q \tilde K^T/\sqrt p)`, :math:`B = \mathrm{softmax}(\tilde Q K^T/\sqrt p)`,
    :math:`W \approx \mathrm{softmax}(\tilde Q \tilde K^T/\sqrt p)^{+}` (``n_iter`` iterations
    of :func:`newton_schulz_pinv`, or the exact ``"pinv"``). With ``landmarks`` at least the
    sequence length the factors are exact SoftMax (``F = softmax(Q K^T / sqrt p)``,
    ``W = B = I``), as in the official code.

    ``init_scale``: the iterative inverse starts at :math:`Z_0 = S^T / (\|S\|_1 \|S\|_\infty)`;
    ``"head"`` (default) takes the two norms per landmark block, so each head and batch entry
    is computed as it would be alone, whatever else is in the batch; ``"batch"`` takes their
    maxima over all blocks at once, as Nyströmformer's official code does (then a head's
    result depends on the other heads and sequences of the batch: up to 0.37 relative).

    ``tol``: when given, the iterative inverse's residual :math:`\|I - A W\|_F` (``A`` the
    landmark block; one more ``m x m`` product) is checked and a :class:`NystromWarning` names
    ``n_iter`` above it (see :func:`newton_schulz_pinv`). The rows of :math:`FWB` do not sum to
    1: :meth:`NystromFactors.row_sums` gives the sums.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> rng = np.random.default_rng(0)
    >>> F = sinkflow.nystromformer_factors(rng.normal(size=(8, 4)), rng.normal(size=(8, 4)), 8, inverse="pinv")
    >>> bool(np.allclose(F.matrix().sum(-1), 1.0))  # m = n: exact SoftMax, rows sum to 1
    True
    """
    q, k, numpy_out = _check_pair(Q, K)
    left, core, right = _nystromformer_torch(q, k, landmarks, inverse, _check_iter(n_iter), init_scale,
                                             _check_tol(tol))
    return NystromFactors(*(from_torch(t, numpy_out) for t in (left, core, right)), None, inverse)


def nystromformer_matrix(Q, K, landmarks: int, **kwargs):
    """Form Nyströmformer's approximation of the SoftMax matrix (keywords as :func:`nystromformer_factors`).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.nystromformer_matrix(np.zeros((4, 2)), np.zeros((4, 2)), 2).round(6)[0]
    array([0.25, 0.25, 0.25, 0.25])
    """
    return nystromformer_factors(Q, K, landmarks, **kwargs).matrix()


def nystromformer_attention(Q, K, V, landmarks: int, *, inverse: str = "iterative", n_iter: int = 6,
                            init_scale: str = "head", tol: float | None = None, renormalize: bool = False):
    r"""Nyströmformer attention :math:`F (W (B V))` approximating :math:`\mathrm{softmax}(QK^T/\sqrt p) V`.

    Keywords as :func:`nystromformer_factors` (``init_scale="batch"``: the official code's start).
    The rows of :math:`FWB` need not sum to 1 as SoftMax's do; ``renormalize=True`` divides each
    output row by its row sum :math:`FWB\mathbf 1` (a ones column through the same three
    products: one more column of ``V``), so a constant ``V`` comes back exactly. A row sum near
    zero or negative (a poorly inverted landmark block) is then amplified or flipped: check
    :meth:`NystromFactors.row_sums` first.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> out = sinkflow.nystromformer_attention(np.zeros((4, 2)), np.zeros((4, 2)), np.ones((4, 3)), 2)
    >>> out.round(6)[0]
    array([1., 1., 1.])
    """
    q, k, numpy_out = _check_pair(Q, K, V=V)
    v = _check_values(V, k)
    left, core, right = _nystromformer_torch(q, k, landmarks, inverse, _check_iter(n_iter), init_scale,
                                             _check_tol(tol))
    if core is right:  # the exact case (landmarks >= tokens): both factors are the identity
        return from_torch(left @ v, numpy_out)
    if renormalize:
        return from_torch(_renormalized(left, core, right, v), numpy_out)
    return from_torch(left @ (core @ (right @ v)), numpy_out)


def landmark_block(Q, K, landmarks: int, kind: str = "gaussian"):
    r"""The m x m landmark block a Nyström method must invert.

    ``"gaussian"``: :math:`\kappa(\tilde X, \tilde X)` for Skyformer, :math:`\tilde X` the ``m``
    segment means of the stacked :math:`X = [Q; K]` (the lifted landmark block);
    ``"softmax"``: :math:`\mathrm{softmax}(\tilde Q \tilde K^T / \sqrt p)` for Nyströmformer,
    with ``m`` segment means each of ``Q`` and ``K``. Compare their condition numbers
    (``numpy.linalg.cond``).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> rng = np.random.default_rng(0)
    >>> Q, K = rng.normal(size=(2, 32, 4))
    >>> sinkflow.landmark_block(Q, K, 8, kind="softmax").shape
    (8, 8)
    """
    q, k, numpy_out = _check_pair(Q, K)
    m = _as_count(landmarks)
    if kind == "gaussian":
        xm = segment_means(_stack(q, k), m)
        block = _kernel(xm, xm, q.shape[-1])
    elif kind == "softmax":
        qm, km = segment_means(q, m), segment_means(k, m)
        block = softmax(dot_scores(qm, km, temperature=math.sqrt(q.shape[-1])))
    else:
        raise ValueError(f"kind must be 'gaussian' or 'softmax', got {kind!r}")
    return from_torch(block, numpy_out)
