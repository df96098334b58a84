"""Results summarize themselves: every public result type has a short ``repr`` (no arrays) and a
``_repr_html_`` table, built by the one helper module ``sinkflow._summary``; a trajectory's HTML
carries a small PNG still, and ``Trajectory.to_xarray`` / ``to_dataframe`` label its data."""

import base64
import html
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import sinkflow
from sinkflow._summary import MAX_LINES, Summarized

MAX_CHARS = 500


def _trajectory():
    x0 = sinkflow.random_particles(16, 2, seed=0, manifold="sphere")
    return sinkflow.simulate(x0, "sinkhorn", manifold="sphere", temperature=0.5, steps=5,
                             monitors=["energy", "marginal_errors"])


def _ensemble():
    x0 = np.stack([sinkflow.random_particles(8, 2, seed=s, manifold="sphere") for s in range(6)]).reshape(2, 3, 8, 2)
    return sinkflow.simulate(x0, "softmax", manifold="sphere", steps=4, h=np.array([[0.1, 0.2, 0.1], [0.1, 0.1, 0.1]]),
                             monitors=["clusters"])


def _nystrom_check():
    Q, K = 0.5 * np.random.default_rng(0).normal(size=(2, 16, 4))
    return sinkflow.nystrom_check(Q, K, landmarks=8, trials=4)


def _training_history():
    from sinkflow.studies import SetClassifier, TrainConfig, train
    from sinkflow.studies.data import Dataset

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 5, 3, generator=g), torch.randint(0, 2, (24,), generator=g)
    torch.manual_seed(0)
    model = SetClassifier(3, 2, dim=8, heads=2, depth=1)
    return train(model, Dataset(x[:16], y[:16], 2, "toy"), Dataset(x[16:], y[16:], 2, "toy"),
                 TrainConfig(epochs=1, batch_size=8, track_kl=False, instability_eps=None, probe_size=8))


GRID = np.linspace(-7, 7, 141)


def _gaussian(variance):
    return sinkflow.GaussianMixture.gaussian([0.0], [[variance]])


def _symbolic():
    from sinkflow.heat.symbolic import heat_kernel_solves_heat

    return heat_kernel_solves_heat(1)


#: Every public result type: (name, builder, facts its repr must state).
CASES = {
    "Trajectory": (_trajectory, ["16 tokens", "6 states", "sinkhorn", "sphere", "converged", "euler"]),
    "Trajectory (ensemble)": (_ensemble, ["6 systems (2, 3)", "8 tokens", "softmax", "h: 0.1 to 0.2"]),
    "SinkhornResult": (lambda: sinkflow.solve_sinkhorn(torch.randn(5, 5, dtype=torch.float64)),
                       ["5 x 5", "float64", "converged", "tol", "half-iterations"]),
    "MarginalErrors": (lambda: sinkflow.marginal_errors(np.full((4, 3, 3), 1 / 3)), ["batch of 4", "row", "column"]),
    "NystromErrors": (lambda: sinkflow.nystrom_errors(*np.random.default_rng(0).normal(size=(2, 16, 4)), 8, trials=3),
                      ["3 draws", "m=8", "||C - C~||_2"]),
    "NystromCheck": (_nystrom_check, ["bound", "theorem does not apply", "lambda", ".summary()"]),
    "NystromFactors": (lambda: sinkflow.nystrom_factors(*torch.randn(2, 12, 4), 5), ["m = 5", "12 x 12", "pinv"]),
    "FieldEvaluation": (lambda: sinkflow.particles.attention_field(torch.randn(6, 2, dtype=torch.float64), "sinkhorn",
                                                                   None, None), ["velocity 6 x 2", "converged"]),
    "ClusterPrediction": (lambda: sinkflow.clustering.predict_clusters(
        np.random.default_rng(0).uniform(0, 2 * np.pi, 200), 5.0), ["k* = 3", "formation time", "positions"]),
    "HardmaxTargets": (lambda: sinkflow.hardmax_targets([[1.0, 0.0], [0.0, 1.0], [0.2, 0.1]], np.eye(2)),
                       ["3 tokens", "predicted: 3 of 3", "dominant points: 2", "stationary: 2"]),
    "CriticalScaling": (lambda: sinkflow.critical_scaling(50, d=8, gammas=[1.0, 2.0], seeds=[0, 1]),
                        ["n = 50", "rho = 0.5", "2 seeds", "gamma_c: 2", "closed form"]),
    "GaussianMomentFlow": (lambda: sinkflow.gaussian_moment_flow([1.0, 0.0], np.eye(2), [0.0, 0.5],
                                                                 normalization="sinkhorn"),
                           ["2 times", "d = 2", "sinkhorn", "final mean", "ODE"]),
    "HeatFlowResult": (lambda: sinkflow.heat_trajectory(sinkflow.random_particles(12, 1, seed=0), [0.0, 0.02],
                                                        eps=0.2, dt=0.01),
                       ["2 snapshots", "12 particles", "sinkhorn", "converged"]),
    "MeanFieldResult": (lambda: sinkflow.mean_field_flow(_gaussian(1.0).pdf(GRID), GRID, [0.0, 0.1], eps=0.2,
                                                         normalization="softmax_gaussian"),
                        ["densities 2 x 141", "softmax_gaussian", "mass error"]),
    "GridHeatSolution": (lambda: sinkflow.solve_heat_grid(_gaussian(0.5).pdf, [np.linspace(-8, 8, 101)], [0.5, 1.0]),
                         ["2 x 101", "1-D grid", "error bound"]),
    "BarycentricMapResult": (lambda: sinkflow.barycentric_map(_gaussian(1.0), np.linspace(-7, 7, 71), eps=0.1),
                             ["sinkhorn", "71 grid points", "error"]),
    "LandmarkFlowErrors": (lambda: sinkflow.heat.landmark_flow_errors(sinkflow.random_particles(12, 2, seed=0), (4, 12),
                                                                      h=0.05, steps=2),
                           ["2 landmark counts", "spectral error", "Lipschitz"]),
    "W2Result": (lambda: sinkflow.wasserstein2(np.random.default_rng(0).normal(size=(50, 1)), _gaussian(1.0)),
                 ["W2 = ", "quantile"]),
    "MomentErrors": (lambda: sinkflow.moment_errors(np.random.default_rng(0).normal(size=(50, 2)),
                                                    mean=np.zeros(2), covariance=np.eye(2)),
                     ["mean error", "covariance error"]),
    "ConvergenceStudy": (lambda: sinkflow.convergence_study([0.1, 0.2, 0.4], lambda e, s: 3 * e * (1 + 0.01 * s)),
                         ["slope 1", "3 values x 3 seeds"]),
    "StochasticitySummary": (lambda: sinkflow.studies.stochasticity_summary(torch.full((2, 4, 4), 0.25)),
                             ["column deviation 0", "4 columns"]),
    "TrainingHistory": (_training_history, ["1 epoch", "final loss", "test accuracy"]),
    "SymbolicCheck": (_symbolic, ["holds", "identity"]),
}


