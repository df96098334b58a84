"""Normalization placements (simulate's norm=) and the equiangular reduction, against independent oracles:
the practitioners' layers re-implemented in numpy, the closed (rho, r) systems of docs/theory/placements.md
integrated by scipy's solve_ivp, and the placements' algebraic relations (Post-LN against the sphere flow,
RMSNorm's radius against the temperature)."""

import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp
from scipy.special import softmax

import sinkflow
from sinkflow.particles._placements import PLACEMENTS

PLACED = ("post", "pre", "peri", "mix", "ngpt", "lnscale")


# ----------------------------------------------------------------------------------------------------------
# oracles


def plain_layers(x0, norm, beta, h, steps, split=0.25):
    """The practitioners' layers with SoftMax attention, Q = K = V = I, in numpy (the formulas of the page)."""
    def N(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def A(x):
        return softmax(beta * x @ x.T, axis=1) @ x

    x, switch = np.array(x0, dtype=float), int(np.floor(split * steps + 0.5))
    for layer in range(steps):
        kind = ("post" if layer < switch else "pre") if norm == "mix" else norm
        if kind == "post":
            x = N(x + h * A(x))
        elif kind == "pre":
            x = x + h * A(N(x))
        elif kind == "peri":
            x = x + h * N(A(N(x)))
        elif kind == "ngpt":
            x = N(x + h * (N(A(x)) - x))
        elif kind == "lnscale":
            x = x + h * A(N(x)) / np.sqrt(1 + layer * h)
        else:
            x = x + h * A(x)
    return x


def closed_system(norm, beta, n, attention):
    """The closed (rho, r) right-hand sides, written from the formulas (not from sinkflow's reduction)."""
    def f(t, y):
        rho, r = y
        if attention == "unnormalized":
            a, b = np.exp(beta) / n, np.exp(beta * rho) / n
        else:
            den = np.exp(beta) + (n - 1) * np.exp(beta * rho)
            a, b = np.exp(beta) / den, np.exp(beta * rho) / den
        ang = 2 * b * (1 - rho) * (1 + (n - 1) * rho)
        rad = a + (n - 1) * b * rho
        m = np.sqrt(a**2 + 2 * a * (n - 1) * b * rho + (n - 1) * b**2 * (1 + (n - 2) * rho))
        return {"post": [ang, 0.0], "ngpt": [ang / m, 0.0], "pre": [ang / r, rad],
                "peri": [ang / (r * m), rad / m],
                "lnscale": [ang / (r * np.sqrt(1 + t)), rad / np.sqrt(1 + t)]}[norm]
    return f


def directions(positions):
    """Norms and the off-diagonal inner products of the directions of each saved state."""
    X = np.asarray(positions)
    r = np.linalg.norm(X, axis=-1)
    theta = X / r[..., None]
    G = theta @ np.swapaxes(theta, -1, -2)
    n = X.shape[-2]
    return r, G[..., ~np.eye(n, dtype=bool)]


# ----------------------------------------------------------------------------------------------------------
# the layers


@pytest.mark.parametrize("norm", [*PLACED, "none"])
def test_each_euler_step_is_the_practitioners_layer(norm):
    x0 = sinkflow.random_particles(7, 3, seed=2, manifold="sphere")
    got = sinkflow.simulate(x0, "softmax", h=0.1, steps=12, temperature=0.5, norm=norm, chunked=False).final
    np.testing.assert_allclose(got, plain_layers(x0, norm, 2.0, 0.1, 12), rtol=0, atol=1e-13)


def test_ngpt_alpha_scales_its_step():
    x0 = sinkflow.random_particles(7, 3, seed=4, manifold="sphere")
    slow = sinkflow.placement("ngpt", alpha=0.5)
    for integrator in ("euler", "rk4"):
        a = sinkflow.simulate(x0, "softmax", h=0.2, steps=10, norm=slow, integrator=integrator, chunked=False)
        b = sinkflow.simulate(x0, "softmax", h=0.1, steps=10, norm="ngpt", integrator=integrator, chunked=False)
        np.testing.assert_allclose(a.positions, b.positions, rtol=0, atol=1e-14)
    flow = sinkflow.equiangular_flow(5, 0.1, norm=slow, T=2.0, h=0.02)
    np.testing.assert_allclose(flow.rho, sinkflow.equiangular_flow(5, 0.1, norm="ngpt", T=1.0, h=0.01).rho, atol=1e-14)


def test_norm_none_is_todays_flow_bit_for_bit():
    x0 = sinkflow.random_particles(9, 2, seed=0)
    for integrator in ("euler", "rk4"):
        a = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=8, integrator=integrator)
        b = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=8, integrator=integrator, norm="none")
        assert np.array_equal(a.positions, b.positions)


