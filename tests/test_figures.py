"""Every registered figure runs in quick mode, deterministically, writes byte-identical files,
and gets a manifest row that a rerun of its experiment reproduces (config hash, data checksum)."""

import hashlib

import matplotlib.pyplot as plt
import pytest

from sinkflow.plots.registry import config_hash, data_checksum, get, registry, render

NAMES = sorted(registry())


def _manifest(folder):
    lines = (folder / "MANIFEST.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:]]


@pytest.fixture(scope="session")
def quick_data():
    """Each figure's quick-mode data, computed at most once per test run (on first use)."""
    cache = {}

    def data(name):
        if name not in cache:
            spec = get(name)
            cache[name] = spec.compute(spec.quick)
        return cache[name]

    return data


@pytest.mark.parametrize("name", NAMES)
def test_figure_renders_in_quick_mode_and_is_recorded_in_the_manifest(name, tmp_path, quick_data):
    spec = get(name)
    data = quick_data(name)
    paths = render(name, out=tmp_path, data=data)
    plt.close("all")
    assert paths and all(p.exists() and p.stat().st_size > 0 for p in paths)
    rows = [r for r in _manifest(tmp_path) if r["figure"] == name]
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
    second = render(name, out=tmp_path / "b")
    for p, q in zip(first, second):
        assert hashlib.sha256(p.read_bytes()).digest() == hashlib.sha256(q.read_bytes()).digest(), p.name


def test_unknown_figure_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown figure"):
        get("no_such_figure")
