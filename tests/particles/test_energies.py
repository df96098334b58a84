"""Sinkhorn attention is a Wasserstein gradient flow; SoftMax is not (docs/theory/gradient_flows.md)."""

import itertools

import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sinkflow
from sinkflow.particles._energies import (
    energy_0,
    energy_gaussian,
    energy_inf,
    energy_log_partition,
    energy_sphere,
    entropic_ot,
    gradient_flow_error,
    jacobian_asymmetry,
)


def spd(d, rng, scale=0.5):
    A = rng.normal(size=(d, d))
    return scale * (A @ A.T) / d + 0.1 * np.eye(d)


def symmetric(d, rng, scale=0.5):
    A = rng.normal(size=(d, d))
    return scale * (A + A.T) / 2


problems = st.tuples(st.integers(0, 10_000), st.integers(3, 25), st.integers(1, 4))


# ---------------------------------------------------------------------------------------
# velocity = -n grad F


@settings(max_examples=12, deadline=None)
@given(problems, st.sampled_from(["sinkhorn", "unnormalized"]), st.booleans())
def test_field_is_minus_n_grad_energy_for_symmetric_W(problem, attention, weighted):
    seed, n, d = problem
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    W = symmetric(d, rng)  # symmetric, not necessarily definite: the theorem needs only W = W^T
    w = rng.random(n) + 0.1 if weighted else None
    err = gradient_flow_error(x, attention, W, None if w is None else w / w.sum())
    # float64 and Sinkhorn to marginal error 1e-13: the envelope gradient is exact to ~1e-11
    assert err <= 1e-6


def test_softmax_is_not_the_gradient_of_its_candidate_energy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 2))
    # O(0.1) mismatch measured (0.24 at n = 40); 1e-2 leaves room and is 1e4 above the Sinkhorn error
    assert gradient_flow_error(x, "softmax", spd(2, rng)) > 1e-2


def test_grad_energy_inf_matches_finite_differences_of_its_value():
    # independent of autograd and of the envelope theorem: central differences of the OT value
    rng = np.random.default_rng(2)
    x = rng.normal(size=(8, 2))
    W = spd(2, rng)
    X = torch.tensor(x, requires_grad=True)
    (g,) = torch.autograd.grad(energy_inf(X, torch.tensor(W)), X)
    eps = 1e-5
    for i, k in [(0, 0), (3, 1), (7, 0)]:
        xp, xm = x.copy(), x.copy()
        xp[i, k] += eps
        xm[i, k] -= eps
        fd = (energy_inf(xp, W, tol=1e-14) - energy_inf(xm, W, tol=1e-14)) / (2 * eps)
        # O(eps^2) truncation (~1e-10) plus rounding of the values / eps (~1e-11)
        assert abs(fd - float(g[i, k])) < 1e-8


def test_sign_convention_values_plus_W_descend_minus_W_ascend():
    rng = np.random.default_rng(3)
    x0 = rng.normal(size=(40, 2))
    W = spd(2, rng)
    down = sinkflow.simulate(x0, "sinkhorn", W_K=W, W_V=W, h=0.01, steps=15, monitors=["energy"]).monitors["energy"]
    up = sinkflow.simulate(x0, "sinkhorn", W_K=W, W_V=-W, h=0.01, steps=15, monitors=["energy"]).monitors["energy"]
    assert np.all(np.diff(down) < 0)
    assert np.all(np.diff(up) > 0)


# ---------------------------------------------------------------------------------------
# Jacobian symmetry


def test_jacobian_symmetric_for_K0_and_Kinf_not_for_softmax():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(12, 2))
    W = spd(2, rng)
    sym_inf = jacobian_asymmetry(x, "sinkhorn", W)
    sym_0 = jacobian_asymmetry(x, "unnormalized", W)
    asym = jacobian_asymmetry(x, "softmax", W)
    # a Hessian is symmetric to rounding (K^0) or to the Sinkhorn tolerance 1e-13 (K^inf)
    assert sym_0 < 1e-12 and sym_inf < 1e-9
    assert asym / max(sym_inf, sym_0) > 1e3
    assert asym > 1e-2


