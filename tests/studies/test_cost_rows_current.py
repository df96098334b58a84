"""The committed paper-setting cost rows move with the code: each report records the digest of
the attention code it timed, and the digest ignores docstrings, comments and blank lines but
nothing else."""

import json
from pathlib import Path

import pytest

from sinkflow.studies._cost import ATTENTION_CODE, _code_only, attention_code_digest
from sinkflow.studies.paper import refresh_cost, run_paper_setting

ROOT = Path(__file__).resolve().parents[2]
REPORTS = sorted((ROOT / "docs" / "data").glob("*_paper.json"))
RERUN = "sinkflow validate listops pathfinder --paper --cost-only --out docs/data"


def _package_copy(tmp_path):
    """The files of ATTENTION_CODE copied under tmp_path (same relative paths)."""
    src = ROOT / "sinkflow"
    for pattern in ATTENTION_CODE:
        for path in src.glob(pattern):
            target = tmp_path / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path


def test_the_committed_cost_rows_timed_todays_attention_code():
    assert REPORTS, "no paper-setting reports under docs/data"
    today = attention_code_digest()
    stale = [p.name for p in REPORTS if json.loads(p.read_text())["cost"].get("code_digest") != today]
    assert not stale, (f"the attention code changed since the cost rows of {stale} were measured: "
                       f"re-run `{RERUN}`, then `python -m sinkflow.studies.pages docs/data/*.json > "
                       "docs/reproducing.md`")


def test_the_digest_ignores_docstrings_comments_and_blank_lines(tmp_path):
    root = _package_copy(tmp_path)
    before = attention_code_digest(root)
    fused = root / "nn" / "_fused.py"
    text = fused.read_text()
    first_def = text.index("\ndef ")
    edited = text[:first_def] + "\n\n# a new comment\n" + text[first_def:]
    edited = edited.replace('"""', '"""Reworded. ', 1)  # the module docstring
    fused.write_text(edited.replace("\n\n\n", "\n\n\n\n"))
    assert attention_code_digest(root) == before


@pytest.mark.parametrize("edit", [("1.0 / math.sqrt", "2.0 / math.sqrt"), ("-math.inf", "-1e9")])
def test_the_digest_sees_a_changed_line_of_code(tmp_path, edit):
    root = _package_copy(tmp_path)
    before = attention_code_digest(root)
    fused = root / "nn" / "_fused.py"
    old, new = edit
    assert old in fused.read_text()
    fused.write_text(fused.read_text().replace(old, new, 1))
    assert attention_code_digest(root) != before


def test_code_only_keeps_strings_that_look_like_comments():
    source = 'def f(x):  # note\n    """Doc.\n\n    More."""\n\n    s = "# kept"  # dropped\n    return s\n'
    assert _code_only(source) == 'def f(x):\n    s = "# kept"\n    return s'


def test_refresh_cost_measures_the_cost_again_and_keeps_the_rest():
    report = run_paper_setting("listops", ["softmax", "gaussian"], [0], cost_batch=1, cost_steps=1,
                               instability_attentions=["softmax", "gaussian"], instability_batch=1, steps=1,
                               max_length=16)
    report["cost"]["code_digest"] = "an older digest"
    report["note"] = "cost rerun by hand; instability rerun with seed 0"
    new = refresh_cost(report, steps=2)
    assert new["instability"] == report["instability"]
    assert new["cost"]["code_digest"] == attention_code_digest()
    assert [r["attention"] for r in new["cost"]["summary"]] == ["softmax", "gaussian"]
    assert new["cost"]["steps"] == 2 and all(len(r["step_times"]) == 2 for r in new["cost"]["rows"])
    assert all(r["seq_len"] == 16 and r["batch_size"] == 1 for r in new["cost"]["rows"])
    assert new["note"].startswith("instability rerun with seed 0; cost re-measured by refresh_cost")


def test_cli_cost_only_needs_an_existing_report(tmp_path, capsys):
    from sinkflow.cli import main

    assert main(["validate", "listops", "--paper", "--cost-only", "--out", str(tmp_path)]) == 2
    assert "run --paper first" in capsys.readouterr().err
