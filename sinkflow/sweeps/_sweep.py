r"""Parameter sweeps: a grid of configs, one experiment per point, one tidy table.

:func:`sweep` runs an experiment -- a module-level function ``fn(**params) -> dict``
(see :mod:`sinkflow.experiments`) -- on every point of a grid, on a Dask cluster or
sequentially, and gathers the results into a :class:`pandas.DataFrame` with one row per
point (parameter columns, then result columns).

Each point's result is cached on disk under ``cache_dir``, keyed by the SHA-256 of the
experiment's qualified name, the point's parameters (as sorted JSON) and
``sinkflow.__version__``. Workers write each file atomically as soon as the point is
done, so re-running a sweep is free and a sweep that was interrupted (an error, Ctrl-C,
a killed job) resumes where it stopped.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from sinkflow._optional import require
from sinkflow.sweeps._cache import _read_cached
from sinkflow.sweeps._executors import _check_executor, _run_dask, _run_sequential
from sinkflow.sweeps._points import expand_grid, point_key, resolve_experiment

__all__ = ["sweep"]


# ----------------------------------------------------------------------------------------
# grid


# ----------------------------------------------------------------------------------------
# experiments


# ----------------------------------------------------------------------------------------
# results and cache


# ----------------------------------------------------------------------------------------
# executors


# ----------------------------------------------------------------------------------------
# the sweep


def sweep(grid, fn, executor="dask", *, cache_dir: str | os.PathLike | None = ".sinkflow_cache",
          progress: bool = True, n_workers: int = 2, threads_per_worker: int = 1, on_error: str = "raise",
          recompute: bool = False):
    """Run an experiment on every point of a parameter grid and gather a tidy table.

    Parameters
    ----------
    grid : dict or list of dict
        ``{"n": [64, 128], "seed": [0, 1, 2]}`` (cartesian product) or a list of points;
        see :func:`expand_grid`. Values must be JSON-serialisable.
    fn : callable or str
        The experiment: a module-level function taking the parameters as keyword
        arguments and returning a dict of scalars or small arrays, or its import string
        ``"module:function"``. Workers import it by name, so it must be importable there.
    executor : {"dask", "sequential"} or distributed.Client or str
        ``"dask"`` starts a :class:`distributed.LocalCluster` (``n_workers`` processes,
        ``threads_per_worker`` threads each, see :func:`local_client`) for this sweep and
        closes it afterwards;
        a ``Client`` or a scheduler address (``"tcp://host:8786"``, e.g. from
        dask-jobqueue or a Kubernetes cluster) uses an existing cluster;
        ``"sequential"`` runs in this process (tests, debugging).
    cache_dir : path or None
        Folder of the per-point cache (``None``: no cache). Entries are keyed by
        :func:`point_key` and written atomically by the worker that computed them.
    progress : bool
        Show a tqdm progress bar (and the cluster, with its dashboard link).
    n_workers, threads_per_worker : int
        Size of the local cluster of ``executor="dask"``.
    on_error : {"raise", "record"}
        ``"raise"``: the first failing point cancels the rest and raises
        :class:`SweepError` (finished points stay cached). ``"record"``: failed points
        get their message in an ``error`` column and missing results.
    recompute : bool
        Ignore (and overwrite) cached results.

    Returns
    -------
    pandas.DataFrame
        One row per point, in grid order: parameter columns, then result columns.
        ``df.attrs`` holds ``experiment``, ``n_points``, ``n_cached``, ``n_computed``,
        ``seconds`` (wall time of the computation) and ``executor``.

    Examples
    --------
    >>> import sinkflow
    >>> df = sinkflow.sweep({"n": [8, 16], "scale": [1.0, 4.0]}, "sinkflow.experiments:sinkhorn_convergence",
    ...                     executor="sequential", cache_dir=None, progress=False)
    >>> print(df[["n", "scale", "converged"]].to_string(index=False))
     n  scale  converged
     8    1.0       True
     8    4.0       True
    16    1.0       True
    16    4.0       True
    >>> bool((df.observed_rate <= df.birkhoff_hopf_rate).all())
    True
    """
    pd = require("pandas", "sinkflow.sweep")
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error must be 'raise' or 'record', got {on_error!r}")
    _check_executor(executor)
    points = expand_grid(grid)
    func, experiment = resolve_experiment(fn)
    if cache_dir is not None and ("<lambda>" in experiment or "<locals>" in experiment):
        raise ValueError(f"experiment {experiment} is a lambda or a local function: its name cannot key the cache "
                         "and workers cannot import it; define it at module level (or pass cache_dir=None)")
    target = fn if isinstance(fn, str) else func
    if cache_dir is not None:
        folder = Path(cache_dir) / re.sub(r"[^\w.-]+", "_", experiment)
        paths = [folder / f"{point_key(experiment, p)}.json" for p in points]
    else:
        paths = [None] * len(points)

    results: dict[int, Any] = {}
    if not recompute:
        for i, (p, path) in enumerate(zip(points, paths, strict=True)):
            if path is not None and (cached := _read_cached(path, experiment, p)) is not None:
                results[i] = cached
    n_cached = len(results)
    jobs = {i: (target, experiment, points[i], None if paths[i] is None else str(paths[i]))
            for i in range(len(points)) if i not in results}
    t0 = time.perf_counter()
    if jobs:
        if isinstance(executor, str) and executor == "sequential":
            results.update(_run_sequential(jobs, progress, on_error, cache_dir))
        else:
            results.update(_run_dask(executor, jobs, progress, on_error, cache_dir, n_workers, threads_per_worker))
    seconds = time.perf_counter() - t0

    rows = []
    for i, p in enumerate(points):
        r = results[i]
        rows.append({**p, **({"error": f"{type(r).__name__}: {r}"} if isinstance(r, Exception) else r)})
    df = pd.DataFrame(rows)
    if "error" in df.columns:  # keep it last, after the results of the points that worked
        df = df[[c for c in df.columns if c != "error"] + ["error"]]
    df.attrs.update(experiment=experiment, n_points=len(points), n_cached=n_cached, n_computed=len(jobs),
                    seconds=seconds, executor=executor if isinstance(executor, str) else "client")
    return df


# ----------------------------------------------------------------------------------------
# plotting
