"""Heat-diffusion limit (docs/theory/heat_limit.md): references, rescaled flows, distances, sympy oracles."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import solve_ivp

import sinkflow
from sinkflow.heat import symbolic
from sinkflow.heat._heat_velocity import NORMALIZATIONS
from sinkflow.heat._limits import barycentric_map, heat_reference
from sinkflow.heat._references import Barenblatt, GaussianMixture, solve_heat_grid
from sinkflow.heat._rescaled_flow import heat_flow, heat_trajectory


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # docs/performance.md: two OpenMP threads on a loaded 2-vCPU machine make small torch ops 10-150x slower.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


MIX_1D = GaussianMixture.isotropic([0.3, 0.7], [[-1.5], [1.0]], [0.2, 0.5])
MIX_2D = GaussianMixture([0.4, 0.6], [[-1.0, 0.0], [1.0, 0.5]], [[[0.3, 0.1], [0.1, 0.4]], [[0.5, 0.0], [0.0, 0.2]]])
STD_1D = GaussianMixture.gaussian([0.0], [[1.0]])


def mean_field_variance(S0: float, eps: float, t: float) -> float:
    """Variance at time t of the mean-field Sinkhorn flow of a 1D Gaussian
    (symbolic.sinkhorn_variance_rate_gaussian)."""
    def rate(_, S):
        return 8 * S / (2 * S + eps + np.sqrt(eps ** 2 + 4 * S ** 2))
    return float(solve_ivp(rate, [0, t], [S0], rtol=1e-10, atol=1e-12).y[0, -1])


# ---------------------------------------------------------------------------------------
# reference solutions


def test_mixture_evolves_by_adding_2tI_and_stays_normalized():
    g = MIX_1D.evolve(0.7)
    np.testing.assert_allclose(g.covs, MIX_1D.covs + 1.4, rtol=0, atol=1e-15)
    x = np.linspace(-20, 20, 8001)
    # trapezoid rule on a smooth, 20-sigma-covered density: error far below 1e-10
    assert abs(np.trapezoid(g.pdf(x), x) - 1) < 1e-10
    # heat flow: the covariance of any density grows by exactly 2t I
    np.testing.assert_allclose(g.covariance(), MIX_1D.covariance() + 1.4, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(st.floats(-3, 3), st.floats(0.05, 2.0), st.floats(0.0, 1.0))
def test_mixture_score_is_gradient_of_log_density(x, var, w):
    g = GaussianMixture.isotropic([w, 1 - w] if 0 < w < 1 else [1.0, 0.0], [[-1.0], [0.5]], [var, 0.3])
    h = 1e-5
    fd = (g.log_pdf(np.array([x + h])) - g.log_pdf(np.array([x - h]))) / (2 * h)
    # central differences: O(h^2 * third derivative) ~ 1e-8 relative on these scales
    assert abs(g.score(np.array([x]))[0] - fd[0]) < 1e-5 * (1 + abs(fd[0]))


def test_mixture_samples_have_the_mixture_moments():
    x = MIX_2D.sample(40000, seed=3)
    # 40000 samples: standard errors ~ 0.005 on means and covariances of size ~1
    np.testing.assert_allclose(x.mean(0), MIX_2D.mean(), atol=0.025)
    np.testing.assert_allclose(np.cov(x.T), MIX_2D.covariance(), atol=0.03)


def test_grid_solver_matches_closed_form_1d_and_2d():
    x = np.linspace(-10, 10, 801)
    sol = solve_heat_grid(MIX_1D.pdf, [x], [0.0, 0.05, 0.5, 2.0])
    for k, t in enumerate(sol.times):
        assert np.abs(sol.density[k] - MIX_1D.evolve(t).pdf(x)).max() < 1e-6
    assert sol.error_bound < 1e-10
    ax = np.linspace(-8, 8, 129)
    sol2 = solve_heat_grid(MIX_2D.pdf, [ax, ax], [0.1, 1.0])
    pts = sol2.mesh().reshape(-1, 2)
    for k, t in enumerate(sol2.times):
        assert np.abs(sol2.density[k].ravel() - MIX_2D.evolve(t).pdf(pts)).max() < 1e-6
    assert sol2.error_bound < 1e-8


def test_grid_solver_reports_unresolved_and_truncated_data():
    x = np.linspace(-2, 2, 41)  # truncates N(0, 1) at 2 sigma and under-resolves N(0, 1e-3)
    assert solve_heat_grid(STD_1D.pdf, [x], 0.1).boundary_mass > 1e-3
    narrow = GaussianMixture.gaussian([0.0], [[1e-3]])
    assert solve_heat_grid(narrow.pdf, [x], 0.1).spectral_tail > 1e-3


def test_barenblatt_mass_moments_and_porous_medium_equation():
    for d in (1, 2):
        b = Barenblatt(dim=d, time=0.7)
        sym = symbolic.barenblatt_solves_porous_medium(d)
        assert math.isclose(b.k, float(sym.details["k"]), rel_tol=1e-15)
        assert math.isclose(b.alpha, float(sym.details["alpha"]), rel_tol=1e-15)
        # mass formula of the symbolic derivation, evaluated at our height constant
        assert math.isclose(float(sym.details["mass"].subs(sym.details["A"], b.A)), 1.0, rel_tol=1e-12)
    b = Barenblatt(dim=1, time=0.7)
    r = np.linspace(-3, 3, 60001)
    assert abs(np.trapezoid(b.pdf(r), r) - 1) < 1e-6  # kinks at the edge: trapezoid error O(h^2)
    assert abs(np.trapezoid(r ** 2 * b.pdf(r), r) - b.covariance()[0, 0]) < 1e-6
    # finite-difference residual of d_t rho = d_x (rho d_x rho) inside the support
    x = np.linspace(-0.8, 0.8, 9) * b.radius
    h, dt = 1e-4, 1e-6
    rho_t = (b.evolve(dt).pdf(x) - Barenblatt(1, b.time - dt).pdf(x)) / (2 * dt)
    flux = lambda z: b.pdf(z) * (b.pdf(z + h) - b.pdf(z - h)) / (2 * h)  # noqa: E731
    div = (flux(x + h) - flux(x - h)) / (2 * h)
    np.testing.assert_allclose(rho_t, div, atol=1e-5)


# ---------------------------------------------------------------------------------------
# sympy oracles


@pytest.mark.slow  # several seconds: with the slow tests (the README's command stays under 5 minutes)
def test_symbolic_identities_are_exact():
    for d in (1, 2):
        assert symbolic.heat_kernel_solves_heat(d).holds
        assert symbolic.barenblatt_solves_porous_medium(d).holds
    sk = symbolic.sinkhorn_barycentric_map_gaussian()
    assert sk.holds and sk.residual == 0
    x, s, eps = symbolic.X, symbolic.s, symbolic.eps
    # the first-order correction of (B - x)/(eps/2): eps x / (4 s^2)
    assert (sk.details["first_order"] - x / (4 * s ** 2)).simplify() == 0
    sm = symbolic.softmax_barycentric_map_gaussian()
    assert sm.holds and (sm.details["B"] - s * x / (s + eps)).simplify() == 0
    rate = symbolic.sinkhorn_variance_rate_gaussian()
    assert rate.holds and (rate.details["series"] - (2 - eps / (2 * s))).simplify() == 0
    assert "varepsilon" in sk.latex()


# ---------------------------------------------------------------------------------------
# rescaled flows


def test_sinkhorn_flow_covariance_grows_by_2t():
    # Gaussian start, moderate eps and n. The tolerance 5% covers: the O(eps) bias of the
    # mean-field flow (relative eps/(4 S) in the rate: ~1.5% here), the Euler error O(dt)
    # and particle fluctuations of the increment (~1% at n = 600). S0 is the initial
    # sample's covariance, which removes the O(n^-1/2) sampling error of S0 itself.
    x0 = MIX_2D.sample(600, seed=0)
    t = 0.4
    x = heat_flow(x0, t, eps=0.1, dt=0.02)
    target = np.cov(x0.T, bias=True) + 2 * t * np.eye(2)
    rel = np.linalg.norm(np.cov(x.T, bias=True) - target) / np.linalg.norm(target)
    assert rel < 0.05
    # Sinkhorn conserves the mean: |mean velocity| <= (2/eps) max|x| * (column L1 error <= tol),
    # tol = eps^2/100 by default, so the drift over time t is below t (2/eps) max|x| eps^2/100
    drift_bound = t * (2 / 0.1) * np.abs(x).max() * 0.1 ** 2 / 100
    assert np.abs(x.mean(0) - x0.mean(0)).max() < drift_bound


def test_sinkhorn_flow_error_is_first_order_in_eps_and_matches_mean_field():
    x0 = STD_1D.sample(800, seed=1)
    S0, t = x0.var(), 0.5
    err = {}
    for eps in (0.2, 0.05):
        v = heat_flow(x0, t, eps=eps, dt=eps / 8).var()
        err[eps] = abs(v - (S0 + 2 * t)) / (S0 + 2 * t)
        # the particles follow the exact mean-field ODE of the variance far more closely
        # than they follow heat: the O(eps) bias is understood, not noise
        assert abs(v - mean_field_variance(S0, eps, t)) / (S0 + 2 * t) < 0.3 * err[eps]
    # first order: dividing eps by 4 divides the bias by ~4 (>= 2.5 allows for fluctuations)
    assert err[0.05] < err[0.2] / 2.5


@pytest.mark.parametrize("eps", [0.1, 0.05])
def test_softmax_dot_drives_the_cloud_to_size_sqrt_eps_not_to_heat(eps):
    # Mean field for a centred Gaussian of variance S: SoftMax with scores x y / eps tilts it
    # to mean x S / eps, so v(x) = (2/eps)(1 - S/eps) x and dS/dt = (4/eps) S (1 - S/eps):
    # a logistic law with the fixed point S = eps (cloud size sqrt(eps)), reached on the
    # time scale eps/4, whatever the initial spread. Starting at S0 = eps/4 keeps the tilt
    # inside the sample (measured deviation from the law below 1% at n = 300, 600).
    x0 = STD_1D.sample(300, seed=2)
    x0 = (x0 - x0.mean()) / x0.std() * math.sqrt(eps / 4)
    S0 = x0.var()
    times = eps * np.array([0.25, 0.5, 1.0])
    res = heat_trajectory(x0, times, eps, eps / 100, "softmax_dot")
    for t, x in zip(times, res.positions, strict=True):
        logistic = eps / (1 + (eps / S0 - 1) * math.exp(-4 * t / eps))
        assert x.var() == pytest.approx(logistic, rel=0.03)
    assert res.positions[-1].var() == pytest.approx(eps, rel=0.1)  # at the fixed point S = eps
    # ... while heat would have spread it to S0 + 2t: no heat limit.
    assert abs(res.positions[-1].var() - (S0 + 2 * times[-1])) / (S0 + 2 * times[-1]) > 0.3


def test_softmax_gaussian_diffuses_twice_as_fast():
    x0 = STD_1D.sample(600, seed=3)
    S0, t = x0.var(), 0.25
    x = heat_flow(x0, t, eps=0.05, dt=0.01, normalization="softmax_gaussian")
    ref = heat_reference(GaussianMixture.gaussian([0.0], [[S0]]), t, "softmax_gaussian")
    # mean-field rate 4S/(S + eps): 3% below the limit 4 at this eps
    assert abs(x.var() - ref.covs[0, 0, 0]) / ref.covs[0, 0, 0] < 0.06
    assert abs(x.var() - (S0 + 2 * t)) / (S0 + 2 * t) > 0.2  # and is not heat


def test_unnormalized_kernel_follows_the_porous_medium_equation():
    b = Barenblatt(dim=1, time=0.5)
    x0 = b.sample(600, seed=0)
    t = 0.25
    x = heat_flow(x0, t, eps=0.02, dt=0.005, normalization="unnormalized")
    ref = heat_reference(b, t, "unnormalized")
    growth, expected = x.var() - x0.var(), ref.covariance()[0, 0] - b.covariance()[0, 0]
    assert abs(growth - expected) / expected < 0.1  # O(eps) smoothing + fluctuations
    w2 = sinkflow.wasserstein2(x, ref, floor=True)
    assert w2.value < 2 * w2.floor  # as close as i.i.d. samples of the exact solution


def test_flow_keeps_input_type_and_dtype():
    x0 = STD_1D.sample(60, seed=0)
    out = heat_flow(x0, 0.05, 0.2, 0.025)
    assert isinstance(out, np.ndarray) and out.shape == (60, 1) and out.dtype == np.float64
    xt = torch.tensor(x0, dtype=torch.float32)
    out_t = heat_flow(xt, 0.05, 0.2, 0.025)
    assert isinstance(out_t, torch.Tensor) and out_t.dtype == torch.float32
    assert np.abs(out_t.numpy() - out).max() < 1e-3  # float32 vs float64 trajectories
    traj = heat_trajectory(x0, [0.0, 0.05, 0.1], 0.2, 0.03)
    np.testing.assert_array_equal(traj.positions[0], x0)
    assert traj.n_steps == 4 and traj.converged  # 2 + 2 steps of 0.025 <= 0.03


@pytest.mark.parametrize("dtype, tol, agree", [(torch.float64, 1e-10, 1e-8), (torch.float32, 2e-6, 1e-4)])
def test_sinkhorn_flow_by_the_symmetric_solver_equals_the_general_solvers(dtype, tol, agree):
    # A cold bandwidth (eps = 0.02, 100 particles): the symmetric solver (no graph) and the general
    # alternating solver (the path of a tensor that requires grad) give the same flow, the first in
    # about 11 iterations per step (float64) where the second takes about 320. Measured: 2e-10
    # apart in float64, 2e-5 in float32.
    x0 = torch.tensor(STD_1D.sample(100, seed=0), dtype=dtype)
    fast = heat_trajectory(x0, [0.1], eps=0.02, dt=0.01, tol=tol)
    general = heat_trajectory(x0.clone().requires_grad_(), [0.1], eps=0.02, dt=0.01, tol=tol)
    assert fast.converged and general.converged and fast.max_marginal_error <= tol
    assert (fast.positions - general.positions.detach()).abs().max() <= agree
    assert fast.sinkhorn_iterations.mean() * 10 < general.sinkhorn_iterations.mean()


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.3, 2.0))
def test_sinkhorn_velocity_has_zero_mean(seed, eps):
    # eps above the squared nearest-neighbour spacing of 30 points: for a nearly diagonal
    # kernel Sinkhorn converges arbitrarily slowly (rate sigma_2(P)^2 -> 1)
    x = np.random.default_rng(seed).normal(size=(30, 2))
    v = sinkflow.heat_velocity(x, eps, tol=1e-12)
    # columns sum to 1 up to tol: sum_i v_i = -(2/eps) sum_j x_j (col_j - 1)
    assert np.abs(v.sum(0)).max() < 1e-8 / eps


@pytest.mark.parametrize("kwargs, match", [
    (dict(t=0.1, eps=0.0, dt=0.01), "eps"),
    (dict(t=0.1, eps=-1.0, dt=0.01), "eps"),
    (dict(t=-0.1, eps=0.1, dt=0.01), "t must be"),
    (dict(t=0.1, eps=0.1, dt=0.2), "exceeds"),
    (dict(t=0.1, eps=0.1, dt=0.0), "dt must be positive"),
    (dict(t=0.1, eps=0.1, dt=0.01, normalization="sinkorn"), "normalization"),
])
def test_flow_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        heat_flow(np.zeros((5, 1)) + np.arange(5.0)[:, None], **kwargs)


def test_references_reject_bad_input():
    with pytest.raises(ValueError, match="dimensions 1 and 2"):
        ax = np.linspace(-1, 1, 9)
        solve_heat_grid(np.zeros((9, 9, 9)), [ax, ax, ax], 0.1)
    with pytest.raises(ValueError, match="t must be"):
        MIX_1D.evolve(-1.0)
    with pytest.raises(ValueError, match="each time"):
        solve_heat_grid(STD_1D.pdf, [np.linspace(-5, 5, 51)], [-0.5])
    with pytest.raises(ValueError, match="no many-particle limit"):
        heat_reference(MIX_1D, 0.1, "softmax_dot")
    with pytest.raises(ValueError, match="Barenblatt"):
        heat_reference(MIX_1D, 0.1, "unnormalized")
    with pytest.raises(ValueError, match="positive definite"):
        GaussianMixture.gaussian([0.0], [[-1.0]])
    with pytest.raises(ValueError, match="uniform"):
        solve_heat_grid(STD_1D.pdf, [np.array([0, 1, 3, 4, 5, 6, 7, 8.0])], 0.1)


# ---------------------------------------------------------------------------------------
# barycentric map and distances


def test_barycentric_map_eps_over_2_and_first_order_error():
    y = np.linspace(-4.5, 4.5, 181)
    errs = [barycentric_map(MIX_1D, y, eps, tol=1e-9).error for eps in (0.1, 0.05)]
    # O(eps): halving eps halves the error (ratio 0.5 +- rounding of the Riemann sums)
    assert 0.4 < errs[1] / errs[0] < 0.6
    # SoftMax on the same scale eps/2 gives twice the score: another constant
    sm = barycentric_map(MIX_1D, y, 0.02, "softmax_gaussian")
    inner = sm.interior & (np.abs(sm.target) > 0.5)
    on_sinkhorn_scale = sm.rescaled * sm.scale / (0.02 / 2)
    # smoothed score: relative error up to ~eps / s_min = 0.1 (0.22 at the valley between
    # the modes); 0.25 still tells 2x the score from 1x (50% off)
    np.testing.assert_allclose(on_sinkhorn_scale[inner], 2 * sm.target[inner], rtol=0.25)
    sk = barycentric_map(STD_1D, np.linspace(-6, 6, 241), 0.02, tol=1e-9)
    # symbolic first-order term: (B - x)/(eps/2) = -x/s + eps x/(4 s^2) + O(eps^2)
    pred = -sk.grid + 0.02 * sk.grid / 4
    assert np.abs(sk.rescaled - pred)[sk.interior].max() < 2e-3


def test_wasserstein2_exact_in_1d_and_floor_in_2d():
    # particles at the exact quantiles of N(0.5, 4): W2 to N(0, 1) is sqrt(0.5^2 + (2 - 1)^2)
    from scipy.stats import norm
    n = 2000
    x = 0.5 + 2 * norm.ppf((np.arange(n) + 0.5) / n)
    r = sinkflow.wasserstein2(x, STD_1D)
    assert abs(r.value - math.sqrt(1.25)) < 2e-3  # quantile tails of the n-point sample: O(log n / n)
    pts = MIX_2D.sample(300, seed=5)
    r2 = sinkflow.wasserstein2(pts, MIX_2D, floor=True, seed=1)
    # i.i.d. samples sit at the floor; shifted ones clearly above it
    assert r2.method == "emd" and r2.value < 2 * r2.floor
    assert sinkflow.wasserstein2(pts + 1.0, MIX_2D, seed=1).value > 3 * r2.floor


def test_wasserstein2_tabulates_each_reference_once_and_only_for_equal_values(monkeypatch):
    """The 1D quantiles are kept per reference value (a figure compares dozens of samples with each
    reference): equal references, built apart, share one tabulation; a reference that differs in
    one number, a Barenblatt or an object that is not a frozen dataclass gets its own; each value
    equals the uncached computation."""
    import sinkflow.heat._distances as distances

    calls = []
    tabulate = distances._tabulated_quantiles
    monkeypatch.setattr(distances, "_tabulated_quantiles", lambda ref, m: calls.append(ref) or tabulate(ref, m))
    monkeypatch.setattr(distances, "_QUANTILES", distances.OrderedDict())

    class Plain:  # the reference protocol, not a dataclass: never kept
        dim, mean, covariance, pdf = 1, STD_1D.mean, STD_1D.covariance, STD_1D.pdf

    x = np.linspace(-1.0, 2.0, 50)
    shifted = GaussianMixture.gaussian([1e-9], [[1.0]])
    refs = [STD_1D.evolve(0.1), STD_1D.evolve(0.1), shifted, Barenblatt(dim=1, time=0.3), Barenblatt(dim=1, time=0.3),
            Barenblatt(dim=1, time=0.31), Plain(), Plain()]
    values = [sinkflow.wasserstein2(x, r).value for r in refs]
    assert [id(r) for r in calls] == [id(refs[k]) for k in (0, 2, 3, 5, 6, 7)]
    for r, v in zip(refs, values, strict=True):
        assert v == math.sqrt(distances._empirical_w2_squared_1d(x, tabulate(r, 20000)))
    assert values[0] != values[2] and values[3] != values[5]


@pytest.mark.parametrize("n, m, rounded", [(1, 1, False), (3, 7, False), (200, 20000, False), (40, 13, True)])
def test_empirical_w2_1d_matches_pot_and_a_shift(n, m, rounded):
    """The numpy 1D W2 (POT is not imported for it) against POT's wasserstein_1d, ties included,
    and against the closed form of a shift: W2(u, u + c) = |c|."""
    import ot

    from sinkflow.heat._distances import _empirical_w2_squared_1d

    rng = np.random.default_rng(n + m)
    u, v = rng.normal(size=n), 2 * rng.normal(size=m) + 1
    if rounded:
        u, v = np.round(u), np.round(v)
    assert math.isclose(_empirical_w2_squared_1d(u, v), float(ot.wasserstein_1d(u, v, p=2)), rel_tol=1e-12)
    assert math.isclose(_empirical_w2_squared_1d(v, v[::-1] - 0.75), 0.75 ** 2, rel_tol=1e-12)


def test_moment_errors_and_kde_l1_detect_the_wrong_time():
    x = MIX_1D.evolve(0.5).sample(3000, seed=0)
    grid = [np.linspace(-10, 10, 801)]
    right, wrong = MIX_1D.evolve(0.5), MIX_1D.evolve(1.0)
    assert sinkflow.moment_errors(x, right).covariance < 0.06  # ~sqrt(2/n) relative
    assert sinkflow.moment_errors(x, wrong).covariance > 0.2
    assert sinkflow.kde_l1(x, right, grid) < 0.5 * sinkflow.kde_l1(x, wrong, grid)


def test_convergence_study_recovers_a_known_order():
    rng = np.random.default_rng(0)
    noise = rng.uniform(0.95, 1.05, size=(4, 3))
    study = sinkflow.convergence_study([100, 200, 400, 800], lambda n, s: n ** -0.5 * noise[int(np.log2(n / 100)), s])
    assert abs(study.slope + 0.5) < 0.05 and study.slope_ci[0] < -0.5 + 0.1 and study.errors.shape == (4, 3)
    with pytest.raises(ValueError):
        sinkflow.fit_loglog_slope([1, 2], [1, -1])


@pytest.mark.slow
@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_all_normalizations_run_in_2d(normalization):
    x0 = MIX_2D.sample(300, seed=0)
    dt = 0.002 if normalization == "softmax_dot" else 0.02
    x = heat_flow(x0, 0.1, eps=0.1, dt=dt, normalization=normalization)
    assert np.all(np.isfinite(x)) and x.shape == x0.shape


def test_large_dt_against_eps_is_refused_with_the_safe_value():
    # the case: n = 400, eps = 1e-4, dt = 0.01 gave variance growth 2.46 for 0.20
    x0 = np.random.default_rng(0).normal(size=(400, 1))
    with pytest.raises(ValueError, match=r"largest safe step dt = 5e-05 of normalization='sinkhorn'"):
        heat_flow(x0, t=0.1, eps=1e-4, dt=0.01)
    with pytest.warns(RuntimeWarning, match="exceeds the largest safe step"):
        heat_flow(x0[:50], t=0.03, eps=0.04, dt=0.03)


@pytest.mark.parametrize("normalization", ["sinkhorn", "softmax_gaussian", "unnormalized", "softmax_dot"])
def test_step_warning_and_error_name_the_normalization_and_the_same_limit(normalization):
    # issue 19: the tour's warning did not name the normalization; the error and the warning
    # must quote one number, the limit of largest_safe_dt (closed forms here as the oracle)
    import re

    x0 = np.random.default_rng(2).normal(size=(60, 1))
    eps = 0.1
    dot = normalization == "softmax_dot"
    safe = eps**2 / (4 * x0.var(ddof=1)) if dot else eps / 2  # the sample variance
    assert sinkflow.heat.largest_safe_dt(x0, eps, normalization) == pytest.approx(safe, rel=1e-12)
    quoted = rf"largest safe step dt = {re.escape(f'{safe:g}')} of normalization='{normalization}' at eps=0.1"
    with pytest.warns(RuntimeWarning, match=quoted):
        heat_flow(x0, t=3 * safe, eps=eps, dt=1.5 * safe, normalization=normalization)
    if not dot:  # kernel layers: more than twice the limit is refused, with the same number
        with pytest.raises(ValueError, match=quoted):
            heat_flow(x0, t=3 * safe, eps=eps, dt=3 * safe, normalization=normalization)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # below the limit: silent
        heat_flow(x0, t=2 * safe, eps=eps, dt=0.99 * safe, normalization=normalization)


def test_frozen_bandwidth_is_warned_about():
    x0 = np.random.default_rng(1).normal(size=(400, 1))
    with pytest.warns(RuntimeWarning, match="barely move"):
        x1 = heat_flow(x0, t=1e-8, eps=1e-8, dt=5e-9)
    assert np.isfinite(x1).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a resolved bandwidth is not warned about
        heat_flow(x0, t=0.01, eps=0.05, dt=0.01)


def test_time_zero_returns_the_start():
    x0 = np.random.default_rng(2).normal(size=(30, 2))
    np.testing.assert_array_equal(heat_flow(x0, t=0.0, eps=0.1, dt=0.01), x0)
