"""``sinkflow figures``: list, regenerate and check registered figures.

Like ``sinkflow docs``, it writes relative to the folder it is run from (``--out``,
default ``./figures``) and says where it wrote. ``--check`` writes nothing there: it
regenerates into a temporary folder and compares with ``OUT/MANIFEST.tsv``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

__all__ = ["DEFAULT_OUT", "add_arguments", "run", "check"]

#: Where ``sinkflow figures`` writes, relative to the folder it is run from.
DEFAULT_OUT = "figures"


def add_arguments(p) -> None:
    from sinkflow.plots.registry import FORMATS

    p.add_argument("names", nargs="*", help="figures to make (default: the default set)")
    p.add_argument("--list", action="store_true", help="list registered figures and exit")
    p.add_argument("--all", action="store_true", help="make every registered figure")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick", help="small embedded configs (default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full", help="publication-size configs")
    p.set_defaults(mode="quick")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"output folder, relative to the current folder (default: {DEFAULT_OUT})")
    p.add_argument("--format", action="append", choices=[*FORMATS, "gif"],
                   help="formats (default: png and pdf; gif for an animation); "
                        "a format a figure cannot be written in is an error")
    p.add_argument("--data", action="store_true", help="also write each figure's data as NAME.npz beside it")
    p.add_argument("--check", action="store_true",
                   help="regenerate into a temporary folder and compare config hashes and data checksums with "
                        "OUT/MANIFEST.tsv; exit 1 on a mismatch")


def check(names, mode: str, reference: Path, log=print) -> list[str]:
    """Regenerate ``names`` and compare with ``reference/MANIFEST.tsv``; returns the mismatches.

    Config hash and data checksum must agree; a differing file hash alone is reported as a
    note (pixels depend on matplotlib and font versions).
    """
    from sinkflow.plots.registry import read_manifest, render

    expected = read_manifest(reference)
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            rows = {f: r for f, r in expected.items() if r["figure"] == name and r["mode"] == mode}
            if not rows:
                problems.append(f"{name}: no {mode} row in {reference / 'MANIFEST.tsv'}")
                continue
            formats = tuple(Path(f).suffix[1:] for f in rows)
            render(name, mode=mode, out=tmp, formats=formats)
            for file, new in read_manifest(tmp).items():
                old = rows.get(file)
                if old is None:
                    continue
                for key in ("config_hash", "data_checksum"):
                    if new[key] != old[key]:
                        problems.append(f"{name}: {file}: {key} {new[key]} != {old[key]} (committed)")
                if new["file_sha256"] != old["file_sha256"] and new["data_checksum"] == old["data_checksum"]:
                    log(f"note: {file}: same data checksum, other file bytes (matplotlib or font version, "
                        "or last-bit differences of the data)")
            log(f"{name}: {'ok' if not any(p.startswith(name + ':') for p in problems) else 'MISMATCH'}")
    return problems


def _print_list(reg) -> None:
    width = max(map(len, reg)) if reg else 0
    for name, spec in reg.items():
        flag = "*" if spec.default else " "
        print(f"{flag} {name:<{width}}  {spec.description}")
    print("(* = made by `sinkflow figures` without names)")


def run(args) -> int:
    import matplotlib

    matplotlib.use("Agg")  # files only: never open windows from the command line
    from sinkflow.plots.registry import registry, render

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
    if args.check:
        problems = check(names, args.mode, out, log=lambda m: print(m, file=sys.stderr))
        for p in problems:
            print(p, file=sys.stderr)
        print(f"sinkflow figures --check: {len(names) - len({p.split(':')[0] for p in problems})}/{len(names)} "
              f"figures reproduce {out / 'MANIFEST.tsv'}", file=sys.stderr)
        return 1 if problems else 0
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
        paths = render(name, mode=args.mode, out=out, formats=formats[name], save_data=args.data)
        bar.write(f"{name}: {', '.join(p.name for p in paths)} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    print(f"sinkflow figures: {len(names)} figure(s) -> {out}", file=sys.stderr)
    return 0
