"""The README's main job: `sinkflow figures`; and a command line that starts fast."""

import json
import subprocess
import sys

import pytest

from sinkflow.cli import COMMANDS, main
from sinkflow.plots import registry


def test_figures_list(capsys):
    assert main(["figures", "--list"]) == 0
    out = capsys.readouterr().out
    for name in registry():
        assert name in out


def test_figures_named_into_folder(tmp_path):
    assert main(["figures", "normalizations_attention", "--out", str(tmp_path), "--format", "png"]) == 0
    assert (tmp_path / "normalizations_attention.png").exists()
    assert (tmp_path / "MANIFEST.tsv").exists()


def test_unknown_figure_exit_code(tmp_path, capsys):
    assert main(["figures", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown figure" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "sinkflow.cli", "--version"], capture_output=True, text=True,
                         check=True)
    assert out.stdout.startswith("sinkflow ")


_HEAVY = ("torch", "scipy", "sympy", "ot")

_IMPORTS_AFTER = """
import json, sys
sys.argv = ["sinkflow", *json.loads(sys.argv[1])]
from sinkflow.cli import main
try:
    main()
except SystemExit:
    pass
print("\\nMODULES " + json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})))
"""


@pytest.mark.parametrize("argv", [["--help"], ["figures", "--list"], ["docs", "--help"]])
def test_fast_commands_import_no_torch(argv):
    """``sinkflow --help`` and ``sinkflow figures --list`` load neither torch nor scipy/sympy/POT."""
    code = _IMPORTS_AFTER.format(heavy=set(_HEAVY))
    out = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=120)
    assert "usage: sinkflow" in out.stdout or "figures" in out.stdout, out.stderr
    loaded = json.loads(out.stdout.rsplit("MODULES ", 1)[1])
    assert not loaded, f"`sinkflow {' '.join(argv)}` imported {loaded[:5]}"


@pytest.mark.slow  # several seconds: with the slow tests (the README's command stays under 5 minutes)
def test_import_sinkflow_is_lazy_but_complete():
    code = ("import sys, sinkflow; heavy = [m for m in sys.modules if m.split('.')[0] in {heavy!r}]; "
            "names = set(dir(sinkflow)); missing = [n for n in sinkflow.__all__ if n not in names]; "
            "from sinkflow import sinkhorn, wasserstein2; import sinkflow.nn; "
            "print(heavy, missing, sinkflow.sinkhorn is sinkhorn, 'nn' in dir(sinkflow), 'plots' in dir(sinkflow))")
    out = subprocess.run([sys.executable, "-c", code.format(heavy=set(_HEAVY))], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == ["[]", "[]", "True", "True", "True"]


def test_every_public_name_resolves_from_its_module():
    import importlib

    import sinkflow

    for name in sinkflow.__all__:
        module = importlib.import_module(sinkflow._ORIGIN[name])
        assert getattr(sinkflow, name) is getattr(module, name), name
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        sinkflow.no_such_name  # noqa: B018


def test_every_command_module_has_a_parser_and_a_runner():
    import importlib

    for module, _help in COMMANDS.values():
        mod = importlib.import_module(module)
        assert callable(mod.add_arguments) and callable(mod.run), module


def test_docs_without_the_docs_extra_says_what_to_install(monkeypatch, capsys):
    # issue 31: after README's first command (no docs extra) `sinkflow docs --quick` printed
    # "No module named sphinx" and then "FAILED (warnings are errors)"
    from sinkflow.cli import docs

    assert docs.missing_modules() == []  # the test extra installs the docs extra
    assert docs.missing_modules(("sphinx", "no_such_module", "sphinxcontrib.no_such_module")) == [
        "no_such_module", "sphinxcontrib.no_such_module"]
    monkeypatch.setattr(docs, "DOCS_MODULES", ("sphinx", "no_such_module"))
    monkeypatch.setattr(docs.subprocess, "call", lambda *a, **k: pytest.fail("sphinx was started"))
    assert main(["docs", "--quick", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "missing: no_such_module" in err and 'pip install -e ".[docs]"' in err
