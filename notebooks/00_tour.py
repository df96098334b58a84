# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · A ten-minute tour of sinkflow
#
# **What this notebook shows.** How sinkflow turns attention scores into attention
# weights and how to check the theory about it numerically:
#
# 1. SoftMax and Sinkhorn attention on the same scores, and what "doubly stochastic" means;
# 2. `n_iter` as a dial from SoftMax (1 half-iteration) to the doubly stochastic limit;
# 3. the full result of a solve (potentials, iterations, convergence, error history);
# 4. how fast Sinkhorn converges: the Birkhoff–Hopf bound against the observed rate and
#    its prediction $\sigma_2(P)^2$;
# 5. a figure from the registry, regenerated from its seeded configuration;
# 6. a small parameter sweep, cached on disk, gathered into a table and plotted.
#
# Every section is a few lines; the docs' theory pages give the formulas. Set
# `SINKFLOW_QUICK=1` to run it with smaller sizes (the test suite does). Inside Jupyter,
# uncomment `os.environ["SINKFLOW_QUICK"] = "1"` in the first code cell.

# %%
import os
import tempfile

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

import sinkflow
from sinkflow.plots.style import COLORS, new_figure, style

# %matplotlib inline
# (inline figures are the default in Jupyter; explicit for other front ends)

# Quick mode (small sizes, seconds): start Jupyter with SINKFLOW_QUICK=1, or uncomment the
# next line and re-run this cell (and the cells below).
# os.environ["SINKFLOW_QUICK"] = "1"
QUICK = os.environ.get("SINKFLOW_QUICK", "0") == "1"
n = 12 if QUICK else 24
rng = np.random.default_rng(0)
print(f"sinkflow {sinkflow.__version__}, quick mode: {QUICK}")

# %% [markdown]
# ## 1. SoftMax and Sinkhorn on the same scores
#
# Tokens $x_1, \dots, x_n$ in the plane, dot-product scores
# $C_{ij} = \langle x_i, x_j \rangle / \tau$. SoftMax divides each row of $e^C$ by its sum;
# Sinkhorn alternates row and column normalizations until both rows and columns sum to 1.

# %%
X = rng.normal(size=(n, 2))
C = sinkflow.dot_scores(X, X, temperature=0.5)
K_softmax = sinkflow.softmax(C)
K_sinkhorn = sinkflow.sinkhorn(C)

for name, K in [("softmax", K_softmax), ("sinkhorn", K_sinkhorn)]:
    err = sinkflow.marginal_errors(K)
    print(f"{name:8s}  row error {err.row:.1e}   column error {err.column:.1e}")

with style():
    fig, axes = new_figure(2, 1, width=3.0, height=2.8)
    panels = [("SoftMax $K^1$", K_softmax), ("Sinkhorn $K^\\infty$", K_sinkhorn)]
    for ax, (name, K) in zip(axes[0], panels, strict=True):
        im = ax.imshow(K, vmin=0, vmax=K_softmax.max())
        ax.set(title=name, xlabel="key $j$", ylabel="query $i$")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # token indices: no tick at 2.5
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(False)
    fig.colorbar(im, ax=axes[0, 1], shrink=0.8)
    plt.show()

# %% [markdown]
# SoftMax rows sum to one but its columns do not: some keys (the large-norm tokens) receive
# far more than their share of attention. Sinkhorn spreads it so that every key is attended
# to exactly once in total.

# %% [markdown]
# ## 2. `n_iter` is a dial
#
# `sinkhorn(C, n_iter=L)` stops after $L$ half-iterations (row, column, row, ...). $L = 1$ is
# SoftMax exactly; the column error falls geometrically as $L$ grows.

# %%
assert np.allclose(sinkflow.sinkhorn(C, n_iter=1), K_softmax)

L_values = np.arange(1, 22, 2)
column_error = [sinkflow.marginal_errors(sinkflow.sinkhorn(C, n_iter=int(L))).column for L in L_values]

with style():
    fig, axes = new_figure(1, 1, width=4.0, height=2.8)
    ax = axes[0, 0]
    ax.semilogy(L_values, column_error, "o-", color=COLORS["sinkhorn"])
    ax.set(xlabel="half-iterations $L$ (odd: after a row step)", ylabel="column marginal error")
    plt.show()

# %% [markdown]
# ## 3. The full result of a solve
#
# `solve_sinkhorn` returns a frozen result instead of printing: the attention matrix, the log
# potentials $f, g$ with $K_{ij} = e^{f_i + C_{ij} + g_j}$, the half-iterations used, whether
# it converged, and the marginal error after every half-iteration.

# %%
res = sinkflow.solve_sinkhorn(C, tol=1e-12, epsilon_scaling=False)
print(f"converged={res.converged}  n_iter={res.n_iter}  marginal error={res.marginal_error:.1e}")
K_again = np.exp(res.f[:, None] + C + res.g[None, :])
print("K = exp(f + C + g):", np.allclose(K_again, res.attention))

