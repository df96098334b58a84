"""The markdown of the studies: a Long Range Arena report, the docs pages "Reproducing the papers"
(:func:`reproducing_page`) and "Instability" (:func:`sinkflow.studies.paper_report.instability_page`).

The top of the studies: it puts together the comparison tables of :mod:`sinkflow.studies.lra`, the
paper-setting and ``--learn`` sections of :mod:`sinkflow.studies.paper_report` and the Sinkformers
studies' sections of ``_study_report.py``. ``python -m sinkflow.studies.pages [--instability] REPORT.json ...``
prints a page.
"""

from __future__ import annotations

from sinkflow.studies._study_report import study_section
from sinkflow.studies.lra import SETTING_DIFFERENCES, _contradicted, _setting, _table, paper_comparison
from sinkflow.studies.paper_report import (
    LEARN_TARGET,
    instability_page,
    learn_markdown,
    paper_setting_markdown,
    search_section,
)

__all__ = ["report_markdown", "write_paper_report", "reproducing_page"]


def report_markdown(report: dict) -> str:
    """The report of an LRA task as markdown: setting, comparison table, differences, contradictions."""
    return _markdown(report, paper_comparison(report))


def _markdown(report: dict, rows: list[dict]) -> str:
    if report["mode"] == "learn":  # its own differences from the paper (masks on) and the majority baseline
        lines = learn_markdown(report) + [_table(report, rows, with_setting=False), ""]
        contradicted = _contradicted(rows)
        lines.append("Contradicts the paper: " + ", ".join(contradicted) + "." if contradicted
                     else "No variant contradicts the paper's claims on this run.")
        return "\n".join(lines) + "\n"
    cfg, size = report["config"], report["config"]["size"]
    device = cfg["device"] + (f" ({report['environment']['gpu']})" if report["environment"].get("gpu") else "")
    contradicted = _contradicted(rows)
    lines = [f"## {report['task']} ({report['mode']} mode, {device}, {report['environment']['threads']} thread(s))", "",
             f"Model: {size['depth']} layers, embedding {size['dim']}, FFN {size['mlp_ratio'] * size['dim']}, "
             f"{size['heads']} heads, mean pooling, {size['landmarks']} landmarks; sequence length "
             f"{size['seq_len']}; {cfg['n_train']} train / {cfg['n_test']} test examples; {size['epochs']} epochs of "
             f"batch {size['batch_size']}; seeds {cfg['seeds']}; memory: {report.get('memory_method', '-')}.", "",
             _table(report, rows, with_setting=False), "",
             "Paper: Skyformer, Table 1 and Appendix F (LRA, 50k steps, 3 seeds, GPU); Sinkformers for the "
             "Sinkhorn time ratio. Differences from the paper's setting: " + "; ".join(SETTING_DIFFERENCES)
             + (f"; quick mode: reduced data and model ({size['data']})" if report["mode"] == "quick" else "") + ".",
             ""]
    lines.append("Contradicts the paper: " + ", ".join(contradicted) + "." if contradicted
                 else "No variant contradicts the paper's claims on this run.")
    return "\n".join(lines) + "\n"


def write_paper_report(report: dict, stem) -> list:
    """Write ``STEM.md`` (:func:`report_markdown`) and return its path.

    The figure beside it, ``STEM_paper.png``, is drawn by
    :func:`sinkflow.plots.training.write_paper_figure` (figures live above the models).
    """
    from pathlib import Path

    md = Path(f"{stem}.md")
    md.write_text(report_markdown(report))
    return [md]


def _baseline_sentence(report: dict) -> str:
    """The majority baseline of a report's split (absent from reports written before it was recorded)."""
    base = report.get("baseline")
    if base is None:
        return " Majority baseline: not recorded in this report."
    return (f" Majority baseline (the training set's most frequent class, on the test set): "
            f"{100 * base['accuracy']:.1f}%.")


def reproducing_page(reports: list[dict]) -> str:
    """The docs page "Reproducing the papers", its tables generated from validation reports.

    Examples
    --------
    >>> from sinkflow.studies.pages import reproducing_page
    >>> reproducing_page([]).splitlines()[0]
    '# Reproducing the papers'
    """
    paper = [r for r in reports if r.get("mode") == "paper"]
    learn = [r for r in reports if r.get("mode") == "learn"]
    studies = [r for r in reports if r.get("study") in ("patch_size", "point_cloud")]
    searches = [r for r in reports if r.get("study") == "learn_search"]
    runs = [r for r in reports if r.get("mode") not in ("paper", "learn") and "study" not in r]
    lines = _page_intro()
    for report in paper:
        lines += [paper_setting_markdown(report)]
    for report in learn:
        lines += learn_markdown(report)
    for study in searches:
        lines += search_section(study)
    lines += _quick_sections(runs)
    for study in studies:
        lines += study_section(study)
    if runs:
        lines += ["Setting differences from the paper in every quick or full run: " + "; ".join(SETTING_DIFFERENCES)
                  + ".", ""]
    return "\n".join(lines)


