"""The documentation builds without a warning (quick mode: notebooks not executed), and the
generated parts follow the code: every public name, every registered figure, every notebook.

The default build skips rendering the gallery images (tests/test_figures.py runs every
figure already); the slow test builds the gallery with its images, as ``sinkflow docs --quick``."""

from __future__ import annotations

import re

import pytest

import sinkflow
from sinkflow.cli_docs import docs_source

pytest.importorskip("sphinx")
pytest.importorskip("myst_nb")


def _build(out, *extra):
    from sinkflow.cli import main

    # -W: any warning (broken reference, bad docstring markup, unknown figure) fails the build
    assert main(["docs", "--quick", "--fresh", "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def html(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("html"), "--skip-figures")


def test_docs_build_warning_free_in_quick_mode(html):
    for page in ["index", "getting_started", "sweeps", "reproducibility", "references", "cli",
                 "theory/normalizations", "theory/gradient_flows", "theory/heat_limit", "theory/nystrom",
                 "theory/training", "theory/sphere", "api/index", "gallery/index", "notebooks/index"]:
        assert (html / f"{page}.html").is_file(), page


def test_api_reference_lists_every_public_name(html):
    text = (html / "api" / "index.html").read_text()
    missing = [name for name in sinkflow.__all__ if not re.search(rf">\s*(sinkflow\.)?[\w.]*\b{name}\b", text)]
    assert not missing, f"not in the API reference: {missing}"


def _gallery_pages(html):
    from sinkflow.plots.registry import registry

    for name, spec in registry().items():
        page = (html / "gallery" / f"{name}.html").read_text()
        text = re.sub(r"<[^>]+>", "", page)  # highlighted code is split into spans
        for fn in (spec.compute, spec.plot):
            assert f"def {fn.__name__}(" in text, f"{name}: the source of {fn.__name__} is not shown"
        yield name, page


def test_gallery_has_a_page_with_the_code_of_every_registered_figure(html):
    assert all(page for _, page in _gallery_pages(html))


@pytest.mark.slow
def test_gallery_shows_an_image_of_every_registered_figure(tmp_path):
    html = _build(tmp_path)
    for name, page in _gallery_pages(html):
        assert re.search(r"<img[^>]+_images/" + re.escape(name), page), f"{name}: no image"


def test_every_notebook_has_a_page(html):
    for nb in sorted((docs_source().parent / "notebooks").glob("[0-9]*.ipynb")):
        assert (html / "notebooks" / f"{nb.stem}.html").is_file(), nb.name


def test_bibliography_is_rendered(html):
    text = (html / "references.html").read_text()
    assert "Sinkformers" in text and "Skyformer" in text


def test_docs_command_says_where_the_sources_are_missing(tmp_path, capsys):
    from sinkflow.cli import main

    assert main(["docs", "--quick", "--source", str(tmp_path)]) == 2
    assert "no Sphinx project" in capsys.readouterr().err
