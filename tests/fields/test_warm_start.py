"""The warm start of a symmetric solve to tolerance (the polynomial extrapolation of the potentials
``w = g + m/2``) and the Cholesky form of Newton's step, against independent oracles."""

import numpy as np
import pytest
import torch

import sinkflow
from sinkflow.attention._symmetric_sinkhorn import _cholesky_newton, _kernel
from sinkflow.fields._particle_field import EXTRAPOLATED, ParticleField, _extrapolated


@pytest.mark.parametrize("count", range(1, EXTRAPOLATED + 1))
def test_the_extrapolation_is_the_interpolating_polynomials_next_value(count):
    rng = np.random.default_rng(count)
    t = np.arange(count + 1.0)
    coefficients = rng.standard_normal((3, count))  # three polynomials of degree count - 1
    values = np.stack([np.polyval(c, t) for c in coefficients], axis=1)  # (count + 1, 3)
    past = values[:-1]
    np.testing.assert_allclose(_extrapolated(past), values[-1], rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(_extrapolated(torch.as_tensor(past)).numpy(), values[-1], rtol=1e-12, atol=1e-9)


def test_the_cholesky_newton_step_is_the_plain_solve():
    rng = np.random.default_rng(0)
    x = 1.5 * rng.standard_normal((40, 2))
    C = x @ x.T / 0.2
    E, _ = _kernel(C.copy())
    u, F = np.exp(rng.standard_normal(40)), rng.standard_normal(40)
    s = E @ u
    K = E * u[None, :] / s[:, None]  # rows of diag(1/s) E diag(u) sum to 1
    oracle = np.linalg.solve(np.eye(40) + K, F)
    np.testing.assert_allclose(_cholesky_newton(E, u, s, F), oracle, rtol=1e-10, atol=1e-12)


def test_a_flow_in_the_plane_takes_one_newton_step_and_the_cold_flows_positions():
    # W_V = I spreads the particles like e^t, and m_i = |x_i|^2 / tau with them: the potentials g carry
    # that fast change, w = g + m/2 does not; extrapolated from six past w, one Newton step reaches 1e-10
    x0 = sinkflow.random_particles(48, 2, seed=3)
    kw = dict(h=0.05, steps=40, temperature=0.2)
    warm = sinkflow.simulate(x0, "sinkhorn", **kw)
    cold = sinkflow.simulate(x0, "sinkhorn", warm_start=False, **kw)
    assert warm.converged and cold.converged
    assert (warm.sinkhorn_iterations[EXTRAPOLATED + 1:] == 1).all()
    scale = np.abs(cold.positions).max()
    np.testing.assert_allclose(warm.positions / scale, cold.positions / scale, rtol=0, atol=1e-10)


def test_the_warm_start_extrapolates_w_not_g():
    # in a flow whose positions move along a line, w is constant when m is the only change (a single
    # particle's norm grows: its g falls like -m/2 while w stays put); the start must give back g_now
    field = ParticleField("sinkhorn", W=None, W_V=None, n_iter=None, weights=None, temperature=0.5, tol=1e-12,
                          max_iter=200, chunked=False, landmarks=None, warm_start=True, sphere=False,
                          need_errors=False, symmetric=True)
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    field.velocity(X)
    half = (X * X).sum(-1) / (2 * 0.5)
    np.testing.assert_allclose(field.history[0][-1], (field.g + half).numpy(), rtol=0, atol=1e-15)
    Y = 1.1 * X
    start = field._start(0, field._half_norms(Y))
    np.testing.assert_allclose(start.numpy(), (field.g + half - (Y * Y).sum(-1) / (2 * 0.5)).numpy(), atol=1e-14)
