"""solve_heat_grid: an error indicator that does not under-report rough data, and bad input refused by name."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf

from sinkflow.heat import GaussianMixture, solve_heat_grid


def _box_exact(x, t):
    """The heat solution of the box 1 on |x| <= 1."""
    return 0.5 * (erf((1 - x) / np.sqrt(4 * t)) - erf((-1 - x) / np.sqrt(4 * t)))


@pytest.mark.parametrize("n", [41, 161, 641])
def test_error_bound_covers_the_sampling_error_of_a_jump(n):
    # was 0.0865 / 0.0235 / 0.0060 against errors 0.275 / 0.0705 / 0.0176: three times too small
    x, T = np.linspace(-4, 4, n), 0.01
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sol = solve_heat_grid((np.abs(x) <= 1).astype(float), [x], [T])
    error = np.abs(sol.density[0] - _box_exact(x, T)).max()
    assert error <= sol.error_bound <= 10 * error
    # the coarsest grid does not resolve the kernel at T: said, and the trivial bound
    assert any("sampling error cannot be estimated" in str(w.message) for w in caught) == (n == 41)
    if n > 41:
        assert sol.error_bound <= 2.5 * error


@pytest.mark.parametrize("offset", [0.013, 0.05, 0.1])
def test_error_bound_covers_a_jump_between_grid_points(offset):
    x, T = np.linspace(-4, 4, 161), 0.01
    sol = solve_heat_grid((np.abs(x - offset) <= 1).astype(float), [x], [T])
    assert np.abs(sol.density[0] - _box_exact(x - offset, T)).max() <= sol.error_bound


@pytest.mark.parametrize("n", [41, 161])
def test_error_bound_of_smooth_data_is_not_grossly_pessimistic(n):
    x = np.linspace(-4, 4, n)
    g = GaussianMixture.gaussian([0.0], [[0.25]])
    sol = solve_heat_grid(g.pdf, [x], [0.01, 0.1, 1.0])
    assert sol.sampling_error == 0.0
    assert sol.error_bound < 1e-10  # set by tol = 1e-12 and the spectral tail; the errors are ~1e-15
    for k, t in enumerate(sol.times):
        assert np.abs(sol.density[k] - g.evolve(t).pdf(x)).max() <= sol.error_bound


def test_a_grid_too_large_for_memory_is_refused_before_allocating():
    x = np.linspace(-8, 8, 401)
    with pytest.raises(ValueError, match=r"times: the largest time 1e\+14 needs the grid \(401,\).*GiB"):
        solve_heat_grid(lambda p: np.exp(-p[:, 0] ** 2), [x], [1e14])


def test_complex_initial_data_is_refused_by_name():
    x = np.linspace(-8, 8, 101)
    with pytest.raises(TypeError, match="initial must be real"):
        solve_heat_grid(np.exp(-x ** 2) * (1 + 1j), [x], [1.0])  # was numpy's ComplexWarning, imaginary part dropped
    with pytest.raises(TypeError, match="initial .* must be real"):
        solve_heat_grid(lambda p: np.exp(-p[:, 0] ** 2) + 0j, [x], [1.0])


_NAMES = ("initial", "times", "each time", "tol", "grid", "axis", "axes")
_X = np.linspace(-4, 4, 33)
_initials = st.sampled_from([
    np.exp(-_X ** 2), np.exp(-_X ** 2) + 0j, np.full(33, np.nan), np.full(33, np.inf), np.ones(33, dtype=int),
    np.ones(33, dtype=bool), np.zeros(33), np.ones((33, 2)), np.ones(0), (np.abs(_X) < 1) * 1e300, np.full(33, 1e-310),
    np.array(["a"] * 33),
])
_axes = st.sampled_from([[_X], _X, [np.linspace(-4, 4, 4)], [np.ones(33)], [_X[::-1]], [_X * 1e-300], [_X * 1e300],
                         [_X + 1j], [np.linspace(-4, 4, 33).astype(int)], [], [_X, _X, _X]])
_times = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 10**9),
                   st.sampled_from([[], [[1.0]], [0.0, 1.0], 1 + 1j, "1", None, 1e300, 5e-324]))
_tols = st.one_of(st.just(1e-12), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, 1 + 1j]))


@settings(max_examples=25, deadline=None)  # 60 examples took 30 s of the default run
@given(_initials, _axes, _times, _tols)
def test_heat_grid_gives_a_finite_result_or_an_error_naming_the_argument(initial, axes, times, tol):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the unresolved-data notice
            warnings.simplefilter("error", np.exceptions.ComplexWarning)
            sol = solve_heat_grid(initial, axes, times, tol=tol)
    except (ValueError, TypeError, OverflowError) as e:
        assert any(n in str(e) for n in _NAMES), f"{e!r} names no argument"
        return
    assert np.isfinite(sol.density).all() and np.isfinite(sol.error_bound)


@pytest.mark.parametrize("scale", [1e-300, 1e300])
def test_a_grid_spacing_that_squares_out_of_float64_is_refused_by_name(scale):
    """Found by the property test below: axes at scale 1e-300 gave a NaN density at t = 0 (the squared
    frequencies overflow); now refused naming the axis."""
    with pytest.raises(ValueError, match="grid axis 0 has spacing"):
        solve_heat_grid(np.exp(-_X ** 2), [_X * scale], 0.0)
