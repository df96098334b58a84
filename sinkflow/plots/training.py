r"""Figures of full-model validations (docs/theory/training.md).

Plot functions take a report of :func:`sinkflow.studies.validation.run_validation` (the JSON
written by ``sinkflow validate``):

* :func:`plot_column_sums` — the Sinkformers RQ1 plot: sorted column sums of the probe
  batch's attention, one curve per epoch, log scale; plus the mean
  :math:`|\sum_i K_{ij} - 1|` per epoch for every variant (median and range over seeds).
* :func:`plot_accuracy_vs_n_iter` — final test accuracy against Sinkhorn half-iterations
  (median and range over seeds), other normalizations as horizontal bands.
* :func:`plot_epoch_time` — seconds per epoch per variant.
* :func:`plot_instability` — Skyformer's instability score per variant over epochs.

Registered figure: ``training_column_sums`` (a tiny digits run; not in the default set).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register
from sinkflow.plots.style import COLORS, PALETTE, new_figure, plain_log_ticks

__all__ = ["plot_column_sums", "plot_accuracy_vs_n_iter", "plot_epoch_time", "plot_instability", "plot_report",
           "plot_paper_comparison", "write_paper_figure"]


def _colors(variants) -> dict:
    """Fixed concept colours; Sinkhorn variants with L > 1 get the Sinkhorn blue, then others."""
    extra = [COLORS["sinkhorn"], PALETTE[2], PALETTE[7], PALETTE[3], PALETTE[4]]
    out, k = {}, 0
    for v in variants:
        base = v.split("(")[0]
        if v == "sinkhorn(1)":
            out[v] = COLORS["other"]
        elif base == "sinkhorn":
            out[v] = extra[min(k, len(extra) - 1)]
            k += 1
        else:
            out[v] = COLORS.get(base, PALETTE[(len(out) + 4) % len(PALETTE)])
    return out


def _variants(report) -> list[str]:
    return list(dict.fromkeys(r["variant"] for r in report["runs"]))


def _runs(report, variant):
    return [r for r in report["runs"] if r["variant"] == variant]


def _band(ax, x, ys, color, label):
    Y = np.asarray(ys, dtype=float)
    # Sinkhorn with L = 1 is SoftMax: dashed so both stay visible when they coincide.
    ax.plot(x, np.median(Y, 0), color=color, label=label, ls="--" if label == "sinkhorn(1)" else "-")
    if len(Y) > 1:
        ax.fill_between(x, Y.min(0), Y.max(0), color=color, alpha=0.2, lw=0)


def plot_column_sums(report, variants=None):
    """Sorted column sums per epoch (first seed of each variant) and mean ``|col sum - 1|`` per epoch.

    Variants without attention matrices (Nyström) are left out; a reused run (Sinkhorn
    ``L = 1`` = SoftMax) appears only in the last panel.
    """
    import matplotlib as mpl

    variants = [v for v in (variants or _variants(report))
                if np.asarray(_runs(report, v)[0]["history"]["sorted_column_sums"]).size]
    # A run reused from another variant (Sinkhorn L = 1 is SoftMax) gets no panel of its own.
    panels = [v for v in variants if "reused_from" not in _runs(report, v)[0]]
    fig, axes = new_figure(len(panels) + 1, 1, width=2.9, height=2.6)
    cmap = mpl.colormaps["viridis"]
    for ax, v in zip(axes[0], panels, strict=False):  # not strict: the last axis is the extra panel drawn after
        run = _runs(report, v)[0]
        S = np.asarray(run["history"]["sorted_column_sums"], dtype=float)
        E = len(S) - 1
        for e in range(1, E + 1):  # the paper plots from epoch 1
            ax.plot(np.arange(1, S.shape[1] + 1), S[e], color=cmap((e - 1) / max(E - 1, 1)), lw=1)
        ax.plot(np.arange(1, S.shape[1] + 1), S[0], color="k", ls=":", lw=1, label="init")
        ax.axhline(1.0, color=COLORS["reference"], lw=0.6)
        ax.set_yscale("log")
        ax.set_title(f"{v} (seed {run['seed']})")
        ax.set_xlabel("key rank $j$ (sorted)")
        ax.set_ylabel(r"$\sum_i K_{ij}$")
        ax.legend(loc="upper left")
    if panels:
        sm = mpl.cm.ScalarMappable(cmap=cmap, norm=mpl.colors.Normalize(1, max(len(S) - 1, 1)))
        # epochs are whole numbers: no 1.5 or 2.5 on a short run's colour bar
        fig.colorbar(sm, ax=axes[0, len(panels) - 1], label="epoch", ticks=mpl.ticker.MaxNLocator(integer=True))
    ax = axes[0, -1]
    colors = _colors(variants)
    for v in variants:
        ys = [r["history"]["column_deviation"] for r in _runs(report, v)]
        _band(ax, np.arange(len(ys[0])), ys, colors[v], v)
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel(r"mean $|\sum_i K_{ij} - 1|$")
    ax.set_title(report.get("task", ""))
    ax.legend()
    plain_log_ticks(fig)  # 1 and 2, not 10⁰ and 2×10⁰, where the figure is shown without being saved
    return fig


def plot_accuracy_vs_n_iter(report):
    """Final test accuracy vs Sinkhorn half-iterations; other variants as horizontal bands."""
    fig, axes = new_figure(1, 1, width=3.6, height=2.8)
    ax = axes[0, 0]
    sink = [v for v in _variants(report) if v.startswith("sinkhorn(")]
    if sink:
        ks = [int(v[9:-1]) for v in sink]
        order = np.argsort(ks)
        accs = [[r["history"]["test_accuracy"][-1] for r in _runs(report, sink[i])] for i in order]
        med = [np.median(a) for a in accs]
        lo = [np.min(a) for a in accs]
        hi = [np.max(a) for a in accs]
        x = np.array(ks)[order]
        ax.errorbar(x, med, yerr=[np.subtract(med, lo), np.subtract(hi, med)], color=COLORS["sinkhorn"], marker="o",
                    capsize=3, label="Sinkhorn (median, range)")
        ax.set_xticks(x)
    colors = _colors(_variants(report))
    for v in (v for v in _variants(report) if not v.startswith("sinkhorn(")):
        a = [r["history"]["test_accuracy"][-1] for r in _runs(report, v)]
        ax.axhline(np.median(a), color=colors[v], ls="--", label=v)
        ax.axhspan(min(a), max(a), color=colors[v], alpha=0.12, lw=0)
    ax.set_xlabel("Sinkhorn half-iterations $L$ ($L = 1$: SoftMax)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{report.get('task', '')}: {len(report['config']['seeds'])} seeds")
    ax.legend()
    return fig


def plot_epoch_time(report):
    """Median seconds per epoch for each variant (range over seeds as error bars)."""
    variants = _variants(report)
    fig, axes = new_figure(1, 1, width=max(3.0, 0.7 * len(variants) + 1), height=2.8)
    ax = axes[0, 0]
    colors = _colors(variants)
    for k, v in enumerate(variants):
        t = [np.median(r["history"]["epoch_time"]) for r in _runs(report, v)]
        ax.bar(k, np.median(t), color=colors[v], yerr=[[np.median(t) - min(t)], [max(t) - np.median(t)]], capsize=3)
    ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right")
    ax.set_ylabel("seconds per epoch")
    ax.set_title(f"{report.get('task', '')} on {report['config']['device']}")
    return fig


def plot_instability(report):
    """Skyformer's instability score per epoch (median and range over seeds), log scale."""
    fig, axes = new_figure(1, 1, width=3.6, height=2.8)
    ax = axes[0, 0]
    colors = _colors(_variants(report))
    for v in _variants(report):
        ys = [r["history"]["instability"] for r in _runs(report, v)]
        if np.all(np.isfinite(np.asarray(ys, dtype=float))):
            _band(ax, np.arange(len(ys[0])), ys, colors[v], v)
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel(r"$\|\Delta f\|^2 / \|\Delta W_{QK}\|^2$")
    ax.set_title("instability score")
    ax.legend()
    return fig


