"""Lines of weight zero: exactly empty, and the rest is the problem without them, in every path.

Oracle: the reduced problem with the line deleted, solved by the plain log-domain loop of
``oracles.sinkhorn_log`` (fixed ``n_iter``) and by POT's ``ot.sinkhorn`` (to tolerance).
"""

import numpy as np
import ot
import pytest
import torch

from oracles import sinkhorn_log
from sinkflow import solve_sinkhorn
from sinkflow.fields._blockwise_fields import lazy_attention_field
from sinkflow.fields._lowrank_fields import lowrank_attention_field


def problem(n=6, m=5, zero_rows=(), zero_cols=(1,), seed=11, scale=1.0):
    rng = np.random.default_rng(seed)
    C = rng.normal(size=(n, m)) * scale
    a, b = rng.random(n), rng.random(m)
    a[list(zero_rows)] = 0
    b[list(zero_cols)] = 0
    return C, a / a.sum(), b / b.sum()


def kept(size, zero):
    return np.array([i for i in range(size) if i not in zero])


ZEROS = [((), (1,)), ((2,), ()), ((0, 4), (1, 3)), ((5,), (0,))]


@pytest.mark.parametrize("zero_rows,zero_cols", ZEROS)
@pytest.mark.parametrize("n_iter", [1, 2, 3, 4, 6, 9])
def test_fixed_n_iter_empties_the_line_and_solves_the_reduced_problem(zero_rows, zero_cols, n_iter):
    C, a, b = problem(zero_rows=zero_rows, zero_cols=zero_cols)
    r, c = kept(6, zero_rows), kept(5, zero_cols)
    res = solve_sinkhorn(C, n_iter=n_iter, a=a, b=b)
    K = res.attention
    assert (K[list(zero_rows)] == 0).all() and (K[:, list(zero_cols)] == 0).all()
    oracle, f, g = sinkhorn_log(C[np.ix_(r, c)], n_iter, a[r], b[c])
    np.testing.assert_allclose(K[np.ix_(r, c)], oracle, rtol=0, atol=1e-12)
    assert (res.f[list(zero_rows)] == 0).all() and (res.g[list(zero_cols)] == 0).all()


@pytest.mark.parametrize("n,m,scale", [(6, 5, 1.0), (12, 9, 5.0), (12, 9, 40.0), (30, 30, 300.0)])
@pytest.mark.parametrize("zero_rows,zero_cols", ZEROS)
def test_to_tolerance_same_plan_as_pot_and_same_cost_as_without_the_zero(n, m, scale, zero_rows, zero_cols):
    C, a, b = problem(n, m, zero_rows, zero_cols, seed=n + m, scale=scale)
    r, c = kept(n, zero_rows), kept(m, zero_cols)
    res = solve_sinkhorn(C, a=a, b=b, tol=1e-10)
    reduced = solve_sinkhorn(C[np.ix_(r, c)], a=a[r], b=b[c], tol=1e-10)
    assert res.converged and reduced.converged
    K = res.attention
    assert (K[list(zero_rows)] == 0).all() and (K[:, list(zero_cols)] == 0).all()
    np.testing.assert_allclose(K[np.ix_(r, c)], reduced.attention, rtol=0, atol=1e-12)
    # cost: half-iterations and Newton steps (entries of `errors` beyond the half-iterations)
    assert res.n_iter == reduced.n_iter and len(res.errors) == len(reduced.errors)
    if scale <= 5:  # POT's multiplicative loop stalls at cold scores
        plan = ot.sinkhorn(a[r], b[c], -C[np.ix_(r, c)], reg=1.0, stopThr=1e-13, numItermax=100_000)
        np.testing.assert_allclose(a[r, None] * K[np.ix_(r, c)], plan, rtol=0, atol=1e-10)


def test_batched_and_masked_zero_weights_follow_each_entry():
    C0, a0, b0 = problem(zero_cols=(1,))
    C1, a1, b1 = problem(zero_rows=(3,), zero_cols=(), seed=4)
    mask = np.ones((2, 6, 5), bool)
    mask[1, :, 4] = False  # a padded key in the second entry
    C, a, b = np.stack([C0, C1]), np.stack([a0, a1]), np.stack([b0, b1])
    for n_iter in (4, None):
        K = solve_sinkhorn(C, n_iter=n_iter, a=a, b=b, mask=mask, tol=1e-11).attention
        one = solve_sinkhorn(C0, n_iter=n_iter, a=a0, b=b0, tol=1e-11).attention
        b1m = b1 * mask[1, 0]
        two = solve_sinkhorn(C1, n_iter=n_iter, a=a1, b=b1m / b1m.sum(), mask=mask[1], tol=1e-11).attention
        # to tolerance the batch stops together: entries agree to the tolerance, not to rounding
        atol = 1e-12 if n_iter else 1e-9
        np.testing.assert_allclose(K[0], one, rtol=0, atol=atol)
        np.testing.assert_allclose(K[1], two, rtol=0, atol=atol)
        assert (K[0][:, 1] == 0).all() and (K[1][3] == 0).all() and (K[1][:, 4] == 0).all()


