r"""Sinkhorn's contraction rate over a sweep of temperatures: observed, :math:`\sigma_2(P)^2`, Birkhoff-Hopf.

The experiment :func:`sinkflow.experiments.sinkhorn_convergence` on a grid of score scales
and seeds (the grid a ``sinkflow sweep`` would run; computed here point by point so the
figure needs neither Dask nor pandas).
docs/theory/normalizations.md: the observed rate per full iteration should match
:math:`\sigma_2(P)^2` (Knight 2008) and stay below the loose bound
:math:`\tanh(\Delta/4)^2`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinkflow.plots import register

RATES = ("observed_rate", "asymptotic_rate", "birkhoff_hopf_rate")


@dataclass(frozen=True)
class SweepRatesConfig:
    n: int = 30
    scales: tuple = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
    seeds: tuple = (0, 1, 2)
    tol: float = 1e-12
    seed: int = 0  # offset added to every seed of the grid


def compute(cfg: SweepRatesConfig) -> dict:
    from sinkflow.experiments import sinkhorn_convergence
    from sinkflow.sweeps import expand_grid

    grid = {"n": cfg.n, "scale": list(cfg.scales), "seed": [cfg.seed + s for s in cfg.seeds], "tol": cfg.tol}
    points = expand_grid(grid)
    results = [sinkhorn_convergence(**p) for p in points]
    data = {"scale": np.array([p["scale"] for p in points]), "seed": np.array([p["seed"] for p in points])}
    for key in (*RATES, "n_iter"):
        data[key] = np.array([r[key] for r in results], dtype=float)
    return data


def plot(data: dict, cfg: SweepRatesConfig):
    from sinkflow.plots.style import COLORS, new_figure

    fig, axes = new_figure(2, 1)
    ax = axes[0, 0]
    scales = np.unique(data["scale"])
    # observed last, on top: it lies on sigma_2(P)^2
    for key, label in [("birkhoff_hopf_rate", r"$\tanh(\Delta/4)^2$"), ("asymptotic_rate", r"$\sigma_2(P)^2$"),
                       ("observed_rate", "observed")]:
        color = {"observed_rate": COLORS["sinkhorn"], "asymptotic_rate": COLORS["reference"],
                 "birkhoff_hopf_rate": COLORS["bound"]}[key]
        per_scale = [data[key][data["scale"] == s] for s in scales]
        ax.plot(scales, [v.mean() for v in per_scale], "o-", ms=3, color=color, label=label)
        ax.fill_between(scales, [v.min() for v in per_scale], [v.max() for v in per_scale], color=color,
                        alpha=0.2, lw=0)
    ax.set(xlabel=r"score scale $s$", ylabel="rate per full iteration",
           title=f"$n = {cfg.n}$, {len(cfg.seeds)} seeds (band: min-max)")
    ax.legend()
    ax = axes[0, 1]
    ax.plot([0, 1], [0, 1], color=COLORS["reference"], lw=0.8, label="equality")
    ax.scatter(data["asymptotic_rate"], data["observed_rate"], s=10, color=COLORS["sinkhorn"], label="one problem")
    lim = 1.05 * float(max(data["asymptotic_rate"].max(), data["observed_rate"].max()))
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
    description="Sinkhorn contraction rate vs temperature over a grid: observed, sigma_2(P)^2 and the Birkhoff-Hopf "
                "bound",
)
