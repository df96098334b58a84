"""The exact fast fields on the circle and S^2 against independent oracles: the dense field, a direct
quadrature of the expansion coefficients, scipy's Legendre polynomials (addition theorem), POT's Sinkhorn."""

import numpy as np
import ot
import pytest
import torch
from scipy import integrate, special

import sinkflow
from sinkflow.fields import (
    _harmonic_fields,
    _harmonic_kernels,
    attention_field,
    harmonic_attention_field,
    harmonic_kernel,
)
from sinkflow.fields._harmonic_bases import (
    _circle_features,
    _sphere_degrees,
    _sphere_features,
    _SphereBasis,
    _SphereFourierBasis,
)
from sinkflow.fields._harmonic_fields import HarmonicParticleField
from sinkflow.fields._harmonic_kernels import likely_kernel, mean_row_sum


def _particles(n, d, seed, weighted):
    x = sinkflow.random_particles(n, d, seed=seed, manifold="sphere")
    if not weighted:
        return x, None
    a = np.random.default_rng(seed).uniform(0.2, 1.0, n)
    return x, a / a.sum()


def _dense(x, attention, beta, weights, **kw):
    w = None if weights is None else torch.tensor(weights)
    return attention_field(torch.tensor(x), attention, None, None, weights=w, temperature=1 / beta,
                           **kw).velocity.numpy()


def _scipy_harmonics(x, L):
    """Real orthonormal Y_lm from scipy's complex Y_l^m, rows in the order of ``_sphere_degrees``."""
    polar, azimuth = np.arccos(np.clip(x[:, 2], -1, 1)), np.arctan2(x[:, 1], x[:, 0])
    rows = []
    for s in range(L + 1):
        rows.append(special.sph_harm_y(s, 0, polar, azimuth).real)
        for m in range(1, L - s + 1):
            Y = np.sqrt(2) * (-1) ** m * special.sph_harm_y(m + s, m, polar, azimuth)
            rows += [Y.real, Y.imag]
    return np.array(rows)


@pytest.fixture(params=["products", "fourier"])
def sphere_basis(request, monkeypatch):
    """The sphere's products by the product basis or through non-uniform FFTs, whatever the size."""
    fourier = request.param == "fourier"
    monkeypatch.setattr(_harmonic_kernels, "FOURIER_MIN_N", 0 if fourier else 10**18)
    monkeypatch.setattr(_harmonic_kernels, "FOURIER_MIN_ORDER", 0 if fourier else 10**9)
    return _SphereFourierBasis if fourier else _SphereBasis


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("beta", [1.0, 7.0, 40.0])
@pytest.mark.parametrize("weighted", [False, True])
def test_field_equals_dense_field(d, beta, weighted, sphere_basis):
    if d == 2 and sphere_basis is _SphereFourierBasis:
        pytest.skip("the circle has one basis")
    x, a = _particles(240, d, seed=int(beta) + d, weighted=weighted)
    fast = harmonic_attention_field(x, "softmax", temperature=1 / beta, weights=a)
    assert np.abs(fast.velocity - _dense(x, "softmax", beta, a)).max() < 1e-10
    sink = harmonic_attention_field(x, "sinkhorn", temperature=1 / beta, weights=a, tol=1e-13)
    assert sink.converged
    assert np.abs(sink.velocity - _dense(x, "sinkhorn", beta, a, tol=1e-13)).max() < 1e-10
    for n_iter in (1, 2, 5):  # a Sinkformer's fixed half-iterations, row step first
        fixed = harmonic_attention_field(x, "sinkhorn", temperature=1 / beta, weights=a, n_iter=n_iter)
        assert np.abs(fixed.velocity - _dense(x, "sinkhorn", beta, a, n_iter=n_iter)).max() < 1e-10


