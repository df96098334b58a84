"""One step of the attention flow on the circle and on S^2: the exact harmonic field against the block-wise one.

The field of ``simulate(manifold="sphere")`` with ``Q = K = V = I`` in float64, one thread (torch's
and numpy's BLAS), at a uniform random configuration (the start of the clustering experiments),
tolerance 1e-10, and the targets of issue 30 beside it:

- ``SoftMax step``: :func:`sinkflow.particles.harmonic_attention_field` (the field ``simulate``
  chooses on its own there), one step = one field evaluation; target <= 50 ms at N = 2*10^4,
  <= 2 s at N = 10^6;
- ``Sinkhorn step``: one step inside a flow: eight Euler steps (h = 0.1) of the Sinkhorn flow from
  the uniform start, then the next evaluation of the field ``simulate`` builds, from copies of its
  state (the warm start extrapolated from the last three scalings, the solver's memory), with its
  kernel applications (the field's included); target <= 3x the SoftMax step (evaluated by the
  same kind of field at the same state);
- ``block-wise SoftMax``: :func:`sinkflow.particles.lazy_attention_field` (``n^2`` exponentials), measured
  at n = min(N, 2*10^4) in the same run and scaled by ``(N / n)^2`` above (stated as such: at
  N = 10^6 one pass is ~10^12 exponentials, hours on this machine).

CPU time of the process (one thread: the work of one core; on a shared machine the wall time is
longer by the waits for a core, printed beside it), minima of ``--repeats`` runs (2 at N = 10^6),
interleaved; targets and ratios on CPU time. Prints a markdown table and the load average. Rows:
N = 2*10^4 and (without ``--quick``) 10^6, beta = 5 and 32, on the circle and S^2 (about 4 minutes of CPU
for ``--manifold sphere``). The Sinkhorn step is timed inside a flow (a few Euler steps first).

Measured (merged code, CPU time, load 2.0-2.3; SoftMax / Sinkhorn to tolerance, ms, 3 kernel
applications each): circle 2*10^4 beta 5: 5.2 / 11.0 (2.1x), beta 32: 9.6 / 16.2 (1.7x); S^2 2*10^4
beta 5: 28.4 / 57.7 (2.0x), beta 32: 51.9 / 106 (2.0x; SoftMax at the 50 ms line); circle 10^6 beta 5:
189 / 346 (1.8x), beta 32: 428 / 661 (1.5x); S^2 10^6 beta 5: 965 / 2,089 (2.2x), beta 32 (L = 53,
2,916 harmonics): 2,988 / 7,662 (2.6x; SoftMax over the 2 s target). The block-wise field at 2*10^4
takes 1.9-2.2 s (38-428x).
Then (the truncation certified by the rows' sums, the kernel ``simulate`` chooses, and S^2's products by
non-uniform FFTs from L = 24; load 2.0 with two other jobs): S^2 2*10^4 beta 5: 19.9 / 33.3 (1.7x), beta 32
(L = 46): 20.4 / 48.7 (2.4x); S^2 10^6 beta 5: 1,126 / 2,694 (2.4x), beta 32: 1,086 / 2,164 (2.0x). Every
S^2 target met (docs/theory/clustering.md).
Run: ``OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/bench_harmonic.py [--quick] [--manifold sphere]``;
``--flows`` times ``simulate`` end to end at N = 2*10^4 instead, and ``--flows --baseline REV [--rounds N]``
compares those rows with git revision REV (whole runs alternated; benchmarks/_timing.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import time

import torch
from _timing import compare_revisions, record  # benchmarks/_timing.py

import sinkflow

_SOFTMAX_TARGET_S = {20_000: 0.05, 1_000_000: 2.0}  # issue 30: one SoftMax step on one core
_SINKHORN_RATIO = 3.0  # issue 30: a Sinkhorn step to tolerance within 3x the SoftMax step
_FLOW_STEPS = 8  # Euler steps of the flow before the timed one (its warm start extrapolates the last three; on S^2 a
# solve reuses the previous solve's Newton inverse, and the count of applications settles at 3 by the 7th step)


def _one_thread():
    """numpy's BLAS (the harmonic products run there) on one thread too, when threadpoolctl is installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # OMP_NUM_THREADS=1 does the same
        return contextlib.nullcontext()
    return threadpool_limits(1)


