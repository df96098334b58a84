"""Every notebook executes top to bottom in quick mode (SINKFLOW_QUICK=1)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def _execute(path, cwd):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=180, startup_timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_quick_mode(path, monkeypatch, tmp_path):
    monkeypatch.setenv("SINKFLOW_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    assert nb.cells[0].cell_type == "markdown", "a notebook opens with what it shows"
    try:
        _execute(path, tmp_path)
    except (CellTimeoutError, DeadKernelError):
        # Quick notebooks finish in seconds; a silent kernel (seen once under heavy load) is
        # an infrastructure hang, not a result: retry once on a fresh kernel. A cell that
        # raises is never retried.
        _execute(path, tmp_path)
