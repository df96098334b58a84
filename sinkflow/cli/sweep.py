"""``sinkflow sweep CONFIG``: run a parameter sweep described by a TOML or JSON file.

A config names the experiment and the grid; everything else is optional::

    experiment = "sinkflow.experiments:sinkhorn_convergence"   # "module:function"
    executor = "dask"            # or "sequential", or a scheduler address "tcp://host:8786"
    out = "sweep.csv"            # the table (default: <config stem>.csv next to the config)
    cache_dir = ".sinkflow_cache"
    n_workers = 2                # local cluster size for executor = "dask"

    [grid]                       # cartesian product; or a list of points: [[points]] tables
    n = [16, 32, 64]
    scale = [1.0, 2.0, 4.0]
    seed = [0, 1]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["load_config", "add_arguments", "run"]

KEYS = {"experiment", "grid", "points", "executor", "out", "cache_dir", "n_workers", "threads_per_worker", "on_error"}


def load_config(path) -> dict:
    """Read and check a sweep config (``.toml`` or ``.json``); returns the dict.

    Raises
    ------
    ValueError
        Missing file, unknown format or keys, no experiment, neither or both of
        ``grid`` and ``points``.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"sweep config {path} does not exist")
    if path.suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise ValueError("reading TOML needs Python >= 3.11 or `pip install tomli`; "
                                 "or write the config as JSON") from None
        try:
            config = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"sweep config {path} is not valid TOML: {err}") from None
    elif path.suffix == ".json":
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"sweep config {path} is not valid JSON: {err}") from None
    else:
        raise ValueError(f"sweep config must be a .toml or .json file, got {path.name}")
    if not isinstance(config, dict):
        raise ValueError(f"sweep config {path} must be a table/object at top level")
    unknown = sorted(set(config) - KEYS)
    if unknown:
        raise ValueError(f"sweep config {path}: unknown key(s) {unknown}; known: {sorted(KEYS)}")
    if "experiment" not in config:
        raise ValueError(f"sweep config {path} names no experiment (experiment = \"module:function\")")
    if ("grid" in config) == ("points" in config):
        raise ValueError(f"sweep config {path} needs exactly one of 'grid' (a table of lists) or 'points' (a list of "
                         "tables)")
    config.setdefault("out", str(path.with_suffix(".csv")))
    return config


def add_arguments(p) -> None:
    p.add_argument("config", help="sweep config (.toml or .json): experiment, grid, executor, out")
    p.add_argument("--executor", help="override: 'dask', 'sequential' or a scheduler address")
    p.add_argument("--out", help="override: output CSV")
    p.add_argument("--workers", type=int, help="override: local cluster size (executor 'dask')")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the per-point cache")
    p.add_argument("--recompute", action="store_true", help="ignore cached points (and overwrite them)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def run(args) -> int:
    from sinkflow.sweeps._points import SweepError
    from sinkflow.sweeps._sweep import sweep

    try:
        config = load_config(args.config)
    except ValueError as err:
        print(f"sinkflow sweep: {err}", file=sys.stderr)
        return 2
    executor = args.executor or config.get("executor", "dask")
    cache_dir = None if args.no_cache else config.get("cache_dir", ".sinkflow_cache")
    out = Path(args.out or config["out"])
    try:
        df = sweep(config.get("grid", config.get("points")), config["experiment"], executor=executor,
                   cache_dir=cache_dir, progress=not args.quiet,
                   n_workers=args.workers or config.get("n_workers", 2),
                   threads_per_worker=config.get("threads_per_worker", 1),
                   on_error=config.get("on_error", "raise"), recompute=args.recompute)
    except (ValueError, TypeError, SweepError) as err:
        print(f"sinkflow sweep: {err}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    a = df.attrs
    if not args.quiet and len(df) <= 60:
        print(df.to_string(index=False))
    print(f"{a['n_points']} points ({a['n_cached']} cached, {a['n_computed']} computed in {a['seconds']:.1f} s) "
          f"-> {out}", file=sys.stderr)
    return 0
