"""The documentation builds without a warning (quick mode: notebooks not executed, gallery
images committed in figures/ shown as they are, the others rendered), the generated parts follow
the code (every public name, every registered figure, every notebook), and the theory pages render
offline in a real browser.

The quick build runs once per test session (``html`` fixture); the slow test builds the gallery
with freshly rendered images."""

from __future__ import annotations

import re

import pytest
from _browser import Browser, chromium_binary, serve

import sinkflow
from sinkflow.cli.docs import docs_source

pytest.importorskip("sphinx")
pytest.importorskip("myst_nb")


def _build(out, *extra):
    from sinkflow.cli import main

    # -W: any warning (broken reference, bad docstring markup, unknown figure) fails the build
    assert main(["docs", "--quick", "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="session")
def html(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("docs") / "html")


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
    from sinkflow.plots import registry

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
    html = _build(tmp_path, "--fresh")
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


def test_quick_build_shows_an_image_of_every_registered_figure(html):
    """Quick builds show the figures of figures/ made from the current configs and render the others
    (outside the default set, a few seconds each): every gallery page has its image."""
    from sinkflow.plots import registry

    for name in registry():
        page = (html / "gallery" / f"{name}.html").read_text()
        assert re.search(r"<img[^>]+_images/" + re.escape(name), page), f"{name}: no image in a quick build"


def test_docs_go_where_the_user_stands(tmp_path, monkeypatch):
    """``--out`` defaults to ./docs/_build/html of the current folder, like ``sinkflow figures`` (./figures)."""
    from sinkflow.cli import build_parser
    from sinkflow.cli.docs import DEFAULT_OUT

    monkeypatch.chdir(tmp_path)
    docs = build_parser(["docs"]).parse_args(["docs"])
    figures = build_parser(["figures"]).parse_args(["figures"])
    assert docs.out == DEFAULT_OUT == "docs/_build/html" and figures.out == "figures"


@pytest.fixture(scope="module")
def browser():
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no chromium installed (.ci/run installs it with apt-get)")
    pytest.importorskip("websocket")
    b = Browser(binary)
    yield b
    b.close()


THEORY_PAGES = sorted(p.stem for p in (docs_source() / "theory").glob("*.md"))


@pytest.mark.parametrize("page", THEORY_PAGES)
def test_theory_page_renders_offline_in_a_browser(html, browser, page):
    """MathJax is served with the pages: every formula typeset, no raw TeX left, every image loaded,
    with every request outside 127.0.0.1 blocked."""
    with serve(html) as base:
        report = browser.report(f"{base}/theory/{page}.html")
    assert report["mathjax"], "MathJax did not load"
    if "$" in (docs_source() / "theory" / f"{page}.md").read_text():
        assert report["formulas"] > 0, "no formula typeset on a page with formulas"
    assert report["untypeset"] == 0, f"{report['untypeset']} formulas left untypeset"
    raw = [m.group(0) for m in re.finditer(r"\\[(\[]|\$\$", report["text"])]
    assert not raw, f"raw TeX delimiters in the page text: {raw[:5]}"
    assert not report["failed"], f"local files that did not load: {report['failed']}"
    broken = [src for src, ok in report["images"] if not ok]
    assert not broken, f"images that did not load: {broken}"


def test_rendering_bugs_of_issue_31_stay_fixed(html):
    # a constant shows its own comment, not float's docstring (autodoc reads `#:` in the defining module)
    expected = {"LANDMARK_CONSTANT": "constant c in m", "SHARP_LANDMARK_CONSTANT": "matrix-Bernstein argument"}
    for name, words in expected.items():
        pages = list((html / "api" / "generated").glob(f"*.{name}.html"))
        assert len(pages) == 1, (name, pages)
        text = pages[0].read_text()
        assert words in text and "Convert a string or number to a floating point number" not in text, name
    # a table cell holds the whole description (a bare | of ||C - C~|| ended it)
    gallery = (html / "gallery" / "index.html").read_text()
    assert "vs landmarks, against delta" in gallery
    every_page = [p.read_text() for p in html.rglob("*.html")]
    # command-line flags keep their two hyphens (smart quotes made --full an en dash)
    assert not [t for t in every_page if re.search(r"\u2013(full|quick|all|help)\b", t)]
    # an escaped underscore inside \text{} shows its backslash in MathJax
    assert not [t for t in every_page if re.search(r"\\text\{[^}]*\\_", t)]


def test_the_landing_page_fits_a_screen_and_the_gallery_has_thumbnails(html):
    article = re.search(r"<article.*?</article>", (html / "index.html").read_text(), re.S).group(0)
    assert len(re.findall(r"<a class=\"reference internal\"", article)) <= 25  # was about 60
    gallery = (html / "gallery" / "index.html").read_text()
    thumbs = re.findall(r'<a class="reference external image-reference" href="([\w.]+)\.html"><img[^>]*sf-thumbnail',
                        gallery)
    from sinkflow.plots import registry

    defaults = {n for n, s in registry().items() if s.default}
    assert defaults <= set(thumbs) <= set(registry())  # the quick build shows (at least) the committed default figures
    # each thumbnail is named under it (a grid of unnamed pictures in the first trial)
    named = re.findall(r'<figure class="[^"]*sf-gallery-item[^"]*"[^>]*>.*?<figcaption>(.*?)</figcaption>', gallery,
                       re.S)
    assert [re.sub(r"<[^>]+>|\s|\u00b6", "", c) for c in named] == thumbs


def test_figure_pages_show_captions_and_descriptions_as_written(html):
    # a caption holding "k*(beta)" opened an emphasis that ate the star and left a stray "*" at its end
    import html as html_lib

    from sinkflow.plots import registry

    for name, spec in registry().items():
        page = (html / "gallery" / f"{name}.html").read_text()
        text = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", "", page)).split())
        for claim in (spec.caption, spec.description):
            assert not claim or " ".join(claim.split()) in text, (name, claim)
