# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Gaussian flows and causal attention
#
# **What this notebook shows.** Two exact reductions of attention dynamics, each checked against particles:
#
# 1. **Gaussian moment flows** (docs/theory/gaussian_flows.md). In $\mathbb R^d$ the attention velocity of a
#    Gaussian $\mathcal N(m, S)$ is affine, so a Gaussian stays Gaussian and its mean and covariance follow a
#    closed ODE (`gaussian_attention_field`, `gaussian_moment_flow`). Particles sampled from the Gaussian
#    follow it up to their sampling error, which falls like $n^{-1/2}$.
# 2. **The SoftMax blow-up.** With $W_Q = W_K = W_V = I$ the SoftMax moment ODE reaches infinity at
#    $t^* = \tau/(2s_0)$; Sinkhorn never blows up.
# 3. **Causal attention** (docs/theory/causal.md): token $i$ attends to $j \le i$ (`simulate(..., causal=True)`).
#    Sinkhorn under a causal mask with uniform key targets collapses to the identity; with the targets of
#    uniform causal attention (sinkflow's default) it does not. Measured: the attention matrices, the
#    flows' consensus rate, and the metastable clusters against Rényi parking (`renyi_centers`).
#
# Set `SINKFLOW_QUICK=1` for a fast run (under a minute); inside Jupyter, uncomment
# `os.environ["SINKFLOW_QUICK"] = "1"` in the first code cell. Where a quick run is too small to decide a
# claim, the cell says so.

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import scipy.linalg
import torch

import sinkflow
from sinkflow.particles import causal_mask, renyi_centers
from sinkflow.plots.interactive import interact
from sinkflow.plots.style import COLORS, LABELS, PALETTE, new_figure, style

# Quick mode (small sizes, seconds): start Jupyter with SINKFLOW_QUICK=1, or uncomment the
# next line and re-run this cell (and the cells below).
# os.environ["SINKFLOW_QUICK"] = "1"
QUICK = os.environ.get("SINKFLOW_QUICK", "0") == "1"
torch.set_num_threads(1)  # small dense ops: one thread is fastest on a shared machine (docs/performance.md)


def too_short(seconds):
    print(f"    quick mode: too short to decide; run with SINKFLOW_QUICK=0 (about {seconds:.0f} s)")


def moments(x):
    """Means (..., d) and covariances (..., d, d) of particle clouds (..., n, d), normalized by n."""
    x = np.asarray(x)
    mean = x.mean(-2)
    dev = x - mean[..., None, :]
    return mean, np.einsum("...ni,...nj->...ij", dev, dev) / x.shape[-2]


# %% [markdown]
# ## 1. The velocity of a Gaussian is affine
#
# Tokens follow $\dot x_i = \sum_j K_{ij} W_V x_j$ with scores $x^\top A y$, $A = W_Q^\top W_K/\tau$. In the
# mean-field limit the velocity is the barycentre of the keys under the attention plan,
# $v(x) = W_V\,\mathbb E_\pi[y \mid x]$. Under $\mathcal N(m, S)$:
#
# | attention | $\mathbb E[y \mid x]$ |
# |---|---|
# | SoftMax | $m + S A^\top x$ (the tilt $e^{x^\top A y}$ shifts the natural parameter) |
# | Sinkhorn ($K^\infty$) | $m + \Gamma^\top S^{-1}(x - m)$ |
#
# with the Sinkhorn slope, the entropic transport of the Gaussian to itself in closed form,
#
# $$\Gamma^\top S^{-1} = 2 S^{1/2}\Big(I + \big(I + 4 S^{1/2}A^\top S A S^{1/2}\big)^{1/2}\Big)^{-1} S^{1/2}A^\top .$$
#
# So $v(x) = Bx + c$
# and the moments obey
#
# $$\dot m = Bm + c, \qquad \dot S = BS + SB^\top,$$
#
# a closed ODE in $(m, S)$ that `gaussian_moment_flow` integrates (DOP853). `gaussian_attention_field`
# returns $B$ and $c$; the cell checks them against the table, written out by hand.

