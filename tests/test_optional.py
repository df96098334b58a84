"""A bare install (``pip install torch==2.13.0 -e .``, no extras) works, or says which extra to install.

The optional modules are hidden here (``sys.modules[name] = None``: importing one raises
``ModuleNotFoundError``); each feature that needs one must raise an ``ImportError`` naming
the extra, and a command must say so in one line with exit status 3. CI also runs every
figure on a real bare install (``.ci/install_check.sh``).
"""

import ast
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import sinkflow
from sinkflow._optional import EXTRAS, MissingExtraError, available, install_hint, require
from sinkflow.cli import NEEDS_EXTRA, main

ROOT = Path(__file__).parents[1]
PACKAGE = Path(sinkflow.__file__).parent


#: Import names of distributions whose name differs from them.
IMPORT_NAMES = {"pot": "ot", "pillow": "PIL", "scikit-learn": "sklearn"}


def hide(monkeypatch, *modules):
    """Make ``modules`` (and their loaded submodules) unimportable for the test."""
    for name in modules:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture(scope="module")
def project():
    """``[project]`` of pyproject.toml."""
    tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads TOML")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirement_names(requirement: str) -> set[str]:
    """``"dask[distributed]>=2024.1"`` -> ``{"dask", "dask.distributed"}``."""
    m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", requirement)
    extras = [x.strip() for x in (m.group(2) or "").split(",") if x.strip()]
    return {m.group(1).lower(), *(f"{m.group(1).lower()}.{x}" for x in extras)}


def test_the_extras_table_matches_pyproject(project):
    extras = project["optional-dependencies"]
    for module, (distribution, extra) in EXTRAS.items():
        assert extra in extras, f"{module}: no extra {extra!r} in pyproject.toml"
        names = set().union(*map(_requirement_names, extras[extra]))
        assert distribution.lower() in names, f"{distribution} (for {module}) is not in the {extra} extra: {names}"
        core = set().union(*map(_requirement_names, project["dependencies"]))
        assert distribution.lower() not in core, f"{distribution} is a core dependency: take it out of EXTRAS"


def _core_and_stdlib(project) -> set[str]:
    names = {n.split(".")[0] for r in project["dependencies"] for n in _requirement_names(r)}
    return {IMPORT_NAMES.get(n, n.replace("-", "_")) for n in names} | set(sys.stdlib_module_names) | {"sinkflow"}