def _interleaved_min(fields: dict, x, repeats: int) -> dict:
    """``(cpu, wall)`` seconds per ``velocity(x)`` of each field, each the minimum over ``repeats`` rounds
    (the fields taking turns, each from a fresh copy of its state, copied untimed), after a warm-up."""
    best = {key: (float("inf"), float("inf")) for key in fields}
    for round_ in range(repeats + 1):
        for key, field in fields.items():
            fresh = copy.deepcopy(field)
            c0, t0 = time.process_time(), time.perf_counter()
            fresh.velocity(x)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            if round_ > 0:  # the first is the warm-up
                best[key] = (min(best[key][0], cpu), min(best[key][1], wall))
    return best


def _flow_field(kernel, attention):
    """The field ``simulate(manifold="sphere")`` evaluates here (warm starts on, extrapolated from the
    last three solves)."""
    from sinkflow.fields._harmonic_fields import HarmonicParticleField

    return HarmonicParticleField(attention, None, None, None, None, 1 / kernel.beta, 1e-10, 20_000, False, None,
                                 True, True, False, symmetric=True, kernel=kernel)


def _case(n, d, beta, repeats, reference_n):
    """One step inside a flow (its steady state): ``_FLOW_STEPS`` Euler steps (h = 0.1) from a uniform start,
    then the next evaluation timed from copies of the field's state (warm start, history, the solver's memory).
    Private modules are imported here, not at the top, so that ``--flows --baseline REV`` runs on a revision
    whose private layout differs."""
    from sinkflow import lazy_attention_field
    from sinkflow.fields._harmonic_bases import _SphereFourierBasis
    from sinkflow.fields._harmonic_kernels import likely_kernel

    x = torch.tensor(sinkflow.random_particles(n, d, seed=0, manifold="sphere"))
    tau = 1 / beta
    kernel = likely_kernel(tau, d, 1e-10, 1 / n)  # simulate's choice
    sink = _flow_field(kernel, "sinkhorn")
    for _ in range(_FLOW_STEPS):
        v, _ = sink.velocity(x)
        x = torch.nn.functional.normalize(x + 0.1 * v, dim=1)
    t = _interleaved_min({"soft": _flow_field(kernel, "softmax"), "sink": sink}, x, repeats)
    warm = copy.deepcopy(sink).velocity(x)[1]
    m = min(n, reference_n)
    xm = x[:m]
    c0 = time.process_time()
    lazy_attention_field(xm, W=None, normalization="row", temperature=tau)
    block = (time.process_time() - c0) * (n / m) ** 2
    fourier = isinstance(kernel.basis(x), _SphereFourierBasis)
    return dict(n=n, d=d, beta=beta, order=kernel.order, rank=kernel.rank, soft=t["soft"], sink=t["sink"],
                fourier=fourier,
                applications=warm.n_iter, converged=warm.converged, block=block, measured=m == n)


