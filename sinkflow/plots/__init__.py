"""Figures: each a pure function of a frozen, seeded config, drawn in one shared style.

A figure module (``sinkflow/plots/<topic>.py``) computes data from a config and draws it,
and registers both with :func:`register`; every module of this folder is discovered on first
use of the registry. ``sinkflow figures`` renders them (:func:`render`), leaving a figure
whose data agree with its committed reference data alone (:func:`stale`, :class:`Tolerance`).
``style.py`` is the one matplotlib style; ``tables.py`` plots users' sweep tables; ``_animate.py``
animates particle flows (:func:`animate`, the classroom preset :func:`circle_demo`).
Start reading at ``_registry.py`` (what a figure is), ``_render.py`` (how it is written),
``_reference.py`` (how a rerun is compared), then any topic module (``normalizations.py`` is short).
"""

from sinkflow.plots._animate import ParticleAnimation, animate, circle_demo
from sinkflow.plots._reference import (
    DEFAULT_TOLERANCE,
    MANIFEST_COLUMNS,
    Tolerance,
    compare_data,
    data_checksum,
    flatten_data,
    read_manifest,
    read_reference,
    reference_path,
    write_manifest,
    write_reference,
)
from sinkflow.plots._registry import (
    FORMATS,
    FigureSpec,
    compute,
    config_hash,
    get,
    register,
    registry,
    unregister,
)
from sinkflow.plots._render import (
    render,
    stale,
)
from sinkflow.plots.tables import plot_sweep

__all__ = [
    "plot_sweep",
    "animate",
    "circle_demo",
    "ParticleAnimation",
    "FigureSpec",
    "register",
    "unregister",
    "registry",
    "get",
    "compute",
    "config_hash",
    "FORMATS",
    "Tolerance",
    "DEFAULT_TOLERANCE",
    "flatten_data",
    "compare_data",
    "data_checksum",
    "reference_path",
    "write_reference",
    "read_reference",
    "read_manifest",
    "write_manifest",
    "MANIFEST_COLUMNS",
    "render",
    "stale",
]
