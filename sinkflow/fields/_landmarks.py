"""Landmarks for low-rank attention fields: which particles stand for the cloud (uniform draws,
or farthest points that cover it, in the coordinates where the Gaussian kernel is isotropic),
for a flow's Nyström or segment-mean approximation.
"""

from __future__ import annotations

import math

import torch

from sinkflow._backend import lift_half, squared_norms
from sinkflow.attention._nystrom import sample_landmarks

__all__ = [
    "LANDMARK_METHODS",
    "LANDMARK_SAMPLINGS",
    "FPS_BLOCK",
    "landmark_indices",
    "farthest_point_indices",
    "gaussian_coordinates",
]


LANDMARK_METHODS = ("nystrom", "lifted", "segment_means")


LANDMARK_SAMPLINGS = ("farthest", "uniform")


#: Points per block of the farthest-point search (a block far from a new landmark is skipped).
FPS_BLOCK = 1024


def landmark_indices(n: int, landmarks: int, method: str = "nystrom", generator=0, *, sampling: str = "uniform",
                     points: torch.Tensor | None = None) -> torch.Tensor:
    """Indices (into the ``n`` particles) of the landmarks, drawn once for a whole flow.

    Parameters
    ----------
    n : int
        Number of particles.
    landmarks : int
        ``m >= 1``.
    method : {"nystrom", "lifted"}
        ``"nystrom"``: ``min(m, n)`` distinct particles (all of them when ``m >= n``).
        ``"lifted"``: ``m`` of the ``2n`` stacked points ``[x; x]``, reported modulo ``n``; all
        ``2n`` when ``m >= 2n``.
    generator : int, numpy.random.Generator or torch.Generator
        Seed of the draw (of the first point for ``"farthest"``).
    sampling : {"uniform", "farthest"}
        ``"uniform"``: random draws (distinct for ``"nystrom"``, with replacement for
        ``"lifted"``, as Skyformer's theorem). ``"farthest"``: :func:`farthest_point_indices` of
        ``points`` (``min(m, n)`` distinct particles for both methods: the stacked copies are
        the same points).
    points : torch.Tensor (n, p), optional
        Coordinates in which the kernel is isotropic (:func:`gaussian_coordinates`); needed for
        ``"farthest"``.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.particles import landmark_indices
    >>> landmark_indices(3, 10, "lifted").tolist()
    [0, 1, 2, 0, 1, 2]
    >>> x = torch.tensor([[0.0], [0.1], [0.2], [10.0]])
    >>> 3 in landmark_indices(4, 2, sampling="farthest", points=x).tolist()   # the outlier, whatever the start
    True
    """
    n, m = int(n), int(landmarks)
    if m < 1:
        raise ValueError(f"landmarks must be a positive integer, got {landmarks!r}")
    if method not in ("nystrom", "lifted"):
        raise ValueError(f"landmark method must be 'nystrom' or 'lifted', got {method!r}")
    if sampling not in LANDMARK_SAMPLINGS:
        raise ValueError(f"landmark sampling must be one of {LANDMARK_SAMPLINGS}, got {sampling!r}")
    if method == "lifted" and m >= 2 * n:
        return torch.arange(2 * n) % n
    if sampling == "farthest":
        if points is None or points.ndim != 2 or points.shape[0] != n:
            raise ValueError(f"sampling='farthest' needs points of shape (n, p) with n = {n} (the particles in the "
                             f"kernel's coordinates, gaussian_coordinates), got "
                             f"{None if points is None else tuple(points.shape)}")
        return farthest_point_indices(points, m, generator).cpu()
    if method == "nystrom":
        if m >= n:
            return torch.arange(n)
        return torch.as_tensor(sample_landmarks(n, m, replace=False, generator=generator))
    return torch.as_tensor(sample_landmarks(2 * n, m, replace=True, generator=generator)) % n


