r"""Sinkhorn's contraction rate over a sweep of temperatures: observed, :math:`\sigma_2(P)^2`, Birkhoff-Hopf.

A figure computed by :func:`sinkflow.sweep` (sequentially, uncached): the experiment
:func:`sinkflow.experiments.sinkhorn_convergence` on a grid of score scales and seeds.
THEORY.md section 1: the observed rate per full iteration should match
:math:`\sigma_2(P)^2` (Knight 2008) and stay below the loose bound
:math:`\tanh(\Delta/4)^2`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinkflow.plots.registry import register

RATES = ("observed_rate", "asymptotic_rate", "birkhoff_hopf_rate")


@dataclass(frozen=True)
class SweepRatesConfig:
    n: int = 30
    scales: tuple = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
    seeds: tuple = (0, 1, 2)
    tol: float = 1e-12
    seed: int = 0  # offset added to every seed of the grid


def compute(cfg: SweepRatesConfig) -> dict:
    from sinkflow.sweeps import sweep

    grid = {"n": cfg.n, "scale": list(cfg.scales), "seed": [cfg.seed + s for s in cfg.seeds], "tol": cfg.tol}
    df = sweep(grid, "sinkflow.experiments:sinkhorn_convergence", executor="sequential", cache_dir=None,
               progress=False)
    return {col: df[col].to_numpy(dtype=float) for col in ("scale", "seed", *RATES, "n_iter")}


def plot(data: dict, cfg: SweepRatesConfig):
    import pandas as pd

    from sinkflow.plots.style import COLORS, new_figure
    from sinkflow.sweeps import plot_sweep

    df = pd.DataFrame(data)
    fig, axes = new_figure(2, 1)
    labels = {"scale": r"score scale $s$", "observed_rate": "observed",
              "asymptotic_rate": r"$\sigma_2(P)^2$", "birkhoff_hopf_rate": r"$\tanh(\Delta/4)^2$"}
    colors = {"observed_rate": COLORS["sinkhorn"], "asymptotic_rate": COLORS["reference"],
              "birkhoff_hopf_rate": COLORS["bound"]}
    ax = axes[0, 0]
    # observed last, on top: it lies on sigma_2(P)^2
    plot_sweep(df, "scale", ["birkhoff_hopf_rate", "asymptotic_rate", "observed_rate"], ax=ax, labels=labels,
               colors=colors)
    ax.set_ylabel("rate per full iteration")
    ax.set_title(f"$n = {cfg.n}$, {len(cfg.seeds)} seeds (band: min-max)")
    ax = axes[0, 1]
    ax.plot([0, 1], [0, 1], color=COLORS["reference"], lw=0.8, label="equality")
    ax.scatter(df["asymptotic_rate"], df["observed_rate"], s=10, color=COLORS["sinkhorn"], label="one problem")
    lim = 1.05 * float(np.max(df[["asymptotic_rate", "observed_rate"]].to_numpy()))
    ax.set(xlim=(0, lim), ylim=(0, lim), xlabel=r"predicted $\sigma_2(P)^2$", ylabel="observed rate",
           title="Knight (2008): observed = predicted")
    ax.legend()
    return fig


register(
    "sweep_sinkhorn_rates",
    compute=compute,
    plot=plot,
    quick=SweepRatesConfig(),
    full=SweepRatesConfig(n=100, scales=(0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0), seeds=tuple(range(10))),
    default=False,
    description="Sinkhorn contraction rate vs temperature from a sweep: observed, sigma_2(P)^2 and the Birkhoff-Hopf bound",
)
