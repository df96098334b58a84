"""Drawing particles: the axes of each geometry (the plane, the circle, the sphere S^2) and
particles coloured by the cluster they end in.

The still picture of a flow (:meth:`Trajectory.plot`) and the frames of
:func:`sinkflow.animate` both draw through these helpers, so a trajectory's picture and its
animation look the same. They live beside the trajectory because a folder may not import the
folders above it (``plots`` is above ``particles``): ``Trajectory.plot`` cannot reach up into
``plots``, while ``plots`` reaches down here. matplotlib is loaded on first use only.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from sinkflow._backend import from_torch, to_torch
from sinkflow._checks import check_index, check_number
from sinkflow.particles._monitors import cluster_labels

__all__ = ["GEOMETRIES", "geometry", "positions_of", "cluster_colors", "add_axes", "shared_limits", "frame_axes",
           "draw_points", "move_points", "panels", "plot_trajectory", "MAX_PANELS", "display_name"]

#: How a flow is drawn, by (manifold, dimension): the plane, the unit circle, the sphere S^2, space.
GEOMETRIES = {("euclidean", 2): "plane", ("sphere", 2): "circle", ("sphere", 3): "sphere", ("euclidean", 3): "space"}

#: At most this many panels in one picture: an ensemble draws its first systems on a grid (3 a row).
MAX_PANELS = 6

#: Colour of a particle that ends alone (a cluster of one).
SINGLE = (0.62, 0.62, 0.62, 1.0)

#: How a picture names the built-in attentions (a label chosen by the caller is shown as given).
DISPLAY_NAMES = {"softmax": "SoftMax", "sinkhorn": "Sinkhorn", "unnormalized": "Unnormalized", "gaussian": "Gaussian",
                 "skyformer": "Skyformer", "nystromformer": "Nyströmformer"}


def display_name(attention: str) -> str:
    """The name a picture gives the attention ``attention`` (``"softmax"`` -> ``"SoftMax"``; others as they are)."""
    return DISPLAY_NAMES.get(attention, attention)


def geometry(manifold: str, d: int) -> str:
    """``"plane"``, ``"circle"``, ``"sphere"`` or ``"space"`` for a flow on ``manifold`` in dimension ``d``."""
    if (manifold, d) not in GEOMETRIES:
        raise ValueError(f"particles are drawn in dimension d = 2 or 3, got d = {d} on the {manifold}; "
                         "project them first (e.g. positions[..., :3])")
    return GEOMETRIES[manifold, d]


def positions_of(traj) -> np.ndarray:
    """A trajectory's saved positions as a float64 numpy array ``(n_saved, n, d)`` (CPU, detached)."""
    P = np.asarray(from_torch(to_torch(traj.positions, "positions"), True), dtype=float)
    if P.ndim != 3:
        raise ValueError(f"a trajectory drawn must have positions of shape (n_saved, n, d), got {P.shape}")
    return P


def cluster_colors(x, manifold: str, tol: float) -> np.ndarray:
    """RGBA ``(n, 4)``: one colour per cluster of ``x`` (:func:`cluster_labels`, largest first), grey for loners."""
    import matplotlib

    labels = cluster_labels(x, manifold=manifold, tol=tol)
    sizes = np.bincount(labels)
    palette = matplotlib.colormaps["tab10"].colors
    colors = np.array([(*palette[c % len(palette)], 1.0) for c in labels])
    colors[sizes[labels] == 1] = SINGLE
    return colors


def add_axes(fig, spec, geom: str):
    """An axes for ``geom`` at ``spec`` (a subplot spec or ``(rows, cols, index)``): 3-D for the sphere and space."""
    args = spec if isinstance(spec, tuple) else (spec,)
    return fig.add_subplot(*args, projection="3d" if geom in ("sphere", "space") else None)


def shared_limits(arrays, geom: str) -> np.ndarray:
    """``(d, 2)`` axis limits holding every position of ``arrays`` (``[-1.12, 1.12]`` on the circle and sphere)."""
    if geom in ("circle", "sphere"):
        d = 2 if geom == "circle" else 3
        return np.tile([-1.12, 1.12], (d, 1))
    pts = np.concatenate([a.reshape(-1, a.shape[-1]) for a in arrays])
    lo, hi = pts.min(0), pts.max(0)
    pad = 0.06 * np.maximum(hi - lo, 1e-12)
    return np.stack([lo - pad, hi + pad], 1)


def frame_axes(ax, geom: str, limits) -> None:
    """Limits, equal aspect, axis labels, and the unit circle or a faint sphere behind the particles."""
    names = (r"$x^{(1)}$", r"$x^{(2)}$", r"$x^{(3)}$")
    if geom in ("sphere", "space"):
        ax.set(xlim=limits[0], ylim=limits[1], zlim=limits[2])
        ax.set_box_aspect((1, 1, 1))
        ax.view_init(elev=20, azim=-60)
        ax.set_xlabel(names[0], labelpad=-12)
        ax.set_ylabel(names[1], labelpad=-12)
        ax.set_zlabel(names[2], labelpad=-12)
        ax.set(xticks=[], yticks=[], zticks=[])
        if geom == "sphere":
            u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 25), np.linspace(0, np.pi, 13))
            ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.4)
        return
    ax.set_xlim(limits[0])
    ax.set_ylim(limits[1])
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    if geom == "circle":
        t = np.linspace(0, 2 * np.pi, 200)
        ax.plot(np.cos(t), np.sin(t), color="0.8", lw=0.8, zorder=0)


