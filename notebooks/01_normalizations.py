# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · From SoftMax to doubly stochastic attention
#
# **What this notebook shows.** Attention normalizes a matrix of scores $C_{ij}$. SoftMax divides each row of
# $e^{C}$ by its sum; Sinkhorn then alternates with columns. After $\ell$ half-iterations we get $K^{\ell}$:
# $\ell = 1$ is SoftMax, $\ell \to \infty$ is the doubly stochastic limit $K^{\infty}$ (Sinkformers).
# You will
#
# 1. turn the dial $\ell$ and watch rows and columns become balanced,
# 2. measure how far a matrix is from doubly stochastic,
# 3. compare the observed convergence rate with the Birkhoff–Hopf bound $\tanh(\Delta/4)^2$ and with
#    the sharper prediction $\sigma_2(P)^2$.
#
# Set `SINKFLOW_QUICK=1` to run everything in a few seconds.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

import sinkflow
from sinkflow.plots import get as get_figure
from sinkflow.plots.interactive import interact
from sinkflow.plots.style import COLORS, new_figure, style

# Quick mode (small sizes, seconds): start Jupyter with SINKFLOW_QUICK=1, or uncomment the
# next line and re-run this cell (and the cells below).
# os.environ["SINKFLOW_QUICK"] = "1"
QUICK = os.environ.get("SINKFLOW_QUICK", "0") == "1"
n = 12 if QUICK else 24
rng = np.random.default_rng(0)
queries = rng.normal(scale=0.4, size=(n, 2)) + [0.4, 0.0]
keys = rng.normal(size=(n, 2))
C = sinkflow.gaussian_scores(queries, keys, temperature=0.5)
C.shape

# %% [markdown]
# ## 1. The dial: half-iterations $\ell$
#
# `sinkflow.sinkhorn(C, n_iter=ell)` performs exactly $\ell$ half-iterations (row, column, row, ...),
# starting from a row normalization, so `n_iter=1` *is* SoftMax, bit for bit.

# %%
assert np.array_equal(sinkflow.sinkhorn(C, n_iter=1), sinkflow.softmax(C))

def show(ell=1):
    K = sinkflow.sinkhorn(C, n_iter=ell)
    row, col = sinkflow.marginal_errors(K)
    with style():
        fig, axes = new_figure(2, 1, width=3.2, height=2.8)
        axes[0, 0].imshow(K, vmin=0)
        axes[0, 0].set_title(rf"$K^{{{ell}}}$")
        axes[0, 0].grid(False)
        axes[0, 1].plot(sinkflow.sorted_column_sums(K), color=COLORS["sinkhorn"], marker=".")
        axes[0, 1].axhline(1, color="k", lw=0.8)
        axes[0, 1].set_yscale("log")
        axes[0, 1].set_title(f"row err {row:.1e}, column err {col:.1e}")
        axes[0, 1].set_xlabel("key rank")
        axes[0, 1].set_ylabel("sorted column sum")
        plt.show()

interact(show, ell=(1, 21, 1))  # a slider (updates on release) with ipywidgets; without, one static call

# %% [markdown]
# ## 2. How far from doubly stochastic?
#
# Three measures from `sinkflow`: the marginal errors (for a square matrix with uniform weights the column
# error is the mean of $|\sum_i K_{ij} - 1|$), the sorted column sums (the Sinkformers plot), and
# $\mathrm{KL}(K \,|\, \mathrm{Sinkhorn}(K))$, the distance to the Birkhoff polytope.

# %%
for ell in (1, 2, 3, 5, 9, 17):
    K = sinkflow.sinkhorn(C, n_iter=ell)
    row, col = sinkflow.marginal_errors(K)
    print(f"n_iter={ell:2d}  row error={row:.2e}  column error={col:.2e}  "
          f"KL to projection={sinkflow.kl_to_sinkhorn(K):.2e}")

# %% [markdown]
# ## 3. How fast: observed rate vs Birkhoff–Hopf vs $\sigma_2(P)^2$
#
# The marginal error contracts geometrically. Birkhoff–Hopf guarantees the factor $\lambda^2$ per full
# iteration, $\lambda = \tanh(\Delta/4)$ with $\Delta$ the Hilbert diameter of $e^C$; it is a bound,
# usually very loose. Knight (2008): the asymptotic rate is $\sigma_2(P)^2$, the squared second singular value
# of the limit $P$.

# %%
x = rng.normal(size=(n, 2))
for scale in (1.0, 2.0, 4.0):
    Cs = scale * sinkflow.gaussian_scores(x, x)
    run = sinkflow.solve_sinkhorn(Cs, n_iter=300)
    P = sinkflow.sinkhorn(Cs, tol=1e-13)
    print(f"scale {scale}: observed {sinkflow.observed_rate(run.errors):.4f}, "
          f"sigma_2^2 {sinkflow.asymptotic_rate(P):.4f}, bound {sinkflow.birkhoff_hopf_rate(Cs):.6f}")

# %% [markdown]
# The same study is a registered figure: data first, then the plot, both from a frozen seeded config.

# %%
spec = get_figure("normalizations_convergence")
data = spec.compute(spec.quick)
with style():
    spec.plot(data, spec.quick)
    plt.show()

# %% [markdown]
# ## 4. Cold temperatures
#
# Multiplying the scores by a large factor makes the problem hard: plain alternating normalization slows to a
# crawl. `sinkflow.solve_sinkhorn` (run to tolerance) uses epsilon scaling and over-relaxation, stays finite,
# and tells you whether it converged.

# %%
y = rng.normal(size=(n, 2))
for factor in (1, 10, 30):
    Cs = factor * sinkflow.gaussian_scores(x, y)
    fast = sinkflow.solve_sinkhorn(Cs, tol=1e-9)
    plain = sinkflow.solve_sinkhorn(Cs, tol=1e-9, epsilon_scaling=False, max_iter=20_000, warn=False)
    print(f"x{factor}: accelerated {fast.n_iter} half-iterations (converged={fast.converged}), "
          f"plain {plain.n_iter} (converged={plain.converged})")

# %% [markdown]
# ## Exercises
#
# 1. Replace `gaussian_scores` by `dot_scores`. Which of the three measures change for SoftMax, and which for
#    the Sinkhorn limit? (Hint: docs/theory/normalizations.md, section Invariance.)
# 2. Give the queries non-uniform weights `a` (`solve_sinkhorn(C, a=...)`): what do the column sums of $K$ converge to?
# 3. Find a score matrix where the Birkhoff–Hopf bound is nearly tight. (Try rank-one-like scores.)
# 4. Mask out one key with `mask=`; check that its column is exactly zero and that no NaN appears.
