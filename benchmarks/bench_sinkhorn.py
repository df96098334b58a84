"""Sinkhorn speed against POT, measured side by side in one run.

Prints markdown tables:

1. median ms per solve of 20 half-iterations (= 10 POT iterations) and per half-iteration,
   for n in {256, 1024, 4096}, d in {2, 64}, moderate and cold temperature, for
   sinkflow (torch float32) and POT's ``sinkhorn_log`` (numpy float64 and torch float32) and
   kernel-domain ``sinkhorn`` (torch float32), with ratios to sinkflow;
2. run-to-tolerance half-iteration counts, accelerated (epsilon scaling + over-relaxation)
   against the plain alternating loop, on 40 x 40 Gaussian scores;
3. run to the default tolerance in float32 against float64 (128 x 128 and a batch
   8 x 4 x 256 x 256): the float32 time must stay within 3x the float64 time;
4. POT's cold 1D test problem (two Gaussian histograms on n bins, squared-distance cost,
   ``reg = 1e-3``): time to marginal error 1e-6 for sinkflow against POT's
   ``sinkhorn_epsilon_scaling`` and ``sinkhorn_log`` (numpy float64, capped), with iteration
   counts and the error each reached (measured here, from the returned plans);
5. peak extra memory of one float32 solve at n = 4096, in units of n x n buffers;
6. (``floor``) 100 iterations at n = 1,024 and 4,096, float32 and float64, scores x1 and x10,
   against the kernel-domain floor (one exponential, then matrix-vector products), the
   materialized loop used before, and POT's log-stable ``sinkhorn_stabilized``, interleaved.

Cost C_ij = |x_i - y_j|^2, scores -C / eps with eps = T x median(C); T = 1 (moderate) and
T = 0.01 (cold, as in docs/performance.md). One torch thread; medians of ``--repeats`` runs
after a warm-up. Usage: ``python benchmarks/bench_sinkhorn.py [--quick]``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import ot
import torch
from _timing import timed  # benchmarks/_timing.py

import sinkflow


def problem(n, d, temperature, seed=0):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    cost = ot.dist(x, y)
    return cost / (temperature * np.median(cost))


def speed_table(sizes, dims, repeats, half_iterations=20):
    rows = []
    full = half_iterations // 2
    for n in sizes:
        a = np.full(n, 1.0 / n)
        for d in dims:
            for label, temperature in (("moderate", 1.0), ("cold", 0.01)):
                M = problem(n, d, temperature)
                scores32 = torch.tensor(-M, dtype=torch.float32)
                M32 = torch.tensor(M, dtype=torch.float32)
                a32 = torch.tensor(a, dtype=torch.float32)
                res = {}
                res["sinkflow torch f32"] = timed(
                    functools.partial(sinkflow.sinkhorn, scores32, n_iter=half_iterations), repeats)
                pot = {"numItermax": full, "stopThr": 0.0}
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res["POT torch log f32"] = timed(
                        functools.partial(ot.bregman.sinkhorn_log, a32, a32, M32, 1.0, **pot), repeats)
                    res["POT torch kernel f32"] = timed(
                        functools.partial(ot.sinkhorn, a32, a32, M32, 1.0, **pot), repeats)
                    if n <= 1024 or repeats <= 3:
                        res["POT numpy log f64"] = timed(
                            functools.partial(ot.bregman.sinkhorn_log, a, a, M, 1.0, **pot), max(1, min(repeats, 3)))
                rows.append((n, d, label, res))
    return rows


def print_speed(rows, half_iterations):
    cols = ["sinkflow torch f32", "POT torch log f32", "POT torch kernel f32", "POT numpy log f64"]
    print(f"\n### {half_iterations} half-iterations: median ms per solve (ms per half-iteration), ratio = other / "
          "sinkflow\n")
    print("| n | d | temperature | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for n, d, label, res in rows:
        base = res["sinkflow torch f32"]
        cells = []
        for c in cols:
            if c not in res:
                cells.append("-")
                continue
            t = res[c]
            ratio = "" if c == cols[0] else f", x{t / base:.2f}"
            cells.append(f"{t:.1f} ({t / half_iterations:.2f}{ratio})")
        print(f"| {n} | {d} | {label} | " + " | ".join(cells) + " |")


def kernel_floor(C, iterations):
    """The kernel-domain floor: one exponential (clamped, no subnormals), then 2 products per iteration."""
    n, m = C.shape
    K = (C - C.amax()).clamp_min_(math.log(torch.finfo(C.dtype).tiny) + 1.0).exp_()
    a = torch.full((n,), 1.0 / n, dtype=C.dtype)
    b = torch.full((m,), 1.0 / m, dtype=C.dtype)
    v = torch.ones(m, dtype=C.dtype)
    for _ in range(iterations):
        u = 1.0 / torch.mv(K, v)
        v = b / torch.mv(K.T, a * u)
    return u, v


def floor_table(sizes, repeats, iterations=100):
    """Fixed-count Sinkhorn against the kernel-domain floor and POT's sinkhorn_stabilized, interleaved."""
    import sinkflow.attention._operators as steps

    print(f"\n### {iterations} iterations ({2 * iterations} half-iterations), scores -|x_i - y_j|^2 / 2 (x factor) "
          "of standard normal points in 2D: median ms, ratio to the kernel-domain floor\n")
    print("Rounds interleave the four; 'materialized' is the loop used before (now the autograd path).\n")
    print("| n | dtype | factor | floor | sinkflow | materialized | POT sinkhorn_stabilized (numpy) |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(n, 2)), rng.normal(size=(n, 2))
        for dtype in (torch.float32, torch.float64):
            for factor in (1.0, 10.0):
                S = -factor * 0.5 * ot.dist(x, y)
                C = torch.tensor(S, dtype=dtype)
                M, w = (-S).astype(C.numpy().dtype), np.full(n, 1.0 / n, dtype=C.numpy().dtype)

                def materialized(C=C):
                    steps._KERNEL_DOMAIN = False
                    try:
                        sinkflow.sinkhorn(C, n_iter=2 * iterations)
                    finally:
                        steps._KERNEL_DOMAIN = True

                runs = {"floor": functools.partial(kernel_floor, C, iterations),
                        "sinkflow": functools.partial(sinkflow.sinkhorn, C, n_iter=2 * iterations),
                        "materialized": materialized,
                        "POT": functools.partial(ot.bregman.sinkhorn_stabilized, w, w, M, 1.0, numItermax=iterations,
                                                 stopThr=0.0)}
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t = interleaved(runs, repeats)
                cells = [f"{t['floor']:.1f}"] + [f"{t[k]:.1f} (x{t[k] / t['floor']:.2f})" for k in list(runs)[1:]]
                print(f"| {n} | {str(dtype)[6:]} | x{factor:g} | " + " | ".join(cells) + " |", flush=True)


def interleaved(runs, repeats):
    """Median ms of each callable, timed in rounds (one of each per round) after one warm-up each."""
    times = {k: [] for k in runs}
    for fn in runs.values():
        fn()
    for _ in range(repeats):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(1e3 * (time.perf_counter() - t0))
    return {k: float(np.median(v)) for k, v in times.items()}


def iteration_table(n=40, tol=1e-9, budget=100_000):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, 2)), rng.normal(size=(n, 2))
    base = sinkflow.gaussian_scores(x, y)
    print(f"\n### Run to tolerance {tol:g}, {n} x {n} Gaussian scores (float64): half-iterations\n")
    print("| score factor | accelerated | converged | plain loop | converged | max |K_acc - K_plain| |")
    print("|---|---|---|---|---|---|")
    for factor in (1, 10, 30, 1000):
        C = factor * base
        t0 = time.perf_counter()
        fast = sinkflow.solve_sinkhorn(C, tol=tol, max_iter=budget, warn=False)
        t_fast = time.perf_counter() - t0
        t0 = time.perf_counter()
        plain = sinkflow.solve_sinkhorn(C, tol=tol, max_iter=budget, epsilon_scaling=False, warn=False)
        t_plain = time.perf_counter() - t0
        diff = np.abs(fast.attention - plain.attention).max()
        print(f"| x{factor} | {fast.n_iter} ({t_fast:.2f} s, err {fast.marginal_error:.1e}) | {fast.converged} | "
              f"{plain.n_iter} ({t_plain:.2f} s, err {plain.marginal_error:.1e}) | {plain.converged} | {diff:.1e} |")


