"""Every registered figure runs in quick mode, deterministically, writes byte-identical files,
and gets manifest rows and reference data that a rerun of its experiment reproduces within the
figure's tolerances; the committed figures/ reproduce under 1 and 2 threads (`sinkflow figures
--check`; CI also runs it under each CPU kernel), rounding noise leaves them untouched and a real
change does not."""

import hashlib
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from sinkflow.attention import SinkhornWarning
from sinkflow.cli import main
from sinkflow.plots import (
    Tolerance,
    compare_data,
    compute,
    config_hash,
    data_checksum,
    flatten_data,
    get,
    read_manifest,
    read_reference,
    reference_path,
    registry,
    render,
    stale,
)

NAMES = sorted(registry())
#: Figures whose quick config takes more than a few seconds to compute (CPU s on the 2-core development
#: machine): their quick-mode checks run with the slow tests (circle_metastable_clusters and heat_normalizations
#: are default figures: `sinkflow figures` computes and checks them in CI all the same).
SLOW_QUICK = {"attention_lipschitz": 55, "long_context": 10, "clustering_phase_diagram": 16, "norm_placements": 5,
              "circle_metastable_clusters": 5, "heat_normalizations": 5}
QUICK_NAMES = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_QUICK else n for n in NAMES]


def compute_strictly(spec, cfg):
    """``spec.compute(cfg)`` with sinkflow's warnings (RuntimeWarning, SinkhornWarning) as errors:
    the library must not warn about its own defaults (issue 19: particles_sphere's step did)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        warnings.simplefilter("error", SinkhornWarning)
        return spec.compute(cfg)


@pytest.fixture(scope="session")
def quick_data():
    """Each figure's quick-mode data, computed at most once per test run (on first use), warnings as errors."""
    cache = {}

    def data(name):
        if name not in cache:
            spec = get(name)
            cache[name] = compute_strictly(spec, spec.quick)
        return cache[name]

    return data


@pytest.mark.parametrize("name", QUICK_NAMES)
def test_quick_config_computes_without_warnings(name, quick_data):
    assert quick_data(name)  # raises if the computation warned


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", NAMES)
def test_full_config_computes_without_warnings(name):
    spec = get(name)
    assert compute_strictly(spec, spec.full)


