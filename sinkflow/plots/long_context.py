r"""Critical attention scaling and the selectivity threshold (docs/theory/long_context.md).

``long_context``: (left) the output cosine of one layer on equiangular tokens (:math:`\rho = 0.5`) against
:math:`\gamma/\gamma_c`, :math:`\beta_n = \gamma\log n`, closed form (:func:`sinkflow.equiangular_cosine`) for
growing ``n`` (the transition sharpens like :math:`1/\log n`), with SoftMax and Sinkhorn measured on random
tokens (:func:`sinkflow.critical_scaling`, ``d = 64``, seeds averaged) at ``n = 1000``;
(right) :math:`\log\beta^*_n` against :math:`\log n` (:func:`sinkflow.selectivity_threshold`: the median largest
weight is 1/2) for one SoftMax query, ``d = 3, 5, 9``, and the Sinkhorn plan of ``n`` queries (``d = 3``), fitted
slopes beside :math:`2/(d-1)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register


@dataclass(frozen=True)
class LongContextConfig:
    rho: float = 0.5
    ns: tuple = (1e2, 1e3, 1e4, 1e6, 1e9)
    measured_n: int = 1000
    measured_d: int = 64
    measured_gammas: int = 11
    seeds: int = 2
    dims: tuple = (3, 5, 9)
    selectivity_ns: tuple = (100, 300, 1000, 3000, 10_000)
    trials: int = 51
    sinkhorn_ns: tuple = (50, 100, 200)
    sinkhorn_trials: int = 1


def compute_long_context(cfg: LongContextConfig) -> dict:
    gamma_c = 1.0 / (1.0 - cfg.rho)
    ratio = np.linspace(0.3, 2.0, 400)
    data = {"ratio": ratio, "ns": np.array(cfg.ns),
            "closed_form": np.stack([sinkflow.equiangular_cosine(n, cfg.rho, ratio * gamma_c) for n in cfg.ns])}
    measured = np.linspace(0.3, 2.0, cfg.measured_gammas)
    data["measured_ratio"] = measured
    for name in ("softmax", "sinkhorn"):
        r = sinkflow.critical_scaling(cfg.measured_n, cfg.measured_d, cfg.rho, measured * gamma_c, attention=name,
                                      seeds=range(cfg.seeds))
        data[f"cosine_{name}"] = r.cosine
    data["measured_reference"] = sinkflow.equiangular_cosine(cfg.measured_n, cfg.rho, measured * gamma_c)
    ns = np.array(cfg.selectivity_ns, dtype=float)
    data["selectivity_ns"] = ns
    for d in cfg.dims:
        b = np.array([sinkflow.selectivity_threshold(int(n), d, trials=cfg.trials, seed=i) for i, n in enumerate(ns)])
        data[f"beta_softmax_d{d}"] = b
        data[f"slope_softmax_d{d}"] = np.array(np.polyfit(np.log(ns), np.log(b), 1)[0])
    sk = np.array(cfg.sinkhorn_ns, dtype=float)
    b = np.array([sinkflow.selectivity_threshold(int(n), 3, attention="sinkhorn", trials=cfg.sinkhorn_trials, seed=i)
                  for i, n in enumerate(sk)])
    data["sinkhorn_ns"], data["beta_sinkhorn_d3"] = sk, b
    data["slope_sinkhorn_d3"] = np.array(np.polyfit(np.log(sk), np.log(b), 1)[0])
    return data


def plot_long_context(data, cfg):
    from sinkflow.plots.style import COLORS, PALETTE, new_figure

    fig, axes = new_figure(2, 1, width=3.6, height=3.1)
    ax = axes[0][0]
    for k, (n, c) in enumerate(zip(data["ns"], data["closed_form"], strict=True)):
        ax.plot(data["ratio"], c, color=PALETTE[k % 6], lw=1.2, label=f"n = 1e{np.log10(n):.0f}")
    for name, marker in (("softmax", "o"), ("sinkhorn", "x")):
        ax.errorbar(data["measured_ratio"], data[f"cosine_{name}"].mean(0), yerr=data[f"cosine_{name}"].std(0),
                    fmt=marker, color=COLORS[name], ms=4, label=f"{name}, random, n = {cfg.measured_n}")
    ax.axvline(1.0, color="0.6", lw=0.8, ls=":")
    ax.axhline(cfg.rho, color="0.6", lw=0.8, ls=":")
    ax.set_xlabel(r"$\gamma/\gamma_c$,  $\beta_n = \gamma \log n$")
    ax.set_ylabel("output cosine")
    ax.set_title(rf"one layer, $\rho$ = {cfg.rho:g}: collapse -> identity")
    ax.legend(fontsize=6.5)
    ax = axes[0][1]
    for k, d in enumerate(cfg.dims):
        b, s = data[f"beta_softmax_d{d}"], float(data[f"slope_softmax_d{d}"])
        ax.loglog(data["selectivity_ns"], b, "o-", color=PALETTE[k], ms=4,
                  label=f"SoftMax d = {d}: slope {s:.2f} (2/(d-1) = {2 / (d - 1):.2f})")
    s = float(data["slope_sinkhorn_d3"])
    ax.loglog(data["sinkhorn_ns"], data["beta_sinkhorn_d3"], "x--", color=COLORS["sinkhorn"], ms=6,
              label=f"Sinkhorn plan d = 3: slope {s:.2f}")
    ax.set_xlabel("n keys")
    ax.set_ylabel(r"$\beta^*_n$ (median top weight = 1/2)")
    ax.set_title("selectivity threshold")
    ax.legend(fontsize=6.5)
    return fig


register("long_context", compute=compute_long_context, plot=plot_long_context, quick=LongContextConfig(),
         full=LongContextConfig(selectivity_ns=(100, 300, 1000, 3000, 10_000, 30_000, 100_000), trials=101, seeds=4,
                                sinkhorn_ns=(50, 100, 200, 400), sinkhorn_trials=2),
         default=False,
         description="Critical scaling beta_n = gamma log n (output cosine) and the selectivity threshold beta*_n",
         caption=("One layer collapses tokens below gamma_c = 1/(1 - rho) and leaves them near the input above, in a "
                  "window shrinking like 1/log n; beta*_n grows like n^(2/(d-1)) for one SoftMax query."))
