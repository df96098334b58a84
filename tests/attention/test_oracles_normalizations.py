"""Sinkhorn and its contraction rate against oracles written in the test (log-domain loop,
closed forms of the 2 x 2 case, brute-force Hilbert diameter)."""

import itertools

import numpy as np
import pytest
import torch

from oracles import sinkhorn_log, uniform_attention_marginal
from sinkflow import asymptotic_rate, birkhoff_hopf_rate, hilbert_diameter, observed_rate, sinkhorn, solve_sinkhorn


def extreme_scores(n=12, m=9, seed=0, factor=1e4):
    # Gaussian scores x 1e4: every row and column of exp(C) spans thousands of orders of
    # magnitude, so any log-sum-exp without its max-subtraction under- or overflows.
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n, 2)), rng.normal(size=(m, 2))
    return -0.5 * factor * ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)


@pytest.mark.parametrize("n_iter", [2, 3, 4, 6])
def test_column_log_step_is_exact_at_extreme_scores(n_iter):
    C = extreme_scores()
    ref, _, _ = sinkhorn_log(C, n_iter)
    K = sinkhorn(C, n_iter=n_iter)
    assert np.isfinite(K).all()
    # Rows (odd n_iter) or columns (even) are exact, and every entry matches the log-domain
    # loop to rounding of scores of size 1e4 (1e4 * 2e-16 relative in the exponent).
    assert np.abs(K - ref).max() <= 1e-9
    K32 = sinkhorn(torch.tensor(C, dtype=torch.float32), n_iter=n_iter).numpy()
    assert np.abs(K32 - ref).max() <= 5e-3  # float32 exponents carry 1e4 * 6e-8 = 6e-4 absolute


@pytest.mark.parametrize("n_iter", [2, 5])
def test_column_log_step_is_exact_at_extreme_scores_with_weights_and_mask(n_iter):
    rng = np.random.default_rng(3)
    C = extreme_scores(10, 8, seed=3)
    a, b = rng.dirichlet(np.ones(10)), rng.dirichlet(np.ones(8))
    ref, _, _ = sinkhorn_log(C, n_iter, a, b)
    assert np.abs(sinkhorn(C, n_iter=n_iter, a=a, b=b) - ref).max() <= 1e-9
    mask = np.ones_like(C, dtype=bool)
    mask[:, -1] = False  # a padded key: the remaining problem is the 10 x 7 one
    ref_masked, _, _ = sinkhorn_log(C[:, :-1], n_iter)
    K = sinkhorn(C, n_iter=n_iter, mask=mask)
    assert (K[:, -1] == 0).all() and np.abs(K[:, :-1] - ref_masked).max() <= 1e-9


def moderate_scores(seed=1):
    return 2.0 * np.random.default_rng(seed).normal(size=(7, 6))


def test_the_oracle_distinguishes_consecutive_half_iterations():
    # Guard for the counting tests below: one half-iteration more or less changes the matrix.
    C = moderate_scores()
    mats = [sinkhorn_log(C, k)[0] for k in range(1, 10)]
    assert min(np.abs(p - q).max() for p, q in itertools.pairwise(mats)) > 1e-4


@pytest.mark.parametrize("n_iter", range(1, 10))
def test_fixed_n_iter_performs_exactly_n_iter_half_iterations(n_iter):
    C = moderate_scores()
    ref, f, g = sinkhorn_log(C, n_iter)
    res = solve_sinkhorn(C, n_iter=n_iter)
    assert res.n_iter == n_iter and len(res.errors) == n_iter
    assert np.abs(res.attention - ref).max() <= 1e-12
    assert np.abs(sinkhorn(C, n_iter=n_iter) - ref).max() <= 1e-12  # the no-diagnostics path
    # Potentials up to the gauge (f + t, g - t).
    t = (f - res.f).mean()
    assert np.abs(res.f + t - f).max() <= 1e-10 and np.abs(res.g - t - g).max() <= 1e-10


@pytest.mark.parametrize("n_iter", [1, 2, 3, 6])
def test_fixed_n_iter_is_exact_on_the_differentiable_path(n_iter):
    C = moderate_scores(2)
    ref, _, _ = sinkhorn_log(C, n_iter)
    Ct = torch.tensor(C, requires_grad=True)
    res = solve_sinkhorn(Ct, n_iter=n_iter)
    assert res.n_iter == n_iter
    assert np.abs(res.attention.detach().numpy() - ref).max() <= 1e-12
    # Cold scores force the log-domain fallback, which redoes the solve under autograd.
    cold = extreme_scores(6, 5, seed=2, factor=3e3)
    ref_cold, _, _ = sinkhorn_log(cold, n_iter)
    res_cold = solve_sinkhorn(torch.tensor(cold, requires_grad=True), n_iter=n_iter)
    assert res_cold.n_iter == n_iter and np.abs(res_cold.attention.detach().numpy() - ref_cold).max() <= 1e-9


