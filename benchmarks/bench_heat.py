"""Benchmark of the heat-limit particle flow (issue 4 target: 1D, n = 4000, 200 steps < 1 min).

Prints a markdown table: wall time of the whole run, cost per step, Sinkhorn half-iterations
per step (warm-started), and the ratio to the SoftMax-Gaussian flow measured in the same run
(the same layer without the Sinkhorn solve), plus the accuracy reached (variance growth vs 2t).

    python benchmarks/bench_heat.py            # n = 4000, 200 steps
    python benchmarks/bench_heat.py --quick    # n = 1000, 50 steps
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from sinkflow.heat_limit import heat_trajectory
from sinkflow.plots.heat import mixture_1d


def run(x0, t, eps, dt, normalization, dtype, tol=None):
    x = torch.tensor(x0, dtype=dtype)
    t0 = time.perf_counter()
    res = heat_trajectory(x, [t], eps, dt, normalization, tol=tol)
    wall = time.perf_counter() - t0
    return wall, res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n = 1000, 50 steps, 3 repeats")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; PERF.md: pin threads)")
    p.add_argument("--eps", type=float, default=0.05)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    n, steps, repeats = (1000, 50, 3) if args.quick else (4000, 200, 1)
    t = 0.5
    dt = t / steps
    g = mixture_1d()
    x0 = g.sample(n, seed=0)
    growth = 2 * t
    rows = []
    for name, norm, dtype in [("SoftMax-Gaussian f64 (reference)", "softmax_gaussian", torch.float64),
                              ("Sinkhorn f64", "sinkhorn", torch.float64),
                              ("Sinkhorn f32", "sinkhorn", torch.float32),
                              ("unnormalized f64", "unnormalized", torch.float64)]:
        walls, res = [], None
        for _ in range(repeats):
            w, res = run(x0, t, args.eps, dt, norm, dtype)
            walls.append(w)
        wall = statistics.median(walls)
        xt = res.final.numpy().astype(float)
        rel = (xt.var() - x0.var() - growth) / (x0.var() + growth) if norm == "sinkhorn" else float("nan")
        it = res.sinkhorn_iterations
        rows.append((name, wall, wall / res.n_steps * 1e3, float(np.mean(it)) if it.size else 0.0,
                     int(it[0]) if it.size else 0, rel, res.converged))
    ref = rows[0][1]
    print(f"torch {torch.__version__}, threads = {torch.get_num_threads()}, n = {n}, steps = {steps}, "
          f"eps = {args.eps}, dt = {dt:g}, t = {t}, repeats = {repeats} (median)\n")
    print("| flow | total s | ms / step | Sinkhorn half-its / step (first) | ratio to SoftMax | var growth rel. err | converged |")
    print("|---|---|---|---|---|---|---|")
    for name, wall, per, it, first, rel, conv in rows:
        rels = "" if np.isnan(rel) else f"{rel:+.4f}"
        print(f"| {name} | {wall:.2f} | {per:.1f} | {it:.1f} ({first}) | {wall / ref:.2f} | {rels} | {conv} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
