r"""Pathfinder, generated: images with two markers that a dashed curved path does (label 1) or does
not (label 0) connect, among distractor paths; every label checked by a flood fill of the
undashed rendering with the marker squares. And the images' token ids.
"""

from __future__ import annotations

import math

import numpy as np

from sinkflow.datasets._cache import _cached

__all__ = ["pathfinder", "pathfinder_tokens"]


# ----------------------------------------------------------------------------------------
# Pathfinder


def _walks(rng: np.random.Generator, n: int, resolution: int, n_dashes: int, step: float, max_turn: float,
           margin: float) -> np.ndarray:
    """``n`` random curved polylines of ``n_dashes`` segments of length ``step``, inside the image.

    Each segment turns by a uniform angle in ``[-max_turn, max_turn]`` from the previous
    one; the curve is then translated uniformly among the positions that keep it inside
    ``[margin, resolution - 1 - margin]`` (curves too large for that are redrawn).
    Returns vertices ``(n, n_dashes + 1, 2)`` in pixel coordinates (row, column).
    """
    out = np.empty((n, n_dashes + 1, 2))
    todo = np.arange(n)
    room = resolution - 1 - 2 * margin
    for _ in range(1000):
        k = len(todo)
        angle = rng.uniform(0, 2 * math.pi, size=(k, 1)) + np.cumsum(
            rng.uniform(-max_turn, max_turn, size=(k, n_dashes)), axis=1)
        steps = step * np.stack([np.sin(angle), np.cos(angle)], -1)
        v = np.concatenate([np.zeros((k, 1, 2)), np.cumsum(steps, axis=1)], 1)
        v -= v.min(axis=1, keepdims=True)
        slack = room - v.max(axis=1, keepdims=True)
        ok = (slack >= 0).all(axis=(1, 2))
        v = v + margin + rng.uniform(0, 1, size=(k, 1, 2)) * np.maximum(slack, 0)
        out[todo[ok]] = v[ok]
        todo = todo[~ok]
        if not len(todo):
            return out
    raise RuntimeError("paths do not fit in the image: lower path_length or the dash sizes")


def _samples(vertices: np.ndarray, spacing: float, fraction: float = 1.0) -> np.ndarray:
    """Points along each segment's first ``fraction`` at most ``spacing`` apart: ``(..., S, 2)``."""
    seg = vertices[..., 1:, :] - vertices[..., :-1, :]
    length = float(np.linalg.norm(seg, axis=-1).max(initial=0.0)) * fraction
    t = np.linspace(0.0, fraction, max(2, int(math.ceil(length / spacing)) + 1))
    pts = vertices[..., :-1, None, :] + t[:, None] * seg[..., None, :]
    return pts.reshape(*vertices.shape[:-2], -1, 2)


