"""Sweepable experiments: module-level functions ``f(**params) -> dict of scalars``.

An experiment takes its parameters as keyword arguments (numbers, strings, booleans:
JSON values, so a sweep can key its cache by them) and returns a small dict of scalars
or small arrays. That is all :func:`sinkflow.sweep` needs; any importable function of
this shape is an experiment, named on the command line as ``"module:function"``.
"""

from sinkflow.experiments.heat import heat_limit_point
from sinkflow.experiments.sinkhorn import sinkhorn_convergence

__all__ = ["sinkhorn_convergence", "heat_limit_point"]
