# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Normalization placements and value-matrix geometry
#
# **What this notebook shows.** Two ways a transformer layer shapes the motion of its tokens, each measured on
# particles (docs/theory/placements.md, docs/theory/value_geometry.md):
#
# 1. **Where the normalization sits** (Karagodin, Ge, Polyanskiy and Rigollet, NeurIPS 2025). Post-LN, Pre-LN,
#    Peri-LN, Mix-LN, nGPT and LN-scaling written as layers, one cell each, checked against
#    `simulate(..., norm=...)`; then the exact equiangular reduction (`equiangular_flow`) against particles,
#    its tails ($e^{-2t}$ on the sphere, $t^{-2}$ when the norm grows), Peri-LN's early speed, and the
#    placements' clustering speed and collapse from random starts beside the paper's claimed ordering.
# 2. **What the value matrix $V$ does** without normalization (Geshkovski, Letrouit, Polyanskiy and Rigollet,
#    NeurIPS 2023). In the rescaled frame $z = e^{-tV}x$, SoftMax tokens end on the vertices
#    of a polytope ($V = I$), on at most three hyperplanes (a simple top eigenvalue), and in $d = 1$ the
#    attention becomes Boolean with few leaders. Sinkhorn, which those theorems do not cover, freezes instead;
#    and Sinkhorn is a Wasserstein gradient flow only for a symmetric $V = W$ (Sander et al., AISTATS 2022).
#
# Set `SINKFLOW_QUICK=1` for a fast run (under a minute); inside Jupyter, uncomment
# `os.environ["SINKFLOW_QUICK"] = "1"` in the first code cell. Where a quick run is too small to decide a
# claim, the cell says so.

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import scipy.spatial
import torch

import sinkflow
from sinkflow.particles import attention_rank
from sinkflow.plots import get
from sinkflow.plots.placements import NORM_COLORS, NORM_LABELS
from sinkflow.plots.style import COLORS, LABELS, new_figure, style

# Quick mode (small sizes, seconds): start Jupyter with SINKFLOW_QUICK=1, or uncomment the
# next line and re-run this cell (and the cells below).
# os.environ["SINKFLOW_QUICK"] = "1"
QUICK = os.environ.get("SINKFLOW_QUICK", "0") == "1"
torch.set_num_threads(1)  # small dense ops: one thread is fastest on a shared machine (docs/performance.md)


def too_short(seconds):
    print(f"    quick mode: too short to decide; run with SINKFLOW_QUICK=0 (about {seconds:.0f} s)")


# %% [markdown]
# ## 1. The placements, layer by layer
#
# Tokens $x_1, \dots, x_n$, the attention field $A(x)_i = \sum_j K_{ij} x_j$ with SoftMax weights
# $K_{ij} \propto e^{\beta\langle x_i, x_j\rangle}$ ($Q = K = V = I$), the normalization $N(x) = x/|x|$ token by
# token, the step $h$ and the layer count $l$. Each cell below writes one placement's layer by hand in numpy,
# runs four layers of it from the same tokens, compares with `simulate(..., norm=name, integrator="euler")`
# (the practitioners' layer; RK4 integrates the continuous model instead), and prints what the layers do: the
# norm of the first token, and $\bar\rho$, the mean pairwise inner product of the directions of all five tokens
# (closer to 1: more clustered).

# %%
BETA, H, LAYERS = 2.0, 0.25, 4  # h below the largest safe Euler step (0.4 here; simulate warns above it)
X_SPHERE = sinkflow.random_particles(5, 3, seed=0, manifold="sphere")
X_FREE = X_SPHERE * np.array([[1.0], [2.0], [0.5], [1.5], [1.0]])  # the same directions, other norms


def attend(X):
    """A(X) = softmax(beta X X^T) X, by hand."""
    S = BETA * X @ X.T
    P = np.exp(S - S.max(1, keepdims=True))
    return (P / P.sum(1, keepdims=True)) @ X


def N(X):
    return X / np.linalg.norm(X, axis=-1, keepdims=True)


def mean_inner(X):
    theta = N(X)
    G = theta @ np.swapaxes(theta, -1, -2)
    n = X.shape[-2]
    return (G.sum((-1, -2)) - np.trace(G, axis1=-2, axis2=-1)) / (n * (n - 1))