@pytest.mark.parametrize("beta", [0.3, 5.0, 32.0, 900.0])
def test_coefficients_are_the_kernel_expansion(beta):
    """Direct quadrature: (1/2pi) int e^{beta(cos t - 1)} cos(kt) dt and (1/2) int e^{beta(t - 1)} P_l(t) dt."""
    circle, sphere = harmonic_kernel(1 / beta, 2), harmonic_kernel(1 / beta, 3)
    t = 2 * np.pi * np.arange(8192) / 8192  # trapezoid rule: exponentially accurate for periodic integrands
    k = np.arange(circle.order + 1)
    quad = (np.exp(beta * (np.cos(t) - 1))[None, :] * np.cos(np.outer(k, t))).mean(1)
    np.testing.assert_allclose(circle.coefficients, quad, rtol=1e-9, atol=1e-15)
    nodes, w = np.polynomial.legendre.leggauss(300)
    degrees = np.arange(sphere.order + 1)
    quad = 0.5 * (special.eval_legendre(degrees[:, None], nodes[None, :]) * np.exp(beta * (nodes - 1)) * w).sum(1)
    np.testing.assert_allclose(sphere.coefficients, quad, rtol=1e-8, atol=2e-14)  # rounding of the quadrature sum


@pytest.mark.parametrize("d", [2, 3])
def test_truncation_meets_the_requested_tolerance(d):
    beta, tol, min_weight = 12.0, 1e-9, 1e-3
    ker = harmonic_kernel(1 / beta, d, tol, min_weight)
    budget = tol * min_weight / 4
    t = np.cos(np.linspace(0, np.pi, 2001))
    assert ker.tail <= budget
    assert np.abs(ker(t) - np.exp(beta * (t - 1))).max() <= ker.tail + 1e-14  # + rounding of the sum
    shorter = harmonic_kernel(1 / beta, d, tol * 1e6, min_weight)  # a looser tolerance: a lower order
    assert shorter.order < ker.order
    # the order is the smallest: one order less leaves more than the budget out
    coarser = type(ker)(d, beta, ker.order - 1, ker.coefficients[:-1], 0.0)
    assert np.abs(coarser(t) - np.exp(beta * (t - 1))).max() > budget


def test_sphere_features_obey_the_addition_theorem():
    x = sinkflow.random_particles(40, 3, seed=5, manifold="sphere")
    x[0] = [0.0, 0.0, 1.0]  # a pole: no angle phi there
    F = _sphere_features(torch.tensor(x), 9).numpy()
    cos = np.clip(x @ x.T, -1, 1)
    degrees = _sphere_degrees(9)
    assert np.array_equal(np.bincount(degrees), 2 * np.arange(10) + 1)  # 2l + 1 harmonics of degree l
    for degree in range(10):
        rows = F[degrees == degree]
        np.testing.assert_allclose(rows.T @ rows, (2 * degree + 1) / (4 * np.pi) * special.eval_legendre(degree, cos),
                                   atol=1e-12)


def test_circle_features_are_cos_and_sin():
    """The doubling recurrence of (x1 + i x2)^k against numpy's cos k theta, sin k theta, up to k = 120."""
    theta = np.random.default_rng(3).uniform(0, 2 * np.pi, 50)
    F = _circle_features(torch.tensor(np.stack([np.cos(theta), np.sin(theta)], 1)), 120).numpy()
    k = np.arange(121)[:, None]
    np.testing.assert_allclose(F[:121], np.cos(k * theta), atol=1e-13)
    np.testing.assert_allclose(F[121:], np.sin(k * theta), atol=1e-13)


def test_sphere_features_are_scipy_s_harmonics():
    """The harmonics from the product basis (Fourier coefficients in theta, powers of e^{i phi}) against
    scipy's complex Y_l^m (Condon-Shortley phase (-1)^m): rows sqrt(2) (-1)^m Re / Im Y_l^m, in the order
    of ``_sphere_degrees`` (step s = l - m by step)."""
    x = sinkflow.random_particles(30, 3, seed=4, manifold="sphere")
    L = 30
    np.testing.assert_allclose(_sphere_features(torch.tensor(x), L).numpy(), _scipy_harmonics(x, L), atol=1e-12)


