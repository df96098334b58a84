"""The package's layout: concept folders on floors, data flowing one way.

A module may import its own folder and the folders below it, never one above: every
``import sinkflow.X`` and ``from sinkflow.X import`` (at any depth of the module, lazy
imports included), and every use of a public name of the root package (``sinkflow.name``,
``from sinkflow import name``) resolved to the folder that defines it. Inside a folder, the
modules import one another without a circle (lazy imports included). No package attribute
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
    ("_backend", "_checks", "_optional", "_progress", "_summary"),  # shared private helpers
    ("attention",),  # scores, normalizations, variants, Nystrom
    ("bounds",),  # stochasticity, Nystrom bounds
    ("fields",),  # the attention field on particles: dense, block-wise, landmarks, harmonic, ensembles
    ("particles",),  # flows: simulate, integrators, trajectories, monitors, energies
    ("heat",),  # the many-particle limit and its references
    ("clustering",),  # clustering on the circle and the sphere: linear theory, cluster counts
    ("datasets",),  # generated data sets
    ("nn",),  # torch attention layers and their kernels
    ("studies",),  # models, training, tracking, the papers' validations and reports
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


def _module_name(rel: Path) -> str:
    parts = ("sinkflow", *rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_targets(path: Path, modules: set[str]):
    """Every sinkflow module that ``path`` imports (at any depth), resolved to a module of ``modules``."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield sub if sub in modules else (sinkflow._ORIGIN.get(alias.name, node.module)
                                                  if node.module == "sinkflow" else node.module)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sinkflow":
            if node.attr in sinkflow._ORIGIN:
                yield sinkflow._ORIGIN[node.attr]


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """``module -> modules it imports`` over the package (the root ``sinkflow`` left out: its names are lazy)."""
    files = {_module_name(p.relative_to(package)): p for p in sorted(package.rglob("*.py"))}
    files.pop("sinkflow", None)
    return {m: set(_module_targets(p, set(files) | {"sinkflow"})) - {m, "sinkflow"} for m, p in files.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circle_anywhere_in_the_package():
    circles = import_circles(import_graph())
    assert not circles, "modules that import one another in a circle:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_sees_a_planted_lazy_circle(tmp_path):
    package = tmp_path / "sinkflow"
    (package / "studies").mkdir(parents=True)
    (package / "studies" / "__init__.py").write_text("")
    (package / "studies" / "a.py").write_text("from sinkflow.studies.b import f\n")
    (package / "studies" / "b.py").write_text("def f():\n    from sinkflow.studies.c import g\n")
    (package / "studies" / "c.py").write_text("import sinkflow.studies.a\n")
    (package / "studies" / "d.py").write_text("from sinkflow.studies import a\n")
    graph = import_graph(package)
    assert graph["sinkflow.studies.d"] == {"sinkflow.studies.a"}
    assert import_circles(graph) == [["sinkflow.studies.a", "sinkflow.studies.b", "sinkflow.studies.c"]]
