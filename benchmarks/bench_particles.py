"""Euler steps of a Sinkhorn particle flow: sinkflow (torch float32 CPU) vs a plain numpy step.

One step is ``x <- x + h K(x) x W_V^T`` with ``n_iter = 10`` warm-started Sinkhorn
half-iterations (``d = 2``, ``W = W_V = I / 2``), the setting of docs/performance.md. Prints a
markdown table: steps per second of

- ``sinkflow``: :func:`sinkflow.simulate` on a float32 torch tensor (block-wise evaluation,
  :mod:`sinkflow.particles`, switches on automatically above n ~ 11600 in float32);
- ``numpy``: the research-script step (scipy ``logsumexp`` on the full ``n x n`` score
  matrix, float32, same half-iteration convention and warm start),

their ratio, and the peak resident memory of each case (``ru_maxrss`` of a fresh subprocess
per case, so torch's allocations count; the imports alone take ~0.3 GiB of it). A last row
runs one chunked step at n = 100000 (``n_iter=3``: three block passes of 1e10 exponentials
each, ~1 minute per pass on a loaded core) to show the memory stays bounded.

Landmark rows (``--landmarks``, also part of the full run): one Euler step of the same flow
with ``m = 256`` Nyström landmarks (:mod:`sinkflow.particles`, ``simulate(landmarks=m)``)
at n = 10^4, 10^5, 10^6: time with the default farthest-point landmarks (their choice, once per
flow, included and also timed alone) and with uniform ones, peak RSS of a fresh process, time / n
to show the linear growth. ``--baseline REV [--rounds N]`` compares every row with the package of git
revision ``REV``, whole runs alternated (benchmarks/_timing.py). Then, at n = 10^5, the exact block-wise
step measured in the same run (one step, ~5 minutes; ``--skip-exact`` leaves it out), with the relative field error
``|v_m - v| / |v|`` printed beside the ratio.

Measured on the shared 2-core machine (float32, m = 256, load average 1.0-2.0, medians of 3,
``--landmarks --baseline 1a183d7 --skip-exact``), seconds per step:

| n | farthest (incl. choice) | the choice | uniform | peak RSS (GiB) | before (uniform) | before RSS \
| speed-up farthest / uniform |
|---|---|---|---|---|---|---|---|
| 10^4 | 0.072 | 0.052 | 0.0168 | 0.25 | 0.0437 | 0.25 | 0.6x / 2.6x |
| 10^5 | 0.216 | 0.090 | 0.107 | 0.26 | 0.629 | 0.35 | 2.9x / 5.9x |
| 10^6 | 1.96 | 0.367 | 1.15 | 0.49 | 5.35 | 0.39 | 2.7x / 4.6x |

Before, each of the twelve passes recomputed the 10^6 x 256 kernel factor's exponentials (32.5 s
in an earlier, more loaded run); now the factor ``B = L A^{+1/2}`` of the numerical rank of the
landmark block (23 of 256 farthest points, 10 of 256 uniform ones) is formed once and kept. The
farthest-point choice is made once per flow (at n = 10^4 it costs more than the step); the step
itself is ~1.6 s at n = 10^6 (the farthest landmarks cover the cloud, so ``B`` has more columns
than with uniform ones).
At n = 10^5 the exact block-wise step took 1680 s against 8.0 s for the Nyström step of the time (210x),
field error 5.2e-4 (an earlier run).

One torch / BLAS thread (reported). Medians over ``--repeats`` runs after one warm-up step.
``--floor`` prints the CPU it runs on (model name, vendor, its AVX2 / AVX-512 flags from ``/proc/cpuinfo``,
the ISA level torch dispatches to, the L2 the blocks follow) and times, interleaved, the exact block-wise
step (n = 20,000) at four block budgets and a plain hand-written loop of the same algorithm
(:func:`plain_exact_step`), and the landmark step (n = 10^5, 10^6) with its farthest-point choice
included, the choice alone and uniform landmarks, each against the floor of its exponentials (wall and
CPU-time ratios), with issue 28's targets (exact step at the default blocks <= 2x, landmark step with
its choice <= 4x). The floor is timed with torch's ``exp`` and with numpy's (on one thread numpy's ran
twice as fast), both are printed, and every ratio is against the faster. Last measured on an AMD EPYC
(AuthenticAMD, avx2 avx512f, torch AVX512, L2 1 MiB; ``--floor --repeats 3``, two rounds, load
0.6-1.6), against numpy's ``exp``: exact step 1.89x and 2.00x (3.06x and 3.16x for the commit before,
alternated with it), landmark step at 10^6 with its choice 6.67x and 7.06x (8.70x, 8.31x), uniform
landmarks 4.16x and 4.13x (5.21x, 5.95x); docs/performance.md, *Large n: block-wise and landmark steps*.
No Intel CPU was at hand.
Usage: ``python benchmarks/bench_particles.py [--quick] [--landmarks] [--baseline REV] [--skip-exact] [--floor]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from _timing import compare_revisions, record  # noqa: E402  (benchmarks/_timing.py)

N_ITER, H, D = 10, 0.1, 2
LANDMARKS = 256
W = np.eye(D) / 2


def numpy_step(X, g, n_iter=N_ITER, h=H):
    """The step as research scripts write it: full score matrix, scipy logsumexp, float32."""
    from scipy.special import logsumexp

    C = (X @ W) @ X.T
    f = np.zeros(len(X), dtype=X.dtype)
    for it in range(n_iter):
        if it % 2 == 0:
            f = -logsumexp(C + g[None, :], axis=1)
        else:
            g = -logsumexp(C + f[:, None], axis=0)
    K = np.exp(f[:, None] + C + g[None, :])
    return X + h * (K @ X) @ W.T, g


def _particles(n):
    return (np.random.default_rng(0).standard_normal((n, D)) * 0.5).astype(np.float32)


def single(method, n, steps, repeats, n_iter):
    """One case in its own process: returns steps/s (median) and peak RSS."""
    import torch

    import sinkflow

    torch.set_num_threads(1)
    x = _particles(n)
    extra = {}
    if method.startswith("nystrom"):
        xt = torch.from_numpy(x)
        sampling = {"landmark_sampling": "uniform"} if method == "nystrom_uniform" else {}
        farthest = getattr(sinkflow.particles, "farthest_point_indices", None)  # not in older revisions
        if method == "nystrom" and farthest is not None:
            z = sinkflow.particles.gaussian_coordinates(xt, torch.tensor(W, dtype=torch.float32), 1.0)
            t0 = time.perf_counter()
            farthest(z, LANDMARKS)
            extra["choice_s"] = time.perf_counter() - t0

        def run(k):
            return sinkflow.simulate(xt, "sinkhorn", W_K=torch.tensor(W, dtype=torch.float32),
                                     W_V=torch.tensor(W, dtype=torch.float32), h=H, steps=k, n_iter=n_iter,
                                     warm_start=True, landmarks=LANDMARKS, **sampling)
    elif method == "sinkflow":
        xt = torch.from_numpy(x)

        def run(k):
            return sinkflow.simulate(xt, "sinkhorn", W_K=torch.tensor(W, dtype=torch.float32),
                                     W_V=torch.tensor(W, dtype=torch.float32), h=H, steps=k, n_iter=n_iter,
                                     warm_start=True)
    else:
        def run(k):
            X, g = x, np.zeros(n, dtype=np.float32)
            for _ in range(k):
                X, g = numpy_step(X, g, n_iter)
            return X

    if repeats > 1:
        run(1)  # warm-up (allocator, first-call overheads)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = run(steps)
        rates.append(steps / (time.perf_counter() - t0))
    if method != "numpy":
        extra["chunked"] = bool(out.chunked)
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    return {"rate": statistics.median(rates), "peak_gib": peak_gib, "threads": torch.get_num_threads(), **extra}


def run_case(method, n, steps, repeats, n_iter=N_ITER):
    """One case in a fresh process (the ``sinkflow`` this script imports, ``PYTHONPATH`` passed on)."""
    cmd = [sys.executable, __file__, "--single", method, str(n), str(steps), str(repeats), str(n_iter)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=dict(os.environ))
    return json.loads(out.stdout.strip().splitlines()[-1])


def agreement(n=300):
    """Max difference between one sinkflow step and one numpy step (same math, float64)."""
    import sinkflow

    x = _particles(n).astype(np.float64)
    ours = sinkflow.simulate(x, "sinkhorn", W_K=W, W_V=W, h=H, steps=1, n_iter=N_ITER, warm_start=True).final
    ref, _ = numpy_step(x, np.zeros(n))
    return float(np.abs(ours - ref).max())


def landmark_comparison(n=100_000):
    """One exact block-wise step and one Nyström step at ``n``: seconds of each and the field error."""
    import torch

    import sinkflow

    torch.set_num_threads(1)
    x = torch.from_numpy(_particles(n))
    Wt = torch.tensor(W, dtype=torch.float32)
    seconds, moves = {}, {}
    for name, extra in (("nystrom", {"landmarks": LANDMARKS}), ("exact", {"chunked": True})):
        t0 = time.perf_counter()
        traj = sinkflow.simulate(x, "sinkhorn", W_K=Wt, W_V=Wt, h=H, steps=1, n_iter=N_ITER, **extra)
        seconds[name] = time.perf_counter() - t0
        moves[name] = (traj.final - x).double()
    error = float((moves["nystrom"] - moves["exact"]).norm() / moves["exact"].norm())
    return seconds, error


def landmark_rows(quick: bool, repeats: int, exact: bool = True):
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
    print(f"\nNyström landmarks m={LANDMARKS}: one Euler step, Sinkhorn n_iter={N_ITER}, d={D}, float32, 1 thread, "
          f"median of {repeats}; the farthest-point choice is made once per flow and included\n")
    print("| n | farthest (s) | of which the choice (s) | uniform (s) | peak RSS (GiB) | microseconds / particle |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        far, uni = (run_case(method, n, 1, repeats) for method in ("nystrom", "nystrom_uniform"))
        record(f"landmarks, n = {n}, farthest: s / step", 1 / far["rate"])
        record(f"landmarks, n = {n}, uniform: s / step", 1 / uni["rate"])
        choice = far.get("choice_s", math.nan)
        print(f"| {n} | {1 / far['rate']:.3g} | {choice:.3g} | {1 / uni['rate']:.3g} | {far['peak_gib']:.2f} "
              f"| {1e6 / far['rate'] / n:.3g} |", flush=True)
    if not exact:
        return
    n = 20_000 if quick else 100_000
    seconds, error = landmark_comparison(n)
    print("\n| n | exact block-wise step (s) | Nyström step (s) | speed-up | field error |")
    print("|---|---|---|---|---|")
    print(f"| {n} | {seconds['exact']:.3g} | {seconds['nystrom']:.3g} | {seconds['exact'] / seconds['nystrom']:.0f}x | "
          f"{error:.2e} |")


def cpu_description() -> str:
    """The CPU this run is on: model name and vendor (``/proc/cpuinfo``, else ``platform``), its AVX2 /
    AVX-512 flags, the ISA level torch dispatches to and the L2 cache the block sizes follow."""
    import platform

    import torch

    from sinkflow.fields._blockwise_fields import _l2_bytes

    info = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "vendor_id", "flags"):
                    info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or platform.machine()
    flags = [f for f in ("avx2", "avx512f") if f in info.get("flags", "").split()]
    l2 = _l2_bytes()
    return (f"{name} ({info.get('vendor_id', 'vendor unknown')}, flags {' '.join(flags) or 'no avx2/avx512f'}); "
            f"torch {torch.__version__}, ISA {torch.backends.cpu.get_cpu_capability()}; L2 "
            f"{'unknown' if l2 is None else f'{l2 / 2**10:.0f} KiB'} per core")


def _clocks():
    return time.perf_counter(), time.thread_time()


def exp_seconds(count, shape=(4096, 256), library="torch"):
    """(wall, CPU) seconds for ``count`` float32 exponentials of in-range arguments on a ``shape`` buffer,
    in place, by ``library``'s exp ("torch" or "numpy": on one thread numpy's runs about twice as fast on
    the CPUs measured, and sinkflow's fields use it there)."""
    import numpy as np
    import torch

    buf = torch.empty(shape)
    arr = buf.numpy()
    rounds = max(1, int(count // buf.numel()))
    exp = (lambda: buf.exp_()) if library == "torch" else (lambda: np.exp(arr, out=arr))
    t0 = _clocks()
    for _ in range(rounds):
        buf.fill_(-3.0)
        exp()
    t1 = _clocks()
    for _ in range(rounds):
        buf.fill_(-3.0)
    t2 = _clocks()
    scale = count / (rounds * buf.numel())
    return tuple(((b - a) - (c - b)) * scale for a, b, c in zip(t0, t1, t2, strict=True))


EXPS = ("torch", "numpy")


def _floor_runs(label, count, shapes):
    """The floor rows of ``count`` exponentials, ``"{label}: {library} exp"`` for torch's and numpy's, each
    the faster over ``shapes``; the floor ``label`` itself is the faster of the two (:func:`floor_rows`)."""
    def fastest(library):
        return lambda: tuple(map(min, zip(*(exp_seconds(count, shape, library) for shape in shapes), strict=True)))
    return {f"{label}: {library} exp": (None, None, fastest(library)) for library in EXPS}


def plain_exact_step(x, W, g, n_iter=N_ITER, rows=256):
    """The exact block-wise step written plainly (the reference sinkflow must not trail): blocks of
    ``rows`` score rows, ``torch.logsumexp`` per half-iteration (rows first, from ``g``; uniform weights),
    then the velocity ``K V`` of ``K = exp(f_i + C_ij + g_j)`` with ``V = x``. The same ``11 n^2``
    exponentials as sinkflow's step."""
    import torch

    xw, n = x @ W, x.shape[0]
    f, g = torch.zeros(n, dtype=x.dtype), g.clone()
    for it in range(n_iter):  # C_ij = <x_i W, x_j>: a column step is a row step of C^T
        src, dst, pot, out = (xw, x, g, f) if it % 2 == 0 else (x, xw, f, g)
        for i0 in range(0, n, rows):
            out[i0:i0 + rows] = -torch.logsumexp(src[i0:i0 + rows] @ dst.T + pot, 1)
    vel = torch.empty_like(x)
    for i0 in range(0, n, rows):
        vel[i0:i0 + rows] = torch.exp(xw[i0:i0 + rows] @ x.T + f[i0:i0 + rows, None] + g) @ x
    return vel


def _exact_runs(n):
    """The exact step at ``n`` (float32) with the default block budget, half and four times it, 64 MiB, and
    the plain loop with the default's rows; its floor: ``11 n^2`` exponentials (10 half-iterations from a
    warm ``g`` and the application), the fastest of torch's and numpy's exp on a buffer of the default
    block's shape and on a 4 MiB one."""
    import torch

    import sinkflow.fields._blockwise_fields as blockwise_fields

    x = torch.from_numpy(_particles(n))
    Wt = torch.tensor(W, dtype=torch.float32)
    g = blockwise_fields.lazy_attention_field(x, W=Wt, n_iter=4).g
    default = blockwise_fields.DEFAULT_BLOCK_BYTES
    rows = max(1, default // (3 * n * 4))  # the default's rows (lazy_attention_field's rule)
    ref = blockwise_fields.lazy_attention_field(x, W=Wt, n_iter=N_ITER, init_g=g).velocity
    plain = plain_exact_step(x, Wt, g, rows=rows)
    print(f"plain loop vs sinkflow velocity (n = {n}, float32): max relative difference "
          f"{float((plain - ref).abs().max() / ref.abs().max()):.1e}")
    floor = f"exact {n}"
    runs = _floor_runs(floor, 11 * n * n, ((rows, n), (4096, 256)))
    for label, size in ((f"default ({default / 2**20:.1f} MiB)", default), ("half the default", default // 2),
                        ("4x the default", 4 * default), ("64 MiB", 64 * 2**20)):
        runs[f"exact step, blocks {label}"] = (n, floor, lambda size=size: blockwise_fields.lazy_attention_field(
            x, W=Wt, n_iter=N_ITER, init_g=g, block_bytes=size))
    runs[f"plain loop, {rows} rows a block"] = (n, floor, lambda: plain_exact_step(x, Wt, g, rows=rows))
    return runs


def _landmark_runs(sizes):
    """The landmark step (m = LANDMARKS, farthest points chosen inside the call, the default), the choice
    alone, and the step with uniform landmarks; floor: the ``n m`` exponentials of the factor (the faster of
    torch's and numpy's exp)."""
    import torch

    import sinkflow

    Wt = torch.tensor(W, dtype=torch.float32)
    runs, lowrank = {}, sinkflow.particles.lowrank_attention_field
    for n in sizes:
        z, floor = torch.from_numpy(_particles(n)), f"landmark {n}"
        runs.update(_floor_runs(floor, n * LANDMARKS, ((4096, 256),)))
        runs[f"landmark step, farthest-point choice included ({n})"] = (n, floor, lambda z=z: lowrank(
            z, z, LANDMARKS, W=Wt, n_iter=N_ITER))
        runs[f"the choice alone ({n})"] = (n, floor, lambda z=z: sinkflow.particles.farthest_point_indices(
            sinkflow.particles.gaussian_coordinates(z, Wt, 1.0), LANDMARKS, 0))
        runs[f"landmark step, uniform landmarks ({n})"] = (n, floor, lambda z=z: lowrank(
            z, z, LANDMARKS, W=Wt, n_iter=N_ITER, sampling="uniform"))
    return runs


#: Ratios to the exponential floor the issue asks for (wall and CPU time): the exact block-wise step
#: at its default blocks (n = 20,000), the landmark step with its farthest-point choice (n = 10^6).
FLOOR_TARGETS = {("exact step, blocks default", 20_000): 2.0,
                 ("landmark step, farthest-point choice included", 10**6): 4.0}


def floor_rows(repeats: int, exact_n: int = 20_000, landmark_n: int = 1_000_000):
    """The exact block-wise step and the landmark step against the floor of their exponentials, interleaved:
    medians of wall and CPU (thread) time; the CPU-time ratio is the one a loaded machine leaves readable."""
    import torch

    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    runs = {**_exact_runs(exact_n), **_landmark_runs((landmark_n // 10, landmark_n))}
    times = {k: [] for k in runs}
    for _ in range(repeats):
        for k, (_n, floor, fn) in runs.items():
            t0 = _clocks()
            out = fn()
            times[k].append(out if floor is None else tuple(b - a for a, b in zip(t0, _clocks(), strict=True)))
    med = {k: tuple(statistics.median(t[c] for t in v) for c in (0, 1)) for k, v in times.items()}
    floors = {floor: [med[f"{floor}: {library} exp"] for library in EXPS] for _, floor, _ in runs.values() if floor}
    med.update({floor: tuple(map(min, zip(*by_library, strict=True))) for floor, by_library in floors.items()})
    print(f"\nFloors on {cpu_description()}\nfloat32, d={D}, 1 thread, medians of {repeats} interleaved; "
          f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print("| floor | exponentials | torch exp, wall (s) | numpy exp, wall (s) | torch / numpy |")
    print("|---|---|---|---|---|")
    for k, ((tw, _), (nw, _)) in floors.items():
        print(f"| {k} | {'11 n^2' if k.startswith('exact') else 'n m'} | {tw:.3g} | {nw:.3g} | x{tw / nw:.2f} |")
    print("\nRatios against the faster of the two exps:\n")
    print("| step | n | floor, wall (s) | time, wall (s) | ratio, wall | ratio, CPU time | target (issue 28) |")
    print("|---|---|---|---|---|---|---|")
    for k, (n, floor, _) in runs.items():
        if floor is not None:
            (fw, fc), (tw, tc) = med[floor], med[k]
            target = next((t for (prefix, at), t in FLOOR_TARGETS.items() if k.startswith(prefix) and n == at), None)
            verdict = "-"
            if target is not None:
                verdict = f"<= {target:g}: {'ok' if max(tw / fw, tc / fc) <= target else 'MISSED'}"
            print(f"| {k} | {n} | {fw:.3g} | {tw:.3g} | x{tw / fw:.2f} | x{tc / fc:.2f} | {verdict} |")


def main(argv=None):
    argv = compare_revisions(__file__, argv)
    if argv is None:
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n in {1000, 4000}, big case n = 20000")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--landmarks", action="store_true", help="only the Nyström-landmark rows")
    p.add_argument("--skip-exact", action="store_true", help="leave out the exact block-wise step of the landmark rows")
    p.add_argument("--floor", action="store_true", help="only the exact (n = 20000) and landmark (n = 10^5, 10^6) "
                   "steps "
                   "against the floor of their exponentials")
    p.add_argument("--single", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.floor:
        floor_rows(args.repeats, exact_n=6000 if args.quick else 20_000, landmark_n=100_000 if args.quick else 10**6)
        return 0
    if args.landmarks:
        landmark_rows(args.quick, args.repeats, not args.skip_exact)
        return 0
    if args.single:
        method, n, steps, repeats, n_iter = args.single
        print(json.dumps(single(method, int(n), int(steps), int(repeats), int(n_iter))))
        return 0
    sizes = (1000, 4000) if args.quick else (1000, 4000, 16000)
    steps = {1000: 10, 4000: 3, 16000: 1}
    big = 20000 if args.quick else 100000
    print(f"sinkflow vs numpy step agreement (n=300, float64): max |diff| = {agreement():.2e}\n")
    print(f"Euler steps/s, Sinkhorn n_iter={N_ITER} warm-started, d={D}, float32 CPU, 1 thread, "
          f"median of {args.repeats}\n")
    print("| n | sinkflow steps/s | numpy steps/s | ratio | sinkflow peak RSS (GiB) | numpy peak RSS (GiB) | chunked |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        reps = args.repeats if n < 16000 else 1
        ours = run_case("sinkflow", n, steps[n], reps)
        if n < 16000:
            ref = run_case("numpy", n, max(1, steps[n] // 2), reps)
            rate, ratio, mem = f"{ref['rate']:.3g}", f"{ours['rate'] / ref['rate']:.1f}x", f"{ref['peak_gib']:.2f}"
        else:  # several n x n float32 temporaries of 1 GiB each and minutes per step: skipped
            rate, ratio, mem = "skipped", "-", "(~5 GiB est.)"
        record(f"exact, n = {n}, sinkflow: s / step", 1 / ours["rate"])
        print(f"| {n} | {ours['rate']:.3g} | {rate} | {ratio} | {ours['peak_gib']:.2f} | {mem} | {ours['chunked']} |")
    ours = run_case("sinkflow", big, 1, 1, n_iter=3)
    record(f"exact, n = {big}, n_iter = 3: s / step", 1 / ours["rate"])
    print(f"| {big} (n_iter=3, one step) | {ours['rate']:.3g} ({1 / ours['rate']:.0f} s/step) | - | - | "
          f"{ours['peak_gib']:.2f} | - | {ours['chunked']} |")
    landmark_rows(args.quick, args.repeats, not args.skip_exact)
    print(f"\ntorch threads: {ours['threads']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
