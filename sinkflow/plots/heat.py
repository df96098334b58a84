r"""Figures of the heat-diffusion limit (docs/theory/heat_limit.md).

* ``heat_snapshots``: Sinkhorn particles against the exact heat solution (1D and 2D,
  Gaussian-mixture start).
* ``heat_normalizations``: W2 to the heat solution over time for the four
  normalizations, and each kernel against its own limit.
* ``heat_convergence``: observed orders in eps (bias), n (Monte Carlo) and dt (Euler).
* ``heat_barycentric``: :math:`(B_\varepsilon(x) - x)/(\varepsilon/2)` against the score.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register

COLOR_KEYS = {"sinkhorn": "sinkhorn", "softmax_gaussian": "gaussian", "softmax_dot": "softmax",
              "unnormalized": "unnormalized"}


def mixture_1d() -> sinkflow.GaussianMixture:
    """The 1D start used throughout: a bimodal mixture."""
    return sinkflow.GaussianMixture.isotropic([0.35, 0.65], [[-1.5], [1.0]], [0.15, 0.4])


def mixture_2d() -> sinkflow.GaussianMixture:
    """The 2D start: three anisotropic bumps."""
    return sinkflow.GaussianMixture([0.3, 0.3, 0.4], [[-1.5, 0.0], [1.0, 1.2], [0.8, -1.0]],
                           [[[0.15, 0.0], [0.0, 0.3]], [[0.2, 0.1], [0.1, 0.2]], [[0.3, -0.1], [-0.1, 0.15]]])


# ---------------------------------------------------------------------------------------
# (a) snapshots


@dataclass(frozen=True)
class SnapshotConfig:
    n_1d: int = 600
    n_2d: int = 400
    eps_1d: float = 0.05
    eps_2d: float = 0.1
    dt: float = 0.0125
    times: tuple = (0.0, 0.1, 0.3)
    seed: int = 0


def compute_snapshots(cfg: SnapshotConfig) -> dict:
    data = {"times": np.asarray(cfg.times)}
    g1, g2 = mixture_1d(), mixture_2d()
    grid = np.linspace(-4.5, 4.5, 361)
    ax = np.linspace(-4, 4, 121)
    mesh = np.stack(np.meshgrid(ax, ax, indexing="ij"), -1).reshape(-1, 2)
    with sinkflow.torch_threads(1):  # docs/performance.md: two threads on a busy 2-vCPU machine are slower
        r1 = sinkflow.heat_trajectory(g1.sample(cfg.n_1d, cfg.seed), cfg.times, cfg.eps_1d, cfg.dt)
        r2 = sinkflow.heat_trajectory(g2.sample(cfg.n_2d, cfg.seed + 1), cfg.times, cfg.eps_2d, cfg.dt)
    data["x1d"] = r1.positions[:, :, 0]
    data["x2d"] = r2.positions
    data["grid"] = grid
    data["axis2d"] = ax
    data["pdf1d"] = np.stack([g1.evolve(t).pdf(grid) for t in cfg.times])
    data["pdf2d"] = np.stack([g2.evolve(t).pdf(mesh).reshape(ax.size, ax.size) for t in cfg.times])
    data["w2_1d"] = np.array([sinkflow.wasserstein2(x[:, None], g1.evolve(t)).value
                              for x, t in zip(data["x1d"], cfg.times, strict=True)])
    return data


def plot_snapshots(data, cfg):
    from sinkflow.plots.style import COLORS, new_figure

    times = data["times"]
    fig, axes = new_figure(len(times), 2, width=2.8, height=2.5)
    for k, t in enumerate(times):
        a = axes[0, k]
        a.hist(data["x1d"][k], bins=40, density=True, color=COLORS["sinkhorn"], alpha=0.45, label="Sinkhorn particles")
        a.plot(data["grid"], data["pdf1d"][k], color=COLORS["reference"], label=r"$\rho_0 * G_{2t}$")
        a.set_title(f"$t = {t:g}$,  $W_2 = {data['w2_1d'][k]:.3f}$")
        a.set_xlabel("$x$")
        a.set_ylabel(r"density $\rho_t(x)$")
        b = axes[1, k]
        x = data["x2d"][k]
        b.scatter(x[:, 0], x[:, 1], s=3, color=COLORS["sinkhorn"], alpha=0.6, lw=0, rasterized=True)
        ax = data["axis2d"]
        b.contour(ax, ax, data["pdf2d"][k].T, levels=6, colors=COLORS["reference"], linewidths=0.7)
        b.set_aspect("equal")
        b.set_xlabel("$x_1$")
        b.set_ylabel("$x_2$")
    axes[0, 0].legend(loc="upper left")
    fig.suptitle(rf"Sinkhorn attention flow vs heat equation ($n = {cfg.n_1d}$, $\varepsilon = {cfg.eps_1d:g}$ in 1D; "
                 rf"$n = {cfg.n_2d}$, $\varepsilon = {cfg.eps_2d:g}$ in 2D)")
    fig.supxlabel(rf"$W_2$: distance of the {cfg.n_1d} particles to the exact density. At $t = 0$ it is the "
                  "sampling error of the i.i.d. start alone (it varies from draw to draw), not an error of the flow.",
                  fontsize=7)  # a note under the panels, inside the layout (the figure is drawn once)
    return fig


register("heat_snapshots", compute=compute_snapshots, plot=plot_snapshots, quick=SnapshotConfig(),
         full=SnapshotConfig(n_1d=4000, n_2d=1500, eps_1d=0.02, eps_2d=0.05, dt=0.005, times=(0.0, 0.1, 0.3, 0.6)),
         default=True, description="Sinkhorn particles against the exact heat solution, 1D and 2D mixtures",
         caption=('Sinkhorn attention particles follow the exact heat solution in 1D and 2D: '
                  'histograms and scatter match the heat density at every time shown.'))


# ---------------------------------------------------------------------------------------
# (b) four normalizations


@dataclass(frozen=True)
class NormalizationsConfig:
    n: int = 500
    eps: float = 0.1
    dt: float = 0.0125
    dt_dot: float = 0.004  # SoftMax-dot moves at ~var/eps^2; both steps are capped at largest_safe_dt
    t_end: float = 1.0
    n_times: int = 6
    n_pme: int = 500
    eps_pme: float = 0.02
    floor_draws: int = 8  # independent i.i.d. samples behind the floor band
    seed: int = 0


def compute_normalizations(cfg: NormalizationsConfig) -> dict:
    from sinkflow.heat import NORMALIZATIONS, largest_safe_dt

    g = mixture_1d()
    times = np.linspace(0, cfg.t_end, cfg.n_times)
    x0 = g.sample(cfg.n, cfg.seed)
    data = {"times": times}
    with sinkflow.torch_threads(1):  # docs/performance.md: two threads on a busy 2-vCPU machine are slower
        for norm in NORMALIZATIONS:
            dt = min(cfg.dt_dot if norm == "softmax_dot" else cfg.dt, largest_safe_dt(x0, cfg.eps, norm))
            pos = sinkflow.heat_trajectory(x0, times, cfg.eps, dt, norm).positions
            data[f"w2_heat_{norm}"] = np.array([sinkflow.wasserstein2(p, g.evolve(t)).value
                                                for p, t in zip(pos, times, strict=True)])
            if norm == "softmax_gaussian":
                data[f"w2_own_{norm}"] = np.array([sinkflow.wasserstein2(p, sinkflow.heat_reference(g, t, norm)).value
                                                   for p, t in zip(pos, times, strict=True)])
        data["w2_floor"] = _iid_floor([g.evolve(t) for t in times], cfg.n, cfg.floor_draws, cfg.seed + 7)
        # porous medium: Barenblatt start, unnormalized kernel vs its own limit; Sinkhorn for contrast
        b = sinkflow.Barenblatt(dim=1, time=0.3)
        xb = b.sample(cfg.n_pme, cfg.seed + 2)
        for norm in ("unnormalized", "sinkhorn"):
            dt = min(cfg.dt, largest_safe_dt(xb, cfg.eps_pme, norm))
            pos = sinkflow.heat_trajectory(xb, times, cfg.eps_pme, dt, norm).positions
            data[f"w2_pme_{norm}"] = np.array([
                sinkflow.wasserstein2(p, sinkflow.heat_reference(b, t, "unnormalized")).value
                for p, t in zip(pos, times, strict=True)])
        data["w2_pme_floor"] = _iid_floor([sinkflow.heat_reference(b, t, "unnormalized") for t in times], cfg.n_pme,
                                          cfg.floor_draws, cfg.seed + 9)
    return data


def _iid_floor(references, n, draws, seed) -> np.ndarray:
    """W2 of ``draws`` independent i.i.d. ``n``-samples to each reference: array (times, draws)."""
    return np.array([[sinkflow.wasserstein2(ref.sample(n, seed + 1000 * k), ref).value for k in range(draws)]
                     for ref in references])


def _floor_band(ax, t, floor, label):
    """Median and range of the i.i.d. floor. A single sample's W2 varies a lot from draw to draw
    (for a mixture, mostly through how the n points split between the modes), so the flow's
    error at t = 0, its own initial sample's, is one more draw, not a point on the median."""
    from sinkflow.plots.style import COLORS

    ax.fill_between(t, floor.min(1), floor.max(1), color=COLORS["reference"], alpha=0.12, lw=0)
    ax.plot(t, np.median(floor, 1), ":", color=COLORS["reference"], label=label)


