# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Does attention become doubly stochastic during training?
#
# Sinkformers (Sander et al., 2022, RQ1) observe that in a trained SoftMax Transformer the **column sums**
# of the attention matrix approach 1 as epochs pass: SoftMax attention drifts toward the doubly stochastic
# matrices that Sinkhorn attention produces by construction (docs/theory/training.md). This notebook reproduces
# the paper's plot on a laptop with scikit-learn's 8x8 digits and a one-layer, one-head, attention-only ViT
# (2x2 patches, 16 tokens + a class token), then shows that the claim is **conditional on the architecture**
# (without LayerNorm and with mean pooling the drift goes the other way), sweeps Sinkhorn's number of
# half-iterations $L$ ($L = 1$ is SoftMax), and compares Skyformer's instability score.
#
# Everything here is `sinkflow validate` in small: `sinkflow validate digits digits-mean --quick` writes the same
# figures and a JSON report; `--full --device cuda` runs the full sizes on a GPU.

# %%
import os
import time

import numpy as np
import torch

from sinkflow.nn import MultiheadAttention
from sinkflow.plots.style import style
from sinkflow.plots.training import plot_accuracy_vs_n_iter, plot_column_sums, plot_instability
from sinkflow.studies.validation import run_validation

# Quick mode (small sizes, seconds): start Jupyter with SINKFLOW_QUICK=1, or uncomment the
# next line and re-run this cell (and the cells below).
# os.environ["SINKFLOW_QUICK"] = "1"
QUICK = os.environ.get("SINKFLOW_QUICK", "0") == "1"
torch.set_num_threads(1)  # small models: one thread is fastest (and deterministic)
EPOCHS = 3 if QUICK else 30
SEEDS = [0] if QUICK else [0, 1, 2]
# the full run (SINKFLOW_QUICK=0) took 476 s on one core of a shared, loaded 2-core machine; less on an idle one
FULL_SECONDS = 480
t_start = time.perf_counter()


def versus_paper(agrees, claim, why):
    """The verdict on a paper's claim, next to the numbers it judges; a contradiction says why.
    Quick mode (3 epochs, one seed) is too short to decide any of these claims: it says so."""
    if QUICK:
        print(f"    {claim}: quick mode: too short to decide; run with SINKFLOW_QUICK=0 (about {FULL_SECONDS} s)")
    elif agrees:
        print(f"    agrees with the paper: {claim}")
    else:
        print(f"    CONTRADICTS the paper: {claim}\n      why ({EPOCHS} epochs, {len(SEEDS)} seeds): {why}")


# %% [markdown]
# ## The module
#
# `sinkflow.nn.MultiheadAttention` is a drop-in for `torch.nn.MultiheadAttention` (here with `batch_first=True`); the
# normalization is a constructor argument. With `n_iter` half-iterations, Sinkhorn alternates row and column
# normalizations of $\exp(QK^T/\sqrt p)$; masked keys get exactly zero weight.

# %%
x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(0))
pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])  # torch convention: True = padding
for norm, n_iter in [("softmax", 1), ("sinkhorn", 3), ("sinkhorn", 31)]:
    torch.manual_seed(0)
    mha = MultiheadAttention(16, 2, batch_first=True, normalization=norm, n_iter=n_iter)
    _, w = mha(x, x, x, key_padding_mask=pad, average_attn_weights=False)
    col = w[0].sum(-2)  # column sums, first example, per head
    print(f"{norm:8s} L={n_iter:<3d} column sums head 0: {np.round(col[0].detach().numpy(), 3)};"
          f" weight on padded keys: {float(w[1, ..., 4:].detach().abs().max()):.1f}")

# %% [markdown]
# ## The paper's plot: sorted column sums per epoch
#
# One curve per epoch (colour = epoch, dotted = initialization), column sums of the probe batch's attention
# sorted increasingly, log scale. A flat curve at 1 is doubly stochastic. Right panel: mean
# $|\sum_i K_{ij} - 1|$ per epoch.

