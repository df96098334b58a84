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

Usage: ``python benchmarks/bench_step_overhead.py [--repeats 5] [--steps 50] [--sizes 16 64 256]
[--systems 1 8] [--cases SoftMax "Sinkhorn(3)" "Sinkhorn to tol"] [--min]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

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
                    print(f"| {name} | {'circle' if sphere else 'R^2'} | {systems} | {n} | {a_ms:.3f} | "
                          f"{b_ms:.3f} | {ratio:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
