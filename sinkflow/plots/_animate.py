"""Animations of particle flows in one call: :func:`animate` and the classroom preset :func:`circle_demo`.

An animation plays inline in Jupyter (HTML and JavaScript frames, no server: matplotlib's
``to_jshtml``) and saves as GIF (Pillow) or MP4 (ffmpeg). It is drawn for a projector: by
default a panel is 640 px square (two panels: 1,280 px wide), the smallest text 20 px high
(capitals 14.6 px), with a legend of the colours and, on the circle, the number of clusters each
panel shows as time runs. Everything that stands still (axes, ticks, legend, caption, the start)
is painted once into one background; a frame restores it and draws only the particles and the
texts that change. The axes and colours are those of :meth:`sinkflow.Trajectory.plot`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.artist import Artist

import sinkflow
from sinkflow._checks import check_number
from sinkflow.plots.style import style

# sinkflow.particles (and torch) load on the first animation, not with sinkflow.plots: `sinkflow figures --list`
# imports no torch (tests/cli/test_cli.py)

__all__ = ["ParticleAnimation", "animate", "circle_demo"]

#: The normalizations whose fastest mode on the circle has a closed form (:func:`sinkflow.fastest_mode`).
_CIRCLE_KINDS = ("softmax", "unnormalized", "sinkhorn")

#: A panel's side in inches and the resolution at :func:`animate`'s defaults: 640 px a panel.
PANEL_SIZE, PANEL_DPI = 6.4, 100

#: The smallest text of a frame in points at ``size = PANEL_SIZE`` (it scales with ``size``): 20 px at 100 dpi.
_FONT = 14.4

#: Edge colour of the hollow marker of a particle's start (those that end alone are filled grey).
_START = (0.5, 0.5, 0.5, 1.0)

#: What a frame says under a circle panel's count: the rule of k* and of the merges (``k_star=True``).
#: Plain text, no mathtext: a frame draws its changing texts again (mathtext: ~80 ms a frame, plain: ~1 ms).
_RULE = ("Linear theory: near the uniform start the mode k* grows fastest, so about k* clusters form first. "
         "Later, clusters merge on a much slower, metastable time scale, so the count can fall below k*; "
         "from some starts a neighbouring mode grows about as fast.")


class ParticleAnimation:
    """An animation of particle flows: shows itself in Jupyter, saves as GIF, MP4 or a still PNG.

    Attributes
    ----------
    figure : matplotlib.figure.Figure
    animation : matplotlib.animation.FuncAnimation
        Made on first use (saving or showing the animation).
    times : numpy.ndarray
        The time of every frame.
    fps : int
    counts : dict of str to numpy.ndarray
        On the circle: the clusters each panel shows at every frame (:func:`sinkflow.count_clusters`
        of :func:`sinkflow.angular_density`, as :func:`sinkflow.clustering.particle_cluster_count`
        counts them), by panel title; empty elsewhere.
    predicted : dict of str to int
        With ``k_star=True``: :math:`k^*(\\beta)` of every panel; empty otherwise.
    """

    def __init__(self, figure, update, times, fps: int, counts=None, predicted=None):
        self.figure, self.times, self.fps = figure, times, fps
        self.counts, self.predicted = dict(counts or {}), dict(predicted or {})
        self._update, self._animation, self._html = update, None, None

    @property
    def animation(self):
        # made when first needed: a FuncAnimation that is never rendered warns when it is deleted
        if self._animation is None:
            from matplotlib.animation import FuncAnimation

            self._animation = FuncAnimation(self.figure, self._update, frames=len(self.times),
                                            interval=1000 / self.fps, blit=False)
        return self._animation

    def __len__(self) -> int:
        return len(self.times)

    def __repr__(self) -> str:
        return (f"<ParticleAnimation: {len(self)} frames, t = {self.times[0]:.3g} to {self.times[-1]:.3g}, "
                f"{len(self.figure.axes)} panel(s), {self.fps} fps>")

    def to_html(self) -> str:
        """The animation as one self-contained HTML/JavaScript player (frames embedded as PNGs of 256
        colours: ~5 MB for the 200 frames of the classroom demo at 1,280 px)."""
        import tempfile

        if self._html is None:
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "player.html"
                self.animation.save(path, writer=_html_writer(self.fps), dpi=self.figure.dpi)
                self._html = path.read_text()
        return self._html

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
        at that resolution. A GIF's frames share one palette (the colours of the first frame, every
        cluster colour among them): no colour flickers from frame to frame."""
        from matplotlib import animation as mpl_animation

        path = Path(path)
        fps = self.fps if fps is None else check_number(fps, "fps", integer=True, positive=True)
        suffix = path.suffix.lower()
        if suffix == ".gif":
            writer = _gif_writer(fps)
        elif suffix == ".mp4":
            if not mpl_animation.writers.is_available("ffmpeg"):
                raise RuntimeError("saving MP4 needs ffmpeg on the PATH (e.g. `apt install ffmpeg` or "
                                   "`conda install ffmpeg`); save as .gif instead, which needs only Pillow")
            writer = mpl_animation.FFMpegWriter(fps=fps)
        else:
            raise ValueError(f"path must end in .gif or .mp4, got {path.name!r}")
        self.animation.save(path, writer=writer, dpi=self.figure.dpi)
        return path

    def still(self, path, *, frame: int = -1) -> Path:
        """Write one frame (the last by default) as a PNG, as the animation shows it.

        Examples
        --------
        >>> import sinkflow, tempfile, pathlib
        >>> anim = sinkflow.animate(sinkflow.circle_demo(n=16, steps=10), frames=3, size=2.0)
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     anim.still(pathlib.Path(folder) / "end.png").stat().st_size > 0
        True
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        path = Path(path)
        if path.suffix.lower() != ".png":
            raise ValueError(f"path must end in .png, got {path.name!r}")
        frame = range(len(self))[check_number(frame, "frame", integer=True)]
        self._update(frame)
        FigureCanvasAgg(self.figure).print_png(path, metadata={"Software": None})
        from matplotlib.backend_bases import FigureCanvasBase

        FigureCanvasBase(self.figure)  # back to a canvas that draws nothing on its own
        return path


def animate(trajectories, *, frames: int | None = 200, fps: int = 20, cluster_tol: float = 1e-2,
            k_star: bool = False, size: float = PANEL_SIZE, dpi: int = PANEL_DPI, system=None) -> ParticleAnimation:
    r"""Animate one particle flow, or several side by side, in one call: a frame fit for a projector.

    Each particle is drawn where it is, coloured by the cluster it ends in (a legend in the
    frame says so), over a hollow ring where it started; a particle that ends alone is filled
    grey. On the circle each panel's title counts the clusters it shows as time runs; with
    ``k_star=True`` it also gives the predicted number :math:`k^*(\beta)`, and a note in the
    circle says whether the count agrees and why not (the linear phase picks the fastest-growing
    mode :math:`k^*`; later, clusters merge on a slow, metastable time scale), which a caption
    under the panels explains.

    Parameters
    ----------
    trajectories : Trajectory or mapping of str to Trajectory
        One flow, or labelled flows drawn side by side with shared limits (all on the same
        manifold, in the same dimension). The plane (``d = 2``), the circle
        (``manifold="sphere"``, ``d = 2``), the sphere :math:`S^2` and 3-D space (3-D views).
        An ensemble (:func:`sinkflow.simulate` with ``x0`` of shape ``(..., n, d)``) shows its
        first systems on a grid, three a row, titled by their index (``"Sinkhorn, system 2"``):
        at most six panels in all (one row per ensemble when there are several; a warning says
        how many were left out). One flow is titled by its attention (``"SoftMax"``), a mapping
        by its labels.
    frames : int or None
        At most this many frames, evenly spaced in time over the shortest flow (each panel
        shows its last saved state at that time); ``None``: every saved state.
    fps : int
        Frames per second of the player and of saved files.
    cluster_tol : float
        :math:`\delta` of :func:`sinkflow.particles.cluster_labels`: each particle is coloured
        by the cluster it ends in (grey: ends alone).
    k_star : bool
        Give the predicted number of clusters :math:`k^*(\beta)` (:func:`sinkflow.fastest_mode`,
        :math:`\beta = 1/\tau`) in each panel's title, beside the count. Only on the circle, for
        SoftMax, Sinkhorn and the unnormalized kernel, with :math:`Q = K = V = I` (the
        prediction's setting).
    size, dpi : float, int
        Panel side (inches) and resolution: a panel is ``size * dpi`` pixels square, 640 by
        default (two panels: 1,280 px wide). Text, markers and lines scale with ``size``, so
        ``size`` and ``dpi`` change the resolution, not the picture; the cost of a frame grows
        with the pixels.
    system : int or tuple of int, optional
        Animate only this system of each ensemble (:meth:`sinkflow.Trajectory.system`).

    Returns
    -------
    ParticleAnimation
        Plays inline in Jupyter (end a cell with it); ``.save("flow.gif")`` or ``.mp4``;
        ``.still("end.png")`` for one frame; ``.counts`` the clusters counted at every frame.

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
    >>> x0 = sinkflow.random_particles(64, 2, seed=0, manifold="sphere")
    >>> runs = {name: sinkflow.simulate(x0, kind, manifold="sphere", temperature=0.2, steps=40)
    ...         for name, kind in (("SoftMax", "softmax"), ("Sinkhorn", "sinkhorn"))}
    >>> anim = sinkflow.animate(runs, frames=5, k_star=True)
    >>> [ax.get_title() for ax in anim.figure.axes]   # as the first frame shows them
    ['SoftMax — predicted k* = 3, no cluster yet', 'Sinkhorn — predicted k* = 4, no cluster yet']
    >>> anim.predicted, anim.times.tolist(), anim.counts["Sinkhorn"].tolist()
    ({'SoftMax': 3, 'Sinkhorn': 4}, [0.0, 1.0, 2.0, 3.0, 4.0], [0, 1, 1, 3, 3])

    An ensemble of three starts, on a grid:

    >>> import numpy as np
    >>> x0 = np.stack([sinkflow.random_particles(16, 2, seed=s, manifold="sphere") for s in range(3)])
    >>> ens = sinkflow.simulate(x0, "sinkhorn", manifold="sphere", temperature=0.2, steps=20)
    >>> [ax.get_title().split(" —")[0] for ax in sinkflow.animate(ens, frames=2).figure.axes]
    ['Sinkhorn, system 0', 'Sinkhorn, system 1', 'Sinkhorn, system 2']
    """
    from sinkflow.particles._draw import geometry, move_points, panels, positions_of

    runs, columns = panels(_as_runs(trajectories), system)
    cluster_tol = check_number(cluster_tol, "cluster_tol", positive=True)
    fps = check_number(fps, "fps", integer=True, positive=True)
    frames = check_number(frames, "frames", integer=True, positive=True, allow_none=True)
    size = check_number(size, "size", positive=True)
    dpi = check_number(dpi, "dpi", positive=True)
    predicted = _predictions(runs) if k_star else {}
    positions = {label: positions_of(traj) for label, traj in runs.items()}
    first = next(iter(runs.values()))
    geom = geometry(first.manifold, next(iter(positions.values())).shape[2])
    times = _frame_times(runs, frames)
    index = {label: np.searchsorted(traj.times, times, side="right") - 1 for label, traj in runs.items()}
    counts = {label: _circle_counts(positions[label][index[label]]) for label in runs} if geom == "circle" else {}
    titles, notes = _panel_texts(runs, times, counts, predicted)
    with style():
        clock = [f"t = {t:.2f}" for t in times]
        fig, points, texts = _figure(runs, positions, geom, cluster_tol, (titles, notes, clock), (size, dpi, columns))
        texts = _freeze_background(fig, list(points.values()), texts)

    def update(k):
        for label, artist in points.items():
            move_points(artist, geom, positions[label][index[label][k]])
        for artist, text in texts:
            artist.set_text(text[k])
        return [*points.values(), *(artist for artist, _ in texts)]

    update(0)
    return ParticleAnimation(fig, update, times, fps, counts, predicted)


class _Still(Artist):
    """The painted background of a frame, drawn first: a copy of the Agg buffer put back at once
    (``restore_region``: a frame of two 640 px panels then costs a few ms, where an image artist
    resampled the 1 MB background for ~100 ms)."""

    zorder = -1e9

    def __init__(self, region, rgba):
        super().__init__()
        self.region, self.rgba = region, rgba

    def draw(self, renderer):
        if not self.get_visible():
            return
        height, width = self.rgba.shape[:2]
        if getattr(renderer, "restore_region", None) and _pixels(renderer) == (width, height):
            renderer.restore_region(self.region)
        else:  # another resolution or renderer: the picture, at its pixels, from the top-left corner
            gc = renderer.new_gc()
            renderer.draw_image(gc, 0, renderer.height - height, self.rgba[::-1])
            gc.restore()


def _pixels(renderer) -> tuple:
    return getattr(renderer, "width", None), getattr(renderer, "height", None)


class _Tile(Artist):
    """A text that changes now and then, over a part of the background nothing else moves over (a
    circle panel's title, the note in its centre): each of its texts is painted once with the
    background around it, and a frame puts the painted pixels back (``restore_region``) instead
    of drawing the glyphs again (~0.3 ms a glyph, ~60 ms a frame of two panels)."""

    zorder = -1e9 + 1  # over the background, under the particles

    def __init__(self, text, regions, size):
        super().__init__()
        self.text, self.regions, self.size = text, regions, size

    def set_text(self, value):
        self.text.set_text(value)  # the Text still says what the frame shows (get_title)

    def draw(self, renderer):
        if not self.get_visible():
            return
        region = self.regions.get(self.text.get_text())
        if region is not None and getattr(renderer, "restore_region", None) and _pixels(renderer) == self.size:
            renderer.restore_region(region)
        else:
            self.text.set_visible(True)
            self.text.draw(renderer)
            self.text.set_visible(False)


def _freeze_background(fig, moving, texts) -> list:
    """Paint all but the ``moving`` artists and the changing ``texts`` once into one background,
    restored before each frame; returns ``(artist, text of every frame)`` of the texts to set.

    A frame then draws that background, the particles and the texts that change (a tile of
    pixels for those marked so, :class:`_Tile`): no tick, label, legend or title is laid out
    again.
    """
    from matplotlib.axes import Axes
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.transforms import Bbox

    canvas = FigureCanvasAgg(fig)
    for artist in [*moving, *(text for text, _, _ in texts)]:
        artist.set_visible(False)
    canvas.draw()  # the layout engine places everything once, then is switched off
    fig.set_layout_engine(None)  # none at all: printing a frame then draws it once
    renderer = canvas.get_renderer()
    background = canvas.copy_from_bbox(fig.bbox)
    still = _Still(background, np.asarray(canvas.buffer_rgba()).copy())
    setters = []
    for text, values, tile in texts:
        if not tile:
            setters.append((text, values))
            continue
        text.set_visible(True)
        boxes = []
        for value in dict.fromkeys(values):
            text.set_text(value)
            boxes.append(text.get_window_extent(renderer))
        box = Bbox.intersection(Bbox.union(boxes).padded(3), fig.bbox)
        regions = {}
        for value in dict.fromkeys(values):
            renderer.restore_region(background)
            text.set_text(value)
            text.draw(renderer)
            regions[value] = canvas.copy_from_bbox(box)
        text.set_visible(False)
        artist = _Tile(text, regions, _pixels(renderer))
        fig.add_artist(artist)
        setters.append((artist, values))
    for artist in fig.get_children():
        if isinstance(artist, Axes):
            artist.set_axis_off()  # a 3-D axes draws its axes whatever their visibility
            for child in artist.get_children():
                child.set_visible(False)
        elif not isinstance(artist, _Tile):
            artist.set_visible(False)  # the figure's patch, legend and texts
    for artist in [*moving, *(artist for artist, _ in setters if not isinstance(artist, _Tile))]:
        artist.set_visible(True)
    fig.add_artist(still)
    FigureCanvasBase(fig)  # a canvas that draws nothing on its own: each frame is drawn once, when written
    return setters


def _frame(writer):
    """The writer's figure drawn straight into one Agg renderer kept on the writer (no canvas switch,
    no copy through a file object), turned into the palette of the first frame at once, without
    dithering: ~3 ms a frame where Pillow's median cut of every frame took ~120 ms."""
    from matplotlib.backends.backend_agg import RendererAgg
    from PIL import Image

    if getattr(writer, "_sinkflow_renderer", None) is None:
        writer._sinkflow_renderer, writer._sinkflow_palette = RendererAgg(*writer.frame_size, writer.dpi), None
    renderer = writer._sinkflow_renderer
    renderer.clear()
    writer.fig.draw(renderer)
    im = Image.frombuffer("RGBA", writer.frame_size, renderer.buffer_rgba(), "raw", "RGBA", 0, 1).convert("RGB")
    if writer._sinkflow_palette is None:
        writer._sinkflow_palette = _palette(im)
    return im.quantize(palette=writer._sinkflow_palette, dither=Image.Dither.NONE)


def _gif_writer(fps: int):
    """A :class:`matplotlib.animation.PillowWriter` whose frames share one palette (:func:`_frame`):
    a quarter of the memory, no colour flicker."""
    from matplotlib.animation import PillowWriter

    class Writer(PillowWriter):
        def grab_frame(self, **savefig_kwargs):
            self._frames.append(_frame(self))

    return Writer(fps=fps)


def _html_writer(fps: int):
    """A :class:`matplotlib.animation.HTMLWriter` whose embedded frames are PNGs of 256 colours
    (:func:`_frame`): ~25 kB a frame of two 640 px panels where a full-colour PNG took ~110 kB (the
    200 frames of the demo stayed under matplotlib's 20 MB limit of an embedded player only so)."""
    import base64
    from io import BytesIO

    from matplotlib.animation import HTMLWriter

    class Writer(HTMLWriter):
        def grab_frame(self, **savefig_kwargs):
            if not all(hasattr(self, name) for name in ("_saved_frames", "_total_bytes", "_hit_limit")):
                return super().grab_frame(**savefig_kwargs)  # a matplotlib whose writer keeps its frames otherwise
            if self._hit_limit:
                return
            buf = BytesIO()
            _frame(self).save(buf, format="png")
            data = base64.encodebytes(buf.getvalue()).decode("ascii")
            self._total_bytes += len(data)
            if self._total_bytes >= self._bytes_limit:
                return super().grab_frame(**savefig_kwargs)  # matplotlib's own warning, and the frames stop
            self._saved_frames.append(data)

    return Writer(fps=fps, embed_frames=True, default_mode="loop")


def _palette(im):
    """A palette image of at most 256 colours for ``im``: white, black, the greys of the loners and
    of the start and the cluster colours exactly, then its own most used colours (median cut)
    except those within 8 levels of an exact one: Pillow maps a colour through a cache of 4-level
    cells, which would otherwise turn white into a near-white neighbour (a grey tint)."""
    import matplotlib
    from PIL import Image

    from sinkflow.particles._draw import SINGLE

    exact = [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0), SINGLE[:3], _START[:3], *matplotlib.colormaps["tab10"].colors]
    exact = np.unique(np.round(255 * np.array(exact)).astype(int), axis=0)
    rest = np.array(im.quantize(256 - len(exact)).getpalette()[: 3 * (256 - len(exact))]).reshape(-1, 3)
    rest = rest[np.abs(rest[:, None, :] - exact[None]).max(2).min(1) > 8]
    colours = np.concatenate([exact, rest]).ravel().tolist()
    palette = Image.new("P", (1, 1))
    palette.putpalette(colours + [0] * (768 - len(colours)))
    return palette


