"""simulate's keywords checked once into settings objects, the evaluation path chosen in one place
(choose_path) and recorded on the trajectory, and warnings that name the user's line."""

import warnings

import numpy as np
import pytest
import torch

import sinkflow
import sinkflow._backend
from sinkflow.fields._dense_fields import dense_limit
from sinkflow.particles._settings import EvaluationSettings, checked_settings, choose_path


def asked(**kw):
    base = dict(chunked=None, landmarks=None, landmark_seed=0, landmark_sampling="farthest", causal=False)
    return EvaluationSettings(**{**base, **kw})


class Kernel:
    order, rank = 7, 15


@pytest.mark.parametrize("kw, grad, harmonic, n, expected", [
    ({}, False, None, 64, "dense"),
    ({}, False, None, "above", "block-wise"),
    ({}, False, Kernel, 64, "harmonic"),
    ({"causal": True}, False, Kernel, 64, "dense"),       # a causal mask: never the harmonic field
    ({}, True, Kernel, 64, "dense"),                       # gradients: never the harmonic field
    ({"chunked": False}, False, Kernel, "above", "dense"),  # the caller's choice comes first
    ({"chunked": True}, False, Kernel, 64, "block-wise"),
    ({"landmarks": 8, "chunked": False}, False, Kernel, 64, "landmarks"),
])
def test_one_place_chooses_the_path_in_order_of_precedence(kw, grad, harmonic, n, expected):
    n = dense_limit(torch.float64) + 1 if n == "above" else n
    sinkhorn = sinkflow.get_attention("sinkhorn")
    path, kernel = choose_path(n, torch.float64, sinkhorn, asked(**kw), grad, lambda: harmonic)
    assert path.name == expected and path.reason
    assert kernel is (harmonic if expected == "harmonic" else None)


@pytest.mark.parametrize("kw", [{"chunked": True}, {"landmarks": 4}, {}])
def test_gradients_refuse_every_path_but_the_dense_one(kw):
    n = dense_limit(torch.float64) + 1 if not kw else 16
    with pytest.raises(ValueError, match="gradients through simulate need the dense evaluation"):
        choose_path(n, torch.float64, sinkflow.get_attention("softmax"), asked(**kw), True, lambda: None)


def test_the_trajectory_records_the_path_and_why():
    x0 = sinkflow.random_particles(600, 2, seed=2, manifold="sphere")
    kw = dict(h=0.1, steps=2, manifold="sphere", temperature=0.2)
    harmonic = sinkflow.simulate(x0, "softmax", **kw)
    assert harmonic.evaluation.name == "harmonic" and harmonic.harmonic_order is not None
    assert f"order {harmonic.harmonic_order}" in harmonic.evaluation.reason
    dense = sinkflow.simulate(x0, "softmax", chunked=False, **kw)
    assert str(dense.evaluation) == "dense (chunked=False asked for)" and dense.harmonic_order is None
    blocks = sinkflow.simulate(x0, "softmax", chunked=True, **kw)
    assert blocks.evaluation.name == "block-wise" and blocks.chunked
    cheap = sinkflow.simulate(x0[:20], "sinkhorn", **kw)
    assert cheap.evaluation.name == "dense" and "fits the dense budget" in cheap.evaluation.reason
    landmark = sinkflow.simulate(x0[:40], "softmax", landmarks=8, **kw)
    assert landmark.evaluation.name == "landmarks" and landmark.landmarks == 8


def test_an_ensemble_records_whether_it_ran_batched_and_why_not():
    x0 = np.stack([sinkflow.random_particles(12, 2, seed=s) for s in range(3)])
    batched = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=2)
    assert batched.evaluation.name == "batched"
    skewed = np.array([[1.0, 0.5], [0.0, 1.0]])  # W_Q^T W_K not symmetric: Sinkhorn to tolerance system by system
    alone = sinkflow.simulate(x0, "sinkhorn", W_K=skewed, h=0.05, steps=2)
    assert alone.evaluation.name == "dense" and alone.evaluation.reason.startswith("system by system: Sinkhorn")
    chunked = sinkflow.simulate(x0, "softmax", h=0.05, steps=2, chunked=True)
    assert chunked.evaluation.name == "block-wise" and "chunked" in chunked.evaluation.reason
    for b in range(3):  # each system as it runs alone
        one = sinkflow.simulate(x0[b], "sinkhorn", W_K=skewed, h=0.05, steps=2)
        np.testing.assert_allclose(alone.positions[:, b], one.positions, rtol=0, atol=1e-12)


