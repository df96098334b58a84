r"""The clustering phase diagram of attention dynamics on the sphere (docs/theory/sphere.md).

Geshkovski, Letrouit, Polyanskiy and Rigollet ("A mathematical perspective on Transformers",
their ``phase-diagrams.py``) run thousands of independent systems of ``n`` tokens drawn uniformly
on :math:`S^{d-1}` under the layer-norm flow :math:`\dot x_i = P^\perp_{x_i} \sum_j K_{ij} x_j` with
:math:`K` the SoftMax of :math:`\beta \langle x_i, x_j\rangle`, and record, for each inverse
temperature :math:`\beta` and time :math:`t`, the fraction of systems whose tokens have all pairwise
inner products above a threshold (0.999): one cluster. Here the same sweep is one ensemble call
of :func:`sinkflow.simulate` per :math:`\beta`, and the Sinkhorn flow (the doubly stochastic
:math:`K^\infty`) runs beside SoftMax.

**Clustered systems leave the batch.** Clustered is absorbing under these Euler steps
(``h <= 1``, :math:`\beta > 0`, any nonnegative row-stochastic :math:`K`, SoftMax or Sinkhorn): a
step sends :math:`x_i` to the direction of :math:`(1 - h \langle m_i, x_i\rangle) x_i + h m_i`,
:math:`m_i = \sum_j K_{ij} x_j`, a nonnegative combination of the tokens, so the convex cone of
the tokens never grows; when every two tokens are within an angle :math:`r < \pi/2` (threshold
> 0), the spherical cap of radius :math:`r` around each token is convex and holds them all, so it
holds the cone's section, whose diameter is therefore still at most :math:`r`. A system is
recorded at its first clustered step and then dropped.

**Metastable plateaus.** Large :math:`\beta` gives clusters that merge on times like
:math:`e^{\beta (1 - \cos \theta)}` (:math:`\theta` their angle): half of the systems of
:math:`n = 32` tokens on the circle cluster by :math:`t = 1.3 \cdot 10^7` (SoftMax) and
:math:`2.5 \cdot 10^7` (Sinkhorn) at :math:`\beta = 9`, out of reach of fixed steps. With
``max_angle``, tokens closer than ``MERGE_ANGLE`` merge into one token at their
mass-weighted mean carrying their mass (exact for coincident tokens, which every attention here
sees as one weighted token), and while every two distinct tokens of a system are more than
``FAR_ANGLE`` apart (no stiff intra-cluster mode left) its step grows, by at most 4x per step,
to move no token by more than ``max_angle``; elsewhere it is ``h``. Measured against fixed steps
of 0.1 (256 systems of n = 32, beta = 3, t <= 1000) and against ``max_angle = 0.005`` (beta = 9,
t <= 1e9): clustered fractions within 0.03, clustering slightly later.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from sinkflow._backend import check_number, check_seed
from sinkflow._checks import check_choice
from sinkflow._optional import require
from sinkflow._progress import progress_bar

__all__ = ["phase_diagram", "clustered_fractions", "NORMALIZATIONS"]

#: The attentions of the phase diagram (names of :func:`sinkflow.simulate`).
NORMALIZATIONS = ("softmax", "sinkhorn")


#: Tokens of a system closer than this angle (radians) merge into one token carrying their mass.
MERGE_ANGLE = 1e-3
#: Steps longer than ``h`` only while every two distinct tokens of a system are this far apart (radians).
FAR_ANGLE = 0.2
_CHUNK = 10  # fixed steps per ensemble call
_GROWTH = 4.0  # largest factor by which a step grows from one step to the next


def _check_times(times) -> np.ndarray:
    t = np.asarray(times, dtype=float)
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)) or np.any(t < 0) or np.any(np.diff(t) < 0):
        raise ValueError(f"times must be a non-empty increasing 1-D array of times >= 0, got {times!r}")
    return t


def _gram(x):
    return x @ x.mT


def _first_clustered(path, threshold):
    """Index of the first clustered state of ``path`` ``(T, S, m, d)`` per system, for systems
    clustered at its end (clustered systems stay clustered: module docstring)."""
    ok = _gram(path).flatten(2).amin(2) > threshold  # (T, S)
    return ok.int().argmax(0)


def _compact(x, a, cos_merge, width=None):
    r"""Merge the tokens of each system closer than ``cos_merge`` (inner product) into one token at
    their normalized mass-weighted mean carrying their mass; pad to ``width`` (default the largest
    cluster count) with copies of the first cluster sharing its mass (coincident copies are one
    token to every attention). Returns positions, masses and cluster counts.
    """
    S, m, d = x.shape
    rep = (_gram(x) > cos_merge).int().argmax(-1)  # the first token each one is merged into (itself at least)
    mass = torch.zeros_like(a).scatter_add_(1, rep, a)
    center = torch.zeros_like(x).scatter_add_(1, rep[..., None].expand(-1, -1, d), a[..., None] * x)
    keep = mass > 0
    k = keep.sum(1)
    width = int(k.max()) if width is None else width
    order = torch.argsort((~keep).int(), dim=1, stable=True)[:, :width]  # the clusters first
    order = torch.nn.functional.pad(order, (0, width - order.shape[1]))  # slots past m: padding
    pos = center.gather(1, order[..., None].expand(-1, -1, d))
    pos = pos / torch.linalg.vector_norm(pos, dim=-1, keepdim=True)
    mass = mass.gather(1, order)
    pad = torch.arange(width, device=x.device) >= k[:, None]
    share = mass[:, :1] / (1 + width - k[:, None])
    pos = torch.where(pad[..., None], pos[:, :1], pos)
    mass = torch.where(pad, share, mass)
    mass[:, :1] = share
    return pos, mass, k


@dataclass
class _Pool:
    """The systems still running: ids, positions ``(S, m, d)``, masses ``(S, m)``, times and next steps ``(S,)``."""

    ids: torch.Tensor
    x: torch.Tensor
    a: torch.Tensor
    t: torch.Tensor
    h: torch.Tensor

    def select(self, keep: torch.Tensor) -> _Pool:
        return _Pool(*(v[keep] for v in (self.ids, self.x, self.a, self.t, self.h)))


@dataclass(frozen=True)
class _Run:
    """One ``(beta, normalization)`` run: the flow's options and the step rule."""

    normalization: str
    beta: float
    h: float
    horizon: float
    threshold: float
    max_angle: float | None

    def advance(self, pool: _Pool, steps: int, clustered_at: torch.Tensor, dtype: torch.dtype) -> _Pool:
        """``steps`` Euler steps of every system of ``pool`` (its own step each, in ``dtype``); records
        the first clustered time of each system in ``clustered_at``; returns the systems still running."""
        from sinkflow.particles import simulate

        x, a = (pool.x, None) if self.max_angle is None else _compact(pool.x, pool.a, math.cos(MERGE_ANGLE))[:2]
        with warnings.catch_warnings():  # the worst-case step bound does not hold on plateaus (docstring)
            warnings.filterwarnings("ignore", "step h=", RuntimeWarning)
            path = simulate(x.to(dtype), self.normalization, h=pool.h, steps=steps, manifold="sphere",
                            temperature=1.0 / self.beta, weights=None if a is None else a.to(dtype),
                            save_every=1).positions.double()
        end = _gram(path[-1])
        done = end.flatten(1).amin(1) > self.threshold
        first = _first_clustered(path[1:, done], self.threshold)
        clustered_at[pool.ids[done]] = pool.t[done] + pool.h[done] * (first + 1)
        moved = torch.linalg.vector_norm(path[-1] - path[0], dim=-1).amax(-1) / steps
        t = pool.t + steps * pool.h
        out = _Pool(pool.ids, path[-1], pool.a if a is None else a, t, self.next_step(end, moved, pool.h, t))
        return out.select(~done & (t < self.horizon))

    def next_step(self, G, moved, h, t):
        """``h`` while two distinct tokens are closer than ``FAR_ANGLE``, else the step that moves no
        token by more than ``max_angle`` (at least ``h``, at most ``_GROWTH`` times the last one)."""
        if self.max_angle is None:
            return h
        near = ((G > math.cos(FAR_ANGLE)) & (G <= math.cos(MERGE_ANGLE))).flatten(1).any(1)
        grow = (self.max_angle / moved.clamp_min(1e-300)).clamp_max(_GROWTH)
        longer = torch.minimum((h * grow).clamp_min(self.h), self.horizon - t)
        return torch.where(near, torch.full_like(h, self.h), longer.clamp_min(1e-12))