# %%
paper = run_validation("digits", ["softmax", "sinkhorn"], n_iters=[3], seeds=SEEDS, epochs=EPOCHS, track_kl=not QUICK)
with style():
    fig = plot_column_sums(paper)
for row in paper["summary"]:
    d0, d1, dl = (row[f"column_deviation_{k}"]["median"] for k in ("epoch0", "epoch1", "last"))
    print(f"{row['variant']:12s} deviation epoch 0 / 1 / last: {d0:.3f} / {d1:.3f} / {dl:.3f};"
          f" decreased after epoch 1 in {row['decreased_from_epoch1']}/{len(row['seeds'])} seeds;"
          f" test accuracy {row['test_accuracy']['median']:.3f}")
    if not QUICK:  # the KL divergence to the Sinkhorn projection, tracked in the full run; medians over seeds
        kl = [run["history"]["kl"] for run in paper["runs"] if run["variant"] == row["variant"]]
        print(f"{'':12s} KL to Sinkhorn epoch 1 / last: {np.median([k[1] for k in kl]):.4f} / "
              f"{np.median([k[-1] for k in kl]):.4f}; decreased in {sum(k[-1] < k[1] for k in kl)}/{len(kl)} seeds")
    if row["variant"] == "softmax":
        decreased, seeds = row["decreased_from_epoch1"], len(row["seeds"])
        versus_paper(dl < d1 and 2 * decreased > seeds,
                     "SoftMax column sums approach 1 after epoch 1 (here the median deviation goes "
                     f"{d1:.3f} -> {dl:.3f}, lower at the end in {decreased}/{seeds} seeds)",
                     "the deviation did not decrease from epoch 1 to the last epoch in most seeds: over these "
                     "epochs the model moved away from doubly stochastic")

# %% [markdown]
# SoftMax attention starts *near* doubly stochastic (scores are small at initialization) and moves away during
# the first epoch; the paper's observation is the drift back after that, measured from epoch 1 as the paper
# plots it. The verdict line judges it on the full run (`SINKFLOW_QUICK=0`: 30 epochs, seeds 0, 1 and 2, the
# setting docs/theory/training.md quotes); **quick mode** (3 epochs, one seed) is too short to tell a drift from
# the first epochs' noise, and says so instead of printing a verdict.
# Sinkhorn attention with $L = 3$ starts almost exactly doubly stochastic; three half-iterations do not keep it
# there once training sharpens the scores.
#
# ## The claim is conditional: no LayerNorm, mean pooling
#
# With mean pooling the classifier reads $\frac1n\sum_i (KV)_i = \frac1n \sum_j (\sum_i K_{ij}) v_j$, which
# depends on the column sums: the model has a reason to *break* double stochasticity.

# %%
variant = run_validation("digits-mean", ["softmax"], seeds=SEEDS, epochs=EPOCHS, track_kl=False)
with style():
    fig = plot_column_sums(variant)
row = variant["summary"][0]
deviations = " / ".join(f"{row[f'column_deviation_{k}']['median']:.3f}" for k in ("epoch0", "epoch1", "last"))
print(f"mean pooling, no LN: deviation epoch 0 / 1 / last: {deviations};"
      f" decreased after epoch 1 in {row['decreased_from_epoch1']}/{len(row['seeds'])} seeds")

# %% [markdown]
# ## Accuracy against the number of Sinkhorn half-iterations
#
# Median and range over seeds of the final test accuracy; SoftMax as a horizontal band (it is $L = 1$).

# %%
sweep = run_validation("digits", ["softmax", "sinkhorn", "gaussian"], n_iters=[3] if QUICK else [3, 5, 9],
                       seeds=SEEDS, epochs=EPOCHS, track_kl=False)
with style():
    fig = plot_accuracy_vs_n_iter(sweep)
    fig2 = plot_instability(sweep)
