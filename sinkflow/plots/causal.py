r"""Causal attention (docs/theory/causal.md): masked Sinkhorn without collapse, and causal particle
dynamics on the sphere (Karagodin, Polyanskiy and Rigollet 2024), SoftMax and Sinkhorn side by side.

(a) diagonal mass of causal Sinkhorn attention against ``n_iter``: uniform key targets (the old
convention, reachable only by the identity) against those of uniform causal attention;
(b) all tokens reach the first one (``W_V = I``): the spread decays at the rate of the
linearization at consensus, Euler's factor ``1 - h/2`` per step;
(c) the number of clusters from uniform starts on the circle against the number of Rényi
parking centers of the same tokens (spacing :math:`4 \beta^{-1/2}`), over seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register
from sinkflow.plots.style import COLORS, new_figure

ATTENTIONS = ("softmax", "sinkhorn")


@dataclass(frozen=True)
class CausalConfig:
    tokens: int = 8  # (a): the problem, q, k of width 4 from torch.manual_seed(seed)
    n_iters: tuple = (1, 2, 3, 5, 9, 17, 30, 60, 100, 300, 1000)
    spread_n: int = 8  # (b): tokens on the sphere S^2, beta = 1
    spread_h: float = 0.2
    spread_steps: int = 200
    n: int = 32  # (c): tokens on the circle
    beta: float = 16.0
    h: float = 0.05  # under the largest safe step (0.06 at beta = 16, 0.016 at 64)
    steps: int = 200
    save_every: int = 10
    seeds: int = 1
    tol: float = 1e-6  # Sinkhorn marginal tolerance of the cluster runs
    seed: int = 0


def _diagonal_mass(cfg: CausalConfig) -> dict:
    import torch  # here: `sinkflow figures --list` imports this module without torch

    from sinkflow.particles import causal_mask

    torch.manual_seed(cfg.seed)
    q, k = torch.randn(cfg.tokens, 4, dtype=torch.float64), torch.randn(cfg.tokens, 4, dtype=torch.float64)
    C, M = q @ k.T / 2, causal_mask(cfg.tokens)
    uniform = torch.full((cfg.tokens,), 1.0 / cfg.tokens, dtype=torch.float64)  # the old targets, given explicitly
    diag = {"old": [], "new": []}
    for n_iter in cfg.n_iters:
        diag["old"].append(float(sinkflow.sinkhorn(C, n_iter=n_iter, mask=M, b=uniform).diagonal().mean()))
        diag["new"].append(float(sinkflow.sinkhorn(C, n_iter=n_iter, mask=M).diagonal().mean()))
    softmax = float(sinkflow.softmax(C, mask=M).diagonal().mean())
    return {"n_iters": np.array(cfg.n_iters), "diag_old": np.array(diag["old"]), "diag_new": np.array(diag["new"]),
            "diag_softmax": softmax, "diag_uniform": float(np.mean(1.0 / np.arange(1, cfg.tokens + 1)))}


def _spread(cfg: CausalConfig) -> dict:
    x0 = sinkflow.random_particles(cfg.spread_n, 3, seed=cfg.seed, manifold="sphere")
    out = {}
    for kind in ATTENTIONS:
        tr = sinkflow.simulate(x0, kind, h=cfg.spread_h, steps=cfg.spread_steps, manifold="sphere", causal=True)
        out[f"spread_{kind}"] = np.linalg.norm(tr.positions - tr.positions[:, :1], axis=2).max(1)
        out["spread_times"] = tr.times
        late = tr.times >= 0.75 * tr.times[-1]
        out[f"rate_{kind}"] = -np.polyfit(tr.times[late], np.log(out[f"spread_{kind}"][late]), 1)[0]
    out["rate_predicted"] = -math.log(1 - cfg.spread_h / 2) / cfg.spread_h
    return out


def _clusters(cfg: CausalConfig) -> dict:
    counts = {kind: [] for kind in ATTENTIONS}
    renyi = []
    for s in range(cfg.seeds):
        theta = np.random.default_rng(cfg.seed + s).uniform(0, 2 * np.pi, cfg.n)
        x0 = np.stack([np.cos(theta), np.sin(theta)], 1)
        renyi.append(len(sinkflow.renyi_centers(x0, 4 / math.sqrt(cfg.beta))))
        for kind in ATTENTIONS:
            tr = sinkflow.simulate(x0, kind, h=cfg.h, steps=cfg.steps, manifold="sphere", temperature=1 / cfg.beta,
                                   causal=True, save_every=cfg.save_every, tol=cfg.tol)
            counts[kind].append([sinkflow.cluster_statistics(p, manifold="sphere", tol=1e-3)[1] for p in tr.positions])
    return {"cluster_times": tr.times, "renyi": np.array(renyi),
            **{f"clusters_{kind}": np.array(counts[kind]) for kind in ATTENTIONS}}


def compute_causal(cfg: CausalConfig) -> dict:
    return {**_diagonal_mass(cfg), **_spread(cfg), **_clusters(cfg)}


def _diagonal_panel(ax, data, cfg):
    ax.semilogx(data["n_iters"], data["diag_old"], "o-", ms=3, color=COLORS["bound"],
                label="uniform targets $1/n$: collapse")
    ax.semilogx(data["n_iters"], data["diag_new"], "o-", ms=3, color=COLORS["sinkhorn"],
                label="uniform-attention targets")
    ax.axhline(data["diag_uniform"], color=COLORS["reference"], ls=":", lw=0.8, label="uniform causal attention")
    ax.axhline(1.0, color=COLORS["reference"], lw=0.5)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("half-iterations $n_{iter}$")
    ax.set_ylabel("mean diagonal mass $K_{ii}$")
    ax.set_title(f"causal Sinkhorn, {cfg.tokens} tokens")
    ax.legend(loc="lower right", fontsize=7)  # under the curves: nothing lies below 0.3


def _spread_panel(ax, data, cfg):
    t = data["spread_times"]
    for kind, label in (("softmax", "SoftMax"), ("sinkhorn", "Sinkhorn")):
        ax.semilogy(t, data[f"spread_{kind}"], color=COLORS[kind], ls="-" if kind == "softmax" else "--",
                    label=f"{label}: rate {data[f'rate_{kind}']:.4f}")
    ref = data["spread_sinkhorn"][-1] * np.exp(-data["rate_predicted"] * (t - t[-1]))
    ax.semilogy(t, ref, color=COLORS["reference"], lw=0.6, ls=":", label=f"linearization: {data['rate_predicted']:.4f}")
    ax.set_xlabel("$t$")
    ax.set_ylabel(r"$\max_i \|x_i - x_1\|$")
    ax.set_title(rf"one cluster, $W_V = I$, $n = {cfg.spread_n}$, $\beta = 1$")
    ax.legend(loc="lower left", fontsize=7)


def _cluster_panel(ax, data, cfg):
    t = data["cluster_times"]
    for kind, label in (("softmax", "SoftMax"), ("sinkhorn", "Sinkhorn")):
        c = data[f"clusters_{kind}"]
        ax.plot(t, np.median(c, 0), color=COLORS[kind], ls="-" if kind == "softmax" else "--",
                label=f"{label} (median)")
        if len(c) > 1:
            ax.fill_between(t, c.min(0), c.max(0), color=COLORS[kind], alpha=0.15, lw=0)
    ax.axhline(np.mean(data["renyi"]), color=COLORS["reference"], ls=":", label="Rényi centers (mean)")
    top = max(data["clusters_softmax"].max(), data["clusters_sinkhorn"].max())
    ax.set_ylim(0, 1.5 * top)  # room for the legend above the curves
    ax.set_xlabel("$t$")
    ax.set_ylabel("clusters")
    ax.set_title(rf"$n = {cfg.n}$, $\beta = {cfg.beta:g}$, {cfg.seeds} seed{'s' if cfg.seeds > 1 else ''}")
    ax.legend(loc="upper right", fontsize=7)


def plot_causal(data: dict, cfg: CausalConfig):
    fig, axes = new_figure(3, 1, width=3.3, height=2.9)
    _diagonal_panel(axes[0, 0], data, cfg)
    _spread_panel(axes[0, 1], data, cfg)
    _cluster_panel(axes[0, 2], data, cfg)
    fig.suptitle("causal attention: token $i$ attends to $j \\leq i$", fontsize=9)
    return fig


register("causal_attention", compute=compute_causal, plot=plot_causal, quick=CausalConfig(),
         full=CausalConfig(n=200, beta=64.0, h=0.015, steps=2000, save_every=50, seeds=4),
         default=True,
         description="Causal Sinkhorn without collapse, and causal particle dynamics (one cluster, Rényi)",
         caption=("With uniform-attention targets, causal Sinkhorn no longer collapses onto the diagonal; "
                  "causal tokens then merge into one cluster at the linearized rate."))
