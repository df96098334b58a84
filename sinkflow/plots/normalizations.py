"""Figures of the foundation: SoftMax vs Sinkhorn attention, and Sinkhorn's convergence rate."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import Tolerance, register
from sinkflow.plots.style import COLORS, new_figure


@dataclass(frozen=True)
class AttentionConfig:
    """Queries and keys in the plane, Gaussian scores at a temperature (Sinkformers Figure 1 idea)."""

    n_queries: int = 12
    n_keys: int = 12
    temperature: float = 0.5
    seed: int = 0


def attention_data(cfg: AttentionConfig) -> dict:
    rng = np.random.default_rng(cfg.seed)
    # Queries in a tight blob, keys spread on a ring: SoftMax lets most queries pick the
    # same nearby keys; Sinkhorn forces every key to be used exactly once on average.
    q = rng.normal(scale=0.35, size=(cfg.n_queries, 2)) + np.array([0.4, 0.0])
    angles = np.sort(rng.uniform(0, 2 * np.pi, cfg.n_keys))
    k = np.c_[np.cos(angles), np.sin(angles)] * rng.uniform(0.8, 1.2, size=(cfg.n_keys, 1))
    C = sinkflow.gaussian_scores(q, k, temperature=cfg.temperature)
    res = sinkflow.solve_sinkhorn(C, tol=1e-12)
    return {
        "queries": q, "keys": k, "scores": C,
        "softmax": sinkflow.softmax(C), "sinkhorn": res.attention,
        "sinkhorn_error": res.marginal_error,
    }


def _lines(ax, q, k, K, color, title):
    w = K / K.max()
    for i in range(len(q)):
        for j in range(len(k)):
            if w[i, j] > 0.02:
                ax.plot([q[i, 0], k[j, 0]], [q[i, 1], k[j, 1]], color=color, alpha=float(w[i, j]) * 0.9,
                        lw=0.4 + 2.2 * float(w[i, j]), solid_capstyle="round", zorder=1)
    ax.scatter(*q.T, s=18, color="k", zorder=3, label="queries $x_i$")
    ax.scatter(*k.T, s=26, facecolor="white", edgecolor=color, lw=1.2, zorder=3, label="keys $y_j$")
    ax.set_aspect("equal")
    ax.set_title(title)
    ax.set_xticks([]), ax.set_yticks([])
    ax.grid(False)


def attention_plot(data: dict, cfg: AttentionConfig):
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = new_figure(3, 2, width=2.9, height=2.7)
    q, k = data["queries"], data["keys"]
    _lines(axes[0, 0], q, k, data["softmax"], COLORS["softmax"], "SoftMax $K^1$")
    _lines(axes[0, 1], q, k, data["sinkhorn"], COLORS["sinkhorn"], r"Sinkhorn $K^\infty$")
    # below the panel: inside it, the legend hid key markers
    axes[0, 0].legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=7, handletextpad=0.2)
    ax = axes[0, 2]
    ranks = np.arange(1, cfg.n_keys + 1)
    ax.step(ranks, sinkflow.sorted_column_sums(data["softmax"]), where="mid", color=COLORS["softmax"], label="SoftMax")
    ax.step(ranks, sinkflow.sorted_column_sums(data["sinkhorn"]), where="mid", color=COLORS["sinkhorn"],
            label="Sinkhorn")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # sums near 1: 0.5, 1, 2, written plainly
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("key rank")
    ax.set_ylabel(r"sorted column sum $\sum_i K_{ij}$")
    ax.set_title("column sums")
    ax.legend()
    mats = [(np.exp(data["scores"]), r"$\exp(C)$"), (data["softmax"], "SoftMax$(C)$"),
            (data["sinkhorn"], "Sinkhorn$(C)$")]
    for ax, (M, title) in zip(axes[1], mats, strict=True):
        im = ax.imshow(M, cmap="viridis", vmin=0)
        ax.set_title(title)
        ax.set_xlabel("key $j$")
        ax.set_ylabel("query $i$")
        ax.grid(False)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(rf"Attention between queries and keys, Gaussian scores, $\tau$ = {cfg.temperature:g}")
    return fig


register(
    "normalizations_attention",
    compute=attention_data,
    plot=attention_plot,
    quick=AttentionConfig(),
    full=AttentionConfig(n_queries=16, n_keys=16),
    description="SoftMax vs Sinkhorn attention as weighted lines, column sums, heatmaps of exp(C), SoftMax, Sinkhorn",
    caption=('Sinkhorn attention gives every key a total weight of exactly 1 (doubly stochastic); '
             'SoftMax normalizes only the queries, so some keys get twice their share.'),
)


@dataclass(frozen=True)
class ConvergenceConfig:
    """Plain Sinkhorn (no acceleration) on n x n Gaussian scores at several score scales."""

    n: int = 30
    dim: int = 2
    scales: tuple = (1.0, 2.0, 4.0)
    half_iterations: int = 120
    seed: int = 0


def convergence_data(cfg: ConvergenceConfig) -> dict:
    rng = np.random.default_rng(cfg.seed)
    x = rng.normal(size=(cfg.n, cfg.dim))
    base = sinkflow.gaussian_scores(x, x)
    out = {"scales": np.array(cfg.scales, dtype=float), "errors": [], "bound_rate": [], "predicted_rate": [],
           "observed_rate": []}
    for s in cfg.scales:
        C = s * base
        run = sinkflow.solve_sinkhorn(C, n_iter=cfg.half_iterations)
        limit = sinkflow.solve_sinkhorn(C, tol=1e-13, max_iter=200_000).attention
        out["errors"].append(run.errors)
        out["bound_rate"].append(sinkflow.birkhoff_hopf_rate(C))
        out["predicted_rate"].append(sinkflow.asymptotic_rate(limit))
        out["observed_rate"].append(sinkflow.observed_rate(run.errors))
    return {k: np.array(v) for k, v in out.items()}


def convergence_plot(data: dict, cfg: ConvergenceConfig):
    """Left: errors against half-iterations with the predicted slope. Right: the rates per full
    iteration (two half-iterations) against the scale: observed, predicted, and the bound, which
    is close to 1 for every scale (drawn on the left, its three lines lay on top of each other)."""
    fig, axes = new_figure(2, 1, width=3.2, height=3.0)
    ax, rates = axes[0]
    colors = [COLORS["sinkhorn"], COLORS["softmax"], COLORS["unnormalized"], COLORS["gaussian"], COLORS["other"]]
    # not strict: colors is a palette, longer than the scales of the quick and full configurations
    for s, e, pred, color in zip(data["scales"], data["errors"], data["predicted_rate"], colors, strict=False):
        ell = np.arange(1, len(e) + 1)
        ax.semilogy(ell, e, color=color, label=rf"scale {s:g}")
        # a rate r per full iteration is r^(1/2) per half-iteration; anchored at the first error
        ax.semilogy(ell, e[0] * pred ** ((ell - 1) / 2), color=color, ls=":", lw=1.0)
    ax.plot([], [], color="gray", ls=":", label=r"predicted: $\sigma_2(P)^2$ per 2 half-iterations")
    ax.set_ylim(1e-15, 2)  # below ~1e-15 float64 rounding is all that is left
    ax.set_xlabel(r"half-iteration $\ell$")
    ax.set_ylabel("marginal error (L1)")
    ax.set_title("observed errors (solid), prediction (dotted)", fontsize=8)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)  # under the axes: no line hidden
    s = data["scales"]
    rates.plot(s, data["bound_rate"], "s--", color=COLORS["bound"], label=r"bound $\tanh(\Delta/4)^2$ (Birkhoff-Hopf)")
    rates.plot(s, data["predicted_rate"], "x:", color=COLORS["reference"], ms=7,
               label=r"predicted $\sigma_2(P)^2$ (Knight)")
    rates.plot(s, data["observed_rate"], "o", color=COLORS["sinkhorn"], mfc="none", label="observed (fit)")
    rates.set_xscale("log", base=2)
    rates.set_xticks(s, [f"{v:g}" for v in s])
    rates.set_ylim(0, 1.05)
    rates.set_xlabel(r"score scale $s$ (scores $s\,C$)")
    rates.set_ylabel("contraction per 2 half-iterations")
    rates.set_title("rates: the bound is loose", fontsize=8)
    rates.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Sinkhorn convergence, {cfg.n} x {cfg.n} Gaussian scores")
    return fig


register(
    "normalizations_convergence",
    compute=convergence_data,
    plot=convergence_plot,
    quick=ConvergenceConfig(),
    full=ConvergenceConfig(n=60, scales=(1.0, 2.0, 4.0, 8.0), half_iterations=400),
    description="Marginal error vs half-iterations with the Birkhoff-Hopf bound and the sigma_2^2 prediction",
    # a rate fitted on an error curve that reaches rounding level: 5e-6 relative spread
    # measured across CPU and BLAS kernels
    tolerances={"observed_rate": Tolerance(rtol=1e-4)},
    caption=("Sinkhorn's marginal error falls geometrically at the predicted rate sigma_2(P)^2 "
             'per two half-iterations; the Birkhoff-Hopf bound, near 1, is loose.'),
)
