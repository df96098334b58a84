"""The Sinkformers patch-size study: pairing by seed, the t-interval, input checks."""

import math

import numpy as np
import pytest

from sinkflow.studies.patch_study import _interval, patch_size_study


def test_one_half_iteration_is_softmax_so_the_paired_gap_is_zero():
    """Sinkhorn with one half-iteration is SoftMax: same seed, same model, same batches -> a gap of exactly 0."""
    rows = patch_size_study((4,), seeds=(0, 1), n_iter=1, epochs=1, dim=8)
    assert rows[0]["accuracy"]["softmax"] == rows[0]["accuracy"]["sinkhorn"]
    assert rows[0]["difference"] == 0.0 and rows[0]["tokens"] == 4


def test_interval_closed_form():
    lo, hi = _interval(np.array([0.1, 0.2, 0.3]))
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t_{0.975, 2}
    assert math.isclose(lo, 0.2 - half, rel_tol=1e-9) and math.isclose(hi, 0.2 + half, rel_tol=1e-9)
    assert all(math.isnan(v) for v in _interval(np.array([0.5])))


def test_bad_patch_size():
    with pytest.raises(ValueError, match="divide 8"):
        patch_size_study((3,))
