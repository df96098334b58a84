"""Doubly-stochasticity measures and Sinkhorn's contraction rate (docs/theory/normalizations.md and
docs/theory/training.md)."""

import itertools

import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracles import kl, sinkhorn_log
from sinkflow import (
    asymptotic_rate,
    birkhoff_hopf_rate,
    gaussian_scores,
    hilbert_diameter,
    kl_to_sinkhorn,
    marginal_errors,
    observed_rate,
    sinkhorn,
    softmax,
    solve_sinkhorn,
    sorted_column_sums,
)


def gaussian_problem(n=30, scale=2.0, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, 2))
    return scale * gaussian_scores(x, x)


@pytest.mark.parametrize("scale", [1.0, 2.0, 4.0])
def test_observed_rate_below_bound_and_near_sigma2(scale):
    C = gaussian_problem(scale=scale)
    run = solve_sinkhorn(C, n_iter=400)
    limit = solve_sinkhorn(C, tol=1e-13).attention
    observed = observed_rate(run.errors)
    bound = birkhoff_hopf_rate(C)
    predicted = asymptotic_rate(limit)
    assert observed <= bound
    # Knight (2008): the asymptotic rate is sigma_2(P)^2; docs/theory/normalizations.md reports ~1% agreement.
    assert abs(observed - predicted) <= 0.03 * predicted


def test_hilbert_diameter_closed_form_two_by_two():
    # For a 2 x 2 kernel the diameter is |log(K11 K22 / (K12 K21))| = |C11 + C22 - C12 - C21|.
    C = np.array([[0.3, -1.2], [0.7, 2.0]])
    assert np.isclose(float(hilbert_diameter(C)), abs(0.3 + 2.0 + 1.2 - 0.7))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 8), m=st.integers(2, 8), seed=st.integers(0, 1000), scale=st.floats(0.1, 3))
def test_bound_holds_per_iteration(n, m, seed, scale):
    # Birkhoff-Hopf: the Hilbert distance to the fixed point contracts by lambda^2 per full
    # iteration, so the marginal error (a weaker quantity) decays at most that fast asymptotically.
    C = scale * np.random.default_rng(seed).normal(size=(n, m))
    run = solve_sinkhorn(C, n_iter=200)
    e = run.errors[::2]
    e = e[e > 1e-12]
    if len(e) >= 6:
        # 2 x 2 kernels attain the bound exactly; 1e-3 relative covers the log-linear fit
        # picking up rounding noise near the 1e-13 floor.
        assert observed_rate(run.errors) <= birkhoff_hopf_rate(C) * (1 + 1e-3) + 1e-6


def test_marginal_errors_of_doubly_stochastic_and_softmax():
    K = sinkhorn(gaussian_problem(), tol=1e-12)
    row, col = marginal_errors(K)
    assert row < 1e-12 and col < 1e-12
    row, col = marginal_errors(softmax(gaussian_problem()))
    assert row < 1e-12 and col > 0.05
    batch = marginal_errors(torch.tensor(np.stack([K, softmax(gaussian_problem())])))
    assert batch.column.shape == (2,)


def test_sorted_column_sums_sort_and_sum():
    K = softmax(gaussian_problem())
    s = sorted_column_sums(K)
    assert np.all(np.diff(s) >= 0) and np.isclose(s.sum(), K.shape[0])


def test_kl_to_sinkhorn_zero_iff_doubly_stochastic_and_equal_to_the_pot_projection():
    C = gaussian_problem()
    assert kl_to_sinkhorn(sinkhorn(C, tol=1e-12)) < 1e-12
    K = softmax(C)
    n = K.shape[0]
    # Oracle: the Birkhoff projection of K is POT's entropic plan for cost -log K (times n).
    S = n * ot.sinkhorn(np.full(n, 1 / n), np.full(n, 1 / n), -np.log(K), reg=1.0, stopThr=1e-14, numItermax=100_000)
    expected = kl(K, S) / n
    assert expected > 1e-3
    assert kl_to_sinkhorn(K) == pytest.approx(expected, rel=1e-8)


def test_kl_to_sinkhorn_is_never_negative_on_nearly_doubly_stochastic_matrices():
    # Converged float32 Sinkhorn attention (rows and columns off by ~1e-7): the plain sum of
    # K log(K / S) fell to -3e-8, the projection's own marginal error; the generalized KL
    # (+ S - K) is a sum of non-negative terms x log(x / y) - x + y.
    g = torch.Generator().manual_seed(0)
    C = torch.randn(20, 6, 6, generator=g)
    K = sinkhorn(C, n_iter=41).double()
    kl = kl_to_sinkhorn(K)
    assert (kl >= 0).all() and float(kl.max()) < 1e-6


def test_kl_from_the_limit_decreases_along_half_iterations_by_the_pythagorean_identity():
    # Sinkhorn's half-steps are KL (I-)projections onto affine marginal sets that contain the
    # limit S, so KL(S | K_l) = KL(S | K_{l+1}) + KL(K_{l+1} | K_l) on the plans diag(a) K
    # (Csiszar 1975; Benamou et al. 2015). Hence KL(S | K_l) decreases strictly. (The reverse
    # KL(K_l | S) has no such theorem and is not asserted.)
    C = gaussian_problem(n=12, scale=3.0)
    n = C.shape[0]
    S = sinkhorn_log(C, 400)[0] / n
    plans = [sinkhorn_log(C, ell)[0] / n for ell in range(1, 9)]
    forward = [kl(S, P) for P in plans]
    assert all(x > y for x, y in itertools.pairwise(forward)) and forward[0] > 1e-2
    for ell in range(len(plans) - 1):
        gap = forward[ell] - forward[ell + 1]
        assert gap == pytest.approx(kl(plans[ell + 1], plans[ell]), rel=1e-9, abs=1e-15)
    # The library's matrices follow the same monotone sequence.
    lib = [kl(S, sinkhorn(C, n_iter=ell) / n) for ell in range(1, 9)]
    assert np.allclose(lib, forward, rtol=1e-9, atol=1e-15)


def test_observed_rate_needs_data():
    with pytest.raises(ValueError, match="at least 3"):
        observed_rate([1e-20, 1e-20])


def test_single_matrices_give_python_floats_and_batches_arrays():
    C = gaussian_problem(n=6)
    K = softmax(C)
    assert type(birkhoff_hopf_rate(C)) is float and type(asymptotic_rate(sinkhorn(C))) is float
    row, col = marginal_errors(K)
    assert type(row) is float and type(col) is float
    batch = np.stack([C, 2 * C])
    assert birkhoff_hopf_rate(batch).shape == (2,) and marginal_errors(softmax(batch)).row.shape == (2,)
