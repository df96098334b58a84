r"""Dynamic metastability on the circle and on :math:`S^2`: how long each cluster count lasts, and why.

docs/theory/clustering.md. A plateau of the cluster count is a configuration near a saddle of the
energy the flow climbs (:mod:`sinkflow.clustering._saddles`: :math:`E_\beta` for SoftMax,
:math:`-F^\infty` for Sinkhorn), left along its few unstable directions. Two point clusters of masses
:math:`m_A, m_B` an angle :math:`\Delta` apart move towards each other at
:math:`\dot\Delta = -\sin\Delta\,(P_{AB} + P_{BA})`, with the attention weight of the other cluster
:math:`P_{AB} = m_B q/(m_A + m_B q)`, :math:`q = e^{-\beta(1 - \cos\Delta)}` (SoftMax), or
:math:`m_B u_A u_B q` with the symmetric scalings of the 2-point Sinkhorn problem
(:math:`\approx\sqrt{m_B/m_A}\, q`). Antipodal clusters are an equilibrium (:math:`\sin\pi = 0`) that
the flow leaves at the rate :math:`(m_A/m_B + m_B/m_A)e^{-2\beta}` (SoftMax), so the last plateau lasts
:math:`T_2 \approx e^{2\beta}\,(\log(1/\eta_0) - \tfrac12\log\beta + O(1))/(m_A/m_B + m_B/m_A)` from a start
:math:`\eta_0 = \pi - \Delta_0` off antipodal: exponent 2 in :math:`\beta`, with a logarithmic prefactor
(:func:`two_cluster_dwell` integrates the reduced equation exactly). :func:`plateau_run` measures the
dwell of particles from a uniform start, :func:`fit_exponent` fits :math:`\log T` against
:math:`\beta` with a bootstrap interval, :func:`staircase_level` is the energy of point clusters.
"""

from __future__ import annotations

import math

import numpy as np

from sinkflow._checks import check_choice, check_number
from sinkflow.clustering._predictions import cluster_centers, cluster_positions
from sinkflow.clustering._saddles import _symmetric_scaling, unstable_directions

__all__ = ["count_history", "dwell_times", "two_cluster_dwell", "staircase_level", "fit_exponent", "plateau_run"]


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


def _pair_weights(beta, m_a, m_b, delta, normalization):
    """``P_AB + P_BA`` of two point clusters ``delta`` apart (module docstring)."""
    q = math.exp(-beta * (1 - math.cos(delta)))
    if normalization == "softmax":
        return m_b * q / (m_a + m_b * q) + m_a * q / (m_b + m_a * q)
    u = np.exp(_symmetric_scaling(np.log([[1.0, q], [q, 1.0]]), np.array([m_a, m_b])))
    return (m_a + m_b) * u[0] * u[1] * q


def two_cluster_dwell(beta: float, masses, separation: float, normalization: str = "softmax", *,
                      end: float = 0.1) -> float:
    r"""Time two point clusters of ``masses`` ``separation`` rad apart take to come within ``end`` rad.

    The reduced equation :math:`\dot\Delta = -\sin\Delta\,(P_{AB} + P_{BA})` of the module docstring,
    integrated exactly (quadrature of :math:`d\Delta/\dot\Delta` in :math:`\log(\pi - \Delta)`).

    Examples
    --------
    >>> import math
    >>> from sinkflow.clustering import two_cluster_dwell
    >>> extra = two_cluster_dwell(4.0, [0.5, 0.5], math.pi - 1e-3) - two_cluster_dwell(4.0, [0.5, 0.5], math.pi - 1e-2)
    >>> round(extra / (math.exp(8) * math.log(10) / 2), 3)   # a 10 times smaller eta_0 adds e^{2 beta} log(10) / 2
    1.0
    """
    from scipy.integrate import quad

    beta = float(check_number(beta, "beta", positive=True))
    check_choice(normalization, "normalization", ("softmax", "sinkhorn"))
    m_a, m_b = (float(m) for m in masses)
    if not (0 < m_a and 0 < m_b):
        raise ValueError(f"masses must be two positive numbers, got {masses!r}")
    if not 0 < end < separation < math.pi:
        raise ValueError(f"need 0 < end < separation < pi, got end={end}, separation={separation}")

    def integrand(log_eta):  # d(log eta) with eta = pi - Delta
        eta = math.exp(log_eta)
        return eta / (math.sin(eta) * _pair_weights(beta, m_a, m_b, math.pi - eta, normalization))

    lo, hi = math.log(math.pi - separation), math.log(math.pi - end)
    return float(quad(integrand, lo, hi, limit=200, points=[0.5 * math.log(1 / beta)] if lo < -0.5 * math.log(beta) < hi else None)[0])


