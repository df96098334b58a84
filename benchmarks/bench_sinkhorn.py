"""Sinkhorn speed against POT, measured side by side in one run.

Prints markdown tables:

1. median ms per solve of 20 half-iterations (= 10 POT iterations) and per half-iteration,
   for n in {256, 1024, 4096}, d in {2, 64}, moderate and cold temperature, for
   sinkflow (torch float32) and POT's ``sinkhorn_log`` (numpy float64 and torch float32) and
   kernel-domain ``sinkhorn`` (torch float32), with ratios to sinkflow;
2. run-to-tolerance half-iteration counts, accelerated (epsilon scaling + over-relaxation)
   against the plain alternating loop, on 40 x 40 Gaussian scores;
3. peak extra memory of one float32 solve at n = 4096, in units of n x n buffers.

Cost C_ij = |x_i - y_j|^2, scores -C / eps with eps = T x median(C); T = 1 (moderate) and
T = 0.01 (cold, as in docs/performance.md). One torch thread; medians of ``--repeats`` runs
after a warm-up. Usage: ``python benchmarks/bench_sinkhorn.py [--quick]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import warnings

import numpy as np
import ot
import torch

import sinkflow
from _timing import timed  # benchmarks/_timing.py


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
                res["sinkflow torch f32"] = timed(lambda: sinkflow.sinkhorn(scores32, n_iter=half_iterations), repeats)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res["POT torch log f32"] = timed(
                        lambda: ot.bregman.sinkhorn_log(a32, a32, M32, 1.0, numItermax=full, stopThr=0.0), repeats)
                    res["POT torch kernel f32"] = timed(
                        lambda: ot.sinkhorn(a32, a32, M32, 1.0, numItermax=full, stopThr=0.0), repeats)
                    if n <= 1024 or repeats <= 3:
                        res["POT numpy log f64"] = timed(
                            lambda: ot.bregman.sinkhorn_log(a, a, M, 1.0, numItermax=full, stopThr=0.0),
                            max(1, min(repeats, 3)))
                rows.append((n, d, label, res))
    return rows


def print_speed(rows, half_iterations):
    cols = ["sinkflow torch f32", "POT torch log f32", "POT torch kernel f32", "POT numpy log f64"]
    print(f"\n### {half_iterations} half-iterations: median ms per solve (ms per half-iteration), ratio = other / sinkflow\n")
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
    p.add_argument("--quick", action="store_true", help="n in {256, 1024}, 3 repeats")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    sizes = (256, 1024) if args.quick else (256, 1024, 4096)
    repeats = 3 if args.quick else args.repeats
    print(f"sinkflow {sinkflow.__version__}, POT {ot.__version__}, torch {torch.__version__}, "
          f"numpy {np.__version__}; torch threads = {torch.get_num_threads()}; medians of {repeats}")
    print_speed(speed_table(sizes, (2, 64), repeats), 20)
    iteration_table(budget=20_000 if args.quick else 100_000)
    memory_row(4096)


if __name__ == "__main__":
    main()
