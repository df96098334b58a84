r"""Causal particle flows (Karagodin, Polyanskiy and Rigollet 2024; docs/theory/causal.md): token
:math:`i` attends only to tokens :math:`j \le i`. The mask, the key targets of a masked Sinkhorn
flow, and the Rényi parking centers that predict the metastable clusters from the initial tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from sinkflow._backend import check_number, to_torch
from sinkflow.attention._marginals import uniform_attention_marginal

__all__ = ["causal_mask", "renyi_centers"]


def causal_mask(n: int, device=None) -> torch.Tensor:
    """The causal mask of ``n`` tokens: ``True`` where token ``i`` attends to token ``j <= i``.

    Examples
    --------
    >>> from sinkflow.particles import causal_mask
    >>> causal_mask(3).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    n = check_number(n, "n", integer=True, positive=True)
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def key_targets(mask, weights, x):
    """The key marginal a Sinkhorn flow targets: the weights, or under a mask those of uniform attention."""
    if mask is None:
        return weights
    a = weights if weights is not None else torch.full(x.shape[:1], 1.0 / x.shape[0], dtype=x.dtype, device=x.device)
    return uniform_attention_marginal(mask, a, a)


def renyi_centers(x, spacing: float) -> np.ndarray:
    r"""Indices of the Rényi parking centers of tokens taken in order.

    Token 0 is a center; token :math:`i` becomes one when it lies farther than ``spacing``
    (Euclidean distance) from every earlier center: the sequential random parking that
    Karagodin, Polyanskiy and Rigollet (NeurIPS 2024) relate to the metastable clusters of
    causal attention on the sphere (their setting: ``spacing`` :math:`= 4 \beta^{-1/2}`).

    Parameters
    ----------
    x : array (n, d)
        Tokens in their causal order.
    spacing : float
        Parking distance (> 0).

    Returns
    -------
    numpy.ndarray of int
        The centers' indices, increasing.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x = np.array([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.0], [0.0, 1.0]])
    >>> sinkflow.renyi_centers(x, spacing=0.5)
    array([0, 2, 3])
    """
    spacing = float(check_number(spacing, "spacing", positive=True))
    X = to_torch(x, "x").detach().to(torch.float64)
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(f"x must have shape (n, d) with n >= 1, got {tuple(X.shape)}")
    pts = X.cpu().numpy()
    centers = [0]
    for i in range(1, len(pts)):
        if np.all(np.linalg.norm(pts[centers] - pts[i], axis=1) > spacing):
            centers.append(i)
    return np.array(centers, dtype=int)
