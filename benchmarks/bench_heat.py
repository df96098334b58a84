"""Benchmark of the heat-limit particle flow (issue 4 target: 1D, n = 4000, 200 steps < 1 min).

Prints a markdown table: wall time of the run, cost per step, Sinkhorn potential updates per
step (warm-started; the first, cold step in parentheses), and the ratio to the SoftMax-Gaussian
flow measured in the same run (the same layer without the Sinkhorn solve), plus the accuracy
of the full study (variance growth vs 2t). One timed run per row (the full study alone is
minutes long); rows print as they finish.

    python benchmarks/bench_heat.py            # n = 4000, 200 steps
    python benchmarks/bench_heat.py --quick    # n = 1000, 50 steps
    python benchmarks/bench_heat.py --mean-field   # the grid PDE (sinkflow.mean_field_flow) vs particles
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from sinkflow.heat._rescaled_flow import heat_trajectory, largest_safe_dt
from sinkflow.plots.heat import mixture_1d, mixture_2d


def run(x0, t, eps, dt, normalization, dtype, tol=None):
    x = torch.tensor(x0, dtype=dtype)
    t0 = time.perf_counter()
    res = heat_trajectory(x, [t], eps, dt, normalization, tol=tol)
    wall = time.perf_counter() - t0
    return wall, res


def _cells(density, axes):
    mesh = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(axes))
    rho = density.pdf(mesh).reshape([a.size for a in axes])
    return rho / (rho.sum() * np.prod([a[1] - a[0] for a in axes]))


def _step_costs(run_steps, k: int = 6, repeats: int = 3) -> tuple[float, float]:
    """(first step incl. setup, each further step) in ms: medians of ``run_steps(1)`` and ``run_steps(k)``."""
    from _timing import timed

    one = timed(lambda: run_steps(1), repeats)
    many = timed(lambda: run_steps(k), repeats)
    return one, (many - one) / (k - 1)


def mean_field_rows(eps: float) -> None:
    """The grid PDE against the particles it is the limit of, measured in the same run."""
    import sinkflow
    from sinkflow.heat import uniform_angles

    print("| run | size | steps | total s | first step ms (setup, cold Sinkhorn) | ms / further step | ratio |")
    print("|---|---|---|---|---|---|---|", flush=True)
    g1, g2 = mixture_1d(), mixture_2d()
    y = np.linspace(-8, 8, 1024)
    x0 = g1.sample(1000, seed=0)
    part, res = run(x0, 1.0, eps, largest_safe_dt(x0, eps), "sinkhorn", torch.float64)
    finals = {}
    for scheme, label in (("semi_lagrangian", "semi-Lagrangian, error control"), ("explicit", "Heun, CFL")):
        t0 = time.perf_counter()
        r = sinkflow.mean_field_flow(_cells(g1, [y]), y, [1.0], normalization="sinkhorn", eps=eps, scheme=scheme)
        pde = time.perf_counter() - t0
        finals[scheme] = r.final
        print(f"| mean field 1D to t = 1 ({label}) | 1,024 cells | {r.n_steps} | {pde:.2f} | - | "
              f"{1e3 * pde / r.n_steps:.1f} | {pde / part:.2f} x particles (total) |", flush=True)
    l1 = np.abs(finals["semi_lagrangian"] - finals["explicit"]).sum() * (y[1] - y[0])
    print(f"| heat_flow 1D to t = 1, dt = eps/2 | 1,000 particles | {res.n_steps} | {part:.2f} | - | "
          f"{1e3 * part / res.n_steps:.1f} | 1 (the two schemes' final densities differ by {l1:.1e} in L1) |",
          flush=True)
    a = np.linspace(-6, 6, 256)
    rho2, h2 = _cells(g2, [a, a]), 1e-3
    first2, next2 = _step_costs(lambda k: sinkflow.mean_field_flow(rho2, (a, a), [k * h2], normalization="sinkhorn",
                                                                   eps=eps, dt=h2))
    x2 = g2.sample(4000, seed=0)
    first_p, next_p = _step_costs(lambda k: heat_trajectory(x2, [k * eps / 2], eps, eps / 2))
    print(f"| mean field 2D | 256 x 256 cells | - | - | {first2:.0f} | {next2:.0f} | {next2 / next_p:.2f} x particles "
          "(per step) |")
    print(f"| heat_flow 2D, dt = eps/2 | 4,000 particles | - | - | {first_p:.0f} | {next_p:.0f} | 1 |", flush=True)
    th = uniform_angles(1024)
    rho_c = (1 + 1e-3 * np.cos(3 * th)) / (2 * np.pi)
    for norm in ("softmax", "sinkhorn"):
        for scheme in ("semi_lagrangian", "explicit"):
            n = sinkflow.mean_field_flow(rho_c, th, [0.05], normalization=norm, temperature=0.2, manifold="circle",
                                         scheme=scheme).n_steps
            first, each = _step_costs(lambda k, norm=norm, scheme=scheme: sinkflow.mean_field_flow(
                rho_c, th, [0.05 * k], normalization=norm, temperature=0.2, manifold="circle", scheme=scheme))
            print(f"| mean field circle {norm}, beta = 5, {scheme} | 1,024 angles | {n} per 0.05 | - | {first:.0f} | "
                  f"{each:.1f} per 0.05 of time | - |", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n = 1000, 50 steps")
    p.add_argument("--mean-field", action="store_true", help="the mean-field PDE rows (1D, 2D, circle) only")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; docs/performance.md: pin threads)")
    p.add_argument("--eps", type=float, default=0.05)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.mean_field:
        print(f"torch {torch.__version__}, threads = {torch.get_num_threads()}, eps = {args.eps}, Sinkhorn layer\n")
        mean_field_rows(args.eps)
        return 0
    n, steps, short = (1000, 50, 10) if args.quick else (4000, 200, 20)
    t = 0.5
    dt = t / steps
    g = mixture_1d()
    x0 = g.sample(n, seed=0)
    growth = 2 * t
    print(f"torch {torch.__version__}, threads = {torch.get_num_threads()}, n = {n}, eps = {args.eps}, dt = {dt:g}; "
          f"full study: {steps} steps to t = {t}; other rows: {short}-step runs; ms / step = total / steps\n")
    print("| flow | steps | total s | ms / step | Sinkhorn updates / step (first step) | ratio to SoftMax per step | "
          "var growth rel. err |")
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
