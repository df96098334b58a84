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
            def shifted(si, sj):
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