@pytest.fixture(scope="module")
def results():
    return {}


def _build(results, name):
    if name not in results:
        results[name] = CASES[name][0]()
    return results[name]


@pytest.mark.parametrize("name", list(CASES))
def test_repr_is_short_and_states_the_facts(results, name):
    obj = _build(results, name)
    text = repr(obj)
    assert isinstance(obj, Summarized) or type(obj)._repr_html_ is Summarized._repr_html_  # one helper for all
    assert len(text.splitlines()) <= MAX_LINES, text
    assert len(text) <= MAX_CHARS, (len(text), text)
    assert text.startswith(f"<{type(obj).__name__}>"), text
    for fact in CASES[name][1]:
        assert fact in text, (fact, text)
    assert "array(" not in text and "tensor(" not in text and "[[" not in text, text  # no array dumped


@pytest.mark.parametrize("name", list(CASES))
def test_html_is_a_table_of_the_same_facts(results, name):
    obj = _build(results, name)
    page = obj._repr_html_()
    assert "<table" in page and "</table>" in page
    assert f"<b>{type(obj).__name__}</b>" in page
    # every (label, value) pair of the repr is a row of the table, escaped
    head, lines = Summarized._lines(obj)
    assert html.escape(head) in page
    for label, value in (pair for group in lines for pair in group):
        assert f">{html.escape(label)}</th>" in page and f">{html.escape(value)}</td>" in page, (label, value)
        assert (f"{label}: {value}" if label else value) in repr(obj)


def test_html_escapes_text():
    class Odd(Summarized):
        def _facts(self):
            return "<script>", [[("a<b", "x & y")]]

    page = Odd()._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page and "a&lt;b" in page and "x &amp; y" in page
    assert repr(Odd()) == "<Odd> <script>\n  a<b: x & y"


def test_a_summary_never_grows_past_its_lines():
    class Long(Summarized):
        _summary_hint = "see .summary()"

        def _facts(self):
            return "head", [[(f"k{i}", str(i))] for i in range(9)]

    text = repr(Long())
    assert len(text.splitlines()) == MAX_LINES and "k8: 8" in text and text.endswith("see .summary()")


