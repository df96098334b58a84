r"""Long Range Arena tasks of the Skyformer paper: data, model and the paper's numbers.

The tasks ``listops`` and ``pathfinder`` of :data:`sinkflow.nn.validation.TASKS` train the
paper's model — 2 pre-LN blocks, embedding 64, feed-forward 128, 2 heads of dimension 32,
mean pooling, 128 Nyström landmarks — in ``--full`` mode, a smaller one in ``--quick``, on
data from :mod:`sinkflow.datasets`. :func:`paper_comparison` puts a report's accuracy,
time per step, memory and instability score beside the papers' numbers (:data:`PAPER`)
and says where they disagree; :func:`report_markdown` and :func:`sinkflow.plots.training.plot_paper_comparison`
turn that into the report's markdown and figure.

Settings that differ from the paper in quick and full mode (stated in every report): sequences
are padded to a fixed length and padding is attended like any token (no masks, the same for
every attention); train/test are a seeded split of one generated set; the number of steps is
far below the paper's 50,000; quick mode also shrinks the data (shorter expressions, 10 x 10
images) and the model. ``--learn`` (:data:`sinkflow.nn.paper_report.LEARN_DIFFERENCES`)
applies the official padding mask, on shorter data and a smaller model chosen to learn on a
CPU, and reports the majority baseline beside every accuracy.
"""

from __future__ import annotations

import torch

from sinkflow.datasets import LISTOPS_VOCAB, listops, listops_tokens, pathfinder, pathfinder_tokens
from sinkflow.nn.data import Dataset, split
from sinkflow.nn.models import SequenceClassifier
from sinkflow.nn._paper_numbers import PAPER, _f

__all__ = ["PAPER", "lra_data", "lra_model", "paper_comparison", "comparison_table", "report_markdown",
           "write_paper_report", "SETTING_DIFFERENCES"]


SETTING_DIFFERENCES = (
    "padding is attended like any token (no masks, identical for every attention)",
    "train/test: a seeded split of one generated set, not LRA's files",
    "far fewer training steps than the paper's 50,000, seeds as listed",
    "constant learning rate without warmup (quick mode: larger than the paper's, see the run's config)",
    "classifier head: a LayerNorm on every token, mean pooling, one linear layer (paper: a two-layer MLP)",
    "instability score as the paper's Appendix F (first 20 optimizer steps, all weights, embeddings after "
    "the layers, ratio to SoftMax per step), at this run's learning rate and batch",
)


def lra_data(task: str, n_samples: int, params: dict) -> tuple[Dataset, Dataset]:
    """Generated LRA data as token datasets, split 75 / 25 with a fixed seed."""
    if task == "listops":
        x, y = listops(n_samples, seed=1000, **params)
        tokens = listops_tokens(x, params.get("max_length", 2000) - 1)
        data = Dataset(torch.as_tensor(tokens), torch.as_tensor(y), 10, "listops")
    elif task == "pathfinder":
        images, y = pathfinder(n_samples, seed=1000, **params)
        data = Dataset(torch.as_tensor(pathfinder_tokens(images)), torch.as_tensor(y), 2, "pathfinder")
    else:
        raise ValueError(f"unknown LRA task {task!r}: 'listops' or 'pathfinder'")
    return split(data, 0.25, seed=0)


def lra_model(data: Dataset, normalization: str, n_iter: int, dim: int, depth: int, heads: int, mlp_ratio: int,
              landmarks: int, mask: bool = False, embed_std: float | None = None) -> SequenceClassifier:
    """The paper's LRA classifier shape: token embedding, learned positions, mean pooling.

    ``mask=True`` applies the official code's padding mask (token 0 — ListOps padding,
    Pathfinder's black pixels — out of attention, its features zeroed before pooling;
    :class:`sinkflow.nn.paper.PaperLRAClassifier`); Nyströmformer, whose segment means cannot
    leave keys out, then attends to every token as in the ``--paper`` rows. ``embed_std``
    redraws the token and position embeddings from N(0, embed_std^2) (the official 0.02;
    None: torch's N(0, 1) tokens and the package's 0.02 positions).
    """
    vocab = len(LISTOPS_VOCAB) if data.name == "listops" else 256
    shape = dict(dim=dim, heads=heads, depth=depth, normalization=normalization, n_iter=n_iter, mlp_ratio=mlp_ratio,
                 pooling="mean", landmarks=landmarks)
    if mask:
        from sinkflow.nn.paper import PaperLRAClassifier

        model = PaperLRAClassifier(vocab, data.inputs.shape[1], data.n_classes, pad_id=0,
                                   attend_mask=normalization != "nystromformer", **shape)
    else:
        model = SequenceClassifier(vocab, data.inputs.shape[1], data.n_classes, **shape)
    if embed_std is not None:
        with torch.no_grad():
            model.tokens.weight.normal_(0.0, embed_std)
            model.pos.normal_(0.0, embed_std)
    return model


