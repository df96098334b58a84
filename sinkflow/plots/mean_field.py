r"""Figures of the mean-field equation (docs/theory/mean_field.md).

* ``mean_field_limits``: the two errors apart. Particles of :func:`sinkflow.heat_flow` ->
  the mean-field PDE at fixed :math:`\varepsilon` (W2 against :math:`n`, slope near -1/2), and
  the PDE -> the heat solution (density L1 against :math:`\varepsilon`, slope near 1).
* ``circle_metastable_clusters``: the PDE on the circle from a near-uniform start, the cluster
  count of SoftMax and Sinkhorn particles against :math:`\beta` beside the fastest linear mode
  :math:`k^*(\beta)`, and the energy staircase (one particle run, labelled with its count and its
  seeded prediction, which can differ from :math:`k^*`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register


def mixture() -> sinkflow.GaussianMixture:
    """The non-Gaussian start: two overlapping bumps (no empty valley, so W2 reaches its n^-1/2 regime early)."""
    return sinkflow.GaussianMixture.isotropic([0.4, 0.6], [[-1.0], [0.8]], [0.3, 0.5])


def cells(density, y: np.ndarray) -> np.ndarray:
    rho = density.pdf(y[:, None])
    return rho / (rho.sum() * (y[1] - y[0]))


# ---------------------------------------------------------------------------------------
# (a) the two limits


@dataclass(frozen=True)
class LimitsConfig:
    t: float = 0.25
    eps_for_n: float = 0.1
    dt: float = 0.05
    n_values: tuple = (64, 128, 256, 512)
    seeds: int = 6
    eps_values: tuple = (0.2, 0.1, 0.05)
    normalizations: tuple = ("sinkhorn", "softmax_gaussian")
    box: float = 6.0
    cells: int = 241
    seed: int = 0


def compute_limits(cfg: LimitsConfig) -> dict:
    g = mixture()
    y = np.linspace(-cfg.box, cfg.box, cfg.cells)
    h = y[1] - y[0]
    data = {"grid": y, "n": np.asarray(cfg.n_values, dtype=float), "eps": np.asarray(cfg.eps_values, dtype=float)}
    with sinkflow.torch_threads(1):
        pde = sinkflow.mean_field_flow(cells(g, y), y, [cfg.t], normalization="sinkhorn", eps=cfg.eps_for_n).final
        w2 = np.array([[sinkflow.heat.wasserstein2_to_grid(
            sinkflow.heat_flow(g.sample(n, 1000 * cfg.seed + s), cfg.t, cfg.eps_for_n, cfg.dt), pde, y)
            for s in range(cfg.seeds)] for n in cfg.n_values])
        data["pde"], data["w2"] = pde, w2
        data["w2_rms"] = np.sqrt((w2 ** 2).mean(1))
        data["n_slope"] = sinkflow.fit_loglog_slope(data["n"], data["w2_rms"])[0]
        for norm in cfg.normalizations:
            ref = sinkflow.heat_reference(g, cfg.t, norm).pdf(y[:, None])
            sols = [sinkflow.mean_field_flow(cells(g, y), y, [cfg.t], normalization=norm, eps=e).final
                    for e in cfg.eps_values]
            data[f"l1_{norm}"] = np.array([np.abs(s - ref).sum() * h for s in sols])
            data[f"eps_slope_{norm}"] = sinkflow.fit_loglog_slope(data["eps"], data[f"l1_{norm}"])[0]
            data[f"heat_{norm}"] = ref
            data[f"pde_{norm}"] = np.stack(sols)
    return data


def plot_limits(data, cfg):
    from sinkflow.plots.style import COLORS, LABELS, log_axes, loglog_panel, new_figure

    fig, axes = new_figure(3, 1, width=3.4, height=2.8)
    a, b, c = axes[0]
    y = data["grid"]
    a.plot(y, data["heat_sinkhorn"], color=COLORS["reference"], label=r"heat $\rho_0 * G_{2t}$")
    for e, sol in zip(data["eps"], data["pde_sinkhorn"], strict=True):
        a.plot(y, sol, lw=1, label=rf"PDE, $\varepsilon = {e:g}$")
    a.set_xlim(-4, 4)
    a.set_xlabel("$x$")
    a.set_ylabel(r"density $\rho_t(x)$")
    a.set_title(rf"Sinkhorn mean field at $t = {cfg.t:g}$")
    a.legend()
    loglog_panel(b, data["n"], data["w2"], data["n_slope"], COLORS["sinkhorn"], "rms", center=data["w2_rms"],
                 alpha=0.35)
    b.set_xlabel("$n$")
    b.set_ylabel(r"$W_2(\mu^n_t, \rho^\varepsilon_t)$")
    b.set_title(rf"particles $\to$ PDE ($\varepsilon = {cfg.eps_for_n:g}$; $-1/2$ expected)")
    b.legend()
    for norm, key in (("sinkhorn", "sinkhorn"), ("softmax_gaussian", "gaussian")):
        if f"l1_{norm}" in data:
            c.plot(data["eps"], data[f"l1_{norm}"], "o-", color=COLORS[key], ms=4,
                   label=f"{LABELS[norm]}: slope {data[f'eps_slope_{norm}']:.2f}")
    log_axes(c, data["eps"])
    c.set_xlabel(r"$\varepsilon$")
    c.set_ylabel(r"$\|\rho^\varepsilon_t - \rho^{\rm heat}_t\|_{L^1}$")
    c.set_title(r"PDE $\to$ heat (order 1 expected)")
    c.legend()
    return fig


register("mean_field_limits", compute=compute_limits, plot=plot_limits, quick=LimitsConfig(),
         full=LimitsConfig(n_values=(100, 200, 400, 800, 1600, 3200), seeds=16, eps_values=(0.4, 0.2, 0.1, 0.05, 0.025),
                           cells=481),
         default=True, description="The two errors apart: particles -> mean-field PDE in n, PDE -> heat in eps",
         caption=('The Sinkhorn layer has two limits, seen apart: particles approach the mean-field PDE as n '
                  'grows, and the PDE approaches the heat equation at first order in eps.'))


# ---------------------------------------------------------------------------------------
# (b) the circle: metastable clusters


@dataclass(frozen=True)
class ClustersConfig:
    beta_pde: float = 5.0
    cells: int = 256
    amplitude: float = 1e-3
    t_end: float = 30.0
    n_times: int = 61
    betas: tuple = (2.0, 3.0, 5.0, 8.0, 12.0)
    seeds: int = 3
    n: int = 256
    h: float = 0.05  # Euler step of the energy run
    h_counts: float = 0.1  # of the count runs: the 30 quick counts are those at h = 0.05 (measured), in half the steps
    normalization: str = "softmax"
    seed: int = 0


def _near_uniform(cfg: ClustersConfig, theta: np.ndarray) -> np.ndarray:
    """1/(2 pi) times 1 + a sum of random modes k = 1..8 of size ``amplitude`` (positive)."""
    rng = np.random.default_rng(cfg.seed)
    k = np.arange(1, 9)
    a, phase = rng.normal(size=k.size), rng.uniform(0, 2 * np.pi, k.size)
    rho = 1 + cfg.amplitude * (a[:, None] * np.cos(k[:, None] * theta[None] + phase[:, None])).sum(0)
    return rho / (rho.sum() * 2 * np.pi / theta.size)


def _equal_clusters_energy(k: int, beta: float) -> float:
    """E_beta of k equal point clusters at the vertices of a regular k-gon."""
    angles = 2 * np.pi * np.arange(k) / k
    return float(np.exp(beta * np.cos(angles[:, None] - angles[None])).sum() / (2 * beta * k * k))


def compute_clusters(cfg: ClustersConfig) -> dict:
    import sinkflow.clustering as cs
    from sinkflow.bounds import binomial_interval
    from sinkflow.heat import uniform_angles

    theta = uniform_angles(cfg.cells)
    times = np.linspace(0, cfg.t_end, cfg.n_times)
    with sinkflow.torch_threads(1):
        r = sinkflow.mean_field_flow(_near_uniform(cfg, theta), theta, times, normalization=cfg.normalization,
                                     temperature=1 / cfg.beta_pde, manifold="circle")
        seeds = [1000 * cfg.seed + s for s in range(cfg.seeds)]  # one ensemble per beta
        counts = {norm: np.array([cs.particle_cluster_count(b, seeds, cfg.n, norm, h=cfg.h_counts) for b in cfg.betas])
                  for norm in ("softmax", "sinkhorn")}
        # one particle run at beta_pde for the energy staircase, with its own prediction
        th0 = np.random.default_rng(cfg.seed).uniform(0, 2 * np.pi, cfg.n)
        steps = int(round(cfg.t_end / cfg.h))
        traj = sinkflow.simulate(np.stack([np.cos(th0), np.sin(th0)], 1), cfg.normalization, h=cfg.h, steps=steps,
                                 manifold="sphere", temperature=1 / cfg.beta_pde, monitors=["energy"],
                                 monitor_every=max(1, steps // 200), save_every=steps)
    beta_fine = np.linspace(min(cfg.betas), max(cfg.betas), 200)
    k_star = {norm: np.array([cs.fastest_mode(b, norm) for b in cfg.betas]) for norm in ("softmax", "sinkhorn")}
    agree = {norm: int((counts[norm] == k_star[norm][:, None]).sum()) for norm in counts}
    runs = counts["softmax"].size
    return {"theta": theta, "times": times, "densities": r.densities,
            "pde_counts": np.array([cs.count_clusters(d) for d in r.densities]),
            "pde_energy": np.array([cs.circle_energy(d, cfg.beta_pde) for d in r.densities]),
            "particle_energy": traj.monitors["energy"], "particle_energy_times": traj.monitor_times,
            "particle_count": cs.count_clusters(cs.angular_density(np.arctan2(traj.final[:, 1], traj.final[:, 0]))),
            "particle_seeded_count": cs.predict_clusters(th0, cfg.beta_pde, cfg.normalization).seeded_count,
            "betas": np.asarray(cfg.betas), "counts": counts["softmax"], "counts_sinkhorn": counts["sinkhorn"],
            "k_star": k_star["softmax"], "k_star_sinkhorn": k_star["sinkhorn"],
            "cluster_levels": np.array([_equal_clusters_energy(k, cfg.beta_pde) for k in range(1, 5)]),
            "beta_fine": beta_fine, "k_star_fine": np.array([cs.fastest_mode(b, cfg.normalization) for b in beta_fine]),
            "k_star_sinkhorn_fine": np.array([cs.fastest_mode(b, "sinkhorn") for b in beta_fine]),
            "agree": np.array([agree["softmax"], agree["sinkhorn"]]), "runs": runs,
            "agree_intervals": np.array([binomial_interval(agree[k], runs) for k in ("softmax", "sinkhorn")])}


def plot_clusters(data, cfg):
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import MaxNLocator

    from sinkflow.plots.style import COLORS, LABELS, new_figure

    fig, axes = new_figure(3, 1, width=3.8, height=3.1)
    a, b, c = axes[0]
    rho = np.clip(data["densities"] * 2 * np.pi, 0.1, None)  # log scale: the formation (rho ~ 1) stays visible
    im = a.pcolormesh(data["theta"], data["times"], rho, shading="nearest", cmap="viridis", norm=LogNorm(vmin=0.1),
                     rasterized=True)  # 15 000 cells: an image in the PDF
    fig.colorbar(im, ax=a).ax.set_title(r"$2\pi\rho$ (log)", fontsize=8)  # above the bar: off panel (b)'s label
    a.set_xlabel(r"$\theta$")
    a.set_ylabel("$t$")
    k_star = sinkflow.fastest_mode(cfg.beta_pde, cfg.normalization)
    a.set_title(rf"mean field, $\beta = {cfg.beta_pde:g}$ ($k^* = {k_star:d}$)", fontsize=9)
    spread = np.linspace(-0.12, 0.12, data["counts"].shape[1])
    for key, norm, shift in (("counts", "softmax", -0.12), ("counts_sinkhorn", "sinkhorn", 0.12)):
        for k in range(data[key].shape[1]):
            b.plot(data["betas"] * (1 + 0.04 * (spread[k] + shift)), data[key][:, k] + 0.06 * np.sign(shift), "o",
                   color=COLORS[norm], alpha=0.6, ms=4,
                   label=f"{LABELS[norm]} particles (one per seed)" if k == 0 else None)
    b.step(data["beta_fine"], data["k_star_fine"], where="mid", color=COLORS["softmax"], label=r"$k^*(\beta)$ SoftMax")
    b.step(data["beta_fine"], data["k_star_sinkhorn_fine"], where="mid", color=COLORS["sinkhorn"], ls="--", lw=1,
           label=r"$k^*(\beta)$ Sinkhorn")
    b.set_xlabel(r"$\beta$")
    b.set_ylabel("clusters at the plateau ($t = 2 t_f$)")
    b.yaxis.set_major_locator(MaxNLocator(integer=True))
    (lo_s, hi_s), (lo_k, hi_k) = data["agree_intervals"]
    runs = int(data["runs"])
    b.set_title(f"particles (n = {cfg.n}): counts against $k^*$", fontsize=9)
    b.text(0.97, 0.03, f"count = $k^*$ (95% interval):\nSoftMax {data['agree'][0]}/{runs} [{100 * lo_s:.0f}, "
           f"{100 * hi_s:.0f}]%\nSinkhorn {data['agree'][1]}/{runs} [{100 * lo_k:.0f}, {100 * hi_k:.0f}]%",
           transform=b.transAxes, ha="right", va="bottom", fontsize=7)
    b.legend(fontsize=7, loc="upper left")
    _energy_panel(c, data, cfg, COLORS)
    return fig


def _energy_panel(c, data, cfg, COLORS):
    """The energy staircase: the mean field (a 1e-3 start) and one particle run (an i.i.d. start, whose
    count can differ from k*: its seeded count says which mode was ahead at the start)."""
    c.plot(data["particle_energy_times"], data["particle_energy"], color=COLORS["softmax"],
           label=f"particles, n = {cfg.n}: {int(data['particle_count'])} clusters\n"
                 f"(predicted from their start: {int(data['particle_seeded_count'])})")
    c.plot(data["times"], data["pde_energy"], color=COLORS["reference"], ls="--",
           label=f"mean field: {int(data['pde_counts'][-1])} clusters")
    for k in range(1, 5):  # k equal point clusters: E = e^beta / (2 beta k) + O(1/k^2) cross terms
        level = data["cluster_levels"][k - 1]
        c.axhline(level, color=COLORS["reference"], lw=0.5, alpha=0.4)
        c.annotate(f"{k}", xy=(1.01, level), xycoords=("axes fraction", "data"), va="center", fontsize=7)
    c.set_xlabel("$t$")
    c.set_ylabel(r"$E_\beta$ (grey: $k$ clusters, at right)")
    c.set_title(rf"energy staircase, $\beta = {cfg.beta_pde:g}$")
    c.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))  # below: off the plateaus


register("circle_metastable_clusters", compute=compute_clusters, plot=plot_clusters, quick=ClustersConfig(),
         full=ClustersConfig(cells=512, betas=(1.5, 2.0, 3.0, 4.0, 5.0, 6.5, 8.0, 10.0, 12.0, 16.0, 20.0), seeds=10,
                             n=512, h_counts=0.05),
         default=True,
         description="Circle: near-uniform starts cluster into k*(beta) metastable clusters (linear stability)",
         caption=('From a near-uniform start on the circle the fastest-growing mode k*(beta) sets how many clusters '
                  'form first; particles mostly agree, Sinkhorn less often, and the energy climbs a staircase.'))
