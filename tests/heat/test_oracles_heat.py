"""Heat-limit velocities and the grid heat solver against oracles written in the test: the
formula of the rescaled velocity in dimensions 1, 2 and 3, the log-domain Sinkhorn loop, and
closed-form Gaussian solutions placed where a periodic wrap-around would show."""

import math

import numpy as np
import ot
import pytest
from scipy.special import logsumexp

import sinkflow
from sinkflow.heat._limits import barycentric_map
from sinkflow.heat._references import GaussianMixture, solve_heat_grid


def velocity_oracle(x, eps, normalization):
    """-(2/eps) sum_j K_ij (x_j - x_i) with the kernel of each normalization, from the formulas."""
    n, d = x.shape
    sq = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    if normalization == "softmax_dot":
        C = x @ x.T / eps
        K = np.exp(C - logsumexp(C, axis=1, keepdims=True))
    elif normalization == "softmax_gaussian":
        C = -sq / (2 * eps)
        K = np.exp(C - logsumexp(C, axis=1, keepdims=True))
    elif normalization == "sinkhorn":  # POT's entropic plan for cost |x - y|^2 / 2 and reg eps, times n
        a = np.full(n, 1.0 / n)
        K = n * ot.sinkhorn(a, a, sq / 2, reg=eps, stopThr=1e-14, numItermax=100_000)
    else:  # the heat kernel G_eps(x - y) = (2 pi eps)^(-d/2) exp(-|x - y|^2 / (2 eps)), weights 1/n
        K = (2 * math.pi * eps) ** (-d / 2) * np.exp(-sq / (2 * eps)) / n
    return -(2 / eps) * (K @ x - K.sum(1, keepdims=True) * x)


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("normalization", ["unnormalized", "softmax_gaussian", "softmax_dot", "sinkhorn"])
def test_heat_velocity_matches_its_formula_in_each_dimension(normalization, d):
    x = np.random.default_rng(d).normal(size=(40, d))
    eps = 0.3
    got = sinkflow.heat_velocity(x, eps, normalization, tol=1e-13)
    expected = velocity_oracle(x, eps, normalization)
    assert np.abs(got - expected).max() <= 1e-9 * np.abs(expected).max()


@pytest.mark.parametrize("d", [1, 2, 3])
def test_unnormalized_velocity_scales_like_eps_to_the_minus_d_over_2(d):
    # For two particles at distance r the kernel mass is (2 pi eps)^(-d/2) exp(-r^2/(2 eps)) / 2:
    # a hand-computed value that pins the dimension in the normalization.
    r, eps = 0.5, 0.2
    x = np.zeros((2, d))
    x[1, 0] = r
    v = sinkflow.heat_velocity(x, eps, "unnormalized")
    k = (2 * math.pi * eps) ** (-d / 2) * math.exp(-r * r / (2 * eps)) / 2
    assert v[0, 0] == pytest.approx(-(2 / eps) * k * r, rel=1e-12)
    assert v[1, 0] == pytest.approx((2 / eps) * k * r, rel=1e-12)


@pytest.mark.parametrize("eps", [0.05, 0.02])
def test_default_sinkhorn_tolerance_keeps_the_velocity_below_the_flow_bias(eps):
    # The default tol = eps^2 / 100 exists so that the solver error stays an order of magnitude
    # below the O(eps / 4) relative bias of the flow (variance 1 here). Measured: 0.011 eps
    # (eps = 0.05) and 0.0012 eps (0.02); a tolerance of eps / 100 gives 0.07 eps and 0.19 eps.
    x = np.random.default_rng(0).normal(size=(200, 1))
    exact = velocity_oracle(x, eps, "sinkhorn")
    err = np.abs(sinkflow.heat_velocity(x, eps) - exact).max() / np.abs(exact).max()
    assert err <= eps / 40


# ---------------------------------------------------------------------------------------
# the grid solver: zero padding must stop the periodic convolution from wrapping around


def test_grid_solver_has_no_wrap_around_when_the_solution_leaves_the_grid_1d():
    # An off-centre bump whose heat solution carries 10% of its mass beyond the grid at t = 2:
    # without enough zero padding that mass re-enters from the other side.
    start = GaussianMixture.gaussian([-2.0], [[0.1]])
    x = np.linspace(-4, 4, 161)
    times = [0.5, 2.0, 4.0]
    sol = solve_heat_grid(start.pdf, [x], times)
    for k, t in enumerate(times):
        exact = start.evolve(t).pdf(x)
        assert np.abs(sol.density[k] - exact).max() <= 1e-9
    assert sol.density[-1][-1] < sol.density[-1][0] / 5  # the far edge stays low (exact: 0.18x)


def test_grid_solver_pads_each_axis_by_its_own_step_2d():
    start = GaussianMixture([1.0], [[1.5, -1.0]], [[[0.08, 0.02], [0.02, 0.05]]])
    ax0 = np.linspace(-4, 4, 81)  # step 0.1
    ax1 = np.linspace(-3, 3, 241)  # step 0.025
    sol = solve_heat_grid(start.pdf, [ax0, ax1], [0.3, 1.5])
    pts = sol.mesh().reshape(-1, 2)
    for k, t in enumerate(sol.times):
        exact = start.evolve(t).pdf(pts)
        assert np.abs(sol.density[k].ravel() - exact).max() <= 1e-9


def test_unnormalized_barycentric_map_is_the_derivative_of_the_smoothed_density():
    # For rho = N(0, s): int G_eps(x - y)(y - x) rho(y) dy = eps d/dx N(x; 0, s + eps), so the
    # rescaled map is -x/(s + eps) N(x; 0, s + eps) (a Riemann sum on a fine grid: spectrally
    # accurate), its limit rho' = -x/s N(x; 0, s), compared where rho >= 1e-3 max rho,
    # i.e. |x| <= sqrt(2 s log 1000).
    s, eps = 0.8, 0.05
    y = np.linspace(-8, 8, 801)

    def normal(x, var):
        return np.exp(-x * x / (2 * var)) / np.sqrt(2 * np.pi * var)

    r = barycentric_map(GaussianMixture.gaussian([0.0], [[s]]), y, eps, "unnormalized")
    smoothed = -y / (s + eps) * normal(y, s + eps)
    limit = -y / s * normal(y, s)
    assert r.scale == eps
    assert np.abs(r.rescaled - smoothed).max() <= 1e-10
    assert np.abs(r.target - limit).max() <= 1e-8
    inside = np.abs(y) <= np.sqrt(2 * s * np.log(1000))
    assert np.array_equal(r.interior, inside)
    assert r.error == pytest.approx(np.abs(smoothed - limit)[inside].max(), rel=1e-7)


@pytest.mark.parametrize("dim", [1, 2])
def test_barenblatt_samples_fill_the_support_with_the_profile_covariance(dim):
    # The Barenblatt profile is supported in the ball of radius R; its covariance (closed form)
    # is matched by the samples to Monte-Carlo accuracy (20,000 draws: ~1.5% relative).
    from sinkflow.heat._references import Barenblatt

    b = Barenblatt(dim=dim, time=0.5)
    x = b.sample(20_000, seed=1)
    r = np.linalg.norm(x - np.asarray(b.center), axis=1)
    assert r.max() <= b.radius and r.max() > 0.95 * b.radius
    cov = np.atleast_2d(np.cov(x.T, bias=True))
    assert np.abs(cov - b.covariance()).max() <= 0.05 * np.abs(b.covariance()).max()
