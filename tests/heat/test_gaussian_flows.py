"""Gaussian moment flows (sinkflow.heat._gaussian_flows) against independent oracles.

Oracles: particles of sinkflow.simulate (Gauss-Hermite weighted particles, which integrate the
field to quadrature accuracy, and random samples, whose error falls at the sampling rate);
the grid solver sinkflow.mean_field_flow in 1D and 2D; the variance ODEs of the heat-limit
table (docs/theory/heat_limit.md) integrated here with scipy; the isotropic SoftMax closed form
solved by hand; POT's Sinkhorn on a discretized Gaussian (the entropic plan); and a plain
multi-head field written here.
"""

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import sinkflow
from sinkflow.heat._gaussian_flows import sinkhorn_slope

M0 = np.array([0.5, -0.3])
S0 = np.array([[0.6, 0.2], [0.2, 0.3]])
WQ = np.array([[1.0, 0.3], [-0.2, 0.8]])
WK = np.array([[0.7, 0.1], [0.4, 1.1]])  # W_Q^T W_K neither symmetric nor definite
WV = np.array([[-0.5, 0.3], [0.1, -0.4]])
TAU = 1.5

# the exact variance rate of N(0, S) under each rescaled layer (docs/theory/heat_limit.md)
RATES = {
    "sinkhorn": lambda S, e: 8 * S / (2 * S + e + np.sqrt(e ** 2 + 4 * S ** 2)),
    "softmax_gaussian": lambda S, e: 4 * S / (S + e),
    "softmax_dot": lambda S, e: -4 * S / e * (S / e - 1),
}
# the rescaled layer of heat_flow / mean_field_flow as (normalization, scores) of gaussian_moment_flow
HEAT_LAYERS = {"sinkhorn": ("sinkhorn", "gaussian"), "softmax_gaussian": ("softmax", "gaussian"),
               "softmax_dot": ("softmax", "dot")}


def heat_layer_flow(m, S, times, layer, eps):
    norm, scores = HEAT_LAYERS[layer]
    d = len(m)
    return sinkflow.gaussian_moment_flow(m, S, times, normalization=norm, scores=scores, temperature=eps,
                                         W_V=-2 / eps * np.eye(d), drift=2 / eps * np.eye(d))


def gauss_hermite(m, S, q):
    """Weighted nodes of the product Gauss-Hermite rule for N(m, S) in 2D (tiny weights dropped)."""
    z, w = np.polynomial.hermite_e.hermegauss(q)
    Z = np.stack(np.meshgrid(z, z, indexing="ij"), -1).reshape(-1, 2)
    W = np.outer(w, w).ravel()
    keep = W > 1e-14 * W.max()
    return m + Z[keep] @ np.linalg.cholesky(S).T, W[keep] / W[keep].sum()


def weighted_moments(X, w):
    mu = w @ X
    D = X - mu
    return mu, D.T @ (D * w[:, None])


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_gauss_hermite_particles_follow_the_moment_ode(normalization):
    """144 weighted particles under simulate (RK4) carry the ODE's moments to 1e-7 at t = 1."""
    r = sinkflow.gaussian_moment_flow(M0, S0, [1.0], normalization=normalization, W_Q=WQ, W_K=WK, W_V=WV,
                                      temperature=TAU)
    x0, w = gauss_hermite(M0, S0, 12)
    tr = sinkflow.simulate(x0, normalization, W_Q=WQ, W_K=WK, W_V=WV, h=0.05, steps=20, integrator="rk4",
                           temperature=TAU, weights=w, save_every=20)
    mu, C = weighted_moments(tr.final, w)
    assert np.abs(mu - r.means[-1]).max() < 1e-7  # measured 2.3e-9 (SoftMax), 1.6e-9 (Sinkhorn): RK4's h^4
    assert np.abs(C - r.covs[-1]).max() < 1e-7
    assert np.abs(C - S0).max() > 0.1  # the flow moved the covariance