def plot_normalizations(data, cfg):
    from sinkflow.heat import NORMALIZATIONS
    from sinkflow.plots.style import COLORS, LABELS, new_figure

    fig, axes = new_figure(2, 1, width=5.0, height=2.9)
    a, b = axes[0]
    t = data["times"]
    for norm in NORMALIZATIONS:
        c = COLORS[COLOR_KEYS[norm]]
        a.plot(t, data[f"w2_heat_{norm}"], "o-", ms=3, color=c, label=LABELS[norm])
    a.plot(t, data["w2_own_softmax_gaussian"], "--", color=COLORS["gaussian"], label=r"SoftMax vs $\rho_0 * G_{4t}$")
    _floor_band(a, t, data["w2_floor"], f"i.i.d. samples: median, range of {cfg.floor_draws}")
    a.set_yscale("log")
    a.set_xlabel("time $t$")
    a.set_ylabel(r"$W_2(\mu^n_t, \rho_0 * G_{2t})$")
    a.set_title(rf"Against the heat equation ($n = {cfg.n}$, $\varepsilon = {cfg.eps:g}$)")
    a.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the panel: no curve through its text
    for norm in ("unnormalized", "sinkhorn"):
        b.plot(t, data[f"w2_pme_{norm}"], "o-", ms=3, color=COLORS[COLOR_KEYS[norm]], label=LABELS[norm])
    _floor_band(b, t, data["w2_pme_floor"], f"i.i.d. samples: median, range of {cfg.floor_draws}")
    b.set_yscale("log")
    b.set_xlabel("time $t$")
    b.set_ylabel(r"$W_2$ to Barenblatt at $t_0 + 2t$")
    b.set_title(r"Against $\partial_t\rho = 2\nabla\cdot(\rho\nabla\rho)$" + rf" ($\varepsilon = {cfg.eps_pme:g}$)")
    b.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.supxlabel("At $t = 0$ each curve is the $W_2$ of its initial sample alone: one i.i.d. draw, as random as "
                  "the grey band (median and range of other draws).\nOn the left that draw is in the upper tail (its "
                  "points split unevenly between the two modes), which the flow then forgets.", fontsize=7)
    return fig


