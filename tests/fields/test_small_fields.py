"""Small single-system Sinkhorn fields (numpy from scores to velocity) against the batched solver and
a plain log-domain loop, and what ``Trajectory.sinkhorn_iterations`` counts."""

import numpy as np
import pytest
import torch

import sinkflow
import sinkflow.attention._symmetric_sinkhorn as symmetric
import sinkflow.fields._dense_fields as dense_fields
from oracles import sinkhorn_log
from sinkflow.attention._symmetric_sinkhorn import _kernel, solve_kernel, solve_symmetric


def plain_sinkhorn(C, a, half_steps):
    """Alternating row / column normalizations of a_j e^{C_ij} (rows to 1, columns to a), log domain."""
    return sinkhorn_log(C + np.log(a), half_steps, a, a)[0]


def problem(seed, n, spread, tau=0.2):
    rng = np.random.default_rng(seed)
    x = spread * rng.standard_normal((n, 2))
    a = rng.random(n) + 0.2
    return x, x @ x.T / tau, a / a.sum()


@pytest.mark.parametrize("n", [12, 96, 130])  # Newton's steps, then heavy-ball steps alone
@sinkflow.fast_paths(True)  # the numpy route, batched and alone (SINKFLOW_FAST_PATHS=0 turns it off elsewhere)
def test_one_system_takes_the_batched_solvers_iterates_bit_for_bit(n):
    systems = [problem(s, n, spread) for s, spread in ((1, 1.0), (2, 3.0), (3, 0.3))]
    C = np.stack([c for _, c, _ in systems])
    a = np.stack([w for _, _, w in systems])
    kick = 1e-4 * np.random.default_rng(0).standard_normal((3, n))
    cold = solve_symmetric(torch.as_tensor(C), torch.as_tensor(a), None, 1e-11, 200)
    for init in (None, cold.g.numpy() + kick):
        batch = solve_symmetric(torch.as_tensor(C), torch.as_tensor(a), None if init is None else torch.as_tensor(init),
                                1e-11, 200)
        for b in range(3):
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                E, half = _kernel(C[b].copy())
                op, report = solve_kernel(E, half, a[b], None if init is None else init[b], 1e-11, 200)
            K, g, count, err = (E * (op.u / op.s[:, None]), op.w - half, int(op.systems.iterations),
                                report.marginal_error)
            assert count == int(batch.iterations[b]) == report.n_iter and err <= 1e-11 and report.converged
            np.testing.assert_array_equal(K, batch.attention[b].numpy())
            np.testing.assert_array_equal(g, batch.g[b].numpy())


@pytest.mark.parametrize("n_iter", [None, 3])
def test_the_small_field_is_the_plain_loops_field(n_iter):
    x, C, a = problem(4, 20, 1.0)
    ev = dense_fields.attention_field(torch.as_tensor(x), "sinkhorn", None, None, n_iter=n_iter,
                                      weights=torch.as_tensor(a),
                                      temperature=0.2, tol=1e-12, symmetric=True, need_errors=True)
    oracle = plain_sinkhorn(C, a, 6001 if n_iter is None else n_iter)  # ends on a row step
    if n_iter is None:
        assert ev.converged and ev.column_error <= 1e-12
        assert np.abs(a @ oracle - a).sum() < 1e-13  # the oracle converged: its columns too
    np.testing.assert_allclose(ev.velocity.numpy(), oracle @ x, rtol=0, atol=1e-11)
    np.testing.assert_allclose(ev.attention.numpy(), oracle, rtol=0, atol=1e-12)


@pytest.mark.parametrize("manifold, integrator, n_iter", [("sphere", "euler", None), ("euclidean", "rk4", None),
                                                          ("euclidean", "euler", 3)])
def test_numpy_and_torch_small_flows_agree(monkeypatch, manifold, integrator, n_iter):
    x0 = sinkflow.random_particles(24, 2, seed=5, manifold=manifold)
    kw = dict(h=0.05, steps=12, manifold=manifold, temperature=0.2, integrator=integrator, n_iter=n_iter)
    small = sinkflow.simulate(x0, "sinkhorn", **kw)
    monkeypatch.setattr(symmetric, "NUMPY_ENTRIES", 0)  # the batched torch solver
    monkeypatch.setattr(dense_fields, "NUMPY_N", 0)
    big = sinkflow.simulate(x0, "sinkhorn", **kw)
    np.testing.assert_allclose(small.positions, big.positions, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(small.sinkhorn_iterations, big.sinkhorn_iterations)


def test_a_fixed_count_flow_spread_far_in_the_plane_is_the_general_solvers():
    # W_V = I spreads the particles like e^t: by t = 2.5 a SoftMax column sum falls to e^-800
    # (the kernel domain's old limit was crossed near t = 1.2); the general solver works in the log domain
    x0 = sinkflow.random_particles(32, 2, seed=0)
    kw = dict(h=0.05, steps=50, temperature=0.2, n_iter=3)
    fast = sinkflow.simulate(x0, "sinkhorn", **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sinkflow.particles._system._symmetric_psd", lambda W: False)
        general = sinkflow.simulate(x0, "sinkhorn", **kw)
    scale = np.abs(general.positions).max(axis=(1, 2))[:, None, None]
    np.testing.assert_allclose(fast.positions / scale, general.positions / scale, rtol=0, atol=1e-11)


def test_sinkhorn_iterations_count_the_solver_that_ran(monkeypatch):
    x0 = sinkflow.random_particles(10, 2, seed=8, manifold="sphere")
    kw = dict(h=0.05, steps=3, manifold="sphere", temperature=0.1)
    assert (sinkflow.simulate(x0, "sinkhorn", n_iter=5, **kw).sinkhorn_iterations == 5).all()
    assert (sinkflow.simulate(x0, "sinkhorn", n_iter=5, integrator="rk4", **kw).sinkhorn_iterations == 20).all()
    C, a = torch.as_tensor(x0 @ x0.T / 0.1), torch.full((10,), 0.1, dtype=torch.float64)
    first = sinkflow.simulate(x0, "sinkhorn", **kw).sinkhorn_iterations[0]  # a cold start
    assert first == int(solve_symmetric(C, a, None, 1e-10, 200).iterations)
    monkeypatch.setattr(dense_fields, "SYMMETRIC_BUDGET", 1)  # then the general solver finishes
    general = sinkflow.solve_sinkhorn(C + torch.log(a), tol=1e-10, a=a, b=a, warn=False)
    assert sinkflow.simulate(x0, "sinkhorn", **kw).sinkhorn_iterations[0] == 1 + general.n_iter


@pytest.mark.parametrize("n_iter", [None, 4])
def test_the_small_field_takes_W_and_the_temperature_into_its_numpy_scores(n_iter):
    # the small path forms x W x^T / tau in numpy; the oracle forms the scores itself and runs the plain loop
    rng = np.random.default_rng(7)
    x, A = rng.standard_normal((18, 2)), rng.standard_normal((2, 2))
    W, tau = A @ A.T + 0.5 * np.eye(2), 0.7
    a = np.full(18, 1 / 18)
    ev = dense_fields.attention_field(torch.as_tensor(x), "sinkhorn", torch.as_tensor(W), None, n_iter=n_iter,
                                      temperature=tau, tol=1e-12, symmetric=True)
    oracle = plain_sinkhorn(x @ W @ x.T / tau, a, 6001 if n_iter is None else n_iter)
    np.testing.assert_allclose(ev.velocity.numpy(), oracle @ x, rtol=0, atol=1e-10)
