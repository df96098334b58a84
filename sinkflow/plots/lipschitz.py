r"""The local Lipschitz constant of self-attention against the sequence length n
(docs/theory/lipschitz.md; Castin, Ablin and Peyré, ICML 2024).

One randomly initialized head of :class:`sinkflow.nn.MultiheadAttention` (its Xavier-uniform
``W_Q, W_K, W_V``, no output projection); :math:`\|Df(X)\|_2` by
:func:`sinkflow.bounds.attention_lipschitz` for SoftMax, causal SoftMax, Sinkhorn with the layer's
``n_iter = 3`` half-steps and Sinkhorn to tolerance (implicit gradients of the converged map):

(a) the paper's adversarial input at a fixed radius R, with :math:`C\sqrt{n}` overlaid (C the
smallest constant above SoftMax): the constant rises, peaks, then falls;
(b) the adversarial input at the balanced radius :math:`R_n` (token 1 carries as much of a query's
weight as the n - 1 others), with the paper's bound for SoftMax;
(c) random tokens of norm about R (Gaussian).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sinkflow.plots import register
from sinkflow.plots.style import COLORS, LABELS, log_axes, new_figure

VARIANTS = ("softmax", "causal", "sinkhorn_n_iter", "sinkhorn_tol")
_STYLE = {
    "softmax": (COLORS["softmax"], "-", "o", LABELS["softmax"]),
    "causal": (COLORS["other"], "-.", "v", "causal SoftMax"),
    "sinkhorn_n_iter": (COLORS["sinkhorn"], "--", "s", "Sinkhorn, $n_{iter} = 3$"),
    "sinkhorn_tol": (COLORS["unnormalized"], ":", "^", "Sinkhorn to tol $10^{-9}$"),
}


@dataclass(frozen=True)
class LipschitzConfig:
    ns: tuple = (2, 4, 8, 16, 32, 64, 128)
    d: int = 8  # embed_dim of one head
    peak_n: float = 30.0  # (a): the fixed R balances token 1 at n - 1 = peak_n
    random_seeds: int = 1
    n_iter: int = 3
    tol: float = 1e-9
    rtol: float = 1e-6  # power iteration's stopping rule (the plot resolves 1e-3)
    exact_limit: int = 128  # n * d up to which the Jacobian is built densely
    seed: int = 0


def _weights(cfg):
    import torch

    from sinkflow.nn import MultiheadAttention

    torch.manual_seed(cfg.seed)
    W = MultiheadAttention(cfg.d, 1, dtype=torch.float64).in_proj_weight.detach().numpy()
    return W[:cfg.d], W[cfg.d:2 * cfg.d], W[2 * cfg.d:]


def _balance_rate(WQ, WK):
    """``c`` with token 1 balanced against n - 1 others at ``n - 1 = exp(c R^2)``, and the form used."""
    from sinkflow.bounds import query_key_matrix

    vals = np.linalg.eigvals(query_key_matrix(WQ, WK))
    real = vals.real[np.abs(vals.imag) <= 1e-12 * np.abs(vals).max()]
    lam_max, lam_min = real.max(), real.min()
    mirror = not lam_max > -8 * lam_min  # adversarial_input's rule
    # plain: scores lambda R^2 / 2 (token 1) against lambda R^2 / 4; mirrored: |mu| R^2 against -|mu| R^2
    return (2 * abs(lam_min), True, lam_min) if mirror else (lam_max / 4, False, lam_max)


def _all_variants(x, WQ, WK, WV, cfg):
    from sinkflow.bounds import attention_lipschitz
    from sinkflow.particles import causal_mask

    n = len(x)
    common = {"rtol": cfg.rtol, "exact_limit": cfg.exact_limit, "power_iter": 2000}
    runs = {
        "softmax": attention_lipschitz(x, "softmax", WQ, WK, WV, **common),
        "causal": attention_lipschitz(x, "softmax", WQ, WK, WV, mask=causal_mask(n), **common),
        "sinkhorn_n_iter": attention_lipschitz(x, "sinkhorn", WQ, WK, WV, n_iter=cfg.n_iter, **common),
        "sinkhorn_tol": attention_lipschitz(x, "sinkhorn", WQ, WK, WV, tol=cfg.tol, **common),
    }
    return runs


def compute_lipschitz(cfg: LipschitzConfig) -> dict:
    from sinkflow.bounds import adversarial_input

    WQ, WK, WV = _weights(cfg)
    c, mirror, lam = _balance_rate(WQ, WK)
    R_fixed = math.sqrt(math.log(cfg.peak_n) / c)
    ns = np.array(cfg.ns)
    R_balanced = np.sqrt(np.log(ns) / c)
    out = {"ns": ns, "R_fixed": R_fixed, "R_balanced": R_balanced, "eigenvalue": lam, "mirrored": int(mirror),
           "norm_V": float(np.linalg.norm(WV, 2))}
    converged = True
    rng = np.random.default_rng(cfg.seed)
    for panel in ("fixed", "balanced", "random"):
        L = {v: np.zeros((cfg.random_seeds if panel == "random" else 1, len(ns))) for v in VARIANTS}
        bound = np.zeros_like(L["softmax"])
        for k, n in enumerate(ns):
            for s in range(L["softmax"].shape[0]):
                if panel == "random":
                    x = rng.standard_normal((n, cfg.d)) * R_fixed / math.sqrt(cfg.d)
                else:
                    x = adversarial_input(int(n), WQ, WK, R_fixed if panel == "fixed" else R_balanced[k])
                runs = _all_variants(x, WQ, WK, WV, cfg)
                for v, res in runs.items():
                    L[v][s, k] = res.estimate
                    converged &= res.converged
                bound[s, k] = runs["softmax"].bound
        for v in VARIANTS:
            out[f"{panel}_{v}"] = np.median(L[v], 0)
        out[f"{panel}_bound"] = np.median(bound, 0)
    out["all_converged"] = int(converged)
    return out


def _panel(ax, data, panel, title, sqrt_n=True, bound=False):
    ns = data["ns"]
    for v in VARIANTS:
        color, ls, marker, label = _STYLE[v]
        ax.plot(ns, data[f"{panel}_{v}"], color=color, ls=ls, marker=marker, ms=3, label=label)
    if sqrt_n:
        C = float(np.max(data[f"{panel}_softmax"] / np.sqrt(ns)))
        ax.plot(ns, C * np.sqrt(ns), color=COLORS["reference"], lw=0.7, label=rf"$C\sqrt{{n}}$, $C = {C:.2g}$")
    if bound:
        ax.plot(ns, data[f"{panel}_bound"], color=COLORS["bound"], lw=1.0,
                label="paper's bound (SoftMax)")
    log_axes(ax, [n for n in ns if n in (2, 8, 32, 128, 512) or n == ns[-1]])
    ax.set_xlabel("sequence length $n$")
    ax.set_ylabel(r"$\|Df(X)\|_2$")
    ax.set_title(title, fontsize=9)


def plot_lipschitz(data: dict, cfg: LipschitzConfig):
    fig, axes = new_figure(3, 1, width=3.4, height=3.0)
    form = "mirrored" if data["mirrored"] else "plain"
    _panel(axes[0, 0], data, "fixed", f"adversarial ({form}), fixed $R = {float(data['R_fixed']):.3g}$")
    _panel(axes[0, 1], data, "balanced", r"adversarial, balanced $R_n$", bound=True)
    _panel(axes[0, 2], data, "random", rf"random tokens, $\|x_i\| \approx {float(data['R_fixed']):.3g}$")
    axes[0, 0].legend(loc="upper left", fontsize=6.5)
    axes[0, 1].legend(loc="upper left", fontsize=6.5)
    axes[0, 2].legend(loc="upper left", fontsize=6.5)
    fig.suptitle(f"local Lipschitz constant of one random head ($d = {cfg.d}$) against $n$", fontsize=9)
    return fig


register("attention_lipschitz", compute=compute_lipschitz, plot=plot_lipschitz, quick=LipschitzConfig(),
         full=LipschitzConfig(ns=(2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320), random_seeds=3),
         default=False,
         description="Local Lipschitz constant of attention against n: adversarial and random inputs, "
                     "SoftMax, causal, Sinkhorn",
         caption=("On the paper's adversarial input SoftMax's constant rises like sqrt(n) then falls; "
                  "Sinkhorn's stays flat in n."))
