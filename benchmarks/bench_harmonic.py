"""One step of the attention flow on the circle and on S^2: the exact harmonic field against the block-wise one.

The field of ``simulate(manifold="sphere")`` with ``Q = K = V = I`` in float64, one thread, at a
uniform random configuration (the start of the clustering experiments), tolerance 1e-10:

- ``harmonic softmax``: :func:`sinkflow.particles.harmonic_attention_field` (the field ``simulate``
  chooses on its own there), one step = one field evaluation;
- ``harmonic sinkhorn``: one step inside a flow: the solve to 1e-10 warm-started from the scaling of
  the state one Euler step (h = 0.1) before, as ``simulate`` does;
- ``block-wise softmax``: :func:`sinkflow.particles.lazy_attention_field` (``n^2`` exponentials), measured
  up to n = 2*10^4 in the same run; above that its time is the measured one scaled by ``n^2`` (stated
  as such in the table: at n = 10^6 one pass is ~10^12 exponentials, hours on this machine).

Medians of ``--repeats`` runs, interleaved; prints a markdown table and the load average.
Run: ``OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/bench_harmonic.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os

import torch

import sinkflow
from sinkflow.particles import harmonic_attention_field, harmonic_kernel, lazy_attention_field
from _timing import timed


def _case(n, d, beta, repeats, reference_n):
    x = torch.tensor(sinkflow.random_particles(n, d, seed=0, manifold="sphere"))
    tau = 1 / beta
    kernel = harmonic_kernel(tau, d, 1e-10, 1 / n)
    prev = harmonic_attention_field(x, "sinkhorn", temperature=tau, kernel=kernel)
    v = prev.velocity - (prev.velocity * x).sum(1, keepdim=True) * x
    x_next = torch.nn.functional.normalize(x + 0.1 * v, dim=1)
    warm = harmonic_attention_field(x_next, "sinkhorn", temperature=tau, kernel=kernel, init_g=prev.g)
    soft = timed(lambda: harmonic_attention_field(x, "softmax", temperature=tau, kernel=kernel), repeats)
    sink = timed(lambda: harmonic_attention_field(x_next, "sinkhorn", temperature=tau, kernel=kernel, init_g=prev.g),
                 repeats)
    m = min(n, reference_n)
    xm = x[:m]
    block = timed(lambda: lazy_attention_field(xm, W=None, normalization="row", temperature=tau), 1) * (n / m) ** 2
    return dict(n=n, d=d, beta=beta, order=kernel.order, rank=kernel.rank, soft=soft, sink=sink, iters=warm.n_iter,
                block=block, measured=m == n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 2*10^4 only (seconds)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [(20_000, 2, 5.0), (20_000, 2, 32.0), (20_000, 3, 5.0)]
    if not args.quick:
        cases += [(1_000_000, 2, 5.0), (1_000_000, 2, 32.0), (100_000, 3, 5.0)]
    print(f"load average before: {os.getloadavg()}")
    print("| n | d | beta | order | rank | harmonic softmax (ms) | harmonic sinkhorn, warm (ms) | its kernel "
          "applications | sinkhorn / softmax | block-wise softmax (ms) | block-wise / harmonic |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n, d, beta in cases:
        r = _case(n, d, beta, args.repeats, reference_n=20_000)
        block = f"{r['block']:.0f}" + ("" if r["measured"] else " (n^2 from 2*10^4)")
        print(f"| {n:,} | {d} | {beta:g} | {r['order']} | {r['rank']} | {r['soft']:.1f} | {r['sink']:.1f} | "
              f"{r['iters']} | {r['sink'] / r['soft']:.1f}x | {block} | {r['block'] / r['soft']:.0f}x |", flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