def _row(r) -> str:
    target = _SOFTMAX_TARGET_S.get(r["n"])
    (soft, soft_wall), (sink, sink_wall) = r["soft"], r["sink"]
    soft_ok = "" if target is None else ("met" if soft <= target else "missed") + f" (<= {target * 1e3:g} ms)"
    ratio = sink / soft
    sink_ok = ("met" if ratio <= _SINKHORN_RATIO else "missed") + f" (<= {_SINKHORN_RATIO:g}x)"
    block = f"{r['block'] * 1e3:.0f}" + ("" if r["measured"] else " (N^2 from 2*10^4)")
    manifold = "circle" if r["d"] == 2 else "S^2" + (" (NUFFT)" if r["fourier"] else " (products)")
    return (f"| {r['n']:,} | {r['beta']:g} | {manifold} | {r['order']} ({r['rank']}) | {soft * 1e3:.1f} "
            f"({soft_wall * 1e3:.1f}) | {sink * 1e3:.1f} ({sink_wall * 1e3:.1f}) | {r['applications']}"
            f"{'' if r['converged'] else ' (not converged)'} | {ratio:.1f}x | {block} ({r['block'] / soft:.0f}x) | "
            f"{soft_ok} | {sink_ok} |")


def flow_rows(n, repeats, steps=8):
    """End to end: CPU ms per step of ``simulate`` on the circle and on S^2 (the harmonic field, which
    ``simulate`` picks there at this N), SoftMax and Sinkhorn to tolerance, the runs interleaved; public
    API only, so ``--baseline REV`` compares any two revisions."""
    print(f"\n``simulate``, N = {n:,}, {steps} Euler steps (h = 0.1), CPU ms per step, median of {repeats}\n")
    print("| manifold | beta | SoftMax | Sinkhorn to tolerance | Sinkhorn / SoftMax | path |")
    print("|---|---|---|---|---|---|")
    for d in (2, 3):
        for beta in (5.0, 32.0):
            x = torch.tensor(sinkflow.random_particles(n, d, seed=0, manifold="sphere"))
            times, path = {"softmax": [], "sinkhorn": []}, None
            for _ in range(repeats):
                for attention in times:
                    c0 = time.process_time()
                    traj = sinkflow.simulate(x, attention, h=0.1, steps=steps, manifold="sphere", temperature=1 / beta,
                                             save_every=steps)
                    times[attention].append(1e3 * (time.process_time() - c0) / steps)
                    path = getattr(getattr(traj, "evaluation", None), "name", "-")
            soft, sink = (sorted(v)[len(v) // 2] for v in times.values())
            manifold = "circle" if d == 2 else "S^2"
            record(f"{manifold}, beta = {beta:g}, SoftMax: CPU ms / step", soft)
            record(f"{manifold}, beta = {beta:g}, Sinkhorn: CPU ms / step", sink)
            print(f"| {manifold} | {beta:g} | {soft:.1f} | {sink:.1f} | {sink / soft:.1f}x | {path} |", flush=True)


def main() -> None:
    argv = compare_revisions(__file__)
    if argv is None:
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 2*10^4 only")
    parser.add_argument("--manifold", choices=("both", "circle", "sphere"), default="both",
                        help="rows of the circle, of S^2, or both")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--flows", action="store_true", help="only the end-to-end simulate rows at N = 2*10^4 (the "
                        "rows --baseline REV compares)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.flows:
        with _one_thread():
            flow_rows(20_000, args.repeats)
        return
    cases = [(20_000, 2, 5.0), (20_000, 2, 32.0), (20_000, 3, 5.0), (20_000, 3, 32.0)]
    if not args.quick:
        cases += [(1_000_000, 2, 5.0), (1_000_000, 2, 32.0), (1_000_000, 3, 5.0), (1_000_000, 3, 32.0)]
    cases = [case for case in cases if args.manifold in ("both", {2: "circle", 3: "sphere"}[case[1]])]
    print(f"load average before: {os.getloadavg()}")
    print("| N | beta | manifold | order (features) | SoftMax step, CPU ms (wall) | Sinkhorn step, warm, CPU ms "
          "(wall) | its kernel applications | Sinkhorn / SoftMax | block-wise SoftMax, CPU ms (/ SoftMax) | "
          "SoftMax target | Sinkhorn target |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with _one_thread():
        for n, d, beta in cases:
            print(_row(_case(n, d, beta, args.repeats if n <= 20_000 else 2, reference_n=20_000)), flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