# %%
M0 = np.array([0.5, -0.3])
S0 = np.array([[0.6, 0.2], [0.2, 0.3]])
WQ = np.array([[1.0, 0.3], [-0.2, 0.8]])
WK = np.array([[0.7, 0.1], [0.4, 1.1]])  # W_Q^T W_K neither symmetric nor definite
WV = np.array([[-0.5, 0.3], [0.1, -0.4]])
TAU = 1.5
MATS = {"W_Q": WQ, "W_K": WK, "W_V": WV}

A = WQ.T @ WK / TAU
root = scipy.linalg.sqrtm(S0).real
inner = scipy.linalg.sqrtm(np.eye(2) + 4 * root @ A.T @ S0 @ A @ root).real
# E[y | x] = slope x + intercept, by the table
slope_softmax = S0 @ A.T
slope_sinkhorn = 2 * root @ np.linalg.solve(np.eye(2) + inner, root @ A.T)
by_hand = {"softmax": (slope_softmax, M0), "sinkhorn": (slope_sinkhorn, M0 - slope_sinkhorn @ M0)}
for norm, (slope, intercept) in by_hand.items():
    field = sinkflow.gaussian_attention_field(M0, S0, normalization=norm, temperature=TAU, **MATS)
    print(f"{LABELS[norm]:>8}: B = {np.round(field.matrix, 4).tolist()}, c = {np.round(field.offset, 4).tolist()}; "
          f"|B - W_V slope| = {np.abs(field.matrix - WV @ slope).max():.1e}, "
          f"|c - W_V intercept| = {np.abs(field.offset - WV @ intercept).max():.1e}")

# %% [markdown]
# ## 2. Particles against the moment ODE
#
# First a quadrature: 144 weighted particles on the product Gauss–Hermite rule of $\mathcal N(m, S)$
# (`simulate` with `weights`, RK4) integrate the mean-field velocity to quadrature accuracy, so their moments
# are the ODE's up to RK4's $h^4$. Then $n$ particles **sampled** from the Gaussian: their moments differ from
# the ODE's by the sampling error, of order $n^{-1/2}$. An ensemble of seeds runs as one call per $n$ (the
# leading dimension of `x0`).

# %%
T_END, STEPS = 1.0, 10
odes = {norm: sinkflow.gaussian_moment_flow(M0, S0, np.linspace(0, T_END, STEPS + 1), normalization=norm,
                                            temperature=TAU, **MATS) for norm in ("softmax", "sinkhorn")}

z, w = np.polynomial.hermite_e.hermegauss(12)
nodes = M0 + np.stack(np.meshgrid(z, z, indexing="ij"), -1).reshape(-1, 2) @ np.linalg.cholesky(S0).T
weights = np.outer(w, w).ravel() / np.outer(w, w).sum()
for norm, ode in odes.items():
    x_end = sinkflow.simulate(nodes, norm, h=T_END / STEPS, steps=STEPS, integrator="rk4", temperature=TAU,
                              weights=weights, save_every=STEPS, **MATS).final
    mean = weights @ x_end
    cov = (x_end - mean).T @ ((x_end - mean) * weights[:, None])
    print(f"{LABELS[norm]:>8}, Gauss-Hermite particles at t = {T_END:g}: "
          f"mean off by {np.abs(mean - ode.means[-1]).max():.1e}, covariance by {np.abs(cov - ode.covs[-1]).max():.1e} "
          f"(the flow moved S by {np.abs(ode.covs[-1] - S0).max():.2f}; {ode.n_evaluations} ODE evaluations)")

# %%
NS = np.array([16, 64, 256]) if QUICK else np.array([16, 64, 256, 1024])
SEEDS = 8 if QUICK else 32
cpu = time.process_time()
errors, sample_paths = {}, {}
for norm, ode in odes.items():
    errors[norm] = []
    for n in NS:
        x0 = np.stack([np.random.default_rng(seed).multivariate_normal(M0, S0, size=n) for seed in range(SEEDS)])
        traj = sinkflow.simulate(x0, norm, h=T_END / STEPS, steps=STEPS, integrator="rk4", temperature=TAU, tol=1e-8,
                                 **MATS)
        mean, cov = moments(traj.final)
        errors[norm].append(np.linalg.norm(mean - ode.means[-1], axis=-1)
                            + np.linalg.norm(cov - ode.covs[-1], axis=(-2, -1)))  # one error per seed
        if n == NS[-1]:
            sample_paths[norm] = moments(np.asarray(traj.positions)[:, 0])  # seed 0, every step
    errors[norm] = np.array(errors[norm])  # (len(NS), SEEDS)
