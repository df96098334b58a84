"""A ``simulate`` step is the flow's tensor operations: its path is chosen once per call, and what it
computes is the plain loop's (benchmarks/bench_step_overhead.py times the two)."""

import numpy as np
import pytest
import torch
from scipy.special import logsumexp, softmax

import sinkflow
from sinkflow.fields import _particle_field
from sinkflow.particles import _integrators

BETA, H = 4.0, 0.05


def _reference(x, steps, sphere, n_iter):
    """The flow in plain numpy float64: SoftMax (``n_iter=None``) or ``n_iter`` log-domain Sinkhorn
    half-iterations from zero (row, column, ...; columns summing to 1), the velocity projected on the
    sphere's tangent spaces and each state renormalized there."""
    out = [x]
    for _ in range(steps):
        C = BETA * x @ x.T
        if n_iter is None:
            K = softmax(C, axis=1)
        else:
            f, g = np.zeros(len(x)), np.zeros(len(x))
            for k in range(n_iter):
                if k % 2 == 0:
                    f = -logsumexp(C + g[None, :], axis=1)
                else:
                    g = -logsumexp(C + f[:, None], axis=0)
            K = np.exp(f[:, None] + C + g[None, :])
        v = K @ x
        if sphere:
            v = v - (v * x).sum(1, keepdims=True) * x
        x = x + H * v
        if sphere:
            x = x / np.linalg.norm(x, axis=1, keepdims=True)
        out.append(x)
    return np.array(out)


@pytest.mark.parametrize("manifold", ["euclidean", "sphere"])
@pytest.mark.parametrize(("attention", "n_iter"), [("softmax", None), ("sinkhorn", 3), ("sinkhorn", 4)])
def test_a_step_computes_the_plain_loops_flow(manifold, attention, n_iter):
    x0 = sinkflow.random_particles(16, 2, seed=5, manifold=manifold)
    traj = sinkflow.simulate(torch.as_tensor(x0), attention, h=H, steps=30, n_iter=n_iter, temperature=1 / BETA,
                             manifold=manifold, progress=False)
    expected = _reference(x0, 30, manifold == "sphere", n_iter)
    np.testing.assert_allclose(traj.positions.numpy(), expected, rtol=0, atol=1e-12)  # float64 rounding over 30 steps
    assert np.array_equal(traj.sinkhorn_iterations, np.full(30, 0 if n_iter is None else n_iter))


@pytest.mark.parametrize("integrator", ["euler", "rk4"])
@pytest.mark.parametrize("attention", ["softmax", "sinkhorn", "unnormalized"])
def test_the_evaluation_path_is_chosen_once_per_call(monkeypatch, integrator, attention):
    chosen = []
    original = _particle_field.field_evaluator

    def counted(*args, **kwargs):
        chosen.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(_particle_field, "field_evaluator", counted)
    x0 = sinkflow.random_particles(12, 2, seed=1, scale=0.3)
    traj = sinkflow.simulate(x0, attention, h=0.02, steps=9, integrator=integrator, progress=False)
    assert len(chosen) == 1 and traj.positions.shape == (10, 12, 2)


def _blow_up_message(**kwargs):
    x0 = 10 * np.ones((3, 2)) + np.eye(3, 2)
    with pytest.raises(FloatingPointError, match="floating-point range") as error:
        sinkflow.simulate(x0, "unnormalized", h=1.0, steps=40, **kwargs)
    return str(error.value)


def test_the_states_checked_in_blocks_name_the_first_non_finite_step():
    """Saving every state of a dense unnormalized flow, the states are checked every CHECK_EVERY steps; the
    error names the same step as the check of every state (with a monitor, or saving every other state)."""
    assert _integrators.CHECK_EVERY > 2  # the blow-up below (step 2) lies inside the first block
    in_blocks = _blow_up_message()
    assert "at step 2 " in in_blocks
    assert _blow_up_message(monitors=["clusters"]) == in_blocks
    assert _blow_up_message(save_every=2) == in_blocks


def test_a_blow_up_past_the_last_full_block_is_found_at_the_end():
    x0 = 10 * np.ones((3, 2)) + np.eye(3, 2)
    with pytest.raises(FloatingPointError, match="at step 2 "):
        sinkflow.simulate(x0, "unnormalized", h=1.0, steps=3)  # fewer steps than one block
