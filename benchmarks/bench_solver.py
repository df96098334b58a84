"""The callers of the one Sinkhorn solver, timed against another git revision, interleaved.

Prints the median CPU time (one thread) of each case over ``--repeats`` calls after one warm-up. With
``--baseline REV [--rounds N]`` (``benchmarks/_timing.py``) the whole run alternates between this
checkout's ``sinkflow`` and the package of git revision ``REV``, and prints each case's medians and
their ratio (below 1: faster now).

Cases (torch float32 unless said): :func:`sinkflow.solve_sinkhorn` with a fixed ``n_iter`` (the
kernel-domain path, small and large, batched), under autograd with its backward (the unrolled
path), to tolerance (epsilon scaling, Newton steps; float32 and float64); :func:`sinkflow.sinkhorn`
at n = 16 (per-call overhead); :func:`sinkflow.particles.lazy_attention_field` (the block-wise
operator) with a fixed ``n_iter`` warm-started and to tolerance; :func:`sinkflow.heat.symmetric_sinkhorn_scaling`
(the heat grid fields' symmetric operator) on 400 cells, cold and warm-started. Usage:
``python benchmarks/bench_solver.py [--quick] [--repeats 5] [--baseline REV [--rounds 3]]``.

Measured when the solver landed (``--baseline abf0ea1 --rounds 3 --repeats 7``, the revision before it;
shared 2-core machine, load average 1.3-1.6), CPU ms now / before: ``sinkhorn`` 16 x 16 n_iter=3 0.43 / 0.42;
``solve_sinkhorn`` 16 x 16 n_iter=10 0.75 / 0.69, 8 x 256 x 256 6.06 / 5.94, 1024 x 1024 cold 5.98 / 5.70,
with backward 4.66 / 4.55, to tolerance 5.35 / 5.28 (float32) and 21.4 / 20.3 (float64);
``lazy_attention_field`` n = 3000 182 / 195 (n_iter=10) and 177 / 197 (to tolerance); the grid's symmetric
solve 1.20 / 1.36 (cold) and 0.31 / 0.40 (warm). An earlier run at load 2.8-3.5 gave 1.00-1.08x for every
row but the grid's (1.18x cold, 1.14x warm, before its plain stop test read the error alone): rows within
10% move by that much from run to run here.
"""

from __future__ import annotations

import argparse
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _timing import compare_revisions, record  # noqa: E402  (benchmarks/_timing.py)

import sinkflow  # noqa: E402
from sinkflow.heat import symmetric_sinkhorn_scaling  # noqa: E402
from sinkflow.particles import lazy_attention_field  # noqa: E402


def _cases(quick):
    gen = torch.Generator().manual_seed(0)

    def gaussian(n, temperature, dtype=torch.float32, batch=()):
        x = torch.randn(*batch, n, 2, generator=gen, dtype=torch.float64)
        D = torch.cdist(x, x) ** 2
        return (-D / (temperature * D.median())).to(dtype)

    S16 = torch.randn(16, 16, generator=gen)
    S256 = torch.randn(8, 256, 256, generator=gen)
    S1024 = gaussian(1024, 0.1)
    G = torch.randn(4, 128, 128, generator=gen, requires_grad=True)
    T256 = gaussian(256, 0.05)
    T64 = gaussian(256, 0.05, torch.float64)
    n_field = 1000 if quick else 3000
    x = np.random.default_rng(0).normal(size=(n_field, 2)).astype(np.float32)
    xt = torch.tensor(x)
    W = torch.eye(2) / 2
    g0 = lazy_attention_field(xt, W=W, n_iter=4).g

    y = torch.linspace(-4, 4, 400, dtype=torch.float64)
    Kg = torch.exp(-(y[:, None] - y[None]) ** 2 / 0.05)
    wg = torch.exp(-(y**2) / 2)
    wg = wg / wg.sum()
    s_warm = symmetric_sinkhorn_scaling(lambda v: Kg @ v, wg, tol=1e-9)[0]

    def backward():
        sinkflow.solve_sinkhorn(G, n_iter=10).attention.square().sum().backward()

    return {
        "sinkhorn 16x16, n_iter=3": lambda: sinkflow.sinkhorn(S16, n_iter=3),
        "solve_sinkhorn 16x16, n_iter=10": lambda: sinkflow.solve_sinkhorn(S16, n_iter=10),
        "solve_sinkhorn 8x256x256, n_iter=10": lambda: sinkflow.solve_sinkhorn(S256, n_iter=10),
        "solve_sinkhorn 1024x1024 cold, n_iter=20": lambda: sinkflow.solve_sinkhorn(S1024, n_iter=20),
        "solve_sinkhorn 4x128x128 + backward, n_iter=10": backward,
        "solve_sinkhorn 256x256 cold, to tol (float32)": lambda: sinkflow.solve_sinkhorn(T256, warn=False),
        "solve_sinkhorn 256x256 cold, to tol (float64)": lambda: sinkflow.solve_sinkhorn(T64, warn=False),
        f"lazy_attention_field n={n_field}, n_iter=10 warm": lambda: lazy_attention_field(xt, W=W, n_iter=10,
                                                                                          init_g=g0),
        f"lazy_attention_field n={n_field}, to tol 1e-5": lambda: lazy_attention_field(xt, W=W, tol=1e-5),
        "symmetric_sinkhorn_scaling 400 cells, cold, tol 1e-10": lambda: symmetric_sinkhorn_scaling(
            lambda v: Kg @ v, wg, tol=1e-10),
        "symmetric_sinkhorn_scaling 400 cells, warm, tol 1e-10": lambda: symmetric_sinkhorn_scaling(
            lambda v: Kg @ v, wg, s_warm, tol=1e-10),
    }


def cpu_ms(fn, repeats):
    """Median CPU time of ``fn()`` in ms over ``repeats`` runs, after one warm-up (one thread: CPU time is
    what a loaded machine disturbs least)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return 1e3 * statistics.median(times)


def main():
    argv = compare_revisions(__file__)
    if argv is None:
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="block-wise field at n = 1000 instead of 3000")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"sinkflow: {sinkflow.__file__}; load average {os.getloadavg()[0]:.1f}\n")
    print("| case | CPU ms |\n|---|---|")
    for name, fn in _cases(args.quick).items():
        print(f"| {name} | {record(name + ': CPU ms', cpu_ms(fn, args.repeats)):.4g} |", flush=True)


if __name__ == "__main__":
    main()
