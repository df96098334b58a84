"""Critical attention scaling beta_n = gamma log n and the selectivity threshold (docs/theory/long_context.md)."""

import numpy as np
import pytest
import torch

from sinkflow.clustering import critical_scaling, equiangular_cosine, selectivity_threshold


def _simplex_cosine(n, rho, gamma):
    """Explicit tokens y_i = sqrt(rho) e_0 + sqrt(1 - rho) e_i in R^(n+1), torch's SoftMax, mean output cosine."""
    Y = np.zeros((n, n + 1))
    Y[:, 0] = np.sqrt(rho)
    Y[np.arange(n), np.arange(1, n + 1)] = np.sqrt(1 - rho)
    A = torch.softmax(torch.from_numpy(gamma * np.log(n) * (Y @ Y.T)), -1).numpy()
    Z = A @ Y
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    C = Z @ Z.T
    return C[~np.eye(n, dtype=bool)].mean()


@pytest.mark.parametrize("gamma", [0.5, 1.8, 2.0, 2.2, 4.0])
def test_equiangular_closed_form_against_explicit_tokens(gamma):
    assert abs(equiangular_cosine(150, 0.5, gamma) - _simplex_cosine(150, 0.5, gamma)) < 1e-12


def test_equiangular_values_and_limits():
    got = equiangular_cosine(10_000, 0.5, 2.0 * np.array([0.9, 1.0, 1.1]))
    np.testing.assert_allclose(got, [0.925, 0.800, 0.662], atol=6e-4)
    assert equiangular_cosine(1e12, 0.5, 1.0) > 0.99 and abs(equiangular_cosine(1e12, 0.5, 3.0) - 0.5) < 1e-3


def test_transition_sharpens_as_log_n():
    rho = 0.5
    gammas = np.linspace(0.2, 4.0, 40_001) * 2.0

    def width(n):  # gamma window where the cosine crosses from rho + 0.9 (1 - rho) to rho + 0.1 (1 - rho)
        c = (equiangular_cosine(n, rho, gammas) - rho) / (1 - rho)
        return gammas[np.argmax(c < 0.1)] - gammas[np.argmax(c < 0.9)]

    w = np.array([width(n) for n in (1e2, 1e4, 1e8)])
    assert w[0] > w[1] > w[2]
    np.testing.assert_allclose(w * np.log([1e2, 1e4, 1e8]), w[-1] * np.log(1e8), rtol=0.15)  # width ~ 1/log n


def test_critical_scaling_matches_the_closed_form_for_softmax_and_sinkhorn():
    for attention in ("softmax", "sinkhorn"):  # the equiangular matrix is already doubly stochastic
        r = critical_scaling(200, rho=0.5, gammas=[1.0, 2.0, 3.0], attention=attention)
        np.testing.assert_allclose(r.cosine[0], r.reference, rtol=0, atol=1e-8)
        np.testing.assert_allclose(r.self_weight[0], 1 / (1 + 199 * 200.0 ** (-0.5 * np.array([1.0, 2.0, 3.0]))),
                                   rtol=1e-8)


def test_random_tokens_follow_the_transition():
    r = critical_scaling(400, d=256, rho=0.5, gammas=[1.0, 4.0], seeds=[0, 1])
    assert r.cosine.shape == (2, 2)
    assert r.cosine[:, 0].min() > 0.9 and r.cosine[:, 1].max() < 0.6  # collapse below, identity above
    with pytest.raises(ValueError, match="rho must be in"):
        critical_scaling(10, rho=1.0)


def _slope(d, ns, trials):
    betas = [selectivity_threshold(n, d, trials=trials, seed=i) for i, n in enumerate(ns)]
    return np.polyfit(np.log(ns), np.log(betas), 1)[0]


@pytest.mark.parametrize("d", [3, 5])
def test_selectivity_slope_default_range(d):
    assert abs(_slope(d, [100, 300, 1000, 3000], 51) / (2 / (d - 1)) - 1) < 0.10


@pytest.mark.slow
@pytest.mark.parametrize("d", [3, 5])
def test_selectivity_slope_full_range(d):
    assert abs(_slope(d, [100, 1000, 10_000, 100_000], 101) / (2 / (d - 1)) - 1) < 0.10


def test_selectivity_root_is_where_the_median_top_weight_is_one_half():
    beta = selectivity_threshold(300, 4, trials=31, seed=3)
    rng = np.random.default_rng(3)  # same draws: the median of the largest weight at beta*, by brute force
    tops = []
    for _ in range(31):
        s = 2.0 * rng.beta(1.5, 1.5, size=300) - 1.0
        tops.append(torch.softmax(torch.from_numpy(beta * s), -1).max().item())
    assert abs(np.median(tops) - 0.5) < 1e-8
