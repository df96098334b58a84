# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · The heat-diffusion limit of Sinkhorn attention
#
# **What this notebook shows.** Rescale attention so the kernel is $e^{-|x-y|^2/(2\varepsilon)}$ and
# the values are $-(x_j - x_i)$; stack about $1/\varepsilon$ layers. With **Sinkhorn** (doubly
# stochastic) normalization the tokens then move like samples of the **heat equation**
# $\partial_t\rho = \Delta\rho$ (docs/theory/heat_limit.md, Sinkformers). We
#
# 1. derive, with sympy, why the doubly stochastic barycentric map is
#    $B_\varepsilon(x) = x + \tfrac{\varepsilon}{2}\nabla\log\rho(x) + O(\varepsilon^2)$,
#    and what SoftMax gives instead;
# 2. watch particles follow the exact heat solution from a Gaussian-mixture start;
# 3. compare the four normalizations (Sinkhorn, SoftMax with a Gaussian kernel, SoftMax with
#    dot products, no normalization) against their limits;
# 4. measure the first-order error of the barycentric map.
#
# Set `SINKFLOW_QUICK=1` for a fast run (< 30 s). Inside Jupyter, uncomment
# `os.environ["SINKFLOW_QUICK"] = "1"` in the first code cell.

# %%
import dataclasses
import os

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
from IPython.display import Math, display

import sinkflow
from sinkflow.heat import symbolic
from sinkflow.plots import heat as heat_figs
from sinkflow.plots.interactive import interact
from sinkflow.plots.style import COLORS, new_figure, style

# Quick mode (small sizes, seconds): start Jupyter with SINKFLOW_QUICK=1, or uncomment the
# next line and re-run this cell (and the cells below).
# os.environ["SINKFLOW_QUICK"] = "1"
QUICK = os.environ.get("SINKFLOW_QUICK", "0") == "1"
torch.set_num_threads(1)  # small dense ops: one thread is fastest on a shared machine (docs/performance.md)

# %% [markdown]
# ## 1. Why doubly stochastic attention diffuses
#
# Take tokens with density $\rho$ and the symmetric Sinkhorn kernel
# $k(x, y) = e^{\phi(x) + \phi(y) - |x-y|^2/(2\varepsilon)}$ normalized so that
# $\int k(x, y)\rho(y)\,dy = 1$ for every $x$ (rows) — and, by symmetry, columns. For small
# $\varepsilon$, $e^{\phi} \approx \rho^{-1/2}$ up to a constant, so
# $k(x, y)\rho(y) \propto G_\varepsilon(x - y)\sqrt{\rho(y)/\rho(x)}$: attention averages against
# $\sqrt\rho$, not $\rho$. The barycentric map is then a Tweedie formula for $\sqrt\rho$:
#
# $$B_\varepsilon(x) = \int k(x,y)\,y\,\rho(y)\,dy = x + \varepsilon\nabla\log\sqrt\rho(x) + O(\varepsilon^2)
# = x + \tfrac{\varepsilon}{2}\nabla\log\rho(x) + O(\varepsilon^2).$$
#
# So the rescaled velocity $v_\varepsilon = -\tfrac{2}{\varepsilon}(B_\varepsilon(x) - x) \to -\nabla\log\rho$, and the
# continuity equation $\partial_t\rho + \nabla\cdot(\rho v) = 0$ becomes
# $\partial_t\rho = \nabla\cdot(\rho\nabla\log\rho) = \Delta\rho$.
#
# sympy checks the constant exactly for $\rho = \mathcal N(0, s)$: it solves the Schrödinger
# (Sinkhorn) equation for a quadratic potential $\phi = c - a x^2/2$, computes $B_\varepsilon$, and expands.

# %%
sk = symbolic.sinkhorn_barycentric_map_gaussian()
display(Math(r"a = " + sp.latex(sk.details["a"])))
display(Math(r"B_\varepsilon(x) = " + sp.latex(sk.details["B"])))
display(Math(r"\frac{B_\varepsilon(x) - x}{\varepsilon/2} = " + sp.latex(sk.details["series"])
             + r" + O(\varepsilon^2)"))
