"""The symmetric Sinkhorn solver of particle flows against a plain alternating loop (the oracle)."""

import numpy as np
import pytest
import torch

import sinkflow
import sinkflow.attention._symmetric_sinkhorn as symmetric
import sinkflow.fields._dense_fields as dense_fields
from sinkflow.attention._symmetric_sinkhorn import fixed_symmetric, solve_symmetric


def plain_sinkhorn(C, a, half_steps, g0=None):
    """Alternating row / column normalizations of a_j e^{C_ij} (rows to 1, columns to a), log domain,
    from the column potential ``g0`` (0 by default)."""
    from scipy.special import logsumexp

    T = C + np.log(a)[None, :]
    f, g = np.zeros(len(a)), np.zeros(len(a)) if g0 is None else np.array(g0, dtype=float)
    for k in range(half_steps):
        if k % 2 == 0:
            f = -logsumexp(T + g[None, :], axis=1)
        else:
            g = np.log(a) - logsumexp(T + f[:, None] + np.log(a)[:, None], axis=0)
    return np.exp(f[:, None] + T + g[None, :])


def scores(seed, n, scale, tau):
    x = scale * np.random.default_rng(seed).standard_normal((n, 2))
    return x @ x.T / tau


@pytest.mark.parametrize("n, numpy_entries", [(12, symmetric.NUMPY_ENTRIES),
                                               pytest.param(12, 0, marks=pytest.mark.slow),
                                               pytest.param(130, symmetric.NUMPY_ENTRIES, marks=pytest.mark.slow)])
def test_a_batch_of_symmetric_problems_reaches_the_plain_loops_fixed_point(monkeypatch, n, numpy_entries):
    # Newton's steps (n <= 96) in numpy and in torch, and heavy-ball steps alone
    monkeypatch.setattr(symmetric, "NUMPY_ENTRIES", numpy_entries)
    C = np.stack([scores(1, n, 1.0, 0.3), scores(2, n, 2.0, 1.0), scores(11, n, 1.0, 0.15)])
    a = np.random.default_rng(4).random((3, n)) + 0.2
    a /= a.sum(-1, keepdims=True)
    res = solve_symmetric(torch.as_tensor(C), torch.as_tensor(a), None, 1e-11, 200)
    assert res.converged.all() and (res.column_error <= 1e-11).all()
    for b in range(3):
        oracle = plain_sinkhorn(C[b], a[b], 6000)
        assert np.abs(a[b] @ oracle - a[b]).sum() + np.abs(oracle.sum(1) - 1).max() < 1e-12  # the oracle converged
        np.testing.assert_allclose(res.attention[b].numpy(), oracle, rtol=0, atol=1e-9)
        alone = solve_symmetric(torch.as_tensor(C[b]), torch.as_tensor(a[b]), None, 1e-11, 200)
        assert int(alone.iterations) == int(res.iterations[b])  # each system stops for itself


