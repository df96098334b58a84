"""``sinkflow figures``: list and regenerate registered figures."""

from __future__ import annotations

import sys
import time


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", help="figures to make (default: the default set)")
    p.add_argument("--list", action="store_true", help="list registered figures and exit")
    p.add_argument("--all", action="store_true", help="make every registered figure")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick", help="small embedded configs (default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full", help="publication-size configs")
    p.set_defaults(mode="quick")
    p.add_argument("--out", default="figures", help="output folder (default: figures/)")
    p.add_argument("--format", action="append", choices=["png", "pdf", "svg"], help="formats (default: png and pdf)")


def run(args) -> int:
    import matplotlib

    matplotlib.use("Agg")  # files only: never open windows from the command line
    from tqdm.auto import tqdm

    from sinkflow.plots.registry import registry, render

    reg = registry()
    if args.list:
        width = max(map(len, reg)) if reg else 0
        for name, spec in reg.items():
            flag = "*" if spec.default else " "
            print(f"{flag} {name:<{width}}  {spec.description}")
        print("(* = made by `sinkflow figures` without names)")
        return 0
    unknown = [n for n in args.names if n not in reg]
    if unknown:
        print(f"unknown figure(s): {', '.join(unknown)}; see `sinkflow figures --list`", file=sys.stderr)
        return 2
    names = list(reg) if args.all else (args.names or [n for n, s in reg.items() if s.default])
    formats = tuple(args.format or ("png", "pdf"))
    bar = tqdm(names, desc=f"figures ({args.mode})", unit="fig", file=sys.stderr)
    for name in bar:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        paths = render(name, mode=args.mode, out=args.out, formats=formats)
        bar.write(f"{name}: {', '.join(str(p) for p in paths)} ({time.perf_counter() - t0:.1f} s)")
    return 0
