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
from sinkflow.clustering._saddles import _points, _symmetric_scaling, unstable_directions

__all__ = ["count_history", "dwell_times", "two_cluster_dwell", "point_cluster_dwell", "staircase_level",
           "fit_exponent", "plateau_run"]


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
    runs = [(int(counts[s]), s, e) for s, e in zip(starts, ends, strict=True) if counts[s] > 0]
    return [(c, float(times[e] - times[s])) for c, s, e in runs[1:-1]] if len(runs) > 2 else []


def _pair_weights(beta, m_a, m_b, delta, normalization):
    """``P_AB + P_BA`` of two point clusters ``delta`` apart (module docstring)."""
    return 1.0 / _scaled_inverse_weights(beta, m_a, m_b, delta, normalization, 0.0)


def _scaled_inverse_weights(beta, m_a, m_b, delta, normalization, log_q0):
    """``q0 / (P_AB + P_BA)`` with ``log q0 = log_q0``, formed from ``log q`` so that no ``q`` under- or overflows.

    ``q0`` is the smallest ``q`` of the integration (the widest separation): the ratio is then at most of
    order 1 where the dwell accumulates, and the dwell is its integral times ``1 / q0 = e^{-log_q0}``.
    """
    log_q = -beta * (1 - math.cos(delta))
    if normalization == "softmax":
        q = math.exp(log_q)
        return math.exp(log_q0 - log_q) / (m_b / (m_a + m_b * q) + m_a / (m_b + m_a * q))
    s = _symmetric_scaling(np.array([[0.0, log_q], [log_q, 0.0]]), np.array([m_a, m_b]))
    return math.exp(log_q0 - log_q - s[0] - s[1]) / (m_a + m_b)


def two_cluster_dwell(beta: float, masses, separation: float, normalization: str = "softmax", *,
                      end: float = 0.1) -> float:
    r"""Time two point clusters of ``masses`` ``separation`` rad apart take to come within ``end`` rad.

    The reduced equation :math:`\dot\Delta = -\sin\Delta\,(P_{AB} + P_{BA})` of the module docstring,
    integrated exactly (quadrature of :math:`d\Delta/\dot\Delta` in :math:`\log(\pi - \Delta)`, with the
    factor :math:`e^{\beta(1 - \cos\Delta_0)}` of the widest separation taken out, so that no weight
    under- or overflows).

    Raises
    ------
    OverflowError
        The dwell is beyond float64 (it grows like :math:`e^{2\beta}`: past :math:`\beta \approx 355` near
        antipodal); the message gives its natural logarithm.

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
    m = np.asarray(masses)
    if m.dtype.kind not in "iuf":
        raise TypeError(f"masses must be two positive numbers, got {masses!r:.80}")
    if m.shape != (2,) or not np.isfinite(m).all() or not (m > 0).all():
        raise ValueError(f"masses must be exactly two positive finite numbers (the two clusters), got {masses!r:.80}")
    m_a, m_b = (float(v) for v in m)
    separation = float(check_number(separation, "separation", positive=True))
    end = float(check_number(end, "end", positive=True))
    if not end < separation < math.pi:
        raise ValueError(f"need 0 < end < separation < pi, got end={end}, separation={separation}")
    log_q0 = -beta * (1 - math.cos(separation))

    def integrand(log_eta):  # d(log eta) with eta = pi - Delta, times q0
        eta = math.exp(log_eta)
        return eta / math.sin(eta) * _scaled_inverse_weights(beta, m_a, m_b, math.pi - eta, normalization, log_q0)

    lo, hi = math.log(math.pi - separation), math.log(math.pi - end)
    kink = 0.5 * math.log(1 / beta)
    scaled = quad(integrand, lo, hi, limit=200, points=[kink] if lo < kink < hi else None)[0]
    if not scaled > 0:  # the scaled integrand underflowed off its peak: only where e^{-log_q0} alone is huge
        raise OverflowError(f"two_cluster_dwell: the dwell at beta={beta:g} (separation={separation:g}) carries "
                            f"the factor e^(beta (1 - cos separation)) = e^{-log_q0:.4g}, beyond float64 "
                            f"(e^{_LOG_MAX:.1f})")
    log_dwell = math.log(scaled) - log_q0
    if log_dwell > _LOG_MAX:
        raise OverflowError(f"two_cluster_dwell: the dwell at beta={beta:g} (separation={separation:g}) is "
                            f"e^{log_dwell:.1f}, beyond float64 (e^{_LOG_MAX:.1f}); it grows like e^(2 beta): "
                            "take a smaller beta, or compare log-times")
    return float(scaled * math.exp(-log_q0))


_LOG_MAX = math.log(np.finfo(float).max)


def _point_velocity(x, masses, beta, normalization):
    """Velocities of point clusters ``x`` (k, d) of ``masses`` under the attention flow on the sphere (``x``
    normalized first: no radial dynamics, whose fast decay would otherwise limit the steps)."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    S = beta * (x @ x.T)
    if normalization == "softmax":
        L = S + np.log(masses)[None, :]
        P = np.exp(L - L.max(1, keepdims=True))
        P /= P.sum(1, keepdims=True)
    else:  # the symmetric plan pi_ij = m_i m_j e^{s_i + s_j + S_ij}, rows P_ij = pi_ij / m_i
        s = _symmetric_scaling(S, masses, tol=1e-13)
        P = masses[None, :] * np.exp(S + s[:, None] + s[None, :])
    y = P @ x
    return y - (y * x).sum(1, keepdims=True) * x


