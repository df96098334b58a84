"""Every public name of every public subpackage is importable from ``sinkflow`` itself (README), lazily.

``sinkflow._EXPORTS`` is a static table (``import sinkflow`` imports no subpackage to read
their ``__all__``); these tests hold it to the subpackages' ``__all__`` and print the lines
to paste when it drifts.
"""

import importlib
import json
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import sinkflow

#: Subpackages whose names are not re-exported: the command line (``sinkflow.cli.main`` is the console script).
NOT_EXPORTED = {"cli"}
#: Subpackages of which the root exports only these names (README): the figure registry's generic verbs
#: (``register``, ``get``, ``render``, ...) stay in ``sinkflow.plots``.
PARTLY_EXPORTED = {"plots": ("plot_sweep", "animate", "circle_demo", "ParticleAnimation")}
PUBLIC = sorted(info.name for info in pkgutil.iter_modules(sinkflow.__path__)
                if info.ispkg and not info.name.startswith("_") and info.name not in NOT_EXPORTED)


def _expected(sub: str) -> list[str]:
    """The names of ``sinkflow.<sub>.__all__`` that the root exports from it (clashes resolved elsewhere left out)."""
    key = f"sinkflow.{sub}"
    names = PARTLY_EXPORTED.get(sub, importlib.import_module(key).__all__)
    return [n for n in names if sinkflow._CLASHES.get(n, key) == key]


def test_every_public_subpackage_has_its_row():
    rows = {k.removeprefix("sinkflow.") for k in sinkflow._EXPORTS if not k.startswith("sinkflow._")}
    assert rows == set(PUBLIC), f"rows of _EXPORTS missing or without a subpackage: {sorted(rows ^ set(PUBLIC))}"


@pytest.mark.parametrize("sub", PUBLIC)
def test_the_table_lists_the_subpackages_all(sub):
    key, expected = f"sinkflow.{sub}", _expected(sub)
    listed = sinkflow._EXPORTS.get(key, ())
    body = textwrap.indent("\n".join(textwrap.wrap(", ".join(f'"{n}"' for n in expected) + ",", 112)), " " * 8)
    assert set(listed) == set(expected), (
        f"sinkflow._EXPORTS[{key!r}] is out of step with {key}.__all__ (missing: "
        f"{sorted(set(expected) - set(listed))}, extra: {sorted(set(listed) - set(expected))}); paste:\n"
        f'    "{key}": (\n{body}\n    ),')
    assert len(listed) == len(set(listed)), f"{key}: names listed twice"


@pytest.mark.parametrize("sub", PUBLIC)
def test_every_public_name_resolves_from_sinkflow_to_the_same_object(sub):
    package = importlib.import_module(f"sinkflow.{sub}")
    names = PARTLY_EXPORTED.get(sub, package.__all__)
    assert set(names) <= set(package.__all__)
    for name in names:
        assert name in sinkflow.__all__, f"sinkflow.__all__ lacks {sub}.{name}"
        owner = importlib.import_module(sinkflow._CLASHES.get(name, package.__name__))
        assert getattr(sinkflow, name) is getattr(owner, name), f"sinkflow.{name} is not {owner.__name__}.{name}"
        assert name in dir(sinkflow)
    exec(f"from sinkflow import {', '.join(names)}", {})  # every name, by the import statement


def test_the_readme_says_where_the_names_live():
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    assert "Every public name is importable from `sinkflow` itself" in readme
    assert "the figure registry" in readme and "`sinkflow.plots`" in readme


def test_clashes_are_real_and_resolved_once():
    exporters = {}
    for sub in PUBLIC:
        package = importlib.import_module(f"sinkflow.{sub}")
        for name in package.__all__:
            exporters.setdefault(name, {})[package.__name__] = getattr(package, name)
    clashes = {n: owners for n, owners in exporters.items() if len({id(o) for o in owners.values()}) > 1}
    assert set(clashes) == set(sinkflow._CLASHES), "resolve each clash in sinkflow._CLASHES (and only clashes)"
    for name, owner in sinkflow._CLASHES.items():
        assert owner in clashes[name]
    assert len(sinkflow.__all__) == len(set(sinkflow.__all__))


def test_no_exported_name_shadows_a_submodule():
    assert not set(sinkflow.__all__) & sinkflow._SUBMODULES


def test_the_names_the_issue_found_missing():
    # after the move of the studies and the clustering theory, these were in their subpackage only
    from sinkflow import PatchViT, TrainConfig, particle_cluster_count, train
    from sinkflow.clustering import particle_cluster_count as counted
    from sinkflow.studies import PatchViT as ViT
    from sinkflow.studies import TrainConfig as Config
    from sinkflow.studies import train as training

    assert (PatchViT, TrainConfig, train, particle_cluster_count) == (ViT, Config, training, counted)


def test_import_sinkflow_loads_no_subpackage_and_no_torch():
    code = ("import json, sys, sinkflow; names = sinkflow.__all__, dir(sinkflow); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'torch', 'scipy', 'numpy', 'matplotlib', 'pandas'} or m.startswith('sinkflow.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == []
