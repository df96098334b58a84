"""SoftMax and Sinkhorn: the laws of docs/theory/normalizations.md, checked."""

import warnings

import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sinkflow
from sinkflow import SinkhornWarning, gaussian_scores, sinkhorn, softmax, solve_sinkhorn


def random_scores(n, m, scale=1.0, seed=0, batch=()):
    rng = np.random.default_rng(seed)
    return scale * rng.normal(size=batch + (n, m))


def test_sinkhorn_matches_pot_plan():
    # pi = diag(a) K is POT's entropic plan for cost -C and reg = 1 (docs/theory/normalizations.md).
    # Both solvers run to 1e-13, so 1e-8 relative leaves five orders of margin.
    rng = np.random.default_rng(1)
    C = rng.normal(size=(7, 5))
    a = rng.dirichlet(np.ones(7))
    b = rng.dirichlet(np.ones(5))
    res = solve_sinkhorn(C, tol=1e-13, a=a, b=b)
    pi = ot.sinkhorn(a, b, -C, reg=1.0, stopThr=1e-15, numItermax=100_000)
    assert res.converged
    assert np.abs(res.plan - pi).max() / pi.max() <= 1e-8


def test_one_half_iteration_is_softmax_exactly():
    C = random_scores(6, 9, scale=3.0)
    assert np.array_equal(sinkhorn(C, n_iter=1), softmax(C))
    Ct = torch.tensor(C, dtype=torch.float32)
    assert torch.equal(sinkhorn(Ct, n_iter=1), softmax(Ct))
    assert np.allclose(softmax(C), torch.softmax(torch.tensor(C), -1).numpy(), rtol=1e-14, atol=0)


def test_row_and_column_constants_do_not_change_the_limit():
    # Sinkhorn(C + u 1^T + 1 v^T) = Sinkhorn(C): the potentials absorb u and v.
    rng = np.random.default_rng(2)
    C = rng.normal(size=(8, 8))
    u, v = rng.normal(size=(8, 1)) * 5, rng.normal(size=(1, 8)) * 5
    K1 = sinkhorn(C, tol=1e-12)
    K2 = sinkhorn(C + u + v, tol=1e-12)
    assert np.abs(K1 - K2).max() < 1e-10  # 100x the tolerance: two solves, each within 1e-12


def test_dot_and_gaussian_scores_agree_for_sinkhorn_not_softmax():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(10, 3))
    Kdot = sinkhorn(sinkflow.dot_scores(x, x), tol=1e-12)
    Kgau = sinkhorn(gaussian_scores(x, x), tol=1e-12)
    assert np.abs(Kdot - Kgau).max() < 1e-10
    assert np.abs(softmax(sinkflow.dot_scores(x, x)) - softmax(gaussian_scores(x, x))).max() > 1e-2


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), m=st.integers(1, 12), batch=st.integers(1, 3),
       scale=st.floats(0.01, 10.0), seed=st.integers(0, 2**16))
def test_marginals_within_tolerance_for_all_shapes(n, m, batch, scale, seed):
    C = random_scores(n, m, scale, seed, (batch,))
    res = solve_sinkhorn(C, tol=1e-9, max_iter=20_000, warn=False)
    K = res.attention
    assert np.isfinite(K).all() and (K >= 0).all()
    assert np.allclose(K.sum(-1), 1.0, atol=1e-9)
    if res.converged:
        assert np.abs(K.sum(-2) / n - 1.0 / m).sum(-1).max() <= 1e-9 * (1 + 1e-6)
    else:  # only cold, nearly degenerate problems may run out of budget
        assert scale > 5


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 10), scale=st.floats(0.1, 5.0), seed=st.integers(0, 2**16), ell=st.integers(1, 8))
def test_half_iteration_counting_alternates(n, scale, seed, ell):
    # After an odd number of half-iterations rows are exact; after an even number, columns.
    K = sinkhorn(random_scores(n, n, scale, seed), n_iter=ell)
    if ell % 2:
        assert np.allclose(K.sum(1), 1, atol=1e-12)
    else:
        assert np.allclose(K.sum(0), 1, atol=1e-12)


def test_numpy_torch_parity_and_types():
    C = random_scores(5, 6, seed=4, batch=(2, 3))
    Kn = sinkhorn(C, n_iter=7)
    Kt = sinkhorn(torch.tensor(C), n_iter=7)
    assert isinstance(Kn, np.ndarray) and isinstance(Kt, torch.Tensor)
    assert Kt.dtype == torch.float64
    assert np.allclose(Kn, Kt.numpy(), atol=1e-15)
    K32 = sinkhorn(torch.tensor(C, dtype=torch.float32), n_iter=7)
    assert K32.dtype == torch.float32 and np.allclose(K32.numpy(), Kn, atol=1e-6)
    res = solve_sinkhorn(torch.tensor(C))
    assert isinstance(res.f, torch.Tensor) and res.f.shape == (2, 3, 5) and res.g.shape == (2, 3, 6)


def test_potentials_reconstruct_the_matrix():
    C = random_scores(6, 4, seed=5)
    res = solve_sinkhorn(C)
    assert np.allclose(np.exp(res.f[:, None] + C + res.g[None, :]), res.attention, rtol=1e-12)


def test_batched_equals_one_by_one():
    C = random_scores(5, 5, 2.0, seed=6, batch=(4,))
    batched = sinkhorn(C, n_iter=9)
    for k in range(4):
        assert np.allclose(batched[k], sinkhorn(C[k], n_iter=9), atol=1e-15)


def test_autograd_gradcheck_float64():
    C = torch.tensor(random_scores(4, 3, seed=7), requires_grad=True)
    assert torch.autograd.gradcheck(lambda c: sinkhorn(c, n_iter=5), (C,))
    w = torch.tensor(random_scores(4, 3, seed=8))
    assert torch.autograd.gradcheck(lambda c: (sinkhorn(c, tol=1e-12) * w).sum(), (C,))


