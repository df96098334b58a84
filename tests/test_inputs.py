"""One rule for inputs across the public API.

* Types: the result is torch when ANY array input is a torch tensor (on its device, with its
  autograd graph), numpy otherwise (sinkflow._backend.leading).
* Numbers: every numeric parameter goes through sinkflow._backend.check_number, which names
  the parameter; strings, booleans, NaN and wrong signs are refused, numpy scalars and 0-d
  tensors accepted.
* Half precision: float16 / bfloat16 work wherever float32 does, landmarks included, and
  come back in their dtype.
* ``solve_sinkhorn(tol=0)`` is POT's ``stopThr=0``: exactly ``max_iter`` half-iterations.
"""

import math
import warnings

import numpy as np
import pytest
import torch

import sinkflow
import sinkflow._backend
from sinkflow._backend import (
    broadcast_shapes,
    check_number,
    exp_,
    leading,
    numpy_exp_applies,
)
from sinkflow.heat._landmark_errors import nystrom_spectral_error

RNG = np.random.default_rng(2026)
X = RNG.normal(size=(12, 3))
Y = RNG.normal(size=(10, 3))
SPD = np.eye(3) + 0.1 * np.ones((3, 3))


# --------------------------------------------------------------------------- the type rule
def _t(a):
    return torch.tensor(a, requires_grad=True)


# (name, call on (numpy-or-torch) arrays, index of the array given as a tensor, its value)
MIXED = [
    ("dot_scores", lambda q, k: sinkflow.dot_scores(q, k), 1, (X, Y)),
    ("gaussian_scores", lambda q, k: sinkflow.gaussian_scores(q, k), 1, (X, Y)),
    ("gaussian_scores W", lambda q, w: sinkflow.gaussian_scores(q, q, w), 1, (X, SPD)),
    ("gaussian_kernel", lambda q, k: sinkflow.gaussian_kernel(q, k), 1, (X, Y)),
    ("kernelized_attention V", lambda q, v: sinkflow.kernelized_attention(q, q, v), 1, (X, X)),
    ("nystrom_attention V", lambda q, v: sinkflow.nystrom_attention(q, q, v, np.arange(24)), 1, (X, X)),
    ("nystromformer_attention V", lambda q, v: sinkflow.nystromformer_attention(q, q, v, 4), 1, (X, X)),
    ("energy_0 W", lambda x, w: sinkflow.energy_0(x, w), 1, (X, SPD)),
    ("energy_gaussian weights", lambda x, a: sinkflow.energy_gaussian(x, weights=a), 1, (X, np.full(12, 1 / 12))),
    ("entropic_ot y", lambda x, y: sinkflow.entropic_ot(x, y), 1, (X, Y)),
    ("sinkhorn a", lambda c, a: sinkflow.sinkhorn(c, a=a), 1, (X @ X.T / 3, np.full(12, 1 / 12))),
    ("marginal_errors a", lambda k, a: sinkflow.marginal_errors(k, a=a).column, 1,
     (np.full((12, 12), 1 / 12), np.full(12, 1 / 12))),
    ("simulate W_V", lambda x, w: sinkflow.simulate(x, W_V=w, h=0.05, steps=2, tol=1e-12).final, 1, (X, SPD)),
]


@pytest.mark.parametrize("name, call, which, arrays", MIXED, ids=[m[0] for m in MIXED])
def test_any_torch_input_gives_torch_with_its_graph(name, call, which, arrays):
    """numpy first argument, tensor requiring grad later: torch out, gradient reaches the tensor."""
    expected = call(*arrays)  # all numpy: the oracle value
    assert not isinstance(expected, torch.Tensor)
    args = list(arrays)
    args[which] = _t(arrays[which])
    out = call(*args)
    assert isinstance(out, torch.Tensor) and out.requires_grad, name
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-10, atol=1e-12)
    probe = torch.tensor(np.random.default_rng(0).normal(size=out.shape))  # K.sum() would be constant for sinkhorn
    (grad,) = torch.autograd.grad((probe * out).sum(), args[which])
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_leading_moves_numpy_to_the_tensor_dtype_and_keeps_numpy_alone():
    q, numpy_out = leading(np.zeros((2, 3)), "Q", None, torch.ones(3, dtype=torch.float32))
    assert q.dtype == torch.float32 and not numpy_out
    q, numpy_out = leading(np.zeros((2, 3)), "Q", np.ones(3), None)
    assert q.dtype == torch.float64 and numpy_out