print("limit equals the score -x/s:", sk.holds)

# %% [markdown]
# SoftMax normalizes rows only: $B_\varepsilon(x) = \int y\,G_\varepsilon(x-y)\rho(y)dy / (\rho * G_\varepsilon)(x)
# = x + \varepsilon\nabla\log(\rho * G_\varepsilon)(x)$ (Tweedie). The factor is $\varepsilon$, not $\varepsilon/2$:
# the *same* layer diffuses twice as fast, and with a smoothed score.

# %%
sm = symbolic.softmax_barycentric_map_gaussian()
display(Math(r"B^{\mathrm{SoftMax}}_\varepsilon(x) = " + sp.latex(sm.details["B"])))
display(Math(r"\frac{B - x}{\varepsilon} = " + sp.latex(sm.details["series"]) + r" + O(\varepsilon^2)"))
rate = symbolic.sinkhorn_variance_rate_gaussian()
display(Math(r"\text{Sinkhorn, mean field: } \dot s = " + sp.latex(rate.details["closed_form"])
             + " = " + sp.latex(rate.details["series"]) + r" + O(\varepsilon^2)"))

# %% [markdown]
# The last line is the exact mean-field variance rate of the Sinkhorn flow for a Gaussian: heat
# has $\dot s = 2$, so the bias is **first order in $\varepsilon$**, relative size $\varepsilon/(4s)$.
# The references themselves are checked the same way:

# %%
for check in (symbolic.heat_kernel_solves_heat(1), symbolic.heat_kernel_solves_heat(2),
              symbolic.barenblatt_solves_porous_medium(1), symbolic.barenblatt_solves_porous_medium(2)):
    print(f"{check.name}: {check.holds}")
bb = symbolic.barenblatt_solves_porous_medium(1)
display(Math(r"\rho_{\mathrm{Barenblatt}} = " + sp.latex(bb.details["rho"])
             + r",\quad M = " + sp.latex(bb.details["mass"])))

# %% [markdown]
# ## 2. Particles against the exact heat solution
#
# `sinkflow.heat_flow(x0, t, eps, dt)` integrates $\dot x_i = -\tfrac{2}{\varepsilon}\sum_j K_{ij}(x_j - x_i)$
# with explicit Euler steps, warm-starting each Sinkhorn solve. A Gaussian mixture stays a mixture
# under the heat equation, each covariance growing by $2tI$ (`GaussianMixture.evolve`).

# %%
g = heat_figs.mixture_1d()
x0 = g.sample(300 if QUICK else 1000, seed=0)
t = 0.3
x_t = sinkflow.heat_flow(x0, t, eps=0.05, dt=0.015)
print("variance growth:", round(float(x_t.var() - x0.var()), 4), " heat predicts 2t =", 2 * t)
print("W2 to the heat solution:", sinkflow.wasserstein2(x_t, g.evolve(t), floor=True))

# %%
cfg = heat_figs.SnapshotConfig()
if QUICK:
    cfg = dataclasses.replace(cfg, n_1d=300, n_2d=200, times=(0.0, 0.3))
with style():
    fig = heat_figs.plot_snapshots(heat_figs.compute_snapshots(cfg), cfg)

# %% [markdown]
# ### Try it: $\varepsilon$, the step $dt$ and the number of particles $n$
#
# The sliders rerun the flow above (same mixture, $t = 0.3$). Small $\varepsilon$ needs many particles (the
# kernel must see neighbours) and a small step ($dt$ well below $\varepsilon$, or the explicit Euler step
# overshoots). The title gives $W_2$ to the heat solution and its floor, the $W_2$ of $n$ exact samples.
# Without ipywidgets the cell draws the default setting once.

# %%
# quick mode: every setting answers within a second (0.25 s of CPU at n = 300, 0.7 s at n = 600, drawing included)
N_MAX = 200 if QUICK else 2000


