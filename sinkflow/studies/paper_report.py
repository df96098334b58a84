"""Markdown of the paper-setting reports: the ``--paper`` cost and instability tables
(:func:`paper_setting_markdown`), the docs page on instability (:func:`instability_page`) and
the ``--learn`` rows (:func:`learn_markdown`, :func:`search_section`; the Sinkformers studies:
:mod:`sinkflow.studies._study_report`);
:func:`sinkflow.studies.pages.reproducing_page` puts them together.
"""

from __future__ import annotations

from sinkflow.studies._paper_numbers import PAPER, _f
from sinkflow.studies._study_report import _machine_line
from sinkflow.studies.validation import TASKS

__all__ = ["paper_setting_markdown", "instability_page", "learn_markdown", "search_section", "LEARN_TARGET",
           "LEARN_DIFFERENCES"]

#: ``--learn``'s bar per task: the median test accuracy over seeds must reach ``accuracy``
#: and lie ``margin`` above the majority baseline (the target's distance from chance).
LEARN_TARGET = {"listops": {"accuracy": 0.25, "margin": 0.15}, "pathfinder": {"accuracy": 0.60, "margin": 0.10}}

#: The paper's data, beside which a ``--learn`` run's generator parameters are stated.
PAPER_DATA = {"listops": "LRA ListOps: depth up to 10, up to 10 arguments, 500 to 2,000 tokens",
              "pathfinder": "LRA Pathfinder 32 x 32 (1,024 tokens), longer paths among distractor paths"}

#: How every ``--learn`` run differs from the Skyformer paper's LRA setting (besides the sizes each row states).
LEARN_DIFFERENCES = (
    "train/test: a seeded 75/25 split of one generated set of the stated size (LRA: fixed files, e.g. 96,000 "
    "ListOps training expressions)",
    "no dropout (official: 0.1); a LayerNorm and one linear layer as the head (official: a two-layer MLP)",
    "optimizer: AdamW at a constant learning rate, no warm-up (official: OneCycleLR, 50,000 steps), the row's "
    "batch and number of steps",
    "Nyströmformer attends to every token (its segment means cannot leave keys out; the others mask token 0 "
    "as the official code)",
)


def _cost_table(report: dict) -> list[str]:
    """Time and memory per training step at the paper's setting, medians over seeds, ratios to SoftMax."""
    cost = report["cost"]
    p_time = {"skyformer": 1 / PAPER["skyformer_speedup"][0], "sinkhorn": PAPER["sinkhorn_time_ratio"]}
    lines = ["| attention | ms per step (median [min, max] over seeds) | time x SoftMax (ours / paper) | memory MiB | "
             "memory x SoftMax (ours / paper) | load during the rows |", "|---|---|---|---|---|---|"]
    for r in cost["summary"]:
        rows = [c for c in cost["rows"] if c["attention"] == r["attention"]]
        times = [1e3 * c["step_time"] for c in rows]
        loads = [c["loadavg"][0] for c in rows]
        p_mem = 1 / PAPER["skyformer_memory_saving"] if r["attention"] == "skyformer" else None
        lines.append(f"| {_variant_name(r['attention'])} | {r['step_time'] * 1e3:.0f} [{min(times):.0f}, "
                     f"{max(times):.0f}] | {_f(r['step_time_ratio'])} / {_f(p_time.get(r['attention']))} | "
                     f"{r['memory'] / 2**20:.1f} | {_f(r['memory_ratio'])} / {_f(p_mem)} | "
                     f"{min(loads):.1f}-{max(loads):.1f} |")
    return lines


def _variant_name(attention: str) -> str:
    """``"sinkhorn(3)"`` for the paper setting's Sinkhorn (3 half-iterations), the name otherwise."""
    return "sinkhorn(3)" if attention == "sinkhorn" else attention


