"""Sphinx extension generating the parts of the docs that follow the code.

At ``config-inited`` (before Sphinx lists the sources) it writes, under ``docs/``:

- ``api/index.rst``: an autosummary of every name in ``sinkflow.__all__``, grouped by the
  module that defines it, then of every public submodule's ``__all__`` names not already
  listed (so ``sinkflow.nn`` or ``sinkflow.heat`` appear as soon as they exist);
- ``gallery/``: one page per figure of :func:`sinkflow.plots.registry`, rendered
  in quick mode (cached by config hash and source hash), with the source of its compute
  and plot functions and its manifest row. ``SINKFLOW_DOCS_FIGURES`` says which images a build
  renders: ``1`` (default) all of them, ``missing`` (``sinkflow docs --quick``) only those without a
  current committed image in ``figures/`` (the figures outside the default set, a few seconds each),
  ``0`` (``--skip-figures``) none: a page then says in words that its image is not rendered;
- ``notebooks/``: copies of ``../notebooks/*.ipynb`` and an index (executed by myst-nb);
- ``cli.md``: the ``--help`` of every ``sinkflow`` subcommand.

It also defines ``{sinkflow-figures} PREFIX...`` (thumbnails of the registered figures
whose names start with a prefix) and the role ``{sinkflow-figure}`NAME```, which links
to a gallery page and degrades to plain text, without a warning, for a figure that is
not registered in this build.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import pkgutil
import shutil
import textwrap
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx import addnodes

GENERATED = ("api", "gallery", "notebooks", "cli.md")
_SKIP_MODULES = ("sinkflow.cli",)  # command-line front ends: documented on the CLI page


def _write_if_changed(path: Path, text: str) -> None:
    """Keep mtimes of unchanged pages, so incremental builds stay incremental."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


# ---------------------------------------------------------------------------------------
# API reference


def _public_modules():
    import sinkflow

    for info in pkgutil.walk_packages(sinkflow.__path__, prefix="sinkflow."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts) or info.name.startswith(_SKIP_MODULES):
            continue
        yield importlib.import_module(info.name)