def explore_heat(eps=0.05, dt=0.015, n=200 if QUICK else 1000):
    x_n = g.sample(int(n), seed=0)
    step = min(dt, sinkflow.heat.largest_safe_dt(x_n, eps))  # a larger step would not follow the heat flow
    x_t = sinkflow.heat_flow(x_n, t, eps=eps, dt=step)
    exact = g.evolve(t)
    w2 = sinkflow.wasserstein2(x_t, exact, floor=True)
    grid = np.linspace(-4.5, 4.5, 300)
    with style():
        fig, axes = new_figure(1, 1, width=5.0, height=2.6)
        ax = axes[0, 0]
        ax.hist(np.asarray(x_t)[:, 0], bins=40, density=True, color=COLORS["sinkhorn"], alpha=0.5, label="particles")
        ax.plot(grid, exact.pdf(grid[:, None]), color=COLORS["reference"], label="heat solution")
        capped = "" if step == dt else f" (capped at the safe {step:g})"
        ax.set_title(rf"$\varepsilon$={eps:g}, dt={dt:g}{capped}, n={int(n)}: "
                     rf"$W_2$ = {w2.value:.3f} (floor {w2.floor:.3f})",
                     fontsize=8)
        ax.set_xlabel("$x$")
        ax.set_ylabel("density")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        plt.show()


interact(explore_heat, eps=(0.01, 0.2, 0.01), dt=(0.005, 0.05, 0.005), n=(100, N_MAX, 100));

# %% [markdown]
# ## 3. Four normalizations, one layer
#
# Only the normalization of $K$ changes. Against the heat solution: Sinkhorn follows it;
# SoftMax with a Gaussian kernel diffuses at twice the rate (dashed: against $\rho_0 * G_{4t}$, its own
# limit); SoftMax with dot products has no limit (its velocity is of order $1/\varepsilon$ and the cloud
# contracts to a size $O(\sqrt\varepsilon)$: for a Gaussian of variance $S$ the mean-field fixed point is
# $S = \varepsilon$); the unnormalized kernel $(2\pi\varepsilon)^{-d/2}e^{-|x-y|^2/(2\varepsilon)}/n$ follows the
# porous-medium equation $\partial_t\rho = 2\nabla\cdot(\rho\nabla\rho)$ (right, from a Barenblatt start).

# %%
cfg = heat_figs.NormalizationsConfig()
if QUICK:
    cfg = dataclasses.replace(cfg, n=200, n_pme=200, t_end=0.5, n_times=3)
with style():
    fig = heat_figs.plot_normalizations(heat_figs.compute_normalizations(cfg), cfg)

# %% [markdown]
# ## 4. The barycentric map against the score
#
# On a grid, `sinkflow.barycentric_map` solves the weighted Sinkhorn problem and returns
# $(B_\varepsilon(x) - x)/(\varepsilon/2)$; its distance to $\nabla\log\rho$ shrinks like $\varepsilon$.
# SoftMax, on the same scale, gives about twice the score.

# %%
cfg = heat_figs.BarycentricConfig()
if QUICK:
    cfg = dataclasses.replace(cfg, eps_values=(0.2, 0.1), grid_points=121)
with style():
    fig = heat_figs.plot_barycentric(heat_figs.compute_barycentric(cfg), cfg)

# %% [markdown]
# ## 5. Between the particles and the heat equation: the mean-field PDE
#
# The comparison above mixes two limits. `sinkflow.mean_field_flow` solves the mean-field equation of the
# same layer, $\partial_t\rho + \nabla\cdot(\rho\, v_\varepsilon[\rho]) = 0$, on a grid (finite volumes,
# mass conserved to rounding), so the two errors can be seen apart: particles $\to$ PDE at rate
# $n^{-1/2}$ at fixed $\varepsilon$, PDE $\to$ heat at rate $O(\varepsilon)$ (docs/theory/mean_field.md).

# %%
from sinkflow.plots import mean_field as mf_figs

