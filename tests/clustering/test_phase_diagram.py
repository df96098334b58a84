"""The phase diagram against plain re-implementations of the SoftMax flow on the circle."""

import numpy as np
import pytest
import torch

import sinkflow
from sinkflow.clustering._phase_diagram import MERGE_ANGLE, _compact


def plain_clustering_steps(x0, beta, h, steps, threshold):
    """Euler steps of the layer-norm SoftMax flow, written out in numpy (float64), every system to
    the end (none leaves the batch): each system's first clustered step (``steps + 1`` if none)."""
    x, first = x0.copy(), np.full(len(x0), steps + 1)
    for k in range(1, steps + 1):
        s = beta * x @ np.swapaxes(x, -1, -2)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        v = p @ x
        v -= (v * x).sum(-1, keepdims=True) * x
        x = x + h * v
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
        clustered = (x @ np.swapaxes(x, -1, -2)).reshape(len(x), -1).min(1) > threshold
        first = np.where(clustered & (first > steps), k, first)
    return first


def _starts(systems, n, seed):
    rng = np.random.default_rng(seed)
    return np.stack([sinkflow.random_particles(n, 2, seed=rng, manifold="sphere") for _ in range(systems)])


def test_fixed_steps_give_the_plain_flows_fractions():
    # clustered systems leave the batch: the plain flow, which keeps them, must agree at every time
    betas, times = [0.5, 2.0], [0.0, 3.0, 6.0, 9.0, 12.0]
    table = sinkflow.phase_diagram(betas, n=6, d=2, normalization="softmax", systems=24, times=times, seed=3,
                                   max_angle=None, progress=False)
    assert list(table.columns) == ["beta", "t", "clustered_fraction"] and len(table) == 10
    x0 = _starts(24, 6, 3)
    for beta in betas:
        first = plain_clustering_steps(x0, beta, 0.1, 120, 0.999)
        got = table[table.beta == beta].clustered_fraction.to_numpy()
        expected = [(first <= round(t / 0.1)).mean() for t in times]
        np.testing.assert_allclose(got, expected, atol=1e-12)
    assert table.clustered_fraction.iloc[0] == 0.0 and 0 < table.clustered_fraction.max()  # the law's two ends


def test_plateau_steps_keep_the_clustering_times_within_a_quarter():
    # merged clusters and angle-limited steps against the plain fixed-step flow (measured: the
    # fractions of 256 systems of n = 32 within 0.03 at beta = 3, t <= 1000)
    systems, n, beta, h = 48, 8, 3.0, 0.1
    times = np.geomspace(4.0, 200.0, 12)
    table = sinkflow.phase_diagram([beta], n=n, d=2, normalization="softmax", systems=systems, times=times, seed=5,
                                   max_angle=0.02, progress=False)
    first = plain_clustering_steps(_starts(systems, n, 5), beta, h, round(1.25 * times[-1] / h), 0.999) * h
    got = table.clustered_fraction.to_numpy()
    assert got[-1] > 0.5 > got[0]  # the times cover the clustering
    low, high = [(first[None, :] <= f * times[:, None]).mean(1) for f in (1 / 1.25, 1.25)]
    assert np.all((low <= got) & (got <= high)), np.c_[times, low, got, high]


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn"])
def test_merged_tokens_move_as_the_tokens_they_replace(attention):
    # coincident tokens are one token carrying their mass, for the row and the doubly stochastic attention
    rng = np.random.default_rng(0)
    base = sinkflow.random_particles(4, 2, seed=rng, manifold="sphere")
    copies = np.array([0, 0, 1, 2, 2, 2, 3, 1])
    x = base[copies] + 1e-5 * rng.standard_normal((8, 2))  # closer than the merge angle
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    pos, mass, k = _compact(torch.as_tensor(x[None]), torch.full((1, 8), 1 / 8, dtype=torch.float64),
                            np.cos(MERGE_ANGLE), width=6)
    assert int(k[0]) == 4 and float(mass.sum()) == pytest.approx(1.0, abs=1e-15)
    centers = np.stack([x[copies == c].mean(0) for c in range(4)])
    centers /= np.linalg.norm(centers, axis=-1, keepdims=True)
    full = sinkflow.simulate(centers[copies], attention, h=0.1, steps=3, manifold="sphere", temperature=0.3)
    merged = sinkflow.simulate(pos[0].numpy(), attention, h=0.1, steps=3, manifold="sphere", temperature=0.3,
                               weights=mass[0].numpy())
    for c in range(4):
        slots = np.flatnonzero(np.abs(pos[0].numpy() @ centers[c] - 1) < 1e-12)
        assert slots.size, c
        expected = full.positions[-1][copies == c][:1].repeat(slots.size, 0)
        np.testing.assert_allclose(merged.positions[-1][slots], expected, atol=1e-10)
        assert float(mass[0, slots].sum()) == pytest.approx((copies == c).mean(), abs=1e-15)


def test_sinkhorn_runs_and_bad_inputs_name_the_parameter():
    table = sinkflow.phase_diagram([1.0], n=5, d=3, normalization="sinkhorn", systems=4, times=[0.0, 0.5, 40.0],
                                   progress=False)
    assert table.clustered_fraction.between(0, 1).all()
    for kwargs, words in [(dict(times=[0.5, 0.1]), "increasing"), (dict(normalization="relu"), "normalization"),
                          (dict(beta=[-1.0]), "beta"), (dict(threshold=1.5), "threshold"),
                          (dict(max_angle=-0.1), "max_angle"), (dict(h=1.5), "h must be at most 1"),
                          (dict(threshold=-0.5), "threshold")]:
        args = dict(beta=[1.0], n=4, d=2, normalization="softmax", systems=2, times=[0.0], progress=False) | kwargs
        with pytest.raises(ValueError, match=words):
            sinkflow.phase_diagram(args.pop("beta"), **args)
