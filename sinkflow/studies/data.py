r"""Generated and package-shipped data sets for the validations (no downloads).

* :func:`digits` — scikit-learn's bundled 8x8 handwritten digits (1797 images), the
  offline stand-in for MNIST in the Sinkformers RQ1 probe.
* :func:`point_clouds` — 3D point clouds sampled on shapes (sphere, cube, torus,
  cylinder, cone, ...) with noise, random scaling and random rotations, the ModelNet40
  experiment in spirit.
* :func:`retrieval_sequences` — long token sequences where the label is carried by a
  few marked "needle" tokens (retrieval-style, for the Skyformer comparison).

Every generator is seeded and returns a :class:`Dataset` (inputs, labels, number of
classes) split into train and test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from sinkflow._optional import require

__all__ = ["Dataset", "digits", "point_clouds", "retrieval_sequences", "retrieval_vocab_size", "SHAPES", "split"]


@dataclass(frozen=True)
class Dataset:
    """A labelled data set as tensors.

    Attributes
    ----------
    inputs : torch.Tensor
        ``(N, ...)`` float inputs (images, point clouds) or ``(N, L)`` integer tokens.
    labels : torch.Tensor
        ``(N,)`` int64 class labels.
    n_classes : int
    name : str
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    n_classes: int
    name: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, index) -> Dataset:
        return Dataset(self.inputs[index], self.labels[index], self.n_classes, self.name)


def split(data: Dataset, test_fraction: float = 0.25, seed: int = 0) -> tuple[Dataset, Dataset]:
    """Seeded random split into ``(train, test)``.

    Examples
    --------
    >>> from sinkflow.studies.data import retrieval_sequences, split
    >>> train, test = split(retrieval_sequences(100, length=16), 0.2)
    >>> len(train), len(test)
    (80, 20)
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    n = len(data)
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(n))
    n_test = max(1, int(round(n * test_fraction)))
    return data.subset(perm[n_test:]), data.subset(perm[:n_test])


def digits(dtype: torch.dtype = torch.float32) -> Dataset:
    """scikit-learn's 8x8 digits as ``(1797, 1, 8, 8)`` images scaled to [0, 1].

    Examples
    --------
    >>> from sinkflow.studies.data import digits
    >>> d = digits()
    >>> tuple(d.inputs.shape), d.n_classes, float(d.inputs.max())
    ((1797, 1, 8, 8), 10, 1.0)
    """
    bunch = require("sklearn.datasets", "the digits data set (sinkflow.studies.data.digits)").load_digits()
    x = torch.as_tensor(bunch.images / 16.0, dtype=dtype)[:, None]
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    return Dataset(x, y, 10, "digits")


def _rotations(rng: np.random.Generator, n: int) -> np.ndarray:
    """Uniformly random rotations (QR of Gaussian matrices with sign fix), shape (n, 3, 3)."""
    A = rng.normal(size=(n, 3, 3))
    Q, R = np.linalg.qr(A)
    Q = Q * np.sign(np.diagonal(R, axis1=1, axis2=2))[:, None, :]
    det = np.linalg.det(Q)
    Q[det < 0, :, 0] *= -1
    return Q


def _z_rotations(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rotations about the z axis by uniform angles, shape (n, 3, 3)."""
    c, s = np.cos(t := rng.uniform(0, 2 * math.pi, size=n)), np.sin(t)
    R = np.zeros((n, 3, 3))
    R[:, 0, 0], R[:, 0, 1], R[:, 1, 0], R[:, 1, 1], R[:, 2, 2] = c, -s, s, c, 1.0
    return R