def test_trajectory_html_has_a_small_png_still(results):
    traj = _build(results, "Trajectory")
    page = traj._repr_html_()
    assert len(page) < 30_000
    uri = re.search(r'src="data:image/png;base64,([^"]+)"', page)
    assert uri, page[:300]
    png = base64.b64decode(uri.group(1))
    assert png.startswith(b"\x89PNG") and len(png) < 20_000


def test_trajectory_still_changes_no_global_matplotlib_state(results):
    import matplotlib

    def open_figures():  # pyplot's, if loaded (another test module may have left one open: compare, not count)
        return sys.modules["matplotlib.pyplot"].get_fignums() if "matplotlib.pyplot" in sys.modules else []

    traj = _build(results, "Trajectory (ensemble)")
    backend, rc, before = matplotlib.get_backend(), dict(matplotlib.rcParams), open_figures()
    assert "data:image/png;base64," in traj._repr_html_()
    assert matplotlib.get_backend() == backend and dict(matplotlib.rcParams) == rc
    assert open_figures() == before, "the still opened a pyplot figure"


def test_trajectory_repr_torch_and_fixed_iterations():
    x0 = torch.tensor(sinkflow.random_particles(10, 3, seed=1), dtype=torch.float32)
    traj = sinkflow.simulate(x0, "sinkhorn", steps=3, n_iter=4, integrator="rk4", monitors=["marginal_errors"])
    text = repr(traj)
    assert "torch float32" in text and "n_iter = 4 per solve (fixed)" in text and "rk4" in text
    assert "worst marginal error" in text and "converged" not in text  # a fixed n_iter claims no convergence
    assert "data:image/png;base64," in traj._repr_html_()  # d = 3: the first two coordinates


def test_trajectory_repr_says_when_a_solve_did_not_converge(results):
    from dataclasses import replace

    traj = replace(_build(results, "Trajectory"), converged=False)
    assert "NOT converged" in repr(traj)
    ens = replace(_build(results, "Trajectory (ensemble)"), attention="sinkhorn",
                  converged=np.array([[True, False, True], [True, True, True]]))
    assert "NOT converged in 1/6 systems" in repr(ens)


def test_trajectory_repr_shows_how_the_field_was_evaluated(results):
    from dataclasses import replace

    traj = _build(results, "Trajectory")
    assert "evaluation: dense (one n x n matrix fits the dense budget" in repr(traj)  # as simulate recorded it
    by_hand = replace(traj, evaluation=None)  # a trajectory built by hand: read from its flags
    assert "evaluation: dense" in repr(by_hand)
    assert "evaluation: landmarks (m = 8)" in repr(replace(by_hand, landmarks=8))
    assert "evaluation: chunked" in repr(replace(by_hand, chunked=True))
    assert "evaluation: harmonic (order 12)" in repr(replace(by_hand, harmonic_order=12))


def test_nystrom_check_repr_separates_the_bound_from_the_theorem(results):
    check = _build(results, "NystromCheck")
    text = repr(check)
    assert not check.theorem_applies
    bound = next(line for line in text.splitlines() if line.strip().startswith("bound:"))
    assert ("holds" if check.bound_holds else "FAILS") in bound
    assert f"m = 8 < {check.m_required} required landmarks" in text and "promises nothing" in text
    from dataclasses import replace

    assert "theorem applies: m = 8 >= 5 required" in repr(replace(check, theorem_applies=True, m_required=5))
    assert "THEOREM REFUTED" in repr(replace(check, theorem_applies=True, consistent=False, bound_holds=False))

    # the verdict follows bound_holds both ways (a repr that always said "holds" passed the lines above)
    def bound_line(result):
        return next(line for line in repr(result).splitlines() if line.strip().startswith("bound:"))

    failed = replace(check, bound_holds=False, failures=check.trials, failure_rate=1.0)
    held = replace(check, bound_holds=True, failures=0, failure_rate=0.0)
    assert "FAILS" in bound_line(failed) and "holds" not in bound_line(failed), bound_line(failed)
    assert f"0/{check.trials} draws" in bound_line(failed)
    assert "holds" in bound_line(held) and "FAILS" not in bound_line(held), bound_line(held)
    assert f"{check.trials}/{check.trials} draws" in bound_line(held)


def test_marginal_errors_of_one_matrix_keep_their_plain_repr():
    assert repr(sinkflow.marginal_errors(np.array([[1.0, 0.0], [1.0, 0.0]]))) == "MarginalErrors(row=0.0, column=1.0)"
    assert "<table" in sinkflow.marginal_errors(np.eye(2))._repr_html_()