@pytest.mark.parametrize("keyword, value, error", [
    ("chunked", "yes", TypeError), ("causal", 1, TypeError), ("warm_start", "no", TypeError),
    ("progress", 2, TypeError), ("tol", -1.0, ValueError), ("max_iter", 0, ValueError),
    ("landmark_sampling", "random", ValueError), ("integrator", "rk5", ValueError),
])
def test_each_keyword_is_checked_once_naming_itself(keyword, value, error):
    kw = dict(integrator="euler", manifold="euclidean", n_iter=None, tol=None, max_iter=100, warm_start=None,
              chunked=None, landmarks=None, landmark_seed=0, landmark_sampling="farthest", causal=False,
              monitors=(), monitor_every=1, save_every=1, cluster_tol=1e-3, progress=None)
    with pytest.raises(error, match=keyword):
        checked_settings(**{**kw, keyword: value})
    with pytest.raises(error, match=keyword):  # the same check for one system and for an ensemble
        x0 = sinkflow.random_particles(4, 2, seed=0)
        sinkflow.simulate(np.stack([x0, x0]), steps=1, **{keyword: value})


def test_warnings_name_the_users_line_for_one_system_and_an_ensemble():
    x0 = sinkflow.random_particles(8, 2, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sinkflow.simulate(x0, "sinkhorn", h=5.0, steps=1)
        sinkflow.simulate(np.stack([x0, x0]), "sinkhorn", h=5.0, steps=1)
        sinkflow.simulate(x0.astype(np.float32), "sinkhorn", h=0.01, steps=1, tol=1e-12)
    assert len(caught) == 3
    assert all(w.filename == __file__ and w.category is RuntimeWarning for w in caught)


@pytest.mark.parametrize("kw", [{"chunked": True}, {"landmarks": 64}])  # blocks of >= 2^14 entries
def test_the_fast_paths_switch_changes_no_number_of_a_blockwise_or_landmark_flow(kw, monkeypatch):
    """The block-wise and landmark fields exponentiate through numpy when the switch is on (one thread),
    through torch when it is off: the same trajectory to rounding."""
    x0 = sinkflow.random_particles(400, 2, seed=3)
    monkeypatch.setattr(sinkflow._backend, "numpy_exp_is_fast", lambda: True)  # the route, whatever this CPU
    calls, real_exp = [], np.exp
    monkeypatch.setattr(np, "exp", lambda *a, **k: calls.append(1) or real_exp(*a, **k))
    runs = {}
    for on in (True, False):
        calls.clear()
        with sinkflow.torch_threads(1), sinkflow.fast_paths(on):
            runs[on] = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=3, temperature=0.5, **kw)
        assert bool(calls) is on
    scale = np.abs(runs[False].positions).max()
    np.testing.assert_allclose(runs[True].positions / scale, runs[False].positions / scale, rtol=0, atol=1e-13)


def test_a_variant_described_by_its_data_takes_every_fast_path_a_callable_the_dense_one():
    """Registered by its normalization, a variant is computed by sinkflow's own solvers on every path, bit
    for bit as the built-in; given as a callable on dense scores, it runs densely and the trajectory says why."""
    by_data = sinkflow.register_attention("test_sinkhorn_by_data", normalization="sinkhorn", overwrite=True)
    by_call = sinkflow.register_attention("test_softmax_by_call", lambda C, n_iter, mask: sinkflow.softmax(C),
                                          overwrite=True)
    x0 = sinkflow.random_particles(600, 2, seed=2, manifold="sphere")
    kw = dict(h=0.1, steps=2, manifold="sphere", temperature=0.2)
    ours, builtin = sinkflow.simulate(x0, by_data, **kw), sinkflow.simulate(x0, "sinkhorn", **kw)
    assert ours.evaluation.name == builtin.evaluation.name == "harmonic"
    np.testing.assert_array_equal(ours.positions, builtin.positions)
    ensemble = np.stack([x0[:30], x0[30:60]])
    assert sinkflow.simulate(ensemble, by_data, **kw).evaluation.name == "batched"
    assert sinkflow.simulate(x0[:40], by_data, chunked=True, **kw).evaluation.name == "block-wise"
    theirs = sinkflow.simulate(x0, by_call, **kw)
    assert theirs.evaluation.name == "dense" and "callable on dense scores" in theirs.evaluation.reason
    np.testing.assert_allclose(theirs.positions, sinkflow.simulate(x0, "softmax", **kw).positions, atol=1e-10)
    alone = sinkflow.simulate(ensemble, by_call, **kw).evaluation
    assert alone.name == "dense" and alone.reason.startswith("system by system")
    with pytest.raises(ValueError, match="not both"):
        sinkflow.register_attention("test_both", lambda C, n_iter, mask: C, normalization="row", overwrite=True)
    with pytest.raises(ValueError, match="normalization must be one of"):
        sinkflow.register_attention("test_bad", normalization="softmax", overwrite=True)


def test_a_variant_described_by_its_data_takes_the_fused_torch_pass():
    from sinkflow.nn._fused import fused_kind

    by_data = sinkflow.register_attention("test_row_by_data", normalization="row", overwrite=True)
    by_call = sinkflow.register_attention("test_row_by_call", lambda C, n_iter, mask: sinkflow.softmax(C),
                                          overwrite=True)
    assert fused_kind(by_data) == fused_kind("softmax") == "softmax"
    assert fused_kind(by_call) is None