def _min_distance(a: np.ndarray, b: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """Smallest distance between the point sets ``a (n, S, 2)`` and ``b (n, T, 2)`` per row."""
    out = np.empty(len(a), dtype=np.float32)
    for i in range(0, len(a), chunk):
        ai, bi = a[i:i + chunk].astype(np.float32), b[i:i + chunk].astype(np.float32)
        dy = ai[:, :, None, 0] - bi[:, None, :, 0]
        dx = ai[:, :, None, 1] - bi[:, None, :, 1]
        dy *= dy
        dx *= dx
        dy += dx
        out[i:i + chunk] = dy.reshape(len(dy), -1).min(1)
    return np.sqrt(out)


def _place_paths(rng, n, n_paths, resolution, n_dashes, step, max_turn, separation, margin, tries=6):
    """Vertices ``(n, n_paths, n_dashes + 1, 2)`` of paths at least ``separation`` apart.

    Paths are added one at a time: ``tries`` candidates per image are drawn at once and
    the first one far enough from the paths already placed is kept; an image where none
    is is redrawn from scratch.
    """
    spacing = 0.5  # every curve point lies within spacing / 2 of a sample point: add that slack twice
    paths = np.empty((n, n_paths, n_dashes + 1, 2))
    todo = np.arange(n)
    for attempt in range(200):
        draws = min(16 * tries, tries * (1 + attempt))  # images left over are the hard ones: more draws
        placed = np.empty((len(todo), n_paths, n_dashes + 1, 2))
        alive = np.arange(len(todo))
        for p in range(n_paths):
            k = len(alive)
            if not k:
                break
            cand = _walks(rng, k * draws, resolution, n_dashes, step, max_turn, margin).reshape(
                k, draws, n_dashes + 1, 2)
            ok = np.ones((k, draws), dtype=bool)
            pts = _samples(cand, spacing)
            for q in range(p):
                fixed = _samples(placed[alive, q], spacing)  # its own sample count: segment lengths vary
                other = np.broadcast_to(fixed[:, None], (k, draws) + fixed.shape[1:])
                ok[ok] = _min_distance(pts[ok], other[ok]) >= separation + spacing
            found = ok.any(1)
            placed[alive[found], p] = cand[found, ok[found].argmax(1)]
            alive = alive[found]
        paths[todo[alive]] = placed[alive]
        todo = np.delete(todo, alive)
        if not len(todo):
            return paths
    raise RuntimeError("could not place the paths apart: fewer distractors, shorter paths or a larger image")


def _render(paths, markers, resolution, dash_fraction, marker_radius):
    """Dashed paths (each segment's first ``dash_fraction`` lit) and square markers, values in [0, 1]."""
    n = paths.shape[0]
    images = np.zeros((n, resolution, resolution), dtype=np.float32)
    pts = np.rint(_samples(paths, 0.2, dash_fraction)).astype(np.int64).reshape(n, -1, 2)
    rows = np.repeat(np.arange(n), pts.shape[1])
    images[rows, pts[..., 0].ravel(), pts[..., 1].ravel()] = 1.0
    centre = np.rint(markers).astype(np.int64)  # (n, 2, 2)
    r = marker_radius
    offsets = np.stack(np.meshgrid(np.arange(-r, r + 1), np.arange(-r, r + 1), indexing="ij"), -1).reshape(-1, 2)
    cells = np.clip(centre[:, :, None, :] + offsets, 0, resolution - 1).reshape(n, -1, 2)
    rows = np.repeat(np.arange(n), cells.shape[1])
    images[rows, cells[..., 0].ravel(), cells[..., 1].ravel()] = 1.0
    return images


def _draw_geometry(rng, labels, n_paths, resolution, path_length, step, max_turn, separation, marker_radius):
    """Paths and markers for ``labels``: both ends of path 0 (label 1) or one end of paths 0 and 1 (label 0)."""
    n = len(labels)
    paths = _place_paths(rng, n, n_paths, resolution, path_length, step, max_turn, separation,
                         margin=marker_radius + 0.5)
    first_end = rng.integers(0, 2, size=n) * path_length  # which end of path 0 is marked
    other = np.where(labels == 1, path_length - first_end, rng.integers(0, 2, size=n) * path_length)
    rows = np.arange(n)
    return paths, np.stack([paths[rows, 0, first_end], paths[rows, 1 - labels, other]], 1)


def _markers_connected(paths, markers, resolution, dash_fraction, marker_radius) -> np.ndarray:
    """Are the two markers 8-connected through lit pixels of the undashed rendering (markers included)?

    The undashed rendering is united with the dashed one, so every pixel the returned image
    lights counts as well.
    """
    from scipy import ndimage

    lit = (_render(paths, markers, resolution, 1.0, marker_radius)
           + _render(paths, markers, resolution, dash_fraction, marker_radius)) > 0
    structure = np.zeros((3, 3, 3), dtype=bool)
    structure[1] = True  # 8-neighbourhood within each image, never across images
    components, _ = ndimage.label(lit, structure=structure)
    centre = np.rint(markers).astype(np.int64)
    rows = np.arange(len(paths))
    return components[rows, centre[:, 0, 0], centre[:, 0, 1]] == components[rows, centre[:, 1, 0], centre[:, 1, 1]]


def _checked_geometry(rng, labels, dash_fraction, draw, rounds=100):
    """Draw the geometry, then redraw every image whose flood fill disagrees with its label.

    Each round flood-fills only the images drawn in the round before (an accepted image is
    never checked again), so a retry costs the rejected images, not the whole set.

    Keeping ``min_separation`` between path centre lines does not keep a marker square
    (side ``2 marker_radius + 1``) off a neighbouring path: about 1% of negatives came out
    with their markers pixel-connected. Those images are drawn again (same label, so the
    classes stay balanced) until the flood fill on the undashed rendering agrees.
    """
    paths, markers = _draw_geometry(rng, labels, **draw)
    bad = np.arange(len(labels))  # the images still to check: all at first, then only the redrawn ones
    for _ in range(rounds):
        connected = _markers_connected(paths[bad], markers[bad], draw["resolution"], dash_fraction,
                                       draw["marker_radius"])
        bad = bad[connected != (labels[bad] == 1)]
        if not len(bad):
            return paths, markers
        paths[bad], markers[bad] = _draw_geometry(rng, labels[bad], **draw)
    raise RuntimeError("could not draw images whose marker connectivity matches the labels: "
                       "fewer distractors, a smaller marker_radius or a larger min_separation")


def pathfinder(n_examples: int, seed: int = 0, *, resolution: int = 32, path_length: int = 6,
               dash_length: float = 1.5, dash_gap: float = 1.25, n_distractors: int = 1,
               max_turn: float = math.pi / 6, min_separation: float = 3.0, marker_radius: int = 1,
               cache: bool = False, return_paths: bool = False):
    r"""Pathfinder images: do the two markers lie on the two ends of one dashed path?

    Every image holds ``2 + n_distractors`` curved dashed paths of ``path_length`` dashes
    (a dash of ``dash_length`` pixels then a gap of ``dash_gap``; each dash turns by at
    most ``max_turn`` radians from the previous one), at least ``min_separation`` pixels
    apart. Label 1: the two markers sit on both ends of the first path; label 0: one marker
    at an end of the first path and one at an end of the second. Classes alternate, so a
    set is balanced to within one example. Markers are squares of side
    ``2 marker_radius + 1``; paths and markers have value 1, the background 0.

    Every label is checked by an 8-neighbour flood fill of the undashed rendering with the
    marker squares (and the dashed pixels) lit: the markers of a positive are connected, those
    of a negative are not. The path separation alone does not ensure it, since a marker square
    can reach a neighbouring path (about 1% of negatives did); an image that fails the check
    is drawn again with the same label rather than relabelled, so the classes stay balanced
    and the positives keep both markers on one path.

    Parameters
    ----------
    n_examples : int
    seed : int
    resolution : int
        Image side in pixels (LRA Pathfinder: 32).
    path_length : int
        Dashes per path.
    dash_length, dash_gap : float
        Pixels.
    n_distractors : int
        Paths besides the two that can carry markers.
    max_turn : float
        Largest turn between consecutive dashes (radians).
    min_separation : float
        Smallest distance between two paths (pixels); above :math:`2\sqrt 2` no pixel of
        one path's rendering touches (8-neighbourhood) a pixel of another's.
    marker_radius : int
    cache : bool
        Store / reload under :func:`cache_dir`.
    return_paths : bool
        Also return the geometry: a dict with ``"vertices"`` ``(n, 2 + n_distractors,
        path_length + 1, 2)`` (row, column), ``"markers"`` ``(n, 2, 2)`` and
        ``"dash_fraction"``.

    Returns
    -------
    images : numpy.ndarray of float32, shape (n_examples, resolution, resolution)
    labels : numpy.ndarray of int64, shape (n_examples,)
    geometry : dict, only with ``return_paths``

    Examples
    --------
    >>> from sinkflow.datasets import pathfinder
    >>> x, y = pathfinder(4, seed=0)
    >>> x.shape, x.dtype, y.tolist()
    ((4, 32, 32), dtype('float32'), [1, 0, 1, 0])
    """
    if n_examples < 0:
        raise ValueError(f"n_examples must be non-negative, got {n_examples}")
    if resolution < 8 or path_length < 1 or n_distractors < 0 or marker_radius < 0:
        raise ValueError("need resolution >= 8, path_length >= 1, n_distractors >= 0, marker_radius >= 0")
    if dash_length <= 0 or dash_gap < 0 or min_separation <= 0 or not 0 <= max_turn <= math.pi:
        raise ValueError("need dash_length > 0, dash_gap >= 0, min_separation > 0 and 0 <= max_turn <= pi")
    arguments = dict(n=n_examples, seed=seed, resolution=resolution, path_length=path_length,
                     dash_length=dash_length, dash_gap=dash_gap, n_distractors=n_distractors, max_turn=max_turn,
                     min_separation=min_separation, marker_radius=marker_radius, version=2)
    step = dash_length + dash_gap
    dash_fraction = dash_length / step

    def make():
        rng = np.random.default_rng(seed)
        labels = (np.arange(n_examples) % 2 == 0).astype(np.int64)
        draw = dict(n_paths=2 + n_distractors, resolution=resolution, path_length=path_length, step=step,
                    max_turn=max_turn, separation=min_separation, marker_radius=marker_radius)
        paths, markers = _checked_geometry(rng, labels, dash_fraction, draw)
        images = _render(paths, markers, resolution, dash_fraction, marker_radius)
        return {"images": images, "labels": labels, "vertices": paths, "markers": markers}

    out = _cached("pathfinder", arguments, make, cache)
    if not return_paths:
        return out["images"], out["labels"]
    geometry = {"vertices": out["vertices"], "markers": out["markers"], "dash_fraction": dash_fraction}
    return out["images"], out["labels"], geometry


def pathfinder_tokens(images: np.ndarray, levels: int = 256) -> np.ndarray:
    """Row-major pixel sequences quantized to ``levels`` intensity tokens (LRA's input format).

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.datasets import pathfinder_tokens
    >>> pathfinder_tokens(np.array([[[0.0, 1.0], [0.5, 0.2]]]))
    array([[  0, 255, 128,  51]])
    """
    x = np.asarray(images, dtype=np.float64)
    if x.size and (x.min() < 0 or x.max() > 1):
        raise ValueError("images must have values in [0, 1]")
    return np.rint(x.reshape(len(x), -1) * (levels - 1)).astype(np.int64)