# --------------------------------------------------------------------------- analysis
def test_to_xarray_labels_positions(results):
    xr = pytest.importorskip("xarray")
    traj = _build(results, "Trajectory")
    da = traj.to_xarray()
    assert isinstance(da, xr.DataArray)
    assert da.dims == ("time", "token", "coordinate") and da.shape == (6, 16, 2)
    np.testing.assert_array_equal(da.values, traj.positions)
    np.testing.assert_allclose(da.time.values, traj.times)
    np.testing.assert_array_equal(da.step.values, np.arange(6))
    assert da.attrs == {"attention": "sinkhorn", "manifold": "sphere", "integrator": "euler", "n_iter": "to tolerance",
                        "steps": 5, "h": 0.1, "temperature": 0.5, "converged": 1}
    assert float(da.sel(time=0.5, method="nearest")[0, 0]) == traj.positions[-1, 0, 0]


def test_to_xarray_of_an_ensemble_and_of_torch(results):
    pytest.importorskip("xarray")
    ens = _build(results, "Trajectory (ensemble)")
    da = ens.to_xarray()
    assert da.dims == ("time", "system_0", "system_1", "token", "coordinate") and da.shape == (5, 2, 3, 8, 2)
    np.testing.assert_array_equal(da.values, ens.positions)
    assert da.time.dims == ("time", "system_0", "system_1")  # a h per system: times differ by system
    np.testing.assert_allclose(da.time.values, ens.times)
    np.testing.assert_array_equal(da.h.values, ens.h)
    assert "h" not in da.attrs and da.attrs["temperature"] == 1.0
    one = sinkflow.simulate(np.stack([sinkflow.random_particles(6, 2, seed=s) for s in range(3)]), "softmax", steps=2)
    assert one.to_xarray().dims == ("time", "system", "token", "coordinate")
    x0 = torch.tensor(sinkflow.random_particles(6, 2, seed=0), requires_grad=True)
    grad = sinkflow.simulate(x0, "softmax", steps=2, n_iter=None)
    da = grad.to_xarray()
    assert isinstance(da.values, np.ndarray) and da.attrs["n_iter"] == "to tolerance"
    np.testing.assert_array_equal(da.values, grad.positions.detach().numpy())


def test_to_dataframe_is_tidy(results):
    pd = pytest.importorskip("pandas")
    traj = _build(results, "Trajectory")
    df = traj.to_dataframe()
    assert isinstance(df, pd.DataFrame) and list(df.columns) == ["time", "monitor", "value"]
    assert len(df) == len(traj.monitor_times) * len(traj.monitors)
    for key, values in traj.monitors.items():
        rows = df[df.monitor == key]
        np.testing.assert_allclose(rows.value, values)
        np.testing.assert_allclose(rows.time, traj.monitor_times)
    wide = df.pivot_table(index="time", columns="monitor", values="value")
    assert sorted(wide.columns) == sorted(traj.monitors)


def test_to_dataframe_of_an_ensemble(results):
    pytest.importorskip("pandas")
    ens = _build(results, "Trajectory (ensemble)")
    df = ens.to_dataframe()
    assert list(df.columns) == ["time", "system_0", "system_1", "monitor", "value"]
    assert len(df) == len(ens.monitor_times) * 6 * len(ens.monitors)
    for key, values in ens.monitors.items():
        one = df[(df.monitor == key) & (df.system_0 == 1) & (df.system_1 == 2)]
        np.testing.assert_allclose(one.value, values[:, 1, 2])
        np.testing.assert_allclose(one.time, ens.monitor_times[:, 1, 2])
    count = df[df.monitor == "cluster_count"].value
    assert np.array_equal(count, np.round(count))


@pytest.mark.parametrize("module, method", [("xarray", "to_xarray"), ("pandas", "to_dataframe")])
def test_a_missing_optional_library_names_the_extra(results, monkeypatch, module, method):
    traj = _build(results, "Trajectory")
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"sinkflow\[analysis\]"):
        getattr(traj, method)()


def test_the_summary_module_loads_nothing_heavy():
    code = ("import sys, sinkflow._summary; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'scipy', 'pandas', 'xarray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_array_descriptions_name_library_dtype_device_and_grad():
    from sinkflow._summary import as_numpy, describe_array

    assert describe_array(np.zeros(2)) == "numpy float64"
    assert describe_array(torch.zeros(2, dtype=torch.bfloat16)) == "torch bfloat16"
    assert describe_array(torch.zeros(2, device="meta")) == "torch float32 on meta"  # a GPU shows as cuda:0
    assert describe_array(torch.zeros(2, requires_grad=True)) == "torch float32, requires grad"
    half = as_numpy(torch.ones(2, dtype=torch.bfloat16, requires_grad=True))
    assert half.dtype == np.float32 and half.tolist() == [1.0, 1.0]
