"""Figures: each a pure function of a frozen, seeded config (see :mod:`sinkflow.plots.registry`)."""

from sinkflow.plots.registry import (
    compute,
    config_hash,
    data_checksum,
    flatten_data,
    get,
    register,
    registry,
    render,
)

__all__ = ["register", "registry", "get", "compute", "render", "config_hash", "data_checksum", "flatten_data"]
