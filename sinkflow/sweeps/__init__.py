"""Parameter sweeps: a grid of configs, one experiment per point (see
:mod:`sinkflow.experiments`), cached and resumable, on a Dask cluster or sequentially, into
one tidy table. Start reading at ``_sweep.py``.
"""

from sinkflow.sweeps._sweep import (
    sweep,
    expand_grid,
    resolve_experiment,
    point_key,
    local_client,
    close_client,
    SweepError,
)

__all__ = [
    "sweep",
    "expand_grid",
    "resolve_experiment",
    "point_key",
    "local_client",
    "close_client",
    "SweepError",
]
