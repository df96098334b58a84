"""Command line: ``sinkflow figures``, and one subcommand per study.

Each subcommand is a module of this package, listed in :data:`COMMANDS` as
``name -> (module, help)``; the module provides ``add_arguments(parser)`` and
``run(args) -> int``. Only the module of the command being run is imported, so
``sinkflow --help`` and ``sinkflow figures --list`` start without importing torch.
A command that needs a package of an extra that is not installed (or a file of the source
checkout that a wheel lacks) says what to install in one line and exits with status 3
(:data:`NEEDS_EXTRA`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS = {
    "figures": ("sinkflow.cli.figures", "regenerate registered figures (quick by default)"),
    "nystrom-check": ("sinkflow.cli.nystrom_check",
                      "check Skyformer's Nyström spectral-norm bound on random or given Q, K"),
    "validate": ("sinkflow.cli.validate",
                 "train small Transformers per attention normalization; JSON report + figures"),
    "docs": ("sinkflow.cli.docs",
             "build the documentation with Sphinx (warnings are errors; --quick skips the gallery and notebooks)"),
    "sinkformers": ("sinkflow.cli.sinkformers",
                    "the Sinkformers paper's patch-size and point-cloud studies, over seeds (JSON)"),
    "sweep": ("sinkflow.cli.sweep", "run a parameter sweep from a TOML/JSON config (Dask or sequential, cached)"),
}


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The ``sinkflow`` parser; only the subcommands in ``commands`` (default: all) get their arguments.

    A subcommand left out is still listed in ``sinkflow --help``, but its module is not imported.
    """
    from sinkflow import __version__

    load = set(COMMANDS if commands is None else commands)
    parser = argparse.ArgumentParser(prog="sinkflow",
                                     description="Attention as interacting particles: figures and checks.")
    parser.add_argument("--version", action="version", version=f"sinkflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name in load:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def _requested_command(argv) -> list[str]:
    """The subcommand named on the command line (the first word that is one), as a list."""
    return [next((a for a in argv if a in COMMANDS), None)] if argv else []


#: Exit status of a command that needs what is not installed (a package of an extra, the checkout's data).
NEEDS_EXTRA = 3


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_requested_command(argv)).parse_args(argv)
    from sinkflow._optional import MissingExtraError, NeedsCheckoutError

    try:
        return int(args._run(args) or 0)
    except (MissingExtraError, NeedsCheckoutError) as err:  # one line that says what to install, not a traceback
        print(f"sinkflow {args.command}: {err}", file=sys.stderr)
        return NEEDS_EXTRA