cfg = mf_figs.LimitsConfig()  # a few seconds; fewer seeds make the n-slope too noisy to read
data = mf_figs.compute_limits(cfg)
with style():
    fig = mf_figs.plot_limits(data, cfg)
print(f"slopes: particles -> PDE {data['n_slope']:.2f} (n), PDE -> heat {data['eps_slope_sinkhorn']:.2f} (eps)")

# %% [markdown]
# On the circle the same equation (tokens under layer normalization, `simulate(..., manifold="sphere")` in
# $d = 2$) has the uniform density as an unstable state: the mode $\cos k\theta$ grows at
# $\lambda_k = k^2 I_k(\beta)/(\beta I_0(\beta))$ (SoftMax), and the fastest, $k^*(\beta)$, predicts how many
# metastable clusters form. Compare the PDE's growth with the formula:

# %%
from sinkflow.clustering import circle_growth_rate, fourier_amplitude
from sinkflow.heat import uniform_angles

beta, k, theta = 5.0, 3, uniform_angles(128)
rho = (1 + 1e-6 * np.cos(k * theta)) / (2 * np.pi)
res = sinkflow.mean_field_flow(rho, theta, np.linspace(0, 3, 7), normalization="softmax", temperature=1 / beta,
                               manifold="circle")
fit = np.polyfit(res.times, np.log([fourier_amplitude(d, k) for d in res.densities]), 1)[0]
print(f"k* = {sinkflow.fastest_mode(beta)}; growth of cos(3 theta): PDE {fit:.4f}, "
      f"linear theory {circle_growth_rate(k, beta):.4f}")

# %% [markdown]
# The full convergence study (orders in $\varepsilon$, $n$ and $dt$, several seeds) is the figure
# `heat_convergence`: `sinkflow figures heat_convergence --full`.
#
# ## Exercises
#
# 1. **Fix the constant.** SoftMax-Gaussian run for time $t/2$ should match Sinkhorn run for time $t$
#    as $\varepsilon \to 0$. Check it with `heat_flow(..., normalization="softmax_gaussian")` and
#    `wasserstein2`. Why does it still differ at finite $\varepsilon$? (Hint: `softmax_barycentric_map_gaussian`.)
# 2. **Mean conservation.** Show that the Sinkhorn velocity field has zero mean because the columns of
#    $K$ sum to one, and check numerically that SoftMax drifts the mean of an asymmetric mixture.
# 3. **The $\varepsilon$-bias.** Integrate the mean-field ODE
#    $\dot s = 8s/(2s + \varepsilon + \sqrt{\varepsilon^2 + 4s^2})$ and compare with particle variances for
#    $\varepsilon = 0.2, 0.1, 0.05$. How large must $n$ be before the particle fluctuations hide the bias?
# 4. **Too small a bandwidth.** Run Sinkhorn with $\varepsilon$ below the squared spacing of the particles
#    (e.g. $n = 100$, $\varepsilon = 10^{-3}$). What happens to the iteration counts
#    (`heat_trajectory(...).sinkhorn_iterations`) and to the motion? Relate it to $\sigma_2(P)^2$.
# 5. **Porous medium.** Derive with sympy the Barenblatt solution of $\partial_t\rho = \Delta(\rho^m)$ for
#    $m = 3$ by adapting `barenblatt_solves_porous_medium`.

# %% [markdown]
# ## Appendix · Beyond the exact flow: Nyström landmarks
#
# The exact Sinkhorn layer costs $O(n^2)$ per step. With `landmarks=m`, `heat_flow` factors the kernel
# as $\tilde G = G_{:,J}\, G_{J,J}^{+}\, G_{J,:}$ ($m$ landmark particles $J$) and runs Sinkhorn on the factors
# (Altschuler et al. 2019): $O(nm)$ time and memory per step, exact when every particle is a landmark.
# Below, Sinkhorn particles at a size the exact flow handles and their Nyström approximation at a size
# it does not (quick mode: smaller), both against the heat solution $\rho_0 * G_{2t}$.
# The figure `landmark_flow_errors` puts the spectral error, the field error, the trajectory deviation
# with its Grönwall estimate and $F^\infty$ along the approximate flow side by side.

