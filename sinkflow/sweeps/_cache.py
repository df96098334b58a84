"""The cache of a sweep: one JSON file per point under the SHA-256 of its experiment, parameters
and sinkflow version, written atomically, read back only when its inputs agree; results checked
to be JSON-able.
"""

from __future__ import annotations

import json
import os
import time
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sinkflow.sweeps._points import MAX_RESULT_SIZE, _import_experiment

__all__ = []


def _check_result(result, experiment: str, params: dict) -> dict:
    if not isinstance(result, Mapping):
        raise TypeError(f"experiment {experiment} returned {type(result).__name__} for {params}; "
                        "an experiment must return a dict of scalars or small arrays")
    clean = {}
    for k, v in result.items():
        if not isinstance(k, str):
            raise TypeError(f"experiment {experiment}: result names must be strings, got {k!r}")
        if k in params:
            raise ValueError(f"experiment {experiment}: result {k!r} has the name of a parameter; rename one of them")
        if type(v).__module__.startswith("torch") and hasattr(v, "detach"):
            v = v.detach().cpu().numpy()
        if isinstance(v, np.generic):
            v = v.item()
        if v is None or isinstance(v, (bool, int, float, str)):
            clean[k] = v
            continue
        if isinstance(v, (list, tuple, np.ndarray)):
            arr = np.asarray(v)
            if arr.dtype.kind in "biuf" and arr.size <= MAX_RESULT_SIZE:
                clean[k] = arr
                continue
        raise TypeError(f"experiment {experiment}: result {k!r} ({type(v).__name__}) is not a scalar or a small "
                        f"numeric array (at most {MAX_RESULT_SIZE} entries)")
    return clean


def _encode(value):
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": value.dtype.str, "shape": list(value.shape)}
    return value


def _decode(value):
    if isinstance(value, dict) and "__ndarray__" in value:
        return np.asarray(value["__ndarray__"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    return value


def _write_atomic(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w") as fh:
            json.dump(record, fh)  # not sort_keys: the result's key order is the table's column order
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
    finally:
        if tmp.exists():
            tmp.unlink()


def _read_cached(path: Path, experiment: str, params: dict):
    """The cached result of a point, or None (missing, unreadable or for another point)."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        warnings.warn(f"ignoring unreadable sweep cache file {path} ({err}); the point is recomputed", stacklevel=3)
        return None
    if record.get("experiment") != experiment or record.get("params") != params:
        return None
    return {k: _decode(v) for k, v in record["result"].items()}


def _run_point(target, experiment: str, params: dict, path: str | None):
    """Compute one point (on a worker) and cache it there, so finished work survives the client."""
    func = _import_experiment(target) if isinstance(target, str) else target
    t0 = time.perf_counter()
    result = _check_result(func(**params), experiment, params)
    seconds = time.perf_counter() - t0
    if path is not None:
        from sinkflow import __version__

        record = {"experiment": experiment, "params": params, "version": __version__, "seconds": seconds,
                  "result": {k: _encode(v) for k, v in result.items()}}
        _write_atomic(Path(path), record)
    return result