def _ratio(row, key):
    v = row.get(key)
    return None if v is None else float(v)


def _separated(row: dict, soft: dict) -> bool:
    """Do the seeds' accuracy ranges of two variants not overlap (a difference beyond seed noise)?"""
    a, s = row["test_accuracy"], soft["test_accuracy"]
    return a["min"] > s["max"] or a["max"] < s["min"]


def paper_comparison(report: dict) -> list[dict]:
    """One row per variant: ours beside the paper's, with a verdict where the paper makes a claim.

    ``verdict`` is ``"agrees"``, ``"contradicts"`` or ``"-"`` (no claim): accuracy is
    compared by the sign of the difference to SoftMax (the paper: every kernel method above
    SoftMax) when the seeds' accuracy ranges do not overlap, the instability ratio by the side of 1 it falls on, time by the paper's
    direction (Skyformer faster than SoftMax, Sinkhorn within 10% of SoftMax).
    """
    task, rows = report["task"], report["summary"]
    paper = PAPER.get(task, {})
    soft = next((r for r in rows if r["variant"] == "softmax"), None)
    out = []
    for r in rows:
        acc = r["test_accuracy"]["median"]
        p_acc = paper.get("accuracy", {}).get(r["attention"])
        p_inst = paper.get("instability_ratio", {}).get(r["attention"])
        inst = _ratio(r, "update_instability_ratio_to_softmax")  # the paper's definition (Appendix F)
        time_ratio = _ratio(r, "step_time_ratio_to_softmax")
        mem_ratio = _ratio(r, "memory_ratio_to_softmax")
        claims = []
        if soft is not None and p_acc is not None and r["variant"] != "softmax" and _separated(r, soft):
            paper_better = p_acc > paper["accuracy"]["softmax"]
            claims.append((acc > soft["test_accuracy"]["median"]) == paper_better)
        if p_inst is not None and inst is not None and abs(p_inst - 1) > 0.05:
            claims.append((inst < 1) == (p_inst < 1))
        p_time = None
        if r["attention"] == "skyformer":
            p_time = 1 / PAPER["skyformer_speedup"][0]
            if time_ratio is not None:
                claims.append(time_ratio < 1)
        if r["attention"] == "sinkhorn":
            p_time = PAPER["sinkhorn_time_ratio"]
            if time_ratio is not None:
                claims.append(time_ratio <= 1.1)
        verdict = "-" if not claims else ("agrees" if all(claims) else "contradicts")
        out.append({"variant": r["variant"], "accuracy": 100 * acc if acc is not None else None,
                    "paper_accuracy": p_acc, "instability_ratio": inst, "paper_instability_ratio": p_inst,
                    "step_time": r["step_time"]["median"], "step_time_ratio": time_ratio, "paper_time_ratio": p_time,
                    "memory": r["memory"]["median"], "memory_ratio": mem_ratio,
                    "paper_memory_ratio": 1 / PAPER["skyformer_memory_saving"] if r["attention"] == "skyformer" else None,
                    "verdict": verdict})
    return out


def _setting(report: dict) -> str:
    """``"quick, CPU, 1 thread"`` / ``"full, GPU (name)"``: where a number comes from."""
    env = report["environment"]
    where = f"GPU ({env['gpu']})" if env.get("gpu") else f"CPU, {env['threads']} thread(s)"
    return f"{report['mode']}, {where}"


def comparison_table(report: dict, with_setting: bool = False) -> str:
    """:func:`paper_comparison` as a markdown table (optionally a first column with the setting)."""
    return _table(report, paper_comparison(report), with_setting)


def _contradicted(rows: list[dict]) -> list[str]:
    return [c["variant"] for c in rows if c["verdict"] == "contradicts"]


