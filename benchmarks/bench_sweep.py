"""Sweep throughput: sequential vs a Dask LocalCluster, on a real experiment.

Runs the same grid (64 points by default) once sequentially in this process and once on
a LocalCluster of ``--workers`` single-threaded worker processes, without the cache, and
prints a markdown table: wall time, median time per point, and the speedup, both with
the cluster's start-up included ("cold") and on an already running cluster ("warm").
Every process computes with one thread (``torch.set_num_threads(1)`` here; the Dask nanny
sets ``OMP_NUM_THREADS=1`` in the workers), so the speedup measures process parallelism.

The experiment is selectable, e.g. after the heat-limit issue lands::

    python benchmarks/bench_sweep.py --experiment sinkflow.experiments:sinkhorn_convergence \\
        --grid '{"n": [448, 512], "scale": [0.5, 1.0, 1.5, 2.0], "seed": [0, 1, 2, 3, 4, 5, 6, 7]}'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

# One thread per process, here as in the Dask workers (whose nanny sets the same variables):
# set before numpy/torch are imported, so BLAS pools are single-threaded too.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

DEFAULT_EXPERIMENT = "sinkflow.experiments:sinkhorn_convergence"
# 64 points of about 0.5-0.9 s each (1 thread, idle machine): the O(n^3) Hilbert diameter dominates.
DEFAULT_GRID = {"n": [448, 512], "scale": [0.5, 1.0, 1.5, 2.0], "seed": list(range(8))}
QUICK_GRID = {"n": [160, 192], "scale": [0.5, 1.0], "seed": list(range(4))}


def _point_seconds(cache: Path) -> list[float]:
    return [json.loads(p.read_text())["seconds"] for p in cache.rglob("*.json")]


_SPIN = "import time; t = time.perf_counter(); s = sum(range(30_000_000)); print(time.perf_counter() - t)"


def available_parallelism(workers: int) -> float:
    """Throughput of ``workers`` concurrent CPU-bound processes relative to one (= workers on idle cores).

    On a shared machine this is what any process-parallel speedup is bounded by.
    """
    import subprocess
    import sys

    def run(k):
        procs = [subprocess.Popen([sys.executable, "-c", _SPIN], stdout=subprocess.PIPE, text=True) for _ in range(k)]
        return max(float(p.communicate()[0]) for p in procs)

    one = run(1)
    return workers * one / run(workers)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="'module:function' (default: %(default)s)")
    ap.add_argument("--grid", help="grid as JSON (dict of lists or list of dicts); default: 64 Sinkhorn points")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="16 small points (a smoke test of the benchmark)")
    args = ap.parse_args(argv)

    import torch

    from sinkflow.sweeps._executors import local_client
    from sinkflow.sweeps._points import expand_grid
    from sinkflow.sweeps._sweep import sweep

    torch.set_num_threads(1)
    grid = json.loads(args.grid) if args.grid else (QUICK_GRID if args.quick else DEFAULT_GRID)
    n_points = len(expand_grid(grid))
    load_before = os.getloadavg()[0]
    parallel_before = available_parallelism(args.workers)
    tmp = Path(tempfile.mkdtemp(prefix="bench_sweep_"))
    rows = []
    try:
        # Fresh caches per run: timing every point, and keeping their per-point times.
        t0 = time.perf_counter()
        seq = sweep(grid, args.experiment, executor="sequential", cache_dir=tmp / "seq", progress=False)
        t_seq = time.perf_counter() - t0
        rows.append(("sequential (this process)", 1, t_seq, _point_seconds(tmp / "seq"), 1.0))

        t0 = time.perf_counter()
        cold = sweep(grid, args.experiment, executor="dask", n_workers=args.workers, cache_dir=tmp / "cold",
                     progress=False)
        t_cold = time.perf_counter() - t0
        rows.append(("dask LocalCluster, cold (start-up included)", args.workers, t_cold,
                     _point_seconds(tmp / "cold"), t_seq / t_cold))

        t0 = time.perf_counter()
        client = local_client(n_workers=args.workers)  # the cluster executor="dask" makes
        client.run(lambda: __import__("sinkflow.experiments"))  # workers import torch + sinkflow once
        t_start = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            warm = sweep(grid, args.experiment, executor=client, cache_dir=tmp / "warm", progress=False)
            t_warm = time.perf_counter() - t0
        finally:
            client.close()
            client.cluster.close()
        rows.append((f"dask LocalCluster, warm (start-up {t_start:.1f} s excluded)", args.workers, t_warm,
                     _point_seconds(tmp / "warm"), t_seq / t_warm))
        same = seq.equals(cold) and seq.equals(warm)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"experiment `{args.experiment}`, {n_points} points, torch threads per process = 1, "
          f"{os.cpu_count()} CPUs, 1-min load average {load_before:.1f} before / {os.getloadavg()[0]:.1f} after "
          "(other processes share the cores when it exceeds 0)")
    print()
    # efficiency = time spent inside the points / (workers x wall time): 1 = no overhead or
    # idle worker; per-point times above the sequential ones mean the cores were shared.
    print("| executor | workers | wall time (s) | median s / point | sum of point times (s) | efficiency | speedup |")
    print("|---|---|---|---|---|---|---|")
    for name, workers, wall, times, speedup in rows:
        print(f"| {name} | {workers} | {wall:.1f} | {statistics.median(times):.3f} | {sum(times):.1f} | "
              f"{sum(times) / (workers * wall):.2f} | {speedup:.2f}x |")
    print()
    print(f"tables identical across executors: {same}")
    print(f"available parallelism ({args.workers} concurrent CPU-bound processes vs 1, pure Python): "
          f"{parallel_before:.2f}x before / {available_parallelism(args.workers):.2f}x after "
          f"(= {args.workers} on idle cores; the speedup above cannot exceed it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
