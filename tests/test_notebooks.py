"""Every notebook executes top to bottom in quick mode (SINKFLOW_QUICK=1) and shows its figures.

Each notebook is executed once per test session (with IPython's inline backend, as a reader
sees it); all assertions reuse that run. A kernel-side hook, injected as an extra first cell of
the executed copy, records how many pyplot figures are open at the end of each cell's code:
a cell that leaves a figure open is a cell that draws, and it must have an ``image/png``
output. The style context is checked the same way, in a fresh kernel.
"""

import functools
import json
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))

# Runs in the kernel before the notebook. post_execute callbacks run before the inline backend
# flushes (and closes) the cell's figures as long as ours is first in the list: re-insert it in
# front before every cell, since the backend registers its own on first use.
FIGURE_PROBE = """
import matplotlib.pyplot as _plt
from IPython import get_ipython as _get_ipython
_probe_counts = []

def _probe_count_open_figures():
    _probe_counts.append(len(_plt.get_fignums()))

def _probe_first(*_):
    callbacks = _get_ipython().events.callbacks["post_execute"]
    if _probe_count_open_figures in callbacks:
        callbacks.remove(_probe_count_open_figures)
    callbacks.insert(0, _probe_count_open_figures)

_get_ipython().events.register("pre_run_cell", _probe_first)
"""
PROBE_REPORT = "import json as _json; print(_json.dumps(_probe_counts))"  # counts start after the setup cell; this one is counted after it prints


def _execute(nb, cwd):
    client = NotebookClient(nb, timeout=180, startup_timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute()
    except (CellTimeoutError, DeadKernelError):
        # Quick notebooks finish in seconds; a silent kernel (seen once under heavy load) is an
        # infrastructure hang, not a result: retry once on a fresh kernel. A raising cell is never retried.
        for cell in nb.cells:
            cell.outputs = [] if cell.cell_type == "code" else cell.get("outputs")
        client.execute()
    return nb


def execute_with_probe(cells, cwd, env):
    """Execute code ``cells`` (nbformat cells) in a fresh kernel; return them executed and the
    number of open pyplot figures at the end of each."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(FIGURE_PROBE), *cells,
                                         nbformat.v4.new_code_cell(PROBE_REPORT)])
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update({k: v for k, v in env.items() if v is not None})
    for key in [k for k, v in env.items() if v is None]:
        os.environ.pop(key, None)
    try:
        _execute(nb, cwd)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    counts = json.loads(nb.cells[-1].outputs[0]["text"])
    executed = [c for c in nb.cells[1:-1] if c.cell_type == "code"]
    assert len(counts) == len(executed), "the probe must see every cell once"
    return executed, counts


# MPLBACKEND unset: the kernel uses IPython's inline backend, as in Jupyter.
NOTEBOOK_ENV = {"SINKFLOW_QUICK": "1", "MPLBACKEND": None}


@functools.cache
def executed_notebook(path, cwd):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    return execute_with_probe(code, cwd, NOTEBOOK_ENV)


@pytest.fixture(scope="session")
def notebook_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("notebooks")


def _has_image(cell):
    return any("image/png" in out.get("data", {}) for out in cell.outputs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean(path):
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    assert nb.cells[0].cell_type == "markdown", "a notebook opens with what it shows"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_shows_every_figure_it_draws(path, notebook_dir):
    cells, open_figures = executed_notebook(path, notebook_dir)  # raises if a cell fails
    missing = [cell.source.splitlines()[:3] for cell, n in zip(cells, open_figures) if n and not _has_image(cell)]
    assert not missing, f"cells draw a figure that never shows: {missing}"
    assert any(open_figures), "every notebook draws figures: the probe must see them"


STYLE_FIRST = [
    # The style block is the first plotting of the session: loading the inline backend happens inside it.
    "from sinkflow.plots.style import new_figure, style\n"
    "with style():\n    fig, axes = new_figure()\n    axes[0, 0].plot([0, 1])",
    "import json, matplotlib, matplotlib.pyplot as plt\n"
    "print(json.dumps({'interactive': matplotlib.is_interactive(), 'backend': matplotlib.get_backend(),\n"
    "                  'rc': {k: repr(v) for k, v in matplotlib.rcParams.items()}}))",
    "fig, ax = plt.subplots()\nax.plot([1, 2])",
]
PLAIN_FIRST = [
    # The same session without the style: the reference state.
    "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([0, 1])",
    STYLE_FIRST[1],
]


def test_style_leaves_no_global_state_in_a_kernel(notebook_dir):
    env = {"MPLBACKEND": None}
    styled, styled_open = execute_with_probe([nbformat.v4.new_code_cell(c) for c in STYLE_FIRST], notebook_dir, env)
    plain, _ = execute_with_probe([nbformat.v4.new_code_cell(c) for c in PLAIN_FIRST], notebook_dir, env)
    after_style = json.loads(styled[1].outputs[0]["text"])
    reference = json.loads(plain[1].outputs[0]["text"])
    assert after_style["interactive"] is reference["interactive"] is True
    assert after_style["backend"] == reference["backend"] == "module://matplotlib_inline.backend_inline"
    changed = {k for k in reference["rc"] if after_style["rc"].get(k) != reference["rc"][k]}
    assert not changed, f"rcParams left changed by the style block: {sorted(changed)}"
    assert styled_open == [1, 0, 1]
    assert _has_image(styled[0]) and _has_image(styled[2]), "a figure drawn after the style block must show"
