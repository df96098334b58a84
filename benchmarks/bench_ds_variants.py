"""Measurements of the doubly stochastic variants (docs/theory/doubly_stochastic_variants.md).

Row and column errors per variant and dtype, permutation equivariance, the cost of one head at
n = 1,024 (median of interleaved repeats, one thread), and the Jacobian asymmetry of their
particle fields. Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_ds_variants.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numpy as np
import torch

import sinkflow


def errors(K):
    K = K.detach().to(torch.float64)
    return float((K.sum(-1) - 1).abs().max()), float((K.sum(-2) - 1).abs().max())


def scores(n, p, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(n, p, generator=g, dtype=torch.float64) for _ in range(2))
    return (q @ k.T / math.sqrt(p)).to(dtype), q.to(dtype) / p**0.5, k.to(dtype) / p**0.5


def error_table(sizes):
    print("## row / column errors (scores q k^T / sqrt(p), q, k ~ N(0, I), p = 64)")
    for n in sizes:
        for dtype in (torch.float32, torch.float64):
            C, q, k = scores(n, 64, dtype)
            name = str(dtype).removeprefix("torch.")
            for method in sinkflow.ORTHOSTOCHASTIC_METHODS:
                r, c = errors(sinkflow.orthostochastic(C, method))
                print(f"orthostochastic {method:5s} n={n:5d} {name}: row {r:.1e} col {c:.1e}")
            tol = 1e-12 if dtype == torch.float64 else 1e-5
            r, c = errors(sinkflow.lot_attention(C, 16, tol=tol))
            print(f"lot r=16 tol={tol:.0e}      n={n:5d} {name}: row {r:.1e} col {c:.1e}")
            r3, c3 = errors(sinkflow.lot_attention(C, 16, n_iter=3))
            print(f"lot r=16 n_iter=3        n={n:5d} {name}: row {r3:.1e} col {c3:.1e}")
            if n <= 1024:
                for hard in (False, True):
                    r, c = errors(sinkflow.esp_plan(q[None, :, :16], k[None, :, :16], hard=hard))
                    print(f"esp {'hard' if hard else 'soft'} (16 slices)     n={n:5d} {name}: row {r:.1e} col {c:.1e}")


def equivariance():
    print("## permutation equivariance: max |K(P C P^T) - P K(C) P^T|, float64, n = 64")
    C, q, k = scores(64, 64, torch.float64, seed=1)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(2))
    for method in sinkflow.ORTHOSTOCHASTIC_METHODS:
        d = (sinkflow.orthostochastic(C[perm][:, perm], method) - sinkflow.orthostochastic(C, method)[perm][:, perm])
        print(f"orthostochastic {method}: {float(d.abs().max()):.1e}")
    d = (sinkflow.lot_attention(C[perm][:, perm], 16, tol=1e-12)
         - sinkflow.lot_attention(C, 16, tol=1e-12)[perm][:, perm])
    print(f"lot: {float(d.abs().max()):.1e}")
    d = sinkflow.esp_plan(q[perm], k[perm], hard=True) - sinkflow.esp_plan(q, k, hard=True)[perm][:, perm]
    print(f"esp hard: {float(d.abs().max()):.1e}")
    print("## rank-deficient scores (n = 64 > p = 8): polar factor of two SVD routes")
    C8, _, _ = scores(64, 8, torch.float64, seed=3)
    d = (sinkflow.orthostochastic(C8[perm][:, perm], "polar") - sinkflow.orthostochastic(C8, "polar")[perm][:, perm])
    print(f"polar, n = 64, p = 8: equivariance defect {float(d.abs().max()):.1e}")


def timings(n, repeats):
    print(f"## one head, n = {n}, p = 64, float32, {torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.2f}")
    C, q, k = scores(n, 64, torch.float32)
    cases = {
        "softmax": lambda: torch.softmax(C, -1),
        "sinkhorn n_iter=21": lambda: sinkflow.sinkhorn(C, 21),
        "orthostochastic skew": lambda: sinkflow.orthostochastic(C, "skew"),
        "orthostochastic polar": lambda: sinkflow.orthostochastic(C, "polar"),
        "orthostochastic qr": lambda: sinkflow.orthostochastic(C, "qr"),
        "lot r=16 n_iter=3": lambda: sinkflow.lot_attention(C, 16, n_iter=3),
        "esp soft (16 slices)": lambda: sinkflow.esp_plan(q[:, :16], k[:, :16]),
    }
    times = {name: [] for name in cases}
    for fn in cases.values():
        fn()
    for _ in range(repeats):  # interleaved
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    for name, t in times.items():
        print(f"{name:24s} {1e3 * statistics.median(t):8.1f} ms")


def esp_field_asymmetry(x, W):
    X = torch.as_tensor(x, dtype=torch.float64)
    Wt = torch.as_tensor(W, dtype=torch.float64)
    n, d = X.shape

    def T(z):
        z = z.reshape(n, d)
        return (sinkflow.esp_plan(z @ Wt, z) @ (z @ Wt)).reshape(-1)

    J = torch.autograd.functional.jacobian(T, X.reshape(-1))
    return float(torch.linalg.norm(J - J.T) / torch.linalg.norm(J))


def gradient_flows():
    print("## Jacobian asymmetry |J - J^T| / |J| of the particle field T(x_i) = sum_j K_ij W x_j (float64)")
    rng = np.random.default_rng(0)
    for n, d in ((6, 2), (12, 3), (24, 4)):
        x = rng.normal(size=(n, d))
        A = rng.normal(size=(d, d))
        W = A @ A.T / d + np.eye(d)
        row = [f"n={n:3d} d={d}"]
        for name in ("sinkhorn", "softmax", "orthostochastic", "orthostochastic_polar", "orthostochastic_qr", "lot"):
            row.append(f"{name} {sinkflow.jacobian_asymmetry(x, name, W):.1e}")
        row.append(f"esp(soft) {esp_field_asymmetry(x, W):.1e}")
        print("; ".join(row))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    error_table((64, 256) if args.quick else (64, 1024, 2048))
    equivariance()
    timings(256 if args.quick else 1024, 3 if args.quick else 7)
    gradient_flows()


if __name__ == "__main__":
    main()