@pytest.mark.parametrize("L", [1, 2, 11, 12, 33])
def test_sphere_kernel_products_are_the_harmonics_products(L, sphere_basis):
    """The products in the basis of cos/sin k theta times e^{im phi} (moments, those of [w, w x] from w alone
    one degree higher, the kernel's sums, the Gram rows), by matrix products or non-uniform FFTs, against
    plain products with scipy's harmonics."""
    x = sinkflow.random_particles(300, 3, seed=L, manifold="sphere")
    x[:2] = [[0.0, 0.0, 1.0], [0.0, 0.0, -1.0]]  # the poles: no angle phi there
    w = np.random.default_rng(L).uniform(0.1, 1.0, 300)
    ker = harmonic_kernel(1 / 60.0, 3)  # order 55
    ker = type(ker)(3, 60.0, L, ker.coefficients[:L + 1], 0.0)
    Phi = _scipy_harmonics(x, L)  # (rank, n)
    values = np.concatenate([w[:, None], w[:, None] * x], 1)
    F = _harmonic_kernels._Factored(ker, torch.tensor(x), keep=False)
    assert type(F.basis) is sphere_basis
    np.testing.assert_allclose(F.position_moments(torch.tensor(w)).numpy(), Phi @ values, atol=1e-12)
    M = F.moments(torch.tensor(values))
    np.testing.assert_allclose(M.numpy(), Phi @ values, atol=1e-12)
    lam = ker.eigenvalues(M).numpy()
    sums = []
    F.sweep(M, lambda i0, i1, R: sums.append(R.clone()))
    np.testing.assert_allclose(torch.cat(sums).numpy(), Phi.T @ (lam[:, None] * (Phi @ values)), atol=1e-12)
    rows = torch.tensor([0, 3, ker.rank - 1, 1])
    G = F.gram(rows, torch.tensor(w))
    np.testing.assert_allclose(G.numpy(), (Phi[rows] * w) @ Phi[rows].T, atol=1e-12)


def test_the_sphere_takes_fourier_products_for_many_particles_at_high_degree():
    x = torch.tensor(sinkflow.random_particles(20_000, 3, seed=0, manifold="sphere"))
    for beta, basis in ((32.0, _SphereFourierBasis), (5.0, _SphereBasis)):
        ker = likely_kernel(1 / beta, 3, 1e-10, 1 / 20_000)
        assert type(ker.basis(x)) is basis and type(ker.basis(x[:1000])) is _SphereBasis
    assert type(ker.basis(x.float())) is _SphereBasis  # float64 only