def _first_line(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _entry(path: str, obj) -> str:
    """``path`` unless it also names a module (a name and a module of the same path): autosummary
    would document the module, so use the defining module's path."""
    import sys

    if path in sys.modules and sys.modules[path] is not obj:
        return f"{obj.__module__}.{getattr(obj, '__qualname__', path.rsplit('.', 1)[1])}"
    return path


def _data_path(name: str, folder: str) -> str:
    """The module where the constant ``name`` of ``folder`` is assigned: autodoc reads its ``#:``
    comment there (through the package it would show the docstring of ``float``)."""
    import importlib
    import pkgutil
    import re

    package = importlib.import_module(folder)
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{folder}.{info.name}")
        if re.search(rf"^{name}\s*[:=]", inspect.getsource(module), re.M):
            return f"{module.__name__}.{name}"
    return f"{folder}.{name}"


def _plain(text: str) -> str:
    """``text`` shown as written in Markdown: ``k*(beta)`` opened an emphasis that ate its star."""
    return "".join("\\" + c if c in "\\`*_[]<>$|~" else c for c in text)


def _autosummary(entries) -> list[str]:
    return [".. autosummary::", "   :toctree: generated", "   :nosignatures:", ""] + [f"   {e}" for e in entries] + [""]


def _heading(text: str, char: str) -> list[str]:
    return [text, char * len(text), ""]


def write_api(srcdir: Path) -> None:
    """``api/index.rst`` (reST: autosummary only generates stubs for reST sources)."""
    import sys

    import sinkflow

    seen = {}  # id(obj) -> documented name
    groups: dict[str, list[str]] = {}
    for name in sinkflow.__all__:
        obj = getattr(sinkflow, name)
        module = getattr(obj, "__module__", None) or sinkflow._ORIGIN.get(name, "sinkflow")
        module = module.split("._")[0]  # the public folder of a private module (sinkflow.attention._scores)
        is_data = getattr(obj, "__module__", None) is None and name in sinkflow._ORIGIN
        groups.setdefault(module, []).append(_data_path(name, module) if is_data else _entry(f"sinkflow.{name}", obj))
        seen[id(obj)] = name
    lines = _heading("API reference", "=") + [
        "Generated at build time from ``sinkflow.__all__`` and the ``__all__`` of every public "
        "submodule; each entry links to its full docstring.", ""]
    lines += _heading("sinkflow", "-") + ["Everything in this section is importable as ``sinkflow.<name>``, "
                                          "grouped by the folder that defines it.", ""]
    for module in sorted(groups):
        lines += _heading(module, "~")
        if module in sys.modules and _first_line(sys.modules[module]):
            lines += [_first_line(sys.modules[module]), ""]
        lines += _autosummary(groups[module])
    extra = []
    for mod in _public_modules():
        names = [n for n in getattr(mod, "__all__", []) if hasattr(mod, n) and id(getattr(mod, n)) not in seen]
        if not names:
            continue
        for n in names:
            seen[id(getattr(mod, n))] = f"{mod.__name__}.{n}"
        extra += _heading(mod.__name__, "~")
        if _first_line(mod):
            extra += [_first_line(mod), ""]
        extra += _autosummary([_entry(f"{mod.__name__}.{n}", getattr(mod, n)) for n in names])
    if extra:
        lines += _heading("Submodules", "-") + ["Names that are not re-exported at the top level.", ""] + extra
    _write_if_changed(srcdir / "api" / "index.rst", "\n".join(lines))
    _remove_stale_stubs(srcdir / "api" / "generated",
                        {line.strip() for line in lines if line.startswith("   sinkflow")})


def _remove_stale_stubs(folder: Path, entries: set[str]) -> None:
    """Autosummary never deletes the stub of a name that left the API; -W would fail on it (not in a toctree)."""
    for stub in folder.glob("*.rst"):
        if stub.stem not in entries:
            stub.unlink()


# ---------------------------------------------------------------------------------------
# gallery


def _spec_fingerprint(spec) -> str:
    """Config hash + hash of the compute/plot sources + package version: re-render when any changes."""
    import sinkflow
    from sinkflow.plots import config_hash

    h = hashlib.sha256()
    h.update(config_hash(spec.name, spec.quick).encode())
    for fn in (spec.compute, spec.plot):
        h.update(inspect.getsource(inspect.getmodule(fn)).encode())
    h.update(sinkflow.__version__.encode())
    return h.hexdigest()[:16]


def _source(fn) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return f"# source of {fn!r} is not available"


def _manifest_rows(folder: Path, name: str) -> list[list[str]]:
    path = folder / "MANIFEST.tsv"
    if not path.exists():
        return []
    return [line.split("\t") for line in path.read_text().splitlines()[1:] if line.split("\t")[0] == name]


def _committed_images(folder: Path, spec, images: Path) -> list[list[str]]:
    """Manifest rows of the PNGs of ``spec`` committed in ``figures/``, copied into ``images``.

    Only files made from the current quick configuration (config hash) and intact (file
    SHA-256 of the manifest) are used; ``sinkflow figures --check`` verifies that their data
    are what the current code computes.
    """
    from sinkflow.plots import config_hash

    rows = [r for r in _manifest_rows(folder, spec.name)
            if r[2].endswith(".png") and r[1] == "quick" and r[3] == config_hash(spec.name, spec.quick)
            and (folder / r[2]).is_file()
            and hashlib.sha256((folder / r[2]).read_bytes()).hexdigest()[:16] == r[5]]
    for r in rows:
        shutil.copyfile(folder / r[2], images / r[2])
    return rows


def _gallery_index(reg, files) -> list[str]:
    """The gallery's front page: a thumbnail per figure with an image (each links to the figure's
    page), then the table of every figure and its description."""
    index = ["# Figure gallery", "",
             "Every figure registered in `sinkflow.plots`, from the quick configuration and the code shown "
             "on its page: made at docs build time, or, in a quick build (`sinkflow docs --quick`), the "
             "committed file of `figures/` where it is current. `sinkflow figures --all --full` "
             "regenerates all of them at publication size; `sinkflow figures --list` lists them.", ""]
    if not reg:
        return index + ["No figure is registered in this build.", ""]
    for name in reg:
        stills = [f for f in files.get(name, []) if f.endswith((".png", ".gif"))]
        if stills:
            index += [f"```{{figure}} _images/{stills[0]}", f":alt: {name}", f":target: {name}.html",
                      ":class: sf-thumbnail", ":figclass: sf-gallery-item", "", f"`{name}`", "```", ""]
    index += ["| figure | description |", "|---|---|"]
    index += [f"| [`{n}`]({n}.md) | {_plain(s.description)} |" for n, s in reg.items()]
    return index + ["", "```{toctree}", ":hidden:", "", *reg, "```", ""]


def _fence(text: str, lang: str = "python") -> str:
    ticks = "`" * max(3, 1 + max((len(r) for r in text.split("\n") if set(r) == {"`"}), default=0))
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}\n"