# %%

start = sinkflow.GaussianMixture.gaussian([0.0], [[1.0]])
t, eps, dt, m = 0.1, 0.2, 0.05, 64
n_exact, n_landmark = (400, 3_000) if QUICK else (2_000, 100_000)
x_exact = sinkflow.heat_flow(start.sample(n_exact, seed=1), t, eps, dt)
x_landmark = sinkflow.heat_flow(start.sample(n_landmark, seed=2), t, eps, dt, landmarks=m, tol=1e-4, max_iter=300)
grid = np.linspace(-5, 5, 300)
with style():
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.hist(x_exact[:, 0], bins=40, density=True, histtype="step", label=f"Sinkhorn, n = {n_exact}")
    ax.hist(x_landmark[:, 0], bins=80, density=True, histtype="step", label=f"Nyström m = {m}, n = {n_landmark}")
    ax.plot(grid, start.evolve(t).pdf(grid[:, None]), "k", label="heat solution")
    ax.set_xlabel("x")
    ax.legend(fontsize=7)
print(f"variance at t: exact layer {x_exact.var():.4f}, Nyström layer {x_landmark.var():.4f}, heat {1 + 2 * t:.4f}")

# %% [markdown]
# **Try it.** Lower `m` until the approximation breaks: particles no landmark sees get a Nyström mass
# of either sign; sinkflow then restores their exact self-weight, and raises `NystromPositivityError`
# (never a NaN) when that is not enough. Raise $\varepsilon$ and see how few landmarks a wider kernel needs.

# %% [markdown]
# ### In 2D, up to a million particles
#
# The same comparison in 2D from $\mathcal N(0, I_2)$: exact Sinkhorn particles at a size the dense
# flow handles, and their Nyström approximation at $n = 10^6$ ($m = 256$ farthest-point landmarks;
# quick mode: $n = 3000$), against the heat solution, whose covariance grows by exactly $2tI$.
# The left panel subtracts that growth. The dotted curve is the mean field of the same layers: on a
# Gaussian the Sinkhorn layer is linear, $x \mapsto (1 + h a)\,x$ with
# $2as = 8s/(2s + \varepsilon + \sqrt{\varepsilon^2 + 4s^2})$ (section 1), so each Euler step maps the variance
# per coordinate to $(1 + ha)^2 s$. The gap to the heat equation is the layer's $\varepsilon$-bias ($-\varepsilon/(2s)$
# in the rate) less the explicit Euler steps' excess ($h^2a^2s$ per step), not an error of the landmarks:
# the Nyström particles follow the dotted curve (measured at $t = 0.5$: within $3\cdot 10^{-3}$ at $n = 10^6$,
# $2\cdot 10^{-4}$ at $n = 10^5$, against a gap of $0.025$), and a few thousand exact particles scatter around
# it by their sampling. The landmarks are the farthest points of the start
# in the kernel's metric: uniform draws leave the tails uncovered, and a particle far from every landmark
# gets an approximate mass near 0 of either sign (docs/theory/landmark_flows.md). This is the
# registered figure `landmark_heat_2d` (`sinkflow figures landmark_heat_2d --full`).

# %%
from sinkflow.plots import get
from sinkflow.plots import landmarks as landmark_figs

spec = get("landmark_heat_2d")
cfg = spec.quick if QUICK else spec.full  # full: a flow of 10^6 particles, about 1.5 minutes on one core
data = landmark_figs.compute_heat_2d(cfg)
with style():
    fig = landmark_figs.plot_heat_2d(data, cfg)
gap = data["growth_landmark"][-1] - data["growth_mean_field"][-1]
print(f"t = {data['times'][-1]:g}: variance growth, Nyström n = {cfg.n_landmark:,}: {data['growth_landmark'][-1]:.4f}, "
      f"mean field of the layers {data['growth_mean_field'][-1]:.4f} (difference {gap:+.4f}), "
      f"heat {data['growth_heat'][-1]:.4f}")