def precision_table(repeats):
    """Run-to-default-tolerance time, float32 against float64 (same scores)."""
    gen = torch.Generator().manual_seed(0)
    print("\n### Run to the default tolerance: float32 against float64 (ms, half-iterations)\n")
    print("| shape | float64 | float32 | float32 / float64 | float32 converged | float32 error |")
    print("|---|---|---|---|---|---|")
    for shape in ((128, 128), (8, 4, 256, 256)):
        C64 = torch.randn(*shape, generator=gen, dtype=torch.float64)
        C32 = C64.float()
        runs = {}
        for name, C in (("f64", C64), ("f32", C32)):
            res = sinkflow.solve_sinkhorn(C)
            runs[name] = (timed(lambda C=C: sinkflow.solve_sinkhorn(C), repeats), res)
        (t64, r64), (t32, r32) = runs["f64"], runs["f32"]
        print(f"| {' x '.join(map(str, shape))} | {t64:.1f} ({r64.n_iter}) | {t32:.1f} ({r32.n_iter}) | "
              f"x{t32 / t64:.2f} | {r32.converged} | {r32.marginal_error:.1e} |")


def pot_cold_problem(n):
    """POT's 1D test problem on n bins (the 100-bin shape, bins of width 100 / n)."""
    a = ot.datasets.make_1D_gauss(n, m=0.3 * n, s=0.1 * n)
    b = ot.datasets.make_1D_gauss(n, m=0.4 * n, s=0.1 * n)
    return a, b, ot.utils.dist0(n) / (n / 100) ** 2


def plan_error(plan, a, b):
    return max(np.abs(plan.sum(1) - a).sum(), np.abs(plan.sum(0) - b).sum())


