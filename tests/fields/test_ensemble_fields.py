"""The block-wise field of ensembles (EnsembleField) against a plain field written here, and flows
through it against each system's own run."""

import numpy as np
import pytest
import torch

import sinkflow
import sinkflow.fields._ensemble_fields as ensemble_fields
from oracles import sinkhorn_log
from sinkflow.attention._variants import get_attention
from sinkflow.fields._ensemble_fields import EnsembleField, takes_ensemble


def plain_field(x, attention, W, W_V, a, tau):
    """sum_j K_ij W_V x_j with K the row SoftMax (or the doubly stochastic Sinkhorn plan) of
    a_j e^{x_i^T W x_j / tau}, one system at a time, in numpy (log domain)."""
    out = []
    for b in range(x.shape[0]):
        C = x[b] @ W[b] @ x[b].T / tau[b] + np.log(a[b])
        if attention == "softmax":
            K = np.exp(C - C.max(1, keepdims=True))
            K /= K.sum(1, keepdims=True)
        else:
            K = sinkhorn_log(C, 801, a[b], a[b])[0]
            assert np.abs(a[b] @ K - a[b]).sum() < 1e-13  # the oracle converged
        out.append(K @ x[b] @ W_V[b].T)
    return np.stack(out)


def field(attention, W, W_V, a, tau, dtype=torch.float64, symmetric=True):
    def t(v):
        return None if v is None else torch.as_tensor(v, dtype=dtype)

    return EnsembleField(get_attention(attention), t(W), t(W_V), None, t(a), tau, 1e-12 if dtype == torch.float64
                         else 1e-5, 2000, False, None, False, False, False, symmetric=symmetric)


def batch(seed, B, n, spread):
    rng = np.random.default_rng(seed)
    x = spread * rng.standard_normal((B, n, 2))
    a = rng.random((B, n)) + 0.3
    return x, a / a.sum(-1, keepdims=True)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("attention", ["softmax", "sinkhorn"])
def test_blocks_of_systems_give_the_plain_field(monkeypatch, attention, fast):
    """``fast``: the numpy passes on the CPU (the speed tricks on) or torch's operations (off, as on an
    accelerator); evaluated twice, the second time on the reused work arrays."""
    monkeypatch.setattr(ensemble_fields, "BLOCK_ENTRIES", 3 * 9 * 9)  # blocks of 3 systems; 7 = 3 + 3 + 1
    x, a = batch(1, 7, 9, 0.5)  # the plain loop converges within its 801 half-steps
    rng = np.random.default_rng(2)
    W = np.stack([np.eye(2) + 0.2 * M @ M.T for M in rng.standard_normal((7, 2, 2))])  # symmetric PSD
    W_V = rng.standard_normal((7, 2, 2))
    tau = 0.5
    f = field(attention, W / tau, W_V, a, 1.0)
    with sinkflow.fast_paths(fast):
        ev = f.evaluate(torch.as_tensor(x), None)
        again = f.evaluate(torch.as_tensor(x), None)
    expected = plain_field(x, attention, W, W_V, a, np.full(7, tau))
    np.testing.assert_allclose(ev.velocity.numpy(), expected, rtol=0, atol=1e-10)
    assert torch.equal(again.velocity, ev.velocity)
    if attention == "sinkhorn":
        assert ev.converged.all() and ev.n_iter.shape == (7,) and ev.g.shape == (7, 9)


@pytest.mark.parametrize("dtype, spread", [(torch.float64, 9.0), (torch.float32, 3.0)])
def test_softmax_systems_of_large_scores_subtract_their_row_maxima(monkeypatch, dtype, spread):
    # In R^2 the diagonal x_i^T x_i / tau of a spread system exceeds UNSHIFTED_MAX: unshifted
    # exponentials would overflow there. Blocks of two, each a small system and a spread one.
    monkeypatch.setattr(ensemble_fields, "BLOCK_ENTRIES", 2 * 12 * 12)
    x, a = batch(3, 4, 12, spread)
    x[::2] *= 0.1
    m = (x * x).sum(-1) / 0.1
    assert np.array_equal(m.max(1) > ensemble_fields.UNSHIFTED_MAX[dtype], [False, True, False, True])
    eye = np.broadcast_to(np.eye(2), (4, 2, 2))
    ev = field("softmax", None, None, a, 0.1, dtype).evaluate(torch.as_tensor(x, dtype=dtype), None)
    expected = plain_field(x, "softmax", eye, eye, a, np.full(4, 0.1))
    assert torch.isfinite(ev.velocity).all()
    np.testing.assert_allclose(ev.velocity.double().numpy(), expected, rtol=1e-5 if dtype == torch.float32 else 1e-12,
                               atol=1e-5 * spread if dtype == torch.float32 else 1e-12)
    small = field("softmax", None, None, a[::2], 0.1, dtype).evaluate(torch.as_tensor(x[::2], dtype=dtype), None)
    assert torch.equal(small.velocity, ev.velocity[::2])  # a system's field is its own, bit for bit


