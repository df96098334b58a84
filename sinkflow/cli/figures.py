"""``sinkflow figures``: list, regenerate and check registered figures.

Like ``sinkflow docs``, it writes relative to the folder it is run from (``--out``,
default ``./figures``) and says where it wrote. A figure whose recomputed data agree with
its reference data in ``OUT/data/`` within tolerance is left untouched (``--force`` redraws
it). ``--check`` writes nothing: it recomputes and compares with ``OUT``.

A figure that needs a package of an extra that is not installed, or a data file of the
source checkout that a wheel lacks (``needs`` of its registration, marked in ``--list``),
is not made: one line says what to install, the other figures are made, and the exit
status is 3.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

__all__ = ["DEFAULT_OUT", "add_arguments", "run", "check"]

#: Where ``sinkflow figures`` writes, relative to the folder it is run from.
DEFAULT_OUT = "figures"


def add_arguments(p) -> None:
    from sinkflow.plots import FORMATS

    p.add_argument("names", nargs="*", help="figures to make (default: the default set)")
    p.add_argument("--list", action="store_true", help="list registered figures and exit")
    p.add_argument("--all", action="store_true", help="make every registered figure")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="small embedded configs (default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full", help="publication-size configs")
    p.set_defaults(mode="quick")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"output folder, relative to the current folder (default: {DEFAULT_OUT})")
    p.add_argument("--format", action="append", choices=[*FORMATS, "gif"],
                   help="formats (default: png and pdf; gif for an animation); "
                        "a format a figure cannot be written in is an error")
    p.add_argument("--data", action="store_true", help="also write each figure's data as NAME.npz beside it")
    p.add_argument("--check", action="store_true",
                   help="recompute and compare with the figures in OUT (config hash, reference data within "
                        "each figure's tolerances, file hashes); writes nothing; exit 1 on a mismatch")
    p.add_argument("--force", action="store_true",
                   help="redraw figures whose data agree with the reference data in OUT (after a change of "
                        "plotting code); by default they are left untouched")


def _compute_or_skip(name: str, mode: str, log, not_made: list[str]):
    """The data of ``name``, or None (logged, ``name`` appended to ``not_made``) when what it needs is missing."""
    from sinkflow._optional import MissingExtraError, NeedsCheckoutError, install_hint
    from sinkflow.plots import compute, get

    missing = get(name).missing()
    try:
        if not missing:
            return compute(name, mode)
    # an undeclared need (`sinkflow figures --all` from a bare wheel finds it): still one line
    except MissingExtraError as err:
        missing = [install_hint(err.name)]
    except NeedsCheckoutError as err:
        missing = [str(err).split(" needs ", 1)[-1]]
    log(f"{name}: not made: needs {'; '.join(missing)}")
    not_made.append(name)
    return None


def check(names, mode: str, reference: Path, log=print, not_made: list[str] | None = None) -> list[str]:
    """Recompute ``names`` and compare with the figures committed in ``reference``; returns the mismatches.

    Each figure's data must agree with its reference data (``reference/data/NAME.npz``)
    within the figure's tolerances, for the configuration the manifest names, and the files
    must be those the manifest lists. Nothing is drawn or written. A figure whose needs are
    missing (an extra, the checkout's data) is logged and appended to ``not_made``, not compared.
    """
    from sinkflow.plots import stale

    problems = []
    for name in names:
        data = _compute_or_skip(name, mode, log, [] if not_made is None else not_made)
        if data is None:
            continue
        reasons = stale(name, data, mode=mode, out=reference)
        problems += [f"{name}: {line}" for line in reasons]
        log(f"{name}: {'ok' if not reasons else 'MISMATCH'}")
    return problems


def _print_list(reg) -> None:
    width = max(map(len, reg)) if reg else 0
    for name, spec in reg.items():
        flag = "*" if spec.default else " "
        print(f"{flag} {name:<{width}}  {spec.description}{_needs_note(spec)}")
    print("(* = made by `sinkflow figures` without names; [needs ...] = made only with that extra installed, "
          "or from a source checkout)")


def _needs_note(spec) -> str:
    """`` [needs sinkflow[models]]``, `` [needs a source checkout: not installed]``, or nothing."""
    from sinkflow._optional import EXTRAS

    if not spec.needs:
        return ""
    what = [f"sinkflow[{e}]" for e in sorted({EXTRAS[m.split(".")[0]][1] for m in spec.needs if "/" not in m})]
    what += ["a source checkout"] * any("/" in m for m in spec.needs)
    return f" [needs {' and '.join(what)}{': not installed' if spec.missing() else ''}]"


def run(args) -> int:
    import matplotlib

    matplotlib.use("Agg")  # files only: never open windows from the command line
    from sinkflow.cli import NEEDS_EXTRA
    from sinkflow.plots import registry, render, stale

    reg = registry()
    if args.list:
        _print_list(reg)
        return 0
    unknown = [n for n in args.names if n not in reg]
    if unknown:
        print(f"unknown figure(s): {', '.join(unknown)}; see `sinkflow figures --list`", file=sys.stderr)
        return 2
    names = list(reg) if args.all else (args.names or [n for n, s in reg.items() if s.default])
    out = Path(args.out).resolve()
    not_made: list[str] = []
    if args.check:
        problems = check(names, args.mode, out, log=lambda m: print(m, file=sys.stderr), not_made=not_made)
        for p in problems:
            print(p, file=sys.stderr)
        print(f"sinkflow figures --check: {len(names) - len(not_made) - len({p.split(':')[0] for p in problems})}"
              f"/{len(names)} figures reproduce the committed data in {out}{_not_made_note(not_made)}",
              file=sys.stderr)
        return 1 if problems else NEEDS_EXTRA if not_made else 0
    try:
        formats = {name: reg[name].writable(args.format) for name in names}
    except ValueError as err:
        print(f"sinkflow figures: {err}", file=sys.stderr)
        return 2
    from sinkflow._progress import progress_bar

    bar = progress_bar(names, desc=f"figures ({args.mode})", unit="fig", file=sys.stderr)
    for name in bar:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        data = _compute_or_skip(name, args.mode, lambda m: bar.write(m, file=sys.stderr), not_made)
        if data is None:
            continue
        kept = not args.force and not stale(name, data, mode=args.mode, out=out, formats=formats[name])
        paths = render(name, mode=args.mode, out=out, formats=formats[name], data=data, save_data=args.data,
                       force=not kept)  # a stale figure is redrawn without comparing again
        what = "unchanged (data within tolerance of the reference)" if kept else "written"
        bar.write(f"{name}: {', '.join(p.name for p in paths)} {what} ({time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr)
    print(f"sinkflow figures: {len(names) - len(not_made)} figure(s) -> {out}{_not_made_note(not_made)}",
          file=sys.stderr)
    return NEEDS_EXTRA if not_made else 0


def _not_made_note(not_made: list[str]) -> str:
    return f"; not made (what they need is not installed): {', '.join(not_made)}" if not_made else ""
