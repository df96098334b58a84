"""What a notebook's outputs must say, checked on stored outputs (tests/test_notebook_sources.py) and on
freshly executed ones (tests/test_notebooks.py) by the same rules.

A cell that prints a verdict on a paper's claim ("agrees", "CONTRADICTS", "confirms") prints it next to the
numbers it judges; in quick mode, where a run is too short to decide, it prints "quick mode: too short to
decide; run with SINKFLOW_QUICK=0 (about N s)" instead, never both; a contradiction is followed by its "why" line.
"""

from __future__ import annotations

import base64
import re

VERDICT = re.compile(r"\b(agrees|agree|CONTRADICTS|contradicts|confirms|confirmed|refutes|refuted)\b")
UNDECIDED = "too short to decide"

#: The narrowest animation a notebook may store, in pixels: the classroom demo at ``size=3.2`` (two 320 px
#: panels) is 640 px wide, half the projector default; the 374 px GIF stored before (``size=2.6, dpi=72``)
#: had text about 7 px high.
MIN_GIF_WIDTH = 640


def stdout_lines(cell) -> list[str]:
    """The lines a code cell printed (its stream outputs)."""
    return [line for out in cell.get("outputs", []) if out.get("output_type") == "stream"
            for line in out.get("text", "").splitlines()]


def verdict_problems(cells) -> list[str]:
    """Why the verdicts printed by ``cells`` (nbformat code cells with outputs) do not follow from their cells:
    empty when each cell prints either verdicts or that it is too short to decide (saying how to decide),
    and every contradiction with its reason on the next line."""
    problems = []
    for cell in cells:
        lines = stdout_lines(cell)
        verdicts = [line for line in lines if VERDICT.search(line) and UNDECIDED not in line]
        undecided = [line for line in lines if UNDECIDED in line]
        if verdicts and undecided:
            problems.append(f"a verdict printed where the cell says it cannot decide: {verdicts}")
        problems += [f"an undecided line says how to decide (the full run and its time): {line!r}"
                     for line in undecided if not ("SINKFLOW_QUICK=0" in line and re.search(r"about \d+ s", line))]
        for k, line in enumerate(lines):
            if re.search(r"\bCONTRADICTS\b", line):
                why = lines[k + 1].strip() if k + 1 < len(lines) else ""
                if not why.startswith("why"):
                    problems.append(f"a contradiction without its reason: {line!r}")
    return problems


def quick_training_problems(cells) -> list[str]:
    """Notebook 05 in quick mode: its four claims each too short to decide, none judged."""
    lines = [line for cell in cells for line in stdout_lines(cell)]
    undecided = [line for line in lines if UNDECIDED in line]
    judged = [line for line in lines if VERDICT.search(line) and UNDECIDED not in line]
    return ([f"{len(undecided)} claims too short to decide, expected 4"] * (len(undecided) != 4)
            + [f"a verdict in quick mode: {line!r}" for line in judged])


def gif_size(data: str) -> tuple[int, int]:
    """Width and height of a base64 GIF (an ``image/gif`` output), read from its header."""
    head = base64.b64decode(data[:16])  # 12 bytes: signature and logical screen size
    if head[:6] not in (b"GIF87a", b"GIF89a"):
        raise ValueError(f"not a GIF: {head[:6]!r}")
    return int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")


def stored_gifs(cells) -> list[tuple[int, tuple[int, int]]]:
    """``(index of the code cell, (width, height))`` of every GIF the cells show."""
    return [(i, gif_size(out["data"]["image/gif"])) for i, cell in enumerate(cells)
            for out in cell.get("outputs", []) if "image/gif" in out.get("data", {})]