def _join(parts):
    """One pool from pools of possibly different widths (re-padded to the widest)."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.x.shape[1] for p in parts)
    padded = []
    for p in parts:
        if p.x.shape[1] < width:
            x, a, _ = _compact(p.x, p.a, math.cos(MERGE_ANGLE), width)
            p = _Pool(p.ids, x, a, p.t, p.h)
        padded.append(p)
    return _Pool(*(torch.cat(v) for v in zip(*((p.ids, p.x, p.a, p.t, p.h) for p in padded), strict=True)))


def _clustering_times(x0: torch.Tensor, run: _Run) -> torch.Tensor:
    """Each system's first integration time at which it is clustered (inf if not by the horizon)."""
    S, n, _ = x0.shape
    clustered_at = torch.full((S,), math.inf, dtype=torch.float64)
    first = (_gram(x0).flatten(1).amin(1) > run.threshold)
    clustered_at[first] = 0.0
    pool = _Pool(torch.arange(S), x0, torch.full((S, n), 1.0 / n, dtype=x0.dtype), torch.zeros(S, dtype=x0.dtype),
                 torch.full((S,), run.h, dtype=x0.dtype)).select(~first)
    while len(pool.ids):
        fixed = pool.h <= run.h
        parts = [run.advance(pool.select(fixed), _CHUNK, clustered_at, torch.float32)] if bool(fixed.any()) else []
        if not bool(fixed.all()):
            parts.append(run.advance(pool.select(~fixed), 1, clustered_at, torch.float64))
        pool = _join([p for p in parts if len(p.ids)] or parts[:1])
    return clustered_at


