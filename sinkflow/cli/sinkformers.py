"""``sinkflow sinkformers``: the Sinkformers paper's patch-size and point-cloud studies, as JSON reports.

``sinkflow sinkformers patch-size point-cloud --full --seeds 5 --out docs/data`` writes
``docs/data/patch_size_full.json`` and ``docs/data/point_cloud_full.json``; ``python -m sinkflow.studies.pages
docs/data/*.json > docs/reproducing.md`` renders them with a verdict line each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["STUDIES", "add_arguments", "run"]

#: Study name -> (report function ``module:function``, JSON stem).
STUDIES = {"patch-size": ("sinkflow.studies.patch_study:patch_size_report", "patch_size"),
           "point-cloud": ("sinkflow.studies.point_clouds:point_cloud_report", "point_cloud")}


def add_arguments(p) -> None:
    p.add_argument("studies", nargs="+", choices=list(STUDIES), help="which studies to run")
    p.add_argument("--full", action="store_true",
                   help="the documented setting (patch size: all 1,797 digits, 60 epochs, Sinkhorn(5); point "
                        "clouds: 1,000 training clouds, 120 epochs); default: the quick one (about a minute a seed)")
    p.add_argument("--seeds", type=int, default=5, help="number of seeds 0..N-1 (default 5)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", default="docs/data", help="folder of the JSON reports (default docs/data)")


def run(args) -> int:
    import importlib

    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size = "full" if args.full else "quick"
    for name in args.studies:
        target, stem = STUDIES[name]
        module, function = target.split(":")
        report_fn = getattr(importlib.import_module(module), function)
        seeds = tuple(range(args.seeds))
        report = report_fn(seeds, quick=not args.full) if stem == "patch_size" else report_fn(seeds, size=size)
        path = out / f"{stem}_{size}.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"sinkflow sinkformers: {name} -> {path} ({report['wall_time']:.0f} s)", file=sys.stderr)
    return 0