def _instability_table(report: dict, key: str = "instability", label: str = "attention") -> list[str]:
    block = report[key]
    paper = PAPER[report["task"]]["instability_ratio"]
    lines = [f"| {label} | instability x SoftMax (median [min, max] over seeds) | per seed | paper |",
             "|---|---|---|---|"]
    for r in block["rows"]:
        ratio, name = r["ratio"], r.get("label", r["attention"])
        seeds = ", ".join(f"{v:.2f}" for v in r["ratios"])
        claim = paper.get(r["attention"]) if r.get("label", "paper setting") == "paper setting" else None
        lines.append(f"| {name} | {ratio['median']:.2f} [{ratio['min']:.2f}, {ratio['max']:.2f}] | {seeds} | "
                     f"{_f(claim)} |")
    return lines


def paper_setting_markdown(report: dict) -> str:
    """A ``--paper`` report (:func:`sinkflow.studies.paper.run_paper_setting`) as markdown: cost, instability,
    decomposition, with the machine and every reduction of the paper's setting stated.

    Examples
    --------
    >>> from sinkflow.studies.paper_report import paper_setting_markdown
    >>> from sinkflow.studies.paper import run_paper_setting
    >>> r = run_paper_setting("listops", ["softmax", "gaussian"], [0], cost_batch=1, cost_steps=1,
    ...                       instability_attentions=["softmax", "gaussian"], instability_batch=1, steps=1,
    ...                       max_length=16)
    >>> paper_setting_markdown(r).splitlines()[0]
    '## listops: paper setting, CPU'
    """
    s, cost, inst = report["setting"], report["cost"], report["instability"]
    first = cost["rows"][0]
    lines = [f"## {report['task']}: paper setting, CPU", "",
             f"The official model and optimizer (`sinkflow.studies.paper`, {s['seq_len']} tokens, official batch "
             f"{s['batch_size']}, AdamW lr {s['lr']:g} under OneCycleLR with {s['warmup']} warm-up steps of "
             f"{s['total_steps']}); masked as the official code, token 0 (ListOps padding, Pathfinder's black "
             f"pixels), except Nyströmformer, which attends to every token here; torch {report['torch']}; "
             f"{report['total_time']:.0f} s in all." + (f" {report['note']}." if report.get("note") else ""), "",
             f"**Cost** of a training step (forward, backward, AdamW), batch {cost['batch_size']}, length "
             f"{first['seq_len']}, median of {cost['steps']} steps after one warm-up step, seeds {cost['seeds']}; "
             f"memory: {first['memory_method']}; {_machine_line(first)}.", ""]
    lines += _cost_table(report) + ["", f"**Instability** (Appendix F): first {inst['steps']} optimizer steps, "
                                        f"batch {inst['batch_size']}, seeds {inst['seeds']}.", ""]
    lines += _instability_table(report)
    if "decomposition" in report:
        d = report["decomposition"]
        lines += ["", f"**Decomposition** of the Gaussian kernel's ratio (ListOps of at most {d['max_length']} "
                      f"tokens, batch {d['batch_size']}, {d['steps']} steps, seeds {d['seeds']}; one change per row "
                      "from the paper setting, SoftMax changed alike):", ""]
        lines += _instability_table(report, "decomposition", "setting")
    return "\n".join(lines) + "\n"


def _range(ratio: dict) -> str:
    return f"{ratio['median']:.2f} [{ratio['min']:.2f}, {ratio['max']:.2f}]"


def _inside(ratio: dict, claim: float) -> str:
    """Where the paper's number falls against our seeds' range."""
    if claim < ratio["min"]:
        return "below every seed"
    return "above every seed" if claim > ratio["max"] else "inside the seeds' range"


