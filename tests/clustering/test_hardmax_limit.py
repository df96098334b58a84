"""Hardmax layers as Frank-Wolfe steps: straight paths to dominant points (PSD B), the O(1/t) energy (NSD B),
and the finite-beta dwell (docs/theory/hardmax.md)."""

import numpy as np
import pytest

from sinkflow.clustering import frank_wolfe_energy, hardmax_dwell, hardmax_flow, hardmax_targets


def _brute_targets(x, B):
    """Plain loops: j*(i) = argmax_j <B x_i, x_j>, kept where j* is its own argmax."""
    n = len(x)
    best = [max(range(n), key=lambda j, i=i: x[i] @ B @ x[j]) for i in range(n)]
    return [best[i] if best[best[i]] == best[i] else -1 for i in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_psd_tokens_move_on_straight_lines_to_their_dominant_points(seed):
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(3, 3))
    B = M @ M.T
    x0 = rng.normal(size=(25, 3))
    pred = hardmax_targets(x0, B)
    assert list(pred.index) == _brute_targets(x0, B)
    assert pred.predicted.sum() >= 20  # not vacuous
    h, steps = 0.3, 80
    X = hardmax_flow(x0, B, h, steps)
    idx = np.flatnonzero(pred.predicted)
    direction = x0[idx] - pred.targets[idx]
    unit = direction / np.maximum(np.linalg.norm(direction, axis=-1, keepdims=True), 1e-300)
    rel = X[:, idx] - pred.targets[idx]
    off_line = rel - (rel * unit).sum(-1, keepdims=True) * unit  # distance from the line x* + s (x0 - x*)
    assert np.abs(off_line).max() < 1e-12
    np.testing.assert_allclose(X[:, idx], pred.path(np.arange(steps + 1), h)[:, idx], rtol=0, atol=1e-12)
    np.testing.assert_allclose(X[-1, idx], pred.targets[idx], rtol=0, atol=1e-10)  # 0.7^80 ~ 4e-13
    still = X[:, pred.stationary]
    np.testing.assert_array_equal(still, np.broadcast_to(x0[pred.stationary], still.shape))


def test_a_hull_vertex_outside_its_own_cell_moves():
    x0 = np.array([[1.0, 0.0], [0.0, 1.0], [0.2, 0.1]])  # all three are hull vertices
    pred = hardmax_targets(x0, np.eye(2))
    assert list(pred.stationary) == [True, True, False] and list(pred.index) == [0, 1, 0]
    X = hardmax_flow(x0, np.eye(2), 0.5, 40)
    np.testing.assert_allclose(X[-1, 2], [1.0, 0.0], atol=1e-11)
    assert (X[:, :2] == x0[:2]).all()


def test_targets_refuse_indefinite_matrices():
    with pytest.raises(ValueError, match="B must be positive semidefinite"):
        hardmax_targets(np.eye(2), np.diag([1.0, -1.0]))
    with pytest.raises(ValueError, match="h must be in"):
        hardmax_flow(np.eye(2), np.eye(2), 1.5, 3)


def _hull_min_oracle(x):
    """1/2 dist(0, conv x)^2 in the plane: 0 inside a full hull (scipy's facets), else the nearest segment
    between two tokens (the hull's boundary is made of such segments; a flat hull is one)."""
    from scipy.spatial import ConvexHull, QhullError

    try:
        if np.all(ConvexHull(x).equations[:, -1] <= 0):  # 0 satisfies every facet inequality a.y + b <= 0
            return 0.0
    except QhullError:
        pass
    best = np.linalg.norm(x, axis=1).min()
    for a in range(len(x)):
        for b in range(a + 1, len(x)):
            p, q = x[a], x[b]
            if np.allclose(p, q):
                continue
            s = np.clip(-(p @ (q - p)) / ((q - p) @ (q - p)), 0, 1)
            best = min(best, np.linalg.norm(p + s * (q - p)))
    return 0.5 * best**2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nsd_energy_is_monotone_and_below_the_frank_wolfe_bound(seed):
    rng = np.random.default_rng(seed)
    x0 = rng.normal(size=(12, 2)) + [0.5, 0.0]
    X = hardmax_flow(x0, -np.eye(2), "frank-wolfe", 100)
    E, bound = frank_wolfe_energy(X, -np.eye(2))
    assert np.all(np.diff(E) <= 1e-10) and np.all(E <= bound + 1e-12)
    f = 0.5 * (X**2).sum(-1).max(-1)
    for t in (0, 1, 5, 50):  # the quadratic program against the planar geometry
        assert abs(E[t] - (f[t] - _hull_min_oracle(X[t]))) < 1e-8
    assert E[-1] < 0.2 * E[1]


def test_finite_beta_dwell_grows_with_beta():
    x0 = [[1.0, 0.0], [-0.5, 0.8], [-0.5, -0.8], [0.3, 0.1]]
    dwell = [hardmax_dwell(x0, np.eye(2), b, radius=0.1) for b in (7.0, 8.0, 9.0)]
    slope = np.polyfit([7.0, 8.0, 9.0], np.log(dwell), 1)[0]
    assert dwell[0] > 0 and 0.8 < slope < 2.0  # exponential in beta (measured ~1.3 per unit of beta)
