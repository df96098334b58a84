r"""Figures for docs/theory/nystrom.md: Skyformer's Nyström, its spectral-norm theorem and its looseness.

- ``nystrom_error_vs_landmarks`` (default): observed :math:`\|C - \tilde C\|_2 / \|C\|_2` against
  :math:`m` for Skyformer (pinv and iterative inverse), Nyströmformer on SoftMax and uniform
  Nyström on the unlifted kernel, with :math:`\varepsilon = \lambda / \|C\|_2` and the theorem's
  :math:`m(\varepsilon, \delta)` marked.
- ``nystrom_dstat``: :math:`d_{stat}`, :math:`m(\varepsilon, \delta)` and the observed sufficient
  :math:`m` against :math:`n` and against the query scale (bandwidth).
- ``nystrom_failure_probability``: Monte-Carlo :math:`P(\|C - \tilde C\|_2 > \lambda)` against
  :math:`m`, with Clopper–Pearson intervals, against :math:`\delta`.
- ``nystrom_conditioning``: condition numbers of the SoftMax and Gaussian landmark blocks
  against the query scale (Skyformer's stability argument).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sinkflow.plots import register

__all__ = ["SweepConfig", "DstatConfig", "ConditioningConfig"]


def _qk(n, p, scale, seed):
    rng = np.random.default_rng(seed)
    return scale * rng.standard_normal((2, n, p))


def _rel_norm(A, B):
    return float(np.linalg.norm(A - B, 2) / np.linalg.norm(A, 2))


# --------------------------------------------------------------------------- (a) error vs landmarks
@dataclass(frozen=True)
class SweepConfig:
    """A landmark sweep on random queries and keys ``scale * N(0, I)`` (figures a and c)."""

    n: int = 128
    p: int = 32
    scale: float = 0.5
    landmarks: tuple = (2, 4, 8, 16, 32, 64, 128)
    trials: int = 3
    eps: float = 0.1
    delta: float = 0.1
    seed: int = 0


def compute_error(cfg: SweepConfig) -> dict:
    import sinkflow

    Q, K = _qk(cfg.n, cfg.p, cfg.scale, cfg.seed)
    C = sinkflow.kernelized_attention_matrix(Q, K)
    S = sinkflow.softmax(sinkflow.dot_scores(Q, K, temperature=math.sqrt(cfg.p)))
    check = sinkflow.nystrom_check(Q, K, 1, eps=cfg.eps, delta=cfg.delta, trials=1, seed=cfg.seed)
    rng = np.random.default_rng(cfg.seed + 1)
    ms = np.array(cfg.landmarks)
    errors = {k: np.zeros((len(ms), cfg.trials)) for k in ("pinv", "iterative", "unlifted")}
    nystromformer = np.zeros(len(ms))
    for i, m in enumerate(ms):
        for t in range(cfg.trials):
            J = sinkflow.sample_landmarks(2 * cfg.n, int(m), generator=rng)
            errors["pinv"][i, t] = _rel_norm(C, sinkflow.nystrom_matrix(Q, K, J))
            errors["iterative"][i, t] = _rel_norm(C, sinkflow.nystrom_matrix(Q, K, J, inverse="iterative"))
            Ju = sinkflow.sample_landmarks(cfg.n, int(m), generator=rng)
            errors["unlifted"][i, t] = _rel_norm(C, sinkflow.nystrom_matrix(Q, K, Ju, lift=False))
        # Nyströmformer is deterministic (segment means); compared with the SoftMax it approximates.
        nystromformer[i] = _rel_norm(S, sinkflow.nystromformer_matrix(Q, K, min(int(m), cfg.n)))
    stats = {f"{k}{suffix}": f(v, axis=1) for k, v in errors.items()
             for suffix, f in (("", np.mean), ("_min", np.min), ("_max", np.max))}
    return dict(landmarks=ms, **stats, nystromformer=nystromformer, eps=cfg.eps, m_required=check.m_required,
                m_required_sharp=sinkflow.landmarks_required(check.d_stat, check.beta, 2 * cfg.n, cfg.delta,
                                                             sinkflow.SHARP_LANDMARK_CONSTANT),
                d_stat=check.d_stat)


def plot_error(data: dict, cfg: SweepConfig):
    """Left: Gaussian-kernel approximations (mean and range over the landmark draws)
    with lambda, the theorem's m and m = 2n. Right: Nyströmformer, measured against SoftMax
    attention, a different matrix, hence its own axes."""
    import matplotlib as mpl

    from sinkflow.plots.style import COLORS, new_figure

    fig, axes = new_figure(2, 1, width=3.6, height=3.4)
    ax, right = axes[0]
    m = data["landmarks"]
    for key, fmt, color, label in (("pinv", "o-", COLORS["gaussian"], "Skyformer, pseudo-inverse"),
                                   ("iterative", "s--", COLORS["sinkhorn"], "Skyformer, iterative inverse"),
                                   ("unlifted", "^:", COLORS["unnormalized"], "uniform Nyström, unlifted")):
        spread = [data[key] - data[f"{key}_min"], data[f"{key}_max"] - data[key]]  # positive: fits a log axis
        ax.errorbar(m, data[key], yerr=spread, fmt=fmt, color=color, ms=4, capsize=2, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(data["eps"], color=COLORS["bound"], lw=1, label=r"$\varepsilon = \lambda / \|C\|_2$")
    ax.axvline(2 * cfg.n, color=COLORS["reference"], ls=":", lw=1, label=rf"$m = 2n = {2 * cfg.n}$: exact")
    # the theorem's m is far right of the data: written in the empty corner, not drawn on a stretched axis
    ax.text(0.03, 0.03, r"theorem's $m(\varepsilon,\delta)$, off the axis:" + "\n"
            + rf"{data['m_required_sharp']:,.0f} (constant 28/3), {data['m_required']:,.0f} (56/3)",
            transform=ax.transAxes, ha="left", va="bottom", fontsize=7)
    ax.set_xlim(m[0] / 1.3, 2 * cfg.n * 1.5)
    ax.set_xlabel(r"landmarks $m$")
    ax.set_ylabel(r"relative error $\|C - \tilde C\|_2 \,/\, \|C\|_2$")
    ax.set_title(rf"Gaussian kernel $C$: $n = {cfg.n}$, $p = {cfg.p}$, $d_{{stat}} = {data['d_stat']:.0f}$" + "\n"
                 + rf"mean and range of {cfg.trials} draws, $\delta = {cfg.delta:g}$", fontsize=8)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=7)
    right.loglog(m, data["nystromformer"], "d-.", color=COLORS["softmax"], label="Nyströmformer (segment means)")
    right.axvline(cfg.n, color=COLORS["reference"], ls=":", lw=1, label=rf"$m = n = {cfg.n}$")
    right.set_xlim(ax.get_xlim()[0], cfg.n * 1.5)
    # the landmark counts as plain ticks: a log axis spanning under two decades labels its minor
    # ticks too (2×10⁰ 3×10⁰ 4×10⁰ 6×10⁰ 10¹), which ran into each other
    right.xaxis.set_major_locator(mpl.ticker.FixedLocator(m))
    right.xaxis.set_major_formatter(mpl.ticker.StrMethodFormatter("{x:.0f}"))
    right.xaxis.set_minor_locator(mpl.ticker.NullLocator())
    right.set_xlabel(r"landmarks $m$")
    right.set_ylabel(r"relative error $\|S - \tilde S\|_2 \,/\, \|S\|_2$")
    right.set_title("Nyströmformer against SoftMax $S$" + "\n" + "(segment means: deterministic)", fontsize=8)
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=7)
    return fig


register("nystrom_error_vs_landmarks", compute=compute_error, plot=plot_error,
         quick=SweepConfig(), full=SweepConfig(n=512, landmarks=(2, 4, 8, 16, 32, 64, 128, 256, 512), trials=10),
         default=True,
         description="Nyström spectral error vs landmarks (Skyformer pinv/iterative, Nyströmformer, unlifted) "
                     "against lambda and the theorem's m",
         caption=("Skyformer's lifted Nyström reaches the error eps = 0.1 with about 32 landmarks, far fewer "
                  "than the theorem's thousands; unlifted uniform Nyström stalls near 0.5."))


# --------------------------------------------------------------------------- (b) d_stat and m vs n, scale
@dataclass(frozen=True)
class DstatConfig:
    sizes: tuple = (32, 64, 128, 256)
    scales: tuple = (0.125, 0.25, 0.5, 0.75, 1.0)
    n_fixed: int = 128
    scale_fixed: float = 0.5
    p: int = 32
    eps: float = 0.1
    delta: float = 0.1
    trials: int = 5
    seed: int = 0


def _dstat_point(n, p, scale, cfg):
    import sinkflow

    Q, K = _qk(n, p, scale, cfg.seed)
    chk = sinkflow.nystrom_check(Q, K, 1, eps=cfg.eps, delta=cfg.delta, trials=1, seed=cfg.seed)
    m_obs = sinkflow.smallest_sufficient_landmarks(Q, K, cfg.eps, cfg.delta, cfg.trials, seed=cfg.seed)
    return chk.d_stat, chk.d_stat / chk.beta, chk.m_required, np.nan if m_obs is None else m_obs


def compute_dstat(cfg: DstatConfig) -> dict:
    by_n = np.array([_dstat_point(n, cfg.p, cfg.scale_fixed, cfg) for n in cfg.sizes])
    by_s = np.array([_dstat_point(cfg.n_fixed, cfg.p, s, cfg) for s in cfg.scales])
    return dict(sizes=np.array(cfg.sizes), scales=np.array(cfg.scales), by_n=by_n, by_scale=by_s)


def plot_dstat(data: dict, cfg: DstatConfig):
    from sinkflow.plots.style import COLORS, new_figure

    fig, axes = new_figure(2, 1, width=3.4, height=3.0)
    for ax, x, rows, xlabel, title in (
        (axes[0, 0], data["sizes"], data["by_n"], r"tokens $n$", rf"query scale $s = {cfg.scale_fixed}$"),
        (axes[0, 1], data["scales"], data["by_scale"], r"query scale $s$ ($Q, K \sim s\,\mathcal{N}(0, I)$)",
         rf"$n = {cfg.n_fixed}$"),
    ):
        ax.semilogy(x, rows[:, 0], "o-", color=COLORS["gaussian"], label=r"$d_{stat}$")
        ax.semilogy(x, rows[:, 1], "s--", color=COLORS["other"], label=r"$d_{stat} / \beta^\star$")
        ax.semilogy(x, rows[:, 2], "^-", color=COLORS["bound"], label=r"$m(\varepsilon, \delta)$ (theorem)")
        ax.semilogy(x, rows[:, 3], "d-", color=COLORS["reference"], label=r"observed sufficient $m$")
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=9)
        if x is data["sizes"]:
            ax.set_xscale("log", base=2)
            ax.plot(x, 2 * x, color="0.6", lw=0.8, label=r"$N = 2n$")
    axes[0, 0].set_ylabel("landmarks / dimension")
    axes[0, 0].legend(fontsize=7)
    looseness = np.nanmedian(np.concatenate([data["by_n"][:, 2] / data["by_n"][:, 3],
                                             data["by_scale"][:, 2] / data["by_scale"][:, 3]]))
    fig.suptitle(rf"theorem's $m$ / observed $m$: median {looseness:.0f}x "
                 rf"($\varepsilon = {cfg.eps}$, $\delta = {cfg.delta}$, $p = {cfg.p}$)", fontsize=9)
    return fig


register("nystrom_dstat", compute=compute_dstat, plot=plot_dstat, quick=DstatConfig(),
         full=DstatConfig(sizes=(32, 64, 128, 256, 512), scales=(0.0625, 0.125, 0.25, 0.5, 0.75, 1.0, 1.5),
                          n_fixed=256, trials=10),
         default=False,
         description="statistical dimension, the theorem's m(eps, delta) and the observed sufficient m vs n and "
                     "bandwidth")


# --------------------------------------------------------------------------- (c) failure probability vs m
def compute_failure(cfg: SweepConfig) -> dict:
    import sinkflow

    Q, K = _qk(cfg.n, cfg.p, cfg.scale, cfg.seed)
    rows = []
    for m in cfg.landmarks:
        r = sinkflow.nystrom_check(Q, K, int(m), eps=cfg.eps, delta=cfg.delta, trials=cfg.trials,
                                   seed=cfg.seed + int(m))
        rows.append((r.failure_rate, *r.failure_ci, r.loewner_failures / cfg.trials, r.relative_error))
    rows = np.array(rows)
    return dict(landmarks=np.array(cfg.landmarks), rate=rows[:, 0], ci_low=rows[:, 1], ci_high=rows[:, 2],
                loewner_rate=rows[:, 3], relative_error=rows[:, 4], m_required=r.m_required, delta=cfg.delta)


def plot_failure(data: dict, cfg: SweepConfig):
    from sinkflow.plots.style import COLORS, new_figure

    fig, axes = new_figure(1, 1, width=4.4, height=3.1)
    ax = axes[0, 0]
    m = data["landmarks"]
    err = np.vstack([data["rate"] - data["ci_low"], data["ci_high"] - data["rate"]])
    ax.errorbar(m, data["rate"], yerr=err, fmt="o-", color=COLORS["gaussian"], capsize=2,
                label=r"$P(\|C - \tilde C\|_2 > \lambda)$, 95% CI")
    ax.plot(m, data["loewner_rate"], "s--", color=COLORS["other"],
            label=r"$P(\bar C \preceq \tilde{\bar C} + \lambda I$ fails$)$")
    ax.axhline(data["delta"], color=COLORS["bound"], lw=1, label=rf"$\delta = {data['delta']}$")
    ax.set_xscale("log")
    ax.axvline(data["m_required"], color=COLORS["reference"], lw=1)
    ax.text(data["m_required"] / 1.1, 0.5, r"$m(\varepsilon,\delta)$", rotation=90, ha="right", fontsize=8)
    ax.set_xlim(m[0] / 1.3, data["m_required"] * 1.5)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(r"landmarks $m$ (uniform, with replacement, from $N = 2n$ points)")
    ax.set_ylabel("failure probability")
    ax.set_title(rf"$n = {cfg.n}$, $p = {cfg.p}$, $\varepsilon = {cfg.eps}$, {cfg.trials} draws per $m$", fontsize=9)
    ax.legend(fontsize=7, loc="center right")
    return fig


register("nystrom_failure_probability", compute=compute_failure, plot=plot_failure,
         quick=SweepConfig(n=32, p=16, landmarks=(2, 4, 6, 8, 12, 16, 24, 32, 48), trials=40),
         full=SweepConfig(n=128, landmarks=(4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256), trials=200),
         default=False,
         description="Monte-Carlo failure probability of ||C - C~|| <= lambda vs landmarks, against delta")


# --------------------------------------------------------------------------- (d) conditioning
@dataclass(frozen=True)
class ConditioningConfig:
    n: int = 256
    p: int = 32
    landmarks: int = 16
    scales: tuple = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)
    repeats: int = 3
    seed: int = 0


def compute_conditioning(cfg: ConditioningConfig) -> dict:
    import sinkflow

    rng = np.random.default_rng(cfg.seed)
    out = {k: np.zeros((len(cfg.scales), cfg.repeats))
           for k in ("softmax_seg", "gauss_seg", "softmax_tok", "gauss_tok")}
    for i, s in enumerate(cfg.scales):
        for r in range(cfg.repeats):
            Q, K = s * rng.standard_normal((2, cfg.n, cfg.p))
            out["softmax_seg"][i, r] = np.linalg.cond(sinkflow.landmark_block(Q, K, cfg.landmarks, "softmax"))
            out["gauss_seg"][i, r] = np.linalg.cond(sinkflow.landmark_block(Q, K, cfg.landmarks, "gaussian"))
            # Sampled tokens as landmarks: SoftMax on (Q_J, K_J), Gaussian on points of [Q; K].
            J = rng.choice(cfg.n, cfg.landmarks, replace=False)
            S = sinkflow.softmax(sinkflow.dot_scores(Q[J], K[J], temperature=math.sqrt(cfg.p)))
            X = np.concatenate([Q, K])[rng.choice(2 * cfg.n, cfg.landmarks, replace=False)]
            out["softmax_tok"][i, r] = np.linalg.cond(S)
            out["gauss_tok"][i, r] = np.linalg.cond(sinkflow.gaussian_kernel(X, X))
    return dict(scales=np.array(cfg.scales), **{k: np.median(v, axis=1) for k, v in out.items()})


def plot_conditioning(data: dict, cfg: ConditioningConfig):
    from sinkflow.plots.style import COLORS, new_figure

    fig, axes = new_figure(1, 1, width=4.4, height=3.1)
    ax = axes[0, 0]
    s = data["scales"]
    ax.loglog(s, data["softmax_seg"], "o-", color=COLORS["softmax"], label="SoftMax block, segment means")
    ax.loglog(s, data["softmax_tok"], "o--", color=COLORS["softmax"], alpha=0.7, label="SoftMax block, sampled tokens")
    ax.loglog(s, data["gauss_seg"], "s-", color=COLORS["gaussian"], label="Gaussian block, segment means")
    ax.loglog(s, data["gauss_tok"], "s--", color=COLORS["gaussian"], alpha=0.7, label="Gaussian block, sampled points")
    ax.set_xscale("log", base=2)
    ax.set_xticks(s, [f"{v:g}" for v in s])
    ax.minorticks_off()
    ax.set_xlabel(r"query scale $s$ ($Q, K \sim s\,\mathcal{N}(0, I)$)")
    ax.set_ylabel(r"condition number $\kappa_2$ of the $m \times m$ block")
    ax.set_title(rf"$n = {cfg.n}$, $p = {cfg.p}$, $m = {cfg.landmarks}$ (median of {cfg.repeats})", fontsize=9)
    ax.legend(fontsize=7)
    return fig


register("nystrom_conditioning", compute=compute_conditioning, plot=plot_conditioning, quick=ConditioningConfig(),
         full=ConditioningConfig(n=1024, landmarks=64, scales=(0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0),
                                 repeats=10),
         default=False, description="condition number of the SoftMax vs Gaussian landmark block vs query scale")