def _instability_comparison(paper: list[dict], quick: list[dict]) -> list[str]:
    """Per task and attention: paper setting (ours), quick setting (ours), the paper's ratio."""
    lines = ["| task | attention | paper setting, paper length (median [min, max]) | seeds, batch | quick setting "
             "(median over seeds) | paper | the paper's number vs our seeds |", "|---|---|---|---|---|---|---|"]
    for rep in paper:
        task, inst = rep["task"], rep["instability"]
        q = next((r for r in quick if r["task"] == task), None)
        for row in inst["rows"][1:]:
            claim = PAPER[task]["instability_ratio"].get(row["attention"])
            q_row = next((x for x in q["summary"] if x["attention"] == row["attention"]), None) if q else None
            q_val = _f(q_row and q_row.get("update_instability_ratio_to_softmax"))
            lines.append(f"| {task} | {row['attention']} | {_range(row['ratio'])} | {len(inst['seeds'])}, "
                         f"{inst['batch_size']} | {q_val} | {_f(claim)} | "
                         f"{'-' if claim is None else _inside(row['ratio'], claim)} |")
    return lines


def _verdict(paper: list[dict]) -> list[str]:
    """Does the paper's Gaussian-kernel ratio reproduce at the paper's setting? Measured answer per task."""
    out = []
    for rep in paper:
        row = next((r for r in rep["instability"]["rows"] if r["attention"] == "gaussian"), None)
        claim = PAPER[rep["task"]]["instability_ratio"]["gaussian"]
        if row is None:
            continue
        r, n = row["ratio"], len(row["ratios"])
        side = "below 1 (more stable than SoftMax), as the paper says" if r["median"] < 1 else \
            "at or above 1 (not more stable than SoftMax), against the paper"
        out.append(f"- **{rep['task']}**: the Gaussian kernel's median ratio over {n} seed(s) is {r['median']:.2f}, "
                   f"{side}; the paper's {claim:.2f} is {_inside(r, claim)} ({r['min']:.2f} to {r['max']:.2f}).")
        if r["min"] <= claim <= r["max"] and r["min"] <= 1 <= r["max"]:
            out[-1] += (" The seeds span both the paper's ratio and 1: at this batch and number of seeds the run "
                        "neither confirms nor refutes the paper's number; its median is not on the paper's side.")
    return out


def instability_page(reports: list[dict]) -> str:
    """The docs page "Instability at the paper's setting", generated from ``--paper`` and quick reports.

    Examples
    --------
    >>> from sinkflow.studies.paper_report import instability_page
    >>> instability_page([]).splitlines()[0] == "# Instability at the paper's setting"
    True
    """
    paper = [r for r in reports if r.get("mode") == "paper"]
    quick = [r for r in reports if r.get("mode") == "quick"]
    lines = ["# Instability at the paper's setting", "",
             "<!-- generated by `python -m sinkflow.studies.pages --instability docs/data/*.json > "
             "docs/instability.md`; do not edit -->", "",
             "The Skyformer paper (Appendix F) reports that the Gaussian kernel is more stable than SoftMax: its "
             "instability score over the first 20 optimizer steps is 0.77 (ListOps) and 0.74 (Pathfinder) times "
             "SoftMax's, Skyformer's 0.79, Nyströmformer's 1.01 and 0.99. The score of step $i$ is "
             "$\\tau_i = \\|f(x_i; W_i) - f(x_i; W_{i-1})\\|_F^2 / \\|W_i - W_{i-1}\\|_F^2$ "
             "(`sinkflow.studies.update_instability`, [training](theory/training.md)); the ratio is the mean over "
             "the 20 steps of $\\tau_i / \\tau_i^{\\mathrm{SoftMax}}$ from the same initialization and batches. "
             "The official code (pkuzengqi/Skyformer) has no instability script, so its model, initialization, "
             "masks, optimizer and warm-up are what `sinkflow.studies.paper` reproduces (its docstring lists them). "
             "Every number below comes from a JSON report in `docs/data/`, written by "
             "`sinkflow validate listops pathfinder --paper` (commands in [reproducing](reproducing.md)).", "",
             "## The paper's setting beside the quick one", ""]
    lines += _instability_comparison(paper, quick)
    lines += ["", *_verdict(paper)]
    for rep in paper:
        if "decomposition" in rep:
            d = rep["decomposition"]
            lines += ["", "## Taking the Gaussian kernel's ratio apart", "",
                      f"ListOps of at most {d['max_length']} tokens (the paper's 2,000 cost 20x more per step), "
                      f"batch {d['batch_size']} unless the row says otherwise, {d['steps']} steps, seeds "
                      f"{d['seeds']}; each row changes one thing in the paper's setting, for SoftMax and the "
                      "Gaussian kernel alike (`sinkflow.studies.paper.instability_decomposition`, rows "
                      "`sinkflow.studies.paper.DECOMPOSITION`).", ""]
            lines += _instability_table(rep, "decomposition", "setting")
            lines += ["", *_decomposition_findings(d["rows"], d.get("residual_share"))]
    return "\n".join(lines) + "\n"


