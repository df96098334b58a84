"""Skyformer's Nyström attention against exact kernelized attention, measured side by side.

Prints markdown tables:

1. torch CPU float32, head dimension p = 64, m = 128 landmarks: median ms and peak extra memory
   (MiB, measured in a fresh subprocess per cell as peak RSS minus RSS after the inputs exist) of
   exact kernelized attention C V and of Nyström attention C~ V (pinv and iterative inverse), for
   n in {1024, 4096, 16384} (plus 256, 512 and 2048 to locate the crossover), with ratios full / Nyström;
2. seconds for the exact float64 spectral error ||C - C~||_2 at n = 2048 (ARPACK on the n x n
   block), and with the lifted extreme eigenvalues (the Loewner checks, 2n x 2n).

One torch thread (reported); medians of ``--repeats`` runs after a warm-up.
Usage: ``python benchmarks/bench_nystrom.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os

# One BLAS thread for numpy/scipy too (docs/performance.md: spin-waiting threads on a shared machine).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _timing import timed  # noqa: E402  (benchmarks/_timing.py)

import sinkflow  # noqa: E402

P, M = 64, 128


def _inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Scale 0.5: the kernel is neither ~identity nor ~constant (docs/theory/nystrom.md figures).
    return tuple(0.5 * torch.randn(n, P, generator=g) for _ in range(3))


def _runner(method, n):
    Q, K, V = _inputs(n)
    idx = sinkflow.sample_landmarks(2 * n, M, generator=torch.Generator().manual_seed(1))
    if method == "full":
        return lambda: sinkflow.kernelized_attention(Q, K, V)
    inverse = "pinv" if method == "nystrom pinv" else "iterative"
    return lambda: sinkflow.nystrom_attention(Q, K, V, idx, inverse=inverse)


def _status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def single(method, n, repeats):
    """One cell, in its own process so that peak RSS belongs to it alone."""
    torch.set_num_threads(1)
    fn = _runner(method, n)
    fn()  # allocator warm-up outside the measured peak
    base = _status_mib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current RSS
        f.write("5")
    ms = timed(fn, repeats)
    print(json.dumps({"ms": ms, "mib": _status_mib("VmHWM") - base}))


def measure(method, n, repeats):
    # Every buffer >= 64 KiB gets its own mmap, returned on free: RSS then tracks live tensors.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, __file__, "--single", method, str(n), "--repeats", str(repeats)],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def speed_table(sizes, repeats):
    methods = ["full", "nystrom pinv", "nystrom iterative"]
    print(f"\n### Kernelized attention, torch CPU float32, p = {P}, m = {M}, threads = 1: "
          "median ms (peak extra MiB)\n")
    print("| n | full C V | Nyström pinv | Nyström iterative | speed-up pinv | speed-up iterative | memory ratio |")
    print("|---|---|---|---|---|---|---|")
    crossover = None
    for n in sizes:
        r = {m: measure(m, n, repeats if n < 16384 else max(1, repeats // 2)) for m in methods}
        f, a, b = r["full"], r["nystrom pinv"], r["nystrom iterative"]
        if crossover is None and min(a["ms"], b["ms"]) < f["ms"]:
            crossover = n
        print(f"| {n} | {f['ms']:.1f} ({f['mib']:.0f}) | {a['ms']:.1f} ({a['mib']:.0f}) | {b['ms']:.1f} "
              f"({b['mib']:.0f}) | {f['ms'] / a['ms']:.1f}x | {f['ms'] / b['ms']:.1f}x | "
              f"{f['mib'] / max(a['mib'], 1):.0f}x |",
              flush=True)
    print(f"\nNyström n x m buffer = {4 * 16384 * M / 2**20:.0f} MiB at n = 16384 (float32); full n x n = "
          f"{4 * 16384**2 / 2**20:.0f} MiB. Crossover: Nyström faster from n = {crossover} "
          f"(smallest measured size where it wins).")


def spectral_table(n, repeats):
    rng = np.random.default_rng(0)
    Q, K = 0.5 * rng.standard_normal((2, n, P))
    print(f"\n### Exact spectral error at n = {n} (float64, p = {P}, m = {M}, threads = 1), seconds\n")
    print("| what | seconds |")
    print("|---|---|")
    X = np.concatenate([Q, K])
    t0 = time.perf_counter()
    C = sinkflow.kernelized_attention_matrix(Q, K)
    Ct = sinkflow.nystrom_matrix(Q, K, M, generator=0)
    err = sinkflow.spectral_norm(C - Ct, method="lanczos")
    t1 = time.perf_counter()
    dense = float(np.linalg.norm(C - Ct, 2))
    t2 = time.perf_counter()
    print(f"| ||C - C~||_2 = {err:.6g} (form C, C~; ARPACK svds) | {t1 - t0:.2f} |")
    print(f"| same by LAPACK SVD (= {dense:.6g}, rel. diff {abs(dense - err) / dense:.1e}) | {t2 - t1:.2f} |")
    t0 = time.perf_counter()
    res = sinkflow.nystrom_errors(Q, K, M, trials=1, seed=0)
    t1 = time.perf_counter()
    print(f"| nystrom_errors: ||C - C~||_2 and lambda_min/max(Cbar - Cbar~) (2n = {2 * n}) | {t1 - t0:.2f} |")
    t0 = time.perf_counter()
    chk = sinkflow.nystrom_check(Q, K, M, trials=1, seed=0)
    t1 = time.perf_counter()
    print(f"| nystrom_check, 1 draw (adds ||Cbar||, leverage scores by Cholesky: d_stat = {chk.d_stat:.1f}, "
          f"m required = {chk.m_required}) | {t1 - t0:.2f} |")
    del X, res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n in {256, 1024, 4096}, spectral error at n = 1024")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--single", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.single:
        return single(args.single[0], int(args.single[1]), args.repeats)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, threads = {torch.get_num_threads()}, sinkflow {sinkflow.__version__}")
    if args.quick:
        speed_table((256, 1024, 4096), min(args.repeats, 3))
        spectral_table(1024, 1)
    else:
        speed_table((256, 512, 1024, 2048, 4096, 16384), args.repeats)
        spectral_table(2048, 1)


if __name__ == "__main__":
    main()
