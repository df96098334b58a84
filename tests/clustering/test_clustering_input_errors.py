"""The clustering theory functions refuse bad numbers by name, and say when a result leaves float64."""

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sinkflow
from sinkflow.clustering import circle_growth_rate, fastest_mode, formation_time, two_cluster_dwell


def test_two_cluster_dwell_beyond_float64_is_an_overflow_error_naming_beta():
    # was ZeroDivisionError (the weight e^{-beta(1 - cos)} underflowed); sinkhorn returned inf silently
    for normalization in ("softmax", "sinkhorn"):
        with pytest.raises(OverflowError, match=r"beta=700 .*beyond float64"):
            two_cluster_dwell(700.0, [0.5, 0.5], 2.0, normalization)
        with pytest.raises(OverflowError, match=r"beta=500 .*beyond float64"):
            two_cluster_dwell(500.0, [0.3, 0.7], math.pi - 1e-3, normalization)
    # just below the edge: finite, e^{beta (1 - cos 2)} times an O(1) factor
    T = two_cluster_dwell(500.0, [0.5, 0.5], 2.0)
    assert math.isfinite(T) and 700 < math.log(T) < 709.8


def test_two_cluster_dwell_takes_exactly_two_masses():
    with pytest.raises(ValueError, match="masses must be exactly two"):
        two_cluster_dwell(5.0, [0.3, 0.3, 0.4], 2.0)
    with pytest.raises(ValueError, match="masses must be exactly two"):
        two_cluster_dwell(5.0, [0.5, float("nan")], 2.0)
    with pytest.raises(ValueError, match="separation must be finite"):
        two_cluster_dwell(5.0, [0.5, 0.5], float("nan"))


def test_formation_time_takes_a_particle_count():
    with pytest.raises(ValueError, match=r"n must be >= 1"):
        formation_time(5.0, 0)  # was "math domain error"
    with pytest.raises(TypeError, match="n must be an integer"):
        formation_time(5.0, 2.5)  # was accepted
    assert formation_time(5.0, 1) == 0.0


def test_fastest_mode_checks_beta_before_k_max_and_k_max_itself():
    with pytest.raises(ValueError, match="beta must be finite"):
        fastest_mode(float("nan"))  # was "cannot convert float NaN to integer"
    with pytest.raises(ValueError, match=r"k_max must be >= 1"):
        fastest_mode(5.0, k_max=-2)  # was an empty argmax
    with pytest.raises(ValueError, match=r"k_max must be >= 1"):
        fastest_mode(5.0, k_max=0)  # was silently the default
    assert fastest_mode(5.0, k_max=2) == 2


def test_growth_rates_refuse_non_integer_and_infinite_modes():
    with pytest.raises(ValueError, match="k must be a positive integer"):
        circle_growth_rate(float("inf"), 1.0)  # was nan
    with pytest.raises(TypeError, match="k must be a positive integer"):
        circle_growth_rate(1 + 2j, 1.0)
    with pytest.raises(ValueError, match="l must be a positive integer"):
        sinkflow.clustering.sphere_growth_rate([1.0, float("nan")], 1.0)


def test_an_underflowing_growth_rate_is_named():
    with pytest.warns(RuntimeWarning, match="k=700 at beta=1 underflows float64"):
        assert circle_growth_rate(700, 1.0) == 0.0


_NAMES = ("beta", "k", "n", "k_max", "masses", "separation", "end", "l")
_odd_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**6), st.sampled_from([0, -1, 1e308, 5e-324]),
    st.complex_numbers(max_magnitude=10), st.just(None), st.just("1"), st.just(True),
    st.lists(st.floats(-1e3, 1e3), max_size=3).map(np.array), st.just(np.zeros((0,))), st.just(np.ones((2, 2))),
)
_calls = {
    "circle_growth_rate": lambda x, y: circle_growth_rate(x, y),
    "circle_growth_rate unnormalized": lambda x, y: circle_growth_rate(x, y, "unnormalized"),
    "sphere_growth_rate": lambda x, y: sinkflow.clustering.sphere_growth_rate(x, y),
    "fastest_mode": lambda x, y: fastest_mode(x, k_max=y if isinstance(y, int) else None),
    "formation_time": lambda x, y: formation_time(x, y),
    "two_cluster_dwell beta": lambda x, y: two_cluster_dwell(x, [0.5, 0.5], 2.0),
    "two_cluster_dwell masses": lambda x, y: two_cluster_dwell(5.0, x, 2.0),
    "two_cluster_dwell separation": lambda x, y: two_cluster_dwell(5.0, [0.4, 0.6], x, end=0.1),
}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(_calls)), _odd_numbers, _odd_numbers)
def test_clustering_theory_gives_a_finite_result_or_an_error_naming_the_argument(name, x, y):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an underflowed rate is named by a warning
            out = _calls[name](x, y)
    except (ValueError, TypeError, OverflowError) as e:
        assert any(n in str(e) for n in _NAMES), f"{name}: {e!r} names no argument"
        return
    assert np.isfinite(np.asarray(out, dtype=float)).all(), f"{name}({x!r}, {y!r}) -> {out!r}"


def test_a_mode_or_beta_at_two_to_the_thirty_is_refused_not_nan():
    """Found by the property test: scipy's ive(k, beta) is NaN for an order k = 2^30 (and at beta = 2^30)."""
    with pytest.raises(ValueError, match="k must be below 2"):
        sinkflow.circle_growth_rate(2.0 ** 30, 1.0)
    with pytest.raises(ValueError, match="beta must be below 2"):
        sinkflow.circle_growth_rate(1, 2.0 ** 30)
