"""Where generated data sets are kept: ``$SINKFLOW_CACHE`` or the platform's user cache folder,
one file per generator and arguments.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """Where generated data sets are cached: ``$SINKFLOW_CACHE`` or the user cache directory.

    Examples
    --------
    >>> from sinkflow.datasets import cache_dir
    >>> cache_dir().name in ("sinkflow", "datasets") or "SINKFLOW_CACHE" in __import__("os").environ
    True
    """
    if os.environ.get("SINKFLOW_CACHE"):
        return Path(os.environ["SINKFLOW_CACHE"]).expanduser()
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sinkflow"


def _cached(name: str, arguments: dict, make, cache: bool):
    """``make()`` -> dict of arrays, stored as ``.npz`` under the cache directory when ``cache``."""
    if not cache:
        return make()
    key = hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "datasets" / f"{name}-{key}.npz"
    if path.exists():
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    out = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npz")
    np.savez_compressed(tmp, **out)
    tmp.replace(path)
    return out