def _guarded(tree) -> set[int]:
    """Lines of imports inside a ``try`` whose handlers catch ImportError (an optional nicety with a fallback)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                h.type is not None and "ImportError" in ast.unparse(h.type) for h in node.handlers):
            lines |= {n.lineno for stmt in node.body for n in ast.walk(stmt)
                      if isinstance(n, (ast.Import, ast.ImportFrom))}
    return lines


def test_no_plain_import_of_a_package_outside_the_core_dependencies(project):
    """An optional package is imported through ``require`` (naming its extra), or inside a ``try`` with a fallback."""
    allowed = _core_and_stdlib(project)
    plain = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        guarded = _guarded(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top not in allowed and node.lineno not in guarded:
                    plain.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {top}")
    assert not plain, "use sinkflow._optional.require(module, feature) for:\n" + "\n".join(plain)


def test_require_names_the_extra(monkeypatch):
    hide(monkeypatch, "pandas")
    with pytest.raises(ImportError, match=re.escape('sinkflow.x needs pandas: pip install "sinkflow[sweep]"')) as err:
        require("pandas", "sinkflow.x")
    assert isinstance(err.value, MissingExtraError) and isinstance(err.value, ModuleNotFoundError)
    assert (err.value.name, err.value.extra, err.value.feature) == ("pandas", "sweep", "sinkflow.x")
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert not available("pandas")
    hide(monkeypatch, "sklearn.datasets")
    with pytest.raises(MissingExtraError, match=re.escape('needs scikit-learn: pip install "sinkflow[models]"')):
        require("sklearn.datasets", "the digits")
    with pytest.raises(ValueError, match="not an optional module"):
        require("numpy", "anything")


def test_a_broken_optional_install_is_not_called_missing(monkeypatch):
    # pandas is there, but something it imports is not: that error, not "install the extra"
    def broken(name):
        raise ModuleNotFoundError("No module named 'pytz'", name="pytz")

    monkeypatch.setattr("sinkflow._optional.importlib.import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="pytz") as err:
        require("pandas", "sinkflow.x")
    assert not isinstance(err.value, MissingExtraError)


def test_phase_diagram_says_which_extra_before_computing(monkeypatch):
    hide(monkeypatch, "pandas")
    monkeypatch.setattr("sinkflow.clustering._phase_diagram.clustered_fractions",
                        lambda *a, **k: pytest.fail("computed before the import"))
    message = 'sinkflow.phase_diagram needs pandas: pip install "sinkflow[sweep]"'
    with pytest.raises(ImportError, match=re.escape(message)):
        sinkflow.phase_diagram([1.0], n=4, d=2, normalization="softmax", systems=2, times=[0.0, 1.0], progress=False)


def test_the_phase_diagram_figure_needs_no_pandas_and_draws_phase_diagrams_numbers(monkeypatch):
    from sinkflow.plots import compute

    small = {"betas": 2, "systems": 3, "n": 6, "horizon": 2.0, "per_decade": 2}
    table = sinkflow.phase_diagram(np.linspace(0.1, 9.0, 2), n=6, d=2, normalization="sinkhorn", systems=3,
                                   times=np.geomspace(0.1, 2.0, 4), progress=False)
    hide(monkeypatch, "pandas")
    data = compute("clustering_phase_diagram", **small)
    assert data["fraction_sinkhorn"].shape == (2, len(data["t"])) == (2, 4)
    np.testing.assert_array_equal(data["fraction_sinkhorn"].reshape(-1), table.clustered_fraction.to_numpy())


def test_sweep_says_which_extra(monkeypatch, tmp_path):
    grid, fn = {"n": [8]}, "sinkflow.experiments:sinkhorn_convergence"
    hide(monkeypatch, "distributed")
    with pytest.raises(ImportError, match=re.escape("sinkflow.sweep(executor='dask') needs dask.distributed: "
                                                    'pip install "sinkflow[sweep]"')):
        sinkflow.sweep(grid, fn, executor="dask", cache_dir=None, progress=False)
    assert len(sinkflow.sweep(grid, fn, executor="sequential", cache_dir=None, progress=False)) == 1
    hide(monkeypatch, "dask")
    message = 'sinkflow.sweeps.local_client needs dask: pip install "sinkflow[sweep]"'
    with pytest.raises(ImportError, match=re.escape(message)):
        sinkflow.local_client(n_workers=1)
    hide(monkeypatch, "pandas")
    with pytest.raises(ImportError, match=re.escape('sinkflow.sweep needs pandas: pip install "sinkflow[sweep]"')):
        sinkflow.sweep(grid, fn, executor="sequential", cache_dir=None, progress=False)
    # the command line: one line, exit status 3
    config = tmp_path / "s.json"
    config.write_text(json.dumps({"experiment": fn, "grid": {"n": [8]}, "executor": "sequential"}))
    assert main(["sweep", str(config), "--quiet", "--no-cache"]) == NEEDS_EXTRA


def test_digits_say_which_extra(monkeypatch):
    from sinkflow.studies.data import digits

    hide(monkeypatch, "sklearn")
    with pytest.raises(ImportError, match=re.escape('needs scikit-learn: pip install "sinkflow[models]"')):
        digits()


def test_the_sliders_fall_back_without_ipywidgets(monkeypatch, capsys):
    from sinkflow.plots.interactive import interact

    hide(monkeypatch, "ipywidgets")

    def show(eps=0.1):
        print(f"eps = {eps}")

    assert interact(show, eps=(0.0, 1.0, 0.1)) is None
    assert capsys.readouterr().out == "eps = 0.1\n"


def test_a_figure_that_needs_a_missing_extra_is_named_in_one_line(monkeypatch, tmp_path, capsys):
    hide(monkeypatch, "sklearn")
    assert main(["figures", "--list"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if "training_column_sums" in line]
    assert listed and listed[0].endswith("[needs sinkflow[models]: not installed]")
    out = tmp_path / "figs"
    assert main(["figures", "training_column_sums", "normalizations_attention", "--out", str(out),
                 "--format", "png"]) == NEEDS_EXTRA
    err = capsys.readouterr().err
    assert 'training_column_sums: not made: needs scikit-learn: pip install "sinkflow[models]"' in err.splitlines()
    assert "Traceback" not in err and "not made (what they need is not installed): training_column_sums" in err
    assert (out / "normalizations_attention.png").exists() and not list(out.glob("training_column_sums*"))
    # --check: the figure is reported and not compared; the status says an extra is missing
    assert main(["figures", "training_column_sums", "--check", "--out", str(ROOT / "figures")]) == NEEDS_EXTRA
    assert "training_column_sums: not made: needs scikit-learn" in capsys.readouterr().err


def test_an_undeclared_need_is_still_one_line(monkeypatch, tmp_path, capsys):
    from dataclasses import dataclass

    from sinkflow.plots import register, unregister

    @dataclass(frozen=True)
    class Config:
        n: int = 2

    def compute(cfg):
        require("pandas", "the demo figure")
        return {"y": np.arange(cfg.n)}

    register("demo_needs_pandas", compute=compute, plot=lambda data, cfg: None, quick=Config(), default=False)
    try:
        hide(monkeypatch, "pandas")
        assert main(["figures", "demo_needs_pandas", "--out", str(tmp_path)]) == NEEDS_EXTRA
        assert 'demo_needs_pandas: not made: needs pandas: pip install "sinkflow[sweep]"' in capsys.readouterr().err
    finally:
        unregister("demo_needs_pandas")
    with pytest.raises(ValueError, match="neither optional modules"):
        register("demo_bad_needs", compute=compute, plot=lambda data, cfg: None, quick=Config(), needs=("numpy",))


def test_install_hint_names_every_extra_module():
    assert {install_hint(m).split(":")[0] for m in EXTRAS} == {d for d, _ in EXTRAS.values()}


def test_figures_of_the_checkouts_study_data_say_so_from_a_wheel(monkeypatch, tmp_path, capsys):
    # a wheel ships no docs/: the figures that draw committed study runs name what they need
    from sinkflow._optional import NeedsCheckoutError
    from sinkflow.plots import compute, registry

    monkeypatch.setattr("sinkflow._optional.checkout_path", lambda relative: tmp_path / "site-packages" / relative)
    needing = sorted(name for name, spec in registry().items() if any("/" in n for n in spec.needs))
    assert needing == ["cluster_predictions", "dynamic_metastability"]
    for name in needing:
        with pytest.raises(NeedsCheckoutError, match=r"needs docs/data/clustering/\w+\.json of a source checkout"):
            compute(name)
    assert main(["figures", *needing, "--out", str(tmp_path / "figs")]) == NEEDS_EXTRA
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in err if ": not made: needs docs/data/clustering/" in line] == needing
