"""Writing figures: draw, save without timestamps, and leave a figure alone when its data have not moved.

:func:`render` draws a registered figure into a folder with its reference data and manifest
rows (:mod:`sinkflow.plots._reference`); :func:`stale` says why the figure in a folder does
not show new data (empty: it does, within the figure's tolerances).
"""

from __future__ import annotations

from pathlib import Path

from sinkflow.plots._reference import (
    _file_hash,
    _update_manifest,
    compare_data,
    data_checksum,
    read_manifest,
    read_reference,
    reference_path,
    write_reference,
)
from sinkflow.plots._registry import FigureSpec, _run, config_hash, get

__all__ = ["render", "stale"]


_PNG_META = {"Software": None}


_PDF_META = {"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None}


def _save(obj, stem: Path, formats) -> list[Path]:
    import matplotlib.pyplot as plt
    from matplotlib.animation import Animation, PillowWriter

    if isinstance(obj, Animation):
        path = stem.with_suffix(".gif")
        obj.save(path, writer=PillowWriter(fps=obj._fps if hasattr(obj, "_fps") else 12))
        plt.close(obj._fig)
        return [path]
    written = save_figure(obj, [stem.with_suffix(f".{fmt}") for fmt in formats])
    plt.close(obj)
    return written


def save_figure(fig, paths) -> list[Path]:
    """Save ``fig`` to each of ``paths`` (format from the suffix) from one layout, without timestamps.

    ``savefig(bbox_inches="tight")`` draws a figure twice per file: once to lay it out and
    measure it, once to write it, each time measuring its text again (mathtext parsing is a third
    of the drawing). Here the figure is drawn once at the PNG resolution, which lays it out;
    the PNG is that drawing cut to the tight bounding box, and the other formats are one draw
    each of the layout frozen by it, so the PNG and the PDF show the same positions: the default
    figure build ran 1.36-1.49x faster than with ``bbox_inches="tight"`` (``benchmarks/bench_tricks.py``).
    A speed trick: with :func:`sinkflow.fast_paths` off, each file is matplotlib's own
    ``savefig(bbox_inches="tight")``.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure, drawn in the current rcParams (:func:`sinkflow.plots.style.style`).
    paths : iterable of str or Path
        Files to write; the suffix (``.png``, ``.pdf``, ``.svg``) names the format.

    Returns
    -------
    list of Path
    """
    import matplotlib as mpl

    paths = [Path(p) for p in paths]
    if not paths:
        return []
    from sinkflow._backend import fast_paths_enabled  # torch: not at import (sinkflow figures --list)

    if not fast_paths_enabled():
        from sinkflow.plots.style import plain_log_ticks

        plain_log_ticks(fig)
        for path in paths:
            _savefig(fig, path, "tight" if mpl.rcParams["savefig.bbox"] == "tight" else None)
        return paths
    dpi = fig.get_dpi() if mpl.rcParams["savefig.dpi"] == "figure" else mpl.rcParams["savefig.dpi"]
    image, bbox = _draw_once(fig, dpi)
    for path in paths:
        if path.suffix == ".png" and image is not None:
            _write_png(path, image, dpi)
        else:
            _savefig(fig, path, bbox)
    return paths


def _draw_once(fig, dpi: float):
    """Draw ``fig`` with Agg at ``dpi`` (the layout engine runs in that draw) and freeze its layout.

    Returns ``(image, bbox)``: the RGBA pixels of the tight (padded) bounding box ``bbox``, in
    inches, or ``image = None`` when an artist reaches outside the figure (Agg clipped it: the
    PNG is then drawn by ``savefig`` like the other formats).
    """
    import matplotlib as mpl
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import to_rgba_array

    from sinkflow.plots.style import plain_log_ticks

    rc = mpl.rcParams
    plain_log_ticks(fig)  # mathtext log tick labels: a third of a log figure's drawing
    fig.set_dpi(dpi)
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    _freeze_layout(fig)
    full = np.asarray(canvas.buffer_rgba())
    if rc["savefig.bbox"] != "tight":
        return full.copy(), None
    box = fig.get_tightbbox(canvas.get_renderer())
    bbox = box.padded(rc["savefig.pad_inches"])
    width, height = fig.get_size_inches()
    px = 1 / dpi  # an antialiased edge within a pixel of the border
    if box.x0 < -px or box.y0 < -px or box.x1 > width + px or box.y1 > height + px:
        return None, bbox
    # as savefig: the figure's pixel (0, 0) lands at -bbox.p0 * dpi; outside the figure, its face colour
    x0, y0 = round(bbox.x0 * dpi), round(bbox.y0 * dpi)
    w, h = int(bbox.width * dpi), int(bbox.height * dpi)
    image = np.empty((h, w, 4), np.uint8)
    image[:] = np.round(255 * to_rgba_array(fig.get_facecolor())[0]).astype(np.uint8)
    top = full.shape[0] - h - y0  # the row of the full image at the image's first row
    rows = slice(max(0, -top), min(h, full.shape[0] - top))
    cols = slice(max(0, -x0), min(w, full.shape[1] - x0))
    image[rows, cols] = full[rows.start + top:rows.stop + top, cols.start + x0:cols.stop + x0]
    return image, bbox


def _freeze_layout(fig) -> None:
    """Drop ``fig``'s layout engine once it has laid the figure out, so that no later file redoes it.

    ``set_layout_engine("none")`` would leave a placeholder engine, and ``savefig`` draws a figure
    that has an engine once more before writing it (a whole draw with the vector renderer, a
    third of the PDF's time); ``None`` is no engine, unless the rcParams ask for one by default.
    """
    import matplotlib as mpl

    with mpl.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
        fig.set_layout_engine(None)


def _savefig(fig, path: Path, bbox) -> None:
    """One draw of the laid-out ``fig`` into ``path`` (format from its suffix), cut to ``bbox``."""
    fmt = path.suffix[1:]
    meta = _PNG_META if fmt == "png" else _PDF_META if fmt == "pdf" else None
    fig.savefig(path, format=fmt, metadata=meta, bbox_inches=bbox)


def _write_png(path: Path, image, dpi: float) -> None:
    from matplotlib.image import imsave

    imsave(path, image, format="png", origin="upper", dpi=dpi, metadata=_PNG_META)


def render(name: str, mode: str = "quick", out: str | Path = "figures", formats=None, data: dict | None = None,
           save_data: bool = False, force: bool = False) -> list[Path]:
    """Compute (unless ``data`` is given) and write one figure; returns its paths.

    ``formats`` defaults to PNG and PDF (GIF for an animation); a format the figure cannot be
    written in is a ``ValueError``. A figure already in ``out`` that shows the same data
    within its tolerances (:func:`stale` is empty) is left untouched, files, reference data
    and manifest rows alike, so regenerating committed figures on another CPU changes no
    file; ``force=True`` redraws it all the same (after a change of the plotting code).
    Otherwise the figure is drawn, its data are stored as the reference ``out/data/NAME.npz``
    and ``out/MANIFEST.tsv`` gets its rows (figure, mode, file, config hash, data checksum,
    file hash). ``save_data=True`` also writes the data as ``NAME.npz`` beside the figure
    (:func:`flatten_data`).

    Parameters
    ----------
    name : str
        A registered figure.
    mode : {"quick", "full"}
        Which embedded configuration to use.
    out : str or Path
        Folder to write in (created if needed).
    formats : iterable of str, optional
        File formats (see :meth:`FigureSpec.writable`).
    data : dict, optional
        Data already computed for this configuration (the experiment is then not rerun).
    save_data : bool
        Also write ``NAME.npz``.
    force : bool
        Redraw even when the figure in ``out`` is current.

    Returns
    -------
    list of Path
        The figure's files (written, or left as they were), then ``NAME.npz`` if asked.

    Examples
    --------
    >>> import tempfile
    >>> from dataclasses import dataclass
    >>> from pathlib import Path
    >>> import numpy as np
    >>> from sinkflow.plots import config_hash, read_manifest, register, render, unregister
    >>> @dataclass(frozen=True)
    ... class LineConfig:
    ...     n: int = 5
    >>> def line_plot(data, cfg):
    ...     import matplotlib.pyplot as plt
    ...     fig, ax = plt.subplots()
    ...     ax.plot(data["y"])
    ...     return fig
    >>> _ = register("demo_line", compute=lambda cfg: {"y": np.arange(cfg.n)}, plot=line_plot,
    ...              quick=LineConfig(), default=False)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     paths = render("demo_line", out=tmp, formats=("png",))
    ...     rows = read_manifest(tmp)
    ...     print([p.name for p in paths], Path(tmp, "demo_line.png").stat().st_size > 0)
    ['demo_line.png'] True
    >>> rows["demo_line.png"]["config_hash"] == config_hash("demo_line", LineConfig())
    True
    >>> _ = unregister("demo_line")   # leave the registry as this example found it
    """
    spec = get(name)
    formats = spec.writable(formats)
    cfg = spec.config(mode)
    if data is None:
        data = _run(spec, cfg, mode)
    out = Path(out)
    current = None if force else _current_files(spec, mode, out, data, formats)
    written = current if current is not None else _write(spec, mode, out, data, formats)
    if save_data:  # not in the manifest: the reference data of the figure's rows cover it
        write_reference(out / f"{name}.npz", data)
        written = [*written, out / f"{name}.npz"]
    return written


def _write(spec: FigureSpec, mode: str, out: Path, data: dict, formats) -> list[Path]:
    """Draw and save the figure, its reference data and its manifest rows."""
    from sinkflow.plots.style import style

    cfg = spec.config(mode)
    out.mkdir(parents=True, exist_ok=True)
    with style():
        result = spec.plot(data, cfg)
        items = result.items() if isinstance(result, dict) else [("", result)]
        written = []
        for suffix, obj in items:
            stem = out / (f"{spec.name}_{suffix}" if suffix else spec.name)
            written += _save(obj, stem, formats)
    write_reference(reference_path(out, spec.name), data)
    _update_manifest(out, spec.name, mode, written, config_hash(spec.name, cfg), data_checksum(data))
    return written


def stale(name: str, data: dict, mode: str = "quick", out: str | Path = "figures", formats=None) -> list[str]:
    """Why the figure ``name`` in ``out`` does not show ``data`` (empty: it does, leave it alone).

    The committed files show ``data`` when the manifest has rows of the same mode and config
    hash for every requested format, the files are intact (their SHA-256), the reference data
    ``out/data/NAME.npz`` are those the rows name, and ``data`` agree with them within the
    figure's tolerances (:func:`compare_data`): numbers that moved at rounding level on
    another CPU leave the figure untouched.

    Parameters
    ----------
    name : str
        A registered figure.
    data : dict
        Its freshly computed data.
    mode : {"quick", "full"}
    out : str or Path
        The folder of the committed figure.
    formats : iterable of str, optional
        The formats that must be there (see :meth:`FigureSpec.writable`).

    Returns
    -------
    list of str
        The reasons, one per line; the differing arrays are named with their worst element.

    Examples
    --------
    >>> import tempfile
    >>> from dataclasses import dataclass
    >>> import numpy as np
    >>> from sinkflow.plots import register, render, stale, unregister
    >>> @dataclass(frozen=True)
    ... class Cfg:
    ...     n: int = 4
    >>> def plot(data, cfg):
    ...     import matplotlib.pyplot as plt
    ...     return plt.figure()
    >>> _ = register("demo_stale", compute=lambda cfg: {"y": np.linspace(0, 1, cfg.n)}, plot=plot,
    ...              quick=Cfg(), default=False)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = render("demo_stale", out=tmp, formats=("png",))
    ...     near = stale("demo_stale", {"y": np.linspace(0, 1, 4) + 1e-16}, out=tmp, formats=("png",))
    ...     far = stale("demo_stale", {"y": np.linspace(0, 1, 4) + 1e-3}, out=tmp, formats=("png",))
    ...     print(near, far[0].startswith("data: y:"))
    [] True
    >>> _ = unregister("demo_stale")   # leave the registry as this example found it
    """
    spec = get(name)
    return _staleness(spec, mode, Path(out), data, spec.writable(formats))[0]


def _staleness(spec: FigureSpec, mode: str, out: Path, data: dict, formats) -> tuple[list[str], list[Path]]:
    """``(reasons, files)``: why the figure in ``out`` is not current, and its files of ``formats``."""
    chash = config_hash(spec.name, spec.config(mode))
    rows = [r for r in read_manifest(out).values() if r["figure"] == spec.name]
    rows = [r for r in rows if r["mode"] == mode and r["config_hash"] == chash]
    files = [out / r["file"] for r in rows if Path(r["file"]).suffix[1:] in formats]
    if not rows or not set(formats) <= {Path(r["file"]).suffix[1:] for r in rows}:
        return [f"no {mode} manifest row with config hash {chash} for every format of {', '.join(formats)}"], files
    broken = [r["file"] for r in rows
              if not (out / r["file"]).is_file() or _file_hash(out / r["file"]) != r["file_sha256"]]
    if broken:
        return [f"missing or changed file(s): {', '.join(broken)}"], files
    reference = read_reference(reference_path(out, spec.name))
    if not reference or any(r["data_checksum"] != data_checksum(reference) for r in rows):
        return [f"no reference data {reference_path(out, spec.name)} matching the manifest"], files
    return [f"data: {line}" for line in compare_data(data, reference, dict(spec.tolerances))], files


def _current_files(spec: FigureSpec, mode: str, out: Path, data: dict, formats) -> list[Path] | None:
    """The committed files when they show ``data`` (within tolerance), else None."""
    reasons, files = _staleness(spec, mode, out, data, formats)
    return None if reasons else files