def plot_report(report) -> dict:
    """All four figures of a validation report, by file suffix."""
    return {"column_sums": plot_column_sums(report), "accuracy_vs_n_iter": plot_accuracy_vs_n_iter(report),
            "epoch_time": plot_epoch_time(report), "instability": plot_instability(report)}


# ----------------------------------------------------------------------------------------
# registered figure


@dataclass(frozen=True)
class ColumnSumsConfig:
    task: str = "digits"
    attentions: tuple = ("softmax",)
    n_iters: tuple = (3,)
    seeds: tuple = (0,)
    epochs: int = 5
    quick: bool = True
    seed: int = 0


def _compute_column_sums(cfg: ColumnSumsConfig) -> dict:
    from sinkflow.studies.validation import run_validation

    with sinkflow.torch_threads(1):  # small models: one thread is fastest and deterministic
        report = run_validation(cfg.task, cfg.attentions, cfg.n_iters, cfg.seeds, quick=cfg.quick, epochs=cfg.epochs,
                                track_kl=False)
    report = {k: report[k] for k in ("task", "config", "runs")}
    report["config"] = _without_none(report["config"])  # figure data hold arrays and text, not None
    for r in report["runs"]:
        r.pop("wall_time")
        r["history"] = {k: r["history"][k] for k in ("sorted_column_sums", "column_deviation", "test_accuracy")}
    return report


