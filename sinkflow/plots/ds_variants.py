"""Figure of the doubly stochastic variants without a Sinkhorn loop (docs/theory/doubly_stochastic_variants.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import sinkflow
from sinkflow.plots import register
from sinkflow.plots.style import COLORS, new_figure


@dataclass(frozen=True)
class DSVariantsConfig:
    """Self-attention of ``n`` tokens, queries and keys ~ N(0, I) in ``p`` dimensions, scores q k^T / sqrt(p)."""

    n: int = 24
    p: int = 4
    lot_rank: int = 4
    seed: int = 0


#: (registry name or solver, panel title), in panel order.
_PANELS = (("sinkhorn", "Sinkhorn (to tol)"), ("orthostochastic", r"orthostochastic $\exp(C - C^\top)$"),
           ("orthostochastic_qr", "orthostochastic, QR"), ("esp", r"ESP, soft sort $\tau = 10^{-3}$"),
           ("esp_hard", "ESP, hard sort"), ("lot", "LOT, pivot of 4 tokens"))


def ds_variants_data(cfg: DSVariantsConfig) -> dict:
    import torch  # here: listing the figures must not import torch

    g = torch.Generator().manual_seed(cfg.seed)
    q, k = (torch.randn(cfg.n, cfg.p, generator=g, dtype=torch.float64) for _ in range(2))
    C = q @ k.T / np.sqrt(cfg.p)
    scale = cfg.p ** -0.5
    mats = {
        "sinkhorn": sinkflow.solve_sinkhorn(C, tol=1e-12).attention,
        "orthostochastic": sinkflow.orthostochastic(C),
        "orthostochastic_qr": sinkflow.orthostochastic(C, "qr"),
        "esp": sinkflow.esp_plan(q * scale, k * scale),
        "esp_hard": sinkflow.esp_plan(q * scale, k * scale, hard=True),
        "lot": sinkflow.lot_attention(C, cfg.lot_rank, tol=1e-12),
    }
    out = {"scores": C.numpy()}
    for name, K in mats.items():
        out[name] = K.numpy()
        out[f"{name}_row_error"] = float(np.abs(K.sum(-1).numpy() - 1).max())
        out[f"{name}_column_error"] = float(np.abs(K.sum(-2).numpy() - 1).max())
    return out


def ds_variants_plot(data: dict, cfg: DSVariantsConfig):
    from matplotlib.colors import PowerNorm

    fig, axes = new_figure(4, 2, width=2.5, height=2.5)
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)  # square-root scale: small weights stay visible beside 1
    colors = [COLORS["sinkhorn"], COLORS["unnormalized"], COLORS["gaussian"], COLORS["softmax"], COLORS["bound"],
              COLORS["other"]]
    errors = []
    for index, (name, title) in enumerate(_PANELS):
        ax = axes[index // 3, index % 3]
        im = ax.imshow(data[name], cmap="viridis", norm=norm)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("key $j$")
        ax.set_ylabel("query $i$")
        ax.set_xticks([]), ax.set_yticks([])
        ax.grid(False)
        errors.append(max(data[f"{name}_row_error"], data[f"{name}_column_error"]))
    fig.colorbar(im, ax=axes[:, :3], shrink=0.6, label="attention weight (square-root scale)")
    ax = axes[0, 3]
    ranks = np.arange(1, cfg.n + 1)
    for (name, title), color in zip(_PANELS, colors, strict=True):
        ax.step(ranks, np.sort(data[name].sum(0))[::-1], where="mid", color=color, label=title.split(" $")[0])
    ax.set_xlabel("key rank")
    ax.set_ylabel(r"column sum $\sum_i K_{ij}$")
    ax.set_title("sorted column sums", fontsize=9)
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=1)
    ax = axes[1, 3]
    floor = 1e-17  # an exact 0 drawn at the bottom of the log axis
    ax.barh(np.arange(len(_PANELS)), [max(e, floor) for e in errors], color=colors, left=1e-18)
    for row, e in enumerate(errors):
        if e == 0:
            ax.text(2e-17, row, "exactly 0", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(1e-18, 1)
    ax.set_yticks(np.arange(len(_PANELS)), [title.split(" $")[0].split(" (")[0] for _, title in _PANELS],
                  fontsize=7)
    ax.invert_yaxis()
    ax.set_ylabel("attention variant [name]")
    ax.set_xlabel(r"error: max $|$row or column sum $- 1|$")
    ax.set_title("doubly stochastic to", fontsize=9)
    fig.suptitle(f"Doubly stochastic attention without a Sinkhorn loop: one head, n = {cfg.n}, p = {cfg.p}")
    return fig


register(
    "ds_variants_attention",
    compute=ds_variants_data,
    plot=ds_variants_plot,
    quick=DSVariantsConfig(),
    full=DSVariantsConfig(n=48, p=8, lot_rank=4),
    default=False,
    description="Attention matrices of Sinkhorn, orthostochastic (skew, QR), ESP (soft, hard) and LOT, column sums",
    caption=("Orthostochastic, hard-sort ESP and LOT are doubly stochastic to rounding or tolerance without "
             "a Sinkhorn loop; ESP with the authors' soft sort is not."),
)
