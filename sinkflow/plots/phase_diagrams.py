r"""The clustering phase diagram on the circle, SoftMax beside Sinkhorn (:func:`sinkflow.phase_diagram`).

``clustering_phase_diagram``: systems of ``n = 32`` tokens uniform on the circle (``d = 2``), the
fraction whose tokens all have pairwise inner products above 0.999, against :math:`\beta` and
:math:`t` (Geshkovski, Letrouit, Polyanskiy, Rigollet, "A mathematical perspective on
Transformers"; their ``phase-diagrams.py``). Full configuration: 2,048 systems x 90 values of
:math:`\beta` in [0.1, 9], Euler steps of 0.1 up to the horizon :math:`t = 30`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register

LABELS = {"softmax": "SoftMax", "sinkhorn": "Sinkhorn"}


@dataclass(frozen=True)
class PhaseConfig:
    betas: int = 10
    beta_range: tuple = (0.1, 9.0)
    systems: int = 32
    n: int = 32
    horizon: float = 30.0
    dt_saved: float = 1.0
    h: float = 0.1
    threshold: float = 0.999
    normalizations: tuple = ("softmax", "sinkhorn")
    seed: int = 0


def compute_phase(cfg: PhaseConfig) -> dict:
    betas = np.linspace(*cfg.beta_range, cfg.betas)
    times = np.arange(0.0, cfg.horizon + cfg.dt_saved / 2, cfg.dt_saved)
    data = {"beta": betas, "t": times}
    with sinkflow.torch_threads(1):
        for norm in cfg.normalizations:
            table = sinkflow.phase_diagram(betas, n=cfg.n, d=2, normalization=norm, systems=cfg.systems, times=times,
                                           threshold=cfg.threshold, seed=cfg.seed, h=cfg.h, progress=False)
            data[f"fraction_{norm}"] = table.clustered_fraction.to_numpy().reshape(len(betas), len(times))
    return data


def plot_phase(data, cfg):
    from sinkflow.plots.style import new_figure

    fig, axes = new_figure(len(cfg.normalizations), 1, width=3.3, height=2.8)
    for ax, norm in zip(axes[0], cfg.normalizations):
        im = ax.pcolormesh(data["beta"], data["t"], data[f"fraction_{norm}"].T, shading="nearest", cmap="magma",
                           vmin=0, vmax=1)
        ax.set_xlabel(r"$\beta$")
        ax.set_ylabel("$t$")
        ax.set_title(f"{LABELS[norm]}: {cfg.systems} systems x {cfg.betas} " + r"$\beta$")
    fig.colorbar(im, ax=axes[0].tolist(), label="fraction clustered")
    fig.suptitle(f"n = {cfg.n} tokens on the circle, one cluster = all inner products > {cfg.threshold:g}; "
                 f"horizon t = {cfg.horizon:g}", fontsize=8)
    return fig


register("clustering_phase_diagram", compute=compute_phase, plot=plot_phase, quick=PhaseConfig(),
         full=PhaseConfig(betas=90, systems=2048, dt_saved=0.5), default=False,
         description="Circle: fraction of clustered systems against beta and t, SoftMax beside Sinkhorn (GLPR)")