for row in sweep["summary"]:
    r = row["instability_ratio_to_softmax"]
    print(f"{row['variant']:12s} accuracy {row['test_accuracy']['median']:.3f}, "
          f"instability {row['instability_last']['median']:.3g} ({r:.2f}x SoftMax), "
          f"{row['epoch_time']['median']:.3f} s/epoch")
acc = {row["variant"]: row["test_accuracy"]["median"] for row in sweep["summary"]}
ratio = {row["variant"]: row["instability_ratio_to_softmax"] for row in sweep["summary"]}
best_sinkhorn = max(a for variant, a in acc.items() if variant.startswith("sinkhorn"))
TOLERANCE = 0.02  # "about as accurate": within two points of test accuracy
versus_paper(best_sinkhorn >= acc["softmax"],
             f"Sinkhorn attention is at least as accurate as SoftMax (Sinkformers; here {best_sinkhorn:.3f} "
             f"against {acc['softmax']:.3f})",
             "the paper's gains are a few points, averaged over runs; here the medians of three seeds of a "
             "one-layer model")
versus_paper(acc["gaussian"] >= acc["softmax"] - TOLERANCE,
             f"Gaussian-kernel attention is about as accurate as SoftMax, within {TOLERANCE:.2f} (Skyformer; here "
             f"{acc['gaussian']:.3f} against {acc['softmax']:.3f})",
             f"the Gaussian-kernel model is more than {TOLERANCE:.2f} below SoftMax in test accuracy")
versus_paper(ratio["gaussian"] < 1,
             f"Gaussian-kernel attention is more stable than SoftMax (Skyformer: 0.64-0.81x on LRA with its own "
             f"score; here a perturbation proxy, {ratio['gaussian']:.2f}x)",
             "the proxy perturbs the trained model's query and key weights where the paper follows the "
             "optimizer's first steps: the two scores need not agree")
print(f"notebook compute time: {time.perf_counter() - t_start:.1f} s")

# %% [markdown]
# Skyformer reports that its Gaussian-kernel attention has an instability score 0.64–0.81 times SoftMax's on
# Long Range Arena, at an accuracy comparable to SoftMax's. Each verdict line above quotes the numbers it
# judges; a "CONTRADICTS" line adds its reason. In quick mode (3 epochs, one seed) the accuracies are those of
# models still learning fast, and their differences are within the seed-to-seed spread: the cell prints the
# numbers and no verdict. Run the full notebook (`SINKFLOW_QUICK=0`) to read the verdicts.
#
# The score here is a *proxy*: the mean squared change of the logits per squared change of the query and
# key weights under a small random perturbation of the trained model (`sinkflow.studies.instability_score`). The
# paper's own score follows the optimizer instead: over the first 20 training steps, the squared change of the
# token features per squared change of all the weights, divided by SoftMax's at the same step
# (`sinkflow.studies.update_instability`). `sinkflow validate listops` and `sinkflow validate pathfinder` measure that
# one, beside the paper's table ("Reproducing the papers" in the docs); the two scores need not agree.
#
# ## Exercises
#
# 1. Run `sinkflow validate digits --n-iter 1 3 5 9 --seeds 0 1 2 3 4` and read the JSON report: does the
#    accuracy gain of Sinkhorn over SoftMax exceed the seed-to-seed spread?
# 2. Change the patch size (`PatchViT(patch_size=4)`, 4 tokens) — Sinkformers report larger gains for smaller
#    patches. What happens to the drift?
# 3. Add LayerNorm but keep mean pooling (`PatchViT(pre_norm=True, pooling="mean")`): which of the two
#    ingredients decides the direction of the drift?
# 4. Track `kl_to_sinkhorn` instead of the column deviation: do the two summaries ever disagree?
# 5. On a GPU: `sinkflow validate retrieval --full --device cuda --attention softmax sinkhorn gaussian` and compare
#    the time per epoch of the three normalizations at sequence length 1024.
