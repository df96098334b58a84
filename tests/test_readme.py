"""The README keeps its promises: its Python runs and prints what its comments say, its commands
are valid invocations, its links and its picture exist, and it stays one page. The docs' landing
page (docs/index.md) shows a first example too: its Python is held to the same convention.

Convention for the Python blocks: every ``print(...)`` carries a comment ``# -> OUTPUT`` with
the line it prints. The blocks run in order in one namespace, in a fresh interpreter with a
temporary working folder, and the printed lines are compared with those comments: words
exactly, integers exactly, and a decimal number within one unit of its last written digit
(``0.036`` matches 0.0355 to 0.0370), so that values moving at rounding level from one CPU to
another never fail the test.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
#: Pages whose ```python blocks a reader copies: each runs and prints what its comments say.
EXAMPLE_PAGES = (README, ROOT / "docs" / "index.md")

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
EXPECTED = re.compile(r"#\s*->\s*(.*?)\s*$")
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]\n]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
TWO_COMMANDS = (
    "pip install torch==2.13.0 -e . && sinkflow figures",
    'pip install torch==2.13.0 -e ".[test]" && python -m pytest -q',
)


def blocks(lang: str, text: str = TEXT) -> list[str]:
    return [body for tag, body in FENCE.findall(text) if tag == lang]


# --- the page -------------------------------------------------------------------------------


def test_readme_is_one_page_without_a_changelog():
    lines = TEXT.splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines: move detail to docs/ or CHANGELOG.md"
    assert not [line for line in lines if re.match(r"#+ .*changelog", line, re.I)], "history goes to CHANGELOG.md"
    assert "before:" not in TEXT.lower()  # no numbers of a past the reader never saw


def test_readme_shows_a_picture_that_exists():
    images = IMAGE.findall(TEXT)
    assert images, "the README shows no picture"
    for target in images:
        assert not re.match(r"[a-z]+:", target), f"{target}: a committed file, by a relative path"
        assert (ROOT / target).is_file(), f"{target} does not exist"


def test_readme_relative_links_resolve():
    targets = [t.split("#")[0] for t in LINK.findall(TEXT)]
    relative = [t for t in targets if t and not re.match(r"[a-z]+:", t)]
    assert relative
    missing = [t for t in relative if not (ROOT / t).exists()]
    assert not missing, f"links to nothing: {missing}"


def test_readme_keeps_the_torch_pin_and_the_public_namespace_promise():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch>=2.1" in deps
    assert "any torch >= 2.1" in TEXT
    assert "Every public name is importable from `sinkflow`" in TEXT


# --- the commands ---------------------------------------------------------------------------


def test_the_two_commands_appear_verbatim_in_bash_blocks():
    lines = {line.strip() for block in blocks("bash") for line in block.splitlines()}
    for command in TWO_COMMANDS:
        assert command in lines, f"missing, verbatim, in a ```bash block: {command}"


def _commands():
    """(where, command) of every command in a bash block and every inline `sinkflow ...` or `pip install ...`."""
    for block in blocks("bash"):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            for part in filter(None, (p.strip() for p in line.split("&&"))):
                yield "bash block", part
    for span in INLINE_CODE.findall(TEXT):
        if re.match(r"(sinkflow|pip install) ", span):
            yield "inline code", span


def _check_extras(argv):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for arg in argv:
        match = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
        if match:
            unknown = set(match.group(1).split(",")) - set(extras)
            assert not unknown, f"no such extra: {unknown}"


def _check_sinkflow(argv):
    from sinkflow.cli import COMMANDS, build_parser
    from sinkflow.plots import registry

    if not argv or argv[0] not in COMMANDS:
        assert argv in (["--help"], ["--version"]), f"not a sinkflow command: {argv}"
        return
    try:
        args = build_parser([argv[0]]).parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"`sinkflow {' '.join(argv)}` does not parse (exit {exc.code})")
    if argv[0] == "figures":
        unknown = set(args.names) - set(registry())
        assert not unknown, f"no such figure: {unknown}"


def test_every_command_shown_is_a_valid_invocation():
    seen = 0
    for where, command in _commands():
        argv = shlex.split(command)
        if argv[0] == "sinkflow" and where == "inline code" and len(argv) == 2:
            from sinkflow.cli import COMMANDS

            assert argv[1] in COMMANDS, f"no such command: {command}"  # a mention, not an invocation
        elif argv[0] == "sinkflow":
            _check_sinkflow(argv[1:])
        elif argv[:2] == ["pip", "install"]:
            _check_extras(argv[2:])
        elif argv[:3] == ["python", "-m", "pytest"]:
            pass
        else:
            pytest.fail(f"{where}: a command this test does not know how to check: {command}")
        seen += 1
    assert seen >= 5


# --- the Python -----------------------------------------------------------------------------


def _number_matches(actual: str, expected: str) -> bool:
    if re.fullmatch(r"[-+]?\d+", expected):
        return actual == expected
    mantissa, _, exponent = expected.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    unit = 10.0 ** (int(exponent or 0) - decimals)
    return abs(float(actual) - float(expected)) <= unit * (1 + 1e-9)


def output_matches(printed: str, expected: str) -> bool:
    """Words equal, numbers equal (integers) or within one unit of the last written digit."""
    if NUMBER.sub("#", printed).split() != NUMBER.sub("#", expected).split():
        return False
    got, want = NUMBER.findall(printed), NUMBER.findall(expected)
    return len(got) == len(want) and all(map(_number_matches, got, want))


@pytest.mark.parametrize("printed, expected, ok", [
    ("False 0.03601889", "False 0.036", True),
    ("False 0.0374", "False 0.036", False),
    ("True True 1e-09", "True True 1e-09", True),
    ("(51, 64, 2)", "(51, 64, 2)", True),
    ("(51, 64, 3)", "(51, 64, 2)", False),
    ("Tensor torch.float64 True", "Tensor torch.float64 True", True),
    ("Tensor torch.float32 True", "Tensor torch.float64 True", False),
    ("True", "False", False),
])
def test_output_convention(printed, expected, ok):
    assert output_matches(printed, expected) is ok


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=_page_id)
def test_every_print_of_the_readme_says_what_it_prints(page):
    code = "\n".join(blocks("python", page.read_text(encoding="utf-8")))
    prints = [line for line in code.splitlines() if re.match(r"\s*print\(", line)]
    assert prints, f"{_page_id(page)} has no example"
    unexplained = [line for line in prints if not EXPECTED.search(line)]
    assert not unexplained, f"a print without its `# -> output` comment: {unexplained}"


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=_page_id)
def test_readme_python_blocks_run_and_print_what_they_say(page, tmp_path):
    code = "\n\n".join(blocks("python", page.read_text(encoding="utf-8")))
    expected = [m.group(1) for line in code.splitlines() if (m := EXPECTED.search(line))]
    env = {**os.environ, "MPLBACKEND": "Agg", "SINKFLOW_QUICK": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, f"the Python of {_page_id(page)} failed:\n{run.stderr[-3000:]}"
    printed = run.stdout.splitlines()
    assert len(printed) == len(expected), f"printed {printed}\nthe comments say {expected}"
    wrong = [(p, e) for p, e in zip(printed, expected, strict=True) if not output_matches(p, e)]
    assert not wrong, f"printed (left) against the comments of {_page_id(page)} (right):\n" + "\n".join(map(str, wrong))


def test_every_notebook_is_linked_from_the_capability_table():
    # issue 41: notebooks 06 and 07 came after the table and were left out of it (their rows showed "-")
    rows = [line for line in TEXT.splitlines() if line.startswith("| ") and "](notebooks/" in line]
    linked = {Path(target).name for row in rows for target in LINK.findall(row) if target.startswith("notebooks/")}
    notebooks = {p.name for p in (ROOT / "notebooks").glob("[0-9]*.ipynb")}
    assert notebooks and not notebooks - linked, f"notebooks no table row links: {sorted(notebooks - linked)}"