def _page_intro() -> list[str]:
    """The head of the reproducing page: what each block of rows is, and the commands that made them."""
    return ["# Reproducing the papers", "",
             "<!-- generated by `python -m sinkflow.studies.pages docs/data/*.json > docs/reproducing.md`; do not edit "
             "-->", "",
             "The Skyformer paper's comparisons on two Long Range Arena tasks, ListOps and Pathfinder, regenerated "
             "offline by `sinkflow.datasets` and run by `sinkflow validate listops pathfinder`. Every table "
             "below is generated from the JSON report of a run (in `docs/data/`) and states its setting.", "",
             "**Paper setting, CPU** (`--paper`, first): the paper's model, lengths (ListOps up to 2,000 tokens, "
             "Pathfinder 1,024), padding masks, optimizer, learning rate and warm-up (`sinkflow.studies.paper`), for "
             "what needs no GPU: the cost of a training step and the instability score of the first 20 "
             "optimizer steps (the paper's Appendix F). Where a batch or a number of seeds is reduced, the row "
             "says so. The cost rows record the digest of the attention code they timed; when that code "
             "changes, the test suite asks for them to be re-measured (`--cost-only`, third command below). "
             "[Instability](instability.md) explains the instability numbers.", "",
             "**CPU, learns** (`--learn`, second): a setting per task "
             "(`sinkflow.studies.validation.TASKS[task].learn`), chosen by the small search whose table follows its "
             "rows, to learn clearly above the majority class within minutes per run on one CPU thread; shorter data "
             "and a smaller model than the paper's, each difference stated beside the numbers. The bar, on the median "
             "over seeds: " + "; ".join(
                 f"{t} at least {100 * b['accuracy']:.0f}% and {100 * b['margin']:.0f} points above the majority "
                 "baseline" for t, b in LEARN_TARGET.items()) + ".", "",
             "**Quick** (after): reduced data and model, CPU, at lengths 39 and 100. These check that the "
             "comparison runs end to end; they are not estimates of the paper's numbers, which need the full model, "
             "50,000 steps and a GPU (`--full --device cuda`). Compare their accuracy with the majority "
             "baseline each section states (the training set's most frequent class, scored on the test set; chance: "
             "10% on ListOps, 50% on Pathfinder) before reading anything into it.", "",
             "```bash",
             "sinkflow validate listops --paper --attention softmax sinkhorn gaussian skyformer nystromformer \\",
             "    --batch-size 1 --cost-steps 2 --decomposition-length 128",
             "sinkflow validate pathfinder --paper --attention softmax sinkhorn gaussian skyformer nystromformer \\",
             "    --batch-size 1 --cost-steps 3",
             "sinkflow validate listops pathfinder --paper --cost-only --out docs/data   # cost rows on today's code",
             "sinkflow validate listops pathfinder --learn --attention softmax skyformer",
             "sinkflow validate pathfinder --learn --data resolution=32 --epochs 3 --attention softmax --seeds 0 \\",
             "    --no-kl                                   # the 32 x 32 learning curve",
             "sinkflow validate listops pathfinder --quick --attention softmax sinkhorn gaussian skyformer "
             "nystromformer \\",
             "    --n-iter 3 --no-kl",
             "sinkflow validate listops pathfinder --full --device cuda --attention softmax sinkhorn gaussian "
             "skyformer \\",
             "    nystromformer --n-iter 3 --no-kl        # or: bash benchmarks/gpu_validation.sh",
             "```", ""]


def _quick_sections(runs: list[dict]) -> list[str]:
    """The quick (or full) validation runs of the page, one section per report, with their verdicts."""
    lines = []
    if runs:
        lines += ["Columns of the quick tables: test accuracy (median over seeds), instability score relative to "
                  "SoftMax, time per training step and its ratio to SoftMax, memory of one training step (CUDA: peak "
                  "allocated; CPU: bytes saved for backward) and its ratio; the paper's number after each slash; the "
                  "verdict says whether our run agrees with the direction the paper claims (see "
                  "`sinkflow.studies.lra.paper_comparison`).", ""]
    for report in runs:
        size, cfg, rows = report["config"]["size"], report["config"], paper_comparison(report)
        lines += [f"## {report['task']}: {_setting(report)}", "",
                  f"{report['description']}. Sequence length {size['seq_len']}, embedding {size['dim']}, "
                  f"{size['depth']} layers, {size['landmarks']} landmarks, {cfg['n_train']} training examples, "
                  f"{size['epochs']} epochs of batch {size['batch_size']}, seeds {cfg['seeds']}; torch "
                  f"{report['environment']['torch']}; {report['total_time']:.0f} s in all."
                  + _baseline_sentence(report), "",
                  _table(report, rows, with_setting=True), ""]
        contradicted = _contradicted(rows)
        lines += [("Contradicts the paper here: " + ", ".join(contradicted) + ".") if contradicted
                  else "Nothing here contradicts the paper's claims.", ""]
    return lines


# python -m sinkflow.studies.pages [--instability] REPORT.json ... > a docs page (reproducing.md, instability.md)
if __name__ == "__main__":
    import json
    import sys


    args = sys.argv[1:]
    page = instability_page if args[:1] == ["--instability"] else reproducing_page
    print(page([json.loads(open(p).read()) for p in args if p != "--instability"]), end="")