# --------------------------------------------------------------------------- heat_flow gradient
@pytest.mark.parametrize("normalization, dt", [("sinkhorn", 0.01), ("softmax_gaussian", 0.01),
                                               ("softmax_dot", 0.002), ("unnormalized", 0.01)])
def test_heat_flow_gradient_matches_central_finite_differences(normalization, dt):
    rng = np.random.default_rng(5)
    x0 = torch.tensor(rng.normal(size=(8, 1)), requires_grad=True)
    weights = torch.tensor(rng.normal(size=(8, 1)))

    def loss(x):
        out = sinkflow.heat_flow(x, t=0.02, eps=0.3, dt=dt, normalization=normalization, tol=1e-13)
        return (weights * out ** 2).sum()

    value = loss(x0)
    assert value.requires_grad
    (grad,) = torch.autograd.grad(value, x0)
    step = 1e-6
    for i in (0, 3, 7):
        E = torch.zeros_like(x0)
        E[i, 0] = step
        with torch.no_grad():
            fd = float((loss(x0 + E) - loss(x0 - E)) / (2 * step))
        assert abs(fd - float(grad[i, 0])) < 1e-6 * max(1.0, abs(fd))


def test_heat_flow_refuses_gradients_with_landmarks():
    x0 = torch.tensor(RNG.normal(size=(20, 1)), requires_grad=True)
    with pytest.raises(ValueError, match="dense evaluation"):
        sinkflow.heat_flow(x0, 0.02, 0.3, 0.01, landmarks=8)


# --------------------------------------------------------------------------- half precision
_P = torch.tensor(sinkflow.random_particles(48, 2, seed=0), dtype=torch.float32)


def _final(out):
    return out.final if hasattr(out, "final") else out