def test_post_ln_and_the_sphere_flow():
    """RK4: norm="post" integrates the sphere flow's ODE, step for step (identical). Euler: the layer
    N(x + h A(x)) and the projected step N(x + h P_x A(x)) agree to first order, O(h) apart at t = 1."""
    x0 = sinkflow.random_particles(8, 3, seed=1, manifold="sphere")
    kw = dict(temperature=0.5, chunked=False)
    post = sinkflow.simulate(x0, "softmax", h=0.05, steps=20, integrator="rk4", norm="post", **kw)
    sphere = sinkflow.simulate(x0, "softmax", h=0.05, steps=20, integrator="rk4", manifold="sphere", **kw)
    assert np.array_equal(post.positions, sphere.positions)
    gaps = []
    for h in (0.02, 0.01, 0.005):
        steps = round(1 / h)
        post = sinkflow.simulate(x0, "softmax", h=h, steps=steps, norm="post", **kw).final
        sphere = sinkflow.simulate(x0, "softmax", h=h, steps=steps, manifold="sphere", **kw).final
        gaps.append(np.abs(post - sphere).max())
    assert gaps[-1] > 1e-4                                      # not the same map
    np.testing.assert_allclose(np.log2(np.array(gaps[:-1]) / gaps[1:]), 1.0, atol=0.05)  # apart by O(h)


@pytest.mark.parametrize("norm", PLACED)
def test_each_layer_converges_to_its_continuous_model_at_order_one(norm):
    x0 = sinkflow.random_particles(6, 3, seed=3, manifold="sphere")
    kw = dict(temperature=0.5, norm=norm, chunked=False)
    T = 0.5
    reference = sinkflow.simulate(x0, "softmax", h=0.005, steps=100, integrator="rk4", **kw).final
    errors = [np.abs(sinkflow.simulate(x0, "softmax", h=h, steps=round(T / h), **kw).final - reference).max()
              for h in (0.025, 0.0125, 0.00625)]
    orders = np.log2(np.array(errors[:-1]) / errors[1:])
    np.testing.assert_allclose(orders, 1.0, atol=0.06)


def test_rms_norm_radius_multiplies_beta_by_d():
    """x = sqrt(d) y: RMSNorm's flow at temperature tau is sqrt(d) times the unit sphere's at tau / d
    (scores beta d <theta_i, theta_j>, values sqrt(d) longer); LayerNorm is RMSNorm on centered tokens."""
    d = 4
    y0 = sinkflow.random_particles(6, d, seed=5, manifold="sphere")
    centered = y0 - y0.mean(1, keepdims=True)
    centered /= np.linalg.norm(centered, axis=1, keepdims=True)
    for name in ("post", "pre", "peri", "ngpt", "lnscale"):
        for integrator in ("euler", "rk4"):
            unit = sinkflow.simulate(centered, "softmax", h=0.05, steps=10, temperature=2.0 / d, norm=name,
                                     integrator=integrator, chunked=False).positions
            for normalization in ("rms", "layer"):
                p = sinkflow.placement(name, normalization=normalization)
                big = sinkflow.simulate(np.sqrt(d) * centered, "softmax", h=0.05, steps=10, temperature=2.0,
                                        norm=p, integrator=integrator, chunked=False).positions
                np.testing.assert_allclose(big, np.sqrt(d) * unit, rtol=0, atol=1e-12)


def test_placements_run_as_ensembles_and_with_monitors():
    x0 = np.stack([sinkflow.random_particles(6, 3, seed=s, manifold="sphere") for s in range(3)])
    for norm in ("peri", "mix"):
        ens = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=10, norm=norm, temperature=[[0.5], [1.0]],
                                monitors=["clusters"], integrator="rk4")
        one = sinkflow.simulate(x0[2], "sinkhorn", h=0.05, steps=10, norm=norm, temperature=1.0,
                                monitors=["clusters"], integrator="rk4")
        np.testing.assert_allclose(ens.positions[:, 1, 2], one.positions, rtol=0, atol=1e-12)
        assert np.array_equal(ens.monitors["cluster_count"][:, 1, 2], one.monitors["cluster_count"])
        assert ens.norm.name == one.norm.name == norm and f"norm: {norm}" in repr(ens)


