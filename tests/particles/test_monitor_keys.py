"""The keys each monitor writes: as simulate's docstring lists them, counts as integers, helpful KeyErrors."""

import re

import numpy as np
import pytest

import sinkflow
from sinkflow.particles import MONITORS


def _documented_keys() -> dict:
    """``{monitor: keys}`` parsed from the ``monitors`` entry of simulate's docstring."""
    entry = sinkflow.simulate.__doc__.split("    monitors : ")[1].split("    monitor_every")[0]
    documented = {}
    for line in re.findall(r"- (.+?): keys? (.+?)(?:;|\.|,\s*the|$)", entry.replace("\n        ", " ")):
        names, keys = re.findall(r'``"(\w+)"``', line[0]), re.findall(r'``"(\w+)"``', line[1])
        for name, key in zip(names, keys, strict=True) if len(names) == len(keys) else [(names[0], k) for k in keys]:
            documented.setdefault(name, []).append(key)
    return documented


@pytest.mark.parametrize("manifold", ["euclidean", "sphere"])
def test_every_monitor_writes_the_keys_the_docstring_lists(manifold):
    documented = _documented_keys()
    assert sorted(documented) == sorted(MONITORS)
    x0 = sinkflow.random_particles(6, 3, seed=0, manifold=manifold)
    for name in MONITORS:
        traj = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=3, manifold=manifold, monitors=[name])
        assert sorted(traj.monitors) == sorted(documented[name]), name
        for values in traj.monitors.values():
            assert len(values) == len(traj.monitor_times) == 4


def test_the_cluster_count_is_an_integer_and_the_monitor_name_says_its_keys():
    x = np.array([[1.0, 0.0], [1.0, 1e-6], [0.0, 1.0]])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    traj = sinkflow.simulate(x, "softmax", h=0.01, steps=2, manifold="sphere", monitors=["clusters"])
    counts = traj.monitors["cluster_count"]
    assert counts.dtype.kind == "i" and counts.tolist() == [2, 2, 2]
    assert traj.monitors["cluster_fraction"].dtype == np.float64
    with pytest.raises(KeyError, match="'cluster_fraction', 'cluster_count'"):
        traj.monitors["clusters"]
    with pytest.raises(KeyError, match="recorded keys"):
        traj.monitors["energy"]


def test_an_ensemble_counts_clusters_as_integers_and_each_system_is_its_run_alone():
    x0 = np.stack([sinkflow.random_particles(8, 2, seed=s, manifold="sphere") for s in range(4)]).reshape(2, 2, 8, 2)
    h = np.array([[0.05, 0.1], [0.1, 0.05]])
    options = dict(manifold="sphere", temperature=0.25, steps=6, monitors=["clusters", "energy"])
    for kind in ("softmax", "sinkhorn"):
        ens = sinkflow.simulate(x0, kind, h=h, **options)
        assert ens.batch_shape == (2, 2) and ens.monitors["cluster_count"].dtype.kind == "i"
        with pytest.raises(KeyError, match="'cluster_fraction', 'cluster_count'"):
            ens.monitors["clusters"]
        for flat, index in enumerate(np.ndindex(2, 2)):
            alone = sinkflow.simulate(x0[index], kind, h=float(h[index]), **options)
            one = ens.system(flat)
            assert one.batch_shape == () and one.h == alone.h and one.temperature == alone.temperature
            np.testing.assert_allclose(one.positions, alone.positions, atol=1e-9)
            np.testing.assert_allclose(one.times, alone.times)
            np.testing.assert_array_equal(one.sinkhorn_iterations, alone.sinkhorn_iterations)
            np.testing.assert_array_equal(one.monitors["cluster_count"], alone.monitors["cluster_count"])
            np.testing.assert_allclose(one.monitors["energy"], alone.monitors["energy"], rtol=1e-9)
            np.testing.assert_allclose(ens.system(index).positions, one.positions)


def test_selecting_a_system_names_the_index_that_does_not_fit():
    ens = sinkflow.simulate(np.stack([sinkflow.random_particles(4, 2, seed=s) for s in range(3)]), "softmax", steps=1)
    assert ens.system(-1).positions.shape == (2, 4, 2)
    with pytest.raises(ValueError, match="outside the 3"):
        ens.system(3)
    with pytest.raises(ValueError, match="multi-index"):
        ens.system((0, 0))
    with pytest.raises(TypeError, match="system must be an int"):
        ens.system(1.0)
    with pytest.raises(ValueError, match="one system"):
        ens.system(0).system(0)
