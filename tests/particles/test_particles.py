"""A residual attention layer is an Euler step of a particle flow (docs/theory/gradient_flows.md and
docs/theory/sphere.md)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sinkflow
from sinkflow.fields._blockwise_fields import lazy_attention_field
from sinkflow.fields._dense_fields import attention_field
from sinkflow.particles._energies import energy_inf


def spd(d, rng, scale=0.5):
    A = rng.normal(size=(d, d))
    return scale * (A @ A.T) / d + 0.1 * np.eye(d)


# ---------------------------------------------------------------------------------------
# energy along the flow


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10_000), st.integers(4, 20))
def test_energy_inf_never_increases_along_small_euler_steps(seed, n):
    rng = np.random.default_rng(seed)
    W = spd(2, rng)
    traj = sinkflow.simulate(rng.normal(size=(n, 2)), "sinkhorn", W_K=W, W_V=W, h=1e-3, steps=5, monitors=["energy"])
    F = traj.monitors["energy"]
    # dF = -h int|T|^2 + O(h^2); the only slack allowed is the energy's own accuracy (tol 1e-12)
    assert np.all(np.diff(F) <= 1e-11)


def test_energy_decrease_rate_is_minus_int_T_squared_to_first_order():
    rng = np.random.default_rng(11)
    x0 = rng.normal(size=(20, 2))
    W = spd(2, rng)
    T = attention_field(torch.tensor(x0), "sinkhorn", torch.tensor(W), torch.tensor(W), tol=1e-13).velocity.numpy()
    rate = -np.mean(np.sum(T * T, 1))  # dF/dt = -int |T|^2 dmu
    F0 = energy_inf(x0, W, tol=1e-14)
    hs = np.array([4e-3, 2e-3, 1e-3])
    gaps = [abs((energy_inf(x0 + h * T, W, tol=1e-14) - F0) / h / rate - 1) for h in hs]
    slope = np.polyfit(np.log(hs), np.log(gaps), 1)[0]
    assert 0.9 < slope < 1.1  # relative error of the first-order prediction is O(h)
    assert gaps[-1] < 1e-2


def test_euler_converges_to_rk4_at_order_one():
    rng = np.random.default_rng(12)
    x0 = rng.normal(size=(12, 2))
    W = spd(2, rng)
    t_end = 0.4
    ref = sinkflow.simulate(x0, "sinkhorn", W_K=W, W_V=W, h=0.01, steps=40, integrator="rk4").final
    hs = np.array([0.04, 0.02, 0.01])
    errs = [np.abs(sinkflow.simulate(x0, "sinkhorn", W_K=W, W_V=W, h=h, steps=round(t_end / h)).final - ref).max()
            for h in hs]
    slope = np.polyfit(np.log(hs), np.log(errs), 1)[0]
    assert 0.85 < slope < 1.15  # Euler is first order; RK4's own error (~h^4 = 1e-8) is negligible


def test_rk4_is_fourth_order():
    rng = np.random.default_rng(13)
    x0 = rng.normal(size=(8, 2))
    ref = sinkflow.simulate(x0, "softmax", h=0.0125, steps=32, integrator="rk4").final
    errs = [np.abs(sinkflow.simulate(x0, "softmax", h=h, steps=round(0.4 / h), integrator="rk4").final - ref).max()
            for h in (0.1, 0.05)]
    assert 3.5 < np.log2(errs[0] / errs[1]) < 4.5  # ratio 2^4 between consecutive halvings


# ---------------------------------------------------------------------------------------
# sphere


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn", "unnormalized"])
@pytest.mark.parametrize("integrator", ["euler", "rk4"])
def test_sphere_trajectories_stay_on_the_sphere(attention, integrator):
    x0 = sinkflow.random_particles(16, 3, seed=1, manifold="sphere")
    traj = sinkflow.simulate(x0, attention, h=0.2, steps=20, manifold="sphere", temperature=0.5, integrator=integrator)
    assert np.abs(np.linalg.norm(traj.positions, axis=2) - 1).max() < 1e-12  # renormalized every step


def test_unnormalized_flow_on_sphere_increases_E_beta_and_clusters():
    # Q = K = V = I, Z_i = n: projected gradient ascent of E_beta (Geshkovski et al.)
    x0 = sinkflow.random_particles(24, 3, seed=2, manifold="sphere")
    traj = sinkflow.simulate(x0, "unnormalized", h=0.1, steps=200, manifold="sphere", monitors=["energy", "clusters"])
    assert np.all(np.diff(traj.monitors["energy"]) > -1e-12)
    assert traj.monitors["cluster_fraction"][-1] > traj.monitors["cluster_fraction"][0]
    assert traj.monitors["cluster_count"][-1] < 24


def test_off_sphere_start_is_rejected():
    with pytest.raises(ValueError, match="unit sphere"):
        sinkflow.simulate(np.ones((3, 2)), manifold="sphere", steps=1)


# ---------------------------------------------------------------------------------------
# measures, weights, types, reproducibility


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn", "unnormalized", "gaussian"])
def test_weights_are_a_measure_two_coincident_particles_equal_one_of_double_weight(attention):
    rng = np.random.default_rng(14)
    x = 0.5 * rng.normal(size=(6, 2))  # moderate scores: K^0 stays bounded, Sinkhorn converges fast
    dup = np.vstack([x, x[:1]])
    heavy = np.full(6, 1 / 7)
    heavy[0] = 2 / 7
    t_dup = sinkflow.simulate(dup, attention, h=0.05, steps=10, temperature=2.0)
    t_w = sinkflow.simulate(x, attention, h=0.05, steps=10, weights=heavy, temperature=2.0)
    # the field only sees the measure: same dynamics, to the Sinkhorn tolerance 1e-10
    np.testing.assert_allclose(t_w.positions, t_dup.positions[:, :6], atol=1e-8)
    np.testing.assert_array_equal(t_w.weights, heavy)  # weights move with the particles, unchanged
    assert t_w.weights.sum() == pytest.approx(1, abs=1e-15)


def test_seeds_make_runs_reproducible():
    a = sinkflow.simulate(sinkflow.random_particles(10, 2, seed=5), "sinkhorn", steps=5, n_iter=3)
    b = sinkflow.simulate(sinkflow.random_particles(10, 2, seed=5), "sinkhorn", steps=5, n_iter=3)
    c = sinkflow.simulate(sinkflow.random_particles(10, 2, seed=6), "sinkhorn", steps=5, n_iter=3)
    np.testing.assert_array_equal(a.positions, b.positions)
    assert not np.allclose(a.positions, c.positions)


def test_numpy_in_numpy_out_float64_and_torch_keeps_dtype():
    x = sinkflow.random_particles(5, 2, seed=0)
    traj = sinkflow.simulate(x, steps=2)
    assert isinstance(traj.positions, np.ndarray) and traj.positions.dtype == np.float64
    assert traj.positions.shape == (3, 5, 2) and np.array_equal(traj.times, [0, 0.1, 0.2])
    t = sinkflow.simulate(torch.tensor(x, dtype=torch.float32), steps=2, n_iter=4)
    assert isinstance(t.positions, torch.Tensor) and t.positions.dtype == torch.float32
    np.testing.assert_allclose(t.positions.numpy(), sinkflow.simulate(x, steps=2, n_iter=4).positions, atol=1e-5)


def test_one_sinkhorn_half_iteration_is_softmax():
    x = sinkflow.random_particles(9, 2, seed=3)
    np.testing.assert_array_equal(sinkflow.simulate(x, "sinkhorn", n_iter=1, steps=4).positions,
                                  sinkflow.simulate(x, "softmax", steps=4).positions)


def test_warm_start_reaches_the_same_flow_with_fewer_iterations():
    x = sinkflow.random_particles(15, 2, seed=4)
    # a non-symmetric W_K: symmetric scores start cold from the symmetric guess, as cheap as a warm
    # start there (914 against 935 half-iterations over these steps with W_K = I)
    W_K = np.array([[1.0, 0.3], [-0.2, 0.8]])
    warm = sinkflow.simulate(x, "sinkhorn", W_K=W_K, steps=10, h=0.05, warm_start=True)
    cold = sinkflow.simulate(x, "sinkhorn", W_K=W_K, steps=10, h=0.05, warm_start=False)
    np.testing.assert_allclose(warm.positions, cold.positions, atol=1e-9)  # both solved to 1e-10
    assert warm.sinkhorn_iterations[1:].sum() < cold.sinkhorn_iterations[1:].sum()
    assert warm.converged and cold.converged


def test_marginal_error_monitor_separates_softmax_from_sinkhorn():
    x = sinkflow.random_particles(20, 2, seed=5)
    sk = sinkflow.simulate(x, "sinkhorn", steps=3, monitors=["marginal_errors"]).monitors
    sm = sinkflow.simulate(x, "softmax", steps=3, monitors=["marginal_errors"]).monitors
    assert sk["column_error"].max() < 1e-9 and sm["row_error"].max() < 1e-12
    assert sm["column_error"].min() > 1e-2  # SoftMax of random points is far from doubly stochastic


def test_monitor_and_save_every():
    traj = sinkflow.simulate(sinkflow.random_particles(6, 2), steps=10, save_every=4, monitor_every=5,
                             monitors=["energy_0"])
    assert np.allclose(traj.times, [0, 0.4, 0.8, 1.0]) and np.allclose(traj.monitor_times, [0, 0.5, 1.0])


@pytest.mark.parametrize("steps, save_every", [(10, 4), (8, 4), (3, 10)])
def test_kept_positions_are_those_of_every_step_at_the_kept_times(steps, save_every):
    """Every ``save_every``-th position and the last one (also when ``steps`` is no multiple)."""
    x0 = sinkflow.random_particles(6, 2, seed=1)
    every = sinkflow.simulate(x0, "softmax", h=0.1, steps=steps)
    kept = sinkflow.simulate(x0, "softmax", h=0.1, steps=steps, save_every=save_every)
    at = [*range(0, steps + 1, save_every), *([steps] if steps % save_every else [])]
    np.testing.assert_allclose(kept.times, every.times[at])
    assert np.array_equal(np.asarray(kept.positions), np.asarray(every.positions)[at])


# ---------------------------------------------------------------------------------------
# block-wise evaluation (never n x n)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 1000), st.sampled_from([1, 2, 5, None]), st.integers(3, 40), st.booleans())
def test_lazy_sinkhorn_equals_dense_sinkhorn(seed, n_iter, block_rows, weighted):
    rng = np.random.default_rng(seed)
    n = 30
    x = rng.normal(size=(n, 2))
    W = spd(2, rng)
    w = rng.random(n) + 0.1 if weighted else np.ones(n)
    w /= w.sum()
    g0 = rng.normal(size=n)
    lazy = lazy_attention_field(x, x @ W, W, n_iter=n_iter, weights=w, init_g=g0, tol=1e-12, max_iter=20000,
                                block_bytes=block_rows * 3 * n * 8)
    assert lazy.converged  # the plain alternation needs up to a few thousand half-steps here (seed 187: 3,563)
    dense = sinkflow.solve_sinkhorn(x @ W @ x.T + np.log(w), n_iter, tol=1e-12, a=w, b=w, init_g=g0)
    # same half-iteration convention; to tol 1e-12 when run to convergence
    np.testing.assert_allclose(lazy.velocity, dense.attention @ (x @ W), atol=1e-10)


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn", "unnormalized", "gaussian"])
def test_chunked_simulation_matches_dense(attention):
    x = sinkflow.random_particles(25, 2, seed=6, scale=0.5)  # K^0 = e^{C} blows up in finite time from larger x
    kw = dict(h=0.05, steps=5, temperature=2.0, n_iter=5 if attention == "sinkhorn" else None,
              monitors=["marginal_errors"])
    dense = sinkflow.simulate(x, attention, **kw)
    lazy = sinkflow.simulate(x, attention, chunked=True, **kw)
    assert lazy.chunked and not dense.chunked
    np.testing.assert_allclose(lazy.positions, dense.positions, atol=1e-12)
    for key in ("row_error", "column_error"):
        np.testing.assert_allclose(lazy.monitors[key], dense.monitors[key], atol=1e-12)


# ---------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("kwargs, match", [
    (dict(h=0.0), "h must be"),
    (dict(h=-0.1), "h must be"),
    (dict(h=float("nan")), "h must be"),
    (dict(steps=-1), "steps"),
    (dict(weights=np.ones(3) / 3), "shape"),
    (dict(weights=np.ones(4)), "sum to 1"),
    (dict(weights=np.array([1.0, 0.0, 0.0, 0.0])), "positive"),
    (dict(W_Q=np.eye(3)), "W_Q must have shape"),
    (dict(W_V=np.ones((2, 3))), "W_V must have shape"),
    (dict(attention="linear"), "attention must be one of"),
    (dict(integrator="rk45"), "integrator"),
    (dict(manifold="torus"), "manifold"),
    (dict(monitors=["entropy"]), "monitor"),
    (dict(n_iter=0), "n_iter"),
    (dict(temperature=0.0), "temperature"),
    (dict(monitor_every=0), "monitor_every"),
])
def test_bad_simulation_inputs_say_what_is_wrong(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sinkflow.simulate(np.zeros((4, 2)), **kwargs)


def test_non_finite_or_misshaped_start_is_rejected():
    x = np.zeros((4, 2))
    x[1, 0] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        sinkflow.simulate(x)
    with pytest.raises(ValueError, match="shape"):
        sinkflow.simulate(np.zeros(4))
    with pytest.raises(TypeError, match="floating"):
        sinkflow.simulate(np.zeros((4, 2), dtype=int))


def test_dense_monitors_refuse_huge_n_before_running():
    with pytest.raises(ValueError, match="n x n"):
        sinkflow.simulate(np.zeros((9000, 2)), steps=1, monitors=["energy"])


def test_blow_up_is_reported_not_hidden():
    with pytest.raises(FloatingPointError, match="floating-point range"):
        sinkflow.simulate(10 * np.ones((3, 2)) + np.eye(3, 2), "unnormalized", h=1.0, steps=50)


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn", "unnormalized", "gaussian"])
def test_every_kind_records_a_finite_energy(attention):
    traj = sinkflow.simulate(sinkflow.random_particles(8, 2, seed=7, scale=0.5), attention, h=0.05, steps=3,
                             monitors=["energy", "energy_0", "energy_inf"])
    assert all(np.isfinite(v).all() and v.shape == (4,) for v in traj.monitors.values())


# ---------------------------------------------------------------------------------------
# paths a user takes: gradients, float32, string monitors, step-size guard


@pytest.mark.parametrize("n_iter", [None, 4])
def test_gradient_of_a_final_loss_matches_finite_differences(n_iter):
    rng = np.random.default_rng(21)
    x0 = torch.tensor(rng.normal(size=(6, 2)), requires_grad=True)
    Wv = torch.tensor(spd(2, rng), requires_grad=True)

    def loss(x, wv):
        traj = sinkflow.simulate(x, "sinkhorn", W_V=wv, h=0.05, steps=4, n_iter=n_iter, tol=1e-13)
        return (traj.final ** 2).sum()

    value = loss(x0, Wv)
    gx, gw = torch.autograd.grad(value, (x0, Wv))
    step = 1e-6
    for param, grad, other in ((x0, gx, Wv), (Wv, gw, x0)):
        E = torch.zeros_like(param)
        for idx in [(0, 0), (1, 1), (0, 1)]:
            E.zero_()
            E[idx] = step
            with torch.no_grad():
                args = (param + E, other) if param is x0 else (other, param + E)
                plus = loss(*args)
                args = (param - E, other) if param is x0 else (other, param - E)
                minus = loss(*args)
            fd = float((plus - minus) / (2 * step))
            assert abs(fd - float(grad[idx])) < 1e-6 * max(1.0, abs(fd))


def test_float32_particles_do_not_spin_to_max_iter():
    x = torch.tensor(sinkflow.random_particles(64, 2, seed=3), dtype=torch.float32)
    traj = sinkflow.simulate(x, "sinkhorn", h=0.05, steps=5, max_iter=2000)
    assert traj.converged and traj.sinkhorn_iterations.max() < 2000
    assert traj.positions.dtype == torch.float32
    with pytest.warns(RuntimeWarning, match="below what torch.float32"):
        sinkflow.simulate(x, "sinkhorn", h=0.05, steps=1, tol=1e-12)


def test_a_single_monitor_name_is_accepted():
    x0 = sinkflow.random_particles(8, 2, seed=0)
    one = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=3, monitors="energy").monitors
    listed = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=3, monitors=["energy"]).monitors
    np.testing.assert_array_equal(one["energy"], listed["energy"])


def test_step_beyond_the_lipschitz_scale_warns_with_the_safe_value():
    from sinkflow.particles._step_size import lipschitz_scale

    x0 = sinkflow.random_particles(20, 2, seed=0, scale=2.0)
    L = lipschitz_scale(torch.tensor(x0), None, None, 1.0)
    assert L == pytest.approx(1 + 2 * np.mean(np.sum(x0 ** 2, 1)))  # plain re-computation of the estimate
    with pytest.warns(RuntimeWarning, match=rf"largest safe step h = {2 / L:.3g} of attention='softmax' \(euler\)"):
        sinkflow.simulate(x0, "softmax", h=3.0 / L, steps=1)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sinkflow.simulate(x0, "softmax", h=1.0 / L, steps=1)


@pytest.mark.parametrize("integrator, factor", [("euler", 2.0), ("rk4", 2.78)])
def test_largest_safe_step_is_the_number_the_warning_quotes(integrator, factor):
    # issue 19: one function computes the limit; the warning quotes it and names the attention
    import re
    import warnings

    from sinkflow.particles._step_size import largest_safe_step

    x0 = sinkflow.random_particles(16, 3, seed=1, manifold="sphere")
    tau = 1 / 9
    safe = largest_safe_step(x0, "softmax", temperature=tau, integrator=integrator)
    assert safe == pytest.approx(factor / (1 + 2 * 9), rel=1e-12)  # on the sphere R = 1, W = W_V = I
    with pytest.warns(RuntimeWarning, match=re.escape(f"largest safe step h = {safe:.3g} of attention='softmax'")):
        sinkflow.simulate(x0, "softmax", h=1.2 * safe, steps=1, manifold="sphere", temperature=tau,
                          integrator=integrator)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        sinkflow.simulate(x0, "softmax", h=0.99 * safe, steps=1, manifold="sphere", temperature=tau,
                          integrator=integrator)
    assert largest_safe_step(x0, "unnormalized") == np.inf


def test_lazy_sinkhorn_out_of_budget_is_not_converged():
    """Run to tol with too few half-steps: the budget ends on a column step (column error ~0), and the
    field must still say it did not converge (it said True before)."""
    rng = np.random.default_rng(187)
    x = rng.normal(size=(30, 2))
    W = spd(2, rng)
    lazy = lazy_attention_field(x, x @ W, W, tol=1e-12, max_iter=2000, init_g=rng.normal(size=30))
    assert lazy.n_iter == 2000 and not lazy.converged and lazy.row_error > 1e-12


def test_saved_positions_carry_the_graph_of_a_value_matrix_the_start_does_not_have():
    """The start has no graph, the later positions do (through W_V): the gradient of a loss on two
    saved positions equals central finite differences."""
    x = torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def loss(W):
        P = torch.as_tensor(sinkflow.simulate(x, "softmax", h=0.1, steps=5, W_V=W).positions)
        return (P[-1] ** 2).sum() + (P[2] ** 3).sum()

    W = torch.eye(2, dtype=torch.float64, requires_grad=True)
    loss(W).backward()
    eps, fd = 1e-6, torch.zeros(2, 2, dtype=torch.float64)
    for i in range(2):
        for j in range(2):
            E = torch.zeros(2, 2, dtype=torch.float64)
            E[i, j] = eps
            eye = torch.eye(2, dtype=torch.float64)
            fd[i, j] = (loss(eye + E) - loss(eye - E)) / (2 * eps)
    torch.testing.assert_close(W.grad, fd, rtol=1e-7, atol=1e-7)
