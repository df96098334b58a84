r"""Dynamic metastability on the circle: how long each cluster count lasts, and why it does not last.

docs/theory/clustering.md. SoftMax particles on the circle ascend the interaction energy
:math:`E(\theta) = \frac{1}{2\beta}\sum_{ij} a_i a_j e^{\beta\cos(\theta_i - \theta_j)}` in a positive
diagonal metric (:math:`\dot\theta_i = \partial_i E / (a_i Z_i)`), so a configuration of :math:`k`
clusters is a saddle when the Hessian of :math:`E` has positive eigenvalues (directions that climb),
:math:`k - 1` of them for :math:`k` separated clusters (bringing two clusters together), beside the
negative ones of the spread inside each cluster and the zero of a rotation
(:func:`energy_hessian`). Two clusters :math:`\Delta` apart attract each other at a rate
:math:`\propto e^{-\beta(1 - \cos\Delta)}` (the SoftMax weight of the other cluster), so a plateau of
:math:`k` clusters lasts :math:`\sim e^{\beta(1 - \cos(2\pi/k))}` (:func:`dwell_times`).
"""

from __future__ import annotations

import numpy as np

from sinkflow._checks import check_number
from sinkflow.clustering._predictions import cluster_positions

__all__ = ["energy_hessian", "count_history", "dwell_times"]


def energy_hessian(theta, beta: float, weights=None) -> np.ndarray:
    r"""Hessian of :math:`e^{-\beta} E(\theta)` in the angles (``n x n``, scaled: no overflow).

    With :math:`f(t) = e^{\beta(\cos t - 1)}`, :math:`f'' = f\,(\beta^2\sin^2 t - \beta\cos t)`:
    :math:`H_{ij} = -a_i a_j f''(\theta_i - \theta_j)/\beta` for :math:`i \ne j` and
    :math:`H_{ii} = \sum_{j \ne i} a_i a_j f''(\theta_i - \theta_j)/\beta`.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import energy_hessian
    >>> H = energy_hessian(2 * np.pi * np.arange(3) / 3, 4.0)   # three points, an equilateral triangle
    >>> ev = np.linalg.eigvalsh(H)   # a rotation (0) and two climbing directions
    >>> bool(abs(ev[0]) < 1e-15), bool(ev[1] > 0), bool(np.isclose(ev[1], ev[2]))
    (True, True, True)
    """
    theta = np.asarray(theta, dtype=float).ravel()
    beta = float(check_number(beta, "beta", positive=True))
    a = np.full(theta.size, 1.0 / theta.size) if weights is None else np.asarray(weights, dtype=float)
    t = theta[:, None] - theta[None, :]
    f2 = np.exp(beta * (np.cos(t) - 1)) * (beta ** 2 * np.sin(t) ** 2 - beta * np.cos(t))
    H = -np.outer(a, a) * f2 / beta
    np.fill_diagonal(H, 0.0)
    np.fill_diagonal(H, -H.sum(1))
    return H


def count_history(beta: float, seed: int, n: int = 1000, t_max: float = 200.0, *, h: float = 0.1,
                  every: float = 1.0, normalization: str = "softmax") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cluster counts of ``n`` i.i.d. uniform particles along a long run, every ``every`` time units.

    Returns ``(times, counts, angles)``: counts by :func:`cluster_positions`, angles ``(len(times), n)``.
    """
    from sinkflow.particles import largest_safe_step, simulate

    theta = np.random.default_rng(seed).uniform(0, 2 * np.pi, int(n))
    x0 = np.stack([np.cos(theta), np.sin(theta)], 1)
    h = min(float(h), largest_safe_step(x0, normalization, temperature=1 / beta))
    stride = max(1, int(round(every / h)))
    steps = stride * int(np.ceil(t_max / (stride * h)))
    traj = simulate(x0, normalization, h=h, steps=steps, manifold="sphere", temperature=1 / beta, save_every=stride)
    angles = np.arctan2(traj.positions[..., 1], traj.positions[..., 0])
    return traj.times, np.array([cluster_positions(t).size for t in angles]), angles


def dwell_times(times, counts) -> list[tuple[int, float]]:
    """``(count, duration)`` of every completed plateau: the maximal runs of one nonzero count after
    the first one (the formation) and before the last one (still running at the end).

    Examples
    --------
    >>> from sinkflow.clustering import dwell_times
    >>> dwell_times([0, 1, 2, 3, 4, 5, 6], [0, 3, 3, 2, 2, 2, 1])
    [(2, 3.0)]
    """
    times, counts = np.asarray(times), np.asarray(counts)
    change = np.flatnonzero(np.diff(counts) != 0) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [counts.size]])
    runs = [(int(counts[s]), s, e) for s, e in zip(starts, ends) if counts[s] > 0]
    return [(c, float(times[e] - times[s])) for c, s, e in runs[1:-1]] if len(runs) > 2 else []