cpu_moments = time.process_time() - cpu

rng = np.random.default_rng(0)
for norm, err in errors.items():
    rms = np.sqrt(np.mean(err ** 2, axis=1))
    slope = sinkflow.fit_loglog_slope(NS, rms)[0]
    boot = [sinkflow.fit_loglog_slope(NS, np.sqrt(np.mean(err[:, rng.integers(0, SEEDS, SEEDS)] ** 2, axis=1)))[0]
            for _ in range(1000)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    print(f"{LABELS[norm]:>8}: error (|mean| + |cov|, rms over {SEEDS} seeds) at n = {NS.tolist()}: "
          f"{np.array2string(rms, precision=3)}; slope in n {slope:.2f} [{lo:.2f}, {hi:.2f}] (bootstrap over seeds)")
    if hi - lo > 0.4:
        too_short(cpu_moments * 6) if QUICK else print("    the interval is too wide to read the rate")
    elif lo <= -0.5 <= hi:
        print(f"    the sampling rate -1/2 is inside [{lo:.2f}, {hi:.2f}]: the particles follow the ODE up to sampling")
    else:
        print(f"    the sampling rate -1/2 is outside [{lo:.2f}, {hi:.2f}]")
print(f"({cpu_moments:.1f} s of CPU)")

# %%
times = np.linspace(0, T_END, STEPS + 1)
with style():
    fig, axes = new_figure(3, 1, width=8.0, height=2.5)
    for norm, ode in odes.items():
        err = errors[norm]
        axes[0, 0].loglog(NS, np.sqrt(np.mean(err ** 2, axis=1)), "o-", color=COLORS[norm], label=LABELS[norm])
        mean, cov = sample_paths[norm]
        for (i, j), marker in zip(((0, 0), (1, 1), (0, 1)), ("o", "s", "^"), strict=True):
            axes[0, 1 if norm == "softmax" else 2].plot(times, ode.covs[:, i, j], color=COLORS["reference"], lw=1)
            axes[0, 1 if norm == "softmax" else 2].plot(times, cov[:, i, j], marker, ms=3, color=COLORS[norm],
                                                        label=f"$S_{{{i + 1}{j + 1}}}$")
    ref = np.sqrt(np.mean(errors["sinkhorn"][0] ** 2)) * np.sqrt(NS[0] / NS)
    axes[0, 0].loglog(NS, ref, ":", color=COLORS["reference"], label=r"$n^{-1/2}$")
    axes[0, 0].set_xlabel("particles $n$")
    axes[0, 0].set_ylabel(f"error at t = {T_END:g}")
    axes[0, 0].legend()
    for col, norm in ((1, "softmax"), (2, "sinkhorn")):
        axes[0, col].set_title(f"{LABELS[norm]}: n = {NS[-1]} (markers), ODE (lines)", fontsize=8)
        axes[0, col].set_xlabel("$t$")
        axes[0, col].legend(fontsize=6)
    plt.show()

# %% [markdown]
# ## 3. The SoftMax blow-up
#
# Isotropic case: $W_Q = W_K = W_V = I$, $S = sI$. The SoftMax slope is $S A^\top = (s/\tau) I$, so
#
# $$\dot s = \frac{2s^2}{\tau}, \qquad s(t) = \frac{s_0}{1 - 2s_0 t/\tau}, \qquad
# m(t) = m_0\, e^t\,(1 - 2s_0t/\tau)^{-1/2},$$
#
# infinite at $t^* = \tau/(2s_0)$: `gaussian_moment_flow` raises `FloatingPointError` there. Sinkhorn's slope has
# norm below $s$ ($\|G\| < 1$), so $\dot s < 2s$ and it never blows up. Particles cannot blow up (each moves toward a
# convex combination of the others, so they spread at most exponentially); they follow the ODE while their
# sample represents the tilted Gaussian, and leave it as $t^*$ nears, where the tilt $e^{x^\top y/\tau}$ is carried
# by the few particles farthest out.

# %%
s0, tau_b, d = 0.4, 2.0, 2
t_star = tau_b / (2 * s0)
try:
    sinkflow.gaussian_moment_flow(np.zeros(d), s0 * np.eye(d), [0.0, 1.2 * t_star], normalization="softmax",
                                  temperature=tau_b)
except FloatingPointError as error:
    print("SoftMax moment ODE:", error)
check = np.linspace(0, 0.9 * t_star, 10)
soft = sinkflow.gaussian_moment_flow(np.zeros(d), s0 * np.eye(d), check, normalization="softmax", temperature=tau_b)
inverse_slope, inverse_start = np.polyfit(check, 1 / soft.covs[:, 0, 0], 1)
print(f"1/s(t) is linear: zero at t = {-inverse_start / inverse_slope:.6f}; the formula tau / (2 s0) = {t_star:g}")

N_BLOW = 400 if QUICK else 4000
h_b = 0.05
t_grid = np.arange(0, 0.96 * t_star + 1e-9, h_b)
x0 = np.random.default_rng(1).normal(scale=np.sqrt(s0), size=(N_BLOW, d))
cpu = time.process_time()
blow = {}
for norm in ("softmax", "sinkhorn"):
    ode = sinkflow.gaussian_moment_flow(np.zeros(d), s0 * np.eye(d), t_grid, normalization=norm, temperature=tau_b)
    traj = sinkflow.simulate(x0, norm, h=h_b, steps=len(t_grid) - 1, integrator="rk4", temperature=tau_b, tol=1e-8)
    var = moments(np.asarray(traj.positions))[1].trace(axis1=-2, axis2=-1) / d
    blow[norm] = (ode.covs[:, 0, 0], var)
cpu_blow = time.process_time() - cpu
for frac in (0.4, 0.8, 0.96):
    i = int(round(frac * t_star / h_b))
    print(f"t = {t_grid[i]:.2f} ({frac:.0%} of t*): SoftMax s = {blow['softmax'][0][i]:.3f} (ODE), "
          f"{blow['softmax'][1][i]:.3f} ({N_BLOW} particles); Sinkhorn s = {blow['sinkhorn'][0][i]:.3f} (ODE), "
          f"{blow['sinkhorn'][1][i]:.3f} (particles)")
print(f"Sinkhorn below 2s growth: s(t) / (s0 e^(2t)) = {blow['sinkhorn'][0][-1] / (s0 * np.exp(2 * t_grid[-1])):.3f} "
      f"at t = {t_grid[-1]:.2f} ({cpu_blow:.1f} s of CPU)")

# %%
with style():
    fig, axes = new_figure(1, 1, width=5.0, height=2.8)
    ax = axes[0, 0]
    for norm in ("softmax", "sinkhorn"):
        ax.semilogy(t_grid, blow[norm][0], color=COLORS[norm], label=f"{LABELS[norm]}, ODE")
        ax.semilogy(t_grid, blow[norm][1], "o", ms=2.5, color=COLORS[norm], label=f"{LABELS[norm]}, {N_BLOW} particles")
    ax.axvline(t_star, ls="--", color=COLORS["reference"], lw=0.8, label=r"$t^* = \tau/(2s_0)$")
    ax.set_xlabel("$t$")
    ax.set_ylabel("variance per coordinate $s$")
    ax.legend(fontsize=7)
    plt.show()

# %% [markdown]
# ## 4. Causal attention: Sinkhorn without collapse
#
# A lower-triangular matrix whose rows and columns all sum to 1 is the identity (the last column has one
# admissible entry, then the last row is full, and so on). So causal Sinkhorn with **uniform** key targets
# tends to the identity as the half-iterations $n_{\rm iter}$ grow: every token attends only to itself. sinkflow
# targets instead the key marginal of uniform causal attention,
#
# $$\beta_j = \frac1n \sum_{i \ge j} \frac1i = \frac{H_n - H_{j-1}}{n}$$
#
# (tokens numbered from 1), which constant scores meet with the masked average at every $n_{\rm iter}$. Measured
# on 8 tokens (`torch.manual_seed(0)`, queries and keys of width 4, scores $qk^\top/2$): the mean diagonal mass
# of the attention matrix against $n_{\rm iter}$, with the default targets and with uniform ones (`b` given).

# %%
torch.manual_seed(0)
q, k = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)
scores, mask = q @ k.T / 2, causal_mask(8)
uniform_b = torch.full((8,), 1 / 8, dtype=torch.float64)
n_iters = [1, 3, 9, 30, 100, 1000]
diag_new = [float(sinkflow.sinkhorn(scores, n_iter=i, mask=mask).diagonal().mean()) for i in n_iters]
diag_old = [float(sinkflow.sinkhorn(scores, n_iter=i, mask=mask, b=uniform_b).diagonal().mean()) for i in n_iters]
diag_softmax = float(sinkflow.softmax(scores, mask=mask).diagonal().mean())
print("n_iter                   " + "".join(f"{i:>8}" for i in n_iters))
print("default targets          " + "".join(f"{v:8.3f}" for v in diag_new))
print("uniform targets (b = 1/n)" + "".join(f"{v:8.3f}" for v in diag_old))
print(f"SoftMax: {diag_softmax:.3f}")
limit = sinkflow.sinkhorn(scores, mask=mask)  # to tolerance
harmonic = np.array([np.sum(1 / np.arange(j, 9)) / 8 for j in range(1, 9)])
print(f"column sums of the limit / 8 against (H_n - H_(j-1)) / n: largest difference "
      f"{np.abs(limit.sum(0).numpy() / 8 - harmonic).max():.1e}")
