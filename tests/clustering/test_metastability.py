"""Plateaus as saddles of the interaction energy (finite differences of an energy written here) and dwell times."""

import numpy as np
import pytest

from sinkflow.clustering import dwell_times, energy_hessian


def _energy(theta, beta, a):
    """e^{-beta} E(theta) = sum_ij a_i a_j e^{beta (cos(theta_i - theta_j) - 1)} / (2 beta), directly."""
    return float(a @ np.exp(beta * (np.cos(theta[:, None] - theta[None, :]) - 1)) @ a / (2 * beta))


def test_hessian_is_the_second_derivative_of_the_energy():
    rng = np.random.default_rng(0)
    theta, beta = rng.uniform(0, 2 * np.pi, 7), 3.0
    a = rng.uniform(0.5, 1.0, 7)
    a /= a.sum()
    step, n = 1e-4, theta.size
    fd = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            def shifted(si, sj, i=i, j=j):
                t = theta.copy()
                t[i] += si
                t[j] += sj
                return _energy(t, beta, a)
            fd[i, j] = (shifted(step, step) - shifted(step, -step) - shifted(-step, step)
                        + shifted(-step, -step)) / (4 * step ** 2)
    np.testing.assert_allclose(energy_hessian(theta, beta, a), fd, atol=1e-7)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_k_separated_clusters_are_a_saddle_with_k_minus_1_climbing_directions(k):
    beta, m = 6.0, 5
    spread = np.linspace(-1e-3, 1e-3, m)
    theta = np.concatenate([2 * np.pi * c / k + spread for c in range(k)])
    ev = np.linalg.eigvalsh(energy_hessian(theta, beta))
    tiny = 1e-9 * np.abs(ev).max()
    assert (ev > tiny).sum() == k - 1  # bring two clusters together: E climbs
    assert (ev < -tiny).sum() == k * (m - 1)  # spread inside a cluster: E falls
    assert (np.abs(ev) <= tiny).sum() == 1  # the rotation


def test_dwell_times_keep_only_completed_plateaus():
    assert dwell_times([0, 1, 2, 3, 4, 5, 6], [0, 3, 3, 2, 2, 2, 1]) == [(2, 3.0)]
    assert dwell_times([0, 1, 2, 3], [0, 4, 3, 3]) == []  # the formation and a plateau still running
    assert dwell_times(np.arange(8.0), [0, 5, 4, 4, 3, 3, 3, 2]) == [(4, 2.0), (3, 3.0)]


def test_two_cluster_dwell_is_the_time_two_weighted_particles_take():
    """The reduced law against sinkflow.simulate of two weighted particles (RK4), both normalizations."""
    import math

    from sinkflow.clustering import two_cluster_dwell
    from sinkflow.particles import simulate

    beta, masses, delta0, end, h = 1.0, np.array([0.7, 0.3]), math.pi - 0.3, 0.1, 0.1
    x0 = np.array([[1.0, 0.0], [math.cos(delta0), math.sin(delta0)]])
    for normalization in ("softmax", "sinkhorn"):
        predicted = two_cluster_dwell(beta, masses, delta0, normalization, end=end)
        traj = simulate(x0, normalization, h=h, steps=int(1.3 * predicted / h), weights=masses, integrator="rk4",
                        manifold="sphere", temperature=1 / beta, tol=1e-13)
        gap = np.arccos(np.clip((traj.positions[:, 0] * traj.positions[:, 1]).sum(-1), -1, 1))
        measured = np.interp(-end, -gap, traj.times)  # gap decreases through end
        assert abs(measured / predicted - 1) < 2e-3, (normalization, measured, predicted)


def test_exponent_fit_recovers_a_planted_law_and_its_interval_covers_it():
    from sinkflow.clustering import fit_exponent

    rng = np.random.default_rng(0)
    betas = np.repeat([2.0, 2.5, 3.0, 3.5, 4.0], 12)
    times = 5 * np.exp(1.7 * betas) * rng.lognormal(0.0, 0.3, betas.size)
    slope, lo, hi = fit_exponent(betas, times)
    assert abs(slope - 1.7) < 0.1 and lo < 1.7 < hi and hi - lo < 0.3
    with pytest.raises(ValueError, match="two values of beta"):
        fit_exponent([2.0, 2.0], [1.0, 2.0])


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_staircase_levels_are_the_energies_of_far_point_clusters(normalization):
    """Against sinkflow.energy_sphere / energy_inf (POT-checked elsewhere) of a hand-made configuration."""
    import sinkflow
    from sinkflow.clustering import staircase_level

    beta, counts = 40.0, np.array([5, 3, 2])
    angles = np.repeat(2 * np.pi * np.arange(3) / 3, counts)
    x = np.stack([np.cos(angles), np.sin(angles)], 1)
    if normalization == "softmax":
        measured = np.exp(-beta) * sinkflow.energy_sphere(x, beta=beta)
    else:
        measured = sinkflow.energy_inf(x, W=beta * np.eye(2))
    level = staircase_level(counts / counts.sum(), beta, normalization)
    assert abs(measured - level) < 1e-12 * abs(level) + 1e-20


def test_cluster_centers_of_a_hand_made_configuration():
    from sinkflow.clustering import cluster_centers

    theta = np.concatenate([np.full(60, 1.0), np.full(20, 4.0)]) + np.linspace(-1e-3, 1e-3, 80)
    centers, masses = cluster_centers(np.stack([np.cos(theta), np.sin(theta)], 1))
    np.testing.assert_allclose(np.arctan2(centers[:, 1], centers[:, 0]) % (2 * np.pi), [1.0, 4.0], atol=1e-3)
    np.testing.assert_allclose(masses, [0.75, 0.25])