@pytest.mark.parametrize("name", QUICK_NAMES)
def test_figure_renders_in_quick_mode_and_is_recorded_in_the_manifest(name, tmp_path, quick_data):
    spec = get(name)
    data = quick_data(name)
    paths = render(name, out=tmp_path, data=data)
    plt.close("all")
    assert paths and all(p.exists() and p.stat().st_size > 0 for p in paths)
    rows = [r for r in read_manifest(tmp_path).values() if r["figure"] == name]
    assert {r["file"] for r in rows} == {p.name for p in paths}
    assert all(r["mode"] == "quick" and r["config_hash"] == config_hash(name, spec.quick) for r in rows)
    assert all(r["data_checksum"] == data_checksum(data) for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_figure_data_is_a_pure_function_of_the_seeded_config(name, quick_data):
    # A reader re-running the experiment gets the same data (a second computation: slow).
    spec = get(name)
    assert data_checksum(spec.compute(spec.quick)) == data_checksum(quick_data(name))


def test_rerender_is_byte_identical(tmp_path, quick_data):
    # One cheap figure recomputed from its seeded config in the default run (all of them: slow).
    name = "normalizations_convergence"
    first = render(name, out=tmp_path / "a", data=quick_data(name))
    second = render(name, out=tmp_path / "b", formats=("pdf", "png"))  # the order asked for does not matter
    assert [p.name for p in first] == [q.name for q in second]
    for p, q in zip(first, second, strict=True):
        assert hashlib.sha256(p.read_bytes()).digest() == hashlib.sha256(q.read_bytes()).digest(), p.name


def test_unknown_figure_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown figure"):
        get("no_such_figure")


# --------------------------------------------------------------------------------------------
# `sinkflow figures --check`, `--data`, formats

FIGURES = Path(__file__).resolve().parents[2] / "figures"
# The two cheapest default figures, checked in the default run; the slow test checks them all.
# `sinkflow figures --check` seconds per figure (1 thread, shared 2-core machine, compute + render):
# normalizations_convergence 1.1, particles_trajectories 1.2, particles_energy 1.5,
# nystrom_error_vs_landmarks 2.0, normalizations_attention 2.1, heat_snapshots 2.7, landmark_flow_errors 2.7,
# heat_normalizations 7.5 (all eight: about 30 s).
CHEAP = ["normalizations_convergence", "particles_trajectories"]
DEFAULTS = [name for name, spec in registry().items() if spec.default]


def _check(names, threads):
    """`sinkflow figures NAMES --check` against figures/MANIFEST.tsv with torch and BLAS on ``threads``."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(threads):
            return main(["figures", *names, "--check", "--out", str(FIGURES)])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
def test_committed_figures_reproduce_under_any_thread_count(threads, capsys):
    """`sinkflow figures --check` regenerates and matches figures/MANIFEST.tsv with 1 or 2 threads."""
    assert set(CHEAP) <= set(DEFAULTS)
    assert _check(CHEAP, threads) == 0, capsys.readouterr().err


@pytest.mark.slow
def test_every_committed_default_figure_reproduces(capsys):
    """`sinkflow figures --check` over the whole default set (what the default run samples with CHEAP)."""
    assert _check(DEFAULTS, 1) == 0, capsys.readouterr().err


def test_check_fails_on_a_changed_manifest(tmp_path, capsys):
    """The reference data must be those the manifest names (a hand-edited row is caught)."""
    import shutil

    shutil.copytree(FIGURES, tmp_path / "figures")
    manifest = (tmp_path / "figures" / "MANIFEST.tsv").read_text().splitlines()
    row = next(i for i, line in enumerate(manifest) if line.startswith(CHEAP[0] + "\t"))
    cells = manifest[row].split("\t")
    cells[4] = "0" * 16  # another data checksum
    manifest[row] = "\t".join(cells)
    (tmp_path / "figures" / "MANIFEST.tsv").write_text("\n".join(manifest) + "\n")
    assert main(["figures", CHEAP[0], "--check", "--out", str(tmp_path / "figures")]) == 1
    assert "reference data" in capsys.readouterr().err


@pytest.mark.parametrize("name", CHEAP)
def test_another_seed_fails_the_check(name):
    """A real change of the data (the next seed) is outside the tolerances: the check keeps its teeth."""
    spec = get(name)
    moved = stale(name, compute(name, seed=spec.quick.seed + 1), out=FIGURES)
    assert moved and all(line.startswith("data: ") for line in moved), moved
    assert not stale(name, compute(name), out=FIGURES)


def _rounding_noise(data, rng):
    """What another CPU kernel does to the data: relative noise 1e-13, values at rounding level anywhere below 1e-10."""
    noisy = {}
    for key, arr in flatten_data(data).items():
        if arr.dtype.kind == "f":
            arr = arr * (1 + 1e-13 * rng.standard_normal(arr.shape))
            arr = np.where(np.abs(arr) < 1e-11, 1e-11 * rng.random(arr.shape), arr)
        noisy[key] = arr
    return noisy


def test_rounding_noise_leaves_committed_figures_untouched(tmp_path):
    """`sinkflow figures` on another CPU: data that moved at rounding level change no file."""
    import shutil

    shutil.copytree(FIGURES, tmp_path / "figures")
    out = tmp_path / "figures"
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    noisy = _rounding_noise(compute(CHEAP[0]), np.random.default_rng(0))
    assert not stale(CHEAP[0], noisy, out=out)
    render(CHEAP[0], out=out, data=noisy)
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    moved = flatten_data(compute(CHEAP[0]))
    key = next(k for k, v in moved.items() if v.dtype.kind == "f" and np.abs(v).max() > 1e-3)
    moved[key] = moved[key] * (1 + 1e-5)  # visible in no figure, but a real change: redrawn
    render(CHEAP[0], out=out, data=moved)
    assert read_reference(reference_path(out, CHEAP[0]))[key].tolist() == moved[key].tolist()
    assert not stale(CHEAP[0], moved, out=out)


def test_tolerance_compares_within_rtol_atol_and_floor():
    tol = Tolerance(rtol=1e-6, atol=1e-12, floor=1e-9)
    ref = np.array([1.0, 1e-3, 5e-10, np.nan, np.inf, 0.0])
    assert tol.allows(np.array([1 + 9e-7, 1e-3 * (1 + 9e-7), 1e-9, np.nan, np.inf, 1e-9]), ref).all()
    far = np.array([1 + 2e-6, 1e-3 * (1 + 2e-6), 2e-9, 0.0, -np.inf, 2e-9])
    assert not tol.allows(far, ref).any()
    assert compare_data({"n": np.arange(3)}, {"n": np.arange(3) + np.array([0, 0, 1])})  # integers: exact
    assert compare_data({"x": np.zeros(3)}, {"x": np.zeros(4)})[0].startswith("x: shape")
    assert compare_data({"x": 1.0}, {"y": 1.0}) == ["y: missing (in the reference, not in the new data)",
                                                    "x: not in the reference"]


def test_a_figure_states_wider_tolerances_for_the_arrays_that_need_them():
    spec = get("normalizations_convergence")
    data = flatten_data(compute("normalizations_convergence"))
    moved = dict(data, observed_rate=data["observed_rate"] * (1 + 5e-6))  # the spread measured across kernels
    assert compare_data(moved, data, dict(spec.tolerances)) == []
    assert compare_data(moved, data) != []  # the default tolerance would call it a change


def test_data_option_writes_the_figure_data(tmp_path):
    assert main(["figures", CHEAP[1], "--data", "--format", "png", "--out", str(tmp_path)]) == 0
    saved = np.load(tmp_path / f"{CHEAP[1]}.npz")
    data = flatten_data(get(CHEAP[1]).compute(get(CHEAP[1]).quick))
    assert set(saved.files) == set(data)
    for key in data:
        np.testing.assert_array_equal(saved[key], data[key])


def test_animation_refuses_a_format_it_cannot_write(tmp_path, capsys):
    assert main(["figures", "particles_animation", "--format", "svg", "--out", str(tmp_path)]) == 2
    assert "cannot be written as svg" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="supports gif"):
        render("particles_animation", out=tmp_path, formats=("png",))


def test_unregister_removes_a_figure_and_refuses_an_unknown_name():
    from dataclasses import dataclass

    from sinkflow.plots import register, registry, unregister

    @dataclass(frozen=True)
    class Cfg:
        seed: int = 0

    spec = register("test_unregistered", compute=lambda cfg: {"x": 1.0}, plot=lambda data, cfg: None, quick=Cfg())
    assert "test_unregistered" in registry()
    assert unregister("test_unregistered") is spec and "test_unregistered" not in registry()
    with pytest.raises(ValueError, match="no registered figure 'test_unregistered'"):
        unregister("test_unregistered")


def test_quick_figure_data_are_computed_on_one_torch_thread(tmp_path):
    # committed figures must not depend on the core count: a thread pool's split of a reduction
    # moves the last digits, and those move a PDF's coordinates
    from dataclasses import dataclass

    import torch

    from sinkflow.plots import compute, register, render, unregister

    @dataclass(frozen=True)
    class Cfg:
        seed: int = 0

    seen = []
    register("test_threads", compute=lambda cfg: seen.append(torch.get_num_threads()) or {"x": 1.0},
             plot=lambda data, cfg: None, quick=Cfg(), full=Cfg(seed=1), default=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        compute("test_threads")
        compute("test_threads", mode="full")
        render("test_threads", out=tmp_path, formats=())
        assert seen == [1, 2, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
        unregister("test_threads")