# %% [markdown]
# ## 4. How fast does Sinkhorn converge?
#
# The marginal error contracts by a constant factor per full iteration (two half-iterations).
# Three numbers describe that factor:
#
# - the **Birkhoff–Hopf bound** $\tanh(\Delta/4)^2$, from the Hilbert diameter $\Delta$ of $e^C$:
#   guaranteed, often loose;
# - the **asymptotic rate** $\sigma_2(P)^2$, the squared second singular value of the limit $P$ (Knight 2008);
# - the **observed rate**, fitted to the error history.

# %%
bound = sinkflow.birkhoff_hopf_rate(C)
predicted = sinkflow.asymptotic_rate(res.attention)
observed = sinkflow.observed_rate(res.errors)
print(f"Birkhoff-Hopf bound {bound:.6f} >= observed {observed:.4f} ~ sigma_2(P)^2 = {predicted:.4f}")
print(f"the bound leaves 1 - bound = {1 - bound:.1e} per iteration: guaranteed, but loose")

errors = res.errors[::2]  # after row steps: one entry per full iteration
k = np.arange(len(errors))
with style():
    fig, axes = new_figure(1, 1, width=4.0, height=2.8)
    ax = axes[0, 0]
    ax.semilogy(k, errors, "o", ms=3, color=COLORS["sinkhorn"], label="marginal error")
    ax.semilogy(k, errors[0] * predicted**k, color=COLORS["reference"], label="$\\sigma_2(P)^{2k}$")
    ax.semilogy(k, errors[0] * bound**k, color=COLORS["bound"], label="Birkhoff–Hopf $\\lambda^{2k}$")
    ax.set(xlabel="full iterations $k$", ylabel="error", ylim=(1e-14, 10))
    ax.legend()
    plt.show()

# %% [markdown]
# ## 5. A figure from the registry
#
# Every figure of the project is registered under a name with a seeded configuration, a
# `compute` function (the experiment) and a `plot` function. `sinkflow figures NAME` writes
# it to disk; here we call the two functions directly.

# %%
from sinkflow.plots import registry

for name, spec in registry().items():
    print(f"{name:28s} {spec.description}")

spec = registry()["sweep_sinkhorn_rates"]
data = spec.compute(spec.quick)       # a dict of arrays: the figure's data
with style():
    fig = spec.plot(data, spec.quick)
    plt.show()

# %% [markdown]
# ## 6. Your own study: a parameter sweep
#
# `sinkflow.sweep` runs an experiment (a module-level function returning a dict of numbers)
# on every point of a grid and returns a pandas table. Every point is cached on disk under a
# hash of the experiment, its parameters and the sinkflow version, so running the cell again
# is free and an interrupted sweep resumes. `executor="dask"` (the default) runs the points
# on a local Dask cluster and shows its dashboard link; here we stay sequential.

# %%
cache = tempfile.mkdtemp(prefix="sinkflow_tour_")  # use a folder of your project in real studies
grid = {"n": [16, 32] if QUICK else [16, 32, 64], "scale": [0.5, 1.0, 2.0, 3.0], "seed": [0, 1]}

df = sinkflow.sweep(grid, "sinkflow.experiments:sinkhorn_convergence", executor="sequential",
                    cache_dir=cache, progress=False)
print(f"{df.attrs['n_computed']} points computed in {df.attrs['seconds']:.1f} s")
df.head()

# %%
again = sinkflow.sweep(grid, "sinkflow.experiments:sinkhorn_convergence", executor="sequential",
                       cache_dir=cache, progress=False)
print(f"re-run: {again.attrs['n_cached']} points from the cache, {again.attrs['n_computed']} computed")

fig = sinkflow.plot_sweep(df, x="scale", y="n_iter", hue="n", logy=True,
                          labels={"scale": "score scale $s$", "n_iter": "half-iterations to 1e-12"})
plt.show()

# %% [markdown]
# The colder the scores (larger $s$), the closer $\sigma_2(P)^2$ gets to 1 and the more
# iterations Sinkhorn needs: that is why `solve_sinkhorn` anneals cold problems with
# epsilon scaling by default.

# %% [markdown]
# ## 7. Tokens as particles: a Wasserstein gradient flow
#
# A residual attention layer is an Euler step $x_i \leftarrow x_i + h \sum_j K_{ij} W_V x_j$.
# With a symmetric $W$ and $W_V = W$, Sinkhorn attention is the gradient flow of
# $F^\infty = \tfrac12 \mathrm{OT}_1(\mu, \mu)$: the field equals $-n\nabla F^\infty$, and
# the energy decreases. SoftMax is no gradient flow: its Jacobian is not symmetric.

# %%
W = np.diag([1.0, -1.0]) / 2
x0 = sinkflow.random_particles(12 if QUICK else 40, 2, seed=0)
traj = sinkflow.simulate(x0, "sinkhorn", W_Q=W, W_V=W, h=0.1, steps=10 if QUICK else 40, monitors=["energy"])
print("positions", traj.positions.shape, "energy decreasing:", bool(np.all(np.diff(traj.monitors["energy"]) <= 1e-12)))
print("field = -n grad F (Sinkhorn), relative error:", sinkflow.gradient_flow_error(x0, "sinkhorn", W))
print("Jacobian asymmetry: Sinkhorn", sinkflow.jacobian_asymmetry(x0, "sinkhorn", W),
      " SoftMax", sinkflow.jacobian_asymmetry(x0, "softmax", W))

