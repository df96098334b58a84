r"""The clustering phase diagram of attention dynamics on the sphere (docs/theory/sphere.md).

Geshkovski, Letrouit, Polyanskiy and Rigollet ("A mathematical perspective on Transformers",
their ``phase-diagrams.py``) run thousands of independent systems of ``n`` tokens drawn uniformly
on :math:`S^{d-1}` under the layer-norm flow :math:`\dot x_i = P^\perp_{x_i} \sum_j K_{ij} x_j` with
:math:`K` the SoftMax of :math:`\beta \langle x_i, x_j\rangle`, and record, for each inverse
temperature :math:`\beta` and time :math:`t`, the fraction of systems whose tokens have all pairwise
inner products above a threshold (0.999): one cluster. Here the same sweep is one ensemble call
of :func:`sinkflow.simulate` per :math:`\beta`, and the Sinkhorn flow (the doubly stochastic
:math:`K^\infty`) runs beside SoftMax.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sinkflow._backend import check_number, check_seed
from sinkflow._checks import check_choice
from sinkflow._progress import progress_bar

__all__ = ["phase_diagram", "NORMALIZATIONS"]

#: The attentions of the phase diagram (names of :func:`sinkflow.simulate`).
NORMALIZATIONS = ("softmax", "sinkhorn")


def _grid_steps(times, h: float) -> np.ndarray:
    """Step indices of ``times`` (each a multiple of ``h``, sorted, >= 0), or a ValueError."""
    t = np.asarray(times, dtype=float)
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)) or np.any(t < 0) or np.any(np.diff(t) < 0):
        raise ValueError(f"times must be a non-empty increasing 1-D array of times >= 0, got {times!r}")
    steps = np.rint(t / h).astype(int)
    if np.abs(steps * h - t).max() > 1e-9 * max(1.0, t.max()):
        raise ValueError(f"times must be multiples of the step h = {h:g}, got {t.tolist()}")
    return steps


def _clustered(positions: torch.Tensor, threshold: float) -> np.ndarray:
    """Fraction of systems (axis 1 of ``(T, systems, n, d)``) whose pairwise inner products all exceed ``threshold``."""
    out = []
    for X in positions:  # one saved time at a time: (systems, n, n) at most
        out.append(float(((X @ X.mT).flatten(1).amin(1) > threshold).double().mean()))
    return np.array(out)


def phase_diagram(beta, *, n: int, d: int, normalization: str, systems: int, times, threshold: float = 0.999,
                  seed=0, h: float = 0.1, progress: bool = True):
    r"""Fraction of clustered systems against :math:`\beta` and :math:`t`, on the sphere :math:`S^{d-1}`.

    For every ``beta``, ``systems`` independent systems of ``n`` tokens uniform on :math:`S^{d-1}`
    (the same draws for every ``beta``) follow :func:`sinkflow.simulate` with
    ``manifold="sphere"``, ``temperature = 1 / beta``, Euler steps of ``h`` (float32; Sinkhorn to its
    float32 tolerance), in one ensemble call. A system is clustered at time ``t`` when all its
    pairwise inner products exceed ``threshold``.

    Parameters
    ----------
    beta : array_like (B,)
        Inverse temperatures (> 0).
    n, d : int
        Tokens per system and their dimension (``d = 2``: the circle).
    normalization : {"softmax", "sinkhorn"}
    systems : int
        Independent systems per ``beta``.
    times : array_like (T,)
        Increasing times >= 0, multiples of ``h``.
    threshold : float
        Inner-product threshold of a cluster (in (-1, 1)).
    seed : int
        Seed of the initial tokens.
    h : float
        Euler step (``h (1 + 2 beta) < 2`` keeps it stable, :func:`sinkflow.particles.lipschitz_scale`).
    progress : bool
        A progress bar over ``beta`` (quiet where the output is not a terminal).

    Returns
    -------
    pandas.DataFrame
        Tidy: columns ``beta``, ``t``, ``clustered_fraction``; one row per ``(beta, t)``.

    Examples
    --------
    >>> import sinkflow
    >>> table = sinkflow.phase_diagram([1.0, 4.0], n=8, d=2, normalization="softmax", systems=16,
    ...                                times=[0.0, 10.0], progress=False)
    >>> list(table.columns), len(table)
    (['beta', 't', 'clustered_fraction'], 4)
    >>> float(table.clustered_fraction.iloc[0])   # uniform starts are not clustered at t = 0
    0.0
    """
    import pandas as pd

    from sinkflow.particles import random_particles, simulate

    check_choice(normalization, "normalization", NORMALIZATIONS)
    n = check_number(n, "n", integer=True, positive=True)
    d = check_number(d, "d", integer=True, positive=True)
    systems = check_number(systems, "systems", integer=True, positive=True)
    h = check_number(h, "h", positive=True)
    threshold = check_number(threshold, "threshold")
    if not -1.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (-1, 1) (an inner product of unit vectors), got {threshold!r}")
    betas = np.asarray(beta, dtype=float).reshape(-1)
    if betas.size == 0 or not np.all(np.isfinite(betas) & (betas > 0)):
        raise ValueError(f"beta must be a non-empty array of positive finite values, got {beta!r}")
    steps = _grid_steps(times, h)
    every = math.gcd(*steps.tolist()) or 1
    rng = np.random.default_rng(check_seed(seed))
    x0 = torch.as_tensor(np.stack([random_particles(n, d, seed=rng, manifold="sphere") for _ in range(systems)]),
                         dtype=torch.float32)
    rows = []
    for b in progress_bar(betas, enabled=progress, desc=f"{normalization} phase diagram", unit="beta"):
        traj = simulate(x0, normalization, h=h, steps=int(steps[-1]), manifold="sphere", temperature=1.0 / b,
                        save_every=every)
        rows.append(_clustered(traj.positions[steps // every], threshold))
    t = steps * h
    return pd.DataFrame({"beta": np.repeat(betas, len(t)), "t": np.tile(t, len(betas)),
                         "clustered_fraction": np.concatenate(rows)})