def show_layers(name, x0, layer):
    hand = [x0]
    for k in range(LAYERS):
        hand.append(layer(hand[-1], k))
    hand = np.array(hand)
    ours = np.asarray(sinkflow.simulate(x0, "softmax", h=H, steps=LAYERS, integrator="euler", temperature=1 / BETA,
                                        norm=name).positions)
    gaps[name] = np.abs(ours - hand).max()
    print(f"{name}: |simulate - the layer by hand| = {gaps[name]:.1e} over {LAYERS} layers (h = {H:g})")
    print("    |x_1|:      " + " -> ".join(f"{v:.3f}" for v in np.linalg.norm(hand[:, 0], axis=-1)))
    print("    mean rho:   " + " -> ".join(f"{v:.3f}" for v in mean_inner(hand)))
    return hand


layers, gaps = {}, {}

# %% [markdown]
# **Post-LN**, $x \leftarrow N(x + hA(x))$: the residual step, then back to the sphere. Tokens start and stay
# at norm 1; only directions move.

# %%
layers["post"] = show_layers("post", X_SPHERE, lambda X, k: N(X + H * attend(X)))

# %% [markdown]
# **Pre-LN**, $x \leftarrow x + hA(N(x))$: the branch sees normalized tokens, the residual stream does not.
# Each layer adds a vector of norm at most 1, so norms grow (like $t$ once tokens agree) and the same angular
# push turns a longer token less: Pre-LN slows down as it goes.

# %%
layers["pre"] = show_layers("pre", X_FREE, lambda X, k: X + H * attend(N(X)))

# %% [markdown]
# **Peri-LN**, $x \leftarrow x + hN(A(N(x)))$: the branch's output is normalized too, so every token moves by
# exactly $h$. Early, while the field is an average of spread directions ($|A| < 1$), that is a longer step than
# Pre-LN's.

# %%
layers["peri"] = show_layers("peri", X_FREE, lambda X, k: X + H * N(attend(N(X))))

# %% [markdown]
# **Mix-LN**: Post-LN for the first quarter of the layers (`split=0.25`; here layer 0), then Pre-LN. Tokens
# start on the sphere and leave it once the Pre-LN layers begin.

# %%
layers["mix"] = show_layers("mix", X_SPHERE,
                            lambda X, k: N(X + H * attend(X)) if k < round(0.25 * LAYERS) else X + H * attend(N(X)))

# %% [markdown]
# **nGPT**, $x \leftarrow N(x + \alpha h(N(A(x)) - x))$ ($\alpha = 1$): on the sphere, each token moves toward
# the normalized field direction, a step that does not shrink as tokens spread.

# %%
layers["ngpt"] = show_layers("ngpt", X_SPHERE, lambda X, k: N(X + H * (N(attend(X)) - X)))

# %% [markdown]
# **LN-scaling**, $x \leftarrow x + hA(N(x))/\sqrt{1 + lh}$: Pre-LN with layer $l$'s branch divided by
# $\sqrt{1 + lh}$ (Sun et al., *The Curse of Depth in Large Language Models*): deeper layers move tokens less.

# %%
layers["lnscale"] = show_layers("lnscale", X_FREE, lambda X, k: X + H * attend(N(X)) / np.sqrt(1 + k * H))
worst = max(gaps.values())
print(f"largest difference between the hand-written layers and simulate, six placements: {worst:.1e} "
      f"({'within 1e-12: the same layers' if worst < 1e-12 else 'NOT within 1e-12: different layers'})")

# %% [markdown]
# ## 2. Equiangular tokens: the exact reduction against particles
#
# Tokens whose directions have all pairwise inner products equal to $\rho$ (and all norms equal to $r$) stay so
# under every placement: the attention matrix is $aI + b(E - I)$, symmetric with equal row sums, hence already
# doubly stochastic, so **Sinkhorn is SoftMax** on such tokens. The particles are a linear image of two
# coefficients, and `equiangular_flow` integrates those with the particles' own integrator and step, so
# `simulate` from `equiangular_start` follows it to rounding. Below: $n = d = 6$, $\beta = 2$, $\rho_0 = 0$,
# RK4, for SoftMax and Sinkhorn under Post-LN, Pre-LN and Peri-LN; the largest difference in $\rho$ (over all
# pairs) and in $r$ (over all tokens), and between Sinkhorn's and SoftMax's particles.