def staircase_level(masses, beta: float, normalization: str = "softmax") -> float:
    r"""Energy of point clusters of ``masses`` far apart: :math:`\frac{1}{2\beta}\sum_c m_c^2` for
    SoftMax (:math:`e^{-\beta}E_\beta`), :math:`-\frac\beta2 + \frac12\sum_c m_c\log\frac1{m_c}` for
    Sinkhorn (:math:`F^\infty`: one cluster of mass :math:`m` has :math:`s = -(\beta + \log m)/2`).

    Examples
    --------
    >>> from sinkflow.clustering import staircase_level
    >>> round(staircase_level([0.5, 0.5], 2.0, "sinkhorn"), 6)   # -1 + log(2) / 2
    -0.653426
    """
    m = np.asarray(masses, dtype=float)
    beta = float(check_number(beta, "beta", positive=True))
    check_choice(normalization, "normalization", ("softmax", "sinkhorn"))
    if normalization == "softmax":
        return float((m ** 2).sum() / (2 * beta))
    return float(-beta / 2 - 0.5 * (m * np.log(m)).sum())


def fit_exponent(betas, times, *, resamples: int = 2000, confidence: float = 0.95, seed: int = 0):
    r"""Slope of :math:`\log T` against :math:`\beta` (least squares) with a bootstrap interval.

    The runs are resampled with replacement within each value of :math:`\beta`. Returns
    ``(slope, low, high)``.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import fit_exponent
    >>> b = np.repeat([2.0, 3.0, 4.0], 4)
    >>> slope, lo, hi = fit_exponent(b, 7 * np.exp(2 * b))
    >>> round(slope, 9), round(lo, 9), round(hi, 9)
    (2.0, 2.0, 2.0)
    """
    b, t = np.asarray(betas, dtype=float), np.asarray(times, dtype=float)
    if b.shape != t.shape or b.ndim != 1 or np.unique(b).size < 2:
        raise ValueError("betas and times must be 1-d of the same length, with at least two values of beta")
    if np.any(t <= 0):
        raise ValueError("times must be positive")
    y = np.log(t)
    slope = float(np.polyfit(b, y, 1)[0])
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(b == v) for v in np.unique(b)]
    boot = np.empty(int(resamples))
    for r in range(boot.size):
        idx = np.concatenate([rng.choice(g, g.size) for g in groups])
        boot[r] = np.polyfit(b[idx], y[idx], 1)[0]
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    return slope, float(lo), float(hi)


def _energy(x, beta, normalization):
    """:math:`e^{-\\beta}E_\\beta` (SoftMax) or :math:`F^\\infty` (Sinkhorn) of uniform weights."""
    a = np.full(len(x), 1.0 / len(x))
    if normalization == "softmax":
        return float(a @ np.exp(beta * (x @ x.T - 1)) @ a / (2 * beta))
    return float(a @ _symmetric_scaling(beta * (x @ x.T), a, tol=1e-12))


