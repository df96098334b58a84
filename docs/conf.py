"""Sphinx configuration of the sinkflow docs (``sinkflow docs`` builds them with -W).

Environment:
- ``SINKFLOW_DOCS_QUICK=1``: notebooks are not executed (CI's quick build): their stored
  quick-mode outputs are shown (``notebooks/_store_outputs.py``).
- ``SINKFLOW_DOCS_FIGURES``: ``1`` (default) renders every gallery image from the figures' quick
  configurations; ``missing`` (``sinkflow docs --quick``) shows the committed images of ``figures/``
  and renders only the figures without one; ``0`` (``sinkflow docs --skip-figures``) renders none
  (cached and committed images are still shown; pages and code are built as usual).
- ``SINKFLOW_QUICK`` (default ``1`` here): the mode notebooks run in when executed.
- ``SINKFLOW_DOCS_CACHE``: folder of the notebook execution cache (``sinkflow docs`` puts it
  beside its output, so a build writes nothing into the source checkout but generated pages).

Formulas are rendered by a MathJax copy shipped in the build's ``_static/`` (from the
``sphinx-mathjax-offline`` package of the ``docs`` extra): the pages need no network.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))  # the checkout's sinkflow wins over an installed copy

import sinkflow  # noqa: E402

QUICK = os.environ.get("SINKFLOW_DOCS_QUICK", "0") == "1"
os.environ.setdefault("SINKFLOW_QUICK", "1")  # notebooks executed by the docs build run small

project = "sinkflow"
author = "sinkflow developers"
copyright = "sinkflow developers, BSD-3-Clause"
release = version = sinkflow.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "sphinxcontrib.bibtex",
    "sinkflow_docs",
]

# .rst first: autosummary writes its stubs with the first suffix (the API pages are reST).
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "jupyter_execute", "**/.ipynb_checkpoints", "_ext"]
root_doc = "index"

# Docutils' smart quotes would turn the "--" of every command-line flag (--full) into an en dash.
smartquotes = False

# MyST: $...$ and $$...$$ math, ::: fences, heading anchors for cross-page links.
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# myst-nb: the full build executes the notebooks (cached by content); the quick one shows their stored outputs.
nb_execution_mode = "off" if QUICK else "cache"
nb_execution_timeout = 300
nb_execution_raise_on_error = True  # a broken notebook breaks the docs build
nb_execution_cache_path = os.environ.get("SINKFLOW_DOCS_CACHE", str(HERE / "_build" / ".jupyter_cache"))

# API reference
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": False}
autodoc_typehints = "none"  # numpydoc writes the types from the docstrings
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# Bibliography
bibtex_bibfiles = ["refs.bib"]
bibtex_reference_style = "author_year"
bibtex_default_style = "plain"

html_theme = "furo"
html_title = f"sinkflow {release}"


def _mathjax_static() -> str:
    """The folder holding ``mathjax/`` in the sphinx-mathjax-offline package (copied into ``_static``)."""
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the docs render formulas with a local MathJax: pip install -e '.[docs]' "
                           "(package sphinx-mathjax-offline)")
    return str(Path(next(iter(spec.submodule_search_locations))) / "static")


html_static_path = [_mathjax_static(), "_static"]
html_css_files = ["sinkflow.css"]  # the gallery's thumbnails
mathjax_path = "mathjax/tex-chtml.js"  # relative to _static: served with the pages, no CDN
suppress_warnings = ["mystnb.unknown_mime_type"]
