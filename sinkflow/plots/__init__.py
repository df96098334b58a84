"""Figures: each a pure function of a frozen, seeded config, drawn in one shared style.

A figure module (``sinkflow/plots/<topic>.py``) computes data from a config and draws it,
and registers both with :func:`register`; every module of this folder is discovered on first
use of the registry. ``sinkflow figures`` renders them (:func:`render`), leaving a figure
whose data agree with its committed reference data alone (:func:`stale`, :class:`Tolerance`).
``style.py`` is the one matplotlib style; ``tables.py`` plots users' sweep tables.
Start reading at ``_registry.py``, then any topic module (``normalizations.py`` is short).
"""

from sinkflow.plots._registry import (
    FigureSpec,
    register,
    unregister,
    registry,
    get,
    compute,
    render,
    stale,
    config_hash,
    data_checksum,
    flatten_data,
    compare_data,
    Tolerance,
    DEFAULT_TOLERANCE,
    reference_path,
    read_reference,
    write_reference,
    read_manifest,
    write_manifest,
    FORMATS,
    MANIFEST_COLUMNS,
)

__all__ = [
    "FigureSpec",
    "register",
    "unregister",
    "registry",
    "get",
    "compute",
    "render",
    "stale",
    "config_hash",
    "data_checksum",
    "flatten_data",
    "compare_data",
    "Tolerance",
    "DEFAULT_TOLERANCE",
    "reference_path",
    "read_reference",
    "write_reference",
    "read_manifest",
    "write_manifest",
    "FORMATS",
    "MANIFEST_COLUMNS",
]