def test_cluster_centers_on_s2_by_components():
    from sinkflow.clustering import cluster_centers

    rng = np.random.default_rng(0)
    poles = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
    x = np.repeat(poles, [50, 30, 20], axis=0) + 1e-3 * rng.normal(size=(100, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    centers, masses = cluster_centers(x)
    order = np.argsort(-masses)
    np.testing.assert_allclose(centers[order], poles, atol=1e-3)
    np.testing.assert_allclose(masses[order], [0.5, 0.3, 0.2])


def test_a_short_run_measures_the_dwell_the_law_predicts():
    """plateau_run end to end at a small beta: a 2-cluster plateau, one unstable direction on it, the law."""
    from sinkflow.clustering import plateau_run

    r = plateau_run(1.5, 0, n=64, d=2, samples=20)
    assert r["dwell"] is not None and not r["censored"]
    assert abs(r["dwell"] / r["predicted"] - 1) < 0.3
    settled = [p for p in r["plateaus"] if abs(p["energy"] - p["level"]) < 0.01 * abs(p["level"])]
    assert {(p["count"], p["positive"]) for p in settled} >= {(1, 0)}
    assert all(p["positive"] == p["count"] - 1 for p in settled)


def test_plateau_run_names_a_bad_plateau():
    from sinkflow.clustering import plateau_run

    with pytest.raises(ValueError, match="clusters"):
        plateau_run(2.0, 0, n=16, clusters=1)
    with pytest.raises(ValueError, match="normalization"):
        plateau_run(2.0, 0, n=16, normalization="gaussian")


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_point_cluster_dwell_is_the_flow_of_weighted_particles(normalization):
    """Two points on the circle: the quadrature of the reduced law. Three on S^2: sinkflow.simulate of three
    weighted particles (RK4, its own dense field and Sinkhorn loop), the time the closest pair crosses 0.1 rad."""
    import math

    from sinkflow.clustering import point_cluster_dwell, two_cluster_dwell
    from sinkflow.particles import simulate

    law = two_cluster_dwell(4.0, [0.6, 0.4], math.pi - 1e-3, normalization)
    assert abs(point_cluster_dwell([0.0, math.pi - 1e-3], [0.6, 0.4], 4.0, normalization) / law - 1) < 1e-7
    beta, end, h, masses = 1.5, 0.1, 0.02, np.array([0.5, 0.3, 0.2])
    x0 = np.array([[1.0, 0.0, 0.0], [math.cos(1.2), math.sin(1.2), 0.0], [-0.6, -0.3, 0.742]])
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    T = point_cluster_dwell(x0, masses, beta, normalization, end=end)
    traj = simulate(x0, normalization, h=h, steps=int(1.2 * T / h), weights=masses, integrator="rk4",
                    manifold="sphere", temperature=1 / beta, tol=1e-13)
    dots = np.einsum("tid,tjd->tij", traj.positions, traj.positions) - 3 * np.eye(3)
    gap = np.arccos(np.clip(dots.max((1, 2)), -1, 1))
    assert abs(np.interp(-end, -gap, traj.times) / T - 1) < 1e-4
    assert point_cluster_dwell(x0, masses, beta, normalization, t_max=0.5 * T) == math.inf
    with pytest.raises(ValueError, match="masses"):
        point_cluster_dwell(x0, [0.5, 0.5], beta, normalization)


def test_a_handed_off_plateau_lasts_as_long_as_the_particles_hold_it():
    """plateau_run with the hand-off to point_cluster_dwell against the same run of particles to the end."""
    from sinkflow.clustering import plateau_run

    full = plateau_run(3.0, 1, n=64, d=2, samples=20)
    fast = plateau_run(3.0, 1, n=64, d=2, samples=20, handoff=1e-4)
    assert fast["reduced"] > 0.5 * fast["dwell"] and fast["handoff"] < full["start"] + full["dwell"]
    assert abs(fast["dwell"] / full["dwell"] - 1) < 0.05, (fast["dwell"], full["dwell"])


def test_handoff_agreement_pairs_runs_with_the_same_start():
    from sinkflow.clustering.metastability_study import handoff_agreement

    particles = [dict(beta=3.0, seed=0, n=64, dwell=100.0), dict(beta=3.0, seed=1, n=64, dwell=200.0),
                 dict(beta=4.0, seed=0, n=64, dwell=None), dict(beta=4.0, seed=1, n=128, dwell=50.0)]
    handed = [dict(beta=3.0, seed=1, n=64, dwell=210.0), dict(beta=3.0, seed=0, n=64, dwell=99.0),
              dict(beta=4.0, seed=0, n=64, dwell=7.0), dict(beta=4.0, seed=1, n=64, dwell=50.0)]
    assert handoff_agreement(particles, handed) == [(3.0, 1, 1.05), (3.0, 0, 0.99)]


@pytest.mark.slow
@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_the_hand_off_at_the_study_scale(normalization):
    """N = 256, beta = 4 (a dwell of ~1500 time units): the hand-off against the particles run to the end."""
    from sinkflow.clustering import plateau_run

    full = plateau_run(4.0, 0, n=256, d=2, normalization=normalization)
    fast = plateau_run(4.0, 0, n=256, d=2, normalization=normalization, handoff=1e-4)
    assert abs(fast["dwell"] / full["dwell"] - 1) < 0.01, (fast["dwell"], full["dwell"])
