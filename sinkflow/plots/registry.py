"""Registry of named figures: each is a frozen seeded config -> data -> matplotlib figure.

A figure module (``sinkflow/plots/<topic>.py``) calls :func:`register` at import time;
all modules of this package are discovered automatically. Writing is deterministic:
PNG and PDF carry no timestamps or software versions, so reruns are byte-identical, and
``MANIFEST.tsv`` records each file's config hash and data checksum.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = ["FigureSpec", "register", "registry", "get", "compute", "render", "config_hash", "data_checksum"]

_REGISTRY: dict[str, "FigureSpec"] = {}
_NOT_FIGURE_MODULES = {"registry", "style"}


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
    """

    name: str
    compute: Callable[[Any], dict]
    plot: Callable[[dict, Any], Any]
    quick: Any
    full: Any
    default: bool = True
    description: str = ""

    def config(self, mode: str = "quick"):
        if mode not in ("quick", "full"):
            raise ValueError(f"mode must be 'quick' or 'full', got {mode!r}")
        return self.quick if mode == "quick" else self.full


def register(name: str, *, compute, plot, quick, full=None, default: bool = True, description: str = "") -> FigureSpec:
    """Register a figure (called at import time by figure modules)."""
    for cfg in (quick, full):
        if cfg is not None and not (dataclasses.is_dataclass(cfg) and cfg.__dataclass_params__.frozen):
            raise TypeError(f"figure {name!r}: configs must be frozen dataclass instances")
    if name in _REGISTRY and _REGISTRY[name].compute is not compute:
        raise ValueError(f"figure name {name!r} is registered twice")
    spec = FigureSpec(name, compute, plot, quick, full if full is not None else quick, default, description)
    _REGISTRY[name] = spec
    return spec


def _discover() -> None:
    import sinkflow.plots as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name not in _NOT_FIGURE_MODULES and not info.name.startswith("_"):
            importlib.import_module(f"sinkflow.plots.{info.name}")


def registry() -> dict[str, FigureSpec]:
    """All registered figures, by name (sorted)."""
    _discover()
    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> FigureSpec:
    reg = registry()
    if name not in reg:
        raise KeyError(f"unknown figure {name!r}; known: {', '.join(reg)}")
    return reg[name]


def config_hash(name: str, config) -> str:
    """Short SHA-256 of the figure name and its config (as sorted JSON)."""
    payload = json.dumps({"figure": name, "config": dataclasses.asdict(config)}, sort_keys=True, default=repr)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def data_checksum(data: dict) -> str:
    """Short SHA-256 over a figure's data (arrays rounded to 10 significant digits)."""
    h = hashlib.sha256()

    def feed(key, value):
        h.update(str(key).encode())
        if isinstance(value, dict):
            for k in sorted(value):
                feed(f"{key}.{k}", value[k])
        elif isinstance(value, (list, tuple)) and not all(isinstance(v, (int, float, np.number)) for v in value):
            for i, v in enumerate(value):
                feed(f"{key}[{i}]", v)
        else:
            arr = np.asarray(value)
            if arr.dtype.kind in "fc":
                arr = np.array([float(f"{v:.10g}") for v in arr.ravel()]) if arr.size else arr
            h.update(np.ascontiguousarray(arr).tobytes() if arr.dtype != object else repr(value).encode())

    for k in sorted(data):
        feed(k, data[k])
    return h.hexdigest()[:16]


def compute(name: str, mode: str = "quick", **overrides) -> dict:
    """Run a figure's experiment and return its data (no plotting)."""
    spec = get(name)
    cfg = spec.config(mode)
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
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


def render(name: str, mode: str = "quick", out: str | Path = "figures", formats=("png", "pdf"), data: dict | None = None) -> list[Path]:
    """Compute (unless ``data`` is given) and write one figure; returns the written paths.

    Also updates ``out/MANIFEST.tsv`` (figure, mode, file, config hash, data checksum).
    """
    from sinkflow.plots.style import style

    spec = get(name)
    cfg = spec.config(mode)
    if data is None:
        data = spec.compute(cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with style():
        result = spec.plot(data, cfg)
        items = result.items() if isinstance(result, dict) else [("", result)]
        written = []
        for suffix, obj in items:
            stem = out / (f"{name}_{suffix}" if suffix else name)
            written += _save(obj, stem, formats)
    _update_manifest(out, name, mode, written, config_hash(name, cfg), data_checksum(data))
    return written


def _update_manifest(out: Path, name: str, mode: str, written, chash: str, dsum: str) -> None:
    path = out / "MANIFEST.tsv"
    header = "figure\tmode\tfile\tconfig_hash\tdata_checksum\tfile_sha256"
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) == 6:
                rows[parts[2]] = line
    for p in written:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        rows[p.name] = "\t".join([name, mode, p.name, chash, dsum, digest])
    path.write_text("\n".join([header] + [rows[k] for k in sorted(rows)]) + "\n")