collapsed = diag_old[-1] > 0.95
held = abs(diag_new[-1] - diag_softmax) < 0.05
print(f"at n_iter = {n_iters[-1]}: uniform targets {'collapse to the identity' if collapsed else 'do not collapse'} "
      f"(diagonal {diag_old[-1]:.3f}); default targets {'stay at' if held else 'move away from'} the SoftMax level "
      f"(diagonal {diag_new[-1]:.3f} against {diag_softmax:.3f})")

# %% [markdown]
# ### The causal flow: consensus at rate 1/2, and not causal in information
#
# With $W_V = I$ on the sphere, row 1 has one admissible key, so the first token never moves, and every token
# converges to it. At consensus the scores are constant, so SoftMax and causal Sinkhorn are both the masked
# average; linearized, $\dot\delta_i = \frac1i\sum_{j\le i}\delta_j - \delta_i$, eigenvalues $-(i-1)/i$, the slowest
# $-1/2$ whatever $\beta$ and the normalization (Euler steps of $h$: $-\log(1 - h/2)/h$). Below, 5 tokens on
# $S^2$, $\beta = 1$, $h = 0.2$: the spread $\max_i\|x_i - x_1\|$ and its decay rate over the second half of the
# run. Then the last token is moved: a Sinkhorn column step sums over every query, so the earlier tokens
# feel it; SoftMax's earlier tokens do not.