def _table(report: dict, rows: list[dict], with_setting: bool) -> str:
    """:func:`comparison_table` from the rows :func:`paper_comparison` already gave."""
    first = "| setting " if with_setting else ""
    lines = [first + "| variant | accuracy % (ours / paper) | instability x SoftMax (ours / paper) | ms per step | "
             "time x SoftMax (ours / paper) | memory MiB | memory x SoftMax (ours / paper) | verdict |",
             ("|---" if with_setting else "") + "|---|---|---|---|---|---|---|---|"]
    prefix = f"| {_setting(report)} " if with_setting else ""
    for c in rows:
        lines.append(
            prefix + f"| {c['variant']} | {_f(c['accuracy'], '{:.1f}')} / {_f(c['paper_accuracy'])} | "
            f"{_f(c['instability_ratio'])} / {_f(c['paper_instability_ratio'])} | {_f(c['step_time'] and 1e3 * c['step_time'], '{:.1f}')} | "
            f"{_f(c['step_time_ratio'])} / {_f(c['paper_time_ratio'])} | {_f(c['memory'] and c['memory'] / 2**20, '{:.1f}')} | "
            f"{_f(c['memory_ratio'])} / {_f(c['paper_memory_ratio'])} | {c['verdict']} |")
    return "\n".join(lines)


def report_markdown(report: dict) -> str:
    """The report of an LRA task as markdown: setting, comparison table, differences, contradictions."""
    return _markdown(report, paper_comparison(report))


def _markdown(report: dict, rows: list[dict]) -> str:
    if report["mode"] == "learn":  # its own differences from the paper (masks on) and the majority baseline
        from sinkflow.nn.paper_report import learn_markdown

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
             + (f"; quick mode: reduced data and model ({size['data']})" if report["mode"] == "quick" else "") + ".", ""]
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
    >>> from sinkflow.nn.lra import reproducing_page
    >>> reproducing_page([]).splitlines()[0]
    '# Reproducing the papers'
    """
    from sinkflow.nn._study_report import study_section
    from sinkflow.nn.paper_report import learn_markdown, paper_setting_markdown, search_section

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
    from sinkflow.nn.paper_report import LEARN_TARGET

    return ["# Reproducing the papers", "",
             "<!-- generated by `python -m sinkflow.nn.lra docs/data/*.json > docs/reproducing.md`; do not edit -->", "",
             "The Skyformer paper's comparisons on two Long Range Arena tasks, ListOps and Pathfinder, regenerated "
             "offline by `sinkflow.datasets` and run by `sinkflow validate listops pathfinder`. Every table "
             "below is generated from the JSON report of a run (in `docs/data/`) and states its setting.", "",
             "**Paper setting, CPU** (`--paper`, first): the paper's model, lengths (ListOps up to 2,000 tokens, "
             "Pathfinder 1,024), padding masks, optimizer, learning rate and warm-up (`sinkflow.nn.paper`), for "
             "what needs no GPU: the cost of a training step and the instability score of the first 20 "
             "optimizer steps (the paper's Appendix F). Where a batch or a number of seeds is reduced, the row "
             "says so. The cost rows record the digest of the attention code they timed; when that code "
             "changes, the test suite asks for them to be re-measured (`--cost-only`, third command below). "
             "[Instability](instability.md) explains the instability numbers.", "",
             "**CPU, learns** (`--learn`, second): a setting per task (`sinkflow.nn.validation.TASKS[task].learn`), "
             "chosen by the small search whose table follows its rows, to learn clearly above the majority class "
             "within minutes per run on one CPU thread; shorter data and a smaller model than the paper's, each "
             "difference stated beside the numbers. The bar, on the median over seeds: " + "; ".join(
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
             "sinkflow validate listops pathfinder --quick --attention softmax sinkhorn gaussian skyformer nystromformer \\",
             "    --n-iter 3 --no-kl",
             "sinkflow validate listops pathfinder --full --device cuda --attention softmax sinkhorn gaussian skyformer \\",
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
                  "`sinkflow.nn.lra.paper_comparison`).", ""]
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


if __name__ == "__main__":  # python -m sinkflow.nn.lra [--instability] REPORT.json ... > a docs page (reproducing.md, instability.md)
    import json
    import sys

    from sinkflow.nn.paper_report import instability_page

    args = sys.argv[1:]
    page = instability_page if args[:1] == ["--instability"] else reproducing_page
    print(page([json.loads(open(p).read()) for p in args if p != "--instability"]), end="")