@pytest.mark.parametrize("n_iter", [2, 3, 6, None])
def test_gradients_are_those_of_the_reduced_problem(n_iter):
    C, a, b = problem(zero_rows=(2,), zero_cols=(1,))
    r, c = kept(6, (2,)), kept(5, (1,))
    R = torch.tensor(np.random.default_rng(3).normal(size=C.shape))
    full = torch.tensor(C, requires_grad=True)
    solved = solve_sinkhorn(full, n_iter=n_iter, a=torch.tensor(a), b=torch.tensor(b), tol=1e-12)
    (solved.attention * R).sum().backward()
    sub = torch.tensor(C[np.ix_(r, c)], requires_grad=True)
    K = solve_sinkhorn(sub, n_iter=n_iter, a=torch.tensor(a[r]), b=torch.tensor(b[c]), tol=1e-12).attention
    (K * R[np.ix_(r, c)]).sum().backward()
    grad = full.grad.numpy()
    assert (grad[2] == 0).all() and (grad[:, 1] == 0).all()
    np.testing.assert_allclose(grad[np.ix_(r, c)], sub.grad.numpy(), rtol=0, atol=1e-12)


def test_gradient_matches_finite_differences_with_a_zero_weight():
    C, a, b = problem(zero_cols=(1,))
    Ct = torch.tensor(C, requires_grad=True)
    at, bt = torch.tensor(a), torch.tensor(b)
    assert torch.autograd.gradcheck(lambda S: solve_sinkhorn(S, n_iter=5, a=at, b=bt).attention, (Ct,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float32_zero_column_is_empty_at_cold_scores(dtype):
    C, a, b = problem(12, 9, (), (3,), scale=1000.0)
    res = solve_sinkhorn(torch.tensor(C, dtype=dtype), a=torch.tensor(a, dtype=dtype), b=torch.tensor(b, dtype=dtype))
    K = res.attention
    assert res.converged and torch.isfinite(K).all() and (K[:, 3] == 0).all()


def particles(n=14, zero=(3, 8), seed=0):
    x = torch.randn(n, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    w = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1)) + 0.1
    w[list(zero)] = 0
    return x, w / w.sum(), torch.tensor(kept(n, zero))


@pytest.mark.parametrize("scores", ["dot", "gaussian"])
@pytest.mark.parametrize("n_iter", [3, 4, None])
def test_blockwise_field_without_its_weightless_particles(scores, n_iter):
    x, w, keep = particles()
    res = lazy_attention_field(x, weights=w, scores=scores, n_iter=n_iter, tol=1e-12, block_bytes=800)
    reduced = lazy_attention_field(x[keep], weights=w[keep], scores=scores, n_iter=n_iter, tol=1e-12)
    assert torch.isfinite(res.velocity).all() and (res.velocity[[3, 8]] == 0).all()
    torch.testing.assert_close(res.velocity[keep], reduced.velocity, rtol=0, atol=1e-12)
    assert res.n_iter == reduced.n_iter and (res.g[[3, 8]] == 0).all()
    # the dense solver agrees (kernel a_j e^{C_ij}, the zero lines masked)
    C = x @ x.T if scores == "dot" else -0.5 * torch.cdist(x, x) ** 2
    K = solve_sinkhorn(C + torch.log(w)[None, :].nan_to_num(neginf=0.0), n_iter=n_iter, a=w, b=w, tol=1e-12).attention
    torch.testing.assert_close(res.velocity, K @ x, rtol=0, atol=1e-9)


@pytest.mark.parametrize("n_iter", [3, 4, None])
def test_landmark_field_without_its_weightless_particles(n_iter):
    x, w, keep = particles()
    res = lowrank_attention_field(x, x, keep, weights=w, n_iter=n_iter, tol=1e-12)
    reduced = lowrank_attention_field(x[keep], x[keep], torch.arange(len(keep)), weights=w[keep], n_iter=n_iter,
                                      tol=1e-12)
    assert (res.velocity[[3, 8]] == 0).all() and (res.g[[3, 8]] == 0).all()
    torch.testing.assert_close(res.velocity[keep], reduced.velocity, rtol=0, atol=1e-12)
    assert res.n_iter == reduced.n_iter
