"""The callers of the one Sinkhorn solver, timed against another git revision, interleaved.

Each round runs every case once in a fresh process with this tree's ``sinkflow`` and once with
the package of ``--baseline REV`` (extracted with ``git archive``), alternating which goes first;
a case's time is the median of ``--repeats`` calls after one warm-up, and the table prints the
median over ``--rounds`` rounds, with the ratio now / before (below 1: faster). One torch thread.

Cases (torch float32 unless said): :func:`sinkflow.solve_sinkhorn` with a fixed ``n_iter`` (the
kernel-domain path, small and large, batched), under autograd with its backward (the unrolled
path), to tolerance (epsilon scaling, Newton steps; float32 and float64); :func:`sinkflow.sinkhorn`
at n = 16 (per-call overhead); :func:`sinkflow.particles.lazy_attention_field` (the block-wise
operator) with a fixed ``n_iter`` warm-started and to tolerance; :func:`sinkflow.heat.symmetric_sinkhorn_scaling`
(the heat grid fields' symmetric operator) on 400 cells, cold and warm-started. Usage:
``python benchmarks/bench_solver.py --baseline main [--rounds 3] [--repeats 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _cases(quick):
    import numpy as np
    import torch

    import sinkflow
    from sinkflow.heat import symmetric_sinkhorn_scaling
    from sinkflow.particles import lazy_attention_field

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


def worker(repeats, quick):
    import torch

    torch.set_num_threads(1)
    from _timing import timed

    import sinkflow

    out = {"file": sinkflow.__file__}
    for name, fn in _cases(quick).items():
        out[name] = timed(fn, repeats)  # ms, after one warm-up
    print(json.dumps(out))


def run(package, repeats, quick):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--worker", "--repeats", str(repeats)] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", metavar="REV", default="main", help="git revision to compare against")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="block-wise field at n = 1000 instead of 3000")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.repeats, args.quick)
    from bench_particles import baseline_package

    here, before = str(Path(__file__).resolve().parents[1]), baseline_package(args.baseline)
    times = {"now": [], "before": []}
    for k in range(args.rounds):
        order = [("now", here), ("before", before)]
        for label, package in order if k % 2 == 0 else order[::-1]:
            times[label].append(run(package, args.repeats, args.quick))
    print(f"load average: {os.getloadavg()}; now: {times['now'][0]['file']}, before: {args.baseline}")
    print(f"| case | now (ms) | before, {args.baseline} (ms) | now / before |")
    print("|---|---|---|---|")
    for name in times["now"][0]:
        if name == "file":
            continue
        now = statistics.median(r[name] for r in times["now"])
        old = statistics.median(r[name] for r in times["before"])
        print(f"| {name} | {now:.3g} | {old:.3g} | {now / old:.2f} |")


if __name__ == "__main__":
    main()
