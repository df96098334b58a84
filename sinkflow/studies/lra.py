r"""Long Range Arena tasks of the Skyformer paper: data, model and the comparison with the papers' numbers.

The tasks ``listops`` and ``pathfinder`` of :data:`sinkflow.studies.validation.TASKS` train the
paper's model — 2 pre-LN blocks, embedding 64, feed-forward 128, 2 heads of dimension 32,
mean pooling, 128 Nyström landmarks — in ``--full`` mode, a smaller one in ``--quick``, on
data from :mod:`sinkflow.datasets`. :func:`paper_comparison` puts a report's accuracy,
time per step, memory and instability score beside the papers' numbers (:data:`PAPER`)
and says where they disagree; :func:`sinkflow.studies.pages.report_markdown` and
:func:`sinkflow.plots.training.plot_paper_comparison` turn that into the report's markdown and figure.

Settings that differ from the paper in quick and full mode (stated in every report): sequences
are padded to a fixed length and padding is attended like any token (no masks, the same for
every attention); train/test are a seeded split of one generated set; the number of steps is
far below the paper's 50,000; quick mode also shrinks the data (shorter expressions, 10 x 10
images) and the model. ``--learn`` (:data:`sinkflow.studies.paper_report.LEARN_DIFFERENCES`)
applies the official padding mask, on shorter data and a smaller model chosen to learn on a
CPU, and reports the majority baseline beside every accuracy.
"""

from __future__ import annotations

import torch

from sinkflow.datasets import LISTOPS_VOCAB, listops, listops_tokens, pathfinder, pathfinder_tokens
from sinkflow.studies._paper_numbers import PAPER, _f
from sinkflow.studies.data import Dataset, split
from sinkflow.studies.models import SequenceClassifier

__all__ = ["PAPER", "lra_data", "lra_model", "paper_comparison", "comparison_table", "SETTING_DIFFERENCES"]


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
    :class:`sinkflow.studies.paper.PaperLRAClassifier`); Nyströmformer, whose segment means cannot
    leave keys out, then attends to every token as in the ``--paper`` rows. ``embed_std``
    redraws the token and position embeddings from N(0, embed_std^2) (the official 0.02;
    None: torch's N(0, 1) tokens and the package's 0.02 positions).
    """
    vocab = len(LISTOPS_VOCAB) if data.name == "listops" else 256
    shape = dict(dim=dim, heads=heads, depth=depth, normalization=normalization, n_iter=n_iter, mlp_ratio=mlp_ratio,
                 pooling="mean", landmarks=landmarks)
    if mask:
        from sinkflow.studies.paper import PaperLRAClassifier

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
    SoftMax) when the seeds' accuracy ranges do not overlap, the instability ratio by the side of 1 it
    falls on, time by the paper's direction (Skyformer faster than SoftMax, Sinkhorn within 10% of SoftMax).
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
                    "paper_memory_ratio": (1 / PAPER["skyformer_memory_saving"] if r["attention"] == "skyformer"
                                           else None),
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
            f"{_f(c['instability_ratio'])} / {_f(c['paper_instability_ratio'])} | "
            f"{_f(c['step_time'] and 1e3 * c['step_time'], '{:.1f}')} | {_f(c['step_time_ratio'])} / "
            f"{_f(c['paper_time_ratio'])} | {_f(c['memory'] and c['memory'] / 2**20, '{:.1f}')} | "
            f"{_f(c['memory_ratio'])} / {_f(c['paper_memory_ratio'])} | {c['verdict']} |")
    return "\n".join(lines)
