r"""The column marginals of masked doubly stochastic attention (docs/theory/causal.md).

Under a mask the key (column) targets of Sinkhorn attention are those of **uniform attention
under the same mask**: with query weights :math:`a` and key weights :math:`b` (uniform by
default), row :math:`i` of uniform attention spreads its mass over its admissible keys in
proportion to :math:`b`, and the column target is what key :math:`j` receives,

.. math:: \beta_j = b_j \sum_i a_i \frac{M_{ij}}{\sum_{j'} M_{ij'} b_{j'}}.

The uniform masked matrix :math:`U_{ij} = M_{ij} b_j / \sum_{j'} M_{ij'} b_{j'}` has rows
summing to 1, the column marginal :math:`a^T U = \beta` and the mask's support, so the target
is reachable and Sinkhorn converges (Menon's theorem); constant scores give :math:`U` itself,
the masked average. For a padding mask (admissible = query rows x key columns) :math:`\beta`
is :math:`b` renormalized over the admissible keys, the convention of every unmasked solve;
under a causal mask the uniform target :math:`\beta = b` is reachable only by the identity.
"""

from __future__ import annotations

import torch

from sinkflow._backend import branch_free

__all__ = []


def is_padding(mask: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> bool:
    r"""Whether ``mask`` (..., n, m) is a padding mask: admissible exactly on its rows x columns.

    A mask broadcast along queries or keys (stride 0: key or query padding) is one without a
    look; any other costs one comparison of the mask and one sync. Under ``torch.compile`` the
    answer is ``False`` without a look (no branch on data in a graph): on a padding mask
    :func:`uniform_attention_marginal` is the padding convention itself, once normalized
    (:math:`\beta_j \propto b_j` on the admissible keys), to rounding.
    """
    if mask.dim() >= 2 and 0 in (mask.stride(-1), mask.stride(-2)):
        return True
    if branch_free():
        return False
    return bool(torch.equal(mask, rows.unsqueeze(-1) & cols.unsqueeze(-2)))


def uniform_attention_marginal(mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r"""Column marginal :math:`\beta = a^T U` of uniform attention :math:`U` under ``mask``.

    ``mask`` (..., n, m) boolean, ``a`` (..., n) query weights, ``b`` (..., m) key weights
    (non-negative; any total: ``a = 1`` gives column sums in counts). A row that sees no key
    weight contributes nothing. Returns (..., m) in ``a``'s dtype.
    """
    M = mask.to(a.dtype)
    seen = (M @ b.unsqueeze(-1)).squeeze(-1)  # key weight each row can attend to
    share = torch.where(seen > 0, a / torch.where(seen > 0, seen, torch.ones_like(seen)), torch.zeros_like(seen))
    return b * (share.unsqueeze(-2) @ M).squeeze(-2)