def draw_points(ax, geom: str, x, colors, size: float = 14.0):
    """Scatter the particles ``x`` ``(n, d)``; move them later with :func:`move_points`."""
    if geom in ("sphere", "space"):
        return ax.scatter(x[:, 0], x[:, 1], x[:, 2], s=size, c=colors, depthshade=False, edgecolors="none")
    return ax.scatter(x[:, 0], x[:, 1], s=size, c=colors, edgecolors="none", zorder=3)


def move_points(points, geom: str, x) -> None:
    """Put the particles drawn by :func:`draw_points` at ``x`` (no new artist: cheap per frame)."""
    if geom in ("sphere", "space"):
        points._offsets3d = (x[:, 0], x[:, 1], x[:, 2])
    else:
        points.set_offsets(x[:, :2])


def panels(runs: dict, system=None, stacklevel: int = 3) -> tuple[dict, int]:
    """The flows drawn, one panel each, and the number of columns of their grid.

    A one-system flow is one panel (flows side by side); ``system`` picks that system of every
    ensemble; otherwise an ensemble shows its first systems, labelled by their index
    (``"Sinkhorn, system 2"``), at most :data:`MAX_PANELS` in all (one row per ensemble when there
    are several), with a warning when some are left out.
    """
    def named(label, index):
        return f"{label}, system {int(index[0]) if len(index) == 1 else tuple(int(i) for i in index)}"

    if system is not None:
        return {named(label, check_index(system, traj.batch_shape, "system")): traj.system(system)
                for label, traj in runs.items()}, len(runs)
    if not any(traj.batch_shape for traj in runs.values()):
        return dict(runs), len(runs)
    share = max(1, MAX_PANELS // len(runs))
    out, widths = {}, []
    for label, traj in runs.items():
        batch = traj.batch_shape
        count = math.prod(batch)
        if count > share:
            warnings.warn(f"{label!r} is an ensemble of {count} systems {batch}: drawing the first {share} "
                          f"(at most {MAX_PANELS} panels); pick one with system=i", UserWarning, stacklevel=stacklevel)
        shown = list(range(min(count, share))) if batch else [None]
        for i in shown:
            name = label if i is None else named(label, np.unravel_index(i, batch))
            out[name] = traj if i is None else traj.system(i)
        widths.append(len(shown))
    return out, max(widths) if len(runs) > 1 else min(len(out), 3)


def plot_trajectory(traj, ax=None, *, paths: bool = True, cluster_tol: float = 1e-2, system=None):
    """The still picture of :meth:`Trajectory.plot` (see there)."""
    import matplotlib.pyplot as plt

    cluster_tol = check_number(cluster_tol, "cluster_tol", positive=True)
    if system is not None:
        traj = traj.system(system)
    if traj.batch_shape:
        if ax is not None:
            raise ValueError(f"an ensemble of {math.prod(traj.batch_shape)} systems draws on a grid of its own: "
                             "pass ax=None, or pick one system with system=i")
        return _plot_grid(traj, paths, cluster_tol)
    P = positions_of(traj)
    geom = geometry(traj.manifold, P.shape[2])
    if ax is None:
        fig = plt.figure(figsize=(3.4, 3.4), layout="constrained")
        ax = add_axes(fig, (1, 1, 1), geom)
    colors = cluster_colors(P[-1], traj.manifold, cluster_tol)
    frame_axes(ax, geom, shared_limits([P], geom))
    if paths:
        for i in range(P.shape[1]):
            ax.plot(*P[:, i, :].T, color=colors[i], lw=0.6, alpha=0.45)
    draw_points(ax, geom, P[0], [SINGLE], size=5.0)
    draw_points(ax, geom, P[-1], colors)
    ax.set_title(f"{display_name(traj.attention)}, t = {float(traj.times[-1]):.3g}")
    return ax


def _plot_grid(traj, paths: bool, cluster_tol: float) -> np.ndarray:
    """The stills of an ensemble's first systems on one figure (:func:`panels`); their Axes."""
    import matplotlib.pyplot as plt

    runs, cols = panels({display_name(traj.attention): traj}, stacklevel=5)  # the caller of Trajectory.plot
    rows = -(-len(runs) // cols)
    fig = plt.figure(figsize=(3.0 * cols, 3.0 * rows), layout="constrained")
    geom = geometry(traj.manifold, np.shape(traj.positions)[-1])
    axes = []
    for i, (label, one) in enumerate(runs.items()):
        ax = plot_trajectory(one, add_axes(fig, (rows, cols, i + 1), geom), paths=paths, cluster_tol=cluster_tol)
        ax.set_title(f"{label}, t = {float(one.times[-1]):.3g}")
        axes.append(ax)
    return np.array(axes, dtype=object)