def test_torch_newton_steps_are_numpys(monkeypatch):
    # torch batches take Newton's step through the SPD form E + diag(s/u) (Cholesky), numpy through
    # gesv on I + K: the same iterates, so the same counts and plans, from cold and from warm starts
    problems = [(1, 0.3), (2, 1.0), (11, 0.15), (3, 0.05)]
    C = torch.as_tensor(np.stack([scores(seed, 32, 1.0, tau) for seed, tau in problems]))
    a = torch.full((4, 32), 1 / 32, dtype=torch.float64)
    warm = torch.as_tensor(np.random.default_rng(0).normal(scale=0.1, size=(4, 32)))
    default = symmetric.NUMPY_ENTRIES
    for init in (None, warm):
        by_numpy = solve_symmetric(C, a, init, 1e-11, 200)
        monkeypatch.setattr(symmetric, "NUMPY_ENTRIES", 0)
        by_torch = solve_symmetric(C, a, init, 1e-11, 200)
        monkeypatch.setattr(symmetric, "NUMPY_ENTRIES", default)
        assert by_torch.converged.all() and torch.equal(by_torch.iterations, by_numpy.iterations)
        np.testing.assert_allclose(by_torch.attention.numpy(), by_numpy.attention.numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("numpy_entries", [symmetric.NUMPY_ENTRIES, 0])  # numpy, then torch
def test_a_fixed_count_is_the_plain_loop_bit_for_rounding(monkeypatch, numpy_entries):
    monkeypatch.setattr(symmetric, "NUMPY_ENTRIES", numpy_entries)
    C, a = scores(5, 9, 1.5, 0.4), np.full(9, 1 / 9)
    for n_iter in (2, 3, 6):
        K, _ = fixed_symmetric(torch.as_tensor(C), torch.as_tensor(a), n_iter, None)
        np.testing.assert_allclose(K.numpy(), plain_sinkhorn(C, a, n_iter), rtol=0, atol=1e-14)


@pytest.mark.parametrize("numpy_entries", [symmetric.NUMPY_ENTRIES, 0])  # numpy, then torch
def test_a_fixed_count_of_particles_spread_far_is_the_plain_loop(monkeypatch, numpy_entries):
    # spread 0.5 to 30 at temperature 0.2: scores up to ~1e4, columns that every row outweighs by more than
    # the float range (the first SoftMax's column sums reach e^-850), refreshed in the log domain
    monkeypatch.setattr(symmetric, "NUMPY_ENTRIES", numpy_entries)
    rng = np.random.default_rng(3)
    C = np.stack([scores(s, 40, spread, 0.2) for s, spread in ((1, 0.5), (2, 10.0), (4, 30.0))])
    a = rng.random((3, 40)) + 0.2
    a /= a.sum(-1, keepdims=True)
    g0 = rng.standard_normal((3, 40))
    for n_iter in (1, 2, 3, 4, 7):
        for init in (None, g0):
            K, g = fixed_symmetric(torch.as_tensor(C), torch.as_tensor(a), n_iter,
                                   None if init is None else torch.as_tensor(init))
            for b in range(3):
                oracle = plain_sinkhorn(C[b], a[b], n_iter, None if init is None else init[b])
                # rounding of exponents of size |C| (1e4 here: 1e-12 relative)
                np.testing.assert_allclose(K[b].numpy(), oracle, rtol=0, atol=1e-15 * np.abs(C[b]).max() + 1e-14)
                if n_iter % 2 == 1:  # ended on a row step: the row step from g is K itself
                    again = plain_sinkhorn(C[b], a[b], 1, g[b].numpy())
                    np.testing.assert_allclose(again, oracle, rtol=0, atol=1e-15 * np.abs(C[b]).max() + 1e-14)


def test_float32_reaches_its_tolerance():
    C = torch.as_tensor(np.stack([scores(6, 40, 1.0, 0.2), scores(7, 40, 1.0, 0.5)]), dtype=torch.float32)
    res = solve_symmetric(C, torch.full((40,), 1 / 40), None, 1e-5, 200)
    assert res.attention.dtype == torch.float32 and res.converged.all()
    np.testing.assert_allclose(res.attention.double().numpy()[0],
                               plain_sinkhorn(C[0].double().numpy(), np.full(40, 1 / 40), 3000),
                               atol=2e-5)


def test_systems_the_symmetric_solver_gives_up_on_are_solved_by_the_general_one(monkeypatch):
    x0 = sinkflow.random_particles(10, 2, seed=8, manifold="sphere")
    reference = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=3, manifold="sphere", temperature=0.1)
    monkeypatch.setattr(dense_fields, "SYMMETRIC_BUDGET", 1)
    fallback = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=3, manifold="sphere", temperature=0.1,
                                 monitors=["marginal_errors"])
    assert fallback.converged and fallback.monitors["column_error"].max() < 1e-10
    np.testing.assert_allclose(fallback.positions, reference.positions, atol=1e-9)
    assert (fallback.sinkhorn_iterations > reference.sinkhorn_iterations).all()  # the general solver's half-steps


@pytest.mark.parametrize("manifold, integrator", [("sphere", "euler"), ("euclidean", "rk4")])
def test_the_flow_is_the_general_solvers_flow(monkeypatch, manifold, integrator):
    x0 = sinkflow.random_particles(20, 2, seed=9, manifold=manifold)
    kwargs = dict(h=0.05, steps=12, manifold=manifold, integrator=integrator, temperature=0.2)
    fast = {k: sinkflow.simulate(x0, "sinkhorn", n_iter=k, **kwargs) for k in (None, 3)}
    monkeypatch.setattr("sinkflow.particles._system._symmetric_psd", lambda W: False)
    general = {k: sinkflow.simulate(x0, "sinkhorn", n_iter=k, **kwargs) for k in (None, 3)}
    np.testing.assert_allclose(fast[None].positions, general[None].positions, rtol=0, atol=1e-9)  # both to 1e-10
    np.testing.assert_allclose(fast[3].positions, general[3].positions, rtol=0, atol=1e-13)
    assert fast[None].sinkhorn_iterations.sum() < general[None].sinkhorn_iterations.sum() / 10


@pytest.mark.parametrize("numpy_entries", [symmetric.NUMPY_ENTRIES, 0])
def test_systems_far_from_their_warm_start_take_heavy_ball_steps_the_others_newtons(monkeypatch, numpy_entries):
    monkeypatch.setattr(symmetric, "NUMPY_ENTRIES", numpy_entries)
    C = torch.as_tensor(np.stack([scores(s, 20, 1.0, 0.2) for s in range(4)]))
    a = torch.full((20,), 1 / 20, dtype=torch.float64)
    solved = solve_symmetric(C, a, None, 1e-11, 200)
    kick = (torch.as_tensor(np.random.default_rng(0).standard_normal((4, 20)))
            * torch.tensor([0.0, 3.0, 0.0, 3.0])[:, None])
    warm = solve_symmetric(C, a, solved.g + kick, 1e-11, 200)
    assert warm.converged.all()
    np.testing.assert_allclose(warm.attention.numpy(), solved.attention.numpy(), atol=1e-9)
    assert (warm.iterations[[1, 3]] > warm.iterations[[0, 2]]).all()