#: What a page says where a figure has no image in this build (``sinkflow docs --skip-figures``).
NOT_RENDERED = ("The image of `{name}` is not rendered in this build (`sinkflow docs --skip-figures`) and "
                "no current one is committed in `figures/`; `sinkflow figures {name}` makes it.")

#: Values of ``SINKFLOW_DOCS_FIGURES``: which gallery images a build renders.
RENDER_MODES = {"1": "all", "missing": "missing", "0": "none"}


def write_gallery(srcdir: Path, logger, render_images: bool | str = True) -> dict[str, list[str]]:
    """Render every registered figure (quick mode) and write its page; returns name -> image files.

    Images are cached in ``gallery/_images`` by :func:`_spec_fingerprint`. ``render_images``:
    ``True`` or ``"all"`` renders every image that is not cached; ``"missing"`` shows the
    committed image of ``figures/`` where one is current and renders the others; ``False`` or
    ``"none"`` renders nothing (committed and cached images are still shown); the pages (code,
    configuration) are written all the same.
    """
    mode = {True: "all", False: "none"}.get(render_images, render_images)
    if mode not in RENDER_MODES.values():
        raise ValueError(f"render_images: one of {sorted(RENDER_MODES.values())}, not {render_images!r}")
    from sinkflow.plots import registry, render

    folder = srcdir / "gallery"
    images = folder / "_images"
    images.mkdir(parents=True, exist_ok=True)
    reg = registry()
    files: dict[str, list[str]] = {}
    for name, spec in reg.items():
        stamp = images / f".{name}.fingerprint"
        fingerprint = _spec_fingerprint(spec)
        rows = _manifest_rows(images, name)
        fresh = (stamp.exists() and stamp.read_text() == fingerprint and rows
                 and all((images / r[2]).exists() for r in rows))
        committed = [] if fresh or mode == "all" else _committed_images(srcdir.parent / "figures", spec, images)
        if not fresh and (mode == "all" or (mode == "missing" and not committed)):
            logger.info(f"[sinkflow] rendering gallery figure {name} (quick)")
            for r in rows:
                (images / r[2]).unlink(missing_ok=True)
            render(name, mode="quick", out=images, formats=("png",) if "png" in spec.formats else None)  # GIF
            stamp.write_text(fingerprint)
            rows = _manifest_rows(images, name)
        elif not fresh:  # a stale image is not shown; the committed default figure is, if it is current
            rows = committed
        files[name] = [r[2] for r in rows]
        page = [f"# `{name}`", "", *([f"**{_plain(spec.caption)}**", ""] if spec.caption else []),
                _plain(spec.description or ""), "",
                f"Quick configuration (`sinkflow figures {name}`; `--full` for the publication size):", "",
                _fence(repr(spec.quick)), ""]
        for f in files[name]:
            page += [f"```{{image}} _images/{f}", f":alt: {name}", "```", ""]
        if not files[name]:
            page += [f"*{NOT_RENDERED.format(name=name)}*", ""]
        if rows:
            page += ["| file | config hash | data checksum | file sha256 |", "|---|---|---|---|"]
            page += [f"| `{r[2]}` | `{r[3]}` | `{r[4]}` | `{r[5]}` |" for r in rows]
            page += ["", "(see [reproducibility](../reproducibility.md) for what these hashes mean)", ""]
        if spec.full is not spec.quick:
            page += ["Full configuration:", "", _fence(repr(spec.full)), ""]
        page += [f"## Experiment: `{spec.compute.__module__}.{spec.compute.__qualname__}`", "",
                 _fence(_source(spec.compute)), "",
                 f"## Plot: `{spec.plot.__module__}.{spec.plot.__qualname__}`", "", _fence(_source(spec.plot)), ""]
        _write_if_changed(folder / f"{name}.md", "\n".join(page))
    for stale in folder.glob("*.md"):
        if stale.stem != "index" and stale.stem not in reg:
            stale.unlink()
    _write_if_changed(folder / "index.md", "\n".join(_gallery_index(reg, files)))
    return files


# ---------------------------------------------------------------------------------------
# notebooks and CLI


