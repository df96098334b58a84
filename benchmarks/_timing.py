"""Shared timing helper of the benchmark scripts (run them from the repository root)."""

from __future__ import annotations

import statistics
import time


def timed(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` runs, after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)
