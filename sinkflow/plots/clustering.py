r"""Figure of the clustering experiment at the field's scale (docs/theory/clustering.md).

* ``cluster_predictions``: Bruno et al.'s experiment on the circle at :math:`N = 2\times 10^4`
  (SoftMax and Sinkhorn): counts at the plateau against :math:`k^*(\beta)`, the agreement rate with
  its exact 95% interval, the position error against the prediction of
  :func:`sinkflow.clustering.predict_clusters`, and how the Sinkhorn count splits with :math:`N` at
  :math:`\beta = 5` (modes 3 and 4 tied). The runs take hours on a CPU, so the figure draws the
  committed runs (``docs/data/clustering/cluster_predictions.json``, written by
  ``python -m sinkflow.clustering.prediction_study``); quick and full configurations read the same file.
* ``dynamic_metastability``: how long the last plateau (2 clusters) lasts against :math:`\beta` on the
  circle and :math:`S^2`, SoftMax and Sinkhorn, beside the two-cluster law
  (:func:`sinkflow.clustering.two_cluster_dwell`) and the slope :math:`e^{2\beta}`, and the energy
  staircases of one SoftMax and one Sinkhorn run with their point-cluster levels. It draws the committed
  runs of ``python -m sinkflow.clustering.metastability_study`` (docs/data/clustering/dwell_*.json);
  quick and full configurations read the same files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sinkflow._optional import checkout_file
from sinkflow.plots import register

_NORMS = ("softmax", "sinkhorn")
#: The committed runs of the studies, in the source checkout (a wheel does not ship docs/: these figures need a clone).
_STUDIES = "docs/data/clustering/{}.json"


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
        path = checkout_file(cfg.source, "the figure cluster_predictions")
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
    from sinkflow.plots.style import COLORS, LABELS, new_figure

    fig, axes = new_figure(4, 1, width=3.2, height=3.0)
    a, b, c, d = axes[0]
    for norm, shift in zip(_NORMS, (0.97, 1.03), strict=True):
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
    a.set_title(r"cluster counts against $k^*(\beta)$", fontsize=9)
    a.legend(fontsize=6.5, loc="upper left")
    a.text(0.97, 0.04, f"N = {cfg.n:,} tokens", transform=a.transAxes, ha="right", va="bottom", fontsize=7)
    b.set_ylabel("fraction of runs with count $= k^*$")
    b.set_ylim(-0.05, 1.05)
    b.set_title("agreement, with exact 95% intervals", fontsize=9)
    b.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)  # below: off the bars
    c.set_ylabel("median position error (rad),\nruns whose count is $k^*$")
    c.set_title("positions against the prediction", fontsize=9)
    c.legend(fontsize=6.5)
    ks, shades = np.arange(1, 7), ("#9ecae1", "#4292c6", "#08306b")  # light to dark: small to large N
    for i, (n, runs) in enumerate(zip(data["tie_n"], data["tie_runs"], strict=True)):
        d.bar(ks + (i - 1) * 0.25, data["tie_histogram"][i], width=0.25, color=shades[i % 3],
              label=f"N = {int(n):,} ({int(runs)} seeds)")
    d.set_xlabel("clusters at $t = 2t_f$")
    d.set_ylabel("fraction of runs")
    d.set_title(rf"Sinkhorn at $\beta = {cfg.tie_beta:g}$: modes 3 and 4 tie", fontsize=9)
    d.text(0.04, 0.6, "growth rates\n$\\lambda_3 = 0.495$\n$\\lambda_4 = 0.505$", transform=d.transAxes, ha="left",
           va="top", fontsize=7)  # over the empty counts 1-2, under the legend
    d.set_xticks(ks)
    d.set_ylim(0, 1.02)  # a fraction: ticks up to 1
    d.set_yticks(np.linspace(0, 1, 6))
    d.legend(fontsize=7, loc="upper right")  # above the empty counts 4-6
    return fig


register("cluster_predictions", compute=compute_predictions, plot=plot_predictions, quick=PredictionsConfig(),
         full=PredictionsConfig(), default=False, needs=(PredictionsConfig.source,),
         description="Circle at N = 2e4: cluster counts and positions vs predict_clusters, SoftMax and Sinkhorn",
         caption=("At N = 20,000, SoftMax forms k*(beta) clusters in 31 of 40 runs, Sinkhorn its own k* in 19 of 52; "
                  "no run forms more than k*, and at the beta = 5 tie of modes 3 and 4 Sinkhorn mostly forms 3."))


@dataclass(frozen=True)
class MetastabilityConfig:
    sources: tuple = ("dwell_circle_softmax", "dwell_circle_sinkhorn", "dwell_sphere_softmax", "dwell_sphere_sinkhorn")
    staircase_beta: float = 3.0
    staircase_seed: int = 1


def _study(name: str):
    """A committed run of the metastability study (``docs/data/clustering/NAME.json`` of the checkout)."""
    return json.loads(checkout_file(_STUDIES.format(name), "the figure dynamic_metastability").read_text())


def compute_metastability(cfg: MetastabilityConfig) -> dict:
    data = {}
    for name in cfg.sources:
        study = _study(name)
        ok = [r for r in study["runs"] if r["dwell"] is not None and r["predicted"] is not None]
        data[f"{name}_beta"] = np.array([r["beta"] for r in ok])
        data[f"{name}_dwell"] = np.array([r["dwell"] for r in ok])
        data[f"{name}_law"] = np.array([r["predicted"] for r in ok])
        if name.startswith("dwell_circle"):
            run = next((r for r in study["runs"]
                        if r["beta"] == cfg.staircase_beta and r["seed"] == cfg.staircase_seed), study["runs"][0])
            norm = study["config"]["normalization"]
            data[f"{norm}_times"] = np.array(run["times"])
            data[f"{norm}_energy"] = np.array(run["energies"])
            data[f"{norm}_levels"] = np.array([[run["times"][p["start"]], run["times"][p["end"] - 1], p["level"]]
                                               for p in run["plateaus"]])
            data[f"{norm}_level_counts"] = np.array([p["count"] for p in run["plateaus"]])
            data[f"{norm}_run"] = np.array([run["beta"], run["seed"]])
    return data


def plot_metastability(data, cfg):
    from sinkflow.plots.style import COLORS, new_figure

    fig, axes = new_figure(3, 1, width=3.3, height=3.0)
    a, b, c = axes[0]
    markers = {"circle": "o", "sphere": "^"}
    for name in cfg.sources:
        if f"{name}_beta" not in data:
            continue
        manifold, norm = name.split("_")[1:]
        col, shift = COLORS[norm], 0.97 if norm == "softmax" else 1.03
        label = f"{'circle' if manifold == 'circle' else '$S^2$'}, {'SoftMax' if norm == 'softmax' else 'Sinkhorn'}"
        a.plot(data[f"{name}_beta"] * shift, data[f"{name}_dwell"], markers[manifold], color=col, ms=3.5, alpha=0.6,
               mfc=col if manifold == "circle" else "none", label=label)
    if "dwell_circle_softmax_beta" in data:
        bs = np.linspace(1.9, 4.1, 20)
        ref = np.median(data["dwell_circle_softmax_law"] / np.exp(2 * data["dwell_circle_softmax_beta"]))
        a.plot(bs, ref * np.exp(2 * bs), "k--", lw=1, label=r"$\propto e^{2\beta}$")
    a.set_yscale("log")
    a.set_xlabel(r"$\beta$")
    a.set_ylabel("2-cluster dwell time (runs)")
    a.set_title("last plateau, N = 256", fontsize=9)
    a.legend(fontsize=6.5, loc="upper left")
    for name in cfg.sources:
        if f"{name}_beta" in data:
            manifold, norm = name.split("_")[1:]
            b.plot(data[f"{name}_law"], data[f"{name}_dwell"], markers[manifold], color=COLORS[norm], ms=3.5, alpha=0.6,
                   mfc=COLORS[norm] if manifold == "circle" else "none")
    lim = [2.0, 1e4]
    b.plot(lim, lim, "k-", lw=0.8, label="measured = law")
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("two-cluster law (from the plateau's start)")
    b.set_ylabel("measured dwell")
    b.set_title("each run against the law", fontsize=9)
    b.legend(fontsize=7, loc="upper left")
    twin = c.twinx()
    for norm, ax in (("softmax", c), ("sinkhorn", twin)):
        if f"{norm}_times" not in data:
            continue
        t = np.maximum(data[f"{norm}_times"], 0.5)
        ax.plot(t, data[f"{norm}_energy"], color=COLORS[norm], lw=1.2,
                label=r"SoftMax $e^{-\beta}E_\beta$ (left)" if norm == "softmax" else r"Sinkhorn $F^\infty$ (right)")
        for t0, t1, level in data[f"{norm}_levels"]:
            ax.hlines(level, max(t0, 0.5), max(t1, 0.5), color=COLORS[norm], ls=":", lw=1.5)
        ax.tick_params(axis="y", colors=COLORS[norm])
    twin.spines["right"].set_visible(True)  # the right ticks sit on an axis line, not as loose dashes
    twin.spines["right"].set_color(COLORS["sinkhorn"])
    c.set_xscale("log")
    c.set_xlabel("time")
    c.set_ylabel(r"$e^{-\beta}E_\beta$", color=COLORS["softmax"])
    twin.set_ylabel(r"$F^\infty$", color=COLORS["sinkhorn"])
    run = data.get("softmax_run", np.array([cfg.staircase_beta, cfg.staircase_seed]))
    c.set_title(rf"staircases, circle, $\beta = {run[0]:g}$ (dotted: point-cluster levels)", fontsize=8)
    lines = c.get_lines()[:1] + twin.get_lines()[:1]
    c.legend(lines, [ln.get_label() for ln in lines], fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.2),
             ncol=2)  # below: off the levels
    return fig


register("dynamic_metastability", compute=compute_metastability, plot=plot_metastability, quick=MetastabilityConfig(),
         full=MetastabilityConfig(), default=False, needs=tuple(map(_STUDIES.format, MetastabilityConfig.sources)),
         description="Dwell time of the last plateau vs beta (circle, S^2; SoftMax, Sinkhorn) and energy staircases",
         caption="The last two clusters last as long as the two-cluster law says, ~e^{2 beta} when they formed "
                 "antipodal (circle), less on S^2; energies sit on the point-cluster levels.")
