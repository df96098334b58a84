"""The notebooks as committed, read without executing anything (fast: not an integration test).

Each notebook ``notebooks/<NN_name>.ipynb`` is built from its source ``notebooks/<NN_name>.py`` (jupytext
percent format) by ``notebooks/_store_outputs.py``, which stores its quick-mode outputs. Here: every
notebook has its source and says what it says (same cells); its outputs were stored from that
source's code (a hash); they are small and free of volatile metadata. ``tests/test_notebooks.py``
executes the notebooks.
"""

import importlib.util
import json
import re
from pathlib import Path

import jupytext
import nbformat
import pytest
from _notebook_checks import MIN_GIF_WIDTH, gif_size, quick_training_problems, stored_gifs, verdict_problems

FOLDER = Path(__file__).parents[1] / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("[0-9]*.ipynb"))
SOURCES = sorted(FOLDER.glob("[0-9]*.py"))


def _store_outputs():
    spec = importlib.util.spec_from_file_location("_store_outputs", FOLDER / "_store_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cells(nb):
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def test_every_notebook_is_paired_with_its_source():
    assert NOTEBOOKS, "no notebook found"
    assert [p.stem for p in NOTEBOOKS] == [p.stem for p in SOURCES], \
        "each notebooks/<NN_name>.ipynb is built from notebooks/<NN_name>.py: add the missing one"
    assert not list(FOLDER.glob("_build_*.py")), "the sources are the jupytext files, not nbformat scripts"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_says_what_its_source_says(path):
    # compared cell by cell as jupytext parses them (the text, not the bytes of the JSON)
    notebook = jupytext.read(path)
    source = jupytext.read(path.with_suffix(".py"), fmt="py:percent")
    assert _cells(notebook) == _cells(source), \
        f"{path.name} differs from {path.stem}.py: edit the .py, then python notebooks/_store_outputs.py {path.stem}"


#: The stored size of one notebook: quick-mode figures as palette PNGs at the inline backend's resolution
#: and the classroom animation as a GIF (02: 326 kB, of which the 640 x 410 px GIF is about 210 kB in base64;
#: the others 46-200 kB). A JavaScript animation player (1.35 MB for 30 frames), full-colour PNGs (03 stored 525 kB
#: with them) or a figure at print resolution fail it.
MAX_STORED_BYTES = 400_000


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_with_current_small_stable_outputs(path):
    # issue 31: the outputs are stored (a reader who runs nothing sees them), from the source as committed,
    # small, and without what changes from run to run (never compared byte for byte: they differ at the
    # rounding level from one CPU to another)
    store = _store_outputs()
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown", "a notebook opens with what it shows"
    stored = nb.metadata.get("sinkflow", {}).get("code_sha256")
    source = store.read_source(path.with_suffix(".py"))
    assert stored == store.code_sha256(source), f"outputs are stale: run python notebooks/_store_outputs.py {path.stem}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert sum(bool(c.outputs) for c in code) >= len(code) // 2, "most cells show something"
    assert any("image/png" in out.get("data", {}) for c in code for out in c.outputs), "figures are stored"
    assert path.stat().st_size < MAX_STORED_BYTES, f"{path.name}: stored outputs over {MAX_STORED_BYTES} bytes"
    scripts = [c.source.splitlines()[0] for c in code for out in c.outputs
               if "<script" in out.get("data", {}).get("text/html", "")]
    assert not scripts, f"outputs that need JavaScript show nothing to a reader who runs nothing: {scripts}"
    stripped = nbformat.from_dict(json.loads(json.dumps(nb)))
    store.strip_volatile(stripped)
    assert stripped == nb, "volatile metadata left in the notebook (execution times, widget state)"
    assert not [out for c in code for out in c.outputs if out.output_type == "error"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_widgets_have_a_static_fallback(path):
    """ipywidgets is optional: notebooks reach it only through sinkflow.plots.interactive.interact."""
    sources = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    assert not [s for s in sources if re.search(r"^\s*(import|from) ipywidgets", s, re.M)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_says_how_to_switch_quick_mode_in_jupyter(path):
    nb = nbformat.read(path, as_version=4)
    assert any('os.environ["SINKFLOW_QUICK"] = "1"' in c.source for c in nb.cells)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_title_carries_its_number(path):
    nb = nbformat.read(path, as_version=4)
    title = next(line for cell in nb.cells if cell.cell_type == "markdown"
                 for line in cell.source.splitlines() if line.startswith("# "))
    assert title.startswith(f"# {path.name[:2]} · "), \
        f"{path.name}: title {title!r} should start with '# {path.name[:2]} · '"


def _prose_before_exercises(nb) -> str:
    """The markdown of a notebook up to its exercises (which suggest settings: they measure nothing)."""
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return re.split(r"^## Exercises", prose, flags=re.M)[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_prose_quotes_no_number_its_cells_do_not_print(path):
    # issue 31: the training notebook's prose quoted measured values (0.26 / 0.33, 0.18 ...) that its cells then
    # printed differently; a decimal in the prose must be a constant of the code (a paper's range, a tolerance),
    # never a measurement that a rerun would change
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    prose = re.sub(r"\$[^$]*\$", "", _prose_before_exercises(nb))
    decimals = set(re.findall(r"(?<![\w.^_{])\d+\.\d+(?![\w.])", prose))
    assert not [d for d in sorted(decimals) if d not in code]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_verdicts_follow_from_what_their_cells_printed(path):
    # issue 40: quick mode printed "CONTRADICTS the paper" on runs too short to decide. A stored (quick-mode)
    # output prints either a verdict with its reason or that the run is too short to decide, never both
    # (tests/test_notebooks.py holds the notebooks it executes to the same rules)
    nb = nbformat.read(path, as_version=4)
    problems = verdict_problems(c for c in nb.cells if c.cell_type == "code")
    assert not problems, "\n".join(problems)


def test_the_verdict_rules_catch_what_they_name():
    # the shared rules (tests/_notebook_checks.py) on cells made by hand: each broken rule is reported
    def cell(*lines):
        return nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output("stream", text="\n".join(lines) + "\n")])

    undecided = "claim: quick mode: too short to decide; run with SINKFLOW_QUICK=0 (about 480 s)"
    assert verdict_problems([cell("0.19 -> 0.14: agrees"), cell(undecided),
                             cell("0.19 -> 0.24: CONTRADICTS the paper", "why: one seed")]) == []
    assert len(verdict_problems([cell("0.19 -> 0.14: agrees", undecided)])) == 1  # both in one cell
    assert len(verdict_problems([cell("quick mode: too short to decide")])) == 1  # without how to decide
    assert len(verdict_problems([cell("0.19 -> 0.24: CONTRADICTS the paper", "0.3")])) == 1  # no "why"
    assert quick_training_problems([cell(*[undecided] * 4)]) == []
    assert len(quick_training_problems([cell(*[undecided] * 3, "0.19 -> 0.14: agrees")])) == 2


def _names(node) -> set[str]:
    import ast

    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - {"len", "min", "max", "abs", "sum", "round"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_every_verdict_quotes_the_numbers_it_judges(path):
    # a verdict line prints the values its condition compares, so a reader can check it against them:
    # versus_paper(agrees, claim, why): every name in `agrees` appears in the f-string `claim`
    import ast

    tree = ast.parse(path.read_text())
    calls = [node for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "versus_paper"]
    for call in calls:
        assert len(call.args) == 3, "versus_paper(agrees, claim, why)"
        agrees, claim, _ = call.args
        quoted = {n for v in ast.walk(claim) if isinstance(v, ast.FormattedValue) for n in _names(v.value)}
        assert _names(agrees) <= quoted, \
            f"line {call.lineno}: the verdict judges {sorted(_names(agrees) - quoted)} without printing them"


TRAINING_NOTEBOOK = FOLDER / "05_doubly_stochastic_training.ipynb"


def test_the_training_notebook_decides_nothing_in_quick_mode():
    # its stored outputs are quick mode's: four claims, each too short to decide, none judged
    nb = nbformat.read(TRAINING_NOTEBOOK, as_version=4)
    problems = quick_training_problems([c for c in nb.cells if c.cell_type == "code"])
    assert not problems, problems


def test_a_stored_animation_is_wide_enough_to_read():
    # issue 43: notebook 02 kept a 374 x 212 px GIF of the classroom demo (text about 7 px high) after the
    # demo was made for a projector; the width is read from each stored GIF's header
    gifs = {path.name: stored_gifs([c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"])
            for path in NOTEBOOKS}
    assert any(gifs.values()), "no notebook stores an animation: notebook 02 shows the classroom demo"
    narrow = {name: sizes for name, found in gifs.items() for sizes in found if sizes[1][0] < MIN_GIF_WIDTH}
    assert not narrow, f"GIFs under {MIN_GIF_WIDTH} px wide (code cell, (width, height)): {narrow}"


def test_the_gif_header_reader():
    import base64

    header = base64.b64encode(b"GIF89a" + (640).to_bytes(2, "little") + (410).to_bytes(2, "little") + b"\0" * 8)
    assert gif_size(header.decode()) == (640, 410)
    with pytest.raises(ValueError, match="not a GIF"):
        gif_size(base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 8).decode())
