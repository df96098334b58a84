"""One validator for the numeric parameters of the public API (torch-free: importing it never loads torch).

:func:`check_number` names the parameter in its error, so ``sinkhorn(C, tol="1e-6")`` says
``TypeError: tol must be a real number, got '1e-6'`` instead of failing deep inside a solver.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import numpy as np

__all__ = ["check_number", "check_seed", "check_choice", "check_numpy_float", "check_index", "warn_caller"]


def _is_torch(value: Any, cls: str) -> bool:
    """Whether ``value`` is a ``torch.<cls>``, without importing torch (a tensor implies torch is loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, getattr(torch, cls))


def check_seed(seed: Any, name: str = "seed"):
    """A random seed: None, a numpy Generator / SeedSequence, a torch Generator, or an integer >= 0."""
    if seed is None or isinstance(seed, (np.random.Generator, np.random.SeedSequence)) or _is_torch(seed, "Generator"):
        return seed
    return check_number(seed, name, integer=True, positive=True, allow_zero=True)


def _real_scalar(value: Any, name: str, what: str):
    """``value`` as a Python int or float; TypeError (it must be ``what``) for anything but a real number."""
    tensor = _is_torch(value, "Tensor")
    if tensor or isinstance(value, np.ndarray):
        real = (not (value.dtype.is_complex or str(value.dtype) == "torch.bool") if tensor
                else value.dtype.kind in "iuf")
        if value.ndim != 0 or not real:
            raise TypeError(f"{name} must be {what}, got an array of shape {tuple(value.shape)} "
                            f"and dtype {value.dtype}")
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def check_number(value: Any, name: str, *, integer: bool = False, positive: bool = False,
                 allow_zero: bool = False, allow_none: bool = False, allow_inf: bool = False):
    """Validate a numeric parameter once, naming it in the error; return it as int or float.

    Accepted: Python and numpy reals, 0-d arrays and 0-d tensors (their value; a tensor's
    graph is not kept). Refused: strings, None (unless ``allow_none``), booleans, NaN,
    infinities (unless ``allow_inf``), non-integers where ``integer``, and with ``positive``
    values ``<= 0`` (``< 0`` with ``allow_zero``).

    Raises
    ------
    TypeError
        Not a real number, or not an integer where one is needed.
    ValueError
        NaN, infinite, or outside the allowed sign.

    Examples
    --------
    >>> check_number(np.float32(0.5), "temperature", positive=True)
    0.5
    >>> check_number("1e-6", "tol")
    Traceback (most recent call last):
    ...
    TypeError: tol must be a real number, got '1e-6'
    """
    if value is None and allow_none:
        return None
    if type(value) not in (int, float):  # fast path for plain numbers (bool is not int here)
        value = _real_scalar(value, name, "an integer" if integer else "a real number")
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if integer and not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if positive and not (value > 0 or (allow_zero and value == 0)):
        bound = ((">= 0 (a non-negative integer)" if allow_zero else ">= 1 (a positive integer)") if integer
                 else (">= 0" if allow_zero else "positive"))
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return value


def check_numpy_float(x: Any, name: str) -> None:
    """Refuse array_like input (not a tensor) of a non-floating dtype, naming its numpy dtype, before
    a conversion to torch would name a torch dtype the caller never had.

    Examples
    --------
    >>> from sinkflow._checks import check_numpy_float
    >>> check_numpy_float([[1, 2]], "x0")
    Traceback (most recent call last):
    ...
    TypeError: x0 must have a floating dtype, got numpy int64; convert explicitly (e.g. x.astype(float))
    so precision is your choice.
    """
    if _is_torch(x, "Tensor"):
        return
    dtype = np.asarray(x).dtype
    if not np.issubdtype(dtype, np.floating):
        raise TypeError(f"{name} must have a floating dtype, got numpy {dtype}; convert explicitly "
                        "(e.g. x.astype(float)) so precision is your choice.")


def check_choice(value: Any, name: str, choices) -> None:
    """Refuse ``value`` unless it is one of ``choices``, naming the parameter and the choices.

    Examples
    --------
    >>> from sinkflow._checks import check_choice
    >>> check_choice("rk4", "integrator", ("euler", "rk4"))
    >>> check_choice("rk3", "integrator", ("euler", "rk4"))
    Traceback (most recent call last):
    ...
    ValueError: integrator must be one of ('euler', 'rk4'), got 'rk3'
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_index(index: Any, shape: tuple, name: str) -> tuple:
    """``index`` as a multi-index of ``shape`` (entries made non-negative): a tuple of ints, or one
    int counting the entries of ``shape`` in C order; negative counts from the end."""
    import numpy as np

    if not shape:
        raise ValueError(f"{name} selects in a batch, and this one has no batch dimensions (one system)")
    count = int(np.prod(shape))

    def is_int(i):
        return isinstance(i, (int, np.integer)) and not isinstance(i, bool)

    if is_int(index):
        if not -count <= index < count:
            raise ValueError(f"{name}={index} is outside the {count} entries of the batch {shape}")
        return tuple(int(i) for i in np.unravel_index(int(index) % count, shape))
    if not isinstance(index, tuple) or not all(map(is_int, index)):
        raise TypeError(f"{name} must be an int or a tuple of ints, got {index!r}")
    if len(index) != len(shape) or not all(-b <= i < b for i, b in zip(index, shape, strict=True)):
        raise ValueError(f"{name}={index} is not a multi-index of the batch shape {shape}")
    return tuple(int(i) % b for i, b in zip(index, shape, strict=True))


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointed at the caller's line: the first frame outside the sinkflow package.

    A warning then names the user's call (``simulate(...)`` in their script or notebook) however deep
    in the package it was raised, without a ``stacklevel`` counted by hand at each call site.
    """
    import os
    import warnings

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level, frame = 2, sys._getframe(1)  # stacklevel 2 is warn_caller's caller
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)