def point_cluster_dwell(points, masses, beta: float, normalization: str = "softmax", *, end: float = 0.1,
                        t_max: float = math.inf) -> float:
    r"""Time ``k`` point clusters take until the closest two come within ``end`` rad (``inf`` past ``t_max``).

    The flow of particles that sit exactly on ``k`` points is the flow of ``k`` weighted particles
    (coincident particles stay coincident), here integrated adaptively (``scipy.integrate.solve_ivp``,
    DOP853, relative tolerance :math:`10^{-10}`): its steps follow the slow drift near a saddle, which an
    explicit step of the particles cannot (their stability limit is set by the fast contraction inside a
    cluster). For two clusters on the circle this is :func:`two_cluster_dwell`; for more, the pull of all
    the others is in, which the closest-pair law neglects.

    Parameters
    ----------
    points : array (k,) of angles or (k, d) of unit vectors
    masses : array (k,)
        Positive masses (normalized to sum 1).
    beta : float
    normalization : {"softmax", "sinkhorn"}
    end : float
        Separation (rad) that ends the plateau.
    t_max : float
        Give up (return ``inf``) after this time.

    Examples
    --------
    >>> import math
    >>> from sinkflow.clustering import point_cluster_dwell, two_cluster_dwell
    >>> T = point_cluster_dwell([0.0, math.pi - 0.01], [0.6, 0.4], 3.0)
    >>> bool(abs(T / two_cluster_dwell(3.0, [0.6, 0.4], math.pi - 0.01) - 1) < 1e-6)
    True
    """
    from scipy.integrate import solve_ivp

    x = _points(points)
    m = np.asarray(masses, dtype=float)
    beta = float(check_number(beta, "beta", positive=True))
    check_choice(normalization, "normalization", ("softmax", "sinkhorn"))
    if m.shape != (len(x),) or len(x) < 2 or np.any(m <= 0):
        raise ValueError(f"masses must be {len(x)} positive numbers, one per point (at least two points)")
    m = m / m.sum()
    k, d, cos_end = len(x), x.shape[1], math.cos(float(check_number(end, "end", positive=True)))

    def closest(t, z):  # > 0 while every pair is further than end
        y = z.reshape(k, d) / np.linalg.norm(z.reshape(k, d), axis=1, keepdims=True)
        return cos_end - (y @ y.T - 3 * np.eye(k)).max()

    closest.terminal, closest.direction = True, -1
    if closest(0.0, x.ravel()) <= 0:
        return 0.0
    sol = solve_ivp(lambda t, z: _point_velocity(z.reshape(k, d), m, beta, normalization).ravel(), (0.0, float(t_max)),
                    x.ravel(), method="DOP853", rtol=1e-10, atol=1e-12, events=closest)
    return float(sol.t_events[0][0]) if sol.t_events[0].size else math.inf


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
                clusters: int = 2, t_max: float | None = None, samples: int = 40, tol: float = 1e-10,
                handoff: float | None = None) -> dict:
    r"""One run from ``n`` i.i.d. uniform points on :math:`S^{d-1}` until its ``clusters``-cluster plateau ends.

    With :math:`c = 1 - \cos(2\pi/\text{clusters})` (2 for the last plateau), ``simulate`` (Euler, 0.9
    times the safe step) runs in chunks of :math:`\max(20, e^{c\beta}/5)` time units, ``samples`` counts
    (:func:`~sinkflow.clustering.cluster_centers`) per chunk, until a whole chunk has between 1 and
    ``clusters - 1`` clusters (that plateau ended or was skipped), or ``t_max`` (default
    :math:`12 e^{c\beta}`). A plateau is a count held for at least 3 samples; the dwell is the longest
    ``clusters``-cluster plateau, from its first sample to the first sample with another count (censored if
    still running at the end); beside it :func:`two_cluster_dwell` of its closest pair (masses and
    separation at its first sample; exact for 2 clusters, the pull of the others neglected beyond). At the
    middle of every plateau: :func:`~sinkflow.clustering.unstable_directions` of the climbed energy, and the
    energy against :func:`staircase_level`.

    ``handoff`` (a width in rad, e.g. ``1e-4``) hands the plateau to :func:`point_cluster_dwell` once it has
    held a whole chunk (of 20 time units) with every particle within ``handoff`` of its cluster's center:
    the particles are then ``clusters`` points to that accuracy, and the dwell is the time held so far plus
    the exact flow of those points (``reduced``) until two come within 0.1 rad.

    Returns
    -------
    dict
        ``beta, seed, n, d, normalization, clusters, h, dwell`` (None if censored or none), ``censored``,
        ``start``, ``masses`` and ``separation`` (of the closest pair), ``predicted`` (its law), ``handoff``
        and ``reduced`` (the time handed off and the reduced flow's share, None without), ``times``,
        ``counts``, ``energies``, ``plateaus`` (``count, start, end, positive, zero, negative, energy,
        level``).
    """
    beta = float(check_number(beta, "beta", positive=True))
    check_choice(normalization, "normalization", ("softmax", "sinkhorn"))
    k = int(check_number(clusters, "clusters", integer=True, positive=True))
    if k < 2:
        raise ValueError(f"clusters must be at least 2 (a plateau that ends), got {clusters}")
    if handoff is not None:
        handoff = float(check_number(handoff, "handoff", positive=True))
    scale = math.exp(beta * (1 - math.cos(2 * math.pi / k)))
    t_max = 12 * scale if t_max is None else float(t_max)
    times, counts, energies, configs, h = _sampled_run(beta, seed, n, d, normalization, k, t_max,
                                                       20.0 if handoff else max(20.0, scale / 5), samples, tol, handoff)
    plateaus = _plateaus(np.asarray(counts), configs, beta, normalization)
    out = dict(beta=beta, seed=int(seed), n=int(n), d=int(d), normalization=normalization, clusters=k, h=h,
               dwell=None, start=None, masses=None, separation=None, predicted=None, censored=False, handoff=None,
               reduced=None)
    held = [p for p in plateaus if p["count"] == k]
    if held:
        handed = handoff is not None and _settled(counts, configs, k, samples, handoff)
        p = held[-1] if handed else max(held, key=lambda p: p["end"] - p["start"])
        out.update(_closest_pair(configs[p["start"]], k, beta, normalization), start=times[p["start"]],
                   censored=p["end"] == len(times))
        if handed:
            centers, masses = cluster_centers(configs[-1])
            reduced = point_cluster_dwell(centers, masses, beta, normalization, t_max=t_max - times[-1])
            out.update(handoff=times[-1], reduced=reduced, censored=math.isinf(reduced))
        end = times[-1] + (out["reduced"] or 0.0) if handed else times[min(p["end"], len(times) - 1)]
        out["dwell"] = None if out["censored"] else end - times[p["start"]]
    return dict(out, times=times, counts=counts, energies=energies, plateaus=plateaus)