def _as_runs(trajectories) -> dict:
    from sinkflow.particles import Trajectory
    from sinkflow.particles._draw import display_name

    if isinstance(trajectories, Trajectory):
        return {display_name(trajectories.attention): trajectories}
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


def _predictions(runs) -> dict:
    """:math:`k^*(\\beta)` of every panel (``k_star=True``): only on the circle, for the kinds it is known for."""
    predicted = {}
    for label, traj in runs.items():
        if traj.manifold != "sphere" or np.shape(traj.positions)[-1] != 2 or traj.attention not in _CIRCLE_KINDS:
            raise ValueError(f"k_star is predicted on the circle (manifold='sphere', d = 2) for {_CIRCLE_KINDS}; "
                             f"trajectories[{label!r}] is {traj.attention!r} on the {traj.manifold} "
                             f"in d = {np.shape(traj.positions)[-1]}")
        predicted[label] = sinkflow.fastest_mode(1.0 / traj.temperature, traj.attention)
    return predicted


def _circle_counts(positions) -> np.ndarray:
    """The clusters of each state ``(frames, n, 2)`` on the circle: peaks of the angular density
    (:func:`sinkflow.clustering.particle_cluster_count`'s count)."""
    from sinkflow.clustering import angular_density, count_clusters

    return np.array([count_clusters(angular_density(np.arctan2(x[:, 1], x[:, 0]))) for x in positions], dtype=int)