@pytest.mark.parametrize("d", [2, 3])
def test_a_straggler_takes_the_guaranteed_truncation_and_a_uniform_start_the_likely_one(d):
    # 1,999 particles near one point and a straggler at its antipode: the straggler's row sums to about
    # its own weight 1/n, far below the quarter of the mean row sum the likely truncation is cut for
    # (measured: 1.3e-9 (circle) and 5.5e-10 (S^2) off the dense field when that truncation is kept);
    # the certificate sends the field to the guaranteed one, within 1e-10 (measured 3e-11, 7e-12).
    beta, n = 5.0, 2000
    rng, pole = np.random.default_rng(0), np.eye(d)[0]
    x = pole + 0.05 * rng.normal(size=(n, d))
    x[-1] = -pole
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    likely = likely_kernel(1 / beta, d, 1e-10, 1 / n)
    assert likely.fallback is not None and likely.order < likely.fallback.order
    fast = harmonic_attention_field(x, "softmax", temperature=1 / beta)
    assert fast.kernel.fallback is None and fast.kernel.order == likely.fallback.order
    assert np.abs(fast.velocity - _dense(x, "softmax", beta, None, tol=1e-13)).max() < 1e-10
    uniform = sinkflow.random_particles(n, d, seed=1, manifold="sphere")
    for attention in ("softmax", "sinkhorn"):
        fast = harmonic_attention_field(uniform, attention, temperature=1 / beta)
        assert fast.kernel.order == likely.order
        assert np.abs(fast.velocity - _dense(uniform, attention, beta, None, tol=1e-13)).max() < 1e-10


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn"])
def test_a_flow_with_a_straggler_pays_the_second_evaluation_once(attention, monkeypatch):
    # the straggler's row fails the likely truncation at the first step; the flow then cuts its kernel for
    # half that row and evaluates every later step once
    beta, n, d = 5.0, 2000, 2
    rng, pole = np.random.default_rng(0), np.eye(d)[0]
    x = pole + 0.05 * rng.normal(size=(n, d))
    x[-1] = -pole
    x = torch.tensor(x / np.linalg.norm(x, axis=1, keepdims=True))
    likely = likely_kernel(1 / beta, d, 1e-10, 1 / n)
    calls = []
    evaluate = _harmonic_fields._evaluate_with
    monkeypatch.setattr(_harmonic_fields, "_evaluate_with", lambda kernel, *args: calls.append(kernel.order) or
                        evaluate(kernel, *args))
    field = HarmonicParticleField(attention, None, None, None, None, 1 / beta, 1e-10, 20_000, False, None, True,
                                  True, False, symmetric=True, kernel=likely)
    for _step in range(3):
        v, _ = field.velocity(x)
        dense = attention_field(x, attention, None, None, temperature=1 / beta, tol=1e-13).velocity
        dense = dense - (dense * x).sum(1, keepdim=True) * x
        assert float((v - dense).abs().max()) < 1e-10
        x = torch.nn.functional.normalize(x + 0.1 * v, dim=1)
    # measured: 19, 21, then 21 (SoftMax: the straggler's row is about its own weight, half of it asks for the
    # guaranteed order) or 20 (Sinkhorn)
    safe, following = likely.fallback.order, field.kernel.order
    assert calls == [likely.order, safe, following, following] and likely.order < following <= safe, calls


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("beta", [0.5, 5.0, 40.0])
def test_the_mean_row_sum_is_the_uniform_measure_s_and_the_least(d, beta):
    # the kernel against the uniform measure: trapezoids in the angle on the circle (exact for a periodic
    # analytic integrand), scipy's quad in <x, y> (uniform on [-1, 1], Archimedes) on S^2
    if d == 2:
        uniform = np.exp(beta * (np.cos(np.linspace(0, 2 * np.pi, 4096, endpoint=False)) - 1)).mean()
    else:
        uniform = integrate.quad(lambda t: np.exp(beta * (t - 1)) / 2, -1, 1, epsabs=0, epsrel=1e-13)[0]
    assert mean_row_sum(beta, d) == pytest.approx(uniform, rel=1e-12)
    for seed in range(3):
        x = sinkflow.random_particles(300, d, seed=seed, manifold="sphere")
        assert np.exp(beta * (x @ x.T - 1)).mean() >= mean_row_sum(beta, d) * (1 - 1e-12)


def test_stored_and_recomputed_features_give_one_field(monkeypatch):
    x = sinkflow.random_particles(700, 3, seed=8, manifold="sphere")
    kw = dict(temperature=0.25, tol=1e-12)
    stored = harmonic_attention_field(x, "sinkhorn", **kw)
    monkeypatch.setattr(_harmonic_kernels, "_STORE_BYTES", 0)  # features recomputed block by block
    width = stored.kernel.basis(torch.zeros(1, 3, dtype=torch.float64)).width
    monkeypatch.setattr(_harmonic_kernels, "_BLOCK_BYTES", 8 * width * 100)  # 100 particles a block
    recomputed = harmonic_attention_field(x, "sinkhorn", **kw)
    assert recomputed.kernel.rank == stored.kernel.rank == 484  # L = 21 (22 for any configuration)
    np.testing.assert_allclose(recomputed.velocity, stored.velocity, atol=1e-13)
    assert recomputed.n_iter == stored.n_iter


