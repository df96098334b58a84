"""Every registered figure runs in quick mode and gets a manifest row, and a rerun of its
experiment reproduces the row: the same configuration hash and the same data checksum.

Reproducing the data costs a second run of the experiment, so by default it is checked on one
figure (``sweep_sinkhorn_rates`` when registered); ``-m slow`` checks every figure.
"""

from __future__ import annotations

import pytest

from sinkflow.plots.registry import compute, config_hash, data_checksum, registry, render

FIGURES = sorted(registry())
REPRODUCED_BY_DEFAULT = {"sweep_sinkhorn_rates"} if "sweep_sinkhorn_rates" in FIGURES else set(FIGURES[:1])


def _manifest(folder):
    lines = (folder / "MANIFEST.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:]]


def _render_rows(name, folder):
    import matplotlib.pyplot as plt

    written = render(name, mode="quick", out=folder, formats=("png",))
    plt.close("all")
    assert written and all(p.stat().st_size > 0 for p in written)
    rows = [r for r in _manifest(folder) if r["figure"] == name]
    assert {r["file"] for r in rows} == {p.name for p in written}
    return rows


@pytest.mark.skipif(not FIGURES, reason="no figure is registered")
@pytest.mark.parametrize("name", FIGURES)
def test_every_gallery_entry_runs_and_is_recorded_in_the_manifest(name, tmp_path):
    rows = _render_rows(name, tmp_path)
    assert all(r["mode"] == "quick" and r["config_hash"] == config_hash(name, registry()[name].quick) for r in rows)


@pytest.mark.skipif(not FIGURES, reason="no figure is registered")
@pytest.mark.parametrize("name", [n if n in REPRODUCED_BY_DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in FIGURES])
def test_rerun_reproduces_the_manifest_checksums(name, tmp_path):
    rows = _render_rows(name, tmp_path)
    # A reader re-running the experiment from the same (seeded) config gets the same numbers.
    again = compute(name, mode="quick")
    assert all(r["data_checksum"] == data_checksum(again) for r in rows)
