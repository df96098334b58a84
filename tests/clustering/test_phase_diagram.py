"""The phase diagram against a plain re-implementation of the SoftMax flow on the circle."""

import numpy as np
import pytest

import sinkflow


def plain_clustered_fraction(x0, beta, h, steps, threshold):
    """Euler steps of the layer-norm SoftMax flow, written out in numpy (float64)."""
    x = x0.copy()
    for _ in range(steps):
        s = beta * x @ np.swapaxes(x, -1, -2)
        k = np.exp(s - s.max(-1, keepdims=True))
        k /= k.sum(-1, keepdims=True)
        v = k @ x
        v -= (v * x).sum(-1, keepdims=True) * x
        x = x + h * v
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
    gram = x @ np.swapaxes(x, -1, -2)
    return float((gram.reshape(len(x), -1).min(1) > threshold).mean())


def test_the_clustered_fraction_is_the_plain_flows():
    betas, times = [0.5, 2.0], [0.0, 6.0, 12.0]
    table = sinkflow.phase_diagram(betas, n=6, d=2, normalization="softmax", systems=24, times=times, seed=3,
                                   progress=False)
    assert list(table.columns) == ["beta", "t", "clustered_fraction"] and len(table) == 6
    rng = np.random.default_rng(3)
    x0 = np.stack([sinkflow.random_particles(6, 2, seed=rng, manifold="sphere") for _ in range(24)])
    for row in table.itertuples():
        expected = plain_clustered_fraction(x0, row.beta, 0.1, round(row.t / 0.1), 0.999)
        assert row.clustered_fraction == pytest.approx(expected, abs=1e-12), row
    assert table.clustered_fraction.iloc[0] == 0.0 and table.clustered_fraction.max() > 0  # the law's two ends


def test_sinkhorn_runs_and_bad_inputs_name_the_parameter():
    table = sinkflow.phase_diagram([1.0], n=5, d=3, normalization="sinkhorn", systems=4, times=[0.0, 0.5],
                                   progress=False)
    assert table.clustered_fraction.between(0, 1).all()
    for kwargs, words in [(dict(times=[0.05]), "multiples of the step"), (dict(normalization="relu"), "normalization"),
                          (dict(beta=[-1.0]), "beta"), (dict(threshold=1.5), "threshold")]:
        args = dict(beta=[1.0], n=4, d=2, normalization="softmax", systems=2, times=[0.0], progress=False) | kwargs
        with pytest.raises(ValueError, match=words):
            sinkflow.phase_diagram(args.pop("beta"), **args)