def test_warm_started_sinkhorn_is_pot_s_in_few_applications():
    """A flow's solve: warm-started from the scaling one Euler step before, it converges to POT's plan in
    at most 8 kernel applications, the final field's included, and so does a cold start (7 and 7 measured
    here, the start scaled as the fixed point is; 11-15 and 9+ by the earlier iterations)."""
    beta, n = 8.0, 400
    x0 = sinkflow.random_particles(n, 2, seed=6, manifold="sphere")
    start = harmonic_attention_field(x0, "sinkhorn", temperature=1 / beta, tol=1e-12)
    v = start.velocity - (start.velocity * x0).sum(1, keepdims=True) * x0
    x = x0 + 0.1 * v
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    warm = harmonic_attention_field(x, "sinkhorn", temperature=1 / beta, tol=1e-12, init_g=start.g)
    cold = harmonic_attention_field(x, "sinkhorn", temperature=1 / beta, tol=1e-12)
    assert warm.converged and cold.converged and max(warm.n_iter, cold.n_iter) <= 8
    a = np.full(n, 1 / n)
    pot = ot.sinkhorn(a, a, -x @ x.T, 1 / beta, stopThr=1e-15, numItermax=100_000)
    np.testing.assert_allclose(warm.velocity, (pot / a[:, None]) @ x, atol=1e-10)
    u = np.exp(warm.g)
    plan = (a * u)[:, None] * np.exp(beta * (np.clip(x @ x.T, -1, 1) - 1)) * (a * u)[None, :]
    assert np.abs(plan - pot).max() < 1e-13


@pytest.mark.parametrize("d", [2, 3])
def test_sinkhorn_scalings_are_pot_s(d):
    beta = 6.0
    x, a = _particles(150, d, seed=11, weighted=True)
    fast = harmonic_attention_field(x, "sinkhorn", temperature=1 / beta, weights=a, tol=1e-13)
    u = np.exp(fast.g)
    kernel = np.exp(beta * (np.clip(x @ x.T, -1, 1) - 1))
    plan = (a * u)[:, None] * kernel * (a * u)[None, :]  # a_i K^inf_ij
    pot = ot.sinkhorn(a, a, -x @ x.T, 1 / beta, stopThr=1e-14, numItermax=100_000)
    assert np.abs(plan - pot).max() < 1e-12
    np.testing.assert_allclose(fast.velocity, (pot / a[:, None]) @ x, atol=1e-10)


def test_simulate_chooses_the_harmonic_field_when_cheaper():
    x0 = sinkflow.random_particles(600, 2, seed=2, manifold="sphere")
    kw = dict(h=0.1, steps=4, manifold="sphere", temperature=0.2)
    for attention in ("softmax", "sinkhorn"):
        fast = sinkflow.simulate(x0, attention, **kw)
        dense = sinkflow.simulate(x0, attention, chunked=False, **kw)
        assert fast.harmonic_order == likely_kernel(0.2, 2, 1e-10, 1 / 600).order and dense.harmonic_order is None
        assert np.abs(fast.final - dense.final).max() < 1e-9
    rotated = np.array([[0.0, -1.0], [1.0, 0.0]])
    assert sinkflow.simulate(x0, "softmax", W_V=rotated, **kw).harmonic_order is None  # not the identity
    assert sinkflow.simulate(x0, "gaussian", **kw).harmonic_order is None
    assert sinkflow.simulate(x0[:100], "softmax", **kw).harmonic_order is None  # small: dense is as fast
    assert sinkflow.simulate(x0 * 2, "softmax", h=0.1, steps=1).harmonic_order is None  # Euclidean


def test_bad_inputs_are_named():
    x = sinkflow.random_particles(10, 2, seed=0, manifold="sphere")
    with pytest.raises(ValueError, match="d"):
        harmonic_kernel(1.0, 4)
    with pytest.raises(ValueError, match="temperature"):
        harmonic_kernel(-1.0, 2)
    with pytest.raises(TypeError, match="tol"):
        harmonic_kernel(1.0, 2, tol="small")
    with pytest.raises(ValueError, match="unit vectors"):
        harmonic_attention_field(2 * x)
    with pytest.raises(ValueError, match="attention"):
        harmonic_attention_field(x, "gaussian")
    with pytest.raises(ValueError, match="shape"):
        harmonic_attention_field(np.ones((3, 4)) / 2)
