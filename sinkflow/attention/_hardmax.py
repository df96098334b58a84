r"""Hardmax attention: the zero-temperature limit of SoftMax (docs/theory/hardmax.md).

Row :math:`i` of :math:`K` is uniform on the set of its maximal scores,

.. math:: K_{ij} = \frac{\mathbf 1[j \in S_i]}{|S_i|}, \qquad S_i = \arg\max_{j\ \mathrm{admissible}} C_{ij},

the limit of :math:`\mathrm{softmax}(\beta C)` as :math:`\beta \to \infty` (Alcalde, Fantuzzi and Zuazua,
*Clustering in pure-attention hardmax transformers*; Alcalde, Geshkovski and Ruiz-Balet, *Attention's forward
pass and Frank-Wolfe*). Tie rule: exactly equal maxima share the row equally (no tolerance: a row whose maximum
is unique is the one-hot argmax). Self-interaction: the diagonal is a candidate like any other key (a token can
attend to itself, as in self-attention); a mask removes it. A row with no admissible key is zero.

The matrix is piecewise constant in the scores: its gradient is zero almost everywhere (undefined on ties), so
the returned matrix carries no autograd graph. A model layer with ``normalization="hardmax"`` runs forward and
still passes gradients to the values (``out = K v``), none to the queries and keys.

The variant registers itself through :func:`sinkflow.register_attention` (a dense ``normalize``: particle flows
evaluate it densely, the heat layer and :class:`sinkflow.nn.MultiheadAttention` use it like any registered
variant).
"""

from __future__ import annotations

import torch

from sinkflow.attention._variants import register_attention

__all__ = ["hardmax"]


def hardmax(C: torch.Tensor, n_iter=None, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Hardmax of scores ``C`` along the last dimension: each row uniform on its maximal entries.

    Parameters
    ----------
    C : torch.Tensor (..., n, m)
        Scores (real; float16 / bfloat16 are compared in float32).
    n_iter : ignored
        Accepted for the attention interface.
    mask : bool tensor broadcastable to C, optional
        ``True`` where key ``j`` is admissible for query ``i``; a row with no admissible key is zero.

    Returns
    -------
    torch.Tensor
        Same shape and dtype as ``C``, rows summing to 1 (0 for a fully masked row), no autograd graph.

    Examples
    --------
    >>> import torch, sinkflow
    >>> C = torch.tensor([[0.0, 2.0, 1.0], [3.0, 3.0, 1.0]])
    >>> sinkflow.hardmax(C)
    tensor([[0.0000, 1.0000, 0.0000],
            [0.5000, 0.5000, 0.0000]])
    >>> sinkflow.hardmax(C, mask=torch.tensor([True, False, True]))
    tensor([[0., 0., 1.],
            [1., 0., 0.]])
    """
    if not isinstance(C, torch.Tensor):
        raise TypeError(f"C must be a torch.Tensor, got {type(C).__name__}")
    if not C.is_floating_point():
        raise TypeError(f"C must be a floating tensor, got {C.dtype}")
    work = C.detach()
    if work.dtype in (torch.float16, torch.bfloat16):
        work = work.float()
    if mask is not None:
        mask = torch.broadcast_to(mask, work.shape)
        work = work.masked_fill(~mask, -torch.inf)
    top = work.amax(-1, keepdim=True)
    winners = work == top
    if mask is not None:
        winners = winners & mask
    K = winners.to(work.dtype)
    count = K.sum(-1, keepdim=True)
    K = K / count.clamp_min(1.0)
    return K.to(C.dtype)


register_attention("hardmax", hardmax)