def cold_table(sizes, reg=1e-3, tol=1e-6, pot_seconds=60.0):
    print(f"\n### Cold 1D problem, reg = {reg:g}: time to marginal error {tol:g} (float64, 1 thread)\n")
    print(f"Each POT solver runs in a child process killed after {pot_seconds:.0f} s; 'err' is measured here "
          "from the returned plan, as max(|plan 1 - a|_1, |plan^T 1 - b|_1).\n")
    print("| n | sinkflow | POT sinkhorn_epsilon_scaling | POT sinkhorn_log | sinkflow cost rel. to emd2 |")
    print("|---|---|---|---|---|")
    for n in sizes:
        a, b, M = pot_cold_problem(n)
        t0 = time.perf_counter()
        res = sinkflow.solve_sinkhorn(-M / reg, a=a, b=b, tol=tol, warn=False)
        t_sf = time.perf_counter() - t0
        newton = len(res.errors) - res.n_iter
        cost_rel = abs(float((res.plan * M).sum()) / ot.emd2(a, b, M, numItermax=10_000_000) - 1)
        cells = [f"{t_sf:.2f} s ({res.n_iter} half-its + {newton} Newton, err {plan_error(res.plan, a, b):.1e})"]
        for solver in ("sinkhorn_epsilon_scaling", "sinkhorn_log"):
            cells.append(_pot_cell(solver, n, reg, tol, pot_seconds, t_sf))
        print(f"| {n} | " + " | ".join(cells) + f" | {cost_rel:.1e} |")


_POT_CHILD = """
import sys, time, warnings, numpy as np, ot
sys.path.insert(0, "benchmarks")
from bench_sinkhorn import pot_cold_problem, plan_error
solver, n, reg, tol = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
a, b, M = pot_cold_problem(n)
warnings.simplefilter("ignore")
t0 = time.perf_counter()
plan, log = getattr(ot.bregman, solver)(a, b, M, reg, numItermax=100_000, stopThr=tol, log=True)
print(time.perf_counter() - t0, plan_error(plan, a, b), log.get("niter", log.get("n_iter", -1)))
"""


def _pot_cell(solver, n, reg, tol, seconds, t_ref):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        out = subprocess.run([sys.executable, "-c", _POT_CHILD, solver, str(n), str(reg), str(tol)],
                             capture_output=True, text=True, timeout=seconds, env=env, check=True)
    except subprocess.TimeoutExpired:
        return f"> {seconds:.0f} s (killed; x > {seconds / t_ref:.0f})"
    t, err, iters = out.stdout.split()
    reached = "reached" if float(err) <= tol else "NOT reached"
    return f"{float(t):.2f} s ({iters} its, err {float(err):.1e}, {reached}; x{float(t) / t_ref:.1f})"


_MEMORY_CHILD = """
import sys, threading, time, psutil, torch, sinkflow
torch.set_num_threads(1)
n = int(sys.argv[1])
torch.manual_seed(0)
C = torch.rand(n, n, dtype=torch.float32).mul_(-10.0)  # scores built in place: no temporaries
sinkflow.sinkhorn(C[:8, :8], n_iter=4)
proc = psutil.Process()
base = proc.memory_info().rss
peak = [base]
done = threading.Event()
def sample():  # resident memory every 0.5 ms (ru_maxrss would report the import-time peak)
    while not done.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.0005)
t = threading.Thread(target=sample)
t.start()
K = sinkflow.sinkhorn(C, n_iter=20)
peak[0] = max(peak[0], proc.memory_info().rss)
done.set()
t.join()
print((peak[0] - base) / (n * n * 4))
"""


def memory_row(n=4096):
    out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(n)], capture_output=True, text=True, check=True)
    buffers = float(out.stdout.strip())
    print(f"\n### Memory: one float32 solve (20 half-iterations) at n = {n}: peak RSS growth = "
          f"{buffers:.2f} n x n float32 buffers beyond the scores (target <= 2; the result itself is one)\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="n in {256, 1024}, 3 repeats, cold problem n <= 1000")
    p.add_argument("--only", choices=["speed", "floor", "iterations", "precision", "cold", "memory"], nargs="*",
                   help="run only these tables")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    sizes = (256, 1024) if args.quick else (256, 1024, 4096)
    repeats = 3 if args.quick else args.repeats
    print(f"sinkflow {sinkflow.__version__}, POT {ot.__version__}, torch {torch.__version__}, "
          f"numpy {np.__version__}; torch threads = {torch.get_num_threads()}; medians of {repeats}")
    tables = {
        "speed": lambda: print_speed(speed_table(sizes, (2, 64), repeats), 20),
        "floor": lambda: floor_table((1024,) if args.quick else (1024, 4096), repeats),
        "iterations": lambda: iteration_table(budget=20_000 if args.quick else 100_000),
        "precision": lambda: precision_table(repeats),
        "cold": lambda: cold_table((100, 1000) if args.quick else (100, 1000, 4000),
                                   pot_seconds=20.0 if args.quick else 60.0),
        "memory": lambda: memory_row(4096),
    }
    for name, table in tables.items():
        if not args.only or name in args.only:
            table()


if __name__ == "__main__":
    main()