def test_softmax_with_any_W_subtracts_row_maxima():
    x, a = batch(4, 5, 10, 8.0)  # scores beyond the float64 exponent range
    W = np.array([[0.5, 2.0], [-1.0, 0.3]])  # not symmetric: no diagonal bound
    ev = field("softmax", W, None, a, 0.2, symmetric=False).evaluate(torch.as_tensor(x), None)
    expected = plain_field(x, "softmax", np.broadcast_to(W, (5, 2, 2)), np.broadcast_to(np.eye(2), (5, 2, 2)), a,
                           np.full(5, 0.2))
    np.testing.assert_allclose(ev.velocity.numpy(), expected, rtol=0, atol=1e-12)


def test_which_flows_take_the_ensemble_field():
    X = torch.zeros(ensemble_fields.SMALL_ENSEMBLE + 1, 8, 2, dtype=torch.float64)
    softmax, sinkhorn = get_attention("softmax"), get_attention("sinkhorn")
    assert takes_ensemble(softmax, None, False, False, X) and takes_ensemble(sinkhorn, None, True, False, X)
    few = X[: ensemble_fields.SMALL_ENSEMBLE]  # a few SoftMax systems: the batched torch field, faster there
    assert not takes_ensemble(softmax, None, False, False, few) and takes_ensemble(sinkhorn, None, True, False, few)
    assert not takes_ensemble(softmax, None, False, False, few.reshape(2, -1, 8, 2))  # counted over the whole batch
    assert not takes_ensemble(sinkhorn, 3, True, False, X)  # fixed counts: the kernel-domain iterations
    assert not takes_ensemble(sinkhorn, None, False, False, X)  # a non-symmetric W to tolerance
    assert not takes_ensemble(softmax, None, True, True, X)  # marginal errors need the matrices
    assert not takes_ensemble(get_attention("gaussian"), None, True, False, X)
    assert not takes_ensemble(softmax, None, True, False, X.half())


@pytest.mark.parametrize("attention, integrator, manifold", [
    ("softmax", "euler", "sphere"), ("softmax", "rk4", "euclidean"),
    ("sinkhorn", "euler", "euclidean"), ("sinkhorn", "rk4", "sphere"),
])
def test_flows_through_the_ensemble_field_evolve_each_system_as_alone(monkeypatch, attention, integrator, manifold):
    monkeypatch.setattr(ensemble_fields, "BLOCK_ENTRIES", 2 * 7 * 7)  # blocks of 2 systems
    monkeypatch.setattr(ensemble_fields, "SMALL_ENSEMBLE", 0)  # 5 SoftMax systems through the EnsembleField too
    evaluate, calls = EnsembleField.evaluate, []
    monkeypatch.setattr(EnsembleField, "evaluate", lambda self, *args: calls.append(1) or evaluate(self, *args))
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal((5, 7, 2))
    x0 = x0 / np.linalg.norm(x0, axis=-1, keepdims=True) if manifold == "sphere" else 0.5 * x0
    temperature = np.array([0.2, 0.5, 1.0, 0.2, 2.0])
    kwargs = dict(h=0.05, steps=6, integrator=integrator, manifold=manifold, monitors=["energy", "clusters"])
    batched = sinkflow.simulate(x0, attention, temperature=temperature, **kwargs)
    assert len(calls) == 6 * (4 if integrator == "rk4" else 1)
    for b in range(5):
        alone = sinkflow.simulate(x0[b], attention, temperature=float(temperature[b]), **kwargs)
        np.testing.assert_allclose(batched.positions[:, b], alone.positions, rtol=0, atol=1e-12)
        assert np.array_equal(batched.sinkhorn_iterations[:, b], alone.sinkhorn_iterations)
        np.testing.assert_allclose(batched.monitors["energy"][:, b], alone.monitors["energy"], rtol=1e-12, atol=1e-12)


