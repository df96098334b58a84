r"""Long Range Arena tasks generated offline: ListOps and Pathfinder.

Both Long Range Arena (LRA) tasks that the Skyformer paper reports are defined by
generators, not by downloads; this module rebuilds them from their published definitions.

* :func:`listops` — nested ``MAX`` / ``MIN`` / ``MED`` / ``SM`` (sum modulo 10) expressions
  over the digits 0-9 in LRA's token format (``[MAX 2 9 [MIN 4 7 ] 0 ]``), labelled by
  their value (10 classes). Defaults: LRA's generator (depth up to 10, 2 to 10 arguments
  per operator, an operator with probability 0.25 at every node above the maximal depth,
  500 to 2,000 tokens).
* :func:`pathfinder` — images with two markers that a dashed curved path does (label 1)
  or does not (label 0) connect, among distractor paths; 32 x 32 by default as LRA's
  Pathfinder. Paths never come closer than ``min_separation`` pixels to one another, so
  connectedness is a property of the geometry, not of the dashes; every label is then
  checked by a flood fill of the undashed rendering including the marker squares, and an
  image where it disagrees (a marker touching a neighbouring path) is drawn again. The
  geometry follows the published description (curved dashed paths, end markers,
  distractors); dash sizes and path lengths are this module's defaults, not LRA's exact
  pixel statistics.

Both are deterministic by seed and vectorized or tight enough to make 10,000 examples in
seconds. ``cache=True`` stores a generated set under :func:`cache_dir` (``$SINKFLOW_CACHE``
or the platform's user cache directory) and reloads it on the next call with the same
arguments. :func:`listops_tokens` and :func:`pathfinder_tokens` turn both into token
sequences for a Transformer.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

__all__ = ["listops", "pathfinder", "listops_tokens", "pathfinder_tokens", "cache_dir", "LISTOPS_VOCAB"]

_OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
_END = "]"
#: ListOps token vocabulary: index 0 is padding, then the digits, the operators and ``]``.
LISTOPS_VOCAB: tuple[str, ...] = ("<pad>",) + tuple(str(d) for d in range(10)) + _OPERATORS + (_END,)


def cache_dir() -> Path:
    """Where generated data sets are cached: ``$SINKFLOW_CACHE`` or the user cache directory.

    Examples
    --------
    >>> from sinkflow.datasets import cache_dir
    >>> cache_dir().name in ("sinkflow", "datasets") or "SINKFLOW_CACHE" in __import__("os").environ
    True
    """
    if os.environ.get("SINKFLOW_CACHE"):
        return Path(os.environ["SINKFLOW_CACHE"]).expanduser()
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sinkflow"


def _cached(name: str, arguments: dict, make, cache: bool):
    """``make()`` -> dict of arrays, stored as ``.npz`` under the cache directory when ``cache``."""
    if not cache:
        return make()
    key = hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "datasets" / f"{name}-{key}.npz"
    if path.exists():
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    out = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npz")
    np.savez_compressed(tmp, **out)
    tmp.replace(path)
    return out


# ----------------------------------------------------------------------------------------
# ListOps

def _listops_levels(rng: np.random.Generator, n_trees: int, max_depth: int, max_args: int, operator_p: float,
                    max_length: int) -> list[dict]:
    """Draw ``n_trees`` LRA trees level by level (breadth first), all at once.

    Level ``d`` holds, for every node at depth ``d + 1``: its tree, its parent's index in
    level ``d - 1`` (children of one parent are contiguous, in argument order), whether it
    is an operator, its operator or digit and its number of arguments. A tree whose tokens
    already reach ``max_length`` stops growing and is flagged in ``levels[0]["dead"]``.
    """
    levels = []
    tree = np.arange(n_trees)
    parent = np.full(n_trees, -1)
    tokens_so_far = np.zeros(n_trees, dtype=np.int64)
    dead = np.zeros(n_trees, dtype=bool)
    for depth in range(1, max_depth + 1):
        k = len(tree)
        is_op = rng.random(k) < operator_p if depth < max_depth else np.zeros(k, dtype=bool)
        arity = np.where(is_op, rng.integers(2, max_args + 1, size=k), 0)
        symbol = np.where(is_op, rng.integers(0, 4, size=k), rng.integers(0, 10, size=k))
        # final length >= tokens of the levels so far + this level + one token per pending child
        tokens_so_far += np.bincount(tree, weights=1 + is_op + arity, minlength=n_trees).astype(np.int64)
        dead |= tokens_so_far >= max_length
        arity = np.where(dead[tree], 0, arity)
        levels.append({"tree": tree, "parent": parent, "is_op": is_op, "arity": arity, "symbol": symbol})
        if not arity.any():
            break
        parent = np.repeat(np.arange(k), arity)
        tree = tree[parent]
        tokens_so_far -= np.bincount(tree, minlength=n_trees)  # pending children were counted once already
    levels[0]["dead"] = dead
    return levels


def _group_starts(arity: np.ndarray) -> np.ndarray:
    """Index of each expanded node's first child in the next level."""
    return np.concatenate([[0], np.cumsum(arity)[:-1]])[arity > 0]


