"""Parameter sweeps: the same table on a Dask cluster as sequentially, a free re-run,
resumption after a failure or a kill, clear errors on bad configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sinkflow
from sinkflow.sweeps._points import SweepError, expand_grid, point_key, resolve_experiment
from sinkflow.sweeps._sweep import sweep

EXPERIMENT = "sinkflow.experiments:sinkhorn_convergence"
GRID8 = {"n": [8, 16], "scale": [1.0, 2.0], "seed": [0, 1]}
HERE = Path(__file__).resolve().parent


# ---- experiments used by the tests (module level: workers import them by name) --------


def counted(x, calls_dir, sleep=0.0):
    """Square ``x``, leaving one file per call in ``calls_dir``; fails while ``fail_<x>`` exists there.

    While ``hold_<x>`` exists there, the call waits (a test kills the process meanwhile).
    """
    if sleep:
        time.sleep(sleep)
    calls = Path(calls_dir)
    while (calls / f"hold_{x}").exists():
        time.sleep(0.01)
    if (calls / f"fail_{x}").exists():
        raise RuntimeError(f"planned failure at x={x}")
    (calls / f"call_{x}_{uuid.uuid4().hex}").touch()
    return {"square": x * x, "vector": np.arange(3) * x}


def n_calls(calls_dir, x):
    return len(list(Path(calls_dir).glob(f"call_{x}_*")))


def returns_list(x):
    return [x]


def returns_object(x):
    return {"value": object()}


def returns_param_name(x):
    return {"x": x}


def unsorted_result(x):
    return {"zeta": x, "alpha": -x, "mid": 2 * x}


@pytest.fixture(scope="module")
def client():
    pytest.importorskip("distributed")
    from sinkflow.sweeps._executors import close_client, local_client

    c = local_client(n_workers=2)
    yield c
    close_client(c)


def _worker_environment():
    import torch

    return os.environ.get("OMP_NUM_THREADS"), os.environ.get("MALLOC_TRIM_THRESHOLD_"), torch.get_num_threads()


def test_local_cluster_workers_compute_with_one_thread_and_default_malloc(client):
    # one thread per worker process (no oversubscription of the cores); glibc's dynamic mmap
    # threshold left alone (the nanny's MALLOC_TRIM_THRESHOLD_ slowed array-heavy points 1.45x)
    assert list(client.run(_worker_environment).values()) == [("1", None, 1)] * 2


# ---- the table ---------------------------------------------------------------------------


@pytest.mark.slow  # several seconds: with the slow tests (the README's command stays under 5 minutes)
def test_dask_local_cluster_gives_the_sequential_table():
    seq = sweep(GRID8, EXPERIMENT, executor="sequential", cache_dir=None, progress=False)
    par = sweep(GRID8, EXPERIMENT, executor="dask", n_workers=2, cache_dir=None, progress=False)
    assert len(seq) == 8 and list(seq.columns[:3]) == ["n", "scale", "seed"]
    assert par.attrs["n_computed"] == 8
    # Same float64 computations in other processes (torch with 1 thread there): equal up to
    # reduction order, far below any quantity the table reports.
    pd.testing.assert_frame_equal(seq, par, check_exact=False, rtol=1e-10)


@pytest.mark.slow  # several seconds: with the slow tests (the README's command stays under 5 minutes)
def test_dask_sweep_closes_its_local_cluster_without_killing_workers():
    # issue 19: every sweep ended with "Worker process still alive after 4.0 seconds, killing"
    # (the nanny's default when the cluster is closed under a client whose workers ran torch)
    import logging
    import warnings

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(f"{record.name} {record.levelname}: {record.getMessage()}")

    keep = Keep(level=logging.WARNING)
    logger = logging.getLogger("distributed")
    logger.addHandler(keep)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            df = sweep({"n": [8, 16], "scale": [1.0], "seed": [0]}, EXPERIMENT, executor="dask", n_workers=2,
                       cache_dir=None, progress=False)
    finally:
        logger.removeHandler(keep)
    assert df.attrs["n_computed"] == 2 and df["converged"].all()
    assert records == [], records
    assert [str(w.message) for w in caught if "alive" in str(w.message) or "kill" in str(w.message)] == []


def test_table_rows_follow_grid_order_and_results_come_back_typed(tmp_path, client):
    grid = {"x": [3, 1, 2], "calls_dir": str(tmp_path)}
    df = sweep(grid, counted, executor=client, cache_dir=tmp_path / "cache", progress=False)
    assert df["x"].tolist() == [3, 1, 2] and df["square"].tolist() == [9, 1, 4]
    np.testing.assert_array_equal(df["vector"][0], [0, 3, 6])
    # the cache round trip keeps arrays as arrays
    again = sweep(grid, counted, executor="sequential", cache_dir=tmp_path / "cache", progress=False)
    assert again.attrs["n_cached"] == 3
    np.testing.assert_array_equal(again["vector"][0], [0, 3, 6])


def test_sinkhorn_experiment_obeys_the_bounds_it_reports():
    df = sweep({"n": [20, 40], "scale": [1.0, 2.0]}, EXPERIMENT, executor="sequential", cache_dir=None, progress=False)
    assert df.converged.all()
    assert (df.observed_rate <= df.birkhoff_hopf_rate).all()  # Birkhoff-Hopf is a guarantee
    # Knight 2008: the asymptotic rate is sigma_2(P)^2; the fit over the error tail is within
    # 10% (docs/theory/normalizations.md: measured 0.1630 vs 0.1647, i.e. 1%; small n is noisier).
    np.testing.assert_allclose(df.observed_rate, df.asymptotic_rate, rtol=0.1)


# ---- caching and resumption -------------------------------------------------------------


def test_rerun_is_free_and_identical(tmp_path):
    grid = {"x": [1, 2, 3, 4], "calls_dir": str(tmp_path)}
    first = sweep(grid, counted, executor="sequential", cache_dir=tmp_path / "cache", progress=False)
    second = sweep(grid, counted, executor="sequential", cache_dir=tmp_path / "cache", progress=False)
    assert (first.attrs["n_computed"], second.attrs["n_computed"], second.attrs["n_cached"]) == (4, 0, 4)
    assert all(n_calls(tmp_path, x) == 1 for x in range(1, 5))
    pd.testing.assert_frame_equal(first, second)
    forced = sweep(grid, counted, executor="sequential", cache_dir=tmp_path / "cache", progress=False, recompute=True)
    assert forced.attrs["n_computed"] == 4 and n_calls(tmp_path, 1) == 2


def test_cached_rerun_gives_the_columns_in_the_same_order(tmp_path):
    # issue 19: the cache stored results with sorted keys, so a rerun's columns came sorted
    grid = {"x": [1, 2, 3]}
    first = sweep(grid, unsorted_result, executor="sequential", cache_dir=tmp_path / "cache", progress=False)
    second = sweep(grid, unsorted_result, executor="sequential", cache_dir=tmp_path / "cache", progress=False)
    assert second.attrs["n_cached"] == 3
    assert list(first.columns) == list(second.columns) == ["x", "zeta", "alpha", "mid"]
    assert first.to_csv(index=False) == second.to_csv(index=False)


def test_failed_sweep_resumes_without_recomputing_finished_points(tmp_path, client):
    grid = {"x": list(range(8)), "calls_dir": str(tmp_path)}
    (tmp_path / "fail_5").touch()
    with pytest.raises(SweepError, match=r"x=5.*planned failure.*re-run to resume"):
        sweep(grid, counted, executor=client, cache_dir=tmp_path / "cache", progress=False)
    finished = len(list((tmp_path / "cache").rglob("*.json")))
    (tmp_path / "fail_5").unlink()
    df = sweep(grid, counted, executor=client, cache_dir=tmp_path / "cache", progress=False)
    assert df["square"].tolist() == [x * x for x in range(8)]
    assert df.attrs["n_cached"] == finished and df.attrs["n_computed"] == 8 - finished
    # every point ran exactly once successfully: nothing finished was recomputed
    assert [n_calls(tmp_path, x) for x in range(8)] == [1] * 8


def test_killed_sweep_resumes_without_recomputing_finished_points(tmp_path):
    cache = tmp_path / "cache"
    grid = {"x": list(range(8)), "calls_dir": str(tmp_path)}
    (tmp_path / "hold_3").touch()  # the sweep finishes 0, 1, 2, then waits at 3 until killed
    script = textwrap.dedent(f"""
        import sinkflow
        sinkflow.sweep({grid!r}, "test_sweep:counted", executor="sequential", cache_dir={str(cache)!r}, progress=False)
    """)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.monotonic() + 240  # a loaded machine may take long to start Python and import torch
    while len(list(cache.rglob("*.json"))) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.kill()  # SIGKILL: no cleanup, as when a job is killed
    proc.wait()
    (tmp_path / "hold_3").unlink()
    done_before = {json.loads(p.read_text())["params"]["x"] for p in cache.rglob("*.json")}
    assert done_before == {0, 1, 2}, "the kill should land mid-sweep, at the held point"
    df = sweep(grid, counted, executor="sequential", cache_dir=cache, progress=False)
    assert df["square"].tolist() == [x * x for x in range(8)]
    assert df.attrs["n_cached"] == len(done_before) and df.attrs["n_computed"] == 8 - len(done_before)
    assert all(n_calls(tmp_path, x) == 1 for x in done_before)


def test_cache_key_is_a_function_of_experiment_params_and_version():
    base = point_key("m:f", {"n": 8, "seed": 0}, version="1.0")
    assert base == point_key("m:f", {"seed": 0, "n": 8}, version="1.0")  # order of the dict is irrelevant
    assert len({base, point_key("m:f", {"n": 9, "seed": 0}, version="1.0"),
                point_key("m:f", {"n": 8, "seed": 1}, version="1.0"),
                point_key("m:g", {"n": 8, "seed": 0}, version="1.0"),
                point_key("m:f", {"n": 8, "seed": 0}, version="1.1")}) == 5
    assert point_key("m:f", {"n": 8}) == point_key("m:f", {"n": 8}, version=sinkflow.__version__)


def test_record_mode_keeps_going_and_reports_the_failure(tmp_path):
    (tmp_path / "fail_2").touch()
    df = sweep({"x": [1, 2, 3], "calls_dir": str(tmp_path)}, counted, executor="sequential",
               cache_dir=tmp_path / "cache", progress=False, on_error="record")
    assert df.columns[-1] == "error" and "planned failure" in df["error"][1]
    assert df["square"][0] == 1 and df["square"][2] == 9 and np.isnan(df["square"][1])
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 2  # failures are not cached


# ---- grids ------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=3),
                       st.lists(st.integers(-5, 5), min_size=1, max_size=3, unique=True), min_size=1, max_size=4))
def test_grid_is_the_cartesian_product(grid):
    points = expand_grid(grid)
    assert len(points) == int(np.prod([len(v) for v in grid.values()]))
    assert all(list(p) == list(grid) for p in points)
    assert len({json.dumps(p, sort_keys=True) for p in points}) == len(points)


def test_numpy_values_are_accepted_as_plain_numbers():
    points = expand_grid({"n": np.array([8, 16]), "scale": np.float32(2.0)})
    assert points == [{"n": 8, "scale": 2.0}, {"n": 16, "scale": 2.0}]
    assert type(points[0]["n"]) is int


# ---- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("grid, error, match", [
    ({}, ValueError, "empty grid"),
    ([], ValueError, "empty grid"),
    ({"n": []}, ValueError, "parameter 'n' has no values"),
    ({"n": [object()]}, TypeError, "not JSON-serialisable"),
    ({"n": [np.zeros((2, 2))]}, TypeError, "not JSON-serialisable"),
    ({"scale": [float("nan")]}, ValueError, "not a finite number"),
    ([{"n": 8}, {"n": 8}], ValueError, "duplicate grid point"),
    ([8, 16], TypeError, "must be a dict"),
    ("n=8", TypeError, "dict of lists or a list of dicts"),
])
def test_bad_grids_get_clear_errors(grid, error, match):
    with pytest.raises(error, match=match):
        sweep(grid, EXPERIMENT, executor="sequential", cache_dir=None, progress=False)


@pytest.mark.parametrize("fn, error, match", [
    ("sinkflow.experiments:no_such_experiment", ValueError, "unknown experiment.*defines: sinkhorn_convergence"),
    ("sinkflow.no_such_module:f", ValueError, "unknown experiment.*no module named"),
    ("sinkhorn_convergence", ValueError, "'module:function'"),
    ("sinkflow:__version__", TypeError, "not a function"),
    (42, TypeError, "function or a 'module:function' string"),
])
def test_unknown_experiments_get_clear_errors(fn, error, match):
    with pytest.raises(error, match=match):
        resolve_experiment(fn)


@pytest.mark.parametrize("fn, error, match", [
    (returns_list, TypeError, "must return a dict"),
    (returns_object, TypeError, "'value'.*not a scalar"),
    (returns_param_name, ValueError, "name of a parameter"),
])
def test_bad_results_get_clear_errors(fn, error, match):
    with pytest.raises(SweepError, match=match) as info:
        sweep({"x": [1]}, fn, executor="sequential", cache_dir=None, progress=False)
    assert isinstance(info.value.__cause__, error)


def test_lambdas_cannot_key_a_cache(tmp_path):
    with pytest.raises(ValueError, match="lambda or a local function"):
        sweep({"x": [1]}, lambda x: {"y": x}, executor="sequential", cache_dir=tmp_path, progress=False)
    df = sweep({"x": [1]}, lambda x: {"y": x}, executor="sequential", cache_dir=None, progress=False)
    assert df["y"].tolist() == [1]


@pytest.mark.parametrize("executor, error", [("threads", ValueError), (2, TypeError)])
def test_bad_executors_are_refused_before_any_work(executor, error, tmp_path):
    with pytest.raises(error, match="executor"):
        sweep({"x": [1], "calls_dir": str(tmp_path)}, counted, executor=executor, cache_dir=None, progress=False)
    assert n_calls(tmp_path, 1) == 0


# ---- plotting and CLI ---------------------------------------------------------------------


def test_plot_sweep_draws_one_line_per_hue_and_averages_repeats():
    import matplotlib.pyplot as plt

    df = pd.DataFrame({"n": [8, 8, 16, 16] * 2, "seed": [0, 1] * 4, "scale": [1.0] * 4 + [2.0] * 4,
                       "err": [1.0, 3.0, 0.5, 0.7, 2.0, 2.0, 1.0, 1.0]})
    fig = sinkflow.plot_sweep(df, "n", "err", hue="scale", labels={"scale": "$s$"})
    lines = fig.axes[0].get_lines()
    assert [ln.get_label() for ln in lines] == ["$s$ = 1.0", "$s$ = 2.0"]
    np.testing.assert_allclose(lines[0].get_ydata(), [2.0, 0.6])  # mean over the two seeds
    with pytest.raises(KeyError, match="not in the table"):
        sinkflow.plot_sweep(df, "n", "missing")
    plt.close("all")


def test_cli_sweep_writes_the_table(tmp_path, capsys):
    from sinkflow.cli import main

    config = tmp_path / "study.toml"
    config.write_text(textwrap.dedent(f"""
        experiment = "{EXPERIMENT}"
        executor = "sequential"
        cache_dir = "{tmp_path / 'cache'}"
        [grid]
        n = [8, 16]
        scale = [1.0, 2.0]
    """))
    assert main(["sweep", str(config), "--quiet"]) == 0
    table = pd.read_csv(tmp_path / "study.csv")
    assert len(table) == 4 and {"n", "scale", "observed_rate"} <= set(table.columns)
    assert "4 points (0 cached, 4 computed" in capsys.readouterr().err


@pytest.mark.parametrize("text, match", [
    ('experiment = "sinkflow.experiments:nope"\n[grid]\nn = [8]\n', "unknown experiment"),
    ('experiment = "x:y"\nflavour = 1\n[grid]\nn = [8]\n', "unknown key"),
    ('[grid]\nn = [8]\n', "names no experiment"),
    (f'experiment = "{EXPERIMENT}"\n', "exactly one of 'grid'"),
    (f'experiment = "{EXPERIMENT}"\n[grid]\nn = []\n', "empty grid"),
])
def test_cli_bad_configs_get_clear_errors(tmp_path, capsys, text, match):
    from sinkflow.cli import main

    config = tmp_path / "bad.toml"
    config.write_text(text)
    assert main(["sweep", str(config), "--executor", "sequential", "--quiet"]) == 2
    assert match in capsys.readouterr().err


def test_cli_sweep_takes_a_json_list_of_points(tmp_path, monkeypatch):
    from sinkflow.cli import main

    monkeypatch.chdir(tmp_path)  # where the default cache folder would appear
    config = tmp_path / "points.json"
    config.write_text(json.dumps({"experiment": EXPERIMENT, "executor": "sequential",
                                  "points": [{"n": 8, "scale": 1.0}, {"n": 12, "scale": 3.0}],
                                  "out": str(tmp_path / "out" / "table.csv")}))
    assert main(["sweep", str(config), "--no-cache", "--quiet"]) == 0
    table = pd.read_csv(tmp_path / "out" / "table.csv")
    assert table[["n", "scale"]].values.tolist() == [[8, 1.0], [12, 3.0]]
    assert not (tmp_path / ".sinkflow_cache").exists()  # --no-cache: nothing written
    assert main(["sweep", str(config), "--quiet"]) == 0
    assert len(list((tmp_path / ".sinkflow_cache").rglob("*.json"))) == 2


def test_a_scheduler_address_reaches_an_existing_cluster(tmp_path, client):
    address = client.scheduler.address  # as given by dask-jobqueue, Kubernetes or `dask scheduler`
    df = sweep({"x": [1, 2], "calls_dir": str(tmp_path)}, counted, executor=address, cache_dir=None, progress=False)
    assert df["square"].tolist() == [1, 4] and df.attrs["executor"] == address