def test_systems_left_unconverged_are_finished_by_the_general_solver_as_alone():
    x0 = 0.7 * np.random.default_rng(6).standard_normal((4, 7, 2))
    kwargs = dict(h=0.05, steps=3, max_iter=2)  # too few iterations for either solver
    batched = sinkflow.simulate(x0, "sinkhorn", **kwargs)
    assert not batched.converged.any()
    for b in range(4):
        alone = sinkflow.simulate(x0[b], "sinkhorn", **kwargs)
        np.testing.assert_allclose(batched.positions[:, b], alone.positions, rtol=0, atol=1e-12)
        assert np.array_equal(batched.sinkhorn_iterations[:, b], alone.sinkhorn_iterations)


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn"])
def test_the_torch_route_of_accelerators_gives_the_same_flow(monkeypatch, attention):
    monkeypatch.setattr(ensemble_fields, "SMALL_ENSEMBLE", 0)  # 6 SoftMax systems through the EnsembleField too
    evaluate, calls = EnsembleField.evaluate, []
    monkeypatch.setattr(EnsembleField, "evaluate", lambda self, *args: calls.append(1) or evaluate(self, *args))
    x0 = np.random.default_rng(7).standard_normal((6, 9, 2))
    x0 /= np.linalg.norm(x0, axis=-1, keepdims=True)
    kwargs = dict(h=0.05, steps=4, manifold="sphere", temperature=0.25)
    in_numpy = sinkflow.simulate(x0, attention, **kwargs)
    monkeypatch.setattr(ensemble_fields, "_in_numpy", lambda t: False)  # one block, torch operations
    in_torch = sinkflow.simulate(x0, attention, **kwargs)
    assert len(calls) == 2 * 4  # both runs evaluated by the EnsembleField
    np.testing.assert_allclose(in_torch.positions, in_numpy.positions, rtol=0, atol=1e-12)
    assert np.array_equal(in_torch.sinkhorn_iterations, in_numpy.sinkhorn_iterations)


@pytest.mark.parametrize("manifold", ["sphere", "euclidean"])
def test_a_few_softmax_systems_take_the_batched_torch_field_and_keep_their_flow(monkeypatch, manifold):
    """Eight SoftMax systems (a notebook slider) go through the batched ParticleField, chosen from the sizes once;
    the flow is the EnsembleField's (forced here) and each system's own run's."""
    x0 = np.random.default_rng(9).standard_normal((8, 16, 2))
    x0 = x0 / np.linalg.norm(x0, axis=-1, keepdims=True) if manifold == "sphere" else 0.5 * x0
    kwargs = dict(h=0.05, steps=6, manifold=manifold, temperature=0.25)
    evaluate, calls = EnsembleField.evaluate, []
    monkeypatch.setattr(EnsembleField, "evaluate", lambda self, *args: calls.append(1) or evaluate(self, *args))
    few = sinkflow.simulate(x0, "softmax", **kwargs)
    assert calls == [] and few.evaluation.reason == "the systems as one tensor flow, dense"
    monkeypatch.setattr(ensemble_fields, "SMALL_ENSEMBLE", 0)
    forced = sinkflow.simulate(x0, "softmax", **kwargs)
    assert len(calls) == 6 and "in cache" in forced.evaluation.reason
    np.testing.assert_allclose(few.positions, forced.positions, rtol=0, atol=1e-12)
    for b in (0, 7):
        alone = sinkflow.simulate(x0[b], "softmax", **kwargs)
        np.testing.assert_allclose(few.positions[:, b], alone.positions, rtol=0, atol=1e-12)


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn"])
def test_float32_ensembles_follow_the_float64_flow(attention):
    x0 = np.random.default_rng(8).standard_normal((6, 9, 2))
    x0 /= np.linalg.norm(x0, axis=-1, keepdims=True)
    kwargs = dict(h=0.05, steps=5, manifold="sphere", temperature=0.2)
    single = sinkflow.simulate(x0.astype(np.float32), attention, **kwargs)
    double = sinkflow.simulate(x0, attention, **kwargs)
    assert single.positions.dtype == np.float32 and single.converged.all()
    # measured 1.5e-7 / 1.8e-7; bound: float32 rounding plus the float32 solve's tolerance (1e-5) over 5 steps of 0.05
    np.testing.assert_allclose(single.positions, double.positions, rtol=0, atol=1e-5)