HALF_PATHS = {
    "simulate": lambda x: sinkflow.simulate(x, "sinkhorn", h=0.05, steps=4),
    "simulate chunked": lambda x: sinkflow.simulate(x, "sinkhorn", h=0.05, steps=4, chunked=True),
    **{f"simulate landmarks {a}": (lambda x, a=a: sinkflow.simulate(x, a, h=0.05, steps=4, landmarks=16))
       for a in ("sinkhorn", "softmax", "gaussian", "nystromformer")},
    "heat_flow": lambda x: sinkflow.heat_flow(x, 0.1, 0.2, 0.05),
    "heat_flow landmarks": lambda x: sinkflow.heat_flow(x, 0.1, 0.2, 0.05, landmarks=16),
    "heat_flow landmarks unnormalized": lambda x: sinkflow.heat_flow(x, 0.1, 0.2, 0.05, "unnormalized", landmarks=16),
    "heat_velocity": lambda x: sinkflow.heat_velocity(x, 0.2),
    "nystrom_attention": lambda x: sinkflow.nystrom_attention(x, x, x, 16, generator=0),
    "nystrom_matrix": lambda x: sinkflow.nystrom_matrix(x, x, 16, generator=0),
    "nystromformer_attention": lambda x: sinkflow.nystromformer_attention(x, x, x, 16),
    "kernelized_attention": lambda x: sinkflow.kernelized_attention(x, x, x),
    "sinkhorn": lambda x: sinkflow.sinkhorn(sinkflow.dot_scores(x, x)),
    "softmax": lambda x: sinkflow.softmax(sinkflow.gaussian_scores(x, x)),
    "energy_inf": lambda x: sinkflow.energy_inf(x, tol=1e-2),
    "energy_log_partition": lambda x: sinkflow.energy_log_partition(x),
    "asymptotic_rate": lambda x: sinkflow.asymptotic_rate(sinkflow.sinkhorn(sinkflow.dot_scores(x, x))),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("path", list(HALF_PATHS))
def test_half_precision_matches_float32_and_keeps_its_dtype(path, dtype):
    """Tolerance: 8 machine epsilons of the half dtype, relative to the largest entry (max norm).

    The float32 reference runs on the same (rounded) input, so only the computation differs.
    """
    x = _P.to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # step-size advice, the same in both runs
        ref = _final(HALF_PATHS[path](x.float()))
        out = _final(HALF_PATHS[path](x))
    assert out.dtype == dtype
    err = float((out.float() - ref).abs().max() / ref.abs().max())
    assert err < 8 * torch.finfo(dtype).eps, err


# --------------------------------------------------------------------------- numeric parameters
C = X @ X.T / 3
_G = sinkflow.GaussianMixture.gaussian([0.0], [[1.0]])
BAD = [
    ("sinkhorn tol", lambda v: sinkflow.sinkhorn(C, tol=v), "tol"),
    ("sinkhorn max_iter", lambda v: sinkflow.sinkhorn(C, max_iter=v), "max_iter"),
    ("sinkhorn n_iter", lambda v: sinkflow.sinkhorn(C, n_iter=v), "n_iter"),
    ("gaussian_scores temperature", lambda v: sinkflow.gaussian_scores(X, X, temperature=v), "temperature"),
    ("dot_scores temperature", lambda v: sinkflow.dot_scores(X, X, temperature=v), "temperature"),
    ("heat_flow t", lambda v: sinkflow.heat_flow(X[:, :1], v, 0.2, 0.05), "t"),
    ("heat_flow eps", lambda v: sinkflow.heat_flow(X[:, :1], 0.1, v, 0.05), "eps"),
    ("heat_flow dt", lambda v: sinkflow.heat_flow(X[:, :1], 0.1, 0.2, v), "dt"),
    ("heat_flow tol", lambda v: sinkflow.heat_flow(X[:, :1], 0.1, 0.2, 0.05, tol=v), "tol"),
    ("heat_flow landmarks", lambda v: sinkflow.heat_flow(X[:, :1], 0.1, 0.2, 0.05, landmarks=v), "landmarks"),
    ("random_particles n", lambda v: sinkflow.random_particles(v, 2), "n"),
    ("random_particles d", lambda v: sinkflow.random_particles(4, v), "d"),
    ("random_particles seed", lambda v: sinkflow.random_particles(4, 2, seed=v), "seed"),
    ("simulate h", lambda v: sinkflow.simulate(X, h=v, steps=1), "h"),
    ("simulate steps", lambda v: sinkflow.simulate(X, steps=v), "steps"),
    ("simulate temperature", lambda v: sinkflow.simulate(X, steps=1, temperature=v), "temperature"),
    ("simulate n_iter", lambda v: sinkflow.simulate(X, steps=1, n_iter=v), "n_iter"),
    ("simulate tol", lambda v: sinkflow.simulate(X, steps=1, tol=v), "tol"),
    ("simulate landmarks", lambda v: sinkflow.simulate(X, steps=1, landmarks=v), "landmarks"),
    ("nystrom_attention landmarks", lambda v: sinkflow.nystrom_attention(X, X, X, v), "landmarks"),
    ("iterative_inverse n_iter", lambda v: sinkflow.iterative_inverse(np.eye(3), n_iter=v), "n_iter"),
    ("energy_sphere beta", lambda v: sinkflow.energy_sphere(X, beta=v), "beta"),
    ("GaussianMixture.sample n", lambda v: sinkflow.GaussianMixture.gaussian([0.0], [[1.0]]).sample(v), "n"),
    ("nystrom_check delta", lambda v: sinkflow.nystrom_check(X, X, 4, delta=v, trials=2), "delta"),
    ("nystrom_errors trials", lambda v: sinkflow.nystrom_errors(X, X, 4, trials=v), "trials"),
    ("binomial_interval trials", lambda v: sinkflow.binomial_interval(1, v), "trials"),
    ("spectral_norm tol", lambda v: sinkflow.spectral_norm(SPD, tol=v), "tol"),
    ("wasserstein2 n_reference", lambda v: sinkflow.wasserstein2(X[:, :1], _G, n_reference=v), "n_reference"),
    ("heat_reference t", lambda v: sinkflow.heat_reference(_G, v), "t"),
    ("cluster_statistics tol", lambda v: sinkflow.cluster_statistics(X, tol=v), "tol"),
    ("nystrom_spectral_error landmarks", lambda v: nystrom_spectral_error(X, v), "landmarks"),
]
# (value, error): strings, booleans, NaN, a negative number, a non-integer count
VALUES = [("0.5", TypeError), (True, TypeError), (math.nan, ValueError), (-2, ValueError)]


@pytest.mark.parametrize("value, error", VALUES, ids=["str", "bool", "nan", "negative"])
@pytest.mark.parametrize("name, call, param", BAD, ids=[b[0] for b in BAD])
def test_bad_numbers_are_refused_naming_the_parameter(name, call, param, value, error):
    with pytest.raises(error, match=rf"^{param}\b.* must be"):
        call(value)


@pytest.mark.parametrize("call", [lambda: sinkflow.simulate(X, steps=2.0), lambda: sinkflow.random_particles(4.0, 2),
                                  lambda: sinkflow.nystrom_attention(X, X, X, 4.5)])
def test_counts_must_be_integers(call):
    with pytest.raises(TypeError, match="must be an integer"):
        call()


def test_kde_bandwidth_is_a_number_or_a_rule_name():
    axes = [np.linspace(-3, 3, 7)]
    for bad in ("0.5", True, -1.0):
        with pytest.raises((TypeError, ValueError), match="bandwidth must be"):
            sinkflow.kde_l1(X[:, :1], _G, axes, bandwidth=bad)
    assert sinkflow.kde_l1(X[:, :1], _G, axes, bandwidth="silverman") >= 0


def test_the_reported_strings_fail_clearly():
    with pytest.raises(TypeError, match="tol must be a real number, got '1e-6'"):
        sinkflow.sinkhorn(C, tol="1e-6")
    with pytest.raises(TypeError, match="temperature must be a real number, got '0.5'"):
        sinkflow.gaussian_scores(X, X, temperature="0.5")
    with pytest.raises(TypeError, match="^n must be an integer, got '64'"):
        sinkflow.random_particles("64", 2)


def test_counts_and_integer_arrays_are_named_as_the_caller_gave_them():
    # A count is an integer, not "a real number"; an integer numpy array is numpy int64, not
    # the torch dtype of an internal conversion.
    with pytest.raises(TypeError, match="^steps must be an integer, got '10'"):
        sinkflow.simulate(X, steps="10")
    with pytest.raises(TypeError, match="x0 must have a floating dtype, got numpy int64"):
        sinkflow.simulate(np.arange(10).reshape(5, 2))
    with pytest.raises(TypeError, match="x0 must have a floating dtype, got torch.int64"):
        sinkflow.simulate(torch.arange(10).reshape(5, 2))
    with pytest.raises(TypeError, match="scores must have a floating dtype, got numpy int64"):
        sinkflow.sinkhorn(np.ones((3, 3), dtype=np.int64))


def test_numpy_scalars_and_zero_dim_tensors_are_numbers():
    ref = sinkflow.gaussian_scores(X, Y, temperature=0.5)
    for tau in (np.float32(0.5), np.float64(0.5), torch.tensor(0.5), np.array(0.5)):
        np.testing.assert_array_equal(sinkflow.gaussian_scores(X, Y, temperature=tau), ref)
    x = sinkflow.random_particles(np.int64(5), torch.tensor(2), seed=np.int32(3))
    np.testing.assert_array_equal(x, sinkflow.random_particles(5, 2, seed=3))
    traj = sinkflow.simulate(X, h=np.float32(0.05), steps=np.int64(2))
    assert traj.positions.shape == (3, 12, 3)


def test_check_number_contract():
    assert check_number(3, "k", integer=True, positive=True) == 3
    assert check_number(0, "k", integer=True, positive=True, allow_zero=True) == 0
    assert check_number(None, "k", allow_none=True) is None
    assert check_number(math.inf, "t", allow_inf=True) == math.inf
    with pytest.raises(TypeError, match="k must be a real number, got None"):
        check_number(None, "k")
    with pytest.raises(TypeError, match="array of shape"):
        check_number(torch.ones(2), "k")
    with pytest.raises(ValueError, match="k must be >= 1"):
        check_number(0, "k", integer=True, positive=True)
    with pytest.raises(ValueError, match="x must be finite"):
        check_number(-math.inf, "x")


SHAPES = [((), ()), ((3,), ()), ((2, 1), (3,)), ((1, 4), (5, 1), (1,)), ((0,), (1,)), ((2, 0, 3), (1, 3)),
          ((4, 1, 2), (3, 1)), (torch.Size([2, 3]), (1, 3)), ((3,), (4,)), ((2, 3), (3, 3)), ((0,), (2,)),
          ((5, 1), (1, 4), (3, 1, 1))]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_broadcast_shapes_is_torchs_rule(shapes):
    """The plain-Python rule (torch's first call imports sympy) against torch's, mismatches included."""
    try:
        expected = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="cannot be broadcast"):
            broadcast_shapes(*shapes)
    else:
        got = broadcast_shapes(*shapes)
        assert got == expected and isinstance(got, torch.Size)


