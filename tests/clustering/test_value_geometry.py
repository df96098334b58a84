"""Limit geometry of unnormalized self-attention with a general value matrix (docs/theory/value_geometry.md).

Geshkovski, Letrouit, Polyanskiy and Rigollet, "The emergence of clusters in self-attention dynamics"
(NeurIPS 2023, arXiv:2305.05465): dx_i/dt = sum_j P_ij V x_j, P = row-softmax of <Q x_i, K x_j>, in R^d,
read in the rescaled frame z_i = exp(-tV) x_i. Each flow test names the theorem whose hypotheses its
matrices meet; every claim is checked against an oracle written here (closed forms, scipy's ConvexHull and
expm, scipy.special.softmax, a plain gap clustering), with its tolerance stated.
"""

import numpy as np
import pytest
import torch
from scipy.linalg import expm
from scipy.spatial import ConvexHull
from scipy.special import softmax

import sinkflow
from sinkflow.particles import attention_rank


def _rotation(theta):
    return np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])


def _gap_levels(values, gap):
    """Oracle: sorted values split wherever two neighbours are more than ``gap`` apart; the group means."""
    v = np.sort(values)
    cuts = np.flatnonzero(np.diff(v) > gap) + 1
    return [g.mean() for g in np.split(v, cuts)]


def _distinct(points, radius):
    """Oracle: greedy grouping of points within ``radius`` of a group's first point; the group means."""
    groups = []
    for p in points:
        for g in groups:
            if np.linalg.norm(p - g[0]) < radius:
                g.append(p)
                break
        else:
            groups.append([p])
    return np.array([np.mean(g, 0) for g in groups])


# ---------------------------------------------------------------------------------------------- rescaling
def test_rescaled_matches_the_closed_form_of_a_linear_flow():
    # One token: P = [[1]], so dx/dt = V x and x(t) = expm(tV) x0 (scipy); z(t) = x0 for all t.
    # A non-normal V with complex eigenvalues catches exp(+tV), a missing transpose or a wrong time.
    V = np.array([[0.3, 1.2], [-0.7, 0.1]])
    x0 = np.array([[0.8, -0.5]])
    traj = sinkflow.simulate(x0, "softmax", W_V=V, h=0.01, steps=200, integrator="rk4")
    x_exact = np.stack([expm(t * V) @ x0[0] for t in traj.times])
    np.testing.assert_allclose(traj.positions[:, 0], x_exact, rtol=1e-8, atol=1e-9)  # RK4, h = 0.01
    z = traj.rescaled(V)
    np.testing.assert_allclose(z[:, 0], np.broadcast_to(x0[0], z[:, 0].shape), atol=1e-8)


def test_rescaled_keeps_type_dtype_and_ensemble_times():
    V = np.array([[0.5, 0.2], [0.0, -0.3]])
    x0 = np.stack([sinkflow.random_particles(5, 2, seed=s) for s in range(2)])
    ens = sinkflow.simulate(x0, "softmax", W_V=V, h=np.array([0.05, 0.1]), steps=4)
    z = ens.rescaled(V)
    for b, h in enumerate((0.05, 0.1)):  # a time per system: z = x @ expm(-t_b V)^T at each saved step
        want = np.stack([ens.positions[k, b] @ expm(-k * h * V).T for k in range(5)])
        np.testing.assert_allclose(z[:, b], want, rtol=1e-12, atol=1e-12)
    xt = torch.tensor(x0[0], dtype=torch.float32)
    zt = sinkflow.simulate(xt, "softmax", W_V=torch.tensor(V, dtype=torch.float32), steps=3).rescaled(V)
    assert isinstance(zt, torch.Tensor) and zt.dtype == torch.float32


def test_rescaled_errors_name_the_problem():
    traj = sinkflow.simulate(sinkflow.random_particles(4, 2, seed=0), "softmax", steps=2)
    with pytest.raises(ValueError, match="V must be a"):
        traj.rescaled(np.eye(3))
    with pytest.raises(ValueError, match="V must be finite"):
        traj.rescaled(np.array([[np.nan, 0], [0, 1]]))
    sphere = sinkflow.simulate(sinkflow.random_particles(4, 2, seed=0, manifold="sphere"), "softmax",
                               manifold="sphere", steps=2)
    with pytest.raises(ValueError, match="manifold='sphere'"):
        sphere.rescaled(np.eye(2))


