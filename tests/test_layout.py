"""The package's layout: concept folders on floors, data flowing one way.

A module may import its own folder and the folders below it, never one above: every
``import sinkflow.X`` and ``from sinkflow.X import`` (at any depth of the module, lazy
imports included), and every use of a public name of the root package (``sinkflow.name``,
``from sinkflow import name``) resolved to the folder that defines it. No package attribute
shadows its own submodule, and every folder says what it is for and what it exports.
"""

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import sinkflow

PACKAGE = Path(sinkflow.__file__).parent

#: Floors from the ground up: what every folder may import is its own floor and those below.
FLOORS = (
    ("_backend", "_checks", "_progress"),  # shared private helpers
    ("attention",),  # scores, normalizations, variants, Nystrom
    ("bounds",),  # stochasticity, Nystrom bounds
    ("particles",),  # fields, flows, energies
    ("heat",),  # the many-particle limit and its references
    ("datasets",),  # generated data sets
    ("nn",),  # torch modules, models, training, validations
    ("experiments",),  # seeded experiments for sweeps
    ("sweeps",),  # parameter grids
    ("plots",),  # figures: data -> matplotlib
    ("cli",),  # the command line
)
FLOOR = {folder: i for i, folders in enumerate(FLOORS) for folder in folders}


def _folder(module: str) -> str:
    """``sinkflow.attention._scores`` -> ``attention``; a root name is resolved through the lazy exports."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _root_name(name: str) -> str | None:
    """The folder that defines the public root name (or root submodule) ``name``."""
    if name in sinkflow._ORIGIN:
        return _folder(sinkflow._ORIGIN[name])
    return name if name in FLOOR else None


def _imports(path: Path):
    """``(line, folder)`` for every sinkflow folder a module reaches, lazily or not."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sinkflow."):
                    yield node.lineno, _folder(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("sinkflow."):
                yield node.lineno, _folder(node.module)
            elif node.module == "sinkflow":
                for alias in node.names:
                    yield node.lineno, _root_name(alias.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sinkflow":
            yield node.lineno, _root_name(node.attr)


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) > 1 or rel.stem != "__init__":
            yield rel, rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_every_folder_and_top_module_has_a_floor():
    tops = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert tops == set(FLOOR), f"give every folder a floor in FLOORS: {sorted(tops ^ set(FLOOR))}"


def test_no_import_runs_up_the_folders():
    upward = []
    for rel, folder in _modules():
        for line, target in _imports(PACKAGE / rel):
            if target and FLOOR.get(target, -1) > FLOOR[folder]:
                upward.append(f"sinkflow/{rel}:{line} ({folder}, floor {FLOOR[folder]}) imports {target} "
                              f"(floor {FLOOR[target]})")
    assert not upward, "imports that run up the folders:\n" + "\n".join(upward)


def test_the_floor_check_sees_lazy_and_root_imports(tmp_path):
    # the check itself: an upward import inside a function, and one through the root's lazy names
    module = tmp_path / "m.py"
    module.write_text("import sinkflow\n\ndef f():\n    from sinkflow.plots.style import style\n"
                      "    return sinkflow.heat_flow, style\n")
    assert sorted(t for _, t in _imports(module)) == ["heat", "plots"]


def _packages():
    return [info.name for info in pkgutil.walk_packages(sinkflow.__path__, prefix="sinkflow.") if info.ispkg]


@pytest.mark.parametrize("name", _packages())
def test_a_folder_says_what_it_is_for_and_exports_what_it_lists(name):
    package = importlib.import_module(name)
    assert (package.__doc__ or "").strip(), f"{name}/__init__.py needs a docstring: what the folder is for"
    exported = getattr(package, "__all__", [])
    assert all(hasattr(package, n) for n in exported), [n for n in exported if not hasattr(package, n)]


@pytest.mark.parametrize("name", ["sinkflow", *_packages()])
def test_no_package_attribute_shadows_its_own_submodule(name):
    package = importlib.import_module(name)
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{name}.{info.name}")
        value = getattr(package, info.name)
        assert value is module, f"{name}.{info.name} is {value!r}, not the submodule"