def _reduce_levels(levels: list[dict]) -> None:
    """Bottom-up: token count ``size`` and ``value`` of every node (in place)."""
    below = None
    for lv in reversed(levels):
        size = np.where(lv["is_op"], 2, 1).astype(np.int64)
        value = lv["symbol"].astype(np.int64).copy()
        if below is not None:
            size += np.bincount(below["parent"], weights=below["size"], minlength=len(size)).astype(np.int64)
            expanded = lv["arity"] > 0
            starts = _group_starts(lv["arity"])
            v, counts, op = below["value"], lv["arity"][expanded], lv["symbol"][expanded]
            ordered = np.sort(below["parent"] * 10 + v) % 10  # children values sorted within each parent
            lo, hi = ordered[starts + (counts - 1) // 2], ordered[starts + counts // 2]
            results = np.select([op == 0, op == 1, op == 2], [np.maximum.reduceat(v, starts),
                                np.minimum.reduceat(v, starts), (lo + hi) // 2], np.add.reduceat(v, starts) % 10)
            value[expanded] = results
        lv["size"], lv["value"] = size, value
        below = lv


def _kept(levels: list[dict], keep: np.ndarray) -> list[dict]:
    """The levels restricted to the trees with ``keep[tree]``, renumbered ``0 .. keep.sum() - 1``."""
    tree_index = np.cumsum(keep) - 1
    out, remap = [], None
    for lv in levels:
        sel = np.flatnonzero(keep[lv["tree"]])
        sub = {k: lv[k][sel] for k in ("tree", "parent", "is_op", "arity", "symbol", "size")}
        sub["tree"] = tree_index[sub["tree"]]
        if remap is not None:
            sub["parent"] = remap[sub["parent"]]
        remap = np.full(len(lv["tree"]), -1)
        remap[sel] = np.arange(len(sel))
        out.append(sub)
    return out


def _preorder_tokens(levels: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (:data:`LISTOPS_VOCAB`) of every tree in pre-order, and each tree's offset."""
    root_size = levels[0]["size"]
    offset = np.concatenate([[0], np.cumsum(root_size)[:-1]]).astype(np.int64)
    flat = np.zeros(int(root_size.sum()), dtype=np.int64)
    position = np.zeros(len(root_size), dtype=np.int64)
    above = None
    for lv in levels:
        if above is not None:
            first = np.repeat(_group_starts(above["arity"]), above["arity"][above["arity"] > 0])
            before = np.concatenate([[0], np.cumsum(lv["size"])[:-1]])  # tokens of earlier siblings
            position = above["position"][lv["parent"]] + 1 + before - before[first]
        lv["position"] = position
        at = offset[lv["tree"]] + position
        flat[at] = np.where(lv["is_op"], 11 + lv["symbol"], 1 + lv["symbol"])
        flat[(at + lv["size"] - 1)[lv["is_op"]]] = len(LISTOPS_VOCAB) - 1
        above = lv
    return flat, offset


def listops(n_examples: int, seed: int = 0, *, max_depth: int = 10, max_args: int = 10, min_length: int = 500,
            max_length: int = 2000, operator_p: float = 0.25, cache: bool = False) -> tuple[list[str], np.ndarray]:
    r"""ListOps expressions in LRA format and their values (the 10 class labels).

    Grammar (LRA's generator): a node at depth ``d < max_depth`` is an operator with
    probability ``operator_p`` — one of ``[MAX``, ``[MIN``, ``[MED`` (median rounded down),
    ``[SM`` (sum modulo 10) — with 2 to ``max_args`` arguments (uniform) closed by ``]``,
    and otherwise a digit 0-9; nodes at ``max_depth`` are digits. The root is at depth 1.
    Expressions are drawn until one has ``min_length < tokens < max_length`` (LRA's
    strict bounds); duplicates are kept (LRA removed them from a 96,000-example set).

    Parameters
    ----------
    n_examples : int
    seed : int
    max_depth, max_args : int
        LRA: 10 and 10.
    min_length, max_length : int
        Token-count bounds, exclusive (LRA: 500 and 2,000).
    operator_p : float
        Probability that a node above ``max_depth`` is an operator (LRA: 0.25).
    cache : bool
        Store / reload the set under :func:`cache_dir`.

    Returns
    -------
    expressions : list of str
        Tokens separated by single spaces, e.g. ``"[MAX 2 9 [MIN 4 7 ] 0 ]"``.
    labels : numpy.ndarray of int64, shape (n_examples,)

    Examples
    --------
    >>> from sinkflow.datasets import listops
    >>> x, y = listops(3, seed=1, max_depth=3, max_args=3, min_length=4, max_length=20)
    >>> x[0], int(y[0])
    ('[MED 3 5 [MAX 0 5 4 ] ]', 5)
    """
    if n_examples < 0:
        raise ValueError(f"n_examples must be non-negative, got {n_examples}")
    if max_depth < 1 or max_args < 2:
        raise ValueError(f"need max_depth >= 1 and max_args >= 2, got {max_depth}, {max_args}")
    if not 0 <= min_length < max_length - 1:
        raise ValueError(f"need 0 <= min_length < max_length - 1, got {min_length}, {max_length}")
    if not 0 < operator_p <= 1:
        raise ValueError(f"operator_p must be in (0, 1], got {operator_p}")
    arguments = dict(n=n_examples, seed=seed, max_depth=max_depth, max_args=max_args, min_length=min_length,
                     max_length=max_length, operator_p=operator_p, version=1)

    def make():
        rng = np.random.default_rng(seed)
        expressions, labels = [], []
        batch = max(256, min(65_536, 16 * n_examples))
        for _ in range(1000):
            if len(expressions) >= n_examples:
                break
            levels = _listops_levels(rng, batch, max_depth, max_args, operator_p, max_length)
            _reduce_levels(levels)
            size = levels[0]["size"]
            keep = (size > min_length) & (size < max_length) & ~levels[0]["dead"]
            keep &= np.cumsum(keep) <= n_examples - len(expressions)
            flat, offset = _preorder_tokens(_kept(levels, keep))
            for start, n_tok in zip(offset.tolist(), size[keep].tolist()):
                expressions.append(" ".join([LISTOPS_VOCAB[t] for t in flat[start:start + n_tok].tolist()]))
            labels += levels[0]["value"][keep].tolist()
        else:
            raise RuntimeError("ListOps parameters almost never give an expression within the length bounds")
        return {"expressions": np.array(expressions, dtype=str), "labels": np.array(labels, dtype=np.int64)}

    out = _cached("listops", arguments, make, cache)
    return [str(s) for s in out["expressions"]], out["labels"].astype(np.int64)


def listops_tokens(expressions, length: int | None = None) -> np.ndarray:
    """Token ids (:data:`LISTOPS_VOCAB`) of ListOps expressions, right-padded with 0.

    Examples
    --------
    >>> from sinkflow.datasets import listops_tokens
    >>> listops_tokens(["[MAX 2 9 ]", "7"])
    array([[11,  3, 10, 15],
           [ 8,  0,  0,  0]])
    """
    index = {t: i for i, t in enumerate(LISTOPS_VOCAB)}
    rows = [[index[t] for t in e.split()] for e in expressions]
    width = max((len(r) for r in rows), default=0) if length is None else int(length)
    out = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"expression {i} has {len(r)} tokens, more than length={width}")
        out[i, : len(r)] = r
    return out


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

    Keeping ``min_separation`` between path centre lines does not keep a marker square
    (side ``2 marker_radius + 1``) off a neighbouring path: about 1% of negatives came out
    with their markers pixel-connected. Those images are drawn again (same label, so the
    classes stay balanced) until the flood fill on the undashed rendering agrees.
    """
    paths, markers = _draw_geometry(rng, labels, **draw)
    for _ in range(rounds):
        connected = _markers_connected(paths, markers, draw["resolution"], dash_fraction, draw["marker_radius"])
        bad = np.flatnonzero(connected != (labels == 1))
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