@pytest.mark.parametrize("kw", [dict(causal=True), dict(chunked=True), dict(landmarks=6)])
def test_placements_on_every_evaluation_path(kw):
    """Block-wise and exact landmarks (m = n) evaluate the same field; a causal first token attends only to
    itself, so under Pre-LN it moves straight out, x_0(t) = x_0 + t theta_0."""
    x0 = sinkflow.random_particles(6, 3, seed=0, manifold="sphere")
    for norm in ("pre", "post", "peri"):
        got = sinkflow.simulate(x0, "softmax", h=0.1, steps=5, norm=norm, **kw)
        ref = sinkflow.simulate(x0, "softmax", h=0.1, steps=5, norm=norm, chunked=False, causal=kw.get("causal", False))
        np.testing.assert_allclose(got.positions, ref.positions, rtol=0, atol=1e-14)
        if kw.get("causal") and norm == "pre":
            np.testing.assert_allclose(got.final[0], 1.5 * x0[0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("attention", ["unnormalized", "gaussian"])
def test_placements_take_every_registered_attention(attention):
    x0 = sinkflow.random_particles(5, 3, seed=0, manifold="sphere")
    for norm in PLACED:
        traj = sinkflow.simulate(x0, attention, h=0.05, steps=4, norm=norm)
        assert np.isfinite(traj.positions).all()
        if norm in ("post", "ngpt"):
            np.testing.assert_allclose(np.linalg.norm(traj.final, axis=1), 1, atol=1e-14)


def test_float32_and_gradients():
    x0 = torch.tensor(sinkflow.random_particles(5, 3, seed=0, manifold="sphere"), dtype=torch.float32,
                      requires_grad=True)
    traj = sinkflow.simulate(x0, "softmax", h=0.1, steps=3, norm="peri")
    assert traj.final.dtype == torch.float32
    traj.final.sum().backward()
    assert x0.grad is not None and torch.isfinite(x0.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_starts_are_accepted_and_kept(dtype):
    x0 = torch.tensor(sinkflow.random_particles(5, 3, seed=0, manifold="sphere"), dtype=dtype)
    traj = sinkflow.simulate(x0, "softmax", h=0.1, steps=3, norm="post")
    assert traj.final.dtype == dtype and torch.isfinite(traj.final.float()).all()


def test_refusals_name_the_argument():
    x0 = sinkflow.random_particles(5, 3, seed=0, manifold="sphere")
    with pytest.raises(ValueError, match="norm"):
        sinkflow.simulate(x0, norm="middle")
    with pytest.raises(TypeError, match="norm"):
        sinkflow.simulate(x0, norm=3)
    with pytest.raises(ValueError, match="manifold"):
        sinkflow.simulate(x0, norm="pre", manifold="sphere")
    with pytest.raises(ValueError, match="x0 must be normalized"):
        sinkflow.simulate(2 * x0, norm="post")
    with pytest.raises(ValueError, match="split"):
        sinkflow.placement("mix", split=1.5)
    with pytest.raises(ValueError, match="normalization"):
        sinkflow.placement("pre", normalization="batch")
    assert set(PLACEMENTS) == {*PLACED, "none"}


# ----------------------------------------------------------------------------------------------------------
# the equiangular reduction


def test_equiangular_start():
    x = sinkflow.equiangular_start(5, 7, -0.2)
    G = x @ x.T
    np.testing.assert_allclose(np.diag(G), 1, atol=1e-15)
    np.testing.assert_allclose(G[~np.eye(5, dtype=bool)], -0.2, atol=1e-15)
    for rho0 in (-0.25, 1.0):
        with pytest.raises(ValueError, match="rho0"):
            sinkflow.equiangular_start(5, 7, rho0)
    with pytest.raises(ValueError, match="n <= d"):
        sinkflow.equiangular_start(5, 4, 0.1)


def test_sinkhorn_is_softmax_on_equiangular_starts():
    x = torch.tensor(sinkflow.equiangular_start(6, 6, 0.3) * np.array([1.7]))
    soft = sinkflow.particles.attention_field(x, "softmax", None, None, temperature=0.25).velocity
    sink = sinkflow.particles.attention_field(x, "sinkhorn", None, None, temperature=0.25).velocity
    assert (sink - soft).abs().max() < 1e-14


EQUIANGULAR_CASES = [  # (attention, beta, rho0, T, norm): the default run; the slow run adds the whole grid
    *[("softmax", 4.0, 0.1, 8.0, norm) for norm in ("post", "pre", "peri")],
    *[("sinkhorn", 2.0, -0.15, 2.0, norm) for norm in ("pre", "peri")],
    *[("softmax", 1.0, 0.6, 2.0, norm) for norm in ("ngpt", "lnscale", "mix", "none")],
    *[pytest.param(attention, beta, rho0, 8.0, norm, marks=pytest.mark.slow)
      for attention, beta, rho0 in (("softmax", 4.0, 0.1), ("sinkhorn", 2.0, -0.15), ("softmax", 1.0, 0.6))
      for norm in ("post", "pre", "peri", "ngpt", "lnscale", "mix")
      if not (attention == "softmax" and beta == 4.0 and norm in ("post", "pre", "peri"))],
]


@pytest.mark.parametrize("attention, beta, rho0, T, norm", EQUIANGULAR_CASES)
def test_equiangular_particles_follow_the_reduced_flow(attention, beta, rho0, T, norm):
    """float64, RK4, h = 0.01, T = 8: particles and the reduced RK4 within 1e-12, the Gram entries' spread
    below 1e-12; the reduced RK4 within C h^4 of solve_ivp on the closed system (C measured: at most 0.021
    for SoftMax and Sinkhorn at beta <= 4, T <= 8; asserted with C = 0.05)."""
    n, h = 6, 0.01
    x0 = sinkflow.equiangular_start(n, n, rho0)
    traj = sinkflow.simulate(x0, attention, h=h, steps=round(T / h), integrator="rk4", temperature=1 / beta,
                             norm=norm, chunked=False, save_every=20)
    flow = sinkflow.equiangular_flow(n, rho0, beta=beta, attention=attention, norm=norm, T=T, h=h)
    r, off = directions(traj.positions)
    assert np.ptp(off, axis=1).max() < 1e-12 and np.ptp(r, axis=1).max() < 1e-12
    assert np.abs(off - flow.rho[::20, None]).max() < 1e-12
    assert np.abs(r - flow.r[::20, None]).max() < 1e-12
    if norm in ("mix", "none"):
        return  # a switch of systems (the closed systems above hold on each side); R^d: beta r^2 in a, b
    sol = solve_ivp(closed_system(norm, beta, n, attention), (0, T), [rho0, 1.0], method="DOP853", rtol=1e-13,
                    atol=1e-15, dense_output=True)
    rho, radius = sol.sol(flow.times)
    assert max(np.abs(flow.rho - rho).max(), np.abs(flow.r - radius).max()) < 0.05 * h**4


@pytest.mark.parametrize("norm", ["post", "pre", "peri", "ngpt", "lnscale"])
def test_reduced_rk4_has_order_four_unnormalized(norm):
    """Unnormalized attention: b = e^(beta rho)/n, the stiff case (h = 0.01 <= 0.1 e^-beta at beta = 1)."""
    n, beta, T = 5, 1.0, 2.0
    sol = solve_ivp(closed_system(norm, beta, n, "unnormalized"), (0, T), [0.2, 1.0], method="DOP853",
                    rtol=1e-13, atol=1e-15, dense_output=True)
    errors = []
    for h in (0.02, 0.01):
        flow = sinkflow.equiangular_flow(n, 0.2, beta=beta, attention="unnormalized", norm=norm, T=T, h=h)
        errors.append(np.abs(np.stack([flow.rho, flow.r]) - sol.sol(flow.times)).max())
    assert errors[1] < 0.2 * 0.01**4
    np.testing.assert_allclose(np.log2(errors[0] / errors[1]), 4.0, atol=0.2)


def test_equiangular_rates():
    """Post-LN and nGPT: 1 - rho ~ C e^(-2t); Pre-LN and Peri-LN: C t^(-2); LN-scaling: C t^(-1) (its local
    exponent approaches -1 like t^(-1/2): r = 2 sqrt(1 + t) + O(1)); Peri-LN ahead of Pre-LN early
    (rho(1) = 0.284 against 0.178 at n = 6, beta = 2, rho0 = 0)."""
    kw = dict(beta=2.0, h=0.05)
    for norm in ("post", "ngpt"):
        f = sinkflow.equiangular_flow(6, 0.0, norm=norm, T=10.0, **kw)
        slope = np.log((1 - f.rho[-1]) / (1 - f.rho[-21])) / (f.times[-1] - f.times[-21])
        np.testing.assert_allclose(slope, -2.0, atol=1e-3)
    for norm, power, tol in (("pre", -2, 0.01), ("peri", -2, 0.01), ("lnscale", -1, 0.05)):
        f = sinkflow.equiangular_flow(6, 0.0, norm=norm, T=4000.0, h=1.0, integrator="rk4", beta=2.0)
        k = len(f.times) // 2
        slope = np.log((1 - f.rho[-1]) / (1 - f.rho[k])) / np.log(f.times[-1] / f.times[k])
        np.testing.assert_allclose(slope, power, atol=tol)
    peri = sinkflow.equiangular_flow(6, 0.0, beta=2.0, norm="peri", T=1.0)
    pre = sinkflow.equiangular_flow(6, 0.0, beta=2.0, norm="pre", T=1.0)
    assert abs(peri.rho[-1] - 0.284) < 5e-4 and abs(pre.rho[-1] - 0.178) < 5e-4


def test_equiangular_flow_refusals_and_summary():
    with pytest.raises(ValueError, match="rho0"):
        sinkflow.equiangular_flow(4, -1 / 3)
    with pytest.raises(ValueError, match="attention"):
        sinkflow.equiangular_flow(4, 0.1, attention="gaussian")
    with pytest.raises(ValueError, match="normalization"):
        sinkflow.equiangular_flow(4, 0.1, norm=sinkflow.placement("pre", normalization="rms"))
    assert len(repr(sinkflow.equiangular_flow(4, 0.1, T=0.1)).splitlines()) <= 6
