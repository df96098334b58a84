"""The docs show their figures, checked without building them (fast: not an integration test).

The gallery pages are written by the docs extension (``docs/_ext/sinkflow_docs.py``) as a quick build
writes them (``SINKFLOW_DOCS_FIGURES=missing``), with the renderer replaced by one that records what it
is asked to render: every gallery page gets an image (committed in ``figures/`` or rendered), and every
figure a theory page shows through ``{sinkflow-figures}`` has one; no theory page leaves a figure out
without a word. ``tests/test_docs.py`` builds the docs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import re
from pathlib import Path

import pytest

pytest.importorskip("sphinx")

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16  # enough for a file that exists; nothing opens it here


def _extension():
    spec = importlib.util.spec_from_file_location("sinkflow_docs_under_test", DOCS / "_ext" / "sinkflow_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_gallery(tmp_path_factory):
    """``(files, rendered, folder)``: the image files of every figure as a quick build lists them, the
    figures it renders, and the gallery folder it writes."""
    import sinkflow.plots
    from sinkflow.plots import config_hash, registry

    rendered = []

    def fake_render(name, mode="quick", out="figures", formats=None):
        out = Path(out)
        ext = (formats or registry()[name].formats)[0]
        (out / f"{name}.{ext}").write_bytes(PNG)
        sha = hashlib.sha256(PNG).hexdigest()[:16]
        manifest = out / "MANIFEST.tsv"
        head = "" if manifest.exists() else "figure\tmode\tfile\tconfig_hash\tdata_checksum\tfile_sha256\n"
        with manifest.open("a") as f:
            f.write(head + f"{name}\t{mode}\t{name}.{ext}\t{config_hash(name, registry()[name].quick)}\t-\t{sha}\n")
        rendered.append(name)

    tmp = tmp_path_factory.mktemp("checkout")
    (tmp / "figures").symlink_to(ROOT / "figures")  # the committed figures, read only
    src = tmp / "docs"
    src.mkdir()
    real_render = sinkflow.plots.render
    sinkflow.plots.render = fake_render
    try:
        files = _extension().write_gallery(src, logging.getLogger("test"), render_images="missing")
    finally:
        sinkflow.plots.render = real_render
    return files, rendered, src / "gallery"


def test_every_gallery_page_of_a_quick_build_has_its_image(quick_gallery):
    from sinkflow.plots import registry

    files, rendered, folder = quick_gallery
    missing = [name for name in registry() if not files.get(name)]
    assert not missing, f"gallery pages without an image in a quick build: {missing}"
    for name in registry():
        page = (folder / f"{name}.md").read_text()
        images = re.findall(r"^```\{image\} (\S+)$", page, re.M)
        assert images, f"{name}: its page shows no image"
        assert all((folder / image).is_file() for image in images), f"{name}: {images} not written"


def test_a_quick_build_shows_the_committed_figures_and_renders_only_the_others(quick_gallery):
    from sinkflow.plots import registry

    _, rendered, _ = quick_gallery
    committed = {line.split("\t")[0] for line in (ROOT / "figures" / "MANIFEST.tsv").read_text().splitlines()[1:]}
    assert not set(rendered) & committed, "a committed, current figure is rendered again"
    assert [name for name, spec in registry().items() if spec.default and name in rendered] == []


def _figures_directives(page: Path) -> list[list[str]]:
    return [m.split() for m in re.findall(r"^```\{sinkflow-figures\} (.+)$", page.read_text(), re.M)]


THEORY = sorted((DOCS / "theory").glob("*.md"))


@pytest.mark.parametrize("page", THEORY, ids=lambda p: p.stem)
def test_theory_page_shows_each_figure_it_names(page, quick_gallery):
    files, _, _ = quick_gallery
    text = page.read_text()
    bare = re.findall(r"^Figure \S+$", text, re.M)
    assert not bare, f"bare figure links, with no image and no word on why: {bare}"
    for prefixes in _figures_directives(page):
        names = [name for name in files if name.startswith(tuple(prefixes))]
        assert names, f"{page.name}: no registered figure starts with {prefixes}"
        assert not [name for name in names if not files[name]], f"{page.name}: figures without an image"


def test_a_figure_without_an_image_says_why_in_words():
    # --skip-figures: the page links the figure and says why it shows no image (never a bare link)
    text = _extension().NOT_RENDERED.format(name="demo")
    assert "not rendered in this build" in text and "sinkflow figures demo" in text
