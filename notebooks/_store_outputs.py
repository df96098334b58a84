"""Build each notebook from its source, execute it in quick mode and store its outputs, small and stable:

    python notebooks/_store_outputs.py [NAME ...]   # all notebooks by default; NAME: a part of the file name

The source of a notebook is its paired jupytext file ``notebooks/<NN_name>.py`` (percent format: ``# %%``
starts a code cell, ``# %% [markdown]`` a markdown cell); ``NN_name.ipynb`` is made from it here and
is never edited by hand (in JupyterLab with jupytext installed, opening either file edits both).

Why stored outputs: a reader who opens a notebook on GitHub, in JupyterLab without running it,
or in the quick docs build (which executes nothing) sees every figure and printed number.
The outputs are those of quick mode (``SINKFLOW_QUICK=1``), without ipywidgets (each slider cell
shows its default setting as a static figure), animations as GIFs (a live kernel shows the
player), with volatile metadata stripped (execution timestamps, widget state, kernel versions)
and cell ids numbered in order: re-running the script on an unchanged source rewrites the same
notebook up to the rounding of the numbers. Each notebook records the SHA-256 of its source's code
cells (``metadata.sinkflow.code_sha256``); ``tests/test_notebook_sources.py`` fails when the source
changed since the outputs were stored.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent

#: Kernel-side prelude (not stored): ipywidgets hidden, so slider cells draw their default once (and
#: tqdm's warning about it stays out of the outputs);
#: PNGs without the volatile ``Software``/date chunks of matplotlib's metadata, on white in 256 colours
#: (a palette PNG: a third of the size, the same figure to the eye); an animation stored
#: as a looping GIF (``image/gif``) instead of its JavaScript player: a GIF plays where a reader
#: runs nothing (JupyterLab does not run the scripts of an untrusted notebook, GitHub never does)
#: and is about a seventh of the player's size.
PRELUDE = """import sys as _sys
import base64 as _base64
_sys.modules["ipywidgets"] = None
import warnings as _warnings
_warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's notice that ipywidgets is hidden
import matplotlib as _mpl
_mpl.rcParams["svg.hashsalt"] = "sinkflow"
from matplotlib_inline.backend_inline import set_matplotlib_formats as _formats
_formats("png", metadata={"Software": None})
import io as _io
from PIL import Image as _Image
from matplotlib.figure import Figure as _Figure
_png = get_ipython().display_formatter.formatters["image/png"]
_draw_png = _png.lookup_by_type(_Figure)
def _small_png(fig):
    data = _draw_png(fig)
    if not data:
        return data
    image = _Image.open(_io.BytesIO(_base64.b64decode(data)))
    if image.mode in ("RGBA", "LA"):
        white = _Image.new("RGB", image.size, "white")
        white.paste(image, mask=image.getchannel("A"))
        image = white
    out = _io.BytesIO()
    image.convert("RGB").quantize(256, method=_Image.Quantize.MAXCOVERAGE, dither=_Image.Dither.NONE).save(
        out, "PNG", optimize=True)
    return _base64.b64encode(out.getvalue()).decode()
_png.for_type(_Figure, _small_png)
from sinkflow import ParticleAnimation as _Animation
_formatter = get_ipython().display_formatter
_formatter.formatters["text/html"].for_type(_Animation, lambda anim: None)
_formatter.mimebundle_formatter.for_type(
    _Animation, lambda anim, include=None, exclude=None: {"image/gif": _base64.b64encode(anim.to_gif()).decode()})
"""


#: The kernel of a source whose header names none.
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def source_of(path: Path) -> Path:
    """The paired jupytext source (``NN_name.py``) of a notebook (``NN_name.ipynb``)."""
    return path.with_suffix(".py")


def read_source(path: Path):
    """The notebook (no outputs) that the jupytext source ``path`` describes."""
    return jupytext.read(path, fmt="py:percent")


def code_sha256(nb) -> str:
    """SHA-256 of a notebook's code cells, in order (what its outputs depend on): the same for a
    source parsed by :func:`read_source` and for the notebook stored from it."""
    code = "\n\x00".join(c.source for c in nb.cells if c.cell_type == "code")
    return hashlib.sha256(code.encode()).hexdigest()


def strip_volatile(nb) -> None:
    """Drop what changes from run to run without the notebook changing."""
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("language_info", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.outputs:
            out.get("metadata", {}).clear() if "metadata" in out else None
            data = out.get("data", {})
            data.pop("application/vnd.jupyter.widget-view+json", None)
            if out.output_type in ("display_data", "execute_result") and not data:
                continue
            kept.append(out)
        cell.outputs = kept


def from_source(path: Path):
    """The notebook built from the source of ``path``: its cells, numbered ids, the kernelspec."""
    source = read_source(source_of(path))
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": dict(source.metadata.get("kernelspec", KERNELSPEC))})
    for i, cell in enumerate(source.cells):
        new = nbformat.v4.new_code_cell if cell.cell_type == "code" else nbformat.v4.new_markdown_cell
        nb.cells.append(new(cell.source, id=f"cell-{i:02d}"))
    return nb


def store(path: Path) -> None:
    nb = from_source(path)
    prelude = nbformat.v4.new_code_cell(PRELUDE)
    nb.cells.insert(0, prelude)
    env = {**os.environ, "SINKFLOW_QUICK": "1", "OMP_NUM_THREADS": "1",  # this checkout's sinkflow
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("MPLBACKEND", None)
    with tempfile.TemporaryDirectory() as cwd:  # whatever a notebook writes stays out of the checkout
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute(env=env)
    nb.cells.pop(0)
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = i + 1
        for out in cell.outputs:
            if "execution_count" in out:
                out.execution_count = i + 1
    strip_volatile(nb)
    nb.metadata["sinkflow"] = {"outputs": "quick mode (SINKFLOW_QUICK=1), stored by notebooks/_store_outputs.py",
                               "source": source_of(path).name, "code_sha256": code_sha256(nb)}
    nbformat.validate(nb)
    nbformat.write(nb, path)
    print(f"{path.name}: {path.stat().st_size / 1e3:.0f} kB")


def main(names) -> None:
    paths = sorted(source.with_suffix(".ipynb") for source in HERE.glob("[0-9]*.py"))
    unknown = [name for name in names if not any(name in path.name for path in paths)]
    if unknown:
        raise SystemExit(f"no notebook source notebooks/<NN_name>.py matches {unknown}")
    for path in paths:
        if not names or any(name in path.name for name in names):
            store(path)


if __name__ == "__main__":
    main(sys.argv[1:])
