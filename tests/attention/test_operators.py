"""The kernel operators behind the one Sinkhorn solver, and the solver's report, against plain oracles.

Oracle: the log-domain half-steps written out in float64 (``f = -logsumexp_j(C + g)``,
``g = log b - logsumexp_i(log a + C + f)``) and the marginal error of ``exp(f + C + g)`` recomputed
from the returned potentials.
"""


import math

import numpy as np
import pytest
import torch

import sinkflow.attention._symmetric_sinkhorn as symmetric
from sinkflow.attention._operators import _DenseLog, _DenseScaling, _scaling_schedule, dense_operator
from sinkflow.attention._solver import SolveReport, sinkhorn_solve
from sinkflow.attention._symmetric_sinkhorn import fixed_count, solve_symmetric
from sinkflow.fields._blockwise_fields import _BlockScores, _BlockwiseOperator, _Passes
from sinkflow.heat._grid_fields import _SymmetricScaling, symmetric_sinkhorn_scaling


def plain_row(C, g):
    return -torch.logsumexp(C + g[..., None, :], -1)


def plain_col(C, f, a, b):
    return torch.log(b) - torch.logsumexp(torch.log(a)[..., :, None] + C + f[..., :, None], -2)


def marginal_errors(C, f, g, a, b):
    """(row error, column error) of ``K = exp(f + C + g)``, per problem."""
    K = torch.exp(f[..., :, None] + C + g[..., None, :])
    row = (a * (K.sum(-1) - 1).abs()).sum(-1)
    col = ((a[..., :, None] * K).sum(-2) - b).abs().sum(-1)
    return row, col


def weights(gen, *shape):
    w = torch.rand(*shape, generator=gen, dtype=torch.float64) + 0.1
    return w / w.sum(-1, keepdim=True)


def dense_problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    C = 3 * torch.randn(2, 7, 5, generator=gen, dtype=torch.float64)
    return C, weights(gen, 2, 7), weights(gen, 2, 5), torch.randn(2, 5, generator=gen, dtype=torch.float64)


def blockwise_problem(n=30, rows=4, seed=1):
    """A block-wise operator (blocks of ``rows`` rows, dot scores x W x^T / tau, uniform weights) and its C."""
    x = torch.tensor(np.random.default_rng(seed).normal(size=(n, 2)))
    W, tau = torch.tensor([[1.0, 0.3], [0.3, 0.8]], dtype=torch.float64), 1.0
    a = torch.full((n,), 1.0 / n, dtype=torch.float64)
    op = _BlockwiseOperator(_Passes(_BlockScores(x, W, tau, "dot", None), x, a, rows), a)
    return op, (x @ W / tau) @ x.T, a, x


# float64 rounding of a few log-sum-exp steps of scores of size ~10
ATOL = 1e-12


def check_dense_steps(op, C, a, b, g0):
    op.reset(1.0, torch.zeros(2, 7, dtype=torch.float64), g0)
    f, g = None, g0
    for k in range(5):  # row, column, row, column, row: the multiplicative steps after the first log step
        row = k % 2 == 0
        op.step(row, 1.0, True)
        f, g = (plain_row(C, g), g) if row else (f, plain_col(C, f, a, b))
        of, og = op.potentials()
        torch.testing.assert_close(of, f, rtol=0, atol=ATOL)
        torch.testing.assert_close(og, g, rtol=0, atol=ATOL)
        err_row, err_col = marginal_errors(C, f, g, a, b)
        torch.testing.assert_close(op.error(row), err_col if row else err_row, rtol=0, atol=ATOL)
    P, of, og = op.finish()
    torch.testing.assert_close(P, torch.exp(f[..., :, None] + C + g[..., None, :]), rtol=0, atol=ATOL)


@pytest.mark.parametrize("kind", ["log", "scaling"])
def test_dense_steps_equal_the_plain_log_domain_steps(kind):
    C, a, b, g0 = dense_problem()
    op = _DenseLog(C, a, b, None, inplace=True) if kind == "log" else _DenseScaling(C, a, b, None)
    assert op.domain == kind
    check_dense_steps(op, C, a, b, g0)


