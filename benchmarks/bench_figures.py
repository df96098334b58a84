"""CPU time of the default figure set, per figure: compute, draw, PNG, PDF (run from the repository root).

    OMP_NUM_THREADS=1 python benchmarks/bench_figures.py [--repeats 1] [--names NAME ...] [--baseline REV]

What ``sinkflow figures --force`` does for each default figure (quick mode, one torch thread):
``compute`` runs the experiment, ``draw`` builds the matplotlib figure in the sinkflow style,
``png`` is the one Agg draw that lays the figure out and is cut to its tight box, ``pdf`` one
draw of that frozen layout (:func:`sinkflow.plots._render.save_figure`). Then the whole
``sinkflow figures`` into an empty folder, in a fresh process (imports and data files
included), against the target: the default set in at most 25 s of CPU on one thread
(``time.process_time`` and ``getrusage``, medians over ``--repeats``). ``--baseline REV [--rounds N]``
compares every row with git revision REV, whole runs alternated (benchmarks/_timing.py).

Measured 2026-12-02 (2 shared cores, load 3.5-6.8, 5 interleaved runs): 29.1 s of CPU (runs
25.1-29.8 s) against 34.3 s (29.7-38.1 s) for commit 61d655d, ratio 0.85. Per figure (load ~10,
medians of 5): compute 11.8 s, draw 0.8 s, PNG 7.1 s, PDF 3.7 s; imports and writing the rest.
The merged tree on the idle machine (load 1.0-1.8, ``--repeats 5``): 19.3 s (runs 17.7-21.3 s; compute
9.5 s, draw 0.6 s, PNG 6.0 s, PDF 3.0 s); at load 2.6, 28.4 s (27.3-29.8 s).
Measured 2026-12-02, evening (idle machine, load 0.9-1.0, ``--repeats 3``, against the commit before
the heat layer's SoftMax without its matrix, Newton's patience for small masked problems and the
ensemble count runs): 21.8 s (runs 20.4-23.2 s; compute 7.9 s, draw 0.6 s, PNG 6.1 s, PDF 2.8 s)
against 23.9 s (23.2-25.8 s), ratio 0.91; before the change, alone, 24.9 s (21.2-27.1 s). A second
round with the ensembles' fourth pass too (load 0.9-1.0): 20.2 s (19.3-20.6 s) against 21.1 s
(19.3-21.3 s), ratio 0.96.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from _timing import compare_revisions, record  # noqa: E402  (benchmarks/_timing.py)

TARGET_S = 25.0
STAGES = ("compute", "draw", "png", "pdf")


def one_figure(spec, folder: Path) -> dict:
    """CPU seconds of each stage of one quick figure, as ``sinkflow figures`` writes it
    (:func:`sinkflow.plots.render`: the PNG draw lays the figure out, the PDF reuses that layout)."""
    from sinkflow.plots._registry import _run
    from sinkflow.plots._render import _draw_once, _savefig, _write_png
    from sinkflow.plots.style import style

    times = {}
    t0 = time.process_time()
    data = _run(spec, spec.quick, "quick")
    times["compute"] = time.process_time() - t0
    with style():
        t0 = time.process_time()
        result = spec.plot(data, spec.quick)
        figures = list(result.values()) if isinstance(result, dict) else [result]
        times["draw"] = time.process_time() - t0
        dpi = plt.rcParams["savefig.dpi"]
        t0 = time.process_time()  # the steps of sinkflow.plots._render.save_figure, timed apart
        drawn = [_draw_once(fig, dpi) for fig in figures]
        for k, (image, bbox) in enumerate(drawn):
            if image is not None:
                _write_png(folder / f"{spec.name}_{k}.png", image, dpi)
            else:
                _savefig(figures[k], folder / f"{spec.name}_{k}.png", bbox)
        times["png"] = time.process_time() - t0
        t0 = time.process_time()
        for k, (fig, (_, bbox)) in enumerate(zip(figures, drawn, strict=True)):
            _savefig(fig, folder / f"{spec.name}_{k}.pdf", bbox)
        times["pdf"] = time.process_time() - t0
        for fig in figures:
            plt.close(fig)
    return times


def cli_cpu(folder: Path) -> float:
    """CPU seconds of ``sinkflow figures --out FOLDER`` into an empty folder (every default figure
    computed, drawn and written, PNG and PDF, with its reference data), in a fresh process, with
    the sinkflow this script imports."""
    import sinkflow

    root = Path(sinkflow.__file__).resolve().parents[1]  # `python -m` imports from the folder it runs in
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "sinkflow.cli", "figures", "--out", str(folder)], env=env, check=True,
                   cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _runs(values) -> str:
    """Each run and the spread: what a median on a loaded machine hides."""
    return f"{', '.join(f'{v:.1f}' for v in values)} (range {min(values):.1f}-{max(values):.1f} s)"


def main(argv=None) -> None:
    argv = compare_revisions(__file__, argv)
    if argv is None:
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--names", nargs="*", help="figures to time (default: the default set, and the CLI run)")
    args = parser.parse_args(argv)
    from sinkflow.plots import registry

    reg = registry()
    names = args.names or [n for n, s in reg.items() if s.default]
    runs = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):  # interleaved: a burst of load hits every figure alike
            for name in names:
                runs[name].append(one_figure(reg[name], Path(tmp)))
    rows = {name: {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]} for name in names}
    width = max(map(len, names))
    print(f"{'figure':<{width}} " + " ".join(f"{s:>8}" for s in STAGES) + "    total   (CPU s, 1 thread)")
    for name, row in rows.items():
        record(f"{name}: CPU s", sum(row.values()))
        print(f"{name:<{width}} " + " ".join(f"{row.get(s, 0.0):8.2f}" for s in STAGES)
              + f" {sum(row.values()):8.2f}")
    sums = {s: sum(r.get(s, 0.0) for r in rows.values()) for s in STAGES}
    print(f"{'sum':<{width}} " + " ".join(f"{sums[s]:8.2f}" for s in STAGES) + f" {sum(sums.values()):8.2f}")
    if args.names:
        return
    totals = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            totals.append(cli_cpu(Path(tmp)))
    total = record("`sinkflow figures`, the default set: CPU s", statistics.median(totals))
    print(f"`sinkflow figures` into an empty folder (imports, writing and all): {total:.2f} s of CPU against "
          f"the {TARGET_S:.0f} s target (ratio {total / TARGET_S:.2f}); per-figure rendering "
          f"{sum(sums.values()) - sums['compute']:.2f} s, compute {sums['compute']:.2f} s")
    print(f"  runs: {_runs(totals)}")
    print(f"load average while measuring: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