def _now(count: int) -> str:
    return "no cluster yet" if count == 0 else f"now {count} cluster{'s' if count > 1 else ''}"


def _panel_texts(runs, times, counts, predicted):
    """Every frame's title of each panel and, with a prediction, the note in its circle."""
    from sinkflow.clustering import formation_time

    titles, notes = {}, {}
    for label, traj in runs.items():
        head = f"{label} — predicted k* = {predicted[label]}" if label in predicted else label
        if label not in counts:
            titles[label] = [head] * len(times)
            continue
        titles[label] = [f"{head}, {_now(c)}" if label in predicted else f"{head} — {_now(c)}" for c in counts[label]]
        if label in predicted:
            formed = formation_time(1.0 / traj.temperature, np.shape(traj.positions)[-2], traj.attention)
            notes[label] = _notes(counts[label], times, predicted[label], formed)
    return titles, notes


def _notes(counts, times, k: int, formed: float) -> list[str]:
    """What each frame says of its count against :math:`k^*`: the linear phase (up to the
    formation time :math:`t_f`, :func:`sinkflow.clustering.formation_time`), the clusters forming
    (up to :math:`2 t_f`), then agreement, a merge (the count fell since), or a neighbouring mode
    that won from this start."""
    out, peak = [], 0
    for count, t in zip(counts, times, strict=True):
        if t < formed:
            out.append("linear phase:\nthe modes near k*\ngrow from the noise")
            continue
        if t < 2 * formed:
            out.append("clusters form:\nabout k* of them")
            continue
        peak = max(peak, count)
        side = "fewer" if count < k else "more"
        if count == k:
            out.append("k* clusters,\nas predicted")
        elif count < peak:
            out.append(f"{side} than k*:\nclusters merged\n(slow, metastable)")
        else:
            out.append(f"{side} than k*: a\nneighbouring mode\ngrew about as fast")
    return out


