r"""Figure of the clustering experiment at the field's scale (docs/theory/clustering.md).

* ``cluster_predictions``: Bruno et al.'s experiment on the circle at :math:`N = 2\times 10^4`
  (SoftMax and Sinkhorn): counts at the plateau against :math:`k^*(\beta)`, the agreement rate with
  its exact 95% interval, the position error against the prediction of
  :func:`sinkflow.clustering.predict_clusters`, and how the Sinkhorn count splits with :math:`N` at
  :math:`\beta = 5` (modes 3 and 4 tied). The runs take hours on a CPU, so the figure draws the
  committed runs (``docs/data/clustering/cluster_predictions.json``, written by
  ``python -m sinkflow.clustering.prediction_study``); quick and full configurations read the same file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sinkflow.plots import register

_NORMS = ("softmax", "sinkhorn")


@dataclass(frozen=True)
class PredictionsConfig:
    source: str = "docs/data/clustering/cluster_predictions.json"
    n: int = 20_000
    tie_beta: float = 5.0


def compute_predictions(cfg: PredictionsConfig) -> dict:
    from sinkflow.clustering import fastest_mode
    from sinkflow.clustering.prediction_study import summarize

    path = Path(cfg.source)
    if not path.is_absolute():
        path = Path(__file__).resolve().parents[2] / path
    rows = summarize(json.loads(path.read_text())["runs"])
    data = {}
    for norm in _NORMS:
        main = [r for r in rows if r["normalization"] == norm and r["n"] == cfg.n]
        counts = [r["counts"] for r in main]
        width = max(len(c) for c in counts)
        data[f"{norm}_betas"] = np.array([r["beta"] for r in main])
        data[f"{norm}_counts"] = np.array([c + [-1] * (width - len(c)) for c in counts])  # -1: no run
        data[f"{norm}_k_star"] = np.array([r["predicted"] for r in main])
        data[f"{norm}_agree"] = np.array([r["agree"] / r["runs"] for r in main])
        data[f"{norm}_interval"] = np.array([r["agree_interval"] for r in main])
        data[f"{norm}_error"] = np.array([r["median_error"] for r in main])
        data[f"{norm}_error_formation"] = np.array([r["median_error_formation"] for r in main])
    ties = [r for r in rows if r["normalization"] == "sinkhorn" and r["beta"] == cfg.tie_beta]
    data["tie_n"] = np.array([r["n"] for r in ties])
    data["tie_histogram"] = np.array([[r["counts"].count(c) / r["runs"] for c in range(1, 7)] for r in ties])
    data["tie_runs"] = np.array([r["runs"] for r in ties])
    beta_fine = np.geomspace(1, 32, 300)
    data["beta_fine"] = beta_fine
    for norm in _NORMS:
        data[f"{norm}_k_star_fine"] = np.array([fastest_mode(b, norm) for b in beta_fine])
    return data


def plot_predictions(data, cfg):
    from sinkflow.plots.mean_field import LABELS
    from sinkflow.plots.style import COLORS, new_figure

    fig, axes = new_figure(4, 1, width=3.2, height=3.0)
    a, b, c, d = axes[0]
    for norm, shift in zip(_NORMS, (0.97, 1.03)):
        col, betas = COLORS[norm], data[f"{norm}_betas"]
        counts = data[f"{norm}_counts"]
        for s in range(counts.shape[1]):
            ok = counts[:, s] >= 0
            a.plot(betas[ok] * shift, counts[ok, s] + (shift - 1) * 3, "o", color=col, alpha=0.5, ms=3.5,
                   label=f"{LABELS[norm]} runs" if s == 0 else None)
        a.step(data["beta_fine"], data[f"{norm}_k_star_fine"], where="mid", color=col, lw=1,
               ls="-" if norm == "softmax" else "--", label=rf"$k^*(\beta)$ {LABELS[norm]}")
        lo, hi = data[f"{norm}_interval"].T
        agree = data[f"{norm}_agree"]
        b.errorbar(betas * shift, agree, yerr=[agree - lo, hi - agree], fmt="o-", color=col, ms=3, capsize=2,
                   label=LABELS[norm])
        c.plot(betas, data[f"{norm}_error"], "o-", color=col, ms=3, label=f"{LABELS[norm]}, $t = 2t_f$")
        c.plot(betas, data[f"{norm}_error_formation"], "s:", color=col, ms=3, label=f"{LABELS[norm]}, $t = t_f$")
    for ax in (a, b, c):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(r"$\beta$")
    a.set_ylabel("clusters at $t = 2t_f$")
    a.set_title(f"N = {cfg.n:,}: counts vs $k^*$", fontsize=9)
    a.legend(fontsize=6.5, loc="upper left")
    b.set_ylabel("fraction of runs with count $= k^*$")
    b.set_ylim(-0.05, 1.05)
    b.set_title("agreement (exact 95% intervals)", fontsize=9)
    b.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)  # below: off the bars
    c.set_ylabel("median position error (rad)")
    c.set_title("positions vs predict_clusters\n(runs whose count is $k^*$)", fontsize=9)
    c.legend(fontsize=6.5)
    ks, shades = np.arange(1, 7), ("#9ecae1", "#4292c6", "#08306b")  # light to dark: small to large N
    for i, (n, runs) in enumerate(zip(data["tie_n"], data["tie_runs"])):
        d.bar(ks + (i - 1) * 0.25, data["tie_histogram"][i], width=0.25, color=shades[i % 3],
              label=f"N = {int(n):,} ({int(runs)} seeds)")
    d.set_xlabel("clusters at $t = 2t_f$")
    d.set_ylabel("fraction of runs")
    d.set_title(rf"Sinkhorn, $\beta = {cfg.tie_beta:g}$: $\lambda_3 = 0.495$, $\lambda_4 = 0.505$", fontsize=9)
    d.set_ylim(0, 1.2)
    d.legend(fontsize=7, loc="upper right")  # above the empty counts 4-6
    return fig


register("cluster_predictions", compute=compute_predictions, plot=plot_predictions, quick=PredictionsConfig(),
         full=PredictionsConfig(), default=False,
         description="Circle at N = 2e4: cluster counts and positions vs predict_clusters, SoftMax and Sinkhorn")