def phase_diagram(beta, *, n: int, d: int, normalization: str, systems: int, times, threshold: float = 0.999,
                  seed=0, h: float = 0.1, max_angle: float | None = 0.02, progress: bool = True):
    r"""Fraction of clustered systems against :math:`\beta` and :math:`t`, on the sphere :math:`S^{d-1}`.

    For every ``beta``, ``systems`` independent systems of ``n`` tokens uniform on :math:`S^{d-1}`
    (the same draws for every ``beta``) follow :func:`sinkflow.simulate` with
    ``manifold="sphere"``, ``temperature = 1 / beta``, Euler steps of ``h`` (float32; Sinkhorn to its
    float32 tolerance) in ensemble calls, and on metastable plateaus longer float64 steps (module
    docstring), up to the horizon ``times[-1]``. A system is clustered at time ``t`` when all its
    pairwise inner products exceed ``threshold`` at its last integration time ``<= t``; clustered
    systems stay clustered (module docstring) and leave the batch.

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
        Increasing times >= 0; the last is the horizon (a log-spaced grid suits the plateaus).
    threshold : float
        Inner-product threshold of a cluster (in (0, 1)).
    seed : int
        Seed of the initial tokens.
    h : float
        Euler step (``h (1 + 2 beta) < 2`` keeps it stable, :func:`sinkflow.particles.lipschitz_scale`;
        at most 1).
    max_angle : float or None
        Largest angle (radians) a token moves in one plateau step; None: steps of ``h`` all the way
        (the plain flow; clustered systems still leave the batch).
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
    pd = require("pandas", "sinkflow.phase_diagram")  # before the long computation
    betas, t, fractions = clustered_fractions(beta, n=n, d=d, normalization=normalization, systems=systems,
                                              times=times, threshold=threshold, seed=seed, h=h, max_angle=max_angle,
                                              progress=progress)
    return pd.DataFrame({"beta": np.repeat(betas, len(t)), "t": np.tile(t, len(betas)),
                         "clustered_fraction": fractions.reshape(-1)})


def clustered_fractions(beta, *, n: int, d: int, normalization: str, systems: int, times, threshold: float = 0.999,
                        seed=0, h: float = 0.1, max_angle: float | None = 0.02, progress: bool = True):
    r""":func:`phase_diagram`'s numbers as numpy arrays, without pandas.

    Parameters
    ----------
    beta, n, d, normalization, systems, times, threshold, seed, h, max_angle, progress
        As for :func:`phase_diagram`.

    Returns
    -------
    beta : ndarray (B,)
        The inverse temperatures.
    t : ndarray (T,)
        The times.
    fraction : ndarray (B, T)
        ``fraction[i, j]``: the fraction of systems clustered at ``beta[i]`` by ``t[j]``
        (the figure ``clustering_phase_diagram`` draws it).

    Examples
    --------
    >>> import sinkflow
    >>> beta, t, fraction = sinkflow.clustered_fractions([1.0, 4.0], n=8, d=2, normalization="softmax",
    ...                                                  systems=16, times=[0.0, 10.0], progress=False)
    >>> fraction.shape, float(fraction[0, 0])   # uniform starts are not clustered at t = 0
    ((2, 2), 0.0)
    """
    from sinkflow.particles import random_particles

    check_choice(normalization, "normalization", NORMALIZATIONS)
    n = check_number(n, "n", integer=True, positive=True)
    d = check_number(d, "d", integer=True, positive=True)
    systems = check_number(systems, "systems", integer=True, positive=True)
    h = check_number(h, "h", positive=True)
    if h > 1.0:
        raise ValueError(f"h must be at most 1 (clustered systems then stay clustered), got {h!r}")
    threshold = check_number(threshold, "threshold")
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1) (an inner product of unit vectors; clustered systems stay "
                         f"clustered above 0), got {threshold!r}")
    betas = np.asarray(beta, dtype=float).reshape(-1)
    if betas.size == 0 or not np.all(np.isfinite(betas) & (betas > 0)):
        raise ValueError(f"beta must be a non-empty array of positive finite values, got {beta!r}")
    if max_angle is not None:
        max_angle = check_number(max_angle, "max_angle", positive=True)
    t = _check_times(times)
    rng = np.random.default_rng(check_seed(seed))
    x0 = torch.as_tensor(np.stack([random_particles(n, d, seed=rng, manifold="sphere") for _ in range(systems)]),
                         dtype=torch.float64)
    rows = []
    for b in progress_bar(betas, enabled=progress, desc=f"{normalization} phase diagram", unit="beta"):
        at = _clustering_times(x0, _Run(normalization, float(b), h, float(t[-1]), threshold, max_angle)).numpy()
        rows.append((at[None, :] <= t[:, None] + 1e-9 * np.maximum(1.0, t[:, None])).mean(1))
    return betas, t, np.stack(rows)
