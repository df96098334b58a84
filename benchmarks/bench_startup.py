"""Start-up times: ``sinkflow --help``, ``sinkflow figures --list`` and ``import sinkflow`` against
``import torch``, each the median over fresh Python processes (run from the repository root).

    python benchmarks/bench_startup.py [--repeats 7]

``import sinkflow`` is lazy (names load on first use), so the table also times the first use
of everything (``from sinkflow import *``) and says how much each adds to ``import torch``.
Targets: the two commands import no torch; ``import sinkflow`` adds < 0.5 s to ``import torch``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: name -> Python code run in a fresh interpreter.
CASES = {
    "python (nothing)": "pass",
    "import torch": "import torch",
    "import torch; import sinkflow": "import torch; import sinkflow",
    "import torch; from sinkflow import *": "import torch; from sinkflow import *",
    "sinkflow --help": "import sys; sys.argv = ['sinkflow', '--help']\nfrom sinkflow.cli import main\ntry: "
                       "main()\nexcept SystemExit: pass",
    "sinkflow figures --list": "from sinkflow.cli import main; main(['figures', '--list'])",
}


def wall_time(code: str) -> float:
    """Seconds of one fresh ``python -c code`` (output discarded)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "MPLBACKEND": "Agg"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes per case (default 7)")
    args = parser.parse_args()
    wall_time("import torch, sinkflow")  # warm the file cache once
    times = {name: [] for name in CASES}
    for _ in range(args.repeats):  # round-robin: a load change on a shared machine hits every case alike
        for name, code in CASES.items():
            times[name].append(wall_time(code))
    medians = {name: statistics.median(t) for name, t in times.items()}
    torch_s = medians["import torch"]
    print(f"median of {args.repeats} fresh processes, seconds")
    print(f"{'case':<40} {'time (s)':>9} {'- import torch (s)':>19}")
    for name, t in medians.items():
        extra = f"{t - torch_s:+.2f}" if "torch" in name and name != "import torch" else ""
        print(f"{name:<40} {t:9.2f} {extra:>19}")
    added = medians["import torch; import sinkflow"] - torch_s
    print(f"\nimport sinkflow adds {added:.2f} s to import torch (target < 0.5 s): "
          f"{'ok' if added < 0.5 else 'MISSED'}")


if __name__ == "__main__":
    main()