def test_jacobian_asymmetry_decreases_with_sinkhorn_iterations():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(10, 2))
    W = spd(2, rng)
    values = [jacobian_asymmetry(x, "sinkhorn", W, n_iter=k) for k in (1, 3, 9, 27)]
    assert values[0] == pytest.approx(jacobian_asymmetry(x, "softmax", W), rel=1e-12)  # 1 half-iteration = SoftMax
    assert all(a > b for a, b in itertools.pairwise(values))


def test_weighted_jacobian_is_symmetric_after_weighting():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(9, 2))
    w = rng.random(9) + 0.2
    assert jacobian_asymmetry(x, "sinkhorn", spd(2, rng), weights=w / w.sum()) < 1e-9  # diag(a) J = -Hess F


# ---------------------------------------------------------------------------------------
# values


def test_entropic_ot_matches_pot_value_including_the_kl_term():
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(15, 2)), rng.normal(size=(11, 2))
    W = spd(2, rng)
    a, b = rng.random(15) + 0.1, rng.random(11) + 0.1
    a, b = a / a.sum(), b / b.sum()
    M = -x @ W @ y.T
    pi = ot.sinkhorn(a, b, M, reg=1.0, stopThr=1e-14, numItermax=100_000)
    value = (pi * M).sum() + (pi * np.log(pi / np.outer(a, b))).sum()  # int c dpi + KL(pi | a x b)
    ours = entropic_ot(x, y, W, a, b)
    assert ours == pytest.approx(value, abs=1e-10)  # both converged to 1e-13
    assert ours == pytest.approx(ot.solve(M, a, b, reg=1.0).value, abs=1e-7)  # POT's default stopping 1e-9
    # POT's sinkhorn2 returns the linear part only: a different number, hence the care above
    assert abs(ot.sinkhorn2(a, b, M, reg=1.0) - ours) > 1e-2


def test_energy_inf_is_half_self_transport():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(10, 3))
    assert energy_inf(x) == pytest.approx(0.5 * entropic_ot(x, x), rel=1e-12)


def test_closed_forms_for_one_cluster():
    x = np.tile([[0.6, 0.8]], (5, 1))  # a Dirac mass at a unit vector
    assert energy_0(x) == pytest.approx(-0.5 * np.e)
    assert energy_gaussian(x) == pytest.approx(-0.5)  # all distances 0
    assert energy_sphere(x, beta=3.0) == pytest.approx(np.exp(3.0) / 6)
    assert energy_log_partition(x) == pytest.approx(-0.5)
    assert entropic_ot(x, x) == pytest.approx(-1.0)  # only plan: cost -|x|^2, KL 0


def test_torch_energy_keeps_type_and_gradient():
    x = torch.randn(6, 2, dtype=torch.float64, requires_grad=True)
    F = energy_0(x)
    assert isinstance(F, torch.Tensor) and F.requires_grad
    F.backward()
    assert torch.isfinite(x.grad).all()


# ---------------------------------------------------------------------------------------
# bad input


def test_non_symmetric_W_is_rejected_with_the_reason():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(5, 2))
    W = np.array([[1.0, 0.5], [0.0, 1.0]])
    for check in (gradient_flow_error, jacobian_asymmetry):
        with pytest.raises(ValueError, match="symmetric W"):
            check(x, "sinkhorn", W)


@pytest.mark.parametrize("kwargs, match", [
    (dict(W=np.eye(3)), "shape"),
    (dict(weights=np.ones(4) / 4), "shape"),
    (dict(weights=np.ones(5)), "sum to 1"),
    (dict(weights=np.array([0.5, 0.5, 0.0, 0.0, 0.0])), "positive"),
])
def test_bad_energy_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        energy_inf(np.zeros((5, 2)), **kwargs)


def test_non_finite_points_and_unknown_kinds():
    with pytest.raises(ValueError, match="non-finite"):
        energy_0(np.array([[np.nan, 0.0]]))
    with pytest.raises(ValueError, match="attention"):
        gradient_flow_error(np.zeros((3, 2)), "gaussian")
    with pytest.raises(ValueError, match="beta"):
        energy_sphere(np.zeros((3, 2)), beta=0.0)
