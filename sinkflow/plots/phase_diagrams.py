r"""The clustering phase diagram on the circle, SoftMax beside Sinkhorn (:func:`sinkflow.phase_diagram`).

``clustering_phase_diagram``: systems of ``n = 32`` tokens uniform on the circle (``d = 2``), the
fraction whose tokens all have pairwise inner products above 0.999, against :math:`\beta` and
:math:`t` (Geshkovski, Letrouit, Polyanskiy, Rigollet, "A mathematical perspective on
Transformers"; their ``phase-diagrams.py``). Full configuration: 2,048 systems x 90 values of
:math:`\beta` in [0.1, 9], Euler steps of 0.1 through the transients and angle-limited steps on
the metastable plateaus (``max_angle = 0.02``, :func:`sinkflow.phase_diagram`), up to the horizon
:math:`t = 10^9`, where the largest :math:`\beta` has clustered: half its systems cluster by
:math:`t = 1.3 \cdot 10^7` (SoftMax) and :math:`2.5 \cdot 10^7` (Sinkhorn); the half-clustered time
grows like :math:`e^{1.9 \beta}` above :math:`\beta \approx 2`. Times on a log grid (10 per
decade from 0.1). The full configuration took 14.6 minutes of CPU on one core (49.5 minutes
wall on a shared 2-core machine at load 3-10).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register


@dataclass(frozen=True)
class PhaseConfig:
    betas: int = 8
    beta_range: tuple = (0.1, 9.0)
    systems: int = 32
    n: int = 32
    horizon: float = 1e9
    t_first: float = 0.1
    per_decade: int = 5
    h: float = 0.1
    max_angle: float = 0.02
    threshold: float = 0.999
    normalizations: tuple = ("softmax", "sinkhorn")
    seed: int = 0


def compute_phase(cfg: PhaseConfig) -> dict:
    betas = np.linspace(*cfg.beta_range, cfg.betas)
    decades = np.log10(cfg.horizon / cfg.t_first)
    times = np.geomspace(cfg.t_first, cfg.horizon, int(round(decades * cfg.per_decade)) + 1)
    data = {"beta": betas, "t": times, "systems": np.array(cfg.systems)}
    with sinkflow.torch_threads(1):
        for norm in cfg.normalizations:
            # sinkflow.phase_diagram's numbers without its pandas table: the figure runs on a bare install
            _, _, data[f"fraction_{norm}"] = sinkflow.clustered_fractions(
                betas, n=cfg.n, d=2, normalization=norm, systems=cfg.systems, times=times, threshold=cfg.threshold,
                seed=cfg.seed, h=cfg.h, max_angle=cfg.max_angle, progress=False)
    return data


def plot_phase(data, cfg):
    from sinkflow.plots.style import LABELS, new_figure

    fig, axes = new_figure(len(cfg.normalizations), 1, width=3.3, height=3.0)
    for ax, norm in zip(axes[0], cfg.normalizations, strict=True):
        fraction = data[f"fraction_{norm}"].T
        im = ax.pcolormesh(data["beta"], data["t"], fraction, shading="nearest", cmap="magma", vmin=0, vmax=1)
        ax.contour(data["beta"], data["t"], fraction, levels=[0.5], colors="cyan", linewidths=1.0)
        ax.set_yscale("log")
        ax.set_xlabel(r"$\beta$")
        ax.set_ylabel("$t$")
        ax.set_title(f"{LABELS[norm]} ({int(data['systems'])} systems x {len(data['beta'])} " + r"$\beta$)")
    fig.colorbar(im, ax=axes[0].tolist(), label="fraction clustered (cyan: 1/2)")
    fig.suptitle(f"n = {cfg.n} tokens on the circle; clustered: all inner products > {cfg.threshold:g}; "
                 f"horizon $t = 10^{{{np.log10(cfg.horizon):.0f}}}$", fontsize=8)
    return fig


register("clustering_phase_diagram", compute=compute_phase, plot=plot_phase, quick=PhaseConfig(),
         full=PhaseConfig(betas=90, systems=2048, per_decade=10), default=False,
         description="Circle: fraction of clustered systems against beta and t, SoftMax beside Sinkhorn (GLPR)",
         caption=("The time to one cluster grows exponentially with beta: at beta = 9 half of 2,048 systems cluster "
                  "by t = 1.3e7 (SoftMax) and 2.5e7 (Sinkhorn); horizon t = 1e9."))