# %% [markdown]
# ## 8. The heat-diffusion limit
#
# Rescale attention (kernel $e^{-|x-y|^2/(2\varepsilon)}$, velocity
# $-\tfrac{2}{\varepsilon}\sum_j K_{ij}(x_j - x_i)$): Sinkhorn particles then follow the heat
# equation, so a standard Gaussian spreads to variance $1 + 2t$. SoftMax with dot-product
# scores has no such limit. An explicit Euler step must stay below the layer's stiffest rate:
# `largest_safe_dt` gives it ($\varepsilon/2$ for the kernel layers, $\varepsilon^2/(4\,\mathrm{var})$
# for SoftMax-dot, which moves much faster).

# %%
from sinkflow.heat import largest_safe_dt

x0 = np.random.default_rng(1).normal(size=(300 if QUICK else 1000, 1))
for normalization in ("sinkhorn", "softmax_dot"):
    dt = min(0.02, largest_safe_dt(x0, eps=0.1, normalization=normalization))
    xt = sinkflow.heat_flow(x0, t=0.2, eps=0.1, dt=dt, normalization=normalization)
    # The heat equation adds 2t to the variance of whatever sample it starts from.
    print(f"{normalization:12s} variance at t = 0.2: {xt.var():.3f} "
          f"(start {x0.var():.3f}, heat {x0.var() + 2 * 0.2:.3f})")

# %% [markdown]
# ## 9. Nyström attention and its error bound (Skyformer)
#
# `nystrom_check` answers: for my $Q, K$, this many landmarks give this spectral error, and
# the theorem asks for that many.

# %%
Q, K = rng.normal(scale=0.5, size=(2, 64, 16))
check = sinkflow.nystrom_check(Q, K, landmarks=16, eps=0.1, delta=0.1, trials=5)
print(f"observed error {check.observed_error:.3f}, lambda {check.lam:.3f}, d_stat {check.d_stat:.1f}, "
      f"theorem asks for m >= {check.m_required:.0f}, failure rate {check.failure_rate:.2f}")

# %% [markdown]
# ## 10. Attention modules and training
#
# `sinkflow.nn.MultiheadAttention` is a drop-in for `torch.nn.MultiheadAttention` whose
# normalization is a switch; `sinkflow validate digits --quick` trains the Sinkformers probe
# and plots how the attention drifts toward (or away from) double stochasticity.

# %%
import torch

from sinkflow.nn import MultiheadAttention

mha = MultiheadAttention(16, 2, batch_first=True, normalization="sinkhorn", n_iter=5)
tokens = torch.randn(3, 10, 16)
out, weights = mha(tokens, tokens, tokens)
print(out.shape, "column sums of one attention map:", weights[0].sum(0)[:4])

# %% [markdown]
# ## Where to go next
#
# One notebook per topic, each ending with exercises:
# [01](01_normalizations.ipynb) normalizations and Sinkhorn's convergence;
# [02](02_particles_and_gradient_flows.ipynb) particles and gradient flows;
# [03](03_heat_diffusion_limit.ipynb) the heat-diffusion limit;
# [04](04_nystrom_error_bounds.ipynb) Nyström error bounds (Skyformer);
# [05](05_doubly_stochastic_training.ipynb) doubly stochastic attention in training;
# [06](06_clustering_and_metastability.ipynb) clustering and metastability: $k^*(\beta)$, predictions at
# scale, the phase diagram, dwell times, saddles;
# [07](07_gaussian_flows_and_causal_attention.ipynb) Gaussian moment flows and causal attention;
# [08](08_normalization_and_value_geometry.ipynb) normalization placements and value-matrix geometry;
# [09](09_long_contexts_and_limits.ipynb) long contexts and the limits of attention: hardmax layers, the critical
# scaling, the Lipschitz constant against $n$, doubly stochastic attention without the Sinkhorn loop.

# %% [markdown]
# ## Exercises
#
# 1. Replace `dot_scores` by `gaussian_scores` in section 1. Sinkhorn's result does not change
#    (up to the tolerance) while SoftMax's does. Why? (Hint: the theory page on normalizations,
#    "Invariance".)
# 2. In section 2, find the smallest `n_iter` for which the column error is below 1e-3 at
#    `temperature=0.1`. How does it grow as the temperature falls?
# 3. Sweep `scale` from 0.25 to 8 and plot `observed_rate / asymptotic_rate`. Where does the
#    fit of the observed rate become unreliable, and why (look at `n_iter`)?
# 4. Write your own experiment in a module `my_study.py` (a function returning a dict) and run
#    it with `sinkflow sweep study.toml` on a local Dask cluster; interrupt it with Ctrl-C and
#    run it again.
# 5. Run `sinkflow figures --list`, regenerate one figure with `--full`, and compare the
#    `config_hash` and `data_checksum` columns of `figures/MANIFEST.tsv` with a quick run.