class _WrongColumns(_DenseLog):
    """A planted bug: the column step aims at the wrong marginal (b shifted by one key)."""

    def step(self, row, omega, fused):
        if row:
            return super().step(row, omega, fused)
        b, self.b = self.b, torch.roll(self.b, 1, -1)
        try:
            return super().step(row, omega, fused)
        finally:
            self.b = b


def test_a_planted_bug_in_a_step_fails_the_oracle():
    C, a, b, g0 = dense_problem()
    with pytest.raises(AssertionError):
        check_dense_steps(_WrongColumns(C, a, b, None, inplace=True), C, a, b, g0)


def test_blockwise_steps_equal_the_plain_log_domain_steps():
    op, C, a, x = blockwise_problem()
    g = 0.1 * torch.arange(30, dtype=torch.float64)
    op.reset(1.0, None, g)
    f = None
    for k in range(5):
        row = k % 2 == 0
        op.step(row, 1.0, True)
        f, g = (plain_row(C, g), g) if row else (f, plain_col(C, f, a, a))
        of, og = op.potentials()
        torch.testing.assert_close(of, f, rtol=0, atol=ATOL)
        torch.testing.assert_close(og, g, rtol=0, atol=ATOL)
        err_row, err_col = marginal_errors(C, f, g, a, a)
        # after a row step the column error is fused with it; after a column step one more pass
        torch.testing.assert_close(op.error(row), err_col if row else err_row, rtol=0, atol=ATOL)
    vel, of, og, row_err, col_err = op.finish()  # ended on a row step: the fused velocity
    K = torch.exp(f[:, None] + C + g[None, :])
    torch.testing.assert_close(vel, K @ x, rtol=0, atol=ATOL)
    assert row_err == 0.0 and col_err == pytest.approx(float(marginal_errors(C, f, g, a, a)[1]), abs=ATOL)


def report_of(op, C, a, **kw):
    f0 = torch.zeros(C.shape[:-1], dtype=C.dtype)
    out, report = sinkhorn_solve(op, None if isinstance(op, _BlockwiseOperator) else f0,
                                 torch.zeros(C.shape[:-2] + C.shape[-1:], dtype=C.dtype), **kw)
    f, g = out[1], out[2]
    return report, max(float(e.max()) for e in marginal_errors(C, f, g, a, a))


@pytest.mark.parametrize("n_iter", [1, 7])
def test_fixed_n_iter_reports_the_same_across_operators(n_iter):
    block, C, a, _ = blockwise_problem()
    dense = dense_operator(C, a, a, None, True)
    for op in (block, dense):
        report, recomputed = report_of(op, C, a, n_iter=n_iter, report=True)
        assert isinstance(report, SolveReport) and report.n_iter == n_iter and report.converged
        # an odd count ends on a row step: the error read last is the column error, the only one left
        assert report.marginal_error == pytest.approx(recomputed, abs=ATOL)
    # the block-wise operator reads its error after row steps only (fused with them): every second half-step
    assert len(report_of(block, C, a, n_iter=n_iter, report=True)[0].errors) == (n_iter + 1) // 2
    assert len(report_of(dense_operator(C, a, a, None, True), C, a, n_iter=n_iter, report=True)[0].errors) == n_iter
    # the lean entry reads nothing
    assert report_of(block, C, a, n_iter=n_iter)[0].errors == []


@pytest.mark.parametrize("tol", [1e-4, 1e-9])
def test_to_tolerance_reaches_it_on_both_operators(tol):
    block, C, a, _ = blockwise_problem()
    counts = []
    for op in (block, dense_operator(C, a, a, None, True)):
        report, recomputed = report_of(op, C, a, tol=tol, max_iter=5000, accelerate=False, stall=False)
        assert report.converged and report.marginal_error <= tol
        # the report is the marginal error of the returned potentials (the other marginal is exact)
        assert recomputed == pytest.approx(report.marginal_error, rel=1e-6, abs=ATOL)
        counts.append(report.n_iter)
    # the same plain iteration: the dense one may stop one half-step earlier (it also reads after column steps)
    assert 0 <= counts[0] - counts[1] <= 1