def _share_text(share: dict | None) -> str:
    if not share:
        return ""
    o, u = share["official"], share["N(0, 1)"]
    return (f" Measured at initialization (`sinkflow.studies.paper.residual_shares`, norm of the first attention "
            f"branch over the residual stream it is added to): official embeddings SoftMax {o['softmax']:.2f}, "
            f"Gaussian {o['gaussian']:.2f}; N(0, 1) embeddings SoftMax {u['softmax']:.2f}, Gaussian "
            f"{u['gaussian']:.2f}.")


def _decomposition_findings(rows: list[dict], share: dict | None = None) -> list[str]:
    """The findings the decomposition supports, each with its measured numbers."""
    by = {r["label"].split(" (")[0]: r["ratio"] for r in rows}
    base, init = by.get("paper setting"), by.get("embedding init N(0, 1)")
    quick = next((r["ratio"] for r in rows if r["label"].startswith("package quick")), None)
    if base is None or init is None or quick is None:
        return []
    return [f"- **The initialization decides it.** With the official N(0, 0.02^2) embeddings the ratio is "
            f"{_range(base)}; with torch's N(0, 1) (the package's quick models) it is {_range(init)}, and the "
            f"quick setting as a whole gives {_range(quick)}. Small embeddings leave the residual stream to the "
            "attention branch for both kernels, so both features move alike; with unit embeddings SoftMax's "
            "branch (an average of values) is small beside the embedding while the unnormalized Gaussian "
            "kernel's (a sum over about n keys) stays comparable to it, so the Gaussian model's features follow "
            "its weights far more than SoftMax's do." + _share_text(share),
            f"- **Normalization.** Rows normalized: {_range(by['rows normalized'])}; the kernel divided by n: "
            f"{_range(by['kernel divided by n'])} (an attention branch too small to move the features).",
            f"- **Within the seed spread:** no padding mask {_range(by['no padding mask'])}, short sequences "
            f"{_range(by['short sequences'])}, no dropout {_range(by['no dropout'])}, constant learning rate "
            f"{_range(by['constant lr, no warm-up'])}"
            + (f", batch 1 {_range(by['batch 1'])}, the official batch {_range(by['official batch'])}"
               if "batch 1" in by and "official batch" in by else "") + "."]


def _curve(report: dict, variant: str) -> str:
    """Median over seeds of the test accuracy after each epoch (index 0: initialization), in %."""
    import numpy as np

    curves = [r["history"]["test_accuracy"] for r in report["runs"] if r["variant"] == variant]
    k = min(len(c) for c in curves)
    med = np.median(np.array([c[:k] for c in curves], dtype=float), axis=0)
    return " ".join(f"{100 * v:.0f}" for v in med)


