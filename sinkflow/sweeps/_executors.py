"""Where a sweep's points run: in this process, one after the other, or on a Dask cluster (a local
one by default, closed without killing its workers), with progress and failures reported per
point.
"""

from __future__ import annotations

import re
import sys

from sinkflow._checks import check_number
from sinkflow._optional import require
from sinkflow.sweeps._cache import _run_point
from sinkflow.sweeps._points import SweepError

__all__ = ["local_client", "close_client"]


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
        from IPython.display import display

        in_kernel = get_ipython() is not None and "IPKernelApp" in get_ipython().config
    except ImportError:
        in_kernel = False
    if in_kernel:
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
    dask = require("dask", "sinkflow.sweeps.local_client")
    distributed = require("distributed", "sinkflow.sweeps.local_client")

    environ = {k: v for k, v in dask.config.get("distributed.nanny.pre-spawn-environ", {}).items()
               if k != "MALLOC_TRIM_THRESHOLD_"}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        # ":0": the scheduler's web server (dashboard if bokeh is installed) on any free port,
        # so several clusters (or sessions) never collide on the default 8787
        cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
                               dashboard_address=":0")
    return distributed.Client(cluster)


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
    distributed = require("distributed", "sinkflow.sweep")
    owned = None
    if isinstance(executor, distributed.Client):
        client = executor
    elif executor == "dask":
        client = owned = local_client(n_workers, threads_per_worker)
    else:
        client = distributed.Client(executor)
        owned = client
    try:
        _announce(client, progress)
        # A sliding window of submitted points (twice the cluster's threads, re-read as
        # workers join or leave, e.g. an adaptive dask-jobqueue cluster) keeps every worker
        # busy and lets a failure stop the sweep cleanly: nothing new is submitted, the points
        # in flight finish (and are cached), then the error is raised.
        pending = iter(jobs.items())
        futures, out, failed = {}, {}, None
        ac = distributed.as_completed()

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
    distributed = require("distributed", f"sinkflow.sweep(executor={executor!r})")
    if not isinstance(executor, (str, distributed.Client)):
        raise TypeError(f"executor must be a string or a dask.distributed.Client, got {type(executor).__name__}")
