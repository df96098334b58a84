"""A ``simulate`` step is the flow's tensor operations: its path is chosen once per call, and what it
computes is the plain loop's (benchmarks/bench_step_overhead.py times the two)."""

import numpy as np
import pytest
import torch
from scipy.special import logsumexp, softmax

import sinkflow
from sinkflow.fields import _dense_fields, _particle_field
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


def _general_steps_only(monkeypatch):
    monkeypatch.setattr(_integrators, "_lean_stepper", lambda *args: None)


@pytest.mark.parametrize("save_every", [1, 3])
@pytest.mark.parametrize("shape", [(16, 2), (8, 12, 3)])
@pytest.mark.parametrize("manifold", ["euclidean", "sphere"])
@pytest.mark.parametrize(("attention", "n_iter"), [("softmax", None), ("sinkhorn", 3), ("unnormalized", None)])
def test_the_lean_steps_are_the_general_steps(monkeypatch, attention, n_iter, manifold, shape, save_every):
    """After its first step a run of a fixed count without monitors takes the field's euler_stepper: the same
    operations as the general step (velocity, tangent projection, step, retraction), so the same states to the
    last bit, and the same iteration counts."""
    x0 = np.random.default_rng(3).standard_normal(shape)
    x0 = x0 / np.linalg.norm(x0, axis=-1, keepdims=True) if manifold == "sphere" else 0.2 * x0  # e^C stays finite
    kwargs = dict(h=H, steps=11, n_iter=n_iter, temperature=1.0, manifold=manifold, save_every=save_every,
                  progress=False)
    lean = sinkflow.simulate(torch.as_tensor(x0), attention, **kwargs)
    _general_steps_only(monkeypatch)
    general = sinkflow.simulate(torch.as_tensor(x0), attention, **kwargs)
    assert torch.equal(lean.positions, general.positions) and lean.positions.shape[0] == (12 if save_every == 1 else 5)
    assert np.array_equal(lean.sinkhorn_iterations, general.sinkhorn_iterations)
    assert np.array_equal(lean.converged, general.converged)


def _evaluations(monkeypatch):
    """Counts of the dense evaluator's full evaluations and of its lean velocities."""
    counts = {"full": 0, "lean": 0}
    cls = _dense_fields._DenseEvaluator
    full, lean = cls.__call__, cls.velocity

    def counted(name, method):
        def call(self, *args):
            counts[name] += 1
            return method(self, *args)

        return call

    monkeypatch.setattr(cls, "__call__", counted("full", full))
    monkeypatch.setattr(cls, "velocity", counted("lean", lean))
    return counts


@pytest.mark.parametrize(("kwargs", "lean_steps"), [
    (dict(), 8),  # SoftMax, fixed count, no monitors: the first step chooses the evaluation, the rest are lean
    (dict(x0=np.random.default_rng(4).standard_normal((8, 10, 2))), 8),  # 8 systems: the batched torch field
    (dict(monitors=["clusters"]), 0),  # a monitor needs each evaluation
    (dict(integrator="rk4"), 0),
    (dict(x0=torch.ones(10, 2, dtype=torch.float64).cumsum(0).requires_grad_()), 0),  # an autograd graph
])
def test_which_runs_take_lean_steps(monkeypatch, kwargs, lean_steps):
    counts = _evaluations(monkeypatch)
    x0 = kwargs.pop("x0", np.random.default_rng(4).standard_normal((10, 2)))
    sinkflow.simulate(x0, "softmax", h=0.01, steps=9, temperature=4.0, progress=False, **kwargs)
    assert counts["lean"] == lean_steps
    assert counts["full"] == (1 if lean_steps else 9 * (4 if kwargs.get("integrator") == "rk4" else 1))