def test_accelerated_solve_to_tolerance_on_cold_scores():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(60, 2, generator=gen, dtype=torch.float64)
    C = -torch.cdist(x, x) ** 2 / 0.002  # cold: scores spanning ~1e4
    a = torch.full((60,), 1 / 60, dtype=torch.float64)
    zeros = torch.zeros(60, dtype=torch.float64)
    schedule = _scaling_schedule(C, None, 4.0)
    assert len(schedule) > 3
    (P, f, g), report = sinkhorn_solve(dense_operator(C, a, a, None, True), zeros, zeros, tol=1e-9, max_iter=20_000,
                                       schedule=schedule)
    row, col = marginal_errors(C, f, g, a, a)
    assert report.converged and max(float(row), float(col)) <= 1e-9 + ATOL
    assert sorted(set(report.scales)) == sorted(schedule)  # every stage ran
    # plain iterations take far longer on this problem (measured: stalled well above 1e-9 within 2,000)
    _, plain = sinkhorn_solve(dense_operator(C, a, a, None, True), zeros, zeros, tol=1e-9, max_iter=2_000,
                              accelerate=False)
    assert report.n_iter < plain.n_iter or not plain.converged


def test_an_unreachable_tolerance_is_reported_early():
    C, a, b, _ = dense_problem(4)
    f0, g0 = torch.zeros(2, 7, dtype=torch.float64), torch.zeros(2, 5, dtype=torch.float64)
    # float64 rounding leaves ~1e-16 of marginal error: 1e-30 is out of reach
    _, report = sinkhorn_solve(_DenseLog(C, a, b, None, True), f0, g0, tol=1e-30, max_iter=20_000, accelerate=False)
    assert not report.converged and 0 < report.marginal_error < 1e-12
    # the rate shows the tolerance out of reach: it stops long before max_iter, and says so
    assert report.stalled is not None and report.n_iter < 1000


def grid_problem(n=61):
    y = torch.linspace(-3, 3, n, dtype=torch.float64)
    K = torch.exp(-(y[:, None] - y[None]) ** 2 / 0.2)
    w = torch.exp(-(y**2) / 2)
    w[:5] = 0.0  # cells outside the support
    return K, w / w.sum()


def test_grid_symmetric_step_equals_the_plain_symmetric_iteration():
    K, w = grid_problem()
    op = _SymmetricScaling(lambda v: K @ v, w)
    assert op.domain == "scaling"
    s = torch.where(w > 0, (K @ w).rsqrt(), 0.0)
    op.reset(1.0, None, s)
    for _ in range(4):
        op.step(True, 1.0, True)
        s = torch.where(w > 0, torch.sqrt(s / (K @ (s * w))), 0.0)  # s <- sqrt(s / K(s w))
        torch.testing.assert_close(op.potentials()[1], s, rtol=0, atol=ATOL)
        plan = (w * s)[:, None] * K * (s * w)[None]
        torch.testing.assert_close(op.error(True), (plan.sum(1) - w).abs().sum(), rtol=0, atol=ATOL)


def test_grid_solve_reports_like_the_others():
    K, w = grid_problem()
    s, n, err, converged = symmetric_sinkhorn_scaling(lambda v: K @ v, w, tol=1e-12)
    plan = (w * s)[:, None] * K * (s * w)[None]
    assert converged and err <= 1e-12 and 0 < n < 60
    assert float((plan.sum(0) - w).abs().sum()) == pytest.approx(err, abs=ATOL)
    # a warm start already within tol: the error of the start is read first, no step taken
    assert symmetric_sinkhorn_scaling(lambda v: K @ v, w, s, tol=1e-10)[1:] == (0, pytest.approx(err, abs=ATOL), True)
    # a budget too small: not converged, the error of the last step reported
    s2, n2, err2, ok2 = symmetric_sinkhorn_scaling(lambda v: K @ v, w, tol=1e-12, max_iter=3)
    assert (n2, ok2) == (3, False) and err2 > 1e-12


