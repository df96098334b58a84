r"""The hardmax limit (docs/theory/hardmax.md): straight paths, the Frank-Wolfe rate, the finite-beta dwell.

``hardmax_limit``: (left) 2-D tokens under hardmax layers with a positive semidefinite :math:`B`: each token's
path (dots, every layer) and the predicted segment to its dominant point (:func:`sinkflow.hardmax_targets`);
(middle) negative semidefinite :math:`B = -I`, Frank-Wolfe steps :math:`h_t = 2/(t+2)`: the energy gap
:math:`E(t)` of :func:`sinkflow.frank_wolfe_energy` for several seeds beside the bound :math:`2C/(t+2)`;
(right) SoftMax at inverse temperature :math:`\beta`: layers spent near the hardmax targets
(:func:`sinkflow.hardmax_dwell`) against :math:`\beta`, with the fitted exponential rate and its 95% interval
(the paper proves exponential growth, no constant).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register


@dataclass(frozen=True)
class HardmaxConfig:
    n: int = 14
    h: float = 0.35
    steps: int = 30
    seed: int = 2
    energy_seeds: int = 3
    energy_steps: int = 100
    betas: tuple = (7.0, 7.5, 8.0, 8.5, 9.0)
    radius: float = 0.1


DWELL_TOKENS = ((1.0, 0.0), (-0.5, 0.8), (-0.5, -0.8), (0.3, 0.1))


def compute_hardmax(cfg: HardmaxConfig) -> dict:
    from scipy import stats

    rng = np.random.default_rng(cfg.seed)
    B = np.array([[1.0, 0.3], [0.3, 0.6]])
    x0 = rng.normal(size=(cfg.n, 2))
    pred = sinkflow.hardmax_targets(x0, B)
    paths = sinkflow.hardmax_flow(x0, B, cfg.h, cfg.steps)
    idx = np.flatnonzero(pred.predicted)
    rel = paths[:, idx] - pred.targets[idx]
    u = x0[idx] - pred.targets[idx]
    u = u / np.maximum(np.linalg.norm(u, axis=-1, keepdims=True), 1e-300)
    off_line = float(np.abs(rel - (rel * u).sum(-1, keepdims=True) * u).max())
    energies, bound = [], None
    for s in range(cfg.energy_seeds):
        X = sinkflow.hardmax_flow(np.random.default_rng(100 + s).normal(size=(12, 2)) + [0.5, 0.0], -np.eye(2),
                                  "frank-wolfe", cfg.energy_steps)
        E, b = sinkflow.frank_wolfe_energy(X, -np.eye(2))
        energies.append(E)
        bound = b if bound is None else np.maximum(bound, b)
    betas = np.array(cfg.betas)
    dwell = np.array([sinkflow.hardmax_dwell(DWELL_TOKENS, np.eye(2), b, radius=cfg.radius) for b in betas])
    fit = stats.linregress(betas, np.log(dwell))
    half = stats.t.ppf(0.975, len(betas) - 2) * fit.stderr
    return {"x0": x0, "B": B, "paths": paths, "targets": pred.targets, "predicted": pred.predicted,
            "stationary": pred.stationary, "off_line": np.array(off_line), "energy": np.array(energies),
            "bound": bound, "betas": betas, "dwell": dwell,
            "rate": np.array([fit.slope, fit.slope - half, fit.slope + half]), "intercept": np.array(fit.intercept)}


def plot_hardmax(data, cfg):
    from sinkflow.plots.style import COLORS, PALETTE, new_figure

    fig, axes = new_figure(3, 1, width=3.3, height=3.0)
    ax = axes[0][0]
    x0, paths, targets = data["x0"], data["paths"], data["targets"]
    for i in range(len(x0)):
        color = PALETTE[i % 6]
        if data["predicted"][i]:
            ax.plot(*np.stack([x0[i], targets[i]]).T, "-", color=color, lw=0.8, alpha=0.6)
        ax.plot(paths[:, i, 0], paths[:, i, 1], ".", color=color, ms=2.5)
    stay = data["stationary"]
    ax.plot(x0[stay, 0], x0[stay, 1], "k*", ms=9, label="stationary (own cell)")
    ax.set_aspect("equal")
    ax.set_xlabel("$x_1$")
    ax.set_ylabel("$x_2$")
    ax.set_title(f"PSD B: straight paths (off-line {float(data['off_line']):.0e})")
    ax.legend(loc="lower right", fontsize=7)
    ax = axes[0][1]
    t = np.arange(data["energy"].shape[1])
    for k, E in enumerate(data["energy"]):
        ax.loglog(t[1:], E[1:], color=PALETTE[k], lw=1.2, label="E(t)" if k == 0 else None)
    ax.loglog(t[1:], data["bound"][1:], "--", color=COLORS["bound"], label="2C/(t+2)")
    ax.set_xlabel("layer t")
    ax.set_ylabel("energy gap E(t)")
    ax.set_title("NSD B = -I, steps 2/(t+2)")
    ax.legend(fontsize=7)
    ax = axes[0][2]
    rate, lo, hi = data["rate"]
    ax.semilogy(data["betas"], data["dwell"], "o", color=COLORS["softmax"], label="SoftMax at beta")
    ax.semilogy(data["betas"], np.exp(float(data["intercept"]) + rate * data["betas"]), "-", color=COLORS["reference"],
                label=f"exp({rate:.2f} beta), 95%: {lo:.2f} to {hi:.2f}")
    ax.set_xlabel(r"$\beta$")
    ax.set_ylabel("layers near the hardmax targets")
    ax.set_title(f"finite beta: dwell (radius {cfg.radius:g})")
    ax.legend(fontsize=7)
    return fig


register("hardmax_limit", compute=compute_hardmax, plot=plot_hardmax, quick=HardmaxConfig(),
         full=HardmaxConfig(energy_seeds=8, energy_steps=300, betas=(7.0, 7.5, 8.0, 8.5, 9.0, 9.5, 10.0, 10.5)),
         default=False,
         description="Hardmax layers: straight paths (PSD B), Frank-Wolfe O(1/t) energy (NSD B), dwell against beta",
         caption=("PSD B: each token runs straight to its dominant point; NSD B: the energy gap stays below "
                  "Frank-Wolfe's 2C/(t+2); finite beta: the dwell near the hardmax targets grows like exp(c beta)."))
