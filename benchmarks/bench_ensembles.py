"""Particle flows at small n and in ensembles: Sinkhorn against SoftMax, one system against a batch.

Two tables, one torch / BLAS thread, float64, ``temperature = 0.2``, ``h = 0.05`` (the issue's
setting), medians over ``--repeats`` interleaved runs, every ratio against a reference measured in
the same run:

1. ``small n``: ms per step of :func:`sinkflow.simulate` with SoftMax, Sinkhorn to tolerance
   (1e-10) and Sinkhorn with ``n_iter=3``, on the circle (``manifold="sphere"``, d = 2) and in
   R^2, n = 16, 64, 256, 1024; and the same Sinkhorn flow through the general solver (the path
   every flow took before the symmetric solver, ``before``).
2. ``ensembles``: 2,048 systems of n = 32 in one call; the cost per system-step against the
   single-system step of the same attention, and against the batch's exponential floor (one
   ``exp`` of the ``2048 x 32 x 32`` scores per field evaluation, timed alone: one Euler step
   evaluates the field once, and both SoftMax and Sinkhorn need the exponentials of all the
   scores at least once).

Targets (issue 28): Sinkhorn to tolerance <= 2x SoftMax and ``n_iter=3`` <= 1.5x per step;
per system-step <= 1/20 (SoftMax) and 1/10 (Sinkhorn) of a single-system step, <= 3x the floor.
Usage: ``python benchmarks/bench_ensembles.py [--quick] [--repeats R] [--ensembles-only]``.
"""

from __future__ import annotations

import argparse
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import statistics  # noqa: E402
import time  # noqa: E402
from unittest import mock  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sinkflow  # noqa: E402

TAU, H = 0.2, 0.05
#: The clock: CPU time of this (single-threaded) process by default, which other processes on a
#: loaded machine disturb far less than wall time (``--clock wall`` for wall time).
CLOCK = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCK["cpu"]


def _x0(n, manifold, systems=None, seed=0):
    shape = (n, 2) if systems is None else (systems, n, 2)
    x = np.random.default_rng(seed).standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True) if manifold == "sphere" else x


def _per_step(x0, attention, steps, manifold, **kwargs):
    """Wall time per step (ms) of one simulate call of ``steps`` steps (its setup and cold first step included)."""
    t0 = clock()
    sinkflow.simulate(x0, attention, h=H, steps=steps, manifold=manifold, temperature=TAU, **kwargs)
    return 1e3 * (clock() - t0) / steps


def _general_solver():
    """Every flow through the general Sinkhorn solver (the path before the symmetric one)."""
    return mock.patch("sinkflow.particles._simulate._symmetric_psd", lambda W: False)


def small_n(sizes, repeats, steps):
    print("| manifold | n | SoftMax ms | Sinkhorn tol ms (x SoftMax) | Sinkhorn(3) ms (x) | before: tol ms (x) | before: (3) ms (x) |")
    print("|---|---|---|---|---|---|---|")
    for manifold in ("sphere", "euclidean"):
        for n in sizes:
            # R^2 flows spread like e^t (W_V = I): t <= 2 keeps their scores O(100 / temperature)
            x0, k = _x0(n, manifold), max(10, steps // max(1, n // 64))
            k = k if manifold == "sphere" else min(k, 40)
            runs = {key: [] for key in ("soft", "tol", "three", "tol_before", "three_before")}
            for _ in range(repeats):  # interleaved
                runs["soft"].append(_per_step(x0, "softmax", k, manifold))
                runs["tol"].append(_per_step(x0, "sinkhorn", k, manifold))
                runs["three"].append(_per_step(x0, "sinkhorn", k, manifold, n_iter=3))
                with _general_solver():
                    runs["tol_before"].append(_per_step(x0, "sinkhorn", k, manifold))
                    runs["three_before"].append(_per_step(x0, "sinkhorn", k, manifold, n_iter=3))
            m = {key: statistics.median(v) for key, v in runs.items()}
            cell = lambda key: f"{m[key]:.3f} ({m[key] / m['soft']:.2f}x)"
            print(f"| {manifold} | {n} | {m['soft']:.3f} | {cell('tol')} | {cell('three')} | {cell('tol_before')} "
                  f"| {cell('three_before')} |", flush=True)


def _exp_floor(systems, n, repeats):
    C = torch.randn(systems, n, n, dtype=torch.float64)
    times = []
    for _ in range(repeats + 1):
        t0 = clock()
        torch.exp(C)
        times.append(clock() - t0)
    return 1e3 * statistics.median(times[1:])


def ensembles(systems, n, repeats, steps):
    print(f"\n| manifold | attention | single ms/step | batch of {systems} ms/step | per system-step (x single) "
          "| batch / exp floor |")
    print("|---|---|---|---|---|---|")
    for manifold in ("sphere", "euclidean"):
        for attention in ("softmax", "sinkhorn"):
            single, batch, floor = [], [], []
            for _ in range(repeats):
                single.append(_per_step(_x0(n, manifold), attention, 4 * steps, manifold))
                batch.append(_per_step(_x0(n, manifold, systems), attention, steps, manifold))
                floor.append(_exp_floor(systems, n, 3))
            s, b, f = (statistics.median(v) for v in (single, batch, floor))
            print(f"| {manifold} | {attention} | {s:.3f} | {b:.1f} | 1/{s / (b / systems):.0f} | {b / f:.2f}x |",
                  flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 16, 64; 256 systems; fewer steps")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ensembles-only", action="store_true", help="only the second table")
    parser.add_argument("--clock", choices=sorted(CLOCK), default="cpu", help="CPU time (default) or wall time")
    args = parser.parse_args()
    global clock
    clock = CLOCK[args.clock]
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, float64, {args.clock} time, load average {os.getloadavg()[0]:.1f}\n")
    if not args.ensembles_only:
        small_n([16, 64] if args.quick else [16, 64, 256, 1024], args.repeats, 40 if args.quick else 200)
    ensembles(256 if args.quick else 2048, 32, args.repeats, 3 if args.quick else 10)


if __name__ == "__main__":
    main()
