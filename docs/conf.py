"""Sphinx configuration of the sinkflow docs (``sinkflow docs`` builds them with -W).

Environment:
- ``SINKFLOW_DOCS_QUICK=1``: notebooks are not executed (CI's quick build); the gallery
  is still rendered, from the figures' quick configurations.
- ``SINKFLOW_DOCS_FIGURES=0`` (``sinkflow docs --skip-figures``): gallery images are not
  rendered (only cached, up-to-date ones are shown); pages and code are built as usual.
- ``SINKFLOW_QUICK`` (default ``1`` here): the mode notebooks run in when executed.
"""

from __future__ import annotations

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

# MyST: $...$ and $$...$$ math, ::: fences, heading anchors for cross-page links.
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# myst-nb: notebooks execute at build time (cached by content), never shipped with outputs.
nb_execution_mode = "off" if QUICK else "cache"
nb_execution_timeout = 300
nb_execution_raise_on_error = True  # a broken notebook breaks the docs build
nb_execution_cache_path = str(HERE / "_build" / ".jupyter_cache")

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
html_static_path = []
suppress_warnings = ["mystnb.unknown_mime_type"]
