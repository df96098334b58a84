"""The README's main job: `sinkflow figures`."""

import subprocess
import sys

from sinkflow.cli import main
from sinkflow.plots.registry import registry


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
    out = subprocess.run([sys.executable, "-m", "sinkflow.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("sinkflow ")
