"""The notebooks' sliders: they update on release, their callbacks return nothing and answer within
1 s of CPU in quick mode at every corner of the sliders' ranges.

The timed test runs each notebook's code cells (quick mode, in this process, matplotlib's Agg
backend) up to its ``interact`` cell, draws the callback once at its defaults as ``interact`` does
on display (untimed), then times it at every combination of its controls' extreme values.
"""

import ast
import io
import itertools
import os
import time
from pathlib import Path

import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

import sinkflow.plots.interactive as interactive  # noqa: E402

NOTEBOOKS = sorted(p for p in (Path(__file__).parents[1] / "notebooks").glob("*.ipynb")
                   if "interact(" in p.read_text())
BUDGET_S = 1.0  # CPU seconds per call in quick mode


def test_the_sliders_update_on_release_and_the_result_is_dropped(monkeypatch):
    ipywidgets = pytest.importorskip("ipywidgets")
    seen = {}

    def fake_interact(function, **widgets):
        seen.update(widgets)
        seen["result"] = function(**{name: w.value for name, w in widgets.items()})

    monkeypatch.setattr(ipywidgets, "interact", fake_interact)

    def draw(a=2, x=0.5, kind="u"):
        return [a, x, kind]

    assert interactive.interact(draw, a=(1, 5, 1), x=(0.0, 1.0, 0.1), kind=["u", "v"]) is None
    assert not seen["a"].continuous_update and not seen["x"].continuous_update
    assert seen["result"] is None  # Jupyter has nothing to print under the figure


def _code(cell) -> str:
    """A cell's Python without IPython magics (``%matplotlib inline``)."""
    return "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith("%"))


def _render_and_close(*args, **kwargs):
    """What Jupyter's inline backend does at ``plt.show()``: render every open figure to PNG."""
    for number in plt.get_fignums():
        plt.figure(number).savefig(io.BytesIO(), format="png")
    plt.close("all")


def _extremes(control):
    if isinstance(control, tuple):
        return control[0], control[1]
    return control[0], control[-1]


def _timed(function, kwargs):
    """``function(**kwargs)`` and its CPU seconds, its figures rendered and closed."""
    start = time.process_time()
    result = function(**kwargs)
    spent = time.process_time() - start
    plt.close("all")
    return result, spent


@pytest.mark.integration
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_callback_answers_within_a_second_at_its_extremes(path, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(interactive, "interact", lambda function, **controls: calls.append((function, controls)))
    monkeypatch.setattr(plt, "show", _render_and_close)
    monkeypatch.setenv("SINKFLOW_QUICK", "1")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__notebook__"}
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        exec(compile(ast.parse(_code(cell)), f"{path.name}", "exec"), namespace)
        plt.close("all")
        if calls:
            break
    assert calls, f"{path.name} has no interact call"
    function, controls = calls[0]
    function()  # what interact does on display, before any slider moves (first-draw costs: fonts, 3-D axes)
    plt.close("all")
    slow = {}
    for values in itertools.product(*(_extremes(c) for c in controls.values())):
        kwargs = dict(zip(controls, values, strict=True))
        result, spent = _timed(function, kwargs)
        assert result is None, f"{function.__name__}{kwargs} returned {type(result).__name__}: return nothing"
        if spent > BUDGET_S:  # the callback is deterministic: its cost is the faster of two calls (noise only adds)
            spent = min(spent, _timed(function, kwargs)[1])
        if spent > BUDGET_S:
            slow[str(kwargs)] = round(spent, 2)
    assert not slow, f"{path.name}: {function.__name__} took more than {BUDGET_S} s of CPU at {slow}"
    assert os.environ["SINKFLOW_QUICK"] == "1"