def _without_none(tree):
    """``tree`` (nested dicts) without its None entries."""
    if not isinstance(tree, dict):
        return tree
    return {k: _without_none(v) for k, v in tree.items() if v is not None}


def _plot_column_sums(data: dict, cfg: ColumnSumsConfig):
    return plot_column_sums(data)


register(
    "training_column_sums",
    compute=_compute_column_sums,
    plot=_plot_column_sums,
    quick=ColumnSumsConfig(),
    full=ColumnSumsConfig(attentions=("softmax", "sinkhorn"), seeds=(0, 1, 2), epochs=30, quick=False),
    default=False,
    description="Sorted attention column sums per training epoch, one-layer ViT on 8x8 digits (Sinkformers RQ1)",
    needs=("sklearn",),  # scikit-learn's digits (sinkflow.studies.data.digits)
)


def plot_paper_comparison(report: dict, rows: list[dict] | None = None):
    """Bar chart of a Long Range Arena report: accuracy and instability ratio, ours beside the paper's.

    ``rows`` defaults to :func:`sinkflow.studies.lra.paper_comparison` of the report.
    """
    import matplotlib.pyplot as plt

    from sinkflow.studies.lra import paper_comparison

    rows = paper_comparison(report) if rows is None else rows
    names = [c["variant"] for c in rows]
    x = np.arange(len(names))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, key, label in ((axes[0], "accuracy", "test accuracy (%)"),
                           (axes[1], "instability_ratio", "instability x SoftMax")):
        ours = [np.nan if c[key] is None else c[key] for c in rows]
        paper = [np.nan if c[f"paper_{key}"] is None else c[f"paper_{key}"] for c in rows]
        ax.bar(x - 0.2, ours, 0.4, label=f"sinkflow ({report['mode']}, {report['config']['device']})")
        ax.bar(x + 0.2, paper, 0.4, label="paper")
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_ylabel(label)
    axes[0].legend(fontsize="small")
    fig.suptitle(f"{report['task']}: ours vs Skyformer paper")
    fig.tight_layout()
    return fig


def write_paper_figure(report: dict, stem) -> list:
    """Write ``STEM_paper.png`` (:func:`plot_paper_comparison`) in the shared style; return its path."""
    from pathlib import Path

    import matplotlib.pyplot as plt

    from sinkflow.plots.style import style

    with style():
        fig = plot_paper_comparison(report)
        png = Path(f"{stem}_paper.png")
        fig.savefig(png, metadata={"Software": None})
        plt.close(fig)
    return [png]
