r"""Figures of particle flows: SoftMax vs Sinkhorn, energies, Jacobian asymmetry, sphere clustering.

docs/theory/gradient_flows.md and docs/theory/sphere.md. Every compute function is a pure function of its frozen,
seeded config; plots only draw the returned arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register
from sinkflow.plots.style import COLORS, new_figure

NORMALIZATIONS = ("softmax", "sinkhorn")


# ----------------------------------------------------------------------------------------
# (a) + (b): the same particles under SoftMax and Sinkhorn


@dataclass(frozen=True)
class FlowConfig:
    n: int = 32
    d: int = 2
    steps: int = 30
    h: float = 0.1
    temperature: float = 2.0
    W: tuple = ((1.0, 0.0), (0.0, -1.0))  # symmetric, indefinite: attraction along x, repulsion along y
    error_every: int = 5
    seed: int = 0


def compute_flows(cfg: FlowConfig) -> dict:
    """Simulate both normalizations from the same particles, with W_V = W / tau (gradient-flow setting)."""
    x0 = sinkflow.random_particles(cfg.n, cfg.d, seed=cfg.seed)
    W = np.array(cfg.W, dtype=float)
    Wf = W / cfg.temperature  # bilinear form of the scores; values W_V = W/tau make T = -n grad F^inf
    out = {"W": W}
    for kind in NORMALIZATIONS:
        traj = sinkflow.simulate(x0, kind, W_K=W, W_V=Wf, h=cfg.h, steps=cfg.steps, temperature=cfg.temperature,
                        monitors=["energy_inf"])
        out[f"{kind}_positions"] = traj.positions
        out[f"{kind}_energy"] = traj.monitors["energy_inf"]
        idx = np.arange(0, cfg.steps + 1, cfg.error_every)
        out[f"{kind}_error_times"] = traj.times[idx]
        out[f"{kind}_identity_error"] = np.array([sinkflow.gradient_flow_error(traj.positions[k], kind, Wf)
                                                  for k in idx])
    out["times"] = traj.times
    return out


def _trajectories_panel(ax, P, color, title):
    for i in range(P.shape[1]):
        ax.plot(P[:, i, 0], P[:, i, 1], color=color, lw=0.7, alpha=0.55)
    ax.scatter(P[0, :, 0], P[0, :, 1], s=8, color="0.55", zorder=3, label=r"$x_i(0)$")
    ax.scatter(P[-1, :, 0], P[-1, :, 1], s=12, color=color, zorder=4, label=r"$x_i(T)$")
    ax.set_title(title)
    ax.set_xlabel(r"$x^{(1)}$")
    ax.set_ylabel(r"$x^{(2)}$")
    ax.set_aspect("equal", adjustable="box")


def _w_text(W) -> str:
    """``W`` as mathtext, e.g. ``diag(1, -1)``."""
    W = np.asarray(W)
    if np.array_equal(W, np.diag(np.diag(W))):
        return r"\mathrm{diag}(" + ", ".join(f"{v:g}" for v in np.diag(W)) + ")"
    return "(" + ", ".join("(" + ", ".join(f"{v:g}" for v in row) + ")" for row in W) + ")"  # mathtext has no matrices


def plot_trajectories(data: dict, cfg: FlowConfig):
    fig, axes = new_figure(2, 1, width=3.4, height=2.7)
    _trajectories_panel(axes[0, 0], data["softmax_positions"], COLORS["softmax"], r"SoftMax $K^1$")
    _trajectories_panel(axes[0, 1], data["sinkhorn_positions"], COLORS["sinkhorn"], r"Sinkhorn $K^\infty$")
    both = np.concatenate([data["softmax_positions"], data["sinkhorn_positions"]]).reshape(-1, 2)
    lo, hi = both.min(0), both.max(0)
    pad = 0.05 * (hi - lo)
    for ax in axes[0]:  # the same window on both panels, so distances compare at a glance
        ax.set_xlim(lo[0] - pad[0], hi[0] + pad[0])
        ax.set_ylim(lo[1] - pad[1], hi[1] + pad[1])
    axes[0, 0].legend(loc="best")
    fig.suptitle(rf"$x_i \leftarrow x_i + h\,\Sigma_j K_{{ij}} W_V x_j$, $h={cfg.h}$, {cfg.steps} steps, "
                 rf"$W_K = W = {_w_text(data['W'])}$, $W_V = W/\tau$, $\tau={cfg.temperature:g}$")
    return fig


def plot_energy(data: dict, cfg: FlowConfig):
    fig, axes = new_figure(2, 1, width=3.4, height=2.8)
    ax, ax2 = axes[0]
    t = data["times"]
    for kind, label in (("softmax", "SoftMax"), ("sinkhorn", "Sinkhorn")):
        ax.plot(t, data[f"{kind}_energy"], color=COLORS[kind], label=label)
        ax2.semilogy(data[f"{kind}_error_times"], data[f"{kind}_identity_error"], "o-", color=COLORS[kind], ms=3,
                     label={"softmax": r"SoftMax vs $-n\nabla F^1$",
                            "sinkhorn": r"Sinkhorn vs $-n\nabla F^\infty$"}[kind])
    ax.set_xlabel(r"$t$")
    ax.set_ylabel(r"$F^\infty(\mu_t) = \frac{1}{2}\mathrm{OT}_1(\mu_t, \mu_t)$")
    ax.set_title("energy along the flow")
    ax.legend()
    ax2.set_xlabel(r"$t$")
    ax2.set_ylabel(r"$\|T + n\nabla F\| / \|T\|$")
    ax2.set_title("gradient-flow identity error")
    ax2.legend()
    fig.suptitle(rf"$n = {cfg.n}$ particles, scores $x_i^\top W x_j/\tau$ with $W = {_w_text(data['W'])}$, "
                 rf"$\tau = {cfg.temperature:g}$, values $W_V = W/\tau$", fontsize=9)
    return fig


_flow_quick = FlowConfig(n=24, steps=20, error_every=5)
_flow_full = FlowConfig(n=64, steps=60, h=0.05, error_every=6)
register("particles_trajectories", compute=compute_flows, plot=plot_trajectories, quick=_flow_quick, full=_flow_full,
         default=True, description="2D particle trajectories under SoftMax vs Sinkhorn attention (same W, same start)",
         caption=('From one start, with the same W and values, SoftMax and Sinkhorn attention move the '
                  'tokens along different paths: the normalization alone changes the flow.'))
register("particles_energy", compute=compute_flows, plot=plot_energy, quick=_flow_quick, full=_flow_full,
         default=True, description="F^inf along SoftMax and Sinkhorn flows, and the error of T = -n grad F",
         caption=('Sinkhorn attention is a gradient flow: its field is -n grad F^inf to rounding error '
                  "and F^inf decreases; SoftMax's field misses its candidate gradient."))


# ----------------------------------------------------------------------------------------
# (c) Jacobian asymmetry vs n_iter


@dataclass(frozen=True)
class JacobianConfig:
    n: int = 16
    d: int = 2
    n_iters: tuple = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    temperatures: tuple = (0.5, 1.0, 2.0)
    seed: int = 0


def compute_jacobian(cfg: JacobianConfig) -> dict:
    x = sinkflow.random_particles(cfg.n, cfg.d, seed=cfg.seed)
    out = {"n_iters": np.array(cfg.n_iters), "temperatures": np.array(cfg.temperatures)}
    for tau in cfg.temperatures:
        W = np.eye(cfg.d) / tau
        out[f"asym_{tau}"] = np.array([sinkflow.jacobian_asymmetry(x, "sinkhorn", W, n_iter=k) for k in cfg.n_iters])
        out[f"asym_inf_{tau}"] = sinkflow.jacobian_asymmetry(x, "sinkhorn", W)
        out[f"asym_0_{tau}"] = sinkflow.jacobian_asymmetry(x, "unnormalized", W)
    return out


def plot_jacobian(data: dict, cfg: JacobianConfig):
    fig, axes = new_figure(1, 1, width=4.4, height=3.2)
    ax = axes[0, 0]
    ks = data["n_iters"]
    for j, tau in enumerate(data["temperatures"]):
        c = ["#0072B2", "#009E73", "#CC79A7", "#E69F00"][j % 4]
        ax.loglog(ks, data[f"asym_{tau}"], "o-", ms=3, color=c, label=rf"$K^L$, $\tau={tau:g}$")
        ax.axhline(max(data[f"asym_inf_{tau}"], 1e-17), color=c, ls="--", lw=0.8)
    ax.axhline(max(data[f"asym_0_{data['temperatures'][0]}"], 1e-17), color=COLORS["unnormalized"], ls=":", lw=1,
               label=r"$K^0$ (unnormalized)")
    ax.annotate("SoftMax", (ks[0], data[f"asym_{data['temperatures'][0]}"][0]), textcoords="offset points",
                xytext=(6, 4), color=COLORS["softmax"])
    ax.set_xlabel(r"Sinkhorn half-iterations $L$ ($L=1$: SoftMax)")
    ax.set_ylabel(r"$\|J - J^T\|_F / \|J\|_F$, $J = \partial T(x_i)/\partial x_j$")
    ax.set_title(rf"Jacobian asymmetry, $n={cfg.n}$ (dashed: $K^\infty$)")
    ax.legend(fontsize=7)
    return fig


register("particles_jacobian", compute=compute_jacobian, plot=plot_jacobian,
         quick=JacobianConfig(n=10, n_iters=(1, 2, 4, 8, 16, 32), temperatures=(1.0, 2.0)), full=JacobianConfig(n=24),
         default=False,
         description="Asymmetry of the particle-field Jacobian vs Sinkhorn iterations: SoftMax -> gradient flow")


# ----------------------------------------------------------------------------------------
# (d) clustering on the sphere


@dataclass(frozen=True)
class SphereConfig:
    n: int = 64
    d: int = 3
    betas: tuple = (1.0, 4.0, 9.0)
    phase_betas: tuple = tuple(np.round(np.geomspace(0.5, 16, 12), 3))
    t_max: float = 30.0
    h: float = 0.1
    attention: str = "softmax"
    seed: int = 0


def compute_sphere(cfg: SphereConfig) -> dict:
    """SA dynamics of Geshkovski et al. (Q = K = V = I, beta = 1/tau) on S^{d-1}."""
    from sinkflow.particles import largest_safe_step

    x0 = sinkflow.random_particles(cfg.n, cfg.d, seed=cfg.seed, manifold="sphere")
    betas = sorted(set(cfg.betas) | set(cfg.phase_betas))
    # one step for every beta (a common time axis), capped at the coldest run's safe step
    safe = largest_safe_step(x0, cfg.attention, temperature=1.0 / max(betas))
    steps = max(int(round(cfg.t_max / cfg.h)), math.ceil(cfg.t_max / safe))
    h = cfg.t_max / steps
    out = {"betas": np.array(cfg.betas), "phase_betas": np.array(cfg.phase_betas)}
    runs = {}
    for beta in betas:
        traj = sinkflow.simulate(x0, cfg.attention, h=h, steps=steps, manifold="sphere", temperature=1.0 / beta,
                        monitors=["clusters", "energy"], save_every=steps)
        runs[beta] = traj
    out["times"] = runs[betas[0]].monitor_times
    out["phase"] = np.array([runs[b].monitors["cluster_fraction"] for b in cfg.phase_betas])
    for beta in cfg.betas:
        out[f"fraction_{beta}"] = runs[beta].monitors["cluster_fraction"]
        out[f"count_{beta}"] = runs[beta].monitors["cluster_count"]
        out[f"energy_{beta}"] = runs[beta].monitors["energy"]
        out[f"final_{beta}"] = runs[beta].final
    return out


def plot_sphere(data: dict, cfg: SphereConfig):
    fig, axes = new_figure(3, 1, width=3.2, height=2.8)
    t = data["times"]
    colors = ["#0072B2", "#009E73", "#D55E00", "#CC79A7", "#E69F00"]
    for j, beta in enumerate(data["betas"]):
        c = colors[j % len(colors)]
        axes[0, 0].plot(t, data[f"fraction_{beta}"], color=c, label=rf"$\beta={beta:g}$")
        axes[0, 1].step(t, data[f"count_{beta}"], where="post", color=c)
    axes[0, 0].set_xlabel(r"$t$")
    axes[0, 0].set_ylabel(r"pairs with $\langle x_i, x_j\rangle > 1 - 10^{-3}$")
    axes[0, 0].set_title("clustered fraction")
    axes[0, 0].legend()
    axes[0, 1].set_xlabel(r"$t$")
    axes[0, 1].set_ylabel("number of clusters")
    axes[0, 1].set_yscale("log")
    axes[0, 1].set_title(rf"metastable phases ($n={cfg.n}$, $d={cfg.d}$)")
    ax = axes[0, 2]
    pb = data["phase_betas"]
    im = ax.pcolormesh(t, np.arange(len(pb)), data["phase"], shading="nearest", vmin=0, vmax=1, cmap="viridis",
                       rasterized=True)
    ax.set_yticks(np.arange(len(pb)))
    ax.set_yticklabels([f"{b:.2g}" for b in pb])
    ax.set_xlabel(r"$t$")
    ax.set_ylabel(r"$\beta$")
    ax.set_title("clustered fraction")
    ax.grid(False)
    fig.colorbar(im, ax=ax)
    return fig


register("particles_sphere", compute=compute_sphere, plot=plot_sphere,
         quick=SphereConfig(n=32, betas=(1.0, 4.0, 9.0), phase_betas=(0.5, 1.0, 2.0, 4.0, 9.0, 16.0), t_max=15.0,
                            h=0.15),
         full=SphereConfig(), default=False,
         description="Clustering on the sphere (SA dynamics, n=64, d=3) and a beta x time phase diagram")


# ----------------------------------------------------------------------------------------
# (e) animation


@dataclass(frozen=True)
class AnimationConfig:
    n: int = 48
    steps: int = 60
    h: float = 0.05
    temperature: float = 2.0
    attention: str = "sinkhorn"
    frames: int = 30
    seed: int = 1


def compute_animation(cfg: AnimationConfig) -> dict:
    x0 = sinkflow.random_particles(cfg.n, 2, seed=cfg.seed)
    W = np.diag([1.0, -1.0])
    traj = sinkflow.simulate(x0, cfg.attention, W_K=W, W_V=W / cfg.temperature, h=cfg.h, steps=cfg.steps,
                    temperature=cfg.temperature)
    idx = np.linspace(0, cfg.steps, cfg.frames).round().astype(int)
    return {"positions": traj.positions[idx], "times": traj.times[idx]}


def plot_animation(data: dict, cfg: AnimationConfig):
    from matplotlib.animation import FuncAnimation

    fig, axes = new_figure(1, 1, width=3.6, height=3.4)
    ax = axes[0, 0]
    P = data["positions"]
    lo, hi = P.reshape(-1, 2).min(0), P.reshape(-1, 2).max(0)
    ax.set_xlim(lo[0] - 0.1, hi[0] + 0.1)
    ax.set_ylim(lo[1] - 0.1, hi[1] + 0.1)
    ax.set_xlabel(r"$x^{(1)}$")
    ax.set_ylabel(r"$x^{(2)}$")
    dots = ax.scatter(P[0, :, 0], P[0, :, 1], s=12, color=COLORS.get(cfg.attention, COLORS["sinkhorn"]))
    title = ax.set_title("")

    def update(k):
        dots.set_offsets(P[k])
        title.set_text(rf"{cfg.attention} flow, $t = {data['times'][k]:.2f}$")
        return dots, title

    anim = FuncAnimation(fig, update, frames=len(P), blit=False)
    anim._fps = 10
    return anim


register("particles_animation", compute=compute_animation, plot=plot_animation,
         quick=AnimationConfig(n=16, steps=10, frames=6), full=AnimationConfig(), default=False, formats=("gif",),
         description="GIF of one Sinkhorn particle flow (meaningful with --full)")
