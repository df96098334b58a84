"""Per-step cost of :func:`sinkflow.simulate` against the plain torch loop of the same flow, at small n.

At n = 16-256 a step is a handful of small tensor operations: what a step costs beyond them is the
library's bookkeeping, paid on every frame of a teacher's slider. This script times, interleaved in
one process on one torch thread, ``simulate`` (torch input, monitors off, positions saved every step)
against the three-line loop a researcher would write, for

- SoftMax: ``x += h * softmax(beta x x^T) x``, then the projection on the circle;
- Sinkhorn(3): three log-domain half-iterations from zero (row, column, row), then the plan times x;
- Sinkhorn to tolerance: the same loop warm-started from the previous step's column potential,
  stopping on the row marginal error (after a column step) at the same tolerance;

on the circle (unit vectors in R^2) and in R^2, at n = 16, 64, 256, for one system and for an
ensemble of 8 systems (``simulate`` on a ``(8, n, 2)`` batch; the plain loop batched the same way).
It prints the median of the paired ratios (simulate / plain) and each side's time per step; with ``--min``,
each side's least-disturbed call (the minimum over the repeats) and the ratio of the two minima: on a loaded
shared machine the per-step overhead is what remains when nothing else ran, and a median of a few calls
swings by tens of percent there.

Measured on the shared 2-core machine (load 1.7-2.9), ``--min --repeats 15 --cases SoftMax "Sinkhorn(3)"``,
simulate / plain, before (the first round of issue 42 item 6) and after the lean Euler steps and the routing of
small SoftMax ensembles to the batched torch field, each run of the script in turn:

| case | space | systems | n = 16 | n = 64 | n = 256 |
|---|---|---|---|---|---|
| SoftMax | circle | 1 | 1.66x -> 1.27x | 1.34x -> 1.25x | 1.04x -> 1.02x |
| SoftMax | R^2 | 1 | 1.68x -> 1.23x | 1.45x -> 1.04x | 1.00x -> 1.00x |
| SoftMax | circle | 8 | 2.29x -> 1.17x | 1.61x -> 1.09x | 0.46x -> 0.83x |
| SoftMax | R^2 | 8 | 3.06x -> 1.12x | 2.25x -> 1.00x | 0.75x -> 0.94x |
| Sinkhorn(3) | circle | 1 | 0.88x -> 0.82x | 0.73x -> 0.82x | 0.87x -> 0.80x |
| Sinkhorn(3) | R^2 | 1 | 1.02x -> 0.96x | 0.89x -> 0.78x | 0.63x -> 0.53x |
| Sinkhorn(3) | circle | 8 | 1.29x -> 1.12x | 1.02x -> 0.93x | 0.70x -> 0.43x |
| Sinkhorn(3) | R^2 | 8 | 1.55x -> 1.40x | 0.84x -> 0.82x | 0.33x -> 0.44x |

Sinkhorn to tolerance (``--min --repeats 5 --steps 20 --sizes 16 64``, circle): 0.01-0.03x before and after (the
plain alternating loop takes 10-80 ms a step at 1e-10). What is left at 8 x 16 in R^2 for Sinkhorn(3) is the
batched symmetric solver's own passes; at n = 16 a call's checks and setup, about 0.2 ms, are a fifth of 50 steps.

Usage: ``python benchmarks/bench_step_overhead.py [--repeats 5] [--steps 50] [--sizes 16 64 256]
[--systems 1 8] [--cases SoftMax "Sinkhorn(3)" "Sinkhorn to tol"] [--min] [--baseline REV [--rounds N]]``; with
``--baseline`` (``benchmarks/_timing.py``) the runs alternate between this checkout and revision ``REV``
and compare the ``simulate`` rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from _timing import compare_revisions, record  # (benchmarks/_timing.py)

import sinkflow

BETA = 4.0
H = 0.05


def project(x, sphere):
    return x / x.norm(dim=-1, keepdim=True) if sphere else x


def plain_softmax(x, steps, sphere, tol=None):
    out = torch.empty((steps + 1, *x.shape), dtype=x.dtype)
    out[0] = x
    for k in range(steps):
        x = project(x + H * torch.softmax(BETA * x @ x.mT, -1) @ x, sphere)
        out[k + 1] = x
    return out


def _row(C, g):
    return -torch.logsumexp(C + g[..., None, :], -1)


def _column(C, f):
    return -torch.logsumexp(C + f[..., :, None], -2)


def plain_sinkhorn3(x, steps, sphere, tol=None):
    out = torch.empty((steps + 1, *x.shape), dtype=x.dtype)
    out[0] = x
    for k in range(steps):
        C = BETA * x @ x.mT
        f = _row(C, torch.zeros(x.shape[:-1], dtype=x.dtype))
        g = _column(C, f)
        f = _row(C, g)
        K = torch.exp(f[..., :, None] + C + g[..., None, :])
        x = project(x + H * K @ x, sphere)
        out[k + 1] = x
    return out


def plain_sinkhorn_tol(x, steps, sphere, tol):
    out = torch.empty((steps + 1, *x.shape), dtype=x.dtype)
    out[0] = x
    g = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for k in range(steps):
        C = BETA * x @ x.mT
        f = _row(C, g)
        while True:
            g = _column(C, f)
            rows = torch.exp(f[..., :, None] + C + g[..., None, :]).sum(-1)
            if float((rows - 1).abs().mean(-1).max()) <= tol:  # the L1 row error with weights 1/n
                break
            f = _row(C, g)
        K = torch.exp(f[..., :, None] + C + g[..., None, :])
        x = project(x + H * K @ x, sphere)
        out[k + 1] = x
    return out


CASES = {"SoftMax": (plain_softmax, dict(attention="softmax")),
         "Sinkhorn(3)": (plain_sinkhorn3, dict(attention="sinkhorn", n_iter=3)),
         "Sinkhorn to tol": (plain_sinkhorn_tol, dict(attention="sinkhorn"))}


def start(n, systems, sphere, seed=0):
    shape = (n, 2) if systems == 1 else (systems, n, 2)
    x = torch.as_tensor(np.random.default_rng(seed).standard_normal(shape))
    return project(x, sphere)


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None):
    argv = compare_revisions(__file__, argv)
    if argv is None:
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--systems", type=int, nargs="+", default=[1, 8])
    p.add_argument("--min", action="store_true",
                   help="report each side's minimum over the repeats and their ratio (least-disturbed calls)")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES),
                   help="flows to time (the plain loop to tolerance takes seconds a call at 1e-10)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tol = sinkflow.particles.default_tol(torch.float64)
    stat = "minima" if args.min else "medians"
    print(f"one torch thread, float64, beta = {BETA}, h = {H}, {args.steps} steps a call, {stat} of "
          f"{args.repeats} paired runs; tol = {tol:g}")
    print("| case | space | systems | n | simulate ms/step | plain ms/step | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name in args.cases:
        plain, kw = CASES[name]
        for sphere in (True, False):
            for systems in args.systems:
                for n in args.sizes:
                    x = start(n, systems, sphere)
                    manifold = "sphere" if sphere else "euclidean"

                    def ours(x=x, kw=kw, manifold=manifold):
                        return sinkflow.simulate(x, h=H, steps=args.steps, temperature=1 / BETA,
                                                 manifold=manifold, progress=False, **kw)

                    def theirs(x=x, plain=plain, sphere=sphere):
                        return plain(x, args.steps, sphere, tol)

                    ours(), theirs()  # warm-up
                    pairs = [(timed(ours), timed(theirs)) for _ in range(args.repeats)]
                    pick = min if args.min else statistics.median
                    a_ms = 1e3 * pick(a for a, _ in pairs) / args.steps
                    b_ms = 1e3 * pick(b for _, b in pairs) / args.steps
                    ratio = a_ms / b_ms if args.min else statistics.median(a / b for a, b in pairs)
                    record(f"{name}, {'circle' if sphere else 'R^2'}, {systems} x {n}: simulate ms/step", a_ms)
                    print(f"| {name} | {'circle' if sphere else 'R^2'} | {systems} | {n} | {a_ms:.3f} | "
                          f"{b_ms:.3f} | {ratio:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