# %%
N_EQ, RHO0, H_EQ, T_EQ = 6, 0.0, 0.01, 4.0
x_eq = sinkflow.equiangular_start(N_EQ, N_EQ, RHO0)
steps_eq = round(T_EQ / H_EQ)
off = ~np.eye(N_EQ, dtype=bool)
paths = {}
for norm in ("post", "pre", "peri"):
    for attention in ("softmax", "sinkhorn"):
        X = np.asarray(sinkflow.simulate(x_eq, attention, h=H_EQ, steps=steps_eq, integrator="rk4",
                                         temperature=1 / BETA, norm=norm, tol=1e-13).positions)
        paths[attention, norm] = X
        flow = sinkflow.equiangular_flow(N_EQ, RHO0, beta=BETA, attention=attention, norm=norm, T=T_EQ, h=H_EQ)
        theta = N(X)
        G = theta @ np.swapaxes(theta, -1, -2)
        rho_gap = np.abs(G[:, off] - flow.rho[:, None]).max()
        r_gap = np.abs(np.linalg.norm(X, axis=-1) - flow.r[:, None]).max()
        print(f"{NORM_LABELS[norm]:>8}, {LABELS[attention]:>8}: particles against equiangular_flow up to t = {T_EQ:g}: "
              f"rho off by {rho_gap:.1e}, r off by {r_gap:.1e} "
              f"({'within' if max(rho_gap, r_gap) < 1e-12 else 'NOT within'} 1e-12; "
              f"rho(T) = {flow.rho[-1]:.4f}, r(T) = {flow.r[-1]:.3f})")
    gap = np.abs(paths["sinkhorn", norm] - paths["softmax", norm]).max()
    print(f"{'':>8}  Sinkhorn's particles against SoftMax's: {gap:.1e}"
          f" ({'the same flow to rounding' if gap < 1e-10 else 'different flows'})")

# %% [markdown]
# ### The tails: exponential on the sphere, polynomial when the norm grows
#
# Near $\rho = 1$, $a, b \to 1/n$, so $\frac{d}{dt}(1 - \rho) \approx -2(1-\rho) \times$ (the placement's
# speed). Post-LN and nGPT keep $r = 1$: $1 - \rho \sim Ce^{-2t}$. Pre-LN and Peri-LN grow $r \approx t$:
# $1 - \rho \sim Ct^{-2}$. LN-scaling grows $r \approx 2\sqrt{1 + t}$: $1 - \rho \sim Ct^{-1}$, approached slowly
# (the local exponent tends to $-1$ like $t^{-1/2}$). The reduced flow is cheap, so both modes run it to a long
# horizon and fit the second half: the slope of $\log(1-\rho)$ in $t$ (sphere) or in $\log t$ (the others).

