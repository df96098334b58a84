# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Tokens as particles: attention flows and Wasserstein gradient flows
#
# A residual self-attention layer moves every token $x_i$ by one explicit Euler step,
# $x_i \leftarrow x_i + h \sum_j K_{ij}(X)\, W_V x_j$ (docs/theory/gradient_flows.md). This notebook shows
#
# 1. the same particles under **SoftMax** ($K^1$) and **Sinkhorn** ($K^\infty$) attention;
# 2. that Sinkhorn attention is a Wasserstein **gradient flow**: with $W$ symmetric and $W_V = W$,
#    $T(x_i) = -n\nabla_{x_i} F^\infty$ with $F^\infty = \frac12 \mathrm{OT}_1(\mu, \mu)$, so the energy decreases,
#    while SoftMax is not (its field Jacobian is not symmetric);
# 3. clustering of tokens on the sphere (the layer-norm model of Geshkovski et al.), with sliders for
#    $\beta$, the number of Sinkhorn half-iterations and the step $h$;
# 4. the classroom demo: an animation of SoftMax beside Sinkhorn on the circle, with the predicted
#    number of clusters.
#
# Set `SINKFLOW_QUICK=1` for a fast run (small sizes). Inside Jupyter, uncomment
# `os.environ["SINKFLOW_QUICK"] = "1"` in the first code cell.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

import sinkflow
from sinkflow.plots import get
from sinkflow.plots.style import COLORS, RC

# Quick mode (small sizes, seconds): start Jupyter with SINKFLOW_QUICK=1, or uncomment the
# next line and re-run this cell (and the cells below).
# os.environ["SINKFLOW_QUICK"] = "1"
QUICK = os.environ.get("SINKFLOW_QUICK", "0") == "1"
MODE = "quick" if QUICK else "full"
# %matplotlib inline
plt.rcParams.update(RC)  # the sinkflow matplotlib style (sinkflow.plots.style) for the whole notebook

# %% [markdown]
# ## 1. SoftMax vs Sinkhorn from the same start
#
# $W = W_Q^T W_K = \mathrm{diag}(1, -1)$ at temperature $\tau$, values $W_V = W/\tau$. The figures are the
# registered `particles_trajectories` and `particles_energy` (regenerate them with `sinkflow figures`).

# %%
spec = get("particles_trajectories")
cfg = spec.config(MODE)
flows = spec.compute(cfg)
spec.plot(flows, cfg)
get("particles_energy").plot(flows, cfg)
plt.show()

# %% [markdown]
# ## 2. The gradient-flow identity, number by number
#
# `gradient_flow_error` compares $T$ with $-n\nabla F$ computed by autograd (float64):
# $F^\infty$ for Sinkhorn, $F^0$ for the unnormalized kernel, and SoftMax's natural candidate
# $F^1 = -\frac12\int \log Z_\mu\, d\mu$. `jacobian_asymmetry` measures $\|J - J^T\| / \|J\|$ for the
# block Jacobian $J = \partial T(x_i)/\partial x_j$: a gradient field has a symmetric Jacobian.

# %%
x = sinkflow.random_particles(12 if QUICK else 40, 2, seed=0)
W = np.array([[0.8, 0.3], [0.3, 0.4]])  # symmetric
for kind in ("sinkhorn", "unnormalized", "softmax"):
    print(f"{kind:>12}:  identity error {sinkflow.gradient_flow_error(x, kind, W):.2e}   "
          f"Jacobian asymmetry {sinkflow.jacobian_asymmetry(x[:10], kind, W):.2e}")

# %% [markdown]
# Sinkhorn with $L$ half-iterations interpolates: $L = 1$ is SoftMax, $L \to \infty$ the gradient flow.

# %%
spec = get("particles_jacobian")
spec.plot(spec.compute(spec.config("quick")), spec.config("quick"))
plt.show()

# %% [markdown]
# ## 3. Clustering on the sphere — with sliders
#
# Tokens on $S^{d-1}$ follow $\dot x_i = P^\perp_{x_i}\big(\sum_j K_{ij} x_j\big)$
# with scores $\beta\langle x_i, x_j\rangle$ (Q = K = V = I). `explore` runs one flow and shows the fraction
# of clustered pairs
# ($\langle x_i, x_j\rangle > 1 - 10^{-3}$) and the final positions. The next cell wires it to
# sliders for $\beta$, `n_iter` (1 = SoftMax) and $h$ with ipywidgets installed; without, it draws the default
# setting once (so the notebook also runs headless).