def _learn_rows(report: dict) -> list[str]:
    base, target = report["baseline"], LEARN_TARGET.get(report["task"])
    lines = ["| variant | test accuracy % (median [min, max] over seeds) | majority baseline % | median - baseline, "
             "points | meets the bar | wall s per run (median [min, max]) | ms per step |",
             "|---|---|---|---|---|---|---|"]
    for r in report["summary"]:
        acc = r["test_accuracy"]
        walls = [run["wall_time"] for run in report["runs"] if run["variant"] == r["variant"]]
        margin = acc["median"] - base["accuracy"]
        ok = "-" if target is None else \
            ("yes" if acc["median"] >= target["accuracy"] and margin >= target["margin"] else "no")
        lines.append(f"| {r['variant']} | {100 * acc['median']:.1f} [{100 * acc['min']:.1f}, {100 * acc['max']:.1f}] | "
                     f"{100 * base['accuracy']:.1f} | {100 * margin:+.1f} | {ok} | "
                     f"{sorted(walls)[len(walls) // 2]:.0f} [{min(walls):.0f}, {max(walls):.0f}] | "
                     f"{_f(r['step_time']['median'] and 1e3 * r['step_time']['median'], '{:.1f}')} |")
    return lines


def _changed(report: dict) -> str:
    """``", resolution 32, 3 epochs (the setting: ...)"`` where a run changed the task's ``--learn`` sizes."""
    spec, size = TASKS[report["task"]].learn, report["config"]["size"]
    if spec is None:
        return ""
    data = dict(spec.data)
    pairs = [(k.replace("_", " "), v, data.get(k)) for k, v in size["data"]]
    pairs += [("epochs", size["epochs"], spec.epochs), ("examples", size["n_samples"], spec.n_samples)]
    changed = [(name, ours, theirs) for name, ours, theirs in pairs if ours != theirs]
    if not changed:
        return ""
    ours = ", ".join(f"{name} {v}" for name, v, _ in changed)
    return f", {ours} (the setting: {', '.join(f'{name} {v}' for name, _, v in changed)})"


def _embedding(size: dict) -> tuple[str, ...]:
    """The embeddings' initialization where it differs from the official N(0, 0.02^2)."""
    std = size.get("embed_std")
    if std is None:
        return ("token embeddings N(0, 1), torch's default (official: N(0, 0.02^2); positions N(0, 0.02^2) as there)",)
    return () if std == 0.02 else (f"token and position embeddings N(0, {std:g}^2) (official: N(0, 0.02^2))",)


def _runs_machine(report: dict) -> str:
    """Threads, CPU model and the range of the 1-minute load over a report's runs."""
    ms = [r["machine"] for r in report["runs"] if r.get("machine")]
    if not ms:
        return "machine not recorded"
    loads = [m["loadavg"][0] for m in ms]
    return (f"{ms[0]['threads']} thread(s) per run, {ms[0]['cpu']} ({ms[0]['cores']} cores), 1-minute load "
            f"{min(loads):.1f}-{max(loads):.1f} at the runs' starts")