def farthest_point_indices(points: torch.Tensor, m: int, generator=0) -> torch.Tensor:
    r"""Greedy farthest-point (k-center) landmarks: each next one is the point farthest from those chosen.

    The first index is drawn uniformly (seeded by ``generator``). After ``k`` picks every point
    lies within the covering radius :math:`r_k = \max_i \min_{j \le k} |z_i - z_{J_j}|` of a
    landmark, :math:`r_k` does not increase with ``k``, the chosen points are at least
    :math:`r_k` apart (so :math:`r_k` is at most twice the best radius with ``k`` centres,
    Gonzalez 1985), and the choice for ``k`` is a prefix of the choice for ``k + 1``.
    ``O(n m p)`` time at most, ``O(n)`` memory; ``m >= n`` returns all indices. The points are
    sorted into spatially compact blocks of ``FPS_BLOCK``; a block whose bounding box is farther
    from the new landmark than its farthest point is from its nearest landmark cannot change and
    is skipped (the picks are those of the plain greedy: 1.1 s instead of 7.1 s at ``n = 10^6``,
    ``m = 256``, ``d = 2``, one thread on a loaded machine; 0.1 s at load 1).

    Parameters
    ----------
    points : torch.Tensor (n, p)
        Coordinates in which distances are measured (:func:`gaussian_coordinates` for a kernel).
    m : int
        Number of landmarks, ``>= 1``.
    generator : int, numpy.random.Generator or torch.Generator
        Seed of the first point.

    Returns
    -------
    torch.Tensor (min(m, n),) of int64 on the device of ``points``, distinct.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.particles import farthest_point_indices
    >>> z = torch.tensor([[0.0, 0.0], [0.1, 0.0], [3.0, 0.0], [0.0, 2.0]])
    >>> sorted(farthest_point_indices(z, 3, generator=0).tolist())[1:]   # both far points, from any start
    [2, 3]
    """
    if not isinstance(points, torch.Tensor) or points.ndim != 2 or not points.is_floating_point():
        raise ValueError("points must be a floating torch tensor of shape (n, p)")
    n, m = points.shape[0], int(m)
    if m < 1:
        raise ValueError(f"m must be a positive integer, got {m!r}")
    if m >= n:
        return torch.arange(n, device=points.device)
    start = int(sample_landmarks(n, 1, generator=generator)[0])
    return _farthest_points(points.detach(), m, start, FPS_BLOCK)