# ------------------------------------------------------------------------- d = 1: Boolean attention limit
@pytest.mark.parametrize("x0", [[-1.0, -0.6, -0.35, -0.1, 0.15, 0.4, 0.7, 1.1], [0.1, 0.3, 0.35, 0.6, 0.9, 1.2]])
def test_one_dimensional_attention_tends_to_a_boolean_matrix_of_rank_the_leaders(x0):
    # Hypotheses as in Theorem 2.1: d = 1, V > 0, QK > 0, pairwise distinct initial tokens.
    Q, K, V = 3.0, 1.0, 1.0
    x0 = np.array(x0)[:, None]
    traj = sinkflow.simulate(x0, "softmax", W_Q=[[Q]], W_K=[[K]], W_V=[[V]], h=0.02, steps=200,
                             integrator="rk4", monitors=["attention_rank"], monitor_every=50)
    x, z = traj.final[:, 0], traj.rescaled([[V]])[-1, :, 0]
    P = softmax(Q * K * np.outer(x, x), axis=1)  # the attention at T = 4, recomputed here
    # Oracle: in d = 1 the order of the tokens is kept, so a token with z_i > 0 attends to the largest
    # initial token and one with z_i < 0 to the smallest; P* is that Boolean matrix.
    top, bottom = int(np.argmax(x0)), int(np.argmin(x0))
    P_star = np.zeros_like(P)
    P_star[np.arange(len(x)), np.where(z > 0, top, bottom)] = 1.0
    assert np.abs(P - P_star).max() < 1e-12  # doubly exponential convergence: ~1e-58 at T = 4
    leaders = int((P_star.sum(0) > 0).sum())
    assert np.linalg.matrix_rank(P_star) == leaders == (2 if (z < 0).any() else 1)
    assert attention_rank(P) == (leaders, leaders)
    assert traj.monitors["attention_rank"][-1] == leaders
    assert traj.monitors["attention_leaders"][-1] == leaders


def test_attention_rank_monitor_refuses_ensembles():
    x0 = np.stack([sinkflow.random_particles(4, 2, seed=s) for s in range(2)])
    with pytest.raises(ValueError, match="one system"):
        sinkflow.simulate(x0, "softmax", steps=2, monitors=["attention_rank"])


def test_attention_rank_counts_singular_values_and_leaders():
    P = np.array([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.0, 0.3, 0.7]])
    assert attention_rank(P) == (3, 3)
    assert attention_rank(np.ones((3, 3)) / 3) == (1, 0)
    with pytest.raises(ValueError, match="P must be a square"):
        attention_rank(np.ones((2, 3)))
    with pytest.raises(ValueError, match="rtol"):
        attention_rank(P, rtol=2.0)


# ----------------------------------------------------------------------------- V = I: polytope vertices
def test_identity_value_rescaled_tokens_end_on_the_vertices_of_a_polytope():
    # Hypotheses as in Theorem 3.1: V = I_d and Q^T K positive definite (here Q = I, K = diag(1, 2)).
    x0 = np.random.default_rng(2).uniform(-2, 2, (16, 2))  # spread enough for the attention to sharpen early
    K = np.diag([1.0, 2.0])
    traj = sinkflow.simulate(x0, "softmax", W_K=K, W_V=np.eye(2), h=0.05, steps=160, integrator="rk4")
    z = traj.rescaled(np.eye(2))
    zT = z[-1]
    radius = 1e-2 * np.abs(zT).max()
    assert np.abs(zT - z[-21]).max() < radius  # converged at this resolution over the last unit of time
    centers = _distinct(zT, radius)
    hull = ConvexHull(centers)  # oracle: every distinct limit point is an extreme point of their hull
    assert len(hull.vertices) == len(centers) >= 3
    geometry = sinkflow.limit_geometry(zT, np.eye(2), W=K)
    assert geometry.kind == "polytope vertices" and geometry.count == len(centers)
    assert geometry.theorem == "Theorem 3.1" and geometry.hypotheses is True