@pytest.mark.parametrize("n_iter", [1, 2, 5])
def test_fixed_n_iter_from_a_warm_start_counts_from_the_given_g(n_iter):
    C = moderate_scores(4)
    g0 = np.random.default_rng(5).normal(size=C.shape[1])
    ref, _, _ = sinkhorn_log(C, n_iter, g0=g0)
    assert np.abs(solve_sinkhorn(C, n_iter=n_iter, init_g=g0).attention - ref).max() <= 1e-12


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_warm_start_survives_the_autograd_redo(dtype, atol):
    # Scores x100 make the differentiable loop re-exponentiate, which redoes the solve under
    # plain autograd: the redo must start from init_g too (it restarted cold, off by 0.13).
    rng = np.random.default_rng(2)
    C, g0 = 100 * rng.normal(size=(12, 17)), rng.normal(size=17)
    ref, _, _ = sinkhorn_log(C, 4, g0=g0)
    scores = torch.tensor(C, dtype=dtype, requires_grad=True)
    res = solve_sinkhorn(scores, n_iter=4, init_g=torch.tensor(g0, dtype=dtype))
    assert np.abs(res.attention.detach().double().numpy() - ref).max() <= atol


# ---------------------------------------------------------------------------------------
# Birkhoff-Hopf: tight on 2 x 2 kernels, and far below 1 on flat kernels


def two_by_two_rate(C):
    """Exact rate of Sinkhorn per full iteration on a 2 x 2 problem with uniform marginals.

    The doubly stochastic limit is [[p, 1-p], [1-p, p]] with p/(1-p) = sqrt(k11 k22 / (k12 k21)),
    and the linearized iteration contracts by sigma_2^2 = (2p - 1)^2 per full iteration.
    """
    s = np.exp((C[0, 0] + C[1, 1] - C[0, 1] - C[1, 0]) / 2)
    p = s / (1 + s)
    return (2 * p - 1) ** 2, p


@pytest.mark.parametrize("C", [[[0.0, -1.0], [0.5, 0.3]], [[1.0, 0.2], [-0.4, 0.9]], [[0.3, -1.2], [0.7, 2.0]],
                               [[0.0, 0.0], [0.0, 0.4]]])
def test_birkhoff_hopf_bound_is_attained_on_two_by_two_kernels(C):
    C = np.array(C)
    exact, p = two_by_two_rate(C)
    assert birkhoff_hopf_rate(C) == pytest.approx(exact, rel=1e-12)
    S = sinkhorn(C, tol=1e-14)
    assert S[0, 0] == pytest.approx(p, rel=1e-12)  # the closed form of the limit
    assert asymptotic_rate(S) == pytest.approx(exact, rel=1e-9)
    run = solve_sinkhorn(C, n_iter=60)
    assert run.errors[0] > 1e-3  # SoftMax is not already doubly stochastic here
    # The 2 x 2 error sequence is geometric after a few steps: the fit is exact to 1e-3.
    assert observed_rate(run.errors) == pytest.approx(exact, rel=1e-3)


def brute_force_diameter(C):
    n = C.shape[0]
    return max((C[i] - C[k]).max() - (C[i] - C[k]).min() for i, k in itertools.product(range(n), repeat=2))


@pytest.mark.parametrize("shape, scale, seed", [((5, 7), 0.15, 0), ((6, 4), 0.3, 1), ((8, 8), 0.2, 2)])
def test_birkhoff_hopf_bound_far_from_one_still_holds(shape, scale, seed):
    C = scale * np.random.default_rng(seed).normal(size=shape)
    delta = brute_force_diameter(C)
    assert float(hilbert_diameter(C)) == pytest.approx(delta, rel=1e-12)
    bound = np.tanh(delta / 4) ** 2
    assert birkhoff_hopf_rate(C) == pytest.approx(bound, rel=1e-12)
    assert bound < 0.3  # a bound that can actually be violated
    run = solve_sinkhorn(C, n_iter=10)
    assert (run.errors[::2] > 1e-11).all()  # still above rounding: the fit measures the contraction
    # Measured: observed 0.006-0.009 for bounds 0.04-0.08.
    assert observed_rate(run.errors, tail=1.0) <= bound


def test_hilbert_diameter_of_batches_matches_brute_force():
    C = np.random.default_rng(7).normal(size=(3, 6, 4))
    got = hilbert_diameter(C)
    assert np.allclose(got, [brute_force_diameter(c) for c in C], rtol=1e-12)


@pytest.mark.parametrize("n_iter", [2, 3, 4])
def test_causal_mask_at_extreme_scores_matches_the_log_domain_loop(n_iter):
    # A per-pair mask: excluded entries are -inf scores for the oracle, exactly 0 in the result.
    C = extreme_scores(9, 9, seed=5)
    mask = np.tril(np.ones((9, 9), dtype=bool))
    ref, _, _ = sinkhorn_log(np.where(mask, C, -np.inf), n_iter, b=uniform_attention_marginal(mask))
    K = sinkhorn(C, n_iter=n_iter, mask=mask)
    assert (K[~mask] == 0).all()
    assert np.abs(K - ref).max() <= 1e-9