def _sampled_run(beta, seed, n, d, normalization, k, t_max, chunk, samples, tol, handoff):
    """Particles from a uniform start, ``samples`` counts per ``chunk`` time units, until a whole chunk has
    between 1 and ``k - 1`` clusters (the ``k``-cluster plateau ended, or was skipped), the plateau settled
    (with ``handoff``), or ``t_max``."""
    from sinkflow.particles import largest_safe_step, random_particles, simulate

    x = random_particles(int(n), int(d), seed=seed, manifold="sphere")
    h = 0.9 * largest_safe_step(x, normalization, temperature=1 / beta)
    stride = max(1, int(round(chunk / samples / h)))
    times, counts, energies, configs = [0.0], [0], [_energy(x, beta, normalization)], [x]

    def done():
        last = counts[-samples:]
        if len(counts) <= samples:
            return False
        return 1 <= min(last) <= max(last) < k or (
            handoff is not None and _settled(counts, configs, k, samples, handoff))

    while times[-1] < t_max and not done():
        traj = simulate(x, normalization, h=h, steps=stride * samples, manifold="sphere", temperature=1 / beta,
                        tol=tol, save_every=stride)
        for y in traj.positions[1:]:
            times.append(times[-1] + stride * h)
            counts.append(int(cluster_centers(y)[1].size))
            energies.append(_energy(y, beta, normalization))
            configs.append(y)
        x = traj.final
    return times, counts, energies, configs, h