# ------------------------------------------------------------------- simple top eigenvalue: hyperplanes
@pytest.mark.parametrize("lam2", [0.5, -0.5])
def test_simple_top_eigenvalue_rescaled_tokens_end_on_at_most_three_hyperplanes(lam2):
    # Hypotheses as in Theorem 4.1: the top eigenvalue lambda_1 = 1 of V is real, positive and simple,
    # and <Q phi_1, K phi_1> = |phi_1|^2 > 0 (Q = K = I).
    R = _rotation(0.5)
    V, phi = R @ np.diag([1.0, lam2]) @ R.T, R[:, 0]
    x0 = np.random.default_rng(2).uniform(-1, 1, (24, 2))
    traj = sinkflow.simulate(x0, "softmax", W_V=V, h=0.05, steps=160, integrator="rk4")
    zT = traj.rescaled(V)[-1]
    tol = 1e-2 * np.linalg.norm(zT, axis=1).max()
    levels = _gap_levels(zT @ phi, tol)  # oracle: cluster the projections on the eigenvector
    assert 1 <= len(levels) <= 3
    # the other coordinate does not cluster: the limit set is hyperplanes, not points
    assert np.ptp(zT @ R[:, 1]) > 10 * tol
    geometry = sinkflow.limit_geometry(zT, V, W=np.eye(2))
    assert geometry.kind == "hyperplanes" and geometry.count == len(levels)
    np.testing.assert_allclose(np.sort(np.abs(geometry.levels)), np.sort(np.abs(levels)), atol=tol)
    assert geometry.theorem == "Theorem 4.1" and geometry.hypotheses is True


# ------------------------------------------------------------- repeated top eigenvalue: polytope x subspace
def test_repeated_top_eigenvalue_projections_end_on_polytope_vertices():
    # Hypotheses as in Theorem 5.1: V = diag(1, 1, -1/2) (the authors' example of a paranormal V) and
    # Q^T K = I positive definite.
    V = np.diag([1.0, 1.0, -0.5])
    x0 = np.random.default_rng(0).uniform(-2, 2, (20, 3))
    zT = sinkflow.simulate(x0, "softmax", W_V=V, h=0.05, steps=160, integrator="rk4").rescaled(V)[-1]
    top = zT[:, :2]  # the top eigenspace
    centers = _distinct(top, 1e-2 * np.linalg.norm(zT, axis=1).max())
    assert len(ConvexHull(centers).vertices) == len(centers) >= 3  # oracle: scipy's hull of the projections
    assert np.ptp(zT[:, 2]) > 1.0  # the third coordinate stays spread: a subspace, not points
    g = sinkflow.limit_geometry(zT, V, W=np.eye(3))
    assert (g.kind, g.count, g.theorem, g.hypotheses) == ("polytope x subspace", len(centers), "Theorem 5.1", True)


# ---------------------------------------------------------------------------------- limit_geometry alone
def test_limit_geometry_classifies_constructed_end_states():
    square = np.array([[1.0, 1], [1, -1], [-1, 1], [-1, -1]])
    assert sinkflow.limit_geometry(square).kind == "polytope vertices"
    inside = sinkflow.limit_geometry(np.vstack([square, [[0.2, 0.1]]]))
    assert inside.kind == "undetermined" and "not vertices" in inside.reason
    collinear = sinkflow.limit_geometry(np.array([[0.0, 0], [1, 1], [2, 2]]))
    assert collinear.kind == "undetermined"
    V = np.diag([2.0, 0.5])
    three = np.array([[-1.0, 0.3], [0.0, -2.0], [1.5, 0.7], [1.5, -0.2]])
    g = sinkflow.limit_geometry(three, V, W=np.eye(2))
    assert (g.kind, g.count) == ("hyperplanes", 3)
    np.testing.assert_allclose(g.levels, [-1.0, 0.0, 1.5])
    four = np.array([[-1.0, 0.3], [0.0, -2.0], [1.5, 0.7], [0.7, -0.2]])
    assert sinkflow.limit_geometry(four, V).kind == "undetermined"
    # a repeated top eigenvalue: vertices in the top eigenspace, anything along the rest (Theorem 5.1)
    V3 = np.diag([1.0, 1.0, -0.5])
    z3 = np.array([[1.0, 0, 5], [0, 1, -3], [-1, -1, 0.2], [1.0, 0, -2]])
    g3 = sinkflow.limit_geometry(z3, V3, W=np.eye(3))
    assert (g3.kind, g3.count, g3.theorem, g3.hypotheses) == ("polytope x subspace", 3, "Theorem 5.1", True)
    # sign conditions not met: <Q phi_1, K phi_1> < 0
    assert sinkflow.limit_geometry(three, V, W=-np.eye(2)).hypotheses is False
    assert sinkflow.limit_geometry(square, -np.eye(2)).kind == "undetermined"
    assert "LimitGeometry" in repr(g) and len(repr(g).splitlines()) <= 6


