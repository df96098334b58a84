r"""Normalization placements (docs/theory/placements.md): how fast tokens cluster, and how far from collapse they
stay, under Post-LN, Pre-LN, Peri-LN, Mix-LN, nGPT and LN-scaling (Karagodin, Ge, Polyanskiy and Rigollet 2025),
SoftMax and Sinkhorn side by side.

Each panel: :math:`1 - \bar\rho(t)` (:math:`\bar\rho` the mean pairwise inner product of the directions
:math:`x_i/|x_i|`) of ``n`` tokens from uniform random starts on the sphere, the continuous model of each
placement (``simulate(..., norm=..., integrator="rk4")``), median over seeds with the 10-90% band; dashed, the
exact equiangular flow from :math:`\rho_0 = 0` (:func:`sinkflow.equiangular_flow`), the reference rates.
Small :math:`1 - \bar\rho` late is collapse; a fast early drop is fast clustering.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register
from sinkflow.plots.style import LABELS, new_figure

ATTENTIONS = ("softmax", "sinkhorn")
NORMS = ("post", "pre", "peri", "mix", "ngpt", "lnscale")
NORM_LABELS = {"post": "Post-LN", "pre": "Pre-LN", "peri": "Peri-LN", "mix": "Mix-LN", "ngpt": "nGPT",
               "lnscale": "LN-scaling"}
NORM_COLORS = {"post": "#000000", "pre": "#0072B2", "peri": "#D55E00", "mix": "#009E73", "ngpt": "#CC79A7",
               "lnscale": "#E69F00"}


@dataclass(frozen=True)
class PlacementsConfig:
    n: int = 16  # tokens, uniform on S^(d-1)
    d: int = 16
    beta: float = 2.0
    h: float = 0.05  # RK4 (the continuous models)
    T: float = 8.0
    save_every: int = 4
    seeds: int = 8
    seed: int = 0


def _mean_inner(positions: np.ndarray) -> np.ndarray:
    """The mean off-diagonal inner product of the directions, per saved state and system."""
    theta = positions / np.linalg.norm(positions, axis=-1, keepdims=True)
    n = positions.shape[-2]
    G = theta @ np.swapaxes(theta, -1, -2)
    return (G.sum((-1, -2)) - np.trace(G, axis1=-2, axis2=-1)) / (n * (n - 1))


def compute_placements(cfg: PlacementsConfig) -> dict:
    x0 = np.stack([sinkflow.random_particles(cfg.n, cfg.d, seed=cfg.seed + s, manifold="sphere")
                   for s in range(cfg.seeds)])
    steps = round(cfg.T / cfg.h)
    out = {}
    for kind in ATTENTIONS:
        for norm in NORMS:
            tr = sinkflow.simulate(x0, kind, h=cfg.h, steps=steps, integrator="rk4", temperature=1 / cfg.beta,
                                   norm=norm, save_every=cfg.save_every)
            gap = 1 - _mean_inner(np.asarray(tr.positions))  # (saved, seeds)
            out[f"gap_{kind}_{norm}"] = gap.T
            out["times"] = np.asarray(tr.times)[:, 0] if np.ndim(tr.times) > 1 else np.asarray(tr.times)
            flow = sinkflow.equiangular_flow(cfg.n, 0.0, beta=cfg.beta, attention=kind, norm=norm, T=cfg.T, h=cfg.h)
            out[f"equiangular_{kind}_{norm}"] = 1 - flow.rho[::cfg.save_every]
    return out


def _panel(ax, data, kind, cfg):
    t = data["times"]
    for norm in NORMS:
        gap = data[f"gap_{kind}_{norm}"]
        color = NORM_COLORS[norm]
        ax.semilogy(t, np.median(gap, 0), color=color, lw=1.4, label=NORM_LABELS[norm])
        if len(gap) > 1:
            ax.fill_between(t, np.quantile(gap, 0.1, 0), np.quantile(gap, 0.9, 0), color=color, alpha=0.15, lw=0)
        ax.semilogy(t, data[f"equiangular_{kind}_{norm}"], color=color, lw=0.8, ls="--")
    ax.set_xlabel("$t$ (depth)")
    ax.set_ylabel(r"$1 - \bar\rho$ (mean $1 - \langle\theta_i, \theta_j\rangle$)")
    ax.set_title(rf"{LABELS[kind]}, $n = d = {cfg.n}$, $\beta = {cfg.beta:g}$, {cfg.seeds} seeds")
    ax.set_xlim(0, t[-1])


def plot_placements(data: dict, cfg: PlacementsConfig):
    fig, axes = new_figure(2, 1, width=3.6, height=3.0)
    for j, kind in enumerate(ATTENTIONS):
        _panel(axes[0, j], data, kind, cfg)
    lo = min(min(data[k].min() for k in data if k.startswith(("gap_", "equiangular_"))), 1e-3)
    for ax in axes[0]:
        ax.set_ylim(max(lo, 1e-8) / 2, 2)
    axes[0, 0].legend(loc="lower left", fontsize=7, ncol=2, title="solid: random starts; dashed: equiangular",
                      title_fontsize=6)
    fig.suptitle("normalization placements: clustering speed and collapse", fontsize=9)
    return fig


register("norm_placements", compute=compute_placements, plot=plot_placements, quick=PlacementsConfig(),
         full=PlacementsConfig(seeds=32, T=12.0), default=False,
         description="Clustering speed and collapse under Post-/Pre-/Peri-/Mix-LN, nGPT and LN-scaling",
         caption=("Post-LN and nGPT collapse exponentially, Pre-, Peri-, Mix-LN and LN-scaling polynomially; "
                  "Peri-LN and nGPT cluster fastest early. Dashed: the exact equiangular flow."))