def _settled(counts, configs, k, samples, width) -> bool:
    """The last ``samples`` counts are all ``k`` and every particle is within ``width`` rad of its cluster's center."""
    if len(counts) <= samples or set(counts[-samples:]) != {k}:
        return False
    x = configs[-1]
    centers = cluster_centers(x)[0]
    return bool(np.arccos(np.clip((x @ centers.T).max(1), -1, 1)).max() <= width)


def _closest_pair(x, k, beta, normalization) -> dict:
    """Masses and separation of the closest two clusters of ``x``, and :func:`two_cluster_dwell` of them."""
    centers, masses = cluster_centers(x)
    dots = centers @ centers.T - 3 * np.eye(masses.size)
    i, j = np.unravel_index(np.argmax(dots), dots.shape)
    sep = float(np.arccos(np.clip(dots[i, j], -1, 1))) if masses.size == k else math.nan
    law = two_cluster_dwell(beta, masses[[i, j]], sep, normalization) if 0.1 < sep < math.pi else None
    return dict(masses=[float(masses[i]), float(masses[j])], separation=sep, predicted=law)


def _plateaus(counts, configs, beta, normalization, min_samples: int = 3) -> list:
    change = np.flatnonzero(np.diff(counts) != 0) + 1
    bounds = zip(np.concatenate([[0], change]), np.concatenate([change, [counts.size]]), strict=True)
    rows = []
    for s, e in bounds:
        if counts[s] >= 1 and e - s >= min_samples:
            mid = configs[(s + e) // 2]
            pos, zero, neg = unstable_directions(mid, beta, normalization=normalization)
            rows.append(dict(count=int(counts[s]), start=int(s), end=int(e), positive=pos, zero=zero, negative=neg,
                             energy=_energy(mid, beta, normalization),
                             level=staircase_level(cluster_centers(mid)[1], beta, normalization)))
    return rows
