"""Registry of named figures: each is a frozen seeded config -> data -> matplotlib figure.

A figure module (``sinkflow/plots/<topic>.py``) calls :func:`register` at import time;
all modules of this package are discovered automatically. Writing the figures is
:mod:`sinkflow.plots._render`'s, their reference data and manifest
:mod:`sinkflow.plots._reference`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sinkflow.plots._reference import Tolerance

__all__ = ["FigureSpec", "register", "unregister", "registry", "get", "compute", "config_hash", "FORMATS"]

_REGISTRY: dict[str, FigureSpec] = {}

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
    caption : str
        The one claim the figure makes, in at most two lines (shown under it in the gallery).
    needs : tuple of str
        Optional modules its computation imports (keys of :data:`sinkflow._optional.EXTRAS`,
        e.g. ``("sklearn",)``) and files of the source checkout it reads (``"docs/data/..."``):
        without them ``sinkflow figures`` does not make it and names what to install. A bare
        install (no extras) from a wheel makes every other figure.
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
    caption: str = ""
    needs: tuple = ()

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
        # one order, whatever was asked (the files come from one layout: the order changes no pixel)
        return tuple(f for f in self.formats if f in requested)

    def missing(self) -> list[str]:
        """What installs each of :attr:`needs` that is missing here (``'scikit-learn: pip install
        "sinkflow[models]"'``); empty when the figure can be made. Imports nothing.
        """
        from sinkflow._optional import available, install_hint

        return [install_hint(m) for m in self.needs if not available(m)]

    def config(self, mode: str = "quick"):
        if mode not in ("quick", "full"):
            raise ValueError(f"mode must be 'quick' or 'full', got {mode!r}")
        return self.quick if mode == "quick" else self.full


def register(name: str, *, compute, plot, quick, full=None, default: bool = True, description: str = "",
             formats: tuple = FORMATS, tolerances: dict | None = None, caption: str = "",
             needs: tuple = ()) -> FigureSpec:
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
    caption : str
        The one claim the figure makes, for a reader of a slide: at most two lines.
    needs : tuple of str
        Optional modules ``compute`` imports (keys of :data:`sinkflow._optional.EXTRAS`), imported
        through :func:`sinkflow._optional.require`, and files of the source checkout it reads
        (paths relative to it, with a ``/``), found through :func:`sinkflow._optional.checkout_file`.

    Returns
    -------
    FigureSpec

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> import numpy as np
    >>> from sinkflow.plots import compute, get, register, unregister
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
    from sinkflow._optional import EXTRAS

    unknown = [m for m in needs if "/" not in m and m.split(".")[0] not in EXTRAS]
    if unknown:
        raise ValueError(f"figure {name!r}: needs {unknown} are neither optional modules (sinkflow._optional.EXTRAS) "
                         "nor files of the checkout (paths with a /)")
    spec = FigureSpec(name, compute, plot, quick, full if full is not None else quick, default, description,
                      tuple(formats), tuple((tolerances or {}).items()), str(caption), tuple(needs))
    _REGISTRY[name] = spec
    return spec


def _discover() -> None:
    """Import every figure module of this folder (each registers its figures)."""
    from pathlib import Path

    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
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
    >>> from sinkflow.plots import registry
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
    >>> from sinkflow.plots import register, registry, unregister
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
    >>> from sinkflow.plots import get
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
    >>> from sinkflow.plots import config_hash, get
    >>> cfg = get("normalizations_convergence").quick
    >>> h = config_hash("normalizations_convergence", cfg)
    >>> len(h), h == config_hash("normalizations_convergence", dataclasses.replace(cfg))
    (16, True)
    >>> h == config_hash("normalizations_convergence", dataclasses.replace(cfg, seed=cfg.seed + 1))
    False
    """
    payload = json.dumps({"figure": name, "config": dataclasses.asdict(config)}, sort_keys=True, default=repr)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


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
    >>> from sinkflow.plots import compute, register, unregister
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


