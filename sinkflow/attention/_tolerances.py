"""Tolerances that follow the dtype: the marginal error a float type can attain on an n x m
problem, the default tolerance of a solve, and how a requested tolerance is checked against
what is attainable.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from sinkflow._backend import check_number
from sinkflow._backend import compute_dtype as _compute_dtype  # float16 and bfloat16 are solved in float32
from sinkflow.attention._result import SinkhornWarning

__all__ = ["attainable_error", "default_tolerance"]


_DEFAULT_TOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def attainable_error(dtype, n, m=None):
    """Marginal error that rounding alone leaves in a Sinkhorn solve of size ``n x m``.

    About ``4 eps sqrt(max(n, m))`` in the dtype the solve is computed in (float32 for
    float16 and bfloat16 inputs); plus, for those, the rounding of the returned matrix,
    ``eps`` of the half dtype. Measured float32 floors were 0.1-0.9 ``eps sqrt(n)`` for
    n = 8 ... 2048.

    Examples
    --------
    >>> import torch, sinkflow.attention as N
    >>> N.attainable_error(torch.float32, 128) < 1e-5 < N.attainable_error(torch.float32, 10**5)
    True
    """
    dtype = _as_torch_dtype(dtype)
    m = n if m is None else m
    compute = _compute_dtype(dtype)
    floor = 4.0 * torch.finfo(compute).eps * math.sqrt(max(n, m))
    return floor + (torch.finfo(dtype).eps if compute != dtype else 0.0)


def default_tolerance(dtype, n=1, m=None):
    """Default ``tol`` of :func:`solve_sinkhorn` for scores of ``dtype`` and size ``n x m``.

    ============  ==========
    dtype         tolerance
    ============  ==========
    float64       1e-9
    float32       1e-5
    float16       1e-3
    bfloat16      1e-2
    ============  ==========

    raised to :func:`attainable_error` for very large problems.

    Examples
    --------
    >>> import torch, sinkflow.attention as N
    >>> N.default_tolerance(torch.float64), N.default_tolerance(torch.float32)
    (1e-09, 1e-05)
    """
    dtype = _as_torch_dtype(dtype)
    if dtype not in _DEFAULT_TOL:
        raise TypeError(f"Sinkhorn supports float16, bfloat16, float32 and float64 scores, got {dtype}")
    return max(_DEFAULT_TOL[dtype], attainable_error(dtype, n, m))


def _as_torch_dtype(dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch.from_numpy(np.zeros(0, dtype=np.dtype(dtype))).dtype


def _resolve_tolerance(tol, dtype, shape, warn):
    n, m = shape[-2], shape[-1]
    if tol is None:
        return default_tolerance(dtype, n, m)
    tol = check_number(tol, "tol", positive=True, allow_zero=True)
    if tol == 0:
        return 0.0  # POT's stopThr=0: no stopping test, max_iter half-iterations
    floor = attainable_error(dtype, n, m)
    if tol < floor:
        if warn:
            warnings.warn(
                f"tol={tol:g} is below the marginal error {dtype} can reach for {n} x {m} scores "
                f"(about {floor:.1g}); solving to {floor:.1g} instead. Pass float64 scores for tighter "
                "solutions.", SinkhornWarning, stacklevel=4)  # the caller of solve_sinkhorn
        return floor
    return float(tol)
