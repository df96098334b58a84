"""Figures of the foundation: SoftMax vs Sinkhorn attention, and Sinkhorn's convergence rate."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots.registry import register
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
    fig, axes = new_figure(3, 2, width=2.9, height=2.7)
    q, k = data["queries"], data["keys"]
    _lines(axes[0, 0], q, k, data["softmax"], COLORS["softmax"], "SoftMax $K^1$")
    _lines(axes[0, 1], q, k, data["sinkhorn"], COLORS["sinkhorn"], r"Sinkhorn $K^\infty$")
    axes[0, 0].legend(loc="lower left", fontsize=7)
    ax = axes[0, 2]
    ranks = np.arange(1, cfg.n_keys + 1)
    ax.step(ranks, sinkflow.sorted_column_sums(data["softmax"]), where="mid", color=COLORS["softmax"], label="SoftMax")
    ax.step(ranks, sinkflow.sorted_column_sums(data["sinkhorn"]), where="mid", color=COLORS["sinkhorn"], label="Sinkhorn")
    ax.set_yscale("log")
    ax.set_xlabel("key rank")
    ax.set_ylabel(r"sorted column sum $\sum_i K_{ij}$")
    ax.set_title("column sums")
    ax.legend()
    mats = [(np.exp(data["scores"]), r"$\exp(C)$"), (data["softmax"], "SoftMax$(C)$"), (data["sinkhorn"], "Sinkhorn$(C)$")]
    for ax, (M, title) in zip(axes[1], mats):
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
    out = {"scales": np.array(cfg.scales, dtype=float), "errors": [], "bound_rate": [], "predicted_rate": []}
    for s in cfg.scales:
        C = s * base
        run = sinkflow.solve_sinkhorn(C, n_iter=cfg.half_iterations)
        limit = sinkflow.solve_sinkhorn(C, tol=1e-13, max_iter=200_000).attention
        out["errors"].append(run.errors)
        out["bound_rate"].append(sinkflow.birkhoff_hopf_rate(C))
        out["predicted_rate"].append(sinkflow.asymptotic_rate(limit))
    out["errors"] = np.array(out["errors"])
    out["bound_rate"] = np.array(out["bound_rate"])
    out["predicted_rate"] = np.array(out["predicted_rate"])
    return out


def convergence_plot(data: dict, cfg: ConvergenceConfig):
    fig, axes = new_figure(1, 1, width=4.2, height=3.2)
    ax = axes[0, 0]
    colors = [COLORS["sinkhorn"], COLORS["softmax"], COLORS["unnormalized"], COLORS["gaussian"], COLORS["other"]]
    for s, e, bound, pred, color in zip(data["scales"], data["errors"], data["bound_rate"], data["predicted_rate"], colors):
        k = np.arange(1, len(e) + 1)
        ax.semilogy(k, e, color=color, label=rf"scale {s:g}: observed")
        # Rates are per full iteration (2 half-iterations), anchored at the first error.
        ax.semilogy(k, e[0] * pred ** ((k - 1) / 2), color=color, ls=":", lw=1.0)
        ax.semilogy(k, e[0] * bound ** ((k - 1) / 2), color=color, ls="--", lw=1.0)
    ax.plot([], [], color="gray", ls=":", label=r"$\sigma_2(P)^{2}$ per iteration (Knight)")
    ax.plot([], [], color="gray", ls="--", label=r"$\tanh(\Delta/4)^{2}$ (Birkhoff-Hopf bound)")
    ax.set_ylim(1e-15, 2)  # below ~1e-15 float64 rounding is all that is left
    ax.set_xlabel("half-iteration $\\ell$")
    ax.set_ylabel("marginal error (L1)")
    ax.set_title(f"Sinkhorn convergence, {cfg.n} x {cfg.n} Gaussian scores")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


register(
    "normalizations_convergence",
    compute=convergence_data,
    plot=convergence_plot,
    quick=ConvergenceConfig(),
    full=ConvergenceConfig(n=60, scales=(1.0, 2.0, 4.0, 8.0), half_iterations=400),
    description="Marginal error vs half-iterations with the Birkhoff-Hopf bound and the sigma_2^2 prediction",
)
