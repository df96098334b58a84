"""The Nyström bound checks and their spectral tools refuse bad input by name, and say when the kernel underflows."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sinkflow

RNG = np.random.default_rng(0)


def test_beta_star_refuses_empty_and_all_zero_leverage():
    with pytest.raises(ValueError, match="leverage must have a positive score"):
        sinkflow.beta_star([0.0, 0.0])  # was nan
    with pytest.raises(ValueError, match="leverage must be a non-empty 1-D array"):
        sinkflow.beta_star([])  # was numpy's zero-size reduction error
    with pytest.raises(ValueError, match="leverage has non-finite"):
        sinkflow.beta_star([0.5, np.inf])


def test_nystrom_check_refuses_empty_queries_or_keys_by_name():
    with pytest.raises(ValueError, match=r"Q must hold at least one query"):
        sinkflow.nystrom_check(np.ones((0, 2)), np.ones((3, 2)), 2)  # was "lam must be positive"
    with pytest.raises(ValueError, match=r"Q must hold at least one query"):
        sinkflow.nystrom_check(np.ones((0, 2)), np.ones((0, 2)), 2)  # was IndexError
    with pytest.raises(ValueError, match=r"K must hold at least one key"):
        sinkflow.nystrom_errors(np.ones((3, 2)), np.ones((0, 2)), 2)


def test_an_underflowing_kernel_gives_no_verdict():
    Q, K = 1e3 * RNG.normal(size=(2, 20, 2))
    # was relative_error 0.52 and bound_holds False, decided on the clamp e^-707 of the exp
    with pytest.raises(ValueError, match="underflow the kernel.*no verdict"):
        sinkflow.nystrom_check(Q, K, 8)
    with pytest.raises(ValueError, match="underflow the kernel.*no landmark count"):
        sinkflow.smallest_sufficient_landmarks(Q, K)
    with pytest.warns(RuntimeWarning, match="underflow the kernel"):
        sinkflow.nystrom_errors(Q, K, 8, trials=2)
    # far apart but not underflowed everywhere that matters: no complaint
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        sinkflow.nystrom_check(0.5 * RNG.normal(size=(16, 4)), 0.5 * RNG.normal(size=(16, 4)), 8, trials=3)


def test_ridge_leverage_scores_say_the_matrix_must_be_psd():
    with pytest.raises(np.linalg.LinAlgError, match="Cbar must be positive semi-definite.*smallest eigenvalue is -1"):
        sinkflow.ridge_leverage_scores(np.array([[1.0, 2.0], [2.0, 1.0]]), 0.1)
    with pytest.raises(ValueError, match="Cbar must be a non-empty square"):
        sinkflow.ridge_leverage_scores(np.ones((2, 3)), 0.1)


def test_nystrom_errors_docstring_case_holds_to_its_stated_tolerance():
    r = np.random.default_rng(3)
    Q, K = 0.05 * r.normal(size=(12, 1)), 0.05 * r.normal(size=(10, 1))
    res = sinkflow.nystrom_errors(Q, K, 17, trials=5, seed=0)
    assert (res.errors <= np.maximum(res.lifted_max, -res.lifted_min) * (1 + 1e-12)).all()
    assert (res.errors <= res.lifted_max + 1e-8 * res.norm_Cbar).all()
    assert (res.lifted_min >= -1e-8 * res.norm_Cbar).all()


_NAMES = ("Q", "K", "Cbar", "lam", "leverage", "landmarks", "eps", "delta", "trials", "d_stat", "beta", "n_points",
          "A", "S", "input")
_arrays = st.one_of(
    st.sampled_from([np.ones((0, 2)), np.ones((3, 0)), np.ones(3), np.ones((2, 3, 2)), np.full((3, 2), np.nan),
                     np.full((3, 2), np.inf), np.ones((3, 2), dtype=complex), np.ones((3, 2), dtype=int),
                     1e200 * np.ones((3, 2)), 1e3 * np.arange(6.0).reshape(3, 2), np.zeros((1, 1))]),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=6).map(lambda v: np.array(v)),
)
_numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 10**9),
                     st.sampled_from([0, 1e308, 5e-324, 1 + 1j, None, "2"]))
_calls = {
    "nystrom_check Q": lambda x, y: sinkflow.nystrom_check(x, np.ones((3, 2)), 2, trials=2),
    "nystrom_check K": lambda x, y: sinkflow.nystrom_check(0.1 * np.ones((3, 2)), x, 2, trials=2),
    "nystrom_check eps": lambda x, y: sinkflow.nystrom_check(0.1 * RNG.normal(size=(4, 2)), 0.1 * np.ones((3, 2)), 2,
                                                             eps=y, trials=2),
    "nystrom_errors landmarks": lambda x, y: sinkflow.nystrom_errors(np.ones((3, 2)), np.ones((3, 2)), y, trials=2),
    "beta_star": lambda x, y: sinkflow.beta_star(x),
    "ridge_leverage_scores": lambda x, y: sinkflow.ridge_leverage_scores(x, 0.1),
    "ridge_leverage_scores lam": lambda x, y: sinkflow.ridge_leverage_scores(np.eye(2), y),
    "spectral_norm": lambda x, y: sinkflow.spectral_norm(x),
    "extreme_eigenvalues": lambda x, y: sinkflow.extreme_eigenvalues(x),
    "landmarks_required": lambda x, y: sinkflow.landmarks_required(y, 0.5, 100, 0.1),
}


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(_calls)), _arrays, _numbers)
def test_bounds_give_a_finite_result_or_an_error_naming_the_argument(name, x, y):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("error", np.exceptions.ComplexWarning)  # an imaginary part dropped silently
            out = _calls[name](x, y)
    except (ValueError, TypeError, OverflowError) as e:
        assert any(n in str(e) for n in _NAMES), f"{name}: {e!r} names no argument"
        return
    values = [out.relative_error, out.norm_C] if hasattr(out, "relative_error") else \
        out.errors if hasattr(out, "errors") else out
    assert np.isfinite(np.asarray(values, dtype=float)).all(), f"{name}({x!r}, {y!r}) -> {out!r}"


def test_beta_star_of_huge_scores_does_not_overflow_to_nan():
    """Found by the property test: the sum of two scores of 9e307 overflowed, and inf / inf gave NaN."""
    assert sinkflow.beta_star([8.98846567e307, 8.98846567e307]) == 1.0
