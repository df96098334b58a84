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

import hashlib
import importlib
import itertools
import json
import math
import os
import re
import sys
import time
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import numpy as np

from sinkflow._checks import check_number

__all__ = ["sweep", "expand_grid", "resolve_experiment", "point_key", "local_client", "close_client", "SweepError"]

#: Result arrays larger than this are refused: a sweep table holds summaries, not data sets.
MAX_RESULT_SIZE = 100_000


class SweepError(RuntimeError):
    """A sweep point failed; the points finished before it are cached (re-run to resume)."""


# ----------------------------------------------------------------------------------------
# grid


def _jsonable(value, where: str):
    """Plain-Python copy of a parameter value, or a TypeError saying why it cannot key a cache."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value!r} is not a finite number; sweep parameters key a JSON cache")
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v, where) for k, v in value.items()}
    raise TypeError(
        f"{where}: value {value!r} of type {type(value).__name__} is not JSON-serialisable; sweep "
        "parameters must be numbers, strings, booleans, None, or lists/dicts of those, because "
        "they key the on-disk cache (pass a seed or a file name instead of an object)")


def expand_grid(grid) -> list[dict]:
    """The points of a sweep grid, as a list of parameter dicts.

    Parameters
    ----------
    grid : dict or list of dict
        A dict ``name -> list of values`` is expanded to the cartesian product (in the
        dict's order, the last name varying fastest); a value that is not a list, tuple,
        range or 1D array is a fixed parameter. A list of dicts is taken as the points
        themselves.

    Returns
    -------
    list of dict
        JSON-compatible parameter dicts (numpy scalars become Python numbers).

    Raises
    ------
    ValueError
        Empty grid, a parameter with no values, non-finite floats, duplicate points.
    TypeError
        Values that are not JSON-serialisable, non-string parameter names.

    Examples
    --------
    >>> from sinkflow.sweeps import expand_grid
    >>> expand_grid({"n": [8, 16], "scale": [1.0, 2.0], "seed": 0})
    [{'n': 8, 'scale': 1.0, 'seed': 0}, {'n': 8, 'scale': 2.0, 'seed': 0}, {'n': 16, 'scale': 1.0, 'seed': 0}, {'n': 16, 'scale': 2.0, 'seed': 0}]
    >>> expand_grid([{"n": 8}, {"n": 16, "scale": 4.0}])
    [{'n': 8}, {'n': 16, 'scale': 4.0}]
    """
    if isinstance(grid, Mapping):
        if not grid:
            raise ValueError("empty grid: give at least one parameter, e.g. {'n': [8, 16]}")
        axes = []
        for name, values in grid.items():
            if not isinstance(name, str):
                raise TypeError(f"grid parameter names must be strings, got {name!r}")
            if isinstance(values, np.ndarray):
                if values.ndim != 1:
                    raise ValueError(f"grid parameter {name!r}: give a 1D list of values, got an array of shape {values.shape}")
                values = values.tolist()
            if isinstance(values, (list, tuple, range)):
                values = list(values)
                if not values:
                    raise ValueError(f"empty grid: parameter {name!r} has no values, so the grid has no points")
            else:
                values = [values]
            axes.append([_jsonable(v, f"grid parameter {name!r}") for v in values])
        points = [dict(zip(grid, combo)) for combo in itertools.product(*axes)]
    elif isinstance(grid, (list, tuple)):
        if not grid:
            raise ValueError("empty grid: the list of points is empty")
        points = []
        for i, p in enumerate(grid):
            if not isinstance(p, Mapping):
                raise TypeError(f"grid point {i} must be a dict of parameters, got {type(p).__name__}")
            if not all(isinstance(k, str) for k in p):
                raise TypeError(f"grid point {i}: parameter names must be strings, got {list(p)}")
            points.append({k: _jsonable(v, f"grid point {i}, parameter {k!r}") for k, v in p.items()})
    else:
        raise TypeError(f"grid must be a dict of lists or a list of dicts, got {type(grid).__name__}")
    seen = set()
    for p in points:
        key = json.dumps(p, sort_keys=True)
        if key in seen:
            raise ValueError(f"duplicate grid point {p}: each point must be unique (it keys one cache entry)")
        seen.add(key)
    return points


# ----------------------------------------------------------------------------------------
# experiments


def _import_experiment(spec: str) -> Callable:
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"unknown experiment {spec!r}: name it as 'module:function', "
                         "e.g. 'sinkflow.experiments:sinkhorn_convergence'")
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise ValueError(f"unknown experiment {spec!r}: no module named {err.name!r}") from None
        raise
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = getattr(module, "__all__", None) or sorted(
                n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                and getattr(v, "__module__", None) == module.__name__)
            hint = f"; it defines: {', '.join(public)}" if public else ""
            raise ValueError(f"unknown experiment {spec!r}: module {module_name!r} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"experiment {spec!r} is a {type(obj).__name__}, not a function")
    return obj


def resolve_experiment(fn) -> tuple[Callable, str]:
    """The function and the qualified name (``"module:qualname"``) of an experiment.

    Parameters
    ----------
    fn : callable or str
        A module-level function, or its import string ``"module:function"``.

    Returns
    -------
    (callable, str)

    Examples
    --------
    >>> from sinkflow.sweeps import resolve_experiment
    >>> resolve_experiment("sinkflow.experiments:sinkhorn_convergence")[1]
    'sinkflow.experiments.sinkhorn:sinkhorn_convergence'
    """
    func = _import_experiment(fn) if isinstance(fn, str) else fn
    if not callable(func):
        raise TypeError(f"fn must be a function or a 'module:function' string, got {type(fn).__name__}")
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname:
        raise TypeError(f"experiment {func!r} has no module-level name (a functools.partial or a callable "
                        "object?); define a module-level function so its name can key the cache")
    return func, f"{module}:{qualname}"


def point_key(experiment: str, params: dict, version: str | None = None) -> str:
    """SHA-256 cache key of one sweep point: experiment name, parameters (sorted JSON), package version.

    Examples
    --------
    >>> from sinkflow.sweeps import point_key
    >>> point_key("m:f", {"n": 8, "seed": 0}) == point_key("m:f", {"seed": 0, "n": 8})
    True
    >>> point_key("m:f", {"n": 8}) == point_key("m:f", {"n": 16})
    False
    """
    if version is None:
        from sinkflow import __version__ as version
    payload = json.dumps({"experiment": experiment, "params": params, "version": version}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


# ----------------------------------------------------------------------------------------
# results and cache


def _check_result(result, experiment: str, params: dict) -> dict:
    if not isinstance(result, Mapping):
        raise TypeError(f"experiment {experiment} returned {type(result).__name__} for {params}; "
                        "an experiment must return a dict of scalars or small arrays")
    clean = {}
    for k, v in result.items():
        if not isinstance(k, str):
            raise TypeError(f"experiment {experiment}: result names must be strings, got {k!r}")
        if k in params:
            raise ValueError(f"experiment {experiment}: result {k!r} has the name of a parameter; rename one of them")
        if type(v).__module__.startswith("torch") and hasattr(v, "detach"):
            v = v.detach().cpu().numpy()
        if isinstance(v, np.generic):
            v = v.item()
        if v is None or isinstance(v, (bool, int, float, str)):
            clean[k] = v
            continue
        if isinstance(v, (list, tuple, np.ndarray)):
            arr = np.asarray(v)
            if arr.dtype.kind in "biuf" and arr.size <= MAX_RESULT_SIZE:
                clean[k] = arr
                continue
        raise TypeError(f"experiment {experiment}: result {k!r} ({type(v).__name__}) is not a scalar or a small "
                        f"numeric array (at most {MAX_RESULT_SIZE} entries)")
    return clean


def _encode(value):
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": value.dtype.str, "shape": list(value.shape)}
    return value


def _decode(value):
    if isinstance(value, dict) and "__ndarray__" in value:
        return np.asarray(value["__ndarray__"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    return value


def _write_atomic(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w") as fh:
            json.dump(record, fh)  # not sort_keys: the result's key order is the table's column order
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
    finally:
        if tmp.exists():
            tmp.unlink()


def _read_cached(path: Path, experiment: str, params: dict):
    """The cached result of a point, or None (missing, unreadable or for another point)."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        warnings.warn(f"ignoring unreadable sweep cache file {path} ({err}); the point is recomputed", stacklevel=3)
        return None
    if record.get("experiment") != experiment or record.get("params") != params:
        return None
    return {k: _decode(v) for k, v in record["result"].items()}


def _run_point(target, experiment: str, params: dict, path: str | None):
    """Compute one point (on a worker) and cache it there, so finished work survives the client."""
    func = _import_experiment(target) if isinstance(target, str) else target
    t0 = time.perf_counter()
    result = _check_result(func(**params), experiment, params)
    seconds = time.perf_counter() - t0
    if path is not None:
        from sinkflow import __version__

        record = {"experiment": experiment, "params": params, "version": __version__, "seconds": seconds,
                  "result": {k: _encode(v) for k, v in result.items()}}
        _write_atomic(Path(path), record)
    return result


# ----------------------------------------------------------------------------------------
# executors


def _point_label(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def _failure(params, err, n_done, cache_dir) -> SweepError:
    where = f"they are cached in {cache_dir}; fix the cause and re-run to resume" if cache_dir else "caching was off"
    return SweepError(f"sweep point ({_point_label(params)}) failed with {type(err).__name__}: {err}; "
                      f"{n_done} point(s) finished before it ({where})")


def _progress_bar(total: int, progress: bool, desc: str):
    from sinkflow._progress import progress_bar

    return progress_bar(total=total, desc=desc, unit="pt", enabled=progress, file=sys.stderr)


def _run_sequential(jobs, progress, on_error, cache_dir):
    out = {}
    with _progress_bar(len(jobs), progress, "sweep (sequential)") as bar:
        for i, args in jobs.items():
            try:
                out[i] = _run_point(*args)
            except Exception as err:
                if on_error == "raise":
                    raise _failure(args[2], err, len(out), cache_dir) from err
                out[i] = err
            bar.update()
    return out


def _announce(client, progress: bool) -> None:
    """Show the cluster: the rich Client repr in Jupyter (with its dashboard link), a line elsewhere."""
    if not progress:
        return
    try:
        from IPython import get_ipython

        in_kernel = get_ipython() is not None and "IPKernelApp" in get_ipython().config
    except ImportError:
        in_kernel = False
    if in_kernel:
        from IPython.display import display

        display(client)
        return
    try:
        import bokeh  # noqa: F401

        link = f"dashboard {client.dashboard_link}"
    except ImportError:
        link = "no dashboard (pip install bokeh to get one)"
    n = len(client.scheduler_info().get("workers", {}))
    print(f"sinkflow.sweep: dask scheduler {client.scheduler.address}, {n} worker(s), {link}", file=sys.stderr)


def local_client(n_workers: int = 2, threads_per_worker: int = 1):
    """A Dask client on a new local cluster set up for experiments (what ``executor="dask"`` uses).

    Worker processes (experiments hold the GIL in Python loops) with one thread each: the
    nanny sets ``OMP_NUM_THREADS=1`` and friends, so torch and BLAS do not oversubscribe the
    cores. Its ``MALLOC_TRIM_THRESHOLD_`` setting is dropped: it pins glibc's mmap threshold,
    so every large array is mapped and zeroed afresh (a heat-flow point ran 1.45x slower).
    Keep one open across several sweeps in a notebook (``executor=client``) to pay the
    start-up once; close it with :func:`close_client` (the client, then its workers and
    the cluster, with a timeout: no "worker still alive, killing" on a busy machine).

    Returns
    -------
    distributed.Client
        With the dashboard on a free port when bokeh is installed (``client.dashboard_link``).
    """
    n_workers = check_number(n_workers, "n_workers", integer=True, positive=True)
    threads_per_worker = check_number(threads_per_worker, "threads_per_worker", integer=True, positive=True)
    import dask
    from distributed import Client, LocalCluster

    environ = {k: v for k, v in dask.config.get("distributed.nanny.pre-spawn-environ", {}).items()
               if k != "MALLOC_TRIM_THRESHOLD_"}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        # ":0": the scheduler's web server (dashboard if bokeh is installed) on any free port,
        # so several clusters (or sessions) never collide on the default 8787
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
                               dashboard_address=":0")
    return Client(cluster)


def close_client(client, timeout: float = 60.0) -> None:
    """Close a client, then (for :func:`local_client`'s) its worker processes and cluster.

    ``client.cluster.close()`` gives each worker process 4 s to exit before killing it (the
    nanny's fixed default), and a process that has run torch can take longer to tear down on
    a loaded machine: every sweep then ended with "Worker process still alive after 4.0
    seconds, killing". Here the client goes first (its futures released), then every
    worker is closed with ``timeout`` seconds to exit, then the scheduler.

    Parameters
    ----------
    client : distributed.Client
    timeout : float
        Seconds each step may take (the worker processes get 80% of it to exit).

    Examples
    --------
    >>> from sinkflow.sweeps import close_client, local_client
    >>> client = local_client(n_workers=1)  # doctest: +SKIP
    >>> close_client(client)  # doctest: +SKIP
    """
    import asyncio

    cluster = client.cluster
    client.close(timeout=timeout)
    if cluster is None:
        return
    workers = list(getattr(cluster, "workers", {}).values())

    async def close_workers():
        await asyncio.gather(*(w.close(timeout=timeout) for w in workers))

    if workers:
        cluster.sync(close_workers)
    cluster.close(timeout=timeout)


def _run_dask(executor, jobs, progress, on_error, cache_dir, n_workers, threads_per_worker):
    from distributed import Client, as_completed

    owned = None
    if isinstance(executor, Client):
        client = executor
    elif executor == "dask":
        client = owned = local_client(n_workers, threads_per_worker)
    else:
        client = Client(executor)
        owned = client
    try:
        _announce(client, progress)
        # A sliding window of submitted points (twice the cluster's threads, re-read as
        # workers join or leave, e.g. an adaptive dask-jobqueue cluster) keeps every worker
        # busy and lets a failure stop the sweep cleanly: nothing new is submitted, the points
        # in flight finish (and are cached), then the error is raised.
        pending = iter(jobs.items())
        futures, out, failed = {}, {}, None
        ac = as_completed()

        def top_up():
            window = max(4, 2 * sum(client.nthreads().values()))
            while len(futures) < window:
                nxt = next(pending, None)
                if nxt is None:
                    return
                fut = client.submit(_run_point, *nxt[1], pure=False)
                futures[fut] = nxt[0]
                ac.add(fut)

        top_up()
        with _progress_bar(len(jobs), progress, "sweep (dask)") as bar:
            for fut in ac:
                i = futures.pop(fut)
                try:
                    out[i] = fut.result()
                except Exception as err:
                    if on_error == "raise":
                        failed = failed or (i, err)
                    else:
                        out[i] = err
                if failed is None:
                    top_up()
                bar.update()
        if failed is not None:
            i, err = failed
            raise _failure(jobs[i][2], err, len(out), cache_dir) from err
        return out
    finally:
        if owned is not None and owned.cluster is not None:  # our local cluster: client, workers, scheduler
            close_client(owned)
        elif owned is not None:
            owned.close()


def _check_executor(executor):
    if isinstance(executor, str) and executor == "sequential":
        return
    if isinstance(executor, str) and executor != "dask" and not re.match(r"^([a-z]+://)?[\w.\-\[\]:]+:\d+$", executor):
        raise ValueError(f"executor must be 'dask' (a local cluster), 'sequential', a dask Client or a scheduler "
                         f"address such as 'tcp://127.0.0.1:8786', got {executor!r}")
    try:
        from distributed import Client
    except ImportError:
        raise ImportError(f"executor={executor!r} needs dask.distributed: pip install 'sinkflow[sweep]' "
                          "(or use executor='sequential')") from None
    if not isinstance(executor, (str, Client)):
        raise TypeError(f"executor must be a string or a dask.distributed.Client, got {type(executor).__name__}")


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
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("sinkflow.sweep returns a pandas table: pip install 'sinkflow[sweep]'") from None
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
        for i, (p, path) in enumerate(zip(points, paths)):
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