def test_limit_geometry_errors_name_the_argument():
    z = np.zeros((3, 2))
    with pytest.raises(ValueError, match="z must be an"):
        sinkflow.limit_geometry(np.zeros(3))
    with pytest.raises(ValueError, match="z must be finite"):
        sinkflow.limit_geometry(np.full((3, 2), np.inf))
    with pytest.raises(ValueError, match="V must be a"):
        sinkflow.limit_geometry(z, np.eye(3))
    with pytest.raises(ValueError, match="W must be finite"):
        sinkflow.limit_geometry(z, W=np.full((2, 2), np.nan))
    with pytest.raises(ValueError, match="tol"):
        sinkflow.limit_geometry(z, tol=1.5)


# ------------------------------------------------------------------------------------ Sinkhorn, any V
def test_sinkhorn_is_a_gradient_flow_only_for_values_equal_to_the_symmetric_form():
    x = np.random.default_rng(0).normal(size=(12, 2))
    W = np.array([[1.0, 0.4], [0.4, 0.7]])
    assert sinkflow.gradient_flow_error(x, "sinkhorn", W=W) < 1e-9
    assert sinkflow.gradient_flow_error(x, "sinkhorn", W=W, W_V=W) < 1e-9
    # V = 3W: the same flow in time 3t; the error is |3 - 1| / 3 (closed form)
    assert abs(sinkflow.gradient_flow_error(x, "sinkhorn", W=W, W_V=3 * W) - 2 / 3) < 1e-9
    # V = I + S, S a quarter turn: |K S x| / |K (I + S) x| = 1 / sqrt(2) (closed form, W = I)
    S = np.array([[0.0, 1.0], [-1.0, 0.0]])
    assert abs(sinkflow.gradient_flow_error(x, "sinkhorn", W_V=np.eye(2) + S) - 2 ** -0.5) < 1e-9


def test_sinkhorn_barycenter_follows_the_linear_flow_for_any_value_matrix():
    # Doubly stochastic K (uniform weights): d/dt mean(x) = V mean(x), so mean(x(t)) = expm(tV) mean(x0)
    # for any W and V (closed form); SoftMax has no such law.
    x0 = np.random.default_rng(4).normal(size=(10, 2))
    W_K = np.array([[1.0, 0.5], [-0.3, 0.8]])
    V = np.array([[0.4, -1.0], [0.6, -0.2]])
    for attention, close in (("sinkhorn", True), ("softmax", False)):
        traj = sinkflow.simulate(x0, attention, W_K=W_K, W_V=V, h=0.05, steps=30, integrator="rk4")
        want = expm(1.5 * V) @ x0.mean(0)
        err = np.linalg.norm(traj.final.mean(0) - want) / np.linalg.norm(want)
        assert (err < 1e-6) if close else (err > 1e-2), (attention, err)


def test_sinkhorn_energy_still_decreases_when_the_symmetric_part_of_v_w_inverse_is_positive():
    # T_i = -V W^{-1} grad_i F / a_i, so dF/dt = -sum_i g_i^T V W^{-1} g_i / a_i <= 0 when V W^{-1} + (V W^{-1})^T
    # is positive semi-definite: F^inf is a Lyapunov function without being the flow's potential.
    x0 = np.random.default_rng(5).normal(size=(10, 2))
    S = np.array([[0.0, 1.0], [-1.0, 0.0]])
    traj = sinkflow.simulate(x0, "sinkhorn", W_V=np.eye(2) + 2 * S, h=0.01, steps=60, integrator="rk4",
                             monitors=["energy"])
    assert np.all(np.diff(traj.monitors["energy"]) <= 1e-12)
    assert sinkflow.gradient_flow_error(traj.final, "sinkhorn", W_V=np.eye(2) + 2 * S) > 0.5