# %%
x5 = sinkflow.random_particles(5, 3, seed=0, manifold="sphere")
moved = x5.copy()
moved[-1] = -moved[-1]
h_c, steps_c = 0.2, 300
expected = -np.log(1 - h_c / 2) / h_c
for norm in ("softmax", "sinkhorn"):
    paths = [np.asarray(sinkflow.simulate(x, norm, h=h_c, steps=steps_c, manifold="sphere", causal=True).positions)
             for x in (x5, moved)]
    spread = np.linalg.norm(paths[0] - paths[0][:, :1], axis=-1).max(-1)
    half = slice(steps_c // 2, None)
    rate = -np.polyfit(h_c * np.arange(steps_c + 1)[half], np.log(spread[half]), 1)[0]
    first_fixed = np.abs(paths[0][:, 0] - x5[0]).max()
    change = np.abs(paths[0][:, :4] - paths[1][:, :4]).max()
    print(f"{LABELS[norm]:>8}: decay rate {rate:.4f} (linearization, Euler: {expected:.4f}); first token moved by "
          f"{first_fixed:.1e}; flipping the last token moves tokens 1-4 by up to {change:.1e}")

# %% [markdown]
# ### Metastable clusters and Rényi parking
#
# From i.i.d. uniform tokens on the circle, causal dynamics pass through long-lived clusters whose centers
# Karagodin, Polyanskiy and Rigollet relate to a Rényi parking process: token $i$ becomes a center when it lies
# farther than $\delta = 4\beta^{-1/2}$ from every earlier center (`renyi_centers`). Their setting is $n = 200$,
# $\beta = 64$, $t \le 30$ (the full mode here; the quick mode runs $n = 32$, $\beta = 16$, $t \le 10$). Clusters
# are the connected components of $\langle x_i, x_j\rangle > 1 - 10^{-3}$ (the `"clusters"` monitor). Causal
# Sinkhorn does not collapse in the flow either: it keeps many clusters, like SoftMax, neither one (full
# consensus) nor $n$ (frozen tokens). The comparison with the Rényi count is read only on a plateau: the count
# unchanged over the last third of the run in every seed.

# %%
N_C, BETA_C, T_C, SEEDS_C = (32, 16.0, 10.0, 3) if QUICK else (200, 64.0, 30.0, 4)
xc = np.stack([sinkflow.random_particles(N_C, 2, seed=s, manifold="sphere") for s in range(SEEDS_C)])
h_safe = min(sinkflow.particles.largest_safe_step(xc[s], "sinkhorn", temperature=1 / BETA_C) for s in range(SEEDS_C))
h_c2 = min(0.05, 0.99 * h_safe)
steps_c2 = int(np.ceil(T_C / h_c2))
every = max(1, steps_c2 // 60)
renyi = [len(renyi_centers(xc[s], 4 / np.sqrt(BETA_C))) for s in range(SEEDS_C)]
cpu = time.process_time()
causal_counts = {}
for norm in ("softmax", "sinkhorn"):
    traj = sinkflow.simulate(xc, norm, h=h_c2, steps=steps_c2, manifold="sphere", temperature=1 / BETA_C,
                             causal=True, tol=1e-8, monitors=["clusters"], monitor_every=every, save_every=steps_c2)
    causal_counts[norm] = (traj.monitor_times, np.asarray(traj.monitors["cluster_count"]))  # (readings, seeds)
cpu_causal = time.process_time() - cpu
print(f"n = {N_C}, beta = {BETA_C:g}, h = {h_c2:.3g}, t = {T_C:g}, {SEEDS_C} seeds ({cpu_causal:.1f} s of CPU)")
print(f"Rényi centers (delta = {4 / np.sqrt(BETA_C):.2f}): {renyi}")
FULL_CAUSAL_S = 150  # full mode, scaled from one seed at n = 200 and h = 0.05 (SoftMax 0.8 s, Sinkhorn 11 s)
for norm, (times_c, counts) in causal_counts.items():
    last_third = counts[times_c >= 2 * T_C / 3]
    change = np.abs(last_third - last_third[-1]).max(0)  # per seed
    print(f"{LABELS[norm]:>8}: clusters at t = {T_C / 2:g}: {counts[np.searchsorted(times_c, T_C / 2)].tolist()}, "
          f"at t = {times_c[-1]:g}: {counts[-1].tolist()} (between 1 and n = {N_C} in "
          f"{np.sum((counts[-1] > 1) & (counts[-1] < N_C))}/{SEEDS_C} seeds); "
          f"largest change over the last third: {change.tolist()}")
    if change.max() <= 1:  # a plateau: read the count against the Rényi centers
        diff = counts[-1] - np.array(renyi)
        print(f"    on a plateau: count minus Rényi centers {diff.tolist()} (mean absolute {np.abs(diff).mean():.1f})")
    elif QUICK:
        too_short(FULL_CAUSAL_S)
    else:
        print("    still merging at the end of the run: no plateau to compare with the Rényi centers")

# %%
with style():
    fig, axes = new_figure(1, 1, width=5.0, height=2.8)
    ax = axes[0, 0]
    for norm, (times_c, counts) in causal_counts.items():
        for s in range(SEEDS_C):
            ax.plot(times_c, counts[:, s], color=COLORS[norm], alpha=0.7, label=LABELS[norm] if s == 0 else None)
    for s, r in enumerate(renyi):
        ax.axhline(r, ls="--", color=PALETTE[2], lw=0.8, label="Rényi centers" if s == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("$t$")
    ax.set_ylabel("clusters")
    ax.set_title(rf"causal flows, $n={N_C}$, $\beta={BETA_C:g}$", fontsize=9)
    ax.legend()
    plt.show()

# %% [markdown]
# ### Try it: the moment ODE against particles
#
# The sliders set the temperature $\tau$, the angle of a rotation $W_V$ (scaled by 0.6) and the number of
# particles $n$; the cell runs $n$ sampled particles and the ODE from the Gaussian (same $W_Q, W_K$ as above),
# SoftMax and Sinkhorn, and draws the covariance entries against time. Small $\tau$ sharpens the tilt
# $e^{x^\top Ay}$: SoftMax then weighs the tails of the sample, and its particles stray further from the ODE.
# Without ipywidgets the cell draws the default once.

# %%
def explore_moments(tau=1.5, angle=0.6, n=128):
    rot = 0.6 * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    mats = {"W_Q": WQ, "W_K": WK, "W_V": rot}
    x0 = np.random.default_rng(0).multivariate_normal(M0, S0, size=int(n))
    t = np.linspace(0, T_END, STEPS + 1)
    with style():
        fig, axes = new_figure(2, 1, width=7.0, height=2.6, sharey=True)
        for ax, norm in zip(axes[0], ("softmax", "sinkhorn"), strict=True):
            for last in range(len(t), 1, -1):  # SoftMax may blow up before T_END: the ODE up to its last time
                try:
                    ode = sinkflow.gaussian_moment_flow(M0, S0, t[:last], normalization=norm, temperature=tau, **mats)
                    break
                except FloatingPointError:
                    continue
            traj = sinkflow.simulate(x0, norm, h=T_END / STEPS, steps=STEPS, integrator="rk4", temperature=tau,
                                     tol=1e-8, **mats)
            cov = moments(np.asarray(traj.positions))[1]
            for (i, j), color in zip(((0, 0), (1, 1), (0, 1)), PALETTE, strict=False):
                ax.plot(ode.times, ode.covs[:, i, j], color=color, lw=1)
                ax.plot(t, cov[:, i, j], "o", ms=3, color=color, label=f"$S_{{{i + 1}{j + 1}}}$")
            err = np.abs(cov[len(ode.times) - 1] - ode.covs[-1]).max()
            blown = "" if len(ode.times) == len(t) else " (the ODE blows up after)"
            ax.set_title(rf"{LABELS[norm]}, $\tau={tau:g}$, n={int(n)}: |ΔS| = {err:.3f} "
                         rf"at t = {ode.times[-1]:g}{blown}",
                         fontsize=8)
            ax.set_yscale("symlog", linthresh=1.0)
            ax.set_xlabel("$t$")
        axes[0, 0].legend(fontsize=7)
        plt.show()


interact(explore_moments, tau=(0.8, 3.0, 0.1), angle=(0.0, 3.1, 0.1), n=(32, 256, 32));

# %% [markdown]
# ## Exercises
#
# 1. **Multi-head.** Stack two heads (`heads=2`, `W_Q` of shape `(2, 1, 2)`) in `gaussian_moment_flow` and check
#    the summed field against `simulate` with a hand-written two-head velocity.
# 2. **The heat layer.** `W_V = -(2/eps) I`, `drift = (2/eps) I`, `temperature = eps`, `scores="gaussian"` is the
#    rescaled layer of `heat_flow`. Check that the Sinkhorn variance rate is
#    $8S/(2S + \varepsilon + \sqrt{\varepsilon^2 + 4S^2})$ in 1D and compare with notebook 03.
# 3. **Blow-up with a general $W$.** With $W_Q^\top W_K$ not a multiple of $I$, find the blow-up time of the SoftMax ODE
#    numerically. Which eigenvalue of $S A^\top$ controls it?
# 4. **Causal in information.** Implement the variant that solves one Sinkhorn problem per prefix (row $i$ from the
#    $i \times i$ problem) and check that moving the last token no longer moves the others. What does it cost?
# 5. **Rényi, longer.** Run the causal flows of the last section to $t = 150$ with $h = 0.1$: do the counts keep
#    merging below the Rényi count?
