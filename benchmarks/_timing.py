"""Shared helpers of the benchmark scripts (run them from the repository root).

* :func:`timed`: the median wall time of a call;
* :func:`record`: a script keeps each number it prints under a row label;
* :func:`compare_revisions`: ``--baseline REV [--rounds N]`` on any script that records its numbers runs
  the script alternately with this checkout's ``sinkflow`` and with the package of git revision
  ``REV`` (``git archive`` into a temporary folder), round after round, and prints every recorded row's
  median for both and their ratio. The rounds alternate which package goes first, so a drift in the
  machine's load reaches both alike.
"""

from __future__ import annotations

import argparse
import atexit
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The numbers this run printed, by row label (:func:`record`).
RECORDS: dict[str, float] = {}


def timed(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` runs, after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def record(label: str, value: float) -> float:
    """Keep ``value`` (a time: smaller is better) under ``label`` for :func:`compare_revisions`; returns it."""
    RECORDS[label] = float(value)
    return value


def baseline_package(rev: str) -> str:
    """The ``sinkflow`` package of git revision ``rev``, extracted into a temporary folder."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "sinkflow"], capture_output=True, check=True).stdout
    folder = tempfile.mkdtemp(prefix="sinkflow-baseline-")
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(folder, filter="data")
    return folder


def _run(script: str, argv: list[str], package: str) -> dict[str, float]:
    """One run of ``script`` importing the ``sinkflow`` of ``package``: the numbers it recorded."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package, os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, script, *argv, "--records", out], check=True, env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    with open(out) as fh:
        rows = json.load(fh)
    os.unlink(out)
    return rows


def compare_revisions(script: str, argv: list[str] | None = None) -> list[str] | None:
    """Handle ``--baseline REV``, ``--rounds N`` and ``--records FILE`` for a benchmark script.

    Call it first in the script's ``main`` (``argv``: its arguments, ``sys.argv[1:]`` by default). With
    ``--records FILE`` it writes :data:`RECORDS` to ``FILE`` as JSON when the script exits; with neither
    option it does nothing; both times it returns the other arguments, for the script's own parser. With
    ``--baseline REV`` it runs the script ``N`` times with each package, alternating, prints the comparison
    and returns None (the script then returns).
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--baseline", metavar="REV")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.records:
        atexit.register(lambda: Path(args.records).write_text(json.dumps(RECORDS)))
    if not args.baseline:
        return rest
    packages = {"this checkout": str(ROOT), args.baseline: baseline_package(args.baseline)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in packages}
    print(f"{Path(script).name} {' '.join(rest)}: {args.rounds} rounds, alternating this checkout and "
          f"{args.baseline}; load average before {os.getloadavg()[0]:.1f}", flush=True)
    for round_ in range(args.rounds):
        for name in list(packages)[:: 1 if round_ % 2 == 0 else -1]:
            runs[name].append(_run(script, rest, packages[name]))
    now, before = runs.values()
    if not now[0]:
        print(f"\n{Path(script).name} {' '.join(rest)} recorded no row to compare (see its --help for the rows "
              "--baseline compares)")
        return None
    print(f"\n| row | this checkout | {args.baseline} | this / {args.baseline} |\n|---|---|---|---|")
    for label in now[0]:
        a = statistics.median(r[label] for r in now if label in r)
        b = [r[label] for r in before if label in r]
        if b:
            print(f"| {label} | {a:.4g} | {statistics.median(b):.4g} | {a / statistics.median(b):.2f}x |")
        else:
            print(f"| {label} | {a:.4g} | - | - |")
    print(f"\nmedians of {args.rounds} runs each; load average after {os.getloadavg()[0]:.1f}")
    return None
