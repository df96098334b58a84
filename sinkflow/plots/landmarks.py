r"""Figures of landmark-approximated (Nyström) attention flows against the exact ones.

- ``landmark_flow_errors`` (default): for one start and a range of ``m``, the Nyström spectral
  error and the field error, the trajectory deviation with its discrete Grönwall bound, the
  energy :math:`F^\infty` along the approximate Sinkhorn flows, and the heat-limit variance
  error of the landmark heat layer as ``n`` grows (:mod:`sinkflow.landmark_errors`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinkflow.plots.registry import register

__all__ = ["LandmarkErrorsConfig"]


@dataclass(frozen=True)
class LandmarkErrorsConfig:
    """One start of ``n`` particles in 2D, Euler steps ``h``, landmark counts, heat sizes."""

    n: int = 12
    landmarks: tuple = (4, 8, 12)
    h: float = 0.05
    steps: int = 4
    heat_sizes: tuple = (100, 400)
    heat_landmarks: int = 32
    seed: int = 0


def compute_errors(cfg: LandmarkErrorsConfig) -> dict:
    import sinkflow
    from sinkflow.landmark_errors import heat_variance_errors, landmark_flow_errors

    x0 = sinkflow.random_particles(cfg.n, 2, seed=cfg.seed)
    r = landmark_flow_errors(x0, cfg.landmarks, h=cfg.h, steps=cfg.steps)
    heat = heat_variance_errors(cfg.heat_sizes, cfg.heat_landmarks, seed=cfg.seed)
    return dict(landmarks=r.landmarks, times=r.times, spectral=r.spectral_error, field=r.field_error,
                deviation=r.deviation, bound=r.bound, lipschitz=r.lipschitz, energy=r.energy,
                energy_exact=r.energy_exact, heat_sizes=np.array(cfg.heat_sizes), heat_error=heat)


def plot_errors(data: dict, cfg: LandmarkErrorsConfig):
    from sinkflow.plots.style import COLORS, PALETTE, new_figure

    fig, axes = new_figure(4, 1, width=3.1, height=2.8)
    ax = axes[0, 0]
    m = data["landmarks"]
    floor = 1e-16
    ax.semilogy(m, np.maximum(data["spectral"], floor), "o-", color=COLORS["gaussian"], label=r"$\|G-\tilde G\|_2/\|G\|_2$")
    ax.semilogy(m, np.maximum(data["field"], floor), "s--", color=COLORS["sinkhorn"], label=r"field error $\delta_m$")
    ax.set_xlabel(r"landmarks $m$ ($m = n$: exact)")
    ax.set_title(f"errors at the start, n = {cfg.n}")
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    for i, mi in enumerate(m[:-1]):
        c = PALETTE[i % len(PALETTE)]
        ax.semilogy(data["times"][1:], data["deviation"][i, 1:], "-", color=c, label=f"m = {mi}")
        ax.semilogy(data["times"][1:], data["bound"][i, 1:], ":", color=c)
    ax.set_xlabel("t")
    ax.set_title(rf"deviation (—) and Grönwall bound (···), $L \approx {data['lipschitz']:.1f}$")
    ax.legend(fontsize=7)
    ax = axes[0, 2]
    ax.plot(data["times"], data["energy_exact"], color=COLORS["reference"], label="exact")
    for i, mi in enumerate(m[:-1]):
        ax.plot(data["times"], data["energy"][i], "--", color=PALETTE[i % len(PALETTE)], label=f"m = {mi}")
    ax.set_xlabel("t")
    ax.set_title(r"$F^\infty$ along the approximate flows")
    ax.legend(fontsize=7)
    ax = axes[0, 3]
    ax.loglog(data["heat_sizes"], data["heat_error"], "o-", color=COLORS["sinkhorn"])
    ax.set_xlabel("particles n")
    ax.set_title(f"heat layer, m = {cfg.heat_landmarks}: |var growth - 2t|")
    return fig


register("landmark_flow_errors", compute=compute_errors, plot=plot_errors, quick=LandmarkErrorsConfig(),
         full=LandmarkErrorsConfig(n=128, landmarks=(8, 16, 32, 64, 128), steps=40,
                                   heat_sizes=(1000, 10_000, 100_000), heat_landmarks=256),
         description="Nyström-approximated Sinkhorn flows: spectral and field error, deviation with Grönwall "
                     "bound, F^inf, heat variance error vs n")
