"""Two cases of geomloss's test suite through solve_sinkhorn: a cold 1-D Gaussian transport in float32, and the
symmetry of the potentials under transposition (in the gauge the SinkhornResult docstring fixes)."""

import math
import warnings

import numpy as np
import pytest
import torch

import sinkflow
from sinkflow.attention._solver import _RATE_WINDOW, _predicted_steps


@pytest.mark.parametrize("history, tol, expected", [
    ([math.inf] * _RATE_WINDOW + [1.0] * _RATE_WINDOW, 1e-5, None),  # an overflowed first window: no reading
    ([1.0] * _RATE_WINDOW + [0.5] * _RATE_WINDOW, 0.0, math.inf),  # tol = 0: no geometric rate reaches it
    ([1.0] * _RATE_WINDOW + [0.0] * _RATE_WINDOW, 1e-5, 0.0),
    ([1e300] * _RATE_WINDOW + [1e-20] * _RATE_WINDOW, 1e-5, 0.0),  # was -1.17 half-steps
    ([1.0] * _RATE_WINDOW + [math.nan] * _RATE_WINDOW, 1e-5, math.inf),  # was nan
])
def test_predicted_steps_never_hands_math_log_a_rate_it_cannot_take(history, tol, expected):
    # the first three were "ValueError: math domain error" out of solve_sinkhorn
    assert _predicted_steps(history, tol) == expected


def _gaussians(n, m, dtype=torch.float32):
    x, y = np.linspace(0, 1, n), np.linspace(0, 1, m)
    a, b = np.exp(-(x - 0.3) ** 2 / (2 * 0.1 ** 2)), np.exp(-(y - 0.6) ** 2 / (2 * 0.1 ** 2))
    C = (x[:, None] - y[None, :]) ** 2 / 2
    return (torch.tensor(v, dtype=dtype) for v in (C, a / a.sum(), b / b.sum()))


@pytest.mark.parametrize("scale", [0.5, 1.0])
def test_geomloss_gaussians_in_float32_converge_or_say_why(scale):
    C, a, b = _gaussians(52, 51)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = sinkflow.solve_sinkhorn(-C / scale / 1e-4, a=a, b=b)
    said = [w for w in caught if issubclass(w.category, sinkflow.SinkhornWarning)]
    assert res.converged or (said and res.marginal_error > res.tol)
    assert math.isfinite(res.marginal_error)
    assert torch.isfinite(res.f).all() and torch.isfinite(res.g).all()
    if res.converged:
        assert res.marginal_error <= res.tol


def _ot_potentials(res, reg):
    """geomloss's potentials F, G (plan a_i b_j exp((F_i + G_j - C_ij) / reg)) in the gauge <a, F> = <b, G>."""
    F, G = reg * res.f, reg * (res.g - np.log(res.b))
    c = 0.5 * (res.a @ F - res.b @ G)
    return F - c, G + c


def test_geomloss_symmetry_holds_in_the_balanced_gauge():
    a = b = np.array([0.5, 0.5])
    C, reg = np.array([[-2.0, 0.0], [0.0, 0.0]]), 0.0625
    r1, r2 = sinkflow.solve_sinkhorn(-C / reg, a=a, b=b), sinkflow.solve_sinkhorn(-C.T / reg, a=b, b=a)
    # the raw potentials differ by a constant: f of C is g of C^T only up to the gauge (and log b)
    assert np.ptp(r1.f - r2.g) < 1e-4 and abs((r1.f - r2.g)[0]) > 0.5
    F1, G1 = _ot_potentials(r1, reg)
    F2, G2 = _ot_potentials(r2, reg)
    assert np.abs(F1 - G2).max() < 1e-3 and np.abs(G1 - F2).max() < 1e-3


def test_the_symmetry_in_the_balanced_gauge_with_unequal_weights():
    rng = np.random.default_rng(0)
    C, reg = rng.random((5, 4)), 0.1
    a, b = rng.random(5), rng.random(4)
    a, b = a / a.sum(), b / b.sum()
    r1, r2 = sinkflow.solve_sinkhorn(-C / reg, a=a, b=b), sinkflow.solve_sinkhorn(-C.T / reg, a=b, b=a)
    F1, G1 = _ot_potentials(r1, reg)
    F2, G2 = _ot_potentials(r2, reg)
    assert np.abs(F1 - G2).max() < 1e-6 and np.abs(G1 - F2).max() < 1e-6