def _rms_errors(normalization, ns, seeds):
    r = sinkflow.gaussian_moment_flow(M0, S0, [0.3], normalization=normalization, W_Q=WQ, W_K=WK, W_V=WV,
                                      temperature=TAU)
    out = []
    for n in ns:
        errs = []
        for seed in range(seeds):
            x0 = np.random.default_rng(seed).multivariate_normal(M0, S0, size=n)
            X = sinkflow.simulate(x0, normalization, W_Q=WQ, W_K=WK, W_V=WV, h=0.1, steps=3, integrator="rk4",
                                  temperature=TAU, save_every=3, tol=1e-8).final
            errs.append(np.linalg.norm(X.mean(0) - r.means[-1]) + np.linalg.norm(np.cov(X.T, bias=True) - r.covs[-1]))
        out.append(np.sqrt(np.mean(np.square(errs))))
    return np.array(out)


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_sampled_particles_converge_at_the_sampling_rate(normalization):
    ns = np.array([16, 64, 256])
    err = _rms_errors(normalization, ns, seeds=8)
    slope = np.polyfit(np.log(ns), np.log(err), 1)[0]
    assert -0.75 < slope < -0.3, (slope, err)  # measured -0.52 (SoftMax), -0.52 (Sinkhorn)


def test_isotropic_softmax_closed_form_and_its_blow_up():
    """W = W_V = I, S = s I: dS/dt = 2 S^2 / tau, dm/dt = (1 + s/tau) m, solved by hand."""
    s0, tau, m0 = 0.4, 2.0, np.array([0.3, -0.1, 0.2])
    t = np.linspace(0, 2.0, 5)  # the blow-up time is tau / (2 s0) = 2.5
    r = sinkflow.gaussian_moment_flow(m0, s0 * np.eye(3), t, normalization="softmax", temperature=tau)
    s = s0 / (1 - 2 * s0 * t / tau)
    np.testing.assert_allclose(r.covs, s[:, None, None] * np.eye(3), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(r.means, m0 * (np.exp(t) / np.sqrt(1 - 2 * s0 * t / tau))[:, None], rtol=1e-8)
    with pytest.raises(FloatingPointError, match="blow up in finite time"):
        sinkflow.gaussian_moment_flow(m0, s0 * np.eye(3), 3.0, normalization="softmax", temperature=tau)


@pytest.mark.parametrize("layer", sorted(RATES))
def test_heat_layer_variances_follow_the_table(layer):
    """Diagonal S in 2D, A = I / eps: each axis follows the 1D variance ODE of the heat-limit table."""
    eps, t = 0.3, np.array([0.0, 0.1, 0.4])
    S = np.diag([0.2, 0.5])
    r = heat_layer_flow(np.zeros(2), S, t, layer, eps)
    for k in range(2):
        ref = solve_ivp(lambda _, s: RATES[layer](s, eps), (0, t[-1]), [S[k, k]], t_eval=t, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(r.covs[:, k, k], ref.y[0], rtol=1e-8)
    np.testing.assert_allclose(r.covs[:, 0, 1], 0.0, atol=1e-14)


def test_sinkhorn_slope_matches_pot_plan():
    """The entropic plan of N(m, S) with itself (cost -x^T A y, A not symmetric), by POT on Gauss-Hermite nodes."""
    ot = pytest.importorskip("ot")
    A = WQ.T @ WK / TAU
    x, w = gauss_hermite(M0, S0, 14)
    plan = ot.sinkhorn(w, w, -(x @ A @ x.T), reg=1.0, method="sinkhorn_log", stopThr=1e-12, numItermax=20_000)
    D = x - M0
    cross = D.T @ plan @ D  # Gamma = Cov(X, Y) under the plan
    np.testing.assert_allclose(cross.T @ np.linalg.inv(S0), sinkhorn_slope(S0, A), atol=1e-8)
    v = sinkflow.gaussian_attention_field(M0, S0, normalization="sinkhorn", W_Q=WQ, W_K=WK, W_V=WV, temperature=TAU)
    barycentres = (plan / w[:, None]) @ x
    np.testing.assert_allclose(v(x), barycentres @ WV.T, atol=1e-7)


def test_sinkhorn_slope_from_the_schroedinger_system_in_sympy():
    """1D: plan e^{-(x^2 + y^2)/(2s) + a x y - q (x^2 + y^2)/2}; the x-marginal must be N(0, s), which fixes q."""
    sp = pytest.importorskip("sympy")
    x, s, a, q = sp.symbols("x s a q", positive=True)
    log_marginal = (a * x) ** 2 / (2 * (1 / s + q))  # log of int e^{-c y^2/2 + b y} dy, up to a constant: b^2 / (2c)
    exponent = sp.expand(-(1 / s + q) * x ** 2 / 2 + log_marginal)
    q_star = [r for r in sp.solve(sp.Eq(exponent.coeff(x, 2), -1 / (2 * s)), q) if r.subs({s: 1, a: 1}) > 0][0]
    slope = sp.lambdify((s, a), a / (1 / s + q_star))  # E[y | x] = a x / (1/s + q)
    for s_val, a_val in [(0.3, 0.5), (2.0, 1.7), (0.05, 10.0)]:
        assert abs(sinkhorn_slope(np.array([[s_val]]), np.array([[a_val]]))[0, 0] - slope(s_val, a_val)) < 1e-12
    S = np.diag([0.3, 2.0])  # isotropic A on a diagonal S: each axis is the 1D plan
    np.testing.assert_allclose(np.diag(sinkhorn_slope(S, 0.5 * np.eye(2))), [slope(0.3, 0.5), slope(2.0, 0.5)],
                               rtol=1e-12)


def _multihead_field(x, w, As, Vs):
    """sum_h W_V^h (SoftMax barycentre of the weighted particles under scores x^T A_h y)."""
    out = np.zeros_like(x)
    for A, V in zip(As, Vs, strict=True):
        C = x @ A @ x.T + np.log(w)[None, :]
        K = np.exp(C - C.max(1, keepdims=True))
        out += (K / K.sum(1, keepdims=True)) @ x @ V.T
    return out


def test_multihead_flow_is_the_sum_of_head_fields():
    """Two heads with (1, 2) query/key maps: weighted Gauss-Hermite particles moved by RK4 on a plain field."""
    Q = np.array([[[1.0, 0.5]], [[0.2, -1.0]]])
    K = np.array([[[0.8, -0.3]], [[1.0, 0.4]]])
    V = np.array([WV, [[0.3, 0.0], [0.2, 0.1]]])
    As = [q.T @ k / TAU for q, k in zip(Q, K, strict=True)]
    x, w = gauss_hermite(M0, S0, 12)
    v = sinkflow.gaussian_attention_field(M0, S0, normalization="softmax", W_Q=Q, W_K=K, W_V=V, temperature=TAU,
                                          heads=2)
    np.testing.assert_allclose(v(x), _multihead_field(x, w, As, V), atol=2e-6)  # 6.5e-7: quadrature at corner nodes
    h, steps = 0.05, 20
    for _ in range(steps):
        k1 = _multihead_field(x, w, As, V)
        k2 = _multihead_field(x + h / 2 * k1, w, As, V)
        k3 = _multihead_field(x + h / 2 * k2, w, As, V)
        k4 = _multihead_field(x + h * k3, w, As, V)
        x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    r = sinkflow.gaussian_moment_flow(M0, S0, h * steps, normalization="softmax", W_Q=Q, W_K=K, W_V=V,
                                      temperature=TAU, heads=2)
    mu, C = weighted_moments(x, w)
    assert np.abs(mu - r.means[-1]).max() < 1e-7 and np.abs(C - r.covs[-1]).max() < 1e-7


def test_multihead_sinkhorn_field_against_pot():
    ot = pytest.importorskip("ot")
    Q, K, V = np.array([WQ, np.eye(2)]), np.array([WK, -np.eye(2)]), np.array([WV, np.eye(2)])
    x, w = gauss_hermite(M0, S0, 16)
    want = np.zeros_like(x)
    for q, k, vv in zip(Q, K, V, strict=True):
        plan = ot.sinkhorn(w, w, -(x @ q.T @ k @ x.T) / TAU, reg=1.0, method="sinkhorn_log", stopThr=1e-13,
                           numItermax=20_000)
        want += (plan / w[:, None]) @ x @ vv.T
    v = sinkflow.gaussian_attention_field(M0, S0, normalization="sinkhorn", W_Q=Q, W_K=K, W_V=V, temperature=TAU,
                                          heads=2)
    np.testing.assert_allclose(v(x), want, atol=1e-7)


def _grid_moments(p, axes):
    pts = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(axes))
    return weighted_moments(pts, p.ravel() / p.sum())


@pytest.mark.parametrize("layer, m, S, tol", [("sinkhorn", 0.4, 0.5, 3e-4), ("softmax_gaussian", 0.4, 0.5, 6e-4),
                                              ("softmax_dot", 0.0, 0.1, 2e-2)])
def test_mean_field_flow_1d(layer, m, S, tol):
    """The grid solver of the same layer keeps the Gaussian's moments (SoftMax-dot: tail-sensitive, 2%)."""
    eps, t = 0.3, [0.1, 0.3]
    y = np.linspace(-6, 6, 241)
    rho = np.exp(-(y - m) ** 2 / (2 * S))
    rho /= rho.sum() * (y[1] - y[0])
    grid = sinkflow.mean_field_flow(rho, y, t, normalization=layer, eps=eps)
    r = heat_layer_flow([m], [[S]], t, layer, eps)
    for k in range(len(t)):
        mu, C = _grid_moments(grid.densities[k], [y])
        assert abs(mu[0] - r.means[k, 0]) < 1e-6
        assert abs(C[0, 0] / r.covs[k, 0, 0] - 1) < tol  # measured 2e-5, 1.2e-4 (Sinkhorn); 2.4e-4; 1.6e-3


@pytest.mark.parametrize("layer", ["sinkhorn", "softmax_gaussian"])
def test_mean_field_flow_2d_correlated(layer):
    eps, m, S = 0.3, np.array([0.3, -0.2]), np.array([[0.5, 0.2], [0.2, 0.35]])
    a = np.linspace(-5, 5, 64)
    X = np.stack(np.meshgrid(a, a, indexing="ij"), -1) - m
    rho = np.exp(-0.5 * np.einsum("...i,ij,...j", X, np.linalg.inv(S), X))
    rho /= rho.sum() * (a[1] - a[0]) ** 2
    grid = sinkflow.mean_field_flow(rho, (a, a), 0.2, normalization=layer, eps=eps)
    r = heat_layer_flow(m, S, [0.2], layer, eps)
    mu, C = _grid_moments(grid.final, [a, a])
    assert np.abs(mu - r.means[-1]).max() < 1e-5
    assert np.abs(C - r.covs[-1]).max() < 1.5e-2  # measured 6.8e-3 (Sinkhorn), 1.2e-2: the explicit scheme's O(dx^2)
    assert abs(C[0, 1] - r.covs[-1][0, 1]) < 1e-3  # measured 1e-4, 3e-5: the isotropic kernel's bias spares it


def test_softmax_gaussian_scores_against_a_plain_field():
    """SoftMax of -(x-y)^T W (x-y) / (2 tau), W = W_Q^T W_K not symmetric (its symmetric part is PSD), at nodes."""
    Wk = np.array([[1.2, -0.3], [0.5, 0.4]])  # W_s has eigenvalues 0.19, 1.14 and does not commute with S0
    W = WQ.T @ Wk
    x, w = gauss_hermite(M0, S0, 16)
    diff = x[:, None, :] - x[None, :, :]
    C = -np.einsum("ija,ab,ijb->ij", diff, W, diff) / (2 * TAU) + np.log(w)[None, :]
    K = np.exp(C - C.max(1, keepdims=True))
    want = (K / K.sum(1, keepdims=True)) @ x @ WV.T
    v = sinkflow.gaussian_attention_field(M0, S0, normalization="softmax", W_Q=WQ, W_K=Wk, W_V=WV, temperature=TAU,
                                          scores="gaussian")
    np.testing.assert_allclose(v(x), want, atol=1e-8)


def test_gaussian_scores_sinkhorn_is_dot_scores_with_the_symmetric_part():
    """Sinkhorn ignores row and column constants: -|x-y|_W^2/2tau is x^T W_s y / tau up to them."""
    W = WQ.T @ WK
    Ws = (W + W.T) / 2
    kw = dict(normalization="sinkhorn", W_V=WV, temperature=TAU)
    g = sinkflow.gaussian_moment_flow(M0, S0, [0.5], W_K=W, scores="gaussian", **kw)
    d = sinkflow.gaussian_moment_flow(M0, S0, [0.5], W_K=Ws, **kw)
    np.testing.assert_allclose(g.covs, d.covs, rtol=1e-9)
    assert np.abs(sinkflow.gaussian_moment_flow(M0, S0, [0.5], W_K=W, **kw).covs - d.covs).max() > 1e-3


def test_bad_inputs_are_named():
    kw = dict(normalization="softmax")
    with pytest.raises(ValueError, match="cov must have shape"):
        sinkflow.gaussian_moment_flow([0.0, 0.0], np.eye(3), 1.0, **kw)
    with pytest.raises(ValueError, match="positive semi-definite"):
        sinkflow.gaussian_moment_flow([0.0, 0.0], np.diag([1.0, -1.0]), 1.0, **kw)
    with pytest.raises(ValueError, match="symmetric"):
        sinkflow.gaussian_moment_flow([0.0, 0.0], [[1.0, 0.5], [0.0, 1.0]], 1.0, **kw)
    with pytest.raises(ValueError, match="times"):
        sinkflow.gaussian_moment_flow([0.0], [[1.0]], [0.5, 0.2], **kw)
    with pytest.raises(ValueError, match="normalization"):
        sinkflow.gaussian_moment_flow([0.0], [[1.0]], 1.0, normalization="unnormalized")
    with pytest.raises(ValueError, match=r"W_V must have shape \(2, 2, 2\)"):
        sinkflow.gaussian_moment_flow([0.0, 0.0], np.eye(2), 1.0, W_V=np.eye(2), heads=2, **kw)
    with pytest.raises(TypeError, match="temperature"):
        sinkflow.gaussian_moment_flow([0.0], [[1.0]], 1.0, temperature="1", **kw)
    with pytest.raises(ValueError, match="positive semi-definite W_Q"):
        sinkflow.gaussian_moment_flow([0.0], [[1.0]], 1.0, W_K=[[-2.0]], scores="gaussian", **kw)


@pytest.mark.slow
@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_sampling_rate_up_to_1e5_particles_with_landmarks(normalization):
    """Landmark fields (200 Nyström landmarks, W_Q = W_K for a PSD kernel), n = 10^3 ... 10^5, 2 seeds."""
    ns = np.array([1_000, 10_000, 100_000])
    r = sinkflow.gaussian_moment_flow(M0, S0, [1.0], normalization=normalization, W_Q=WQ, W_K=WQ, W_V=WV,
                                      temperature=TAU)
    err = []
    for n in ns:
        e = []
        for seed in range(2):
            x0 = np.random.default_rng(seed).multivariate_normal(M0, S0, size=n)
            X = sinkflow.simulate(x0, normalization, W_Q=WQ, W_K=WQ, W_V=WV, h=0.1, steps=10, integrator="rk4",
                                  temperature=TAU, landmarks=200, save_every=10).final
            e.append(np.linalg.norm(X.mean(0) - r.means[-1]) + np.linalg.norm(np.cov(X.T, bias=True) - r.covs[-1]))
        err.append(np.sqrt(np.mean(np.square(e))))
    slope = np.polyfit(np.log(ns), np.log(err), 1)[0]
    assert -0.7 < slope < -0.35, (slope, err)  # measured -0.45 (SoftMax), -0.47 (Sinkhorn)


@pytest.mark.slow
def test_mean_field_flow_2d_error_is_second_order_in_the_cells():
    eps, m, S = 0.3, np.array([0.3, -0.2]), np.array([[0.5, 0.2], [0.2, 0.35]])
    r = heat_layer_flow(m, S, [0.2], "sinkhorn", eps)
    errs = []
    for G in (64, 128):
        a = np.linspace(-5, 5, G)
        X = np.stack(np.meshgrid(a, a, indexing="ij"), -1) - m
        rho = np.exp(-0.5 * np.einsum("...i,ij,...j", X, np.linalg.inv(S), X))
        rho /= rho.sum() * (a[1] - a[0]) ** 2
        _, C = _grid_moments(sinkflow.mean_field_flow(rho, (a, a), 0.2, normalization="sinkhorn", eps=eps).final,
                             [a, a])
        errs.append(np.abs(C - r.covs[-1]).max())
    assert errs[1] < 2e-3 and errs[0] / errs[1] > 3  # measured 6.8e-3 -> 1.6e-3 (ratio 4.3)
