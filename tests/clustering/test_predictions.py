"""The cluster prediction from an initial configuration: planted modes (closed forms), a particle run
(the sign convention), the matching of positions, the summary's intervals against scipy."""

import math

import numpy as np
import pytest
from scipy import stats

from sinkflow.clustering import (
    cluster_positions,
    fastest_mode,
    formation_time,
    plateau_clusters,
    position_error,
    predict_clusters,
)
from sinkflow.clustering.prediction_study import summarize


def _planted(n, modes, seed=0):
    """Angles whose density is (1 + sum_k d_k cos(k (theta - phi_k))) / (2 pi): the inverse CDF of
    equispaced quantiles (no sampling noise), mu_k(0) = d_k e^{i k phi_k} / 2 up to O(1/n)."""
    grid = np.linspace(0, 2 * np.pi, 200_001)
    dens = 1 + sum(d * np.cos(k * (grid - phi)) for k, (d, phi) in modes.items())
    cdf = np.concatenate([[0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))])
    return np.interp((np.arange(n) + 0.5) / n * cdf[-1], cdf, grid)


def test_positions_are_the_phase_of_the_fastest_mode():
    phi = 0.7
    theta = _planted(4000, {3: (0.05, phi), 1: (0.02, 2.0)})
    p = predict_clusters(theta, 5.0)
    assert p.count == fastest_mode(5.0) == 3
    np.testing.assert_allclose(p.positions, np.sort(np.mod(phi + 2 * np.pi * np.arange(3) / 3, 2 * np.pi)), atol=1e-4)
    assert p.amplitude == pytest.approx(0.025, rel=1e-3)
    assert p.formation_time == formation_time(5.0, 4000)
    xy = np.stack([np.cos(theta), np.sin(theta)], 1)  # points instead of angles: the same prediction
    np.testing.assert_allclose(predict_clusters(xy, 5.0).positions, p.positions)


def test_seeded_count_follows_the_amplified_amplitude():
    """At beta = 5 (SoftMax, n = 4000) mode 3 outgrows mode 2 by e^{(lambda_3 - lambda_2) T} = 2.8 by the
    formation time T: a mode 2 planted 1.5x larger falls behind, one 3x larger stays ahead."""
    assert predict_clusters(_planted(4000, {2: (0.015, 1.0), 3: (0.01, 0.0)}), 5.0).seeded_count == 3
    p = predict_clusters(_planted(4000, {2: (0.03, 1.0), 3: (0.01, 0.0)}), 5.0)
    assert (p.count, p.seeded_count) == (3, 2)


def test_particles_cluster_where_predicted():
    """The sign convention against a run: a planted 3-mode at beta = 5 (SoftMax) forms clusters at its phase."""
    import sinkflow

    phi, beta = 0.5, 5.0  # -phi would put the clusters 1 rad away
    theta = _planted(600, {3: (0.02, phi)})
    x0 = np.stack([np.cos(theta), np.sin(theta)], 1)
    x = sinkflow.simulate(x0, "softmax", h=0.1, steps=120, manifold="sphere", temperature=1 / beta,
                          save_every=120).final
    found = cluster_positions(x)
    assert found.size == 3
    assert position_error(found, predict_clusters(theta, beta).positions) < 0.05
    assert position_error(found, predict_clusters(theta + np.pi / 3, beta).positions) > 0.5  # the other sign


def test_cluster_positions_and_their_matching():
    rng = np.random.default_rng(1)
    centres = np.array([0.05, 2.0, 4.1])
    theta = np.concatenate([c + 0.01 * rng.standard_normal(200) for c in centres])
    found = cluster_positions(theta)
    means = [np.angle(np.exp(1j * theta[i * 200:(i + 1) * 200]).mean()) for i in range(3)]
    np.testing.assert_allclose(found, np.sort(np.mod(means, 2 * np.pi)), atol=1e-12)
    assert position_error([6.25, 2.1, 4.0], centres) == pytest.approx(0.1, abs=1e-9)  # across 0: 6.25 ~ -0.033
    assert math.isnan(position_error([1.0, 2.0], centres))


def test_summary_counts_and_intervals():
    runs = [dict(normalization="softmax", n=100, beta=5.0, predicted=3, seeded=s, count=c, error=e)
            for s, c, e in [(3, 3, 0.1), (2, 2, math.nan), (3, 3, 0.3), (4, 3, 0.2)]]
    (row,) = summarize(runs)
    assert (row["agree"], row["seeded_agree"], row["runs"]) == (3, 3, 4)
    ci = stats.binomtest(3, 4).proportion_ci(method="exact")
    np.testing.assert_allclose(row["agree_interval"], [ci.low, ci.high], rtol=1e-9)
    assert row["median_error"] == pytest.approx(0.2) and row["max_error"] == pytest.approx(0.3)


def test_bad_inputs():
    with pytest.raises(ValueError, match="x0"):
        predict_clusters(np.ones((3, 3)), 1.0)
    with pytest.raises(ValueError, match="beta"):
        predict_clusters(np.ones(5), -1.0)
    with pytest.raises(ValueError, match="normalization"):
        predict_clusters(np.ones(5), 1.0, "gaussian")
    with pytest.raises(TypeError):
        plateau_clusters("5", 0)


def test_sphere_mode_maxima_of_platonic_configurations():
    """Maxima of the degree-l part of a measure: the vertices for the harmonics the solids carry."""
    from sinkflow.clustering import sphere_mode_maxima

    tetra = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]]) / np.sqrt(3)
    octa = np.concatenate([np.eye(3), -np.eye(3)])
    assert len(sphere_mode_maxima(tetra, 3)) == 4
    peaks = sphere_mode_maxima(octa, 4)
    assert len(peaks) == 6 and np.abs(np.abs(peaks) .max(1) - 1).max() < 0.03  # near +-e_i
    assert len(sphere_mode_maxima(octa[[0, 3]], 2)) == 2  # two antipodal points: the two ends of the axis