def learn_markdown(report: dict) -> list[str]:
    """A ``--learn`` report (:func:`sinkflow.studies.validation.run_validation` with ``learn=True``) as markdown lines:
    the accuracy rows beside the majority baseline, the bar, the learning curves and the differences from the paper.

    Examples
    --------
    >>> from sinkflow.studies.paper_report import learn_markdown
    >>> from sinkflow.studies.validation import run_validation
    >>> r = run_validation("listops", ["softmax"], seeds=[0], learn=True, track_kl=False,
    ...                    size_overrides=dict(n_samples=40, epochs=1, dim=8, landmarks=4))
    >>> learn_markdown(r)[0].split(" (the setting")[0]   # the title says what the run changed
    '## listops: CPU, learns (`--learn`), epochs 1, examples 40'
    """
    size, cfg, base = report["config"]["size"], report["config"], report["baseline"]
    data = ", ".join(f"{k} {v}" for k, v in size["data"])
    steps = size["epochs"] * -(-cfg["n_train"] // size["batch_size"])
    target = LEARN_TARGET.get(report["task"])
    bar = "" if target is None else (f" The bar: median at least {100 * target['accuracy']:.0f}% and "
                                     f"{100 * target['margin']:.0f} points above the majority baseline.")
    lines = [f"## {report['task']}: CPU, learns (`--learn`){_changed(report)}", "",
             f"{report['description']}. Data: {data}; sequence length {size['seq_len']}; {cfg['n_train']} train / "
             f"{cfg['n_test']} test examples. Model: {size['depth']} layers, embedding {size['dim']}, FFN "
             f"{size['mlp_ratio'] * size['dim']}, {size['heads']} heads, {size['landmarks']} landmarks, mean pooling"
             f"{', padding mask' if size.get('mask') else ''}. AdamW lr {size['lr']:g}, batch {size['batch_size']}, "
             f"{size['epochs']} epochs ({steps} steps); seeds {cfg['seeds']}; {_runs_machine(report)}; torch "
             f"{report['environment']['torch']}; {report['total_time']:.0f} s in all.", "",
             f"Majority baseline: the training set's most frequent class (class {base['class']}) scores "
             f"{100 * base['accuracy']:.1f}% on the test set (largest test class: {100 * base['test_majority']:.1f}%; "
             f"chance {100 / size['n_classes']:.0f}%).{bar}"
             + (" This run is off the setting (the title says how): a learning curve at other sizes, not the "
                "setting's rows." if _changed(report) else ""), ""]
    lines += _learn_rows(report)
    lines += ["", "Test accuracy % after each epoch (median over seeds; first: initialization): "
              + "; ".join(f"{r['variant']} {_curve(report, r['variant'])}" for r in report["summary"]) + ".", "",
              "Differences from the paper's setting: " + "; ".join(
                  (f"data: {data} (paper: {PAPER_DATA.get(report['task'], '-')})",
                   f"model: embedding {size['dim']}, FFN {size['mlp_ratio'] * size['dim']}, {size['landmarks']} "
                   "landmarks (paper: 64, 128, 128)") + LEARN_DIFFERENCES
                  + _embedding(size)) + ".", ""]
    return lines


def search_section(study: dict) -> list[str]:
    """The small search that chose the ``--learn`` settings (``docs/data/learn_search.json``) as a table.

    Examples
    --------
    >>> from sinkflow.studies.paper_report import search_section
    >>> search_section({"command": "c", "rows": [], "stopped": []})[0]
    '## How the `--learn` settings were chosen'
    """
    lines = ["## How the `--learn` settings were chosen", "",
             f"One run per row, seed 0, one thread ({study['command']}); every row has a 2-layer model, "
             "2 heads, FFN 2x, batch 32, and the data and optimizer shown. The setting with the largest final test "
             "accuracy per task was kept, then run over seeds (above). Chosen on the test split of seed 0, so "
             "seed 0's row above is not an unbiased estimate; seeds 1 and 2 are new draws of the model.", "",
             "| task | row | data | length | dim | mask | embeddings | lr | epochs | test accuracy % after each "
             "epoch (first: init) | largest test class % | wall s (1-min load at the end) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in study["rows"]:
        data = ", ".join(f"{k} {v}" for k, v in r["data"].items())
        emb = "torch N(0, 1)" if r["embed_std"] is None else f"N(0, {r['embed_std']:g}^2)"
        curve = " ".join(f"{100 * v:.0f}" for v in r["test_accuracy"])
        lines.append(f"| {r['task']} | {r['note']} ({r['attention']}) | {data}; {r['n_samples']} examples | "
                     f"{r['seq_len']} | {r['dim']} | {'yes' if r['mask'] else 'no'} | {emb} | {r['lr']:g} | "
                     f"{r['epochs']} | {curve} | {100 * r['test_majority']:.1f} | {r['wall_time']:.0f} "
                     f"({r['loadavg_end'][0]:.1f}) |")
    lines += [""] + [f"Not run to the end: {s}." for s in study.get("stopped", [])] + [""]
    return lines
