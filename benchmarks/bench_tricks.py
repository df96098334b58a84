"""Each speed trick on and off, end to end: does it earn its place (at least 1.2x on a whole run)?

    OMP_NUM_THREADS=1 python benchmarks/bench_tricks.py [--quick] [--repeats R] [--only TRICK ...]

One row per trick and run it is meant to speed up (a :func:`sinkflow.simulate` call, an ensemble, a
figure build; never a kernel alone), at a size its comment names. Each row runs the same call with the
trick on and with it off, alternately (the order flips every repeat), and prints the medians, their
ratio (off / on) and the row's verdict: ``keep`` at 1.2x or more, else ``delete``; a trick stays when
one of its rows says ``keep`` (the summary under the table). Times are the process's
CPU seconds (user and system: page faults count), except the thread row, whose point is wall time.
One torch / BLAS thread, as numpy's ``exp`` route requires, except where a row says otherwise.

How a trick is turned off: :func:`sinkflow.fast_paths` where the trick is behind that switch,
otherwise a patch of the trick's function for the duration of the ``off`` run. A trick deleted since
says ``(gone)``; to measure it, run the script on an older revision's package (``git archive REV sinkflow``
into a folder, then ``PYTHONPATH=that-folder``). The table of the last run is in docs/performance.md,
*Speed tricks and their switch*.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import pkgutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from unittest import mock  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _timing import compare_revisions, record  # noqa: E402  (benchmarks/_timing.py)

import sinkflow  # noqa: E402
from sinkflow.plots import registry  # noqa: E402

#: The verdict's threshold: a trick stays when turning it off makes its row at least this much slower.
KEEP = 1.2


def _fast_off():
    return sinkflow.fast_paths(False)


def _patched(target: str, value):
    """``mock.patch(target, value)``, or None when ``target`` no longer exists (a trick deleted)."""
    try:
        pkgutil.resolve_name(target)
    except (ImportError, AttributeError):
        return None
    return mock.patch(target, value)


def _off(*patches):
    """A context manager applying every patch that exists (None: the trick is gone)."""
    patches = [p for p in patches if p is not None]

    @contextlib.contextmanager
    def context():
        with contextlib.ExitStack() as stack:
            for p in patches:
                stack.enter_context(p)
            yield
    return context if patches else None


def _numpy_exp_target() -> str:
    """The SIMD target numpy's float64 ``exp`` runs on this CPU (``X86_V4``: AVX-512)."""
    try:
        from numpy.lib.introspect import opt_func_info

        return opt_func_info(func_name="^exp$")["exp"]["dd"]["current"]
    except Exception:
        return "unknown"


def _torch_empty(shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)


def _x0(shape, manifold, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True) if manifold == "sphere" else x


# ---------------------------------------------------------------------------------------------------------------
# the rows: (trick, row, run, off) with run() the end-to-end call and off() a context that turns the trick off


def rows(quick: bool):
    out = []
    systems, steps = (2048, 10) if quick else (2048, 40)
    ens = torch.from_numpy(_x0((systems, 32, 2), "sphere"))

    def ensemble(attention, steps=steps, save_every=1):
        return lambda: sinkflow.simulate(ens, attention, h=0.05, steps=steps, manifold="sphere", temperature=0.2,
                                         save_every=save_every)

    # empty_large: the positions buffer (an ensemble saved every step), the ensemble's arena, the landmark factor
    empty_off = _off(_patched("sinkflow.particles._integrators.empty_large", _torch_empty),
                     _patched("sinkflow.fields._ensemble_fields.empty_large", _torch_empty),
                     _patched("sinkflow.fields._lowrank_fields.empty_large", _torch_empty))
    out.append(("empty_large", f"ensemble {systems} x 32 SoftMax, {steps} steps saved", ensemble("softmax"),
                empty_off))
    n_land = 200_000 if quick else 1_000_000
    xl = torch.from_numpy(_x0((n_land, 2), "euclidean").astype(np.float32))
    out.append(("empty_large", f"landmarks n = {n_land:,}, m = 256, 1 step",
                lambda: sinkflow.simulate(xl, "sinkhorn", h=0.1, steps=1, n_iter=3, landmarks=256,
                                          landmark_sampling="uniform"), empty_off))
    # _Arena: the ensemble field's numpy work arrays
    arena_off = _off(_patched("sinkflow.fields._ensemble_fields._Arena.empty",
                              lambda self, shape, dtype: np.empty(shape, dtype)))
    out.append(("_Arena", f"ensemble {systems} x 32 SoftMax, {steps} steps", ensemble("softmax", save_every=steps),
                arena_off))
    out.append(("_Arena", f"ensemble {systems} x 32 Sinkhorn, 3 steps", ensemble("sinkhorn", 3, 3), arena_off))
    # the ensemble field's numpy route on the CPU (torch's operations otherwise, as on an accelerator)
    ens_numpy_off = _off(_patched("sinkflow.fields._ensemble_fields._in_numpy", lambda t: False))
    out.append(("ensemble numpy route", f"ensemble {systems} x 32 SoftMax, {steps} steps",
                ensemble("softmax", save_every=steps), ens_numpy_off))
    out.append(("ensemble numpy route", f"ensemble {systems} x 32 Sinkhorn, 3 steps", ensemble("sinkhorn", 3, 3),
                ens_numpy_off))
    # exp_'s numpy route: a block-wise simulate (one thread), the route forced on whatever numpy's exp dispatches to
    n_block = 8000
    xb = torch.from_numpy(_x0((n_block, 2), "euclidean"))

    def blockwise():
        with _patched("sinkflow._backend.numpy_exp_is_fast", lambda: True) or contextlib.nullcontext():
            sinkflow.simulate(xb, "sinkhorn", h=0.1, steps=1, n_iter=3, chunked=True, temperature=0.5)
    out.append(("exp_ numpy route", f"block-wise Sinkhorn(3) n = {n_block:,}, 1 step, float64, numpy exp on "
                f"{_numpy_exp_target()}", blockwise, _fast_off))
    # single_thread_if_small: small flows on a 2-thread torch
    xs = torch.from_numpy(_x0((32, 3), "sphere"))
    single_off = _off(*(_patched(f"{m}.single_thread_if_small", lambda n, device: contextlib.nullcontext())
                        for m in ("sinkflow.particles._system", "sinkflow.particles._ensembles",
                                  "sinkflow.particles._energies")))
    out.append(("single_thread_if_small", "sphere n = 32, SoftMax, 100 steps, 2 torch threads (wall)",
                lambda: sinkflow.simulate(xs, "softmax", h=0.1, steps=100, manifold="sphere"), single_off))
    # the harmonic solvers' numpy route (N = 2*10^4 on the circle and S^2, the harmonic field)
    n_h = 20_000
    for d in (2, 3):
        xh = torch.tensor(sinkflow.random_particles(n_h, d, seed=0, manifold="sphere"))
        where = "circle" if d == 2 else "S^2"
        harmonic_off = _fast_off  # (before: sinkflow.fields._harmonic_solvers._NUMPY_ON_CPU = False)
        for attention in ("softmax", "sinkhorn"):
            out.append(("harmonic numpy route", f"{where} N = {n_h:,}, {attention}, beta = 5, 4 steps",
                        (lambda xh=xh, attention=attention: sinkflow.simulate(
                            xh, attention, h=0.1, steps=4, manifold="sphere", temperature=0.2, save_every=4)),
                        harmonic_off))
    # ParticleField._half_norms in numpy (the warm start of the symmetric solve to tolerance)
    xr = torch.from_numpy(_x0((64, 2), "euclidean"))

    def half_norms_torch(self, Y):
        Y, W = Y.detach(), None if self.W is None else self.W.detach()
        WY = Y if W is None else Y @ W.swapaxes(-1, -2)
        return (WY * Y).sum(-1) * (0.5 / self.temperature)
    half_off = _off(_patched("sinkflow.fields._particle_field.ParticleField._half_norms", half_norms_torch))
    out.append(("_half_norms numpy", "R^2 n = 64, Sinkhorn to tolerance, 100 steps",
                lambda: sinkflow.simulate(xr, "sinkhorn", h=0.05, steps=100, temperature=0.2), half_off))
    # save_figure's own tight box against savefig(bbox_inches="tight")
    names = FIGURES if quick else tuple(n for n, spec in registry().items() if spec.default)
    out.append(("save_figure tight box", f"build of {len(names)} default figures (compute, PNG, PDF)",
                _figures(names), _off(_patched("sinkflow.plots._render.save_figure", _savefig_tight))))
    return out


