"""Every reference in the repository points at something in the repository.

Three checks over the tracked text files: no mention of the notes the project was started
from (they never were part of it), every relative Markdown link resolves, and every
repository path written out in prose or code (``docs/theory/nystrom.md``) exists.
"""

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".toml", ".txt", ".rst", ".cfg", ".yml", ".yaml", ".tsv", ".bib", ".in"}
# Built from pieces so that this file does not match itself.
FORBIDDEN = re.compile("|".join(re.escape(name) for name in
                                ("THEORY" + ".md", "PERF" + ".md", "STYLE" + ".md", "shared" + "/")))
TOP_LEVEL = ("docs", "notebooks", "benchmarks", "sinkflow", "tests", "figures")
REPO_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP_LEVEL)})/[\w./-]*\w\."
                       r"(?:md|py|ipynb|tsv|toml|png|svg|pdf|gif|bib|rst))")
MARKDOWN_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def tracked_text_files():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / name for name in out.splitlines() if Path(name).suffix in TEXT_SUFFIXES and (ROOT / name).is_file()]


def generated_doc_paths():
    """Pages the docs extension writes at build time (``GENERATED`` in docs/_ext/sinkflow_docs.py)."""
    tree = ast.parse((ROOT / "docs" / "_ext" / "sinkflow_docs.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "GENERATED")
    return tuple(ast.literal_eval(node.value))


def exists(path: Path) -> bool:
    path = path.resolve()
    if path.exists():
        return True
    try:
        within_docs = path.relative_to(ROOT / "docs").parts
    except ValueError:
        return False
    return bool(within_docs) and within_docs[0] in generated_doc_paths() + ("_build",)


def locations(pattern, files):
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in pattern.finditer(line):
                yield path, number, match.group(match.lastindex or 0)


def test_no_reference_to_files_outside_the_repository():
    hits = [f"{p.relative_to(ROOT)}:{n}: {m}" for p, n, m in locations(FORBIDDEN, tracked_text_files())]
    assert not hits, "references to notes that are not in the repository:\n" + "\n".join(hits)


def test_relative_markdown_links_resolve():
    files = [p for p in tracked_text_files() if p.suffix in (".md", ".ipynb")]
    dangling = []
    for path, number, target in locations(MARKDOWN_LINK, files):
        target = target.split("#")[0]
        if not target or re.match(r"[a-z]+:", target):  # anchors, http:, mailto:, ...
            continue
        if not re.search(r"[./]", target) or "\\" in target:  # a functional in math, v[\rho](x): no file
            continue
        if not exists(path.parent / target):
            dangling.append(f"{path.relative_to(ROOT)}:{number}: {target}")
    assert not dangling, "links to files that do not exist:\n" + "\n".join(dangling)


def test_repository_paths_in_text_exist():
    files = tracked_text_files()
    dangling = [f"{p.relative_to(ROOT)}:{n}: {m}" for p, n, m in locations(REPO_PATH, files)
                if "*" not in m and not exists(ROOT / m) and not exists(p.parent / m)]
    assert not dangling, "paths that do not exist in the repository:\n" + "\n".join(dangling)


MISSING = "nowhere" + ".md"  # not written out whole: this file is scanned too


@pytest.mark.parametrize("text, found", [(f"see docs/theory/{MISSING}", True), ("see docs/theory/heat_limit.md", False),
                                         (f"[x](docs/{MISSING})", True), (f"a/docs/{MISSING}", False)])
def test_path_pattern_finds_what_it_should(text, found, tmp_path):
    note = tmp_path / "note.md"
    note.write_text(text)
    hits = [m for _, _, m in locations(REPO_PATH, [note]) if not exists(ROOT / m)]
    assert bool(hits) is found
