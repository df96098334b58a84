"""Command line: ``sinkflow figures``, and one subcommand per study.

Each subcommand lives in :data:`COMMANDS` as ``name -> (module, help)``; the module
provides ``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported
lazily so ``sinkflow --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "figures": ("sinkflow.cli_figures", "regenerate registered figures (quick by default)"),
    "nystrom-check": ("sinkflow.cli_nystrom", "check Skyformer's Nyström spectral-norm bound on random or given Q, K"),
    "validate": ("sinkflow.cli_validate", "train small Transformers per attention normalization; JSON report + figures"),
    "docs": ("sinkflow.cli_docs", "build the documentation with Sphinx (warnings are errors; --quick skips notebooks)"),
    "sweep": ("sinkflow.cli_sweep", "run a parameter sweep from a TOML/JSON config (Dask or sequential, cached)"),
}


def build_parser() -> argparse.ArgumentParser:
    from sinkflow import __version__

    parser = argparse.ArgumentParser(prog="sinkflow", description="Attention as interacting particles: figures and checks.")
    parser.add_argument("--version", action="version", version=f"sinkflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(module)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