register("heat_normalizations", compute=compute_normalizations, plot=plot_normalizations, quick=NormalizationsConfig(),
         full=NormalizationsConfig(n=3000, eps=0.05, dt=0.005, dt_dot=0.001, t_end=1.0, n_times=11, n_pme=3000,
                                   eps_pme=0.01),
         default=True,
         description="W2 to the heat solution over time: Sinkhorn vs SoftMax (Gaussian, dot) vs unnormalized",
         caption=('Only Sinkhorn attention follows the heat equation: its W2 stays near the i.i.d. sampling '
                  'floor, while SoftMax (both scores) and the unnormalized kernel drift away.'))


# ---------------------------------------------------------------------------------------
# (c) convergence


@dataclass(frozen=True)
class ConvergenceConfig:
    eps_values: tuple = (0.4, 0.2, 0.1)
    n_for_eps: int = 400
    n_values: tuple = (100, 200, 400)
    eps_for_n: float = 0.1
    dt_values: tuple = (0.1, 0.05, 0.025)
    t: float = 0.5
    seeds: tuple = (0, 1)
    seed: int = 0


def compute_convergence(cfg: ConvergenceConfig) -> dict:
    g = sinkflow.GaussianMixture.gaussian([0.0], [[1.0]])
    t = cfg.t

    def var_error(eps, seed):
        # relative variance error against heat, conditioned on the initial sample
        x0 = g.sample(cfg.n_for_eps, 1000 * cfg.seed + seed)
        v = sinkflow.heat_flow(x0, t, eps, min(eps / 8, t))
        return abs(v.var() - x0.var() - 2 * t) / (x0.var() + 2 * t)

    def w2_error(n, seed):
        x0 = g.sample(int(n), 1000 * cfg.seed + seed)
        return sinkflow.wasserstein2(sinkflow.heat_flow(x0, t, cfg.eps_for_n, cfg.eps_for_n / 8), g.evolve(t)).value

    def w2_floor(n, seed):
        return sinkflow.wasserstein2(g.evolve(t).sample(int(n), 1000 * cfg.seed + seed + 500), g.evolve(t)).value

    x0_dt = g.sample(cfg.n_for_eps, 1000 * cfg.seed)
    with sinkflow.torch_threads(1):  # docs/performance.md: two threads on a busy 2-vCPU machine are slower
        st_eps = sinkflow.convergence_study(cfg.eps_values, var_error, cfg.seeds)
        st_n = sinkflow.convergence_study(cfg.n_values, w2_error, cfg.seeds)
        st_floor = sinkflow.convergence_study(cfg.n_values, w2_floor, cfg.seeds)
        # dt: self-convergence against a run with a step 8x smaller than the smallest (same particles)
        eps_dt = cfg.eps_values[0]
        fine = sinkflow.heat_flow(x0_dt, t, eps_dt, min(cfg.dt_values) / 8).var()
        dt_err = np.array([[abs(sinkflow.heat_flow(x0_dt, t, eps_dt, dt).var() - fine) / fine] for dt in cfg.dt_values])
    slope_dt, _ = sinkflow.fit_loglog_slope(cfg.dt_values, dt_err[:, 0])
    return {"eps": st_eps.values, "eps_errors": st_eps.errors, "eps_slope": st_eps.slope,
            "eps_ci": np.array(st_eps.slope_ci),
            "n": st_n.values, "n_errors": st_n.errors, "n_slope": st_n.slope, "n_ci": np.array(st_n.slope_ci),
            "floor_errors": st_floor.errors, "floor_slope": st_floor.slope,
            "dt": np.asarray(cfg.dt_values), "dt_errors": dt_err, "dt_slope": slope_dt, "eps_dt": eps_dt}


