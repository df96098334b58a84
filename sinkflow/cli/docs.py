"""``sinkflow docs``: build the documentation with Sphinx, warnings as errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["DEFAULT_OUT", "DOCS_MODULES", "docs_source", "missing_modules", "build_command", "add_arguments", "run"]

#: Where ``sinkflow docs`` writes, relative to the folder it is run from (as ``sinkflow figures``).
DEFAULT_OUT = "docs/_build/html"


#: What the build imports, by module name: the ``docs`` extra of pyproject.toml.
DOCS_MODULES = ("sphinx", "furo", "myst_nb", "numpydoc", "sphinxcontrib.bibtex")


def missing_modules(names=None) -> list[str]:
    """The modules of ``names`` (:data:`DOCS_MODULES` by default) that cannot be imported here."""
    import importlib.util

    def absent(name):
        try:
            return importlib.util.find_spec(name) is None
        except ModuleNotFoundError:  # a dotted name whose parent is absent
            return True

    return [name for name in (DOCS_MODULES if names is None else names) if absent(name)]


def docs_source() -> Path:
    """The ``docs/`` folder of the checkout sinkflow is imported from (an editable install)."""
    import sinkflow

    return Path(sinkflow.__file__).resolve().parents[1] / "docs"


def build_command(source: Path, out: Path, builder: str = "html", fresh: bool = False) -> list[str]:
    """The ``sphinx-build`` call: ``-W --keep-going`` makes every warning fail the build (all reported)."""
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", builder, str(source), str(out)]
    return cmd + (["-E"] if fresh else [])


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="do not execute the notebooks (their stored outputs are shown) and render only the gallery "
                        "images that figures/ does not hold: a check that takes about a minute")
    p.add_argument("--skip-figures", action="store_true",
                   help="do not render gallery images (pages and code still built; cached images still shown)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"output folder, relative to the current folder (default: {DEFAULT_OUT})")
    p.add_argument("--fresh", action="store_true", help="rebuild every page (ignore Sphinx's saved environment)")
    p.add_argument("--source", help="docs source folder (default: the checkout's docs/)")


def run(args) -> int:
    source = Path(args.source) if args.source else docs_source()
    if not (source / "conf.py").is_file():
        print(f"sinkflow docs: no Sphinx project at {source} (the docs ship with a source checkout: "
              "pip install -e . from a clone)", file=sys.stderr)
        return 2
    missing = missing_modules()
    if missing:
        print(f"sinkflow docs: the build needs the docs extra (missing: {', '.join(missing)}); install it from "
              "the clone: pip install -e \".[docs]\"", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    env = {**os.environ, "SINKFLOW_DOCS_QUICK": "1" if args.quick else os.environ.get("SINKFLOW_DOCS_QUICK", "0"),
           "SINKFLOW_DOCS_CACHE": str(out.parent / ".jupyter_cache")}
    if args.skip_figures:
        env["SINKFLOW_DOCS_FIGURES"] = "0"
    elif args.quick:  # the committed figures as they are; the few outside the default set rendered
        env["SINKFLOW_DOCS_FIGURES"] = "missing"
    t0 = time.perf_counter()
    rc = subprocess.call(build_command(source, out, fresh=args.fresh), env=env)
    status = "built" if rc == 0 else "FAILED (warnings are errors)"
    print(f"sinkflow docs: {status} in {time.perf_counter() - t0:.0f} s -> {out / 'index.html'}", file=sys.stderr)
    return rc
