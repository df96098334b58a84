"""``binomial_interval`` (Beta quantiles from scipy.special) against ``scipy.stats.binomtest``."""

import math

import pytest
from scipy.stats import binomtest

import sinkflow


@pytest.mark.parametrize("method", ["exact", "wilson", "wilsoncc"])
def test_binomial_interval_matches_binomtest(method):
    for n in (1, 2, 7, 20, 100, 1000):
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            for confidence in (0.5, 0.95, 0.999):
                ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method=method)
                lo, hi = sinkflow.binomial_interval(k, n, confidence, method)
                # binomtest finds the exact bounds by root finding (to about 1e-9 relative)
                assert math.isclose(lo, ci.low, rel_tol=1e-8, abs_tol=1e-14), (k, n, confidence, lo, ci.low)
                assert math.isclose(hi, ci.high, rel_tol=1e-8, abs_tol=1e-14), (k, n, confidence, hi, ci.high)


def test_binomial_interval_rejects_bad_input():
    with pytest.raises(ValueError, match="successes"):
        sinkflow.binomial_interval(5, 4)
    with pytest.raises(ValueError, match="method"):
        sinkflow.binomial_interval(1, 4, method="jeffreys")
    with pytest.raises(ValueError, match="confidence"):
        sinkflow.binomial_interval(1, 4, confidence=1.5)


@pytest.mark.slow  # several seconds: with the slow tests (the README's command stays under 5 minutes)
def test_binomial_interval_does_not_import_scipy_stats():
    import subprocess
    import sys

    code = "import sys, sinkflow; sinkflow.binomial_interval(3, 10); print('scipy.stats' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
