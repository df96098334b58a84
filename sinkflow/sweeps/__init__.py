"""Parameter sweeps: a grid of configs, one experiment per point (see
:mod:`sinkflow.experiments`), cached and resumable, on a Dask cluster or sequentially, into
one tidy table. Start reading at ``_sweep.py``; the grid and its keys are in ``_points.py``,
the cache in ``_cache.py``, the executors (sequential, Dask) in ``_executors.py``.
"""

from sinkflow.sweeps._executors import (
    close_client,
    local_client,
)
from sinkflow.sweeps._points import (
    SweepError,
    expand_grid,
    point_key,
    resolve_experiment,
)
from sinkflow.sweeps._sweep import (
    sweep,
)

__all__ = [
    "SweepError", "expand_grid", "resolve_experiment", "point_key", "local_client", "close_client", "sweep",
]