def plateau_run(beta: float, seed: int, n: int = 256, d: int = 2, normalization: str = "softmax", *,
                clusters: int = 2, t_max: float | None = None, samples: int = 40, tol: float = 1e-10) -> dict:
    r"""One run from ``n`` i.i.d. uniform points on :math:`S^{d-1}` until its ``clusters``-cluster plateau ends.

    With :math:`c = 1 - \cos(2\pi/\text{clusters})` (2 for the last plateau), ``simulate`` (Euler, 0.9
    times the safe step) runs in chunks of :math:`\max(20, e^{c\beta}/5)` time units, ``samples`` counts
    (:func:`~sinkflow.clustering.cluster_centers`) per chunk, until a whole chunk has fewer than
    ``clusters`` clusters after ``clusters`` were seen, or ``t_max`` (default :math:`12 e^{c\beta}`). A
    plateau is a count held for at least 3 samples; the dwell is the longest ``clusters``-cluster plateau,
    from its first sample to the first sample with another count (censored if still running at the end);
    beside it :func:`two_cluster_dwell` of its closest pair (masses and separation at its first sample;
    exact for 2 clusters, the pull of the others neglected beyond). At the middle of every plateau:
    :func:`~sinkflow.clustering.unstable_directions` of the climbed energy, and the energy against
    :func:`staircase_level`.

    Returns
    -------
    dict
        ``beta, seed, n, d, normalization, clusters, h, dwell`` (None if censored or none), ``censored``,
        ``start``, ``masses`` and ``separation`` (of the closest pair), ``predicted`` (its law), ``times``,
        ``counts``, ``energies``, ``plateaus`` (``count, start, end, positive, zero, negative, energy,
        level``).
    """
    from sinkflow.particles import largest_safe_step, random_particles, simulate

    beta = float(check_number(beta, "beta", positive=True))
    check_choice(normalization, "normalization", ("softmax", "sinkhorn"))
    k = int(check_number(clusters, "clusters", integer=True, positive=True))
    if k < 2:
        raise ValueError(f"clusters must be at least 2 (a plateau that ends), got {clusters}")
    x = random_particles(int(n), int(d), seed=seed, manifold="sphere")
    h = 0.9 * largest_safe_step(x, normalization, temperature=1 / beta)
    scale = math.exp(beta * (1 - math.cos(2 * math.pi / k)))
    t_max = 12 * scale if t_max is None else float(t_max)
    stride = max(1, int(round(max(20.0, scale / 5) / samples / h)))
    times, counts, energies, configs = [0.0], [0], [_energy(x, beta, normalization)], [x]
    while times[-1] < t_max and not (k in counts and max(counts[-samples:]) < k):
        traj = simulate(x, normalization, h=h, steps=stride * samples, manifold="sphere", temperature=1 / beta,
                        tol=tol, save_every=stride)
        for y in traj.positions[1:]:
            times.append(times[-1] + stride * h)
            counts.append(int(cluster_centers(y)[1].size))
            energies.append(_energy(y, beta, normalization))
            configs.append(y)
        x = traj.final
    plateaus = _plateaus(np.asarray(counts), configs, beta, normalization)
    out = dict(beta=beta, seed=int(seed), n=int(n), d=int(d), normalization=normalization, clusters=k, h=h,
               dwell=None, start=None, masses=None, separation=None, predicted=None, censored=False)
    held = [p for p in plateaus if p["count"] == k]
    if held:
        p = max(held, key=lambda p: p["end"] - p["start"])
        centers, masses = cluster_centers(configs[p["start"]])
        dots = centers @ centers.T - 3 * np.eye(masses.size)
        i, j = np.unravel_index(np.argmax(dots), dots.shape)
        sep = float(np.arccos(np.clip(dots[i, j], -1, 1))) if masses.size == k else math.nan
        out.update(start=times[p["start"]], masses=[float(masses[i]), float(masses[j])], separation=sep,
                   censored=p["end"] == len(times),
                   predicted=two_cluster_dwell(beta, masses[[i, j]], sep, normalization) if 0.1 < sep < math.pi else None)
        out["dwell"] = None if out["censored"] else times[p["end"]] - times[p["start"]]
    return dict(out, times=times, counts=counts, energies=energies, plateaus=plateaus)


def _plateaus(counts, configs, beta, normalization, min_samples: int = 3) -> list:
    change = np.flatnonzero(np.diff(counts) != 0) + 1
    bounds = zip(np.concatenate([[0], change]), np.concatenate([change, [counts.size]]))
    rows = []
    for s, e in bounds:
        if counts[s] >= 1 and e - s >= min_samples:
            mid = configs[(s + e) // 2]
            pos, zero, neg = unstable_directions(mid, beta, normalization=normalization)
            rows.append(dict(count=int(counts[s]), start=int(s), end=int(e), positive=pos, zero=zero, negative=neg,
                             energy=_energy(mid, beta, normalization),
                             level=staircase_level(cluster_centers(mid)[1], beta, normalization)))
    return rows