def _sphere(rng, k):
    x = rng.normal(size=(k, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _cube(rng, k):
    x = rng.uniform(-1, 1, size=(k, 3))
    face = rng.integers(0, 3, size=k)
    x[np.arange(k), face] = rng.choice([-1.0, 1.0], size=k)
    return x


def _torus(rng, k, R=1.0, r=0.4):
    u, v = rng.uniform(0, 2 * math.pi, size=(2, k))
    return np.stack([(R + r * np.cos(v)) * np.cos(u), (R + r * np.cos(v)) * np.sin(u), r * np.sin(v)], 1)


def _cylinder(rng, k):
    u = rng.uniform(0, 2 * math.pi, size=k)
    return np.stack([np.cos(u), np.sin(u), rng.uniform(-1, 1, size=k)], 1)


def _cone(rng, k):
    u = rng.uniform(0, 2 * math.pi, size=k)
    h = np.sqrt(rng.uniform(0, 1, size=k))  # uniform on the lateral surface
    return np.stack([h * np.cos(u), h * np.sin(u), 1 - 2 * h], 1)


def _octahedron(rng, k):
    x = rng.normal(size=(k, 3))
    return x / np.abs(x).sum(1, keepdims=True)


def _helix(rng, k):
    t = rng.uniform(0, 4 * math.pi, size=k)
    return np.stack([np.cos(t), np.sin(t), t / (2 * math.pi) - 1], 1)


def _plane(rng, k):
    return np.concatenate([rng.uniform(-1, 1, size=(k, 2)), np.zeros((k, 1))], 1)


def _ellipsoid(rng, k, axes=(1.0, 0.6, 0.3)):
    """A sphere stretched to semi-axes ``axes`` (points uniform in direction, not in area)."""
    return _sphere(rng, k) * np.asarray(axes)


def _pyramid(rng, k):
    """Square pyramid (base [-1, 1]^2 at z = -1, apex (0, 0, 1)), uniform in area over its five faces."""
    base, side = 4.0, math.sqrt(5.0)  # areas: the square, each triangle (base 2, slant height sqrt 5)
    face = rng.choice(5, size=k, p=np.array([base] + 4 * [side]) / (base + 4 * side))
    x = np.concatenate([rng.uniform(-1, 1, size=(k, 2)), -np.ones((k, 1))], 1)
    corners = np.array([[1, 1], [-1, 1], [-1, -1], [1, -1], [1, 1]], dtype=float)
    s, t = np.sqrt(rng.uniform(size=k)), rng.uniform(size=k)  # uniform on a triangle: apex + s (edge point - apex)
    tri = face > 0
    a, b = corners[face[tri] - 1], corners[face[tri]]
    edge = (1 - t[tri, None]) * a + t[tri, None] * b
    x[tri] = np.concatenate([s[tri, None] * edge, (1 - 2 * s[tri])[:, None]], 1)
    return x


#: Shape name -> sampler ``(rng, k) -> (k, 3)`` points on the surface (before rotation).
SHAPES = {"sphere": _sphere, "cube": _cube, "torus": _torus, "cylinder": _cylinder, "cone": _cone,
          "octahedron": _octahedron, "helix": _helix, "plane": _plane, "ellipsoid": _ellipsoid, "pyramid": _pyramid}


def point_clouds(n_per_class: int = 100, n_points: int = 64, shapes=("sphere", "cube", "torus", "cylinder", "cone"),
                 noise: float = 0.05, rotate: bool | str = True, seed: int = 0, dtype: torch.dtype = torch.float32,
                 scale: tuple[float, float] = (0.8, 1.2)) -> Dataset:
    """Point clouds on random rotations of simple shapes, ``(N, n_points, 3)``.

    Each cloud: ``n_points`` samples on the shape's surface, anisotropic scaling by a
    factor drawn uniformly in ``scale`` per axis, Gaussian noise of standard deviation ``noise``, a
    uniformly random rotation (``rotate=True``; ``"z"``: about the z axis only, the shapes stay
    upright as ModelNet40's do; ``False``: none), centred and scaled to unit RMS radius.

    Examples
    --------
    >>> from sinkflow.studies.data import point_clouds
    >>> d = point_clouds(4, 32, seed=1)
    >>> tuple(d.inputs.shape), d.n_classes
    ((20, 32, 3), 5)
    """
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise ValueError(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    if n_per_class < 1 or n_points < 1:
        raise ValueError("n_per_class and n_points must be positive")
    if not 0 < scale[0] <= scale[1]:
        raise ValueError(f"scale must be a range 0 < low <= high, got {scale}")
    rng = np.random.default_rng(seed)
    clouds, labels = [], []
    for label, name in enumerate(shapes):
        for _ in range(n_per_class):
            x = SHAPES[name](rng, n_points) * rng.uniform(*scale, size=3)
            clouds.append(x + noise * rng.normal(size=x.shape))
            labels.append(label)
    X = np.stack(clouds)
    if rotate not in (True, False, "z"):
        raise ValueError(f"rotate must be True, False or 'z', got {rotate!r}")
    if rotate:
        X = np.einsum("nij,npj->npi", (_z_rotations if rotate == "z" else _rotations)(rng, len(X)), X)
    X = X - X.mean(1, keepdims=True)
    X = X / np.sqrt((X**2).sum(-1).mean(-1))[:, None, None]
    perm = rng.permutation(len(X))
    return Dataset(torch.as_tensor(X[perm], dtype=dtype), torch.as_tensor(np.array(labels)[perm]), len(shapes),
                   "point_clouds")


def retrieval_sequences(n: int = 1000, length: int = 256, n_classes: int = 8, vocab: int = 32, n_needles: int = 2,
                        seed: int = 0) -> Dataset:
    """Long sequences whose label is carried by a few marked tokens ("needles in a haystack").

    Tokens ``0 .. vocab-1`` are distractors drawn uniformly; ``n_needles`` positions
    (distinct, uniform over the sequence) hold marked tokens ``vocab + c_k``, and the label
    is ``(c_1 + ... + c_k) mod n_classes``. A model must retrieve the needles by content
    and combine them (one needle makes the task easy; two make it a real retrieval task).
    Vocabulary size: :func:`retrieval_vocab_size`.

    Examples
    --------
    >>> from sinkflow.studies.data import retrieval_sequences
    >>> d = retrieval_sequences(10, length=64, seed=0)
    >>> tuple(d.inputs.shape), d.n_classes, bool((d.inputs >= 32).sum(1).eq(2).all())
    ((10, 64), 8, True)
    >>> bool(((d.inputs - 32).clamp_min(0).sum(1) % 8 == d.labels).all())
    True
    """
    if length < n_needles or n_needles < 1:
        raise ValueError(f"need 1 <= n_needles <= length, got n_needles={n_needles}, length={length}")
    if n_classes < 2:
        raise ValueError(f"n_classes must be at least 2, got {n_classes}")
    rng = np.random.default_rng(seed)
    X = rng.integers(0, vocab, size=(n, length))
    classes = rng.integers(0, n_classes, size=(n, n_needles))
    pos = np.argsort(rng.random((n, length)), axis=1)[:, :n_needles]
    np.put_along_axis(X, pos, vocab + classes, axis=1)
    y = classes.sum(1) % n_classes
    return Dataset(torch.as_tensor(X), torch.as_tensor(y), n_classes, "retrieval")


def retrieval_vocab_size(vocab: int = 32, n_classes: int = 8) -> int:
    """Token vocabulary size of :func:`retrieval_sequences` (``vocab + n_classes``)."""
    return vocab + n_classes