def _compact_order(z: torch.Tensor, block: int) -> torch.Tensor:
    """A row order whose consecutive ``block`` rows are close: strips of coordinate 0, each by coordinate 1.

    Only the blocks' compactness matters (the greedy's picks do not depend on the order), so the sort
    key is coarse: about ``sqrt(n / block)`` strips times ``_LEVELS`` levels of coordinate 1, under
    2^16 for up to 10^9 points, which torch's radix sort of integers orders in two byte passes.
    """
    n = z.shape[0]
    if n <= block:
        return torch.arange(n, device=z.device)
    lo, hi = torch.aminmax(z[:, :2], dim=0)
    scale = (hi - lo).clamp_min_(torch.finfo(z.dtype).tiny)
    key = ((z[:, -1] - lo[-1]) * (_LEVELS / scale[-1])).to(torch.int32).clamp_max_(_LEVELS - 1)
    if z.shape[1] > 1:  # about sqrt(n / block) strips of sqrt(n / block) blocks each
        strips = max(1, math.isqrt(n // block))
        strip = ((z[:, 0] - lo[0]) * (strips / scale[0])).to(torch.int32).clamp_max_(strips - 1)
        key.add_(strip, alpha=_LEVELS)
    return torch.argsort(key, stable=True)


#: Levels of coordinate 1 in the sort key of :func:`_compact_order` (a strip of ``sqrt(n block)`` points
#: spans ``_LEVELS`` of them: a block of a strip spans a few levels).
_LEVELS = 64


def _farthest_points(z: torch.Tensor, m: int, start: int, block: int) -> torch.Tensor:
    """Greedy farthest points from row ``start``; blocks whose bounding box is farther from the new
    landmark than their farthest point is from its nearest landmark cannot change and are skipped."""
    n, d = z.shape
    z = z - z.mean(0)  # |z|^2 + |c|^2 - 2 z.c below loses digits far from the origin
    order = _compact_order(z, block)
    nb = -(-n // block)
    rows = torch.cat([order, order[-1:].expand(nb * block - n)])
    # the gather of whole rows as single wide integers when a row is 8 bytes (float32, d = 2): 3x faster
    packed = d * z.element_size() == 8 and z.is_contiguous()
    Z = (torch.index_select(z.view(torch.int64).view(-1), 0, rows).view(z.dtype) if packed
         else torch.index_select(z, 0, rows)).view(nb, block, d)
    lo, hi = torch.aminmax(Z, dim=1)  # one pass (amin and amax over the middle axis: 2.4x slower)
    sq = squared_norms(Z)
    i = int((order == start).nonzero()[0, 0])  # the start's place in the order
    flat, picks = Z.view(-1, d), [i]
    nearest = _squared_distances(Z, sq, flat[i], sq.view(-1)[i])  # to the nearest landmark so far: the start
    near = nearest.view(-1)
    near[n:] = -math.inf  # padding rows: never picked
    top = nearest.amax(1)
    # index_select / index_copy_ rather than advanced indexing: the same values, 2-4x faster on few blocks
    while True:
        near[i] = -math.inf  # never chosen twice (rounding leaves ~eps at the landmarks)
        top[i // block] = nearest[i // block].max()
        if len(picks) == m:
            break
        b = int(top.argmax())
        i = b * block + int(nearest[b].argmax())
        picks.append(i)
        c = flat[i]
        gap = torch.clamp(c, lo, hi).sub_(c).square_().sum(1)  # squared distance to each box
        hit = (gap < top).nonzero().squeeze(1)
        to_c = _squared_distances(Z.index_select(0, hit), sq.index_select(0, hit), c, sq.view(-1)[i])
        closer = torch.minimum(nearest.index_select(0, hit), to_c)
        nearest.index_copy_(0, hit, closer)
        top.index_copy_(0, hit, closer.amax(1))
    return order[torch.tensor(picks, device=z.device)]


def _squared_distances(Z: torch.Tensor, sq: torch.Tensor, c: torch.Tensor, c_sq: torch.Tensor) -> torch.Tensor:
    """``|z - c|^2 = |z|^2 + |c|^2 - 2 z.c`` for blocks ``Z`` (h, block, d) of squared norms ``sq`` (h, block):
    one matrix-vector product."""
    return torch.mv(Z.view(-1, Z.shape[-1]), c).view(sq.shape).mul_(-2.0).add_(sq).add_(c_sq)


def _flow_landmarks(x, landmarks, method, W, temperature, sampling, seed):
    """The landmarks of a flow from its start ``x``: indices for the Nyström methods, else the count."""
    if method not in ("nystrom", "lifted"):
        return landmarks
    points = gaussian_coordinates(*lift_half(x.detach(), W), temperature) if sampling == "farthest" else None
    return landmark_indices(x.shape[0], landmarks, method, seed, sampling=sampling, points=points).to(x.device)


def gaussian_coordinates(x: torch.Tensor, W: torch.Tensor | None, temperature: float) -> torch.Tensor:
    r"""Points ``z`` with ``gaussian_kernel(z, z) = exp(-||x_i - x_j||_W^2 / (2 tau))``.

    :func:`sinkflow.gaussian_kernel` has bandwidth :math:`\sqrt p` in dimension ``p``, so
    :math:`z = p^{1/4} x L^T / \sqrt\tau` with :math:`L^T L = W` (``W`` symmetric positive
    semi-definite; otherwise ``ValueError``).

    Parameters
    ----------
    x : torch.Tensor (n, p)
        Points.
    W : torch.Tensor (p, p) or None
        Symmetric positive semi-definite metric (None: the identity).
    temperature : float
        :math:`\tau > 0`.

    Returns
    -------
    torch.Tensor (n, p)
        The points ``z`` in which the kernel is isotropic (the landmark search measures
        distances there).

    Examples
    --------
    >>> import torch, sinkflow
    >>> from sinkflow.particles import gaussian_coordinates
    >>> x = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> W = torch.diag(torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64))
    >>> z = gaussian_coordinates(x, W, temperature=0.5)
    >>> diff = x[:, None] - x[None]
    >>> exact = torch.exp(-((diff @ W) * diff).sum(-1) / (2 * 0.5))
    >>> bool(torch.allclose(sinkflow.gaussian_kernel(z, z), exact))
    True
    """
    d = x.shape[1]
    scale = d ** 0.25 / math.sqrt(temperature)
    if W is None:
        return x * scale
    if not torch.allclose(W, W.T, rtol=1e-6, atol=1e-12 * float(W.abs().max())):
        raise ValueError("attention with landmarks needs a symmetric W = W_Q^T W_K (the kernel must be positive "
                         "semi-definite for Nyström); symmetrize W or drop landmarks")
    lam, U = torch.linalg.eigh(0.5 * (W + W.T))
    if float(lam.min()) < -1e-10 * max(float(lam.abs().max()), 1e-300):
        raise ValueError(f"attention with landmarks needs W = W_Q^T W_K positive semi-definite (smallest eigenvalue "
                         f"{float(lam.min()):.3g}): exp(x^T W y) is then a positive kernel")
    L = lam.clamp_min(0).sqrt()[:, None] * U.T
    return (x @ L.T) * scale