# %%
N_SPHERE, T_MAX, H_MIN = (24, 6.0, 0.05) if QUICK else (64, 25.0, 0.02)  # quick: answers within a second
x_sphere = sinkflow.random_particles(N_SPHERE, 3, seed=0, manifold="sphere")


def explore(beta=4.0, n_iter=1, h=0.1):
    safe = sinkflow.particles.largest_safe_step(x_sphere, "sinkhorn", temperature=1.0 / beta)
    step = min(h, safe)  # a larger step overshoots (simulate would warn)
    steps = int(round(T_MAX / step))
    traj = sinkflow.simulate(x_sphere, "sinkhorn", h=step, steps=steps, n_iter=int(n_iter), manifold="sphere",
                             temperature=1.0 / beta, monitors=["clusters"], monitor_every=max(steps // 60, 1),
                             save_every=steps)
    fig = plt.figure(figsize=(7.5, 3.0), layout="constrained")
    ax = fig.add_subplot(1, 2, 1)
    ax.plot(traj.monitor_times, traj.monitors["cluster_fraction"], color=COLORS["sinkhorn"])
    ax.set_xlabel(r"time $t$")
    ax.set_ylabel("fraction of clustered pairs")
    capped = "" if step == h else f" (capped at {step:.2g})"
    ax.set_title(rf"$\beta={beta:g}$, $L={int(n_iter)}$, $h={h:g}${capped}: "
                 f"{traj.monitors['cluster_count'][-1]} clusters",
                 fontsize=8)
    ax3 = fig.add_subplot(1, 2, 2, projection="3d")
    P = traj.final
    ax3.scatter(P[:, 0], P[:, 1], P[:, 2], color=COLORS["sinkhorn"], s=12)
    ax3.set_title(r"$x_i(T)$ on $S^2$")
    plt.show()


# %%
from sinkflow.plots.interactive import interact

interact(explore, beta=(0.5, 16.0, 0.5), n_iter=(1, 30, 1), h=(H_MIN, 0.5, 0.01));

# %% [markdown]
# The phase diagram over $\beta$ and time (registered figure `particles_sphere`): small $\beta$ collapses to one
# cluster, large $\beta$ stays in long metastable multi-cluster phases.

# %%
spec = get("particles_sphere")
cfg = spec.config(MODE)
spec.plot(spec.compute(cfg), cfg)
plt.show()

# %% [markdown]
# ## 4. The classroom demo: SoftMax beside Sinkhorn on the circle
#
# Two flows from one start of 64 tokens on the circle ($Q = K = V = I$, $\beta = 8$): near the uniform
# start the mode $\cos k\theta$ with the largest growth rate wins, so about $k^*(\beta)$ clusters form
# (`sinkflow.fastest_mode`, docs/theory/mean_field.md). The prediction differs: $k^* = 4$ for SoftMax,
# $k^* = 5$ for Sinkhorn, and so do the flows. Each particle is coloured by the cluster it ends in;
# `anim.save("demo.gif")` writes the same animation to a file. Here `size=3.2` draws 320 px panels (640 px
# wide), small enough for a notebook; leave `size` out for the projector's default (1,280 px, docs/classroom.md).

# %%
runs = sinkflow.circle_demo(steps=80 if QUICK else 200)   # {"SoftMax": Trajectory, "Sinkhorn": Trajectory}
anim = sinkflow.animate(runs, k_star=True, frames=30 if QUICK else 200, size=3.2)
anim

# %% [markdown]
# The still version of one flow (paths, start in grey, end coloured by cluster):

# %%
runs["Sinkhorn"].plot()
plt.show()

# %% [markdown]
# ## Exercises
#
# 1. Flip the sign of the values ($W_V = -W$) in `sinkflow.simulate` and watch $F^\infty$ *increase*: which sign
#    makes the layer a descent step, and why does the proof need $W$ symmetric?
# 2. Measure the decrease of $F^\infty$ over one Euler step and compare it with $-h\int |T|^2 d\mu$ for
#    $h = 10^{-2}, 10^{-3}$: what is the order of the mismatch?
# 3. With the sliders, find the smallest $n\_iter$ for which the sphere flow at $\beta = 4$ looks like the
#    doubly stochastic one. Does it match where `jacobian_asymmetry` drops below $10^{-3}$?
# 4. Use `sinkflow.energy_sphere` as a monitor (`monitors=["energy"]` on the sphere) and look for the energy
#    staircase of the metastable phases.