def write_notebooks(srcdir: Path) -> None:
    source = srcdir.parent / "notebooks"
    folder = srcdir / "notebooks"
    folder.mkdir(exist_ok=True)
    books = sorted(source.glob("[0-9]*.ipynb")) if source.is_dir() else []
    for nb in books:
        target = folder / nb.name
        if not target.exists() or target.read_bytes() != nb.read_bytes():
            shutil.copyfile(nb, target)
    for stale in folder.glob("*.ipynb"):
        if not (source / stale.name).exists():
            stale.unlink()
    index = ["# Notebooks", "",
             "Teaching notebooks from the repository's `notebooks/` folder, with their quick-mode outputs "
             "(`SINKFLOW_QUICK=1`) stored in the repository: the quick build shows those, the full build "
             "executes the notebooks again. Run them yourself with `jupyter lab notebooks/`.", ""]
    if books:
        index += ["```{toctree}", ":maxdepth: 1", "", *[b.stem for b in books], "```", ""]
    else:
        index += ["No notebook in this build.", ""]
    _write_if_changed(folder / "index.md", "\n".join(index))


def write_cli(srcdir: Path) -> None:
    from sinkflow.cli import COMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    lines = ["# Command line", "", "`sinkflow COMMAND --help` prints the same text.", "",
             "```text", parser.format_help().rstrip(), "```", ""]
    for name in COMMANDS:
        lines += [f"## `sinkflow {name}`", "", "```text", sub.choices[name].format_help().rstrip(), "```", ""]
    _write_if_changed(srcdir / "cli.md", "\n".join(lines))


# ---------------------------------------------------------------------------------------
# directive and role


class FiguresDirective(Directive):
    """``{sinkflow-figures} PREFIX [PREFIX ...]``: the registered figures whose names start with a prefix."""

    required_arguments = 1
    optional_arguments = 20

    def run(self):
        env = self.state.document.settings.env
        env.sinkflow_figure_docs = getattr(env, "sinkflow_figure_docs", set()) | {env.docname}
        files = env.app.sinkflow_gallery
        names = [n for n in files if n.startswith(tuple(self.arguments))]
        if not names:
            para = nodes.paragraph()
            para += nodes.emphasis(text="No figure on this topic is registered in this build "
                                        f"(figure names starting with {', '.join(self.arguments)}).")
            return [para]
        out = []
        for name in names:
            if not files[name]:  # image not rendered in this build: the link, and why there is no image
                para = nodes.paragraph()
                para += _figure_ref(name)
                para += nodes.Text(": " + NOT_RENDERED.format(name=name).replace("`", ""))
                out.append(para)
            for f in files[name][:1]:
                fig = nodes.figure()
                fig += nodes.image(uri=f"/gallery/_images/{f}", alt=name)
                cap = nodes.caption()
                cap += _figure_ref(name)
                fig += cap
                out.append(fig)
        return out


def _figure_ref(name: str):
    ref = addnodes.pending_xref("", refdomain="std", reftype="doc", reftarget=f"/gallery/{name}",
                                refexplicit=True, refwarn=True)
    ref += nodes.literal(text=name)
    return ref


def figure_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    env = inliner.document.settings.env
    env.sinkflow_figure_docs = getattr(env, "sinkflow_figure_docs", set()) | {env.docname}
    if text in env.app.sinkflow_gallery:
        return [_figure_ref(text)], []
    return [nodes.literal(text=text), nodes.Text(" (not registered in this build)")], []


def _always_reread(app, env, added, changed, removed):
    """Pages that show registry contents depend on code, not on their source: re-read them."""
    return sorted(getattr(env, "sinkflow_figure_docs", set()) - set(removed))


def _generate(app, config=None):
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    src = Path(app.srcdir)
    write_api(src)
    setting = os.environ.get("SINKFLOW_DOCS_FIGURES", "1")
    if setting not in RENDER_MODES:
        raise ValueError(f"SINKFLOW_DOCS_FIGURES: one of {sorted(RENDER_MODES)}, not {setting!r}")
    app.sinkflow_gallery = write_gallery(src, logger, render_images=RENDER_MODES[setting])
    write_notebooks(src)
    write_cli(src)


def setup(app):
    app.sinkflow_gallery = {}
    # config-inited: before Sphinx lists the source files and autosummary writes its stubs
    app.connect("config-inited", _generate)
    app.connect("env-get-outdated", _always_reread)
    app.add_directive("sinkflow-figures", FiguresDirective)
    app.add_role("sinkflow-figure", figure_role)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