EXP_CASES = {"numpy": (1, 30_001, 1, True), "two threads": (2, 30_001, 1, True),
             "strided view": (1, 30_001, 2, True), "small": (1, 1_001, 1, True), "switched off": (1, 30_001, 1, False)}


@pytest.mark.parametrize("case", EXP_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_in_place_is_torchs_exp(dtype, case, monkeypatch):
    """numpy's exp for a large contiguous block of a path that decided on numpy at its entry (one thread,
    fast paths on), torch's otherwise (two threads, the switch off: decided against; a strided view, a
    small block): torch's values within 4 eps relative, the same overflow to inf, underflow to 0 and NaN;
    in place, its version counter bumped."""
    threads, size, step, on = EXP_CASES[case]
    monkeypatch.setattr(sinkflow._backend, "numpy_exp_is_fast", lambda: True)  # the route, whatever this CPU
    calls, real_exp = [], np.exp
    monkeypatch.setattr(np, "exp", lambda *a, **k: calls.append(1) or real_exp(*a, **k))
    base = torch.linspace(-800.0, 800.0, size, dtype=dtype)
    base[:3] = torch.tensor([-math.inf, math.inf, math.nan], dtype=dtype)
    expected = torch.exp(base)
    t = base.repeat_interleave(step)[::step] if step > 1 else base.clone()
    version, ptr = t._version, t.data_ptr()
    with sinkflow.torch_threads(threads), sinkflow.fast_paths(on), warnings.catch_warnings():
        warnings.simplefilter("error")
        out = exp_(t, numpy_exp_applies(t))
    assert len(calls) == (case == "numpy")
    assert out is t and t.data_ptr() == ptr and t._version > version
    normal = torch.isfinite(expected) & (expected >= torch.finfo(dtype).tiny)
    assert torch.equal(torch.isnan(t), torch.isnan(expected)) and torch.equal(torch.isinf(t), torch.isinf(expected))
    assert float(((t - expected).abs() / expected)[normal].max()) <= 4 * torch.finfo(dtype).eps
    assert float((t - expected)[~normal & torch.isfinite(expected)].abs().max()) <= torch.finfo(dtype).tiny


def test_exp_in_place_compiles_in_one_graph():
    """Under torch.compile(fullgraph=True) a path decides on torch's op: one graph, no break."""
    x = torch.linspace(-3.0, 3.0, 2**15)
    with sinkflow.torch_threads(1):
        got = torch.compile(lambda v: exp_(v * 2.0, numpy_exp_applies(v)) + 1.0, fullgraph=True, backend="eager")(x)
    torch.testing.assert_close(got, torch.exp(x * 2.0) + 1.0)


def test_the_entry_decides_against_numpy_under_transforms_and_for_inference_tensors(monkeypatch):
    """Under torch.func.vmap, grad, jvp, forward-mode AD and for an inference tensor outside inference mode,
    the entry check says torch, so the path computes torch's result (and its tangent, its error)."""
    x = torch.linspace(-3.0, 3.0, 2 * 2**15, dtype=torch.float64).reshape(2, -1)

    def path(v):  # a path: decides at its entry, then exponentiates its block
        block = v * 1.0
        return exp_(block, numpy_exp_applies(v))

    monkeypatch.setattr(sinkflow._backend, "numpy_exp_is_fast", lambda: True)  # the route, whatever this CPU

    with sinkflow.torch_threads(1):
        assert numpy_exp_applies(x)
        torch.testing.assert_close(torch.func.vmap(path)(x), torch.exp(x))
        torch.testing.assert_close(torch.func.grad(lambda v: path(v).sum())(x[0]), torch.exp(x[0]))
        _, tangent = torch.func.jvp(path, (x,), (torch.ones_like(x),))
        torch.testing.assert_close(tangent, torch.exp(x))
        with torch.autograd.forward_ad.dual_level():
            dual = path(torch.autograd.forward_ad.make_dual(x, torch.ones_like(x)))
            torch.testing.assert_close(torch.autograd.forward_ad.unpack_dual(dual).tangent, torch.exp(x))
        with torch.inference_mode():
            frozen = torch.zeros(2**15)
        assert not numpy_exp_applies(frozen)
        with pytest.raises(RuntimeError, match="[Ii]nference"):
            exp_(frozen, numpy_exp_applies(frozen))


def test_a_path_that_chose_numpy_fails_loudly_under_a_transform_it_did_not_see():
    """A block under vmap that its path's entry did not see (numpy decided from unbatched inputs) raises,
    naming the switch, instead of computing without the transform."""
    x = torch.linspace(-3.0, 3.0, 2 * 2**15, dtype=torch.float64).reshape(2, -1)
    with sinkflow.torch_threads(1), pytest.raises(RuntimeError, match="fast_paths"):
        torch.func.vmap(lambda v: exp_(v * 1.0, True))(x)
    with sinkflow.torch_threads(1), sinkflow.fast_paths(False):
        torch.testing.assert_close(torch.func.vmap(lambda v: exp_(v * 1.0, numpy_exp_applies(v)))(x), torch.exp(x))


def test_exp_in_place_keeps_autograd_honest():
    """Under autograd the entry says torch (its gradient); a tensor saved for a backward pass and then
    exponentiated through numpy is reported stale, as with torch's own in-place op."""
    w = torch.randn(2**15, dtype=torch.float64, requires_grad=True)
    with sinkflow.torch_threads(1):
        assert not numpy_exp_applies(w)
        y = exp_(w * 1.0, numpy_exp_applies(w))
        y.sum().backward()
        assert torch.allclose(w.grad, torch.exp(w.detach()), rtol=1e-15, atol=0)
        saved = torch.randn(2**15, dtype=torch.float64)
        loss = (w * saved).sum()
        exp_(saved, numpy_exp_applies(saved))
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_the_fast_paths_switch_is_checked_and_restored():
    with pytest.raises(TypeError, match="enabled"):
        with sinkflow.fast_paths("no"):
            pass
    before = sinkflow.fast_paths_enabled()
    with sinkflow.fast_paths(not before):
        assert sinkflow.fast_paths_enabled() is (not before)
    assert sinkflow.fast_paths_enabled() is before


# --------------------------------------------------------------------------- tol = 0
def test_tol_zero_runs_exactly_max_iter_half_iterations_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = sinkflow.solve_sinkhorn(C, tol=0, max_iter=7)
    assert res.n_iter == 7 and res.tol == 0.0 and not res.converged
    fixed = sinkflow.solve_sinkhorn(C, n_iter=7)
    np.testing.assert_array_equal(res.attention, fixed.attention)
    assert res.marginal_error == pytest.approx(fixed.marginal_error, rel=1e-12)


def test_tol_zero_reaches_pots_stopthr_zero_fixed_point():
    ot = pytest.importorskip("ot")
    M = np.random.default_rng(1).random((6, 5))
    a, b, reg = np.full(6, 1 / 6), np.full(5, 1 / 5), 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # POT warns that it "did not converge" at stopThr=0
        plan = ot.sinkhorn(a, b, M, reg, stopThr=0, numItermax=500)
    res = sinkflow.solve_sinkhorn(-M / reg, tol=0, max_iter=1000, a=a, b=b)
    assert res.n_iter == 1000
    np.testing.assert_allclose(res.attention * a[:, None], plan, rtol=0, atol=1e-15)