def symmetric_problem(seed=2, n=20, batch=3):
    """Dot scores of points in the plane at three temperatures (symmetric PSD) and positive weights."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, n, 2))
    C = x @ x.swapaxes(-1, -2) / np.array([0.3, 1.0, 0.03])[:batch, None, None]
    a = rng.random((batch, n)) + 0.2
    return torch.as_tensor(C), torch.as_tensor(a / a.sum(-1, keepdims=True))


@pytest.mark.parametrize("numpy_entries", [symmetric.NUMPY_ENTRIES, 0])  # numpy arrays, then torch tensors
def test_symmetric_solve_reports_like_the_others(monkeypatch, numpy_entries):
    # the report of the symmetric operator: iterations of the slowest system and the largest column error,
    # that of the returned plan recomputed by plain sums; a system that blew up stops alone, not converged
    monkeypatch.setattr(symmetric, "NUMPY_ENTRIES", numpy_entries)
    C, a = symmetric_problem(seed=3)
    res = solve_symmetric(C, a, None, 1e-11, 200)
    assert res.iterations.tolist() == [4, 5, 3]  # (measured) systems that stop at different iterations
    column = ((a[..., :, None] * res.attention).sum(-2) - a).abs().sum(-1)
    assert isinstance(res.report, SolveReport) and res.report.converged and res.converged.all()
    assert res.report.n_iter == int(res.iterations.max())
    assert res.report.marginal_error == pytest.approx(float(column.max()), abs=1e-14)
    assert float(column.max()) <= 1e-11
    for b in range(3):  # a system stops for itself: its plan is the one it reaches alone (to rounding of the
        alone = solve_symmetric(C[b], a[b], None, 1e-11, 200)  # batched products; a step more moves it ~1e-12)
        torch.testing.assert_close(alone.attention, res.attention[b], rtol=0, atol=1e-15)
        assert alone.report.n_iter == int(res.iterations[b])
    C_bad = C.clone()
    C_bad[1, 0, 0] = math.nan
    bad = solve_symmetric(C_bad, a, None, 1e-11, 200)
    assert bad.converged.tolist() == [True, False, True] and int(bad.iterations[1]) < 200
    assert not bad.report.converged and math.isnan(bad.report.marginal_error)
    assert torch.equal(bad.iterations[[0, 2]], res.iterations[[0, 2]])
    # a budget too small: not converged, every system at the budget
    short = solve_symmetric(C, a, None, 1e-11, 2)
    assert not short.report.converged and short.report.n_iter == 2 and short.report.marginal_error > 1e-11


@pytest.mark.parametrize("as_numpy", [True, False])
def test_a_symmetric_fixed_count_reports_the_plain_loops_errors(as_numpy):
    # the fixed count on the solver's lean entry: no error read unless asked; asked, the error after every
    # half-step is that of the plain log-domain loop (oracle), of the marginal the half-step did not normalize
    C, a = symmetric_problem(seed=3)
    g0 = 0.1 * torch.randn(3, 20, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    args = [t.numpy() for t in (C, a, g0)] if as_numpy else [C, a, g0]
    (K, g), report = fixed_count(*args, 5, report=True)
    assert report.n_iter == 5 and report.converged and len(report.errors) == 5
    assert fixed_count(*args, 5)[1].shape == (3, 20)  # lean: (K, g) alone
    T, f, h = C + torch.log(a)[..., None, :], torch.zeros_like(a), g0.clone()
    for k, err in enumerate(report.errors):
        row = k % 2 == 0
        f, h = (plain_row(T, h), h) if row else (f, plain_col(T, f, a, a))
        e_row, e_col = marginal_errors(T, f, h, a, a)
        assert err == pytest.approx(float((e_col if row else e_row).max()), abs=ATOL)
    torch.testing.assert_close(torch.as_tensor(K), torch.exp(f[..., :, None] + T + h[..., None, :]), rtol=0,
                               atol=ATOL)
