"""Confidence intervals of a mean over seeds, for the studies that compare attentions seed by seed."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["t_interval"]


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    r"""Mean and two-sided Student-t confidence interval of the mean of ``values``.

    :math:`\bar x \pm t_{(1+\mathrm{level})/2,\,n-1}\, s / \sqrt n`, ``s`` the sample standard
    deviation (``ddof=1``): the interval of ``scipy.stats.t.interval(level, n - 1, loc=mean,
    scale=sem)``. With paired values (one difference per seed) it is the paired t-interval.

    Parameters
    ----------
    values : array_like
        One value per seed (finite).
    level : float
        Confidence level in (0, 1).

    Returns
    -------
    (mean, low, high) : tuple of float
        ``low`` and ``high`` are NaN for a single value; equal to the mean when all values agree.

    Examples
    --------
    >>> from sinkflow.studies.intervals import t_interval
    >>> mean, lo, hi = t_interval([0.1, 0.2, 0.3])
    >>> round(mean, 6), round(lo, 4), round(hi, 4)
    (0.2, -0.0484, 0.4484)
    """
    from scipy import stats

    x = np.asarray(values, dtype=float).ravel()
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"values must be non-empty and finite, got {values!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf((1 + level) / 2, x.size - 1)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half