FIGURES = ("particles_trajectories", "particles_energy", "normalizations_attention", "heat_snapshots",
           "causal_attention")


def _figures(names):
    """``sinkflow figures --force NAMES`` in quick mode, into a temporary folder (compute, draw and files)."""
    from sinkflow.plots import render

    folder = tempfile.mkdtemp(prefix="bench-tricks-")

    def run():
        for name in names:
            render(name, out=folder, force=True)
    return run


def _savefig_tight(fig, paths):
    """matplotlib's own tight box: one ``savefig(bbox_inches="tight")`` per file (the trick off)."""
    from pathlib import Path

    from sinkflow.plots.style import plain_log_ticks

    plain_log_ticks(fig)
    paths = [Path(p) for p in paths]
    for path in paths:
        fmt = path.suffix[1:]
        meta = {"Software": None} if fmt == "png" else (
            {"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None} if fmt == "pdf" else None)
        fig.savefig(path, format=fmt, metadata=meta, bbox_inches="tight")
    return paths


def measure(run, off, repeats: int, wall: bool) -> tuple[float, float]:
    """Median seconds of ``run()`` with the trick on and off (``off()`` a context), alternating."""
    clock = time.perf_counter if wall else time.process_time
    times = {"on": [], "off": []}
    with off():
        run()  # warm-up of both paths
    run()
    for r in range(repeats):
        for which in (("on", "off") if r % 2 == 0 else ("off", "on")):
            with off() if which == "off" else contextlib.nullcontext():
                t0 = clock()
                run()
                times[which].append(clock() - t0)
    return statistics.median(times["on"]), statistics.median(times["off"])


def main() -> None:
    argv = compare_revisions(__file__)
    if argv is None:
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller rows (a few minutes in all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="tricks to measure (their names in the table)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.repeats} alternated repeats, medians\n")
    print("| trick | row | on (s) | off (s) | off / on | verdict |\n|---|---|---|---|---|---|")
    best: dict[str, float] = {}
    for trick, row, run, off in rows(args.quick):
        if args.only and trick not in args.only:
            continue
        if off is None:
            print(f"| {trick} | {row} | - | - | - | (gone) |", flush=True)
            continue
        wall = "(wall)" in row
        with sinkflow.torch_threads(2 if "2 torch threads" in row else 1):
            on, off_time = measure(run, off, args.repeats, wall)
        ratio = off_time / on
        best[trick] = max(best.get(trick, 0.0), ratio)
        record(f"{trick}: {row}: on", on)
        print(f"| {trick} | {row} | {on:.3g} | {off_time:.3g} | {ratio:.2f}x | "
              f"{'keep' if ratio >= KEEP else 'delete'} |", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}\n")
    for trick, ratio in best.items():  # a trick stays when one of its rows gains enough
        print(f"{trick}: best row {ratio:.2f}x: {'keep' if ratio >= KEEP else 'delete'}")


if __name__ == "__main__":
    main()
