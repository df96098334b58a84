"""Animations of particle flows in one call: :func:`animate` and the classroom preset :func:`circle_demo`.

An animation plays inline in Jupyter (HTML and JavaScript frames, no server: matplotlib's
``to_jshtml``) and saves as GIF (Pillow) or MP4 (ffmpeg). Frames move the particles of one
scatter per panel (``set_offsets``) on a small figure, so 64 particles x 200 frames cost a few
seconds. The axes and colours are those of :meth:`sinkflow.Trajectory.plot`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

import sinkflow
from sinkflow._checks import check_number
from sinkflow.plots.style import style

# sinkflow.particles (and torch) load on the first animation, not with sinkflow.plots: `sinkflow figures --list`
# imports no torch (tests/cli/test_cli.py)

__all__ = ["ParticleAnimation", "animate", "circle_demo"]

#: The normalizations whose fastest mode on the circle has a closed form (:func:`sinkflow.fastest_mode`).
_CIRCLE_KINDS = ("softmax", "unnormalized", "sinkhorn")


class ParticleAnimation:
    """An animation of particle flows: shows itself in Jupyter, saves as GIF or MP4.

    Attributes
    ----------
    figure : matplotlib.figure.Figure
    animation : matplotlib.animation.FuncAnimation
    times : numpy.ndarray
        The time of every frame.
    fps : int
    """

    def __init__(self, figure, animation, times, fps: int):
        self.figure, self.animation, self.times, self.fps = figure, animation, times, fps

    def __len__(self) -> int:
        return len(self.times)

    def __repr__(self) -> str:
        return (f"<ParticleAnimation: {len(self)} frames, t = {self.times[0]:.3g} to {self.times[-1]:.3g}, "
                f"{len(self.figure.axes)} panel(s), {self.fps} fps>")

    def to_html(self) -> str:
        """The animation as one self-contained HTML/JavaScript player (frames embedded as PNG)."""
        return self.animation.to_jshtml(fps=self.fps, default_mode="loop")

    def _repr_html_(self) -> str:
        return self.to_html()

    def to_gif(self, *, fps: int | None = None) -> bytes:
        """The animation as the bytes of a looping GIF: it plays wherever an image shows, no
        JavaScript needed (``IPython.display.Image(anim.to_gif())``; the notebooks store it so)."""
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            return self.save(Path(folder) / "animation.gif", fps=fps).read_bytes()

    def save(self, path, *, fps: int | None = None) -> Path:
        """Write the animation to ``path``: ``.gif`` (Pillow) or ``.mp4`` (needs ffmpeg on the PATH).

        The frames keep the animation's ``dpi`` (:func:`animate`): its still background is painted
        at that resolution."""
        from matplotlib import animation as mpl_animation

        path = Path(path)
        fps = self.fps if fps is None else check_number(fps, "fps", integer=True, positive=True)
        suffix = path.suffix.lower()
        if suffix == ".gif":
            writer = mpl_animation.PillowWriter(fps=fps)
        elif suffix == ".mp4":
            if not mpl_animation.writers.is_available("ffmpeg"):
                raise RuntimeError("saving MP4 needs ffmpeg on the PATH (e.g. `apt install ffmpeg` or "
                                   "`conda install ffmpeg`); save as .gif instead, which needs only Pillow")
            writer = mpl_animation.FFMpegWriter(fps=fps)
        else:
            raise ValueError(f"path must end in .gif or .mp4, got {path.name!r}")
        self.animation.save(path, writer=writer, dpi=self.figure.dpi)
        return path


def animate(trajectories, *, frames: int | None = 200, fps: int = 20, cluster_tol: float = 1e-2,
            k_star: bool = False, size: float = 2.6, dpi: int = 72, system=None) -> ParticleAnimation:
    r"""Animate one particle flow, or several side by side, in one call.

    Parameters
    ----------
    trajectories : Trajectory or mapping of str to Trajectory
        One flow, or labelled flows drawn side by side with shared limits (all on the same
        manifold, in the same dimension). The plane (``d = 2``), the circle
        (``manifold="sphere"``, ``d = 2``), the sphere :math:`S^2` and 3-D space (3-D views).
        An ensemble (:func:`sinkflow.simulate` with ``x0`` of shape ``(..., n, d)``) shows its
        first systems on a grid, three a row, labelled by their index: at most six panels in
        all (one row per ensemble when there are several; a warning says how many were left out).
    frames : int or None
        At most this many frames, evenly spaced in time over the shortest flow (each panel
        shows its last saved state at that time); ``None``: every saved state.
    fps : int
        Frames per second of the player and of saved files.
    cluster_tol : float
        :math:`\delta` of :func:`sinkflow.particles.cluster_labels`: each particle is coloured
        by the cluster it ends in (grey: ends alone).
    k_star : bool
        Write the predicted number of clusters :math:`k^*(\beta)` (:func:`sinkflow.fastest_mode`,
        :math:`\beta = 1/\tau`) in each panel's title. Only on the circle, for SoftMax, Sinkhorn
        and the unnormalized kernel, with :math:`Q = K = V = I` (the prediction's setting).
    size, dpi : float, int
        Panel size (inches) and resolution: the cost of a frame grows with their product.
    system : int or tuple of int, optional
        Animate only this system of each ensemble (:meth:`sinkflow.Trajectory.system`).

    Returns
    -------
    ParticleAnimation
        Plays inline in Jupyter (end a cell with it); ``.save("flow.gif")`` or ``.mp4``.

    Raises
    ------
    TypeError
        ``trajectories`` is neither a Trajectory nor a mapping of them.
    ValueError
        An empty mapping, flows on different manifolds or dimensions, ``d`` not 2 or 3,
        ``k_star`` off the circle, ``system`` of a one-system flow or outside the batch.

    Examples
    --------
    >>> import sinkflow
    >>> x0 = sinkflow.random_particles(16, 2, seed=0, manifold="sphere")
    >>> runs = {kind: sinkflow.simulate(x0, kind, manifold="sphere", temperature=0.2, steps=20)
    ...         for kind in ("softmax", "sinkhorn")}
    >>> anim = sinkflow.animate(runs, frames=5, k_star=True)
    >>> len(anim), [ax.get_title() for ax in anim.figure.axes]
    (5, ['softmax: $k^* = 3$', 'sinkhorn: $k^* = 4$'])

    An ensemble of three starts, on a grid:

    >>> import numpy as np
    >>> x0 = np.stack([sinkflow.random_particles(16, 2, seed=s, manifold="sphere") for s in range(3)])
    >>> ens = sinkflow.simulate(x0, "sinkhorn", manifold="sphere", temperature=0.2, steps=20)
    >>> [ax.get_title() for ax in sinkflow.animate(ens, frames=2).figure.axes]
    ['sinkhorn [0]', 'sinkhorn [1]', 'sinkhorn [2]']
    """
    from sinkflow.particles._draw import geometry, move_points, panels, positions_of

    runs, columns = panels(_as_runs(trajectories), system)
    cluster_tol = check_number(cluster_tol, "cluster_tol", positive=True)
    fps = check_number(fps, "fps", integer=True, positive=True)
    frames = check_number(frames, "frames", integer=True, positive=True, allow_none=True)
    k_star = _k_star_titles(runs) if k_star else {label: label for label in runs}
    positions = {label: positions_of(traj) for label, traj in runs.items()}
    first = next(iter(runs.values()))
    geom = geometry(first.manifold, next(iter(positions.values())).shape[2])
    times = _frame_times(runs, frames)
    index = {label: np.searchsorted(traj.times, times, side="right") - 1 for label, traj in runs.items()}
    with style():
        fig, points = _figure(runs, positions, geom, k_star, cluster_tol, (size, dpi, columns))
        label_text = fig.suptitle(f"t = {times[0]:.2f}", x=0.02, ha="left", fontsize=9)
        _freeze_background(fig, [*points.values(), label_text])

    def update(k):
        for label, artist in points.items():
            move_points(artist, geom, positions[label][index[label][k]])
        label_text.set_text(f"t = {times[k]:.2f}")
        return [*points.values(), label_text]

    from matplotlib.animation import FuncAnimation

    anim = FuncAnimation(fig, update, frames=len(times), interval=1000 / fps, blit=False)
    return ParticleAnimation(fig, anim, times, fps)


def _freeze_background(fig, moving) -> None:
    """Paint all but the ``moving`` artists once into one image behind them.

    A frame then draws that image, the particles and the time label: no tick, label or
    title is laid out again (a frame of two circle panels: ~6 ms instead of ~130 ms).
    """
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    for artist in moving:
        artist.set_visible(False)
    canvas.draw()  # the layout engine places everything once, then is switched off
    fig.set_layout_engine(None)  # none at all: printing a frame then draws it once
    background = np.asarray(canvas.buffer_rgba()).copy()
    for ax in fig.axes:
        ax.set_axis_off()  # a 3-D axes draws its axes whatever their visibility
        for child in ax.get_children():
            child.set_visible(False)
    for artist in moving:
        artist.set_visible(True)
    fig.patch.set_visible(False)
    fig.figimage(background, origin="upper", zorder=-1, resample=False)
    FigureCanvasBase(fig)  # a canvas that draws nothing on its own: each frame is drawn once, when written


def _as_runs(trajectories) -> dict:
    from sinkflow.particles import Trajectory

    if isinstance(trajectories, Trajectory):
        return {trajectories.attention: trajectories}
    if not isinstance(trajectories, Mapping):
        raise TypeError(f"trajectories must be a Trajectory or a mapping of labels to Trajectory, "
                        f"got {type(trajectories).__name__}")
    if not trajectories:
        raise ValueError("trajectories is empty: give at least one Trajectory")
    runs = {str(label): traj for label, traj in trajectories.items()}
    for label, traj in runs.items():
        if not isinstance(traj, Trajectory):
            raise TypeError(f"trajectories[{label!r}] must be a Trajectory, got {type(traj).__name__}")
    shapes = {(traj.manifold, np.shape(traj.positions)[-1]) for traj in runs.values()}
    if len(shapes) > 1:
        raise ValueError(f"trajectories drawn side by side must share manifold and dimension, got {sorted(shapes)}")
    return runs


def _k_star_titles(runs) -> dict:
    titles = {}
    for label, traj in runs.items():
        if traj.manifold != "sphere" or np.shape(traj.positions)[-1] != 2 or traj.attention not in _CIRCLE_KINDS:
            raise ValueError(f"k_star is predicted on the circle (manifold='sphere', d = 2) for {_CIRCLE_KINDS}; "
                             f"trajectories[{label!r}] is {traj.attention!r} on the {traj.manifold} "
                             f"in d = {np.shape(traj.positions)[-1]}")
        titles[label] = rf"{label}: $k^* = {sinkflow.fastest_mode(1.0 / traj.temperature, traj.attention)}$"
    return titles


def _frame_times(runs, frames) -> np.ndarray:
    end = min(float(traj.times[-1]) for traj in runs.values())
    saved = next(iter(runs.values())).times
    saved = saved[saved <= end + 1e-12]
    if frames is None or frames >= len(saved):
        return np.asarray(saved, dtype=float)
    return saved[np.linspace(0, len(saved) - 1, frames).round().astype(int)]


def _figure(runs, positions, geom, titles, cluster_tol, layout):
    """A figure outside pyplot (no duplicate still in Jupyter), one panel per flow on a grid of
    ``columns``, particles at t = 0; ``layout`` is ``(size, dpi, columns)``."""
    from matplotlib.figure import Figure

    from sinkflow.particles._draw import SINGLE, add_axes, cluster_colors, draw_points, frame_axes, shared_limits

    size, dpi, columns = layout
    rows = -(-len(runs) // columns)
    fig = Figure(figsize=(size * columns, size * rows + 0.35), dpi=dpi, layout="constrained")
    limits = shared_limits(positions.values(), geom)
    points = {}
    for i, (label, traj) in enumerate(runs.items()):
        ax = add_axes(fig, (rows, columns, i + 1), geom)
        frame_axes(ax, geom, limits)
        P = positions[label]
        draw_points(ax, geom, P[0], [SINGLE], size=3.0)  # where the particles started, faint
        points[label] = draw_points(ax, geom, P[0], cluster_colors(P[-1], traj.manifold, cluster_tol))
        ax.set_title(titles[label])
    return fig, points


def circle_demo(beta: float = 8.0, n: int = 64, *, steps: int = 200, h: float = 0.05, seed: int = 4) -> dict:
    r"""SoftMax beside Sinkhorn from one start on the circle: the classroom preset for :func:`animate`.

    ``n`` particles uniform on the circle move under :func:`sinkflow.simulate`
    (``manifold="sphere"``, :math:`Q = K = V = I`, temperature :math:`1/\beta`) with both
    normalizations. Near the uniform start the mode :math:`\cos k^*\theta` grows fastest, so
    about :math:`k^*(\beta)` clusters form (:func:`sinkflow.fastest_mode`). The defaults
    (:math:`\beta = 8`, seed 4) are a start where the two visibly differ: SoftMax predicts 4
    clusters and ends the 200 steps with 4, Sinkhorn predicts 5 and keeps 5.

    Returns
    -------
    dict
        ``{"SoftMax": Trajectory, "Sinkhorn": Trajectory}``

    Examples
    --------
    >>> import sinkflow
    >>> runs = sinkflow.circle_demo(n=16, steps=10)
    >>> sorted(runs), runs["Sinkhorn"].positions.shape
    (['Sinkhorn', 'SoftMax'], (11, 16, 2))
    """
    beta = check_number(beta, "beta", positive=True)
    x0 = sinkflow.random_particles(n, 2, seed=seed, manifold="sphere")
    return {label: sinkflow.simulate(x0, kind, manifold="sphere", temperature=1.0 / beta, h=h, steps=steps)
            for label, kind in (("SoftMax", "softmax"), ("Sinkhorn", "sinkhorn"))}
