"""The project's papers: ``CITATION.cff`` is valid CFF 1.2.0 and agrees with the package, the
license and the bibliography; ``LICENSE`` is the license the package declares; ``CHANGELOG.md``
keeps the Keep-a-Changelog shape.

The schema, ``tests/data/cff-1.2.0-schema.json``, is the Citation File Format's own (CC-BY-4.0),
copied from the ``cffconvert`` 2.0.0 wheel (``cffconvert/schemas/1.2.0/schema.json``); see
``tests/data/README.md``.
"""

import json
import re
from datetime import date
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).parents[1]
SCHEMA = json.loads((ROOT / "tests" / "data" / "cff-1.2.0-schema.json").read_text(encoding="utf-8"))
CITATION = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_citation_is_valid_cff_1_2_0():
    assert SCHEMA["$schema"].startswith("http://json-schema.org/draft-07/")
    validator = jsonschema.Draft7Validator(SCHEMA)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(CITATION)]
    assert not errors, "CITATION.cff breaks the CFF 1.2.0 schema:\n" + "\n".join(errors)
    assert CITATION["cff-version"] == "1.2.0"


def test_citation_agrees_with_the_package():
    assert CITATION["type"] == "software"
    assert str(CITATION["version"]) == PROJECT["version"]
    assert CITATION["license"] == PROJECT["license"]["text"] == "BSD-3-Clause"


def _bib_entries():
    """key -> title, year and family names of docs/refs.bib, braces and the accents used there undone."""
    text = (ROOT / "docs" / "refs.bib").read_text(encoding="utf-8")
    for latex, char in {r'{\"o}': "ö", r"{\'e}": "é"}.items():
        text = text.replace(latex, char)
    entries = {}
    for key, body in re.findall(r"@\w+\{(\w+),(.*?)\n\}", text, re.S):
        fields = {name: value.replace("{", "").replace("}", "")
                  for name, value in re.findall(r"(\w+)\s*=\s*\{(.*)\},?\s*$", body, re.M)}
        entries[key] = {"title": fields["title"], "year": int(fields["year"]),
                        "family": [a.split(",")[0].strip() for a in fields["author"].split(" and ")]}
    return entries


@pytest.mark.parametrize("key", ["sander2022sinkformers", "chen2021skyformer"])
def test_citation_references_the_two_seed_papers_as_the_bibliography_does(key):
    bib = _bib_entries()[key]
    refs = {ref["title"]: ref for ref in CITATION["references"]}
    assert bib["title"] in refs, f"{bib['title']!r} not among {list(refs)}"
    ref = refs[bib["title"]]
    assert ref["year"] == bib["year"]
    assert [a["family-names"] for a in ref["authors"]] == bib["family"]


def test_license_is_the_bsd_3_clause_text():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("BSD 3-Clause License\n")
    assert "Copyright (c) 2026, sinkflow developers" in text
    assert "Neither the name of the copyright holder nor the names of its" in text
    assert "LICENSE" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["license-files"]


def test_changelog_keeps_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n")
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[0] == "[Unreleased]"
    days = [date.fromisoformat(s) for s in sections[1:]]
    assert days == sorted(days, reverse=True), "dated sections go newest first"
    kinds = set(re.findall(r"^### (.+)$", text, re.M))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
