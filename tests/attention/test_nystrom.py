"""Skyformer's kernelized attention, its lifted Nyström approximation and the spectral-norm theorem.

docs/theory/nystrom.md. Notation: X = [Q; K] (N = 2n points), Cbar = kappa(X, X), C its top-right
block, Cbar~ the Nyström approximation on landmark indices J, E = Cbar - Cbar~.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sinkflow
from sinkflow.cli import main

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _data(n, p, scale, seed):
    rng = np.random.default_rng(seed)
    return scale * rng.standard_normal((n, p)), scale * rng.standard_normal((n, p))


def _gauss(x, y):
    """The kernel written out independently of sinkflow: exp(-|x - y|^2 / (2 sqrt p))."""
    d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    return np.exp(-d2 / (2 * math.sqrt(x.shape[1])))


def _core(M, inverse, n_iter=6, gamma=0.1):
    """The landmark block's inverse written from the formulas, independently of sinkflow.

    ``"pinv"``: Moore-Penrose with singular values below sqrt(machine eps) x the largest dropped.
    ``"iterative"``: Skyformer's (M + gamma I)^{-1} by n_iter cubic Newton-Schulz steps on
    S = D^{-1/2}(M + gamma I)D^{-1/2}, D = diag((M + gamma I) 1), from Skyformer's Z_0 = S^T / |S|_1.
    """
    if inverse == "pinv":
        return np.linalg.pinv(M, rcond=np.sqrt(np.finfo(float).eps), hermitian=True)
    R = M + gamma * np.eye(len(M))
    d = 1 / np.sqrt(R.sum(1))
    S = d[:, None] * R * d[None, :]
    Z = S.T / np.abs(S).sum(0).max()
    eye = np.eye(len(M))
    for _ in range(n_iter):
        SZ = S @ Z
        Z = 0.25 * Z @ (13 * eye - SZ @ (15 * eye - SZ @ (7 * eye - SZ)))
    return d[:, None] * Z * d[None, :]


def _lifted_pair(Q, K, J, inverse="pinv"):
    """(C - C~, Cbar - Cbar~) for the same landmark indices J into [Q; K].

    Cbar~ = Cbar[:, J] core(Cbar[J, J]) Cbar[J, :] is built here from the formula, and the
    library's C~ must be its top-right block (checked here, for every caller).
    """
    X = np.concatenate([Q, K])
    J = np.asarray(J)
    Cbar = _gauss(X, X)
    n = len(Q)
    C = Cbar[:n, n:]
    Cbart = Cbar[:, J] @ _core(Cbar[np.ix_(J, J)], inverse) @ Cbar[J, :]
    Ct = sinkflow.nystrom_matrix(Q, K, J, inverse=inverse)
    # Two LAPACK pseudo-inverses (torch, numpy) agree to rounding amplified by the cutoff (measured <= 1e-9).
    assert np.abs(Ct - Cbart[:n, n:]).max() <= 1e-7 * np.abs(Cbar).max()
    return C - Cbart[:n, n:], Cbar - Cbart, Cbar


problems = st.tuples(
    st.integers(2, 20),                       # n
    st.integers(1, 8),                        # p
    st.floats(0.05, 2.0),                     # scale of queries and keys (bandwidth)
    st.integers(0, 10_000),                   # seed
    st.integers(1, 40),                       # m
)


# --------------------------------------------------------------------------- always-true laws
@SETTINGS
@given(problems, st.sampled_from(["pinv", "iterative"]))
def test_block_error_never_exceeds_lifted_error(problem, inverse):
    """||C - C~||_2 <= ||Cbar - Cbar~||_2 for every draw and either inverse: C - C~ is a block of E."""
    n, p, scale, seed, m = problem
    Q, K = _data(n, p, scale, seed)
    J = sinkflow.sample_landmarks(2 * n, m, generator=seed)
    top, E, _ = _lifted_pair(Q, K, J, inverse=inverse)
    # Exact in exact arithmetic; 1e-12 relative covers the two LAPACK SVDs' rounding.
    assert np.linalg.norm(top, 2) <= np.linalg.norm(E, 2) * (1 + 1e-12) + 1e-14


@SETTINGS
@given(problems, st.sampled_from(["pinv", "iterative"]))
def test_nystrom_never_overestimates_the_lifted_kernel(problem, inverse):
    """Cbar~ <= Cbar (Loewner): E = Cbar^{1/2}(I - P)Cbar^{1/2} is PSD with the pseudo-inverse; the
    iterative inverse Z satisfies 0 <= Z <= (M + gamma I)^{-1} <= M^+ (each Newton–Schulz step maps
    the eigenvalues of S Z into [0, 1]), so it underestimates too."""
    n, p, scale, seed, m = problem
    Q, K = _data(n, p, scale, seed)
    J = sinkflow.sample_landmarks(2 * n, m, generator=seed)
    _, E, Cbar = _lifted_pair(Q, K, J, inverse=inverse)
    low, _ = sinkflow.extreme_eigenvalues(0.5 * (E + E.T))
    # Rounding floor ~ sqrt(machine eps): G pinv(M) G^T divides rounding errors of G ~ eps by the
    # square root of eigenvalues of M kept down to the cutoff ~ m eps ||M|| (measured up to 3.5e-9).
    assert low >= -1e-6 * np.linalg.norm(Cbar, 2)


def test_all_distinct_points_reproduce_C_exactly():
    """m = 2n distinct landmarks: Cbar~ = Cbar pinv(Cbar) Cbar = Cbar, so C~ = C."""
    Q, K = _data(24, 6, 0.7, 1)
    J = sinkflow.sample_landmarks(48, 48, replace=False, generator=3)
    top, E, Cbar = _lifted_pair(Q, K, J)
    # What pinv drops are eigen-directions below its cutoff m eps ||Cbar_JJ||.
    assert np.linalg.norm(top, 2) <= 1e-10 * np.linalg.norm(Cbar, 2)
    C = Cbar[:24, 24:]
    assert np.linalg.norm(C - sinkflow.nystrom_matrix(Q, K, J), 2) <= 1e-10 * np.linalg.norm(Cbar, 2)
    assert np.linalg.norm(E, 2) <= 1e-10 * np.linalg.norm(Cbar, 2)


def test_gaussian_identity_C_equals_scaled_exponential_dot_products():
    """C = D_Q^{-1/2} exp(Q K^T / sqrt p) D_K^{-1/2}, (D_Q)_ii = exp(|q_i|^2 / sqrt p)."""
    Q, K = _data(30, 5, 0.8, 2)
    sp = math.sqrt(5)
    A = np.exp(Q @ K.T / sp)
    dq, dk = np.exp((Q**2).sum(1) / sp), np.exp((K**2).sum(1) / sp)
    C = sinkflow.kernelized_attention_matrix(Q, K)
    np.testing.assert_allclose(C, A / np.sqrt(dq)[:, None] / np.sqrt(dk)[None, :], rtol=1e-12)  # float64 rounding
    np.testing.assert_allclose(C, _gauss(Q, K), rtol=1e-12)
    # The kernel is exp of sinkflow's Gaussian scores at temperature sqrt(p) (Skyformer's bandwidth).
    np.testing.assert_allclose(C, np.exp(sinkflow.gaussian_scores(Q, K, temperature=sp)), rtol=1e-12)
    np.testing.assert_allclose(sinkflow.lifted_kernel(Q, K)[:30, 30:], C, rtol=1e-14)  # other matmul blocking


def test_apply_without_forming_equals_formed_product():
    """C~ V computed as L (W (R V)) equals (L W R) V, and V = I gives back C~."""
    Q, K = _data(40, 8, 0.6, 4)
    V = np.random.default_rng(5).standard_normal((40, 3))
    for inverse in ("pinv", "iterative"):
        F = sinkflow.nystrom_factors(Q, K, 16, generator=6, inverse=inverse)
        out = sinkflow.nystrom_attention(Q, K, V, F.indices, inverse=inverse)
        np.testing.assert_allclose(out, F.matrix() @ V, rtol=1e-9, atol=1e-12)  # reassociation rounding
        assert F.left.shape == (40, 16) and F.core.shape == (16, 16) and F.right.shape == (16, 40)


def test_agrees_with_pot_kernel_nystroem_on_the_same_landmarks():
    """POT's ot.lowrank.kernel_nystroem (sigma = p^{1/4}) uses a/2 anchors from each of Q and K."""
    ot_lowrank = pytest.importorskip("ot.lowrank")
    n, p, anchors, seed = 50, 4, 12, 7
    Q, K = _data(n, p, 1.5, 8)   # spread points: a well-conditioned landmark block
    left, right = ot_lowrank.kernel_nystroem(Q, K, anchors=anchors, sigma=p**0.25, random_state=seed)
    # POT's draw: one seeded RandomState, a permutation of the sources, then of the targets.
    rs = np.random.RandomState(seed)
    J = np.concatenate([rs.permutation(n)[: anchors // 2], n + rs.permutation(n)[: anchors // 2]])
    ours = sinkflow.nystrom_matrix(Q, K, J)
    # Both use an exact pseudo-inverse; the block's condition number (~1e2) bounds the difference.
    np.testing.assert_allclose(ours, left @ right.T, rtol=0, atol=1e-10)


def test_iterative_inverse_converges_to_the_inverse_on_well_conditioned_blocks():
    """Newton–Schulz on D^{-1/2}(M + gamma I)D^{-1/2}: residual r -> r^3 (3 + r) / 4 per iteration."""
    X = _data(12, 3, 2.0, 9)[0]   # spread points: Cbar_JJ is close to the identity
    M = _gauss(X, X)
    target = np.linalg.inv(M + 0.1 * np.eye(12))
    errors = [np.abs(sinkflow.iterative_inverse(M, n_iter=k) - target).max() for k in (2, 4, 6, 12)]
    assert all(b <= a for a, b in itertools.pairwise(errors))
    assert errors[-1] < 1e-12   # converged to rounding
    # With gamma = 0 and enough iterations, the practical Nyström equals the pinv Nyström.
    Q, K = _data(20, 3, 2.0, 10)
    J = np.arange(0, 40, 5)
    np.testing.assert_allclose(sinkflow.nystrom_matrix(Q, K, J, inverse="iterative", gamma=0.0, n_iter=25),
                               sinkflow.nystrom_matrix(Q, K, J), atol=1e-11)
    # Nyströmformer's iterative pinv of a nonsingular stochastic block.
    A = sinkflow.softmax(np.random.default_rng(11).standard_normal((6, 6)))
    np.testing.assert_allclose(sinkflow.newton_schulz_pinv(A, n_iter=30), np.linalg.inv(A), atol=1e-9)


def test_nystromformer_with_all_tokens_as_landmarks_is_softmax():
    """m = n segments are the tokens themselves: F pinv(A) B = A pinv(A) A = A = SoftMax."""
    Q, K = _data(16, 4, 0.5, 12)
    exact = sinkflow.softmax(sinkflow.dot_scores(Q, K, temperature=2.0))
    np.testing.assert_allclose(sinkflow.nystromformer_matrix(Q, K, 16, inverse="pinv"), exact, atol=1e-10)
    np.testing.assert_allclose(sinkflow.segment_means(Q, 4), Q.reshape(4, 4, 4).mean(1), rtol=1e-15)


def test_torch_batched_heads_match_numpy_per_head():
    """Batched over heads in float32 torch = per-head float64 numpy on the same landmarks."""
    rng = np.random.default_rng(13)
    Q, K, V = 0.5 * rng.standard_normal((3, 2, 3, 64, 16))
    g = torch.Generator().manual_seed(0)
    idx = sinkflow.sample_landmarks(128, 24, generator=g, batch_shape=(2, 3))
    out = sinkflow.nystrom_attention(*(torch.tensor(a, dtype=torch.float32) for a in (Q, K, V)), idx)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (2, 3, 64, 16)
    for h in np.ndindex(2, 3):
        ref = sinkflow.nystrom_attention(Q[h], K[h], V[h], idx[h].numpy())
        # float32 pinv of a landmark block with condition ~1e3: ~1e-3 relative accuracy.
        assert np.linalg.norm(out[h].numpy() - ref) <= 2e-3 * np.linalg.norm(ref)
    # Same torch seed, same draw.
    again = sinkflow.sample_landmarks(128, 24, generator=torch.Generator().manual_seed(0), batch_shape=(2, 3))
    assert torch.equal(idx, again)
    full = sinkflow.kernelized_attention(torch.tensor(Q), torch.tensor(K), torch.tensor(V))
    np.testing.assert_allclose(full.numpy()[1, 2], _gauss(Q[1, 2], K[1, 2]) @ V[1, 2], rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    Q, K, V = (torch.randn(2, 256, 64, dtype=torch.float64) * 0.5 for _ in range(3))
    idx = sinkflow.sample_landmarks(512, 64, generator=0, batch_shape=(2,), device="cpu")
    cpu = sinkflow.nystrom_attention(Q, K, V, idx, inverse="iterative")
    gpu = sinkflow.nystrom_attention(Q.cuda(), K.cuda(), V.cuda(), idx.cuda(), inverse="iterative")
    assert gpu.is_cuda
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-8, atol=1e-10)


# --------------------------------------------------------------------------- the theorem
def test_leverage_scores_statistical_dimension_and_beta():
    """l_i = [Cbar (Cbar + lam I)^{-1}]_ii in [0, 1], sum = d_stat <= N, beta* = d_stat / (N max l) <= 1."""
    Q, K = _data(30, 6, 0.6, 14)
    Cbar = sinkflow.lifted_kernel(Q, K)
    lam = 0.1 * np.linalg.norm(Cbar[:30, 30:], 2)
    lev = sinkflow.ridge_leverage_scores(Cbar, lam)
    direct = np.diag(Cbar @ np.linalg.inv(Cbar + lam * np.eye(60)))
    np.testing.assert_allclose(lev, direct, atol=1e-12)   # the kernel block is well conditioned after + lam I
    np.testing.assert_allclose(sinkflow.ridge_leverage_scores(Cbar, lam, method="eigh"), lev, atol=1e-12)
    assert ((lev > 0) & (lev < 1)).all()
    assert sinkflow.statistical_dimension(Cbar, lam) == pytest.approx(lev.sum(), rel=1e-14)
    beta = sinkflow.beta_star(lev)
    assert 0 < beta <= 1 and beta * 60 * lev.max() == pytest.approx(lev.sum())


def test_landmark_bound_on_identical_points_is_the_hand_computed_count():
    """All 2n = 20 points equal: Cbar = 1 1^T (eigenvalue 20), C = 1 1^T (norm 10), lambda = 0.1 * 10 = 1.

    l_i = (20 / 21) / 20 = 1/21, d_stat = 20/21, beta* = 1, so with c = 56/3 and delta = 0.1
    m = ceil(56/3 * 20/21 * log(400)) = ceil(106.52) = 107 (54 with the sharp c = 28/3).
    A rank-one kernel is reproduced by any single landmark.
    """
    Q = K = np.zeros((10, 3))
    res = sinkflow.nystrom_check(Q, K, 1, eps=0.1, delta=0.1, trials=3)
    assert res.lam == pytest.approx(1.0, rel=1e-12)
    assert res.d_stat == pytest.approx(20 / 21, rel=1e-12) and res.beta == pytest.approx(1.0, rel=1e-12)
    assert res.m_required == 107
    sharp = sinkflow.nystrom_check(Q, K, 1, eps=0.1, delta=0.1, trials=1, constant=sinkflow.SHARP_LANDMARK_CONSTANT)
    assert sharp.m_required == 54
    assert res.failures == 0 and res.max_error <= 1e-12


def test_landmark_bound_with_unequal_leverage_is_the_hand_computed_count():
    """Three equal points and one far away, each a query and a key: Cbar has a 6 x 6 block of ones
    (eigenvalue 6) and a 2 x 2 one (eigenvalue 2); C = diag(ones(3, 3), 1) has norm 3, lambda = 0.3.

    l = 1/6.3 (six entries) and 1/2.3 (two), d_stat = 6/6.3 + 2/2.3, beta* = d_stat / (8 / 2.3)
    = 0.5238, so d_stat / beta* = 8 / 2.3 and m = ceil(56/3 * 8/2.3 * log(160)) = ceil(329.52) = 330.
    """
    Q = K = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [60.0, 0.0]])
    res = sinkflow.nystrom_check(Q, K, 2, eps=0.1, delta=0.1, trials=2)
    assert res.norm_C == pytest.approx(3.0, rel=1e-12) and res.lam == pytest.approx(0.3, rel=1e-12)
    assert res.d_stat == pytest.approx(6 / 6.3 + 2 / 2.3, rel=1e-12)
    assert res.beta == pytest.approx((6 / 6.3 + 2 / 2.3) / (8 / 2.3), rel=1e-12)
    assert res.m_required == 330


def _coupon_failure(m, k=5):
    """P(some of k equally likely coupons is missed in m draws) by inclusion-exclusion."""
    return sum((-1) ** (j + 1) * math.comb(k, j) * (1 - j / k) ** m for j in range(1, k + 1))


def test_landmark_bound_on_separated_pairs_against_the_exact_failure_probability():
    """Five far-apart points, each both a query and a key: Cbar = [[I, I], [I, I]], C = I, lambda = 0.1.

    Cbar has eigenvalue 2 (five times), so l_i = (2 / 2.1) / 2 = 1/2.1, d_stat = 10/2.1, beta* = 1 and
    m = ceil(56/3 * 10/2.1 * log(200)) = ceil(470.96) = 471. Nystrom is exact iff every point is
    drawn (else a row of C~ is 0 and the error is 1 > lambda): a coupon-collector failure
    probability, exact by inclusion-exclusion; the bound is valid and 26x loose here.
    """
    Q = K = 50.0 * np.array([[0, 0], [1, 0], [0, 1], [1, 1], [2, 0]], dtype=float)
    res = sinkflow.nystrom_check(Q, K, 10, eps=0.1, delta=0.1, trials=200, seed=4)
    assert res.norm_C == pytest.approx(1.0, rel=1e-12) and res.lam == pytest.approx(0.1, rel=1e-12)
    assert res.d_stat == pytest.approx(10 / 2.1, rel=1e-12) and res.beta == pytest.approx(1.0, rel=1e-12)
    assert res.m_required == 471
    p10 = _coupon_failure(10)  # 0.4775
    assert res.failure_ci[0] <= p10 <= res.failure_ci[1]
    assert set(np.round(res.errors, 9)) <= {0.0, 1.0}
    assert _coupon_failure(res.m_required) <= 0.1  # the theorem's promise holds ...
    m_exact = next(m for m in range(1, 471) if _coupon_failure(m) <= 0.1)
    assert m_exact == 18 and res.m_required / m_exact > 25  # ... with 26x more landmarks than needed


def test_failure_rate_below_delta_once_m_exceeds_the_bound():
    """m >= (56/3)(d_stat/beta) log(4n/delta): P(||C - C~||_2 > lam) <= delta (small n, with replacement)."""
    Q, K = _data(8, 4, 0.3, 15)
    probe = sinkflow.nystrom_check(Q, K, 1, eps=0.1, delta=0.1, trials=30, seed=1)
    assert not probe.theorem_applies and probe.failure_rate > 0.1   # one landmark is not enough: test can fail
    with pytest.warns(UserWarning, match="exceeds the N = 16 stacked queries and keys"):  # as the theorem allows
        res = sinkflow.nystrom_check(Q, K, probe.m_required, eps=0.1, delta=0.1, trials=30, seed=2)
    assert res.theorem_applies and res.consistent
    assert res.failure_rate <= 0.1 and res.bound_holds
    assert res.loewner_lower and res.loewner_failures <= 3
    assert res.failure_ci[0] <= res.failure_rate <= res.failure_ci[1]


def test_check_reports_observed_error_and_loose_bound():
    """The check's numbers agree with a direct computation, and the bound asks for far more landmarks."""
    Q, K = _data(40, 16, 0.5, 16)
    res = sinkflow.nystrom_check(Q, K, 20, eps=0.1, delta=0.1, trials=5, seed=3)
    C = _gauss(Q, K)
    assert res.norm_C == pytest.approx(np.linalg.norm(C, 2), rel=1e-12)
    assert res.lam == pytest.approx(0.1 * res.norm_C)
    rng = np.random.default_rng(3)
    direct = [np.linalg.norm(C - sinkflow.nystrom_matrix(Q, K, sinkflow.sample_landmarks(80, 20, generator=rng)), 2)
              for _ in range(5)]
    assert res.observed_error == pytest.approx(np.mean(direct), rel=1e-8)
    assert res.failures == sum(e > res.lam for e in direct)
    on_torch = sinkflow.nystrom_check(torch.tensor(Q), torch.tensor(K), 20, eps=0.1, delta=0.1, trials=5, seed=3)
    assert on_torch.observed_error == pytest.approx(res.observed_error, rel=1e-12)   # same float64 path
    m_obs = sinkflow.smallest_sufficient_landmarks(Q, K, 0.1, 0.1, trials=5, seed=3)
    assert m_obs is not None and res.m_required > 10 * m_obs   # measured looseness ~ 100-400


@pytest.mark.parametrize("method", ["dense", "lanczos"])
def test_symmetric_spectral_norm_of_an_indefinite_matrix_is_its_largest_absolute_eigenvalue(method):
    """An orthogonal similarity of diag(-5, 1, 2, 3, 4): ||A||_2 = 5, carried by the most negative eigenvalue."""
    U = np.linalg.qr(np.random.default_rng(0).normal(size=(5, 5)))[0]
    A = U @ np.diag([-5.0, 1.0, 2.0, 3.0, 4.0]) @ U.T
    assert sinkflow.spectral_norm(A, symmetric=True, method=method) == pytest.approx(5.0, rel=1e-10)
    assert sinkflow.spectral_norm(A, method=method) == pytest.approx(5.0, rel=1e-10)


def test_lanczos_matches_dense_spectral_norms():
    """ARPACK Lanczos to tol 1e-12 gives the same extreme values as LAPACK."""
    Q, K = _data(60, 8, 0.5, 17)
    J = sinkflow.sample_landmarks(120, 10, generator=0)
    top, E, _ = _lifted_pair(Q, K, J)
    E = 0.5 * (E + E.T)
    assert sinkflow.spectral_norm(top, method="lanczos") == pytest.approx(np.linalg.norm(top, 2), rel=1e-10)
    dense = sinkflow.extreme_eigenvalues(E, method="dense")
    lanczos = sinkflow.extreme_eigenvalues(E, method="lanczos")
    assert lanczos[1] == pytest.approx(dense[1], rel=1e-10)
    assert abs(lanczos[0] - dense[0]) <= 1e-10 * dense[1]


# --------------------------------------------------------------------------- bad input
def test_bad_input_gets_a_clear_error():
    Q, K = _data(5, 3, 1.0, 0)
    with pytest.raises(ValueError, match="landmarks must be >= 1"):
        sinkflow.nystrom_attention(Q, K, K, 0)
    with pytest.raises(ValueError, match="distinct landmarks"):
        sinkflow.nystrom_factors(Q, K, 11, replace=False)
    with pytest.raises(ValueError, match="repeat"):
        sinkflow.nystrom_factors(Q, K, [1, 1], replace=False)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        sinkflow.nystrom_factors(Q, K, [0, 10])
    with pytest.raises(TypeError, match="integers"):
        sinkflow.nystrom_factors(Q, K, np.array([0.0, 1.0]))
    bad = Q.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        sinkflow.nystrom_attention(bad, K, K, 2)
    with pytest.raises(ValueError, match="non-finite"):
        sinkflow.nystrom_check(Q, np.full_like(K, np.inf), 2)
    with pytest.raises(ValueError, match="head dimension"):
        sinkflow.kernelized_attention(Q, K[:, :2], K)
    with pytest.raises(ValueError, match="V must have shape"):
        sinkflow.nystrom_attention(Q, K, K[:4], 2)
    with pytest.raises(ValueError, match="one head"):
        sinkflow.nystrom_check(Q[None], K[None], 2)
    with pytest.raises(ValueError, match="inverse"):
        sinkflow.nystrom_attention(Q, K, K, 2, inverse="cholesky")
    with pytest.raises(ValueError, match="delta"):
        sinkflow.nystrom_check(Q, K, 2, delta=1.5)
    with pytest.raises(TypeError, match="floating"):
        sinkflow.kernelized_attention_matrix(np.ones((2, 2), dtype=int), K[:, :2])


def test_landmarks_beyond_the_stacked_points_cost_what_the_points_do(monkeypatch):
    # The pseudo-inverse estimate G M^+ G^T projects onto the span of the landmarks' columns, so
    # repeated landmarks change nothing (checked here on a draw with repeats); the check keeps the
    # distinct ones (it inverted an m x m block: 13 minutes for m = 10,000, N = 400), and with
    # every point drawn the lifted kernel is exact.
    Q, K = _data(6, 3, 0.5, 2)
    Cbar = np.exp(-0.5 * np.square(np.concatenate([Q, K])[:, None] - np.concatenate([Q, K])[None]).sum(-1)
                  / math.sqrt(3))
    J = np.array([0, 3, 3, 7, 0, 11, 7])

    def approx(J):
        return Cbar[:, J] @ np.linalg.pinv(Cbar[np.ix_(J, J)], hermitian=True) @ Cbar[:, J].T

    assert np.abs(approx(J) - approx(np.unique(J))).max() <= 1e-10
    blocks = []
    pinv = np.linalg.pinv
    monkeypatch.setattr(np.linalg, "pinv", lambda M, *a, **kw: blocks.append(M.shape[0]) or pinv(M, *a, **kw))
    with pytest.warns(UserWarning, match="exceeds the N = 12 .* distinct landmarks"):
        res = sinkflow.nystrom_check(Q, K, 600, trials=3)
    assert max(blocks) <= 12 and res.max_error <= 1e-9 * res.norm_C
    with pytest.raises(ValueError, match="iterative inverse .* O\\(m\\^3\\)"):
        sinkflow.nystrom_check(Q, K, 13, trials=1, inverse="iterative")


def test_a_required_count_beyond_the_stacked_points_is_said():
    Q, K = _data(10, 4, 0.5, 3)
    res = sinkflow.nystrom_check(Q, K, 4, trials=2)
    assert res.m_required > 20 and "m required exceeds the N = 20 stacked points" in res.summary()


# --------------------------------------------------------------------------- CLI
def test_cli_random_data_and_npy_files(tmp_path, capsys):
    assert main(["nystrom-check", "--n", "24", "--p", "8", "--landmarks", "6", "--trials", "4"]) == 0
    out = capsys.readouterr().out
    for what in ("observed ||C - C~||_2", "lambda", "d_stat", "m required", "P(||C - C~||_2 > lambda)", "bound"):
        assert what in out
    Q, K = _data(20, 4, 0.5, 1)
    np.save(tmp_path / "Q.npy", Q)
    np.save(tmp_path / "K.npy", K)
    assert main(["nystrom-check", "--queries", str(tmp_path / "Q.npy"), "--keys", str(tmp_path / "K.npy"),
                 "--landmarks", "40", "--trials", "3", "--looseness"]) == 0
    out = capsys.readouterr().out
    assert "n_q=20, n_k=20, p=4" in out and "looseness" in out
    assert main(["nystrom-check", "--n", "8", "--landmarks", "0", "--trials", "2"]) == 2


def _nystromformer_reference(q, k, v, m, scale_over, n_iter=6):
    """Nyströmformer written from the paper and its code's conventions, independently of sinkflow:
    landmarks the means of m equal segments, three SoftMax kernels, and the cubic Newton-Schulz
    pseudo-inverse of the middle one from V0 = A^T / (max column sum * max row sum), the maxima
    taken per (batch, head) block or, as the official code, over all of them at once."""
    p, n = q.shape[-1], q.shape[-2]
    qm = q.reshape(*q.shape[:-2], m, n // m, p).mean(-2)
    km = k.reshape(*k.shape[:-2], m, n // m, p).mean(-2)
    f, a, b = (torch.softmax(x @ y.transpose(-1, -2) / math.sqrt(p), -1) for x, y in ((q, km), (qm, km), (qm, k)))
    cols, rows = a.abs().sum(-2).amax(-1, keepdim=True), a.abs().sum(-1).amax(-1, keepdim=True)
    if scale_over == "batch":
        cols, rows = cols.max(), rows.max()
    z = a.transpose(-1, -2) / (cols * rows)[..., None]
    eye = torch.eye(m, dtype=a.dtype)
    for _ in range(n_iter):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return f @ z @ (b @ v)


@pytest.mark.parametrize("init_scale", ["head", "batch"])
def test_nystromformer_start_per_head_or_over_the_batch_as_the_official_code(init_scale):
    """batch x heads = 2 x 3 blocks of different scales: both starts against the reference, and
    the two differ (the batch-wide start leaves each block a slower-converging start)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(3, 2, 3, 32, 8, generator=gen, dtype=torch.float64)
    q = q * torch.tensor([0.3, 1.0, 3.0], dtype=torch.float64)[:, None, None]  # heads of different sharpness
    qr, kr = q.clone().requires_grad_(), k.clone().requires_grad_()
    ours = sinkflow.nystromformer_attention(qr, kr, v, 8, init_scale=init_scale)
    ref = _nystromformer_reference(q.requires_grad_(), k.requires_grad_(), v, 8, init_scale)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad(ours.square().sum(), (qr, kr))
    torch.testing.assert_close(grads, torch.autograd.grad(ref.square().sum(), (q, k)), rtol=1e-9, atol=1e-11)
    flipped = {"head": "batch", "batch": "head"}[init_scale]
    other = sinkflow.nystromformer_attention(q.detach(), k.detach(), v, 8, init_scale=flipped)
    assert (other - ours).abs().max() > 1e-3 * ours.abs().max()
    with pytest.raises(ValueError, match="init_scale must be one of"):
        sinkflow.nystromformer_attention(q.detach(), k.detach(), v, 8, init_scale="global")
