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
        for name, key in zip(names, keys) if len(names) == len(keys) else [(names[0], k) for k in keys]:
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