# %%
T_TAIL, H_TAIL = 1000.0, 0.2
tails = {}
for norm, law, expected, tol in (("post", "exp", -2.0, 0.01), ("ngpt", "exp", -2.0, 0.01),
                                 ("pre", "power", -2.0, 0.05), ("peri", "power", -2.0, 0.05),
                                 ("lnscale", "power", -1.0, 0.1)):
    T_fit, h_fit = (10.0, 0.01) if law == "exp" else (T_TAIL, H_TAIL)
    flow = sinkflow.equiangular_flow(N_EQ, RHO0, beta=BETA, norm=norm, T=T_fit, h=h_fit)
    half = slice(len(flow.times) // 2, None)
    x_axis = flow.times[half] if law == "exp" else np.log(flow.times[half])
    slope = np.polyfit(x_axis, np.log(1 - flow.rho[half]), 1)[0]
    tails[norm] = flow
    form = f"e^({expected:g} t)" if law == "exp" else f"t^({expected:g})"
    axis = "t" if law == "exp" else "log t"
    word = "agrees with" if abs(slope - expected) < tol else "differs from"
    print(f"{NORM_LABELS[norm]:>10}: slope of log(1 - rho) in {axis} over t in [{T_fit / 2:g}, {T_fit:g}]: "
          f"{slope:.3f}; {word} {form} (tolerance {tol:g})")

# %% [markdown]
# ### Early on, Peri-LN and nGPT move faster
#
# Early the field $A(x)_i$ averages spread unit vectors, so its norm $m$ is below 1. Peri-LN divides it out
# (speed $1/(rm)$ against Pre-LN's $1/r$), nGPT too (speed $\alpha/m$ against Post-LN's 1). The value of
# $\rho(1)$ from $\rho_0 = 0$ ($n = 6$, $\beta = 2$) under each placement:

# %%
rho1 = {norm: float(sinkflow.equiangular_flow(N_EQ, RHO0, beta=BETA, norm=norm, T=1.0, h=H_EQ).rho[-1])
        for norm in NORM_LABELS}
print("rho(1): " + ", ".join(f"{NORM_LABELS[k]} {v:.3f}" for k, v in sorted(rho1.items(), key=lambda kv: -kv[1])))
faster = rho1["peri"] > max(rho1["pre"], rho1["post"]) and rho1["ngpt"] > rho1["post"]
print(f"Peri-LN ({rho1['peri']:.3f}) ahead of Pre-LN ({rho1['pre']:.3f}) and Post-LN ({rho1['post']:.3f}), nGPT "
      f"({rho1['ngpt']:.3f}) ahead of Post-LN: {'yes' if faster else 'no'}")

# %%
with style():
    fig, axes = new_figure(2, 1, width=4.0, height=2.8)
    for norm, flow in tails.items():
        ax = axes[0, 0] if norm in ("post", "ngpt") else axes[0, 1]
        keep = flow.times > 0
        if norm in ("post", "ngpt"):
            ax.semilogy(flow.times, 1 - flow.rho, color=NORM_COLORS[norm], label=NORM_LABELS[norm])
        else:
            ax.loglog(flow.times[keep], 1 - flow.rho[keep], color=NORM_COLORS[norm], label=NORM_LABELS[norm])
    t = np.linspace(0, 10, 50)
    axes[0, 0].semilogy(t, 0.5 * np.exp(-2 * t), ":", color=COLORS["reference"], label=r"$\propto e^{-2t}$")
    t = np.geomspace(10, T_TAIL, 50)
    axes[0, 1].loglog(t, 20 / t ** 2, ":", color=COLORS["reference"], label=r"$\propto t^{-2}$")
    axes[0, 1].loglog(t, 2 / t, "--", color=COLORS["reference"], lw=0.8, label=r"$\propto t^{-1}$")
    for ax, title in zip(axes[0], ("sphere: exponential", "growing norm: polynomial"), strict=True):
        ax.set_xlabel("$t$")
        ax.set_ylabel(r"$1 - \rho(t)$")
        ax.set_title(f"equiangular, n = {N_EQ}, beta = {BETA:g}: {title}", fontsize=8)
        ax.legend(fontsize=7)
    plt.show()

# %% [markdown]
# ## 3. Clustering speed and collapse from random starts
#
# Equiangular starts are a rate, not a typical start. The registered figure `norm_placements` runs $n = 16$
# tokens drawn uniformly on $S^{15}$, each placement's continuous model (RK4, $\beta = 2$), over an ensemble of
# seeds (the same starts for every placement), SoftMax beside Sinkhorn; dashed, the equiangular flow from
# $\rho_0 = 0$. Then the paper's ordering, claim by claim, against the seeds: a claim "A before B" is read
# seed by seed, and decided only when every seed orders them the same way. The abstract calls Peri-LN "a
# particularly effective choice" without a measurable statement; it is read here as clustering faster early than
# Pre-LN while staying away from Post-LN's exponential collapse (two claims).

# %%
spec = get("norm_placements")
cfg = spec.quick if QUICK else spec.full
cpu = time.process_time()
placed = spec.compute(cfg)
cpu_placed = time.process_time() - cpu
FULL_PLACED_S = cpu_placed * spec.full.seeds / cfg.seeds * spec.full.T / cfg.T  # CPU time scales with both
t_saved = placed["times"]
i1, iT = int(np.argmin(np.abs(t_saved - 1.0))), len(t_saved) - 1
print(f"n = d = {cfg.n}, beta = {cfg.beta:g}, h = {cfg.h:g}, T = {cfg.T:g}, {cfg.seeds} seeds "
      f"({cpu_placed:.1f} s of CPU)")
for kind in ("softmax", "sinkhorn"):
    print(f"{LABELS[kind]}: median rho(1) | median 1 - rho(T):")
    for norm in NORM_LABELS:
        gap = placed[f"gap_{kind}_{norm}"]  # (seeds, saved)
        print(f"    {NORM_LABELS[norm]:>10}: {np.median(1 - gap[:, i1]):.3f} | {np.median(gap[:, iT]):.2e}")
with style():
    fig = spec.plot(placed, cfg)
    plt.show()

# %%
CLAIMS = [  # (claim, source, the placement said to be larger, the other, "early": rho(1) / "late": 1 - rho(T))
    ("Peri-LN clusters faster early than Pre-LN", "abstract, 'particularly effective'", "peri", "pre", "early"),
    ("Peri-LN resists collapse better than Post-LN", "abstract, 'particularly effective'", "peri", "post", "late"),
    ("Peri-LN clusters faster early than Post-LN", "secondary summaries", "peri", "post", "early"),
    ("nGPT clusters faster early than Post-LN", "secondary summaries", "ngpt", "post", "early"),
    ("Pre-LN resists collapse better than Post-LN", "secondary summaries", "pre", "post", "late"),
    ("Mix-LN resists collapse better than Post-LN", "secondary summaries", "mix", "post", "late"),
    ("nGPT resists collapse better than Post-LN", "secondary summaries", "ngpt", "post", "late"),
]
for kind in ("softmax", "sinkhorn"):
    print(f"{LABELS[kind]} (seed by seed, {cfg.seeds} seeds):")
    for claim, source, big, small, when in CLAIMS:
        # early: rho(1) = 1 - gap at t = 1; late: the gap 1 - rho(T)
        one, other = ((1 - placed[f"gap_{kind}_{norm}"][:, i1]) if when == "early"
                      else placed[f"gap_{kind}_{norm}"][:, iT] for norm in (big, small))
        wins = int(np.sum(one > other))
        what = "rho(1)" if when == "early" else f"1 - rho({cfg.T:g})"
        numbers = (f"{what} median {np.median(one):.3g} ({NORM_LABELS[big]}) against "
                   f"{np.median(other):.3g} ({NORM_LABELS[small]}), larger in {wins}/{cfg.seeds} seeds")
        if wins == cfg.seeds:
            print(f"    agrees: {claim} [{source}]: {numbers}")
        elif wins == 0:
            print(f"    CONTRADICTS: {claim} [{source}]: {numbers}")
            print(f"      why: {NORM_LABELS[big]} is behind in every seed"
                  + (" (nGPT at alpha = 1 collapses at Post-LN's exponential rate, ahead of it since m < 1 early;"
                     " it resists only with a smaller step alpha h)" if big == "ngpt" else ""))
        elif QUICK:
            print(f"    {claim}: {numbers}")
            too_short(FULL_PLACED_S)
        else:
            print(f"    undecided: {claim}: {numbers}; the seeds disagree")

# %% [markdown]
# ## 4. Value matrices: the limit geometry
#
# Without normalization, $\dot x_i = \sum_j P_{ij} V x_j$ with SoftMax $P$ (scores $\langle Qx_i, Kx_j\rangle$).
# In the rescaled frame $z_i = e^{-tV}x_i$ (`Trajectory.rescaled(V)`) the flow is a consensus whose attention
# sharpens as $e^{tV}$ grows. Geshkovski et al.'s theorems (hypotheses on docs/theory/value_geometry.md): with
# $V = I$ and $Q^\top K \succ 0$ each $z_i$ ends on a vertex of a convex polytope (their Theorem 3.1); with a
# simple positive top eigenvalue $\lambda_1$ (eigenvector $\varphi_1$, $\langle Q\varphi_1, K\varphi_1\rangle > 0$)
# the $z_i$ end on at most three hyperplanes $\{\langle z, \varphi_1\rangle = c\}$ (Theorem 4.1). The
# registered figure `value_geometry` runs both, SoftMax beside Sinkhorn ($n = 24$ tokens in $[-2, 2]^2$,
# $Q = K = I$, RK4); `limit_geometry` classifies each end state, and the cell checks the polytope case
# independently with `scipy.spatial.ConvexHull`.

# %%
vspec = get("value_geometry")
vcfg = vspec.quick if QUICK else vspec.full
cpu = time.process_time()
vg = vspec.compute(vcfg)
cpu_vg = time.process_time() - cpu
print(f"n = {vcfg.n}, T = {vcfg.h * vcfg.steps:g} ({cpu_vg:.1f} s of CPU)")
for case, theorem, expected in (("identity", "Theorem 3.1", "polytope vertices"),
                                ("simple", "Theorem 4.1", "hyperplanes")):
    V = vg[f"{case}_V"]
    for norm in ("softmax", "sinkhorn"):
        z = vg[f"{case}_{norm}_final"]
        g = sinkflow.limit_geometry(z, V, W=np.eye(2), tol=vcfg.tol)
        rank, leaders = int(vg[f"{case}_{norm}_rank"][-1]), int(vg[f"{case}_{norm}_leaders"][-1])
        line = (f"{'V = I' if case == 'identity' else 'simple top eigenvalue'}, {LABELS[norm]:>8}: {g.kind}, "
                f"count {g.count} ({g.theorem}, hypotheses {'met' if g.hypotheses else 'not met'}); "
                f"attention rank {rank}, {leaders} leaders")
        print(line)
        if norm == "softmax" and case == "identity":
            centers = np.array([z[g.labels == k].mean(0) for k in range(g.count)])
            hull = scipy.spatial.ConvexHull(centers) if g.count >= 3 else None
            on_hull = g.count if hull is None else len(hull.vertices)
            print(f"    ConvexHull of the {g.count} distinct end points has {on_hull} vertices: "
                  f"{'agrees with' if g.kind == expected and on_hull == g.count else 'differs from'} {theorem}")
        elif norm == "softmax":
            print(f"    levels along phi_1: {np.round(g.levels, 3).tolist()} ({g.count} <= 3): "
                  f"{'agrees with' if g.kind == expected and g.count <= 3 else 'differs from'} {theorem}")
        else:
            print(f"    Sinkhorn (not covered by the theorems): {g.reason}")
with style():
    fig = vspec.plot(vg, vcfg)
    plt.show()

# %% [markdown]
# ### $d = 1$: Boolean attention and its leaders
#
# In $d = 1$ with $V > 0$ and $QK > 0$ (their Theorem 2.1) the attention matrix $P(t)$ tends to a Boolean
# $P^*$, doubly exponentially fast. The order of the tokens is kept, so the limit is known: a token with
# $x_i > 0$ attends to the largest initial token, one with $x_i < 0$ to the smallest. A **leader** is a token
# some other token gives more than half of its attention (`attention_rank` returns the numerical rank of $P$ and
# the number of leaders); at a Boolean limit the rank equals the number of leaders. Eight tokens of both signs,
# $Q = 3$, $K = V = 1$, RK4 at $h = 0.01$:

# %%
x1 = np.array([-1.3, -0.8, -0.2, 0.1, 0.4, 0.9, 1.2, 1.6])[:, None]
traj1 = sinkflow.simulate(x1, "softmax", W_Q=[[3.0]], W_K=[[1.0]], W_V=[[1.0]], h=0.01, steps=400, integrator="rk4",
                          save_every=50)
P_star = np.zeros((8, 8))
P_star[x1[:, 0] > 0, np.argmax(x1)] = 1
P_star[x1[:, 0] < 0, np.argmin(x1)] = 1
for t, X in zip(np.asarray(traj1.times), np.asarray(traj1.positions), strict=True):
    S = 3 * X @ X.T
    P = np.exp(S - S.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    rank, leaders = attention_rank(P)
    print(f"t = {t:.1f}: max |P - P*| = {np.abs(P - P_star).max():.1e}, rank {rank}, leaders {leaders}")
print(f"P* has rank {np.linalg.matrix_rank(P_star)}; leaders: tokens {np.flatnonzero(P_star.max(0) > 0.5).tolist()} "
      f"(the smallest and the largest initial token)")
boolean = np.abs(P - P_star).max() < 1e-12 and rank == leaders == np.linalg.matrix_rank(P_star)
print(f"at t = {t:.1f}: |P - P*| = {np.abs(P - P_star).max():.1e}, rank {rank} = leaders {leaders}: "
      f"{'agrees with' if boolean else 'differs from'} the Boolean limit of Theorem 2.1")

# %% [markdown]
# ### Sinkhorn: a gradient flow only for a symmetric $V = W$
#
# With $W = Q^\top K$ symmetric and $V = W$, the Sinkhorn field $\sum_j K^\infty_{ij} W x_j$ is
# $-\frac{1}{a_i}\nabla_{x_i}F^\infty$, a Wasserstein gradient flow (Sander et al., *Sinkformers*, AISTATS 2022).
# `gradient_flow_error(x, "sinkhorn", W=W, W_V=V)` measures $\|K^\infty(V - W)x\| / \|K^\infty Vx\|$, the distance
# of another value matrix's field from that gradient. Closed forms: 0 for $V = W$; $|c - 1|/|c|$ for $V = cW$
# (the same flow in time $ct$, but not the gradient itself); $1/\sqrt 2$ for $V = I + S$ with $W = I$ and $S$ a
# quarter turn ($S x \perp x$ token by token after the average). Twelve Gaussian points in $\mathbb R^2$:

# %%
xg = np.random.default_rng(0).normal(size=(12, 2))
W_sym = np.array([[1.0, 0.4], [0.4, 0.7]])
quarter = np.array([[0.0, -1.0], [1.0, 0.0]])
c, s = np.cos(0.5), np.sin(0.5)
R = np.array([[c, -s], [s, c]])
cases = [("W", "V = W", W_sym, W_sym, 0.0), ("W", "V = 3W", W_sym, 3 * W_sym, 2 / 3),
         ("I", "V = I + S", np.eye(2), np.eye(2) + quarter, 1 / np.sqrt(2)),
         ("I", "V = R diag(1, -1/2) R^T", np.eye(2), R @ np.diag([1.0, -0.5]) @ R.T, None)]
for wname, vname, W, V, closed in cases:
    err = sinkflow.gradient_flow_error(xg, "sinkhorn", W=W, W_V=V)
    tail = "" if closed is None else (f"; closed form {closed:.4f}: "
                                      f"{'agrees' if abs(err - closed) < 1e-6 else 'differs'} (tolerance 1e-6)")
    print(f"W = {wname}, {vname:>24}: gradient_flow_error {err:.2e}{tail}")
print(f"SoftMax, W = V = I (not a gradient flow of its candidate energy): "
      f"{sinkflow.gradient_flow_error(xg, 'softmax'):.3f}")

# %% [markdown]
# ## Exercises
#
# 1. **nGPT's step.** Rerun section 3 with `norm=sinkflow.placement("ngpt", alpha=0.5)`. At which $\alpha$ does
#    nGPT keep $1 - \bar\rho(8)$ above Post-LN's in every seed? Compare with the equiangular rate $e^{-2\alpha t}$.
# 2. **RMSNorm.** Run the Pre-LN cell with `sinkflow.placement("pre", normalization="rms")` in $d = 3$ and check
#    that it is the unit-sphere flow at inverse temperature $3\beta$, scaled by $\sqrt 3$.
# 3. **The layer and its ODE.** For Peri-LN, measure the difference between Euler layers at $h$ and RK4 at
#    $h/10$ at $t = 2$, for $h = 0.2, 0.1, 0.05$: the order should be 1.
# 4. **The regular simplex.** Start `equiangular_flow` at $\rho_0 = -1/(n-1) + 10^{-6}$: how long does each
#    placement stay near this unstable equilibrium?
# 5. **A repeated top eigenvalue.** In $d = 3$ take $V = \mathrm{diag}(1, 1, -1/2)$, $Q = K = I$: check with
#    `limit_geometry` that the projections on the top eigenspace end on polytope vertices while the third
#    coordinate spreads (their Theorem 5.1).
# 6. **Sinkhorn's barycenter.** With any $W$ and $V$, the Sinkhorn mean follows $e^{tV}\bar x(0)$ exactly. Check it
#    with a non-symmetric $W_Q^\top W_K$ and compare with SoftMax.