def test_gradient_is_finite_at_cold_temperature():
    C = torch.tensor(random_scores(8, 8, scale=200.0, seed=9), requires_grad=True)
    sinkhorn(C, n_iter=10).pow(2).sum().backward()
    assert torch.isfinite(C.grad).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cold_temperatures_stay_finite(dtype):
    x = np.random.default_rng(10).normal(size=(40, 2))
    for factor in (1e2, 1e3, 1e4):
        C = (gaussian_scores(x, x[::-1] + 0.1) * factor).astype(dtype)
        res = solve_sinkhorn(C, n_iter=50)
        assert np.isfinite(res.attention).all() and np.isfinite(res.f).all() and np.isfinite(res.g).all()
        assert np.allclose(res.attention.sum(0), 1, atol=1e-4 if dtype == np.float32 else 1e-12)


def test_epsilon_scaling_reaches_the_same_fixed_point_faster():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 2)), rng.normal(size=(40, 2))
    C = 30 * gaussian_scores(x, y)
    fast = solve_sinkhorn(C, tol=1e-9)
    plain = solve_sinkhorn(C, tol=1e-9, epsilon_scaling=False, max_iter=20_000)
    assert fast.converged and plain.converged
    # Both within 1e-9 marginal error of the same (unique) fixed point.
    assert np.abs(fast.attention - plain.attention).max() < 1e-6
    assert fast.n_iter * 5 < plain.n_iter  # measured: 550 vs 9,178 half-iterations


@pytest.mark.parametrize("factor", [1e3, 1e4])
def test_very_cold_temperatures_converge_to_tolerance(factor):
    # The plain loop is at marginal error 2e-5 (x1e3) after 100,000 half-iterations here.
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 2)), rng.normal(size=(40, 2))
    res = solve_sinkhorn(factor * gaussian_scores(x, y), tol=1e-9)
    assert res.converged and res.n_iter < 5_000
    K = res.attention
    assert np.isfinite(K).all() and np.allclose(K.sum(1), 1, atol=1e-12) and np.allclose(K.sum(0), 1, atol=1e-8)


def test_max_iter_warns_and_flags():
    C = 30 * gaussian_scores(*np.random.default_rng(0).normal(size=(2, 40, 2)))
    with pytest.warns(SinkhornWarning, match="max_iter"):
        res = solve_sinkhorn(C, tol=1e-12, max_iter=50)
    assert not res.converged and res.n_iter == 50 and res.marginal_error > 1e-12


def test_fixed_n_iter_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = solve_sinkhorn(random_scores(5, 5, 10.0), n_iter=3)
    assert len(res.errors) == 3


def test_mask_zero_weight_and_empty_rows_are_finite():
    C = random_scores(4, 5, seed=11)
    mask = np.ones((4, 5), bool)
    mask[:, 4] = False  # a padded key
    mask[2, :] = False  # a query with no key at all
    res = solve_sinkhorn(C, mask=mask)
    K = res.attention
    assert np.isfinite(K).all()
    assert (K[:, 4] == 0).all() and (K[2] == 0).all()
    rows = [0, 1, 3]
    assert np.allclose(K[rows].sum(1), 1)
    # Remaining problem: 3 queries, 4 keys, uniform -> columns carry 3/4 each.
    assert np.allclose(K[rows][:, :4].sum(0), 3 / 4, atol=1e-9)
    assert np.allclose(K[rows][:, :4], sinkhorn(C[rows][:, :4]), atol=1e-9)
    Ks = softmax(C, mask=mask)
    assert (Ks[2] == 0).all() and np.allclose(Ks[rows].sum(1), 1) and (Ks[:, 4] == 0).all()


def test_mask_ignores_nonfinite_scores_where_masked():
    C = random_scores(3, 3)
    C[0, 2] = -np.inf
    with pytest.raises(ValueError, match="non-finite"):
        sinkhorn(C)
    K = sinkhorn(C, mask=np.isfinite(C))
    assert np.isfinite(K).all() and K[0, 2] == 0


def test_warm_start_reaches_the_same_fixed_point():
    C = random_scores(10, 10, 3.0, seed=12)
    res = solve_sinkhorn(C)
    warm = solve_sinkhorn(C + 1e-3, init_g=res.g)
    assert np.abs(warm.attention - res.attention).max() < 1e-8 and warm.n_iter < res.n_iter


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"scores": np.array([[1.0, np.nan]])}, ValueError, "non-finite"),
        ({"scores": np.array([1.0, 2.0])}, ValueError, "at least 2"),
        ({"scores": np.ones((2, 2), dtype=int)}, TypeError, "floating"),
        ({"scores": np.ones((2, 2)), "a": np.array([0.5, 0.6])}, ValueError, "sum to 1"),
        ({"scores": np.ones((2, 2)), "b": np.array([1.5, -0.5])}, ValueError, "non-negative"),
        ({"scores": np.ones((2, 2)), "a": np.ones(3) / 3}, ValueError, "last dimension"),
        ({"scores": np.ones((2, 2)), "mask": np.ones((3, 2), bool)}, ValueError, "broadcast"),
        ({"scores": np.ones((2, 2)), "mask": np.ones((2, 2))}, TypeError, "boolean"),
        ({"scores": np.ones((2, 2)), "n_iter": 0}, ValueError, "positive integer"),
        ({"scores": np.ones((0, 2))}, ValueError, "non-empty"),
    ],
)
def test_bad_input_gets_a_clear_error(kwargs, error, match):
    with pytest.raises(error, match=match):
        solve_sinkhorn(**kwargs)