def _frame_times(runs, frames) -> np.ndarray:
    end = min(float(traj.times[-1]) for traj in runs.values())
    saved = next(iter(runs.values())).times
    saved = saved[saved <= end + 1e-12]
    if frames is None or frames >= len(saved):
        return np.asarray(saved, dtype=float)
    return saved[np.linspace(0, len(saved) - 1, frames).round().astype(int)]


def _figure(runs, positions, geom, cluster_tol, texts, layout):
    """A figure outside pyplot (no duplicate still in Jupyter): a clock at the top left, one
    panel per flow on a grid of ``columns``, particles at t = 0 over their hollow start, and a
    legend (with the rule of :math:`k^*` as caption) under the panels. ``texts`` is
    ``(titles, notes, clock)``, each frame's texts, ``layout`` is ``(size, dpi, columns)``. Returns the figure,
    the moving scatter of every panel and ``(artist, text of every frame, tile)`` of the texts
    that change (``tile``: no particle passes over it, :class:`_Tile`)."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.layout_engine import ConstrainedLayoutEngine
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.lines import Line2D

    from sinkflow.particles._draw import SINGLE, add_axes, cluster_colors, draw_points, frame_axes, shared_limits

    titles, notes, clock = texts
    size, dpi, columns = layout
    scale = size / PANEL_SIZE
    font, rows = _FONT * scale, -(-len(runs) // columns)
    line = font / 72  # inches
    caption = textwrap.wrap(_RULE, int(size * columns * 72 / (0.56 * font))) if notes else []
    legend_rows = 1 if columns > 1 else 3
    head, foot = 1.9 * line, (1.9 * legend_rows + 1.3 * len(caption) + 0.6) * line
    width = 2 * round(size * columns * dpi / 2) / dpi  # even pixels, as video codecs want
    height = 2 * np.ceil((size * 1.02 * rows + head + foot) * dpi / 2) / dpi
    rc = {"font.size": font, "axes.titlesize": 1.12 * font, "axes.labelsize": font, "xtick.labelsize": font,
          "ytick.labelsize": font, "legend.fontsize": font, "axes.titlepad": 8 * scale, "axes.linewidth": scale,
          "xtick.major.size": 5 * scale, "ytick.major.size": 5 * scale, "xtick.major.width": scale,
          "ytick.major.width": scale, "grid.linewidth": 0.8 * scale, "xtick.major.pad": 3.5 * scale,
          "ytick.major.pad": 3.5 * scale, "axes.labelpad": 4 * scale}
    with matplotlib.rc_context(rc):
        fig = Figure(figsize=(width, height), dpi=dpi)
        fig.set_layout_engine(ConstrainedLayoutEngine(rect=(0, foot / height, 1, 1 - (head + foot) / height),
                                                      h_pad=3 / 72 * scale, w_pad=3 / 72 * scale))
        limits = shared_limits(positions.values(), geom)
        points, moving, dot = {}, [], 8.5 * scale  # marker diameter, points
        for i, (label, traj) in enumerate(runs.items()):
            ax = add_axes(fig, (rows, columns, i + 1), geom)
            frame_axes(ax, geom, limits)
            if geom == "circle":
                ax.set(xticks=[-1, 0, 1], yticks=[-1, 0, 1])
                ax.lines[-1].set_linewidth(1.6 * scale)
            P = positions[label]
            _hollow(ax, geom, P[0], dot ** 2, 1.2 * scale)
            colors = cluster_colors(P[-1], traj.manifold, cluster_tol)
            points[label] = draw_points(ax, geom, P[0], colors, size=dot ** 2)
            widest = max(titles[label], key=len)  # the layout keeps room for the longest title
            title = ax.set_title(widest, y=1.0)  # y given: the title stays put when the axes are switched off
            if len(set(titles[label])) > 1:  # only on the circle: no particle goes near a title or the centre
                moving.append((title, titles[label], geom == "circle"))
            if label in notes:
                note = ax.text(0, 0, max(notes[label], key=len), ha="center", va="center", color="0.25",
                               linespacing=1.35, zorder=4)
                moving.append((note, notes[label], geom == "circle"))
        # the clock stands clear of the frame's corner (a projector or a player's controls crop the edges)
        moving.append((fig.text(1.0 * line / width, 1 - 0.5 * line / height, max(clock, key=len), ha="left",
                                va="top", fontsize=1.12 * font), clock, False))
        palette = matplotlib.colormaps["tab10"].colors
        marker = dict(ls="none", marker="o", ms=dot, mec="none")
        handles = [tuple(Line2D([], [], mfc=palette[j], **marker) for j in range(3)),
                   Line2D([], [], **{**marker, "mfc": "none", "mec": _START, "mew": 1.2 * scale}),
                   Line2D([], [], mfc=SINGLE, **marker)]
        fig.legend(handles, ["one colour: one cluster at the end", "start", "ends alone"], loc="upper center",
                   bbox_to_anchor=(0.5, foot / height), ncol=3 if columns > 1 else 1, frameon=False,
                   handlelength=3.2, handler_map={tuple: HandlerTuple(ndivide=None, pad=0.2)})
        if caption:
            fig.text(0.5, (foot - 1.9 * legend_rows * line - 0.25 * line) / height, "\n".join(caption), ha="center",
                     va="top", color="0.2", linespacing=1.3)
    return fig, points, moving


def _hollow(ax, geom, x, area, width):
    """The hollow ring of every particle's start."""
    style = dict(s=area, facecolors="none", edgecolors=[_START], linewidths=width)
    if geom in ("sphere", "space"):
        return ax.scatter(x[:, 0], x[:, 1], x[:, 2], depthshade=False, **style)
    return ax.scatter(x[:, 0], x[:, 1], zorder=2, **style)


def circle_demo(beta: float = 8.0, n: int = 64, *, steps: int = 400, h: float = 0.05, seed: int = 4) -> dict:
    r"""SoftMax beside Sinkhorn from one start on the circle: the classroom preset for :func:`animate`.

    ``n`` particles uniform on the circle move under :func:`sinkflow.simulate`
    (``manifold="sphere"``, :math:`Q = K = V = I`, temperature :math:`1/\beta`) with both
    normalizations, ``steps`` Euler steps of ``h`` (by default up to :math:`t = 20`). Near the
    uniform start the mode :math:`\cos k^*\theta` grows fastest, so about :math:`k^*(\beta)`
    clusters form (:func:`sinkflow.fastest_mode`); later, clusters merge on a much slower,
    metastable time scale. The defaults (:math:`\beta = 8`, seed 4) show both: SoftMax predicts 4
    clusters and has 4 at its formation time :math:`t_f \approx 3`
    (:func:`sinkflow.clustering.formation_time`), 3 from :math:`t \approx 14`; Sinkhorn predicts
    5 and has 5 at :math:`t_f \approx 4`, 4 from :math:`t \approx 16` (docs/classroom.md
    measures the rule over seeds).

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
