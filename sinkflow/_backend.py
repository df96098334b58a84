"""Tiny numpy/torch dispatch: every solver computes in torch, numpy callers get numpy back.

torch.from_numpy shares memory, so the round trip costs nothing beyond the solve itself.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

__all__ = ["to_torch", "from_torch", "is_torch", "check_finite", "check_float", "exp_floor", "torch_threads"]


@contextlib.contextmanager
def torch_threads(n: int = 1):
    """Run a block on ``n`` torch threads, restoring the previous setting afterwards.

    Small problems gain nothing from torch's thread pool, and on a loaded machine its
    spin-waiting made small operations 10-150x slower (docs/performance.md).
    """
    before = torch.get_num_threads()
    if before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def exp_floor(dtype: torch.dtype) -> float:
    """Lower clamp for ``exp`` arguments: one unit above log(smallest normal).

    Entries below it are irrelevant next to any line sum that is used, and float32 ``exp``
    takes a slow path on (and below) log(tiny): 92 ms vs 1.7 ms per 1024^2 on the
    reference machine (docs/performance.md).
    """
    import math

    return math.log(torch.finfo(dtype).tiny) + 1.0


def is_torch(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def check_float(x: torch.Tensor, name: str) -> None:
    if not torch.is_floating_point(x):
        raise TypeError(
            f"{name} must have a floating dtype, got {x.dtype}; "
            f"convert explicitly (e.g. x.astype(float)) so precision is your choice."
        )


def check_finite(x: torch.Tensor, name: str, hint: str = "") -> None:
    # Fast path: one reduction (isfinite(x).all() was 50x slower than a sum on CPU). A NaN or
    # inf anywhere makes the sum non-finite; a sum that merely overflows falls through to the
    # exact check below and passes.
    if x.numel() == 0 or bool(torch.isfinite(x.sum())):
        return
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name} has {bad} non-finite entries (NaN or inf)" + (f"; {hint}" if hint else ""))


def to_torch(x: Any, name: str = "input", *, dtype: torch.dtype | None = None, like: torch.Tensor | None = None) -> torch.Tensor:
    """Convert ``x`` to a torch tensor without copying when possible.

    ``like`` puts the result on the device (and float dtype) of another tensor.
    """
    if isinstance(x, torch.Tensor):
        t = x
    else:
        arr = np.asarray(x)
        if arr.dtype == object:
            raise TypeError(f"{name} could not be converted to a numeric array")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if like is not None:
        t = t.to(device=like.device, dtype=like.dtype if torch.is_floating_point(t) or dtype is None else dtype)
    if dtype is not None:
        t = t.to(dtype)
    return t


def from_torch(t: torch.Tensor | None, numpy_out: bool):
    """Return ``t`` as numpy when the caller passed numpy (detached, on CPU)."""
    if t is None or not numpy_out:
        return t
    return t.detach().cpu().numpy()
