"""Ensembles in simulate: every system of a batch evolves as it does alone (float64, 1e-12)."""

import numpy as np
import pytest
import torch

import sinkflow
import sinkflow.particles._ensembles as ensembles

MONITORS = ["energy", "marginal_errors", "clusters"]


def _sphere(shape, seed):
    x = np.random.default_rng(seed).standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _assert_as_alone(batched, alone, index):
    """Positions, times, monitors and iteration counts of system ``index`` equal its own run."""
    np.testing.assert_allclose(batched.positions[(slice(None),) + index], alone.positions, rtol=0, atol=1e-12)
    assert np.array_equal(batched.sinkhorn_iterations[(slice(None),) + index], alone.sinkhorn_iterations)
    assert batched.converged[index] == alone.converged
    for key, values in alone.monitors.items():
        np.testing.assert_allclose(batched.monitors[key][(slice(None),) + index], values, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attention, n_iter, integrator, manifold", [
    ("sinkhorn", None, "euler", "sphere"), ("sinkhorn", None, "rk4", "euclidean"), ("sinkhorn", 3, "rk4", "sphere"),
    ("softmax", None, "euler", "euclidean"), ("unnormalized", None, "rk4", "euclidean"),
    ("gaussian", None, "euler", "sphere"),
])
def test_each_system_of_a_batch_evolves_as_alone(attention, n_iter, integrator, manifold):
    if manifold == "sphere":
        x0 = _sphere((2, 3, 7, 2), seed=1)
    else:
        x0 = 0.3 * np.random.default_rng(1).standard_normal((2, 3, 7, 2))
    temperature = np.array([[0.8], [2.0]])  # broadcast against the batch (2, 3)
    kwargs = dict(h=0.05, steps=6, n_iter=n_iter, integrator=integrator, manifold=manifold, monitors=MONITORS)
    batched = sinkflow.simulate(x0, attention, temperature=temperature, **kwargs)
    assert batched.positions.shape == (7, 2, 3, 7, 2) and batched.monitors["energy"].shape == (7, 2, 3)
    assert batched.temperature.shape == (2, 3) and batched.sinkhorn_iterations.shape == (6, 2, 3)
    assert batched.h == 0.05 and batched.times.shape == (7,)  # one h: one time axis
    for i in range(2):
        for j in range(3):
            alone = sinkflow.simulate(x0[i, j], attention, temperature=float(temperature[i, 0]), **kwargs)
            _assert_as_alone(batched, alone, (i, j))


def test_per_system_step_sizes_matrices_and_weights_broadcast():
    rng = np.random.default_rng(2)
    x0 = 0.6 * rng.standard_normal((3, 6, 2))
    h = np.array([0.02, 0.05, 0.1])
    W_K = np.stack([np.eye(2), [[1.0, 0.3], [0.3, 2.0]], 0.5 * np.eye(2)])  # symmetric PSD: one batched flow
    weights = rng.random((3, 6))
    weights /= weights.sum(-1, keepdims=True)
    for n_iter in (None, 4):
        batched = sinkflow.simulate(x0, "sinkhorn", W_K=W_K, h=h, steps=5, weights=weights, n_iter=n_iter,
                                    monitors=["energy", "marginal_errors"])
        assert batched.times.shape == (6, 3)
        for b in range(3):
            alone = sinkflow.simulate(x0[b], "sinkhorn", W_K=W_K[b], h=h[b], steps=5, weights=weights[b],
                                      n_iter=n_iter, monitors=["energy", "marginal_errors"])
            _assert_as_alone(batched, alone, (b,))
            np.testing.assert_allclose(batched.times[:, b], alone.times, rtol=1e-15)


def test_systems_the_batched_flow_cannot_take_run_one_by_one():
    rng = np.random.default_rng(3)
    x0 = 0.6 * rng.standard_normal((2, 6, 2))
    W_K = np.array([[1.0, 0.4], [-0.3, 1.0]])  # not symmetric: Sinkhorn to tolerance system by system
    batched = sinkflow.simulate(x0, "sinkhorn", W_K=W_K, h=0.05, steps=4, monitors=["marginal_errors"])
    landmark = sinkflow.simulate(x0, "softmax", h=0.05, steps=3, landmarks=4, landmark_sampling="uniform")
    for b in range(2):
        _assert_as_alone(batched, sinkflow.simulate(x0[b], "sinkhorn", W_K=W_K, h=0.05, steps=4,
                                                    monitors=["marginal_errors"]), (b,))
        _assert_as_alone(landmark, sinkflow.simulate(x0[b], "softmax", h=0.05, steps=3, landmarks=4,
                                                     landmark_sampling="uniform"), (b,))


def test_a_batch_too_large_for_memory_runs_in_chunks(monkeypatch):
    x0 = _sphere((5, 6, 3), seed=4)
    whole = sinkflow.simulate(x0, "sinkhorn", h=0.1, steps=4, manifold="sphere", temperature=0.5)
    monkeypatch.setattr(ensembles, "DENSE_BYTES_LIMIT", 2 * 6 * 36 * 8)  # two systems per chunk
    chunked = sinkflow.simulate(x0, "sinkhorn", h=0.1, steps=4, manifold="sphere", temperature=0.5)
    np.testing.assert_array_equal(chunked.positions, whole.positions)
    assert np.array_equal(chunked.sinkhorn_iterations, whole.sinkhorn_iterations)


def test_torch_in_torch_out_and_systems_that_converge_at_their_own_pace():
    x0 = torch.as_tensor(_sphere((2, 8, 2), seed=5))
    temperature = [10.0, 0.02]
    traj = sinkflow.simulate(x0, "sinkhorn", h=0.005, steps=4, manifold="sphere",
                             temperature=torch.tensor(temperature, dtype=torch.float64))
    assert isinstance(traj.positions, torch.Tensor) and traj.positions.shape == (5, 2, 8, 2)
    assert traj.converged.all()
    for b in range(2):  # each system stops when it has converged: its own count, not the batch's
        alone = sinkflow.simulate(x0[b], "sinkhorn", h=0.005, steps=4, manifold="sphere", temperature=temperature[b])
        assert np.array_equal(traj.sinkhorn_iterations[:, b], alone.sinkhorn_iterations)
        torch.testing.assert_close(traj.positions[:, b], alone.positions, rtol=0, atol=1e-12)
    assert not np.array_equal(traj.sinkhorn_iterations[:, 0], traj.sinkhorn_iterations[:, 1])


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(temperature=np.array([1.0, -0.5, 1.0])), ValueError, "temperature[1]"),
    (dict(temperature=np.array([1.0, 2.0])), ValueError, "of temperature do not broadcast"),
    (dict(h=np.zeros(3)), ValueError, "h must be positive"),
    (dict(W_K=np.ones((4, 2, 2))), ValueError, "of W_K do not broadcast"),
    (dict(weights=np.full((2, 5), 0.2)), ValueError, "of weights do not broadcast"),
    (dict(temperature=np.array(["a", "b", "c"])), TypeError, "temperature"),
])
def test_bad_batches_name_the_parameter(kwargs, error, words):
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        sinkflow.simulate(np.zeros((3, 5, 2)) + np.eye(5, 2), "sinkhorn", steps=1, **kwargs)
