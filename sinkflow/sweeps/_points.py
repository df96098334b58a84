"""The points of a sweep: a grid expanded into parameter dicts (JSON-able, in a stable order),
the experiment that runs on each (a function, or a "module:function" name a worker can import),
and the cache key of a point; :class:`SweepError` for what goes wrong.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import math
from collections.abc import Callable, Mapping

import numpy as np

__all__ = ["SweepError", "expand_grid", "resolve_experiment", "point_key"]


#: Result arrays larger than this are refused: a sweep table holds summaries, not data sets.
MAX_RESULT_SIZE = 100_000


class SweepError(RuntimeError):
    """A sweep point failed; the points finished before it are cached (re-run to resume)."""


def _jsonable(value, where: str):
    """Plain-Python copy of a parameter value, or a TypeError saying why it cannot key a cache."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value!r} is not a finite number; sweep parameters key a JSON cache")
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v, where) for k, v in value.items()}
    raise TypeError(
        f"{where}: value {value!r} of type {type(value).__name__} is not JSON-serialisable; sweep "
        "parameters must be numbers, strings, booleans, None, or lists/dicts of those, because "
        "they key the on-disk cache (pass a seed or a file name instead of an object)")


def expand_grid(grid) -> list[dict]:
    """The points of a sweep grid, as a list of parameter dicts.

    Parameters
    ----------
    grid : dict or list of dict
        A dict ``name -> list of values`` is expanded to the cartesian product (in the
        dict's order, the last name varying fastest); a value that is not a list, tuple,
        range or 1D array is a fixed parameter. A list of dicts is taken as the points
        themselves.

    Returns
    -------
    list of dict
        JSON-compatible parameter dicts (numpy scalars become Python numbers).

    Raises
    ------
    ValueError
        Empty grid, a parameter with no values, non-finite floats, duplicate points.
    TypeError
        Values that are not JSON-serialisable, non-string parameter names.

    Examples
    --------
    >>> from sinkflow.sweeps import expand_grid
    >>> expand_grid({"n": [8, 16], "scale": [1.0, 2.0], "seed": 0})
    [{'n': 8, 'scale': 1.0, 'seed': 0}, {'n': 8, 'scale': 2.0, 'seed': 0},
     {'n': 16, 'scale': 1.0, 'seed': 0}, {'n': 16, 'scale': 2.0, 'seed': 0}]
    >>> expand_grid([{"n": 8}, {"n": 16, "scale": 4.0}])
    [{'n': 8}, {'n': 16, 'scale': 4.0}]
    """
    if isinstance(grid, Mapping):
        if not grid:
            raise ValueError("empty grid: give at least one parameter, e.g. {'n': [8, 16]}")
        axes = []
        for name, values in grid.items():
            if not isinstance(name, str):
                raise TypeError(f"grid parameter names must be strings, got {name!r}")
            if isinstance(values, np.ndarray):
                if values.ndim != 1:
                    raise ValueError(f"grid parameter {name!r}: give a 1D list of values, got an array of shape "
                                     f"{values.shape}")
                values = values.tolist()
            if isinstance(values, (list, tuple, range)):
                values = list(values)
                if not values:
                    raise ValueError(f"empty grid: parameter {name!r} has no values, so the grid has no points")
            else:
                values = [values]
            axes.append([_jsonable(v, f"grid parameter {name!r}") for v in values])
        points = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*axes)]
    elif isinstance(grid, (list, tuple)):
        if not grid:
            raise ValueError("empty grid: the list of points is empty")
        points = []
        for i, p in enumerate(grid):
            if not isinstance(p, Mapping):
                raise TypeError(f"grid point {i} must be a dict of parameters, got {type(p).__name__}")
            if not all(isinstance(k, str) for k in p):
                raise TypeError(f"grid point {i}: parameter names must be strings, got {list(p)}")
            points.append({k: _jsonable(v, f"grid point {i}, parameter {k!r}") for k, v in p.items()})
    else:
        raise TypeError(f"grid must be a dict of lists or a list of dicts, got {type(grid).__name__}")
    seen = set()
    for p in points:
        key = json.dumps(p, sort_keys=True)
        if key in seen:
            raise ValueError(f"duplicate grid point {p}: each point must be unique (it keys one cache entry)")
        seen.add(key)
    return points


def _import_experiment(spec: str) -> Callable:
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"unknown experiment {spec!r}: name it as 'module:function', "
                         "e.g. 'sinkflow.experiments:sinkhorn_convergence'")
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise ValueError(f"unknown experiment {spec!r}: no module named {err.name!r}") from None
        raise
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = getattr(module, "__all__", None) or sorted(
                n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                and getattr(v, "__module__", None) == module.__name__)
            hint = f"; it defines: {', '.join(public)}" if public else ""
            raise ValueError(f"unknown experiment {spec!r}: module {module_name!r} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"experiment {spec!r} is a {type(obj).__name__}, not a function")
    return obj


def resolve_experiment(fn) -> tuple[Callable, str]:
    """The function and the qualified name (``"module:qualname"``) of an experiment.

    Parameters
    ----------
    fn : callable or str
        A module-level function, or its import string ``"module:function"``.

    Returns
    -------
    (callable, str)

    Examples
    --------
    >>> from sinkflow.sweeps import resolve_experiment
    >>> resolve_experiment("sinkflow.experiments:sinkhorn_convergence")[1]
    'sinkflow.experiments.sinkhorn:sinkhorn_convergence'
    """
    func = _import_experiment(fn) if isinstance(fn, str) else fn
    if not callable(func):
        raise TypeError(f"fn must be a function or a 'module:function' string, got {type(fn).__name__}")
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname:
        raise TypeError(f"experiment {func!r} has no module-level name (a functools.partial or a callable "
                        "object?); define a module-level function so its name can key the cache")
    return func, f"{module}:{qualname}"


def point_key(experiment: str, params: dict, version: str | None = None) -> str:
    """SHA-256 cache key of one sweep point: experiment name, parameters (sorted JSON), package version.

    Examples
    --------
    >>> from sinkflow.sweeps import point_key
    >>> point_key("m:f", {"n": 8, "seed": 0}) == point_key("m:f", {"seed": 0, "n": 8})
    True
    >>> point_key("m:f", {"n": 8}) == point_key("m:f", {"n": 16})
    False
    """
    if version is None:
        from sinkflow import __version__ as version
    payload = json.dumps({"experiment": experiment, "params": params, "version": version}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()
