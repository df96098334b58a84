"""Registry of named figures: each is a frozen seeded config -> data -> matplotlib figure.

A figure module (``sinkflow/plots/<topic>.py``) calls :func:`register` at import time;
all modules of this package are discovered automatically. Writing is deterministic:
PNG and PDF carry no timestamps or software versions, so reruns are byte-identical, and
``MANIFEST.tsv`` records each file's config hash and data checksum.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from sinkflow.plots._reference import (
    DEFAULT_TOLERANCE,
    Tolerance,
    compare_data,
    flatten_data,
    read_reference,
    reference_path,
    write_reference,
)

__all__ = ["FigureSpec", "register", "unregister", "registry", "get", "compute", "render", "stale", "config_hash",
           "data_checksum", "flatten_data", "compare_data", "Tolerance", "DEFAULT_TOLERANCE", "reference_path",
           "read_reference", "write_reference", "read_manifest", "write_manifest", "FORMATS", "MANIFEST_COLUMNS"]

_REGISTRY: dict[str, "FigureSpec"] = {}

#: Formats a matplotlib figure can be written in, and those written when none is asked for.
FORMATS = ("png", "pdf", "svg")
DEFAULT_FORMATS = ("png", "pdf")
_NOT_FIGURE_MODULES = {"style", "tables"}


@dataclass(frozen=True)
class FigureSpec:
    """A registered figure.

    Attributes
    ----------
    name : str
        Registry key and file stem.
    compute : callable
        ``compute(config) -> dict`` of numpy arrays and numbers (the experiment).
    plot : callable
        ``plot(data, config) -> Figure | matplotlib.animation.Animation | dict[str, ...]``;
        a dict maps file-name suffixes to figures or animations.
    quick, full : frozen dataclass instances
        The embedded configurations of the two modes (seeded).
    default : bool
        Whether ``sinkflow figures`` (no names) makes it.
    description : str
        One line for ``--list`` and the gallery.
    formats : tuple of str
        File formats the figure can be written in (:data:`FORMATS` for figures, ``("gif",)``
        for an animation).
    tolerances : tuple of (str, Tolerance)
        Tolerances for the flat data keys matching each pattern (first match wins); other
        keys are compared within :data:`DEFAULT_TOLERANCE`.
    """

    name: str
    compute: Callable[[Any], dict]
    plot: Callable[[dict, Any], Any]
    quick: Any
    full: Any
    default: bool = True
    description: str = ""
    formats: tuple = FORMATS
    tolerances: tuple = ()

    def writable(self, requested=None) -> tuple:
        """The formats to write for ``requested`` (default: PNG and PDF, or what the figure supports),
        always in the order of :attr:`formats`.

        Raises ``ValueError`` naming the formats the figure can be written in when one is not.
        """
        if requested is None:
            return tuple(f for f in DEFAULT_FORMATS if f in self.formats) or self.formats
        bad = [f for f in requested if f not in self.formats]
        if bad:
            raise ValueError(f"figure {self.name!r} cannot be written as {', '.join(bad)}: "
                             f"it supports {', '.join(self.formats)}")
        # one order, whatever was asked: the first save lays the figure out, and a PDF-first
        # layout gives other PNG pixels than a PNG-first one
        return tuple(f for f in self.formats if f in requested)

    def config(self, mode: str = "quick"):
        if mode not in ("quick", "full"):
            raise ValueError(f"mode must be 'quick' or 'full', got {mode!r}")
        return self.quick if mode == "quick" else self.full


def register(name: str, *, compute, plot, quick, full=None, default: bool = True, description: str = "",
             formats: tuple = FORMATS, tolerances: dict | None = None) -> FigureSpec:
    """Register a figure (called at import time by figure modules).

    Parameters
    ----------
    name : str
        Registry key and file stem (a name already registered with another ``compute`` is a
        ``ValueError``).
    compute : callable
        ``compute(config) -> dict`` of numpy arrays and numbers.
    plot : callable
        ``plot(data, config)`` returning a figure, an animation or a dict of them.
    quick, full : frozen dataclass instances
        Configurations of the two modes (``full`` defaults to ``quick``); anything else is a
        ``TypeError``.
    default : bool
        Whether ``sinkflow figures`` (no names) makes it.
    description : str
        One line for ``--list`` and the gallery.
    formats : tuple of str
        Formats the figure can be written in.
    tolerances : dict, optional
        ``pattern -> Tolerance`` for data keys that need another tolerance than
        :data:`DEFAULT_TOLERANCE` when a rerun is compared with the reference data (say why
        next to it: the measured spread across CPU kernels).

    Returns
    -------
    FigureSpec

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> import numpy as np
    >>> from sinkflow.plots._registry import compute, get, register, unregister
    >>> @dataclass(frozen=True)
    ... class SquaresConfig:
    ...     n: int = 4
    >>> spec = register("demo_squares", compute=lambda cfg: {"y": np.arange(cfg.n) ** 2},
    ...                 plot=lambda data, cfg: None, quick=SquaresConfig(), default=False)
    >>> get("demo_squares") is spec, spec.full == spec.quick
    (True, True)
    >>> compute("demo_squares", n=3)["y"].tolist()
    [0, 1, 4]
    >>> _ = unregister("demo_squares")   # leave the registry as this example found it
    """
    for cfg in (quick, full):
        if cfg is not None and not (dataclasses.is_dataclass(cfg) and cfg.__dataclass_params__.frozen):
            raise TypeError(f"figure {name!r}: configs must be frozen dataclass instances")
    if name in _REGISTRY and _REGISTRY[name].compute is not compute:
        raise ValueError(f"figure name {name!r} is registered twice")
    if not all(isinstance(t, Tolerance) for t in (tolerances or {}).values()):
        raise TypeError(f"figure {name!r}: tolerances must map key patterns to Tolerance instances")
    spec = FigureSpec(name, compute, plot, quick, full if full is not None else quick, default, description,
                      tuple(formats), tuple((tolerances or {}).items()))
    _REGISTRY[name] = spec
    return spec


def _discover() -> None:
    import sinkflow.plots as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name not in _NOT_FIGURE_MODULES and not info.name.startswith("_"):
            importlib.import_module(f"sinkflow.plots.{info.name}")


def registry() -> dict[str, FigureSpec]:
    """All registered figures, by name (sorted).

    Imports every figure module of :mod:`sinkflow.plots` first, so each has registered.

    Returns
    -------
    dict
        ``name -> FigureSpec``, in name order.

    Examples
    --------
    >>> from sinkflow.plots._registry import registry
    >>> figures = registry()
    >>> list(figures) == sorted(figures), all(name == spec.name for name, spec in figures.items())
    (True, True)
    >>> "normalizations_convergence" in figures
    True
    """
    _discover()
    return dict(sorted(_REGISTRY.items()))


def unregister(name: str) -> FigureSpec:
    """Remove the figure ``name`` from the registry (e.g. one registered while exploring in a notebook).

    Parameters
    ----------
    name : str

    Returns
    -------
    FigureSpec
        The removed figure.

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> from sinkflow.plots._registry import register, registry, unregister
    >>> @dataclass(frozen=True)
    ... class Cfg:
    ...     seed: int = 0
    >>> spec = register("demo_removed", compute=lambda cfg: {}, plot=lambda data, cfg: None, quick=Cfg())
    >>> unregister("demo_removed") is spec, "demo_removed" in registry()
    (True, False)
    """
    _discover()
    try:
        return _REGISTRY.pop(name)
    except KeyError:
        raise ValueError(f"no registered figure {name!r}; registered: {', '.join(sorted(_REGISTRY))}") from None


def get(name: str) -> FigureSpec:
    """The registered figure ``name``.

    Parameters
    ----------
    name : str
        A key of :func:`registry`.

    Returns
    -------
    FigureSpec

    Raises
    ------
    KeyError
        For an unknown name (the message lists the known ones).

    Examples
    --------
    >>> from sinkflow.plots._registry import get
    >>> spec = get("normalizations_convergence")
    >>> spec.name, spec.config("quick") is spec.quick
    ('normalizations_convergence', True)
    """
    reg = registry()
    if name not in reg:
        raise KeyError(f"unknown figure {name!r}; known: {', '.join(reg)}")
    return reg[name]


def config_hash(name: str, config) -> str:
    """Short SHA-256 of the figure name and its config (as sorted JSON).

    Parameters
    ----------
    name : str
        Figure name.
    config : dataclass instance
        Its configuration.

    Returns
    -------
    str
        16 hexadecimal digits; ``MANIFEST.tsv`` records it for each written file.

    Examples
    --------
    >>> import dataclasses
    >>> from sinkflow.plots._registry import config_hash, get
    >>> cfg = get("normalizations_convergence").quick
    >>> h = config_hash("normalizations_convergence", cfg)
    >>> len(h), h == config_hash("normalizations_convergence", dataclasses.replace(cfg))
    (16, True)
    >>> h == config_hash("normalizations_convergence", dataclasses.replace(cfg, seed=cfg.seed + 1))
    False
    """
    payload = json.dumps({"figure": name, "config": dataclasses.asdict(config)}, sort_keys=True, default=repr)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def data_checksum(data: dict) -> str:
    """Short SHA-256 over a figure's data, exactly (names, shapes, dtypes and bytes).

    ``MANIFEST.tsv`` records it for the reference data a figure was drawn from; whether new
    data reproduce a figure is decided within tolerances (:func:`compare_data`), never by
    this hash.

    Examples
    --------
    >>> from sinkflow.plots._registry import data_checksum
    >>> data_checksum({"x": [0.5, 0.25]}) == data_checksum({"x": [0.5, 0.25]})
    True
    >>> data_checksum({"x": [0.1 + 0.2]}) == data_checksum({"x": [0.3]})   # exact: last bits count
    False
    """
    h = hashlib.sha256()
    for key, arr in sorted(flatten_data(data).items()):
        arr = np.asarray(arr)
        h.update(f"{key}|{arr.shape}|{arr.dtype.str}|".encode())
        h.update(repr(arr.tolist()).encode() if arr.dtype == object else np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:16]


def compute(name: str, mode: str = "quick", **overrides) -> dict:
    """Run a figure's experiment and return its data (no plotting).

    Parameters
    ----------
    name : str
        A registered figure.
    mode : {"quick", "full"}
        Which embedded configuration to run.
    **overrides
        Fields of the configuration to replace (``dataclasses.replace``).

    Returns
    -------
    dict
        The data of :attr:`FigureSpec.compute`.

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> import numpy as np
    >>> from sinkflow.plots._registry import compute, register, unregister
    >>> @dataclass(frozen=True)
    ... class RampConfig:
    ...     n: int = 5
    >>> _ = register("demo_ramp", compute=lambda cfg: {"y": np.linspace(0, 1, cfg.n)},
    ...              plot=lambda data, cfg: None, quick=RampConfig(), default=False)
    >>> compute("demo_ramp")["y"].shape, compute("demo_ramp", n=3)["y"].shape
    ((5,), (3,))
    >>> _ = unregister("demo_ramp")   # leave the registry as this example found it
    """
    spec = get(name)
    cfg = spec.config(mode)
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    return _run(spec, cfg, mode)


def _run(spec: FigureSpec, cfg, mode: str) -> dict:
    """``spec.compute(cfg)``; quick data on one torch thread.

    A thread pool's split of a reduction changes the last digits, and those move a PDF's
    coordinates: committed (quick) figures would depend on the core count. Full
    configurations use every thread.
    """
    from sinkflow._backend import torch_threads  # torch loads with the first figure, not with the registry

    with torch_threads(1) if mode == "quick" else contextlib.nullcontext():
        return spec.compute(cfg)


_PNG_META = {"Software": None}
_PDF_META = {"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None}


def _save(obj, stem: Path, formats) -> list[Path]:
    import matplotlib.pyplot as plt
    from matplotlib.animation import Animation, PillowWriter

    written = []
    if isinstance(obj, Animation):
        path = stem.with_suffix(".gif")
        obj.save(path, writer=PillowWriter(fps=obj._fps if hasattr(obj, "_fps") else 12))
        plt.close(obj._fig)
        return [path]
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        meta = _PNG_META if fmt == "png" else _PDF_META if fmt == "pdf" else None
        obj.savefig(path, format=fmt, metadata=meta)
        written.append(path)
    plt.close(obj)
    return written


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
    >>> from sinkflow.plots._registry import config_hash, read_manifest, register, render, unregister
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
    >>> from sinkflow.plots._registry import register, render, stale, unregister
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
    if {Path(r["file"]).suffix[1:] for r in rows} < set(formats) or not rows:
        return [f"no {mode} manifest row with config hash {chash} for every format of {', '.join(formats)}"], files
    broken = [r["file"] for r in rows if not (out / r["file"]).is_file() or _file_hash(out / r["file"]) != r["file_sha256"]]
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


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


#: Columns of ``MANIFEST.tsv``, one row per written file.
MANIFEST_COLUMNS = ("figure", "mode", "file", "config_hash", "data_checksum", "file_sha256")


def read_manifest(folder: str | Path) -> dict[str, dict[str, str]]:
    """The rows of ``folder/MANIFEST.tsv``, keyed by file name.

    Parameters
    ----------
    folder : str or Path
        Folder holding ``MANIFEST.tsv``.

    Returns
    -------
    dict
        ``file name -> {column: value}`` over :data:`MANIFEST_COLUMNS`; empty when there is
        no manifest. Lines without one value per column are skipped.

    Examples
    --------
    >>> import tempfile
    >>> from sinkflow.plots._registry import MANIFEST_COLUMNS, read_manifest, write_manifest
    >>> row = dict(zip(MANIFEST_COLUMNS, ("demo", "quick", "demo.png", "0" * 16, "1" * 16, "2" * 16)))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     empty = read_manifest(tmp)   # no MANIFEST.tsv yet
    ...     write_manifest(tmp, {"demo.png": row})
    ...     print(empty, read_manifest(tmp) == {"demo.png": row})
    {} True
    """
    path = Path(folder) / "MANIFEST.tsv"
    lines = path.read_text().splitlines() if path.is_file() else []
    rows = (line.split("\t") for line in lines[1:])
    return {cells[2]: dict(zip(MANIFEST_COLUMNS, cells)) for cells in rows if len(cells) == len(MANIFEST_COLUMNS)}


def write_manifest(folder: str | Path, rows: dict[str, dict[str, str]]) -> None:
    """Write ``folder/MANIFEST.tsv``: a header, then the rows sorted by file name.

    Parameters
    ----------
    folder : str or Path
        Folder to write ``MANIFEST.tsv`` in.
    rows : dict
        ``file name -> {column: value}``, as :func:`read_manifest` returns.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from sinkflow.plots._registry import MANIFEST_COLUMNS, read_manifest, write_manifest
    >>> rows = {f: dict(zip(MANIFEST_COLUMNS, ("demo", "quick", f, "a" * 16, "b" * 16, "c" * 16)))
    ...         for f in ("demo.pdf", "demo.png")}
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     write_manifest(tmp, rows)
    ...     lines = Path(tmp, "MANIFEST.tsv").read_text().splitlines()
    ...     print(read_manifest(tmp) == rows, lines[0].split("\\t") == list(MANIFEST_COLUMNS), len(lines))
    True True 3
    """
    lines = ["\t".join(MANIFEST_COLUMNS)] + ["\t".join(rows[f][c] for c in MANIFEST_COLUMNS) for f in sorted(rows)]
    (Path(folder) / "MANIFEST.tsv").write_text("\n".join(lines) + "\n")


def _update_manifest(out: Path, name: str, mode: str, written, chash: str, dsum: str) -> None:
    # rows of this figure drawn from other data no longer describe the reference data
    rows = {f: r for f, r in read_manifest(out).items() if r["figure"] != name or r["data_checksum"] == dsum}
    for p in written:
        rows[p.name] = dict(zip(MANIFEST_COLUMNS, (name, mode, p.name, chash, dsum, _file_hash(p))))
    write_manifest(out, rows)
