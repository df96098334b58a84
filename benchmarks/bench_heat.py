"""Benchmark of the heat-limit particle flow (issue 4 target: 1D, n = 4000, 200 steps < 1 min).

Prints a markdown table: wall time of the run, cost per step, Sinkhorn half-iterations per
step (warm-started; the first, cold step in parentheses), and the ratio to the SoftMax-Gaussian
flow measured in the same run (the same layer without the Sinkhorn solve), plus the accuracy
of the full study (variance growth vs 2t). One timed run per row (the full study alone is
minutes long); rows print as they finish.

    python benchmarks/bench_heat.py            # n = 4000, 200 steps
    python benchmarks/bench_heat.py --quick    # n = 1000, 50 steps
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from sinkflow.heat._rescaled_flow import heat_trajectory
from sinkflow.plots.heat import mixture_1d


def run(x0, t, eps, dt, normalization, dtype, tol=None):
    x = torch.tensor(x0, dtype=dtype)
    t0 = time.perf_counter()
    res = heat_trajectory(x, [t], eps, dt, normalization, tol=tol)
    wall = time.perf_counter() - t0
    return wall, res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n = 1000, 50 steps")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; docs/performance.md: pin threads)")
    p.add_argument("--eps", type=float, default=0.05)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    n, steps, short = (1000, 50, 10) if args.quick else (4000, 200, 20)
    t = 0.5
    dt = t / steps
    g = mixture_1d()
    x0 = g.sample(n, seed=0)
    growth = 2 * t
    print(f"torch {torch.__version__}, threads = {torch.get_num_threads()}, n = {n}, eps = {args.eps}, dt = {dt:g}; "
          f"full study: {steps} steps to t = {t}; other rows: {short}-step runs; ms / step = total / steps\n")
    print("| flow | steps | total s | ms / step | Sinkhorn half-its / step (first step) | ratio to SoftMax per step | var growth rel. err |")
    print("|---|---|---|---|---|---|---|", flush=True)
    variants = [("SoftMax-Gaussian f64 (reference)", "softmax_gaussian", torch.float64, short),
                ("unnormalized f64", "unnormalized", torch.float64, short),
                ("Sinkhorn f32", "sinkhorn", torch.float32, steps),
                ("Sinkhorn f64", "sinkhorn", torch.float64, steps)]
    ref_step = None
    for name, norm, dtype, k in variants:
        wall, res = run(x0, k * dt, args.eps, dt, norm, dtype)
        per = wall / res.n_steps * 1e3
        if ref_step is None:
            ref_step = per
        it = res.sinkhorn_iterations
        its = f"{np.mean(it[1:]):.1f} ({int(it[0])})" if norm == "sinkhorn" else "-"
        rel = ""
        if k == steps:
            xt = res.final.numpy().astype(float)
            rel = f"{(xt.var() - x0.var() - growth) / (x0.var() + growth):+.4f}"
        print(f"| {name} | {res.n_steps} | {wall:.1f} | {per:.0f} | {its} | {per / ref_step:.2f} | {rel} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