def _log_axes(ax, x):
    """Log-log axes whose x ticks are the sampled values ``x``, written plainly (a range of less than a
    decade would otherwise show one labelled tick)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _loglog_panel(ax, x, errors, slope, color, label, center=None, alpha=0.4):
    """Each seed's errors (columns of ``errors``) as dots and their ``center`` (default: the
    geometric mean) as a line labelled with the fitted ``slope``, on log-log axes."""
    center = np.exp(np.log(errors).mean(1)) if center is None else center
    for k in range(errors.shape[1]):
        ax.plot(x, errors[:, k], ".", color=color, alpha=alpha, ms=4)
    ax.plot(x, center, "o-", color=color, ms=4, label=f"{label}: slope {slope:.2f}")
    _log_axes(ax, x)


def plot_convergence(data, cfg):
    from sinkflow.plots.style import COLORS, new_figure

    fig, axes = new_figure(3, 1, width=3.5, height=2.8)
    a, b, c = axes[0]
    _loglog_panel(a, data["eps"], data["eps_errors"], data["eps_slope"], COLORS["sinkhorn"], "Sinkhorn")
    a.set_xlabel(r"$\varepsilon$")
    a.set_ylabel(r"$|\mathrm{Var}_t - \mathrm{Var}_0 - 2t| / (\mathrm{Var}_0 + 2t)$")
    a.set_title(rf"bias in $\varepsilon$ ($n = {cfg.n_for_eps}$; order 1 expected)")
    a.legend()
    _loglog_panel(b, data["n"], data["n_errors"], data["n_slope"], COLORS["sinkhorn"], "Sinkhorn")
    _loglog_panel(b, data["n"], data["floor_errors"], data["floor_slope"], COLORS["reference"], "i.i.d.")
    b.set_xlabel("$n$")
    b.set_ylabel(r"$W_2(\mu^n_t, \rho_t)$")
    b.set_title(rf"Monte Carlo in $n$ ($\varepsilon = {cfg.eps_for_n:g}$; $-1/2$ expected)")
    b.legend()
    _loglog_panel(c, data["dt"], data["dt_errors"], data["dt_slope"], COLORS["sinkhorn"], "Sinkhorn")
    c.set_xlabel(r"$dt$")
    c.set_ylabel(r"rel. variance error vs fine $dt$")
    c.set_title(rf"Euler step ($\varepsilon = {data['eps_dt']:g}$; order 1 expected)")
    c.legend()
    return fig


register("heat_convergence", compute=compute_convergence, plot=plot_convergence, quick=ConvergenceConfig(),
         full=ConvergenceConfig(eps_values=(0.4, 0.2, 0.1, 0.05, 0.025), n_for_eps=2000,
                                n_values=(250, 500, 1000, 2000, 4000),
                                eps_for_n=0.05, dt_values=(0.1, 0.05, 0.025, 0.0125), seeds=(0, 1, 2)),
         default=False, description="Observed orders of the Sinkhorn heat flow in eps, n and dt, with seeds")


# ---------------------------------------------------------------------------------------
# (d) barycentric map


@dataclass(frozen=True)
class BarycentricConfig:
    eps_values: tuple = (0.2, 0.1, 0.05)
    grid_points: int = 181
    seed: int = 0


def compute_barycentric(cfg: BarycentricConfig) -> dict:
    g = mixture_1d()
    y = np.linspace(-4.5, 4.5, cfg.grid_points)
    data = {"grid": y, "eps": np.asarray(cfg.eps_values), "score": g.score(y[:, None])[:, 0]}
    with sinkflow.torch_threads(1):  # docs/performance.md: two threads on a busy 2-vCPU machine are slower
        for norm in ("sinkhorn", "softmax_gaussian"):
            res = [sinkflow.barycentric_map(g, y, e, norm, tol=1e-9) for e in cfg.eps_values]
            # on the Sinkhorn scale eps/2, to show the factor
            data[f"map_{norm}"] = np.stack([r.rescaled * r.scale / (r.eps / 2) for r in res])
            data[f"err_{norm}"] = np.array([r.error for r in res])
            data[f"slope_{norm}"] = sinkflow.fit_loglog_slope(cfg.eps_values, data[f"err_{norm}"])[0]
        data["interior"] = res[0].interior
    return data


def plot_barycentric(data, cfg):
    from sinkflow.plots.style import COLORS, new_figure

    fig, axes = new_figure(2, 1, width=3.6, height=2.9)
    a, b = axes[0]
    y, inside = data["grid"], data["interior"]
    a.plot(y[inside], data["score"][inside], color=COLORS["reference"], lw=2, label=r"$\partial_x\log\rho$")
    for k, e in enumerate(data["eps"]):
        alpha = 0.4 + 0.6 * (k + 1) / len(data["eps"])
        a.plot(y[inside], data["map_sinkhorn"][k][inside], color=COLORS["sinkhorn"], alpha=alpha,
               label=rf"Sinkhorn, $\varepsilon = {e:g}$")
    a.plot(y[inside], data["map_softmax_gaussian"][-1][inside], "--", color=COLORS["gaussian"],
           label=rf"SoftMax, $\varepsilon = {data['eps'][-1]:g}$")
    a.set_xlabel("$x$")
    a.set_ylabel(r"$(B_\varepsilon(x) - x)/(\varepsilon/2)$")
    a.set_title("Barycentric map vs score")
    a.legend(fontsize=7)
    for norm, lab in (("sinkhorn", r"Sinkhorn, scale $\varepsilon/2$"),
                      ("softmax_gaussian", r"SoftMax, scale $\varepsilon$")):
        b.plot(data["eps"], data[f"err_{norm}"], "o-", color=COLORS[COLOR_KEYS[norm]],
               label=f"{lab}: slope {data[f'slope_{norm}']:.2f}")
    _log_axes(b, data["eps"])
    b.set_xlabel(r"$\varepsilon$")
    b.set_ylabel(r"$\max_x |(B_\varepsilon - x)/\mathrm{scale} - \partial_x\log\rho|$")
    b.set_title("First-order error")
    b.legend(fontsize=7)
    return fig


register("heat_barycentric", compute=compute_barycentric, plot=plot_barycentric, quick=BarycentricConfig(),
         full=BarycentricConfig(eps_values=(0.2, 0.1, 0.05, 0.025, 0.0125), grid_points=361),
         default=False, description="Sinkhorn barycentric map (B - x)/(eps/2) against the score, O(eps) error")
