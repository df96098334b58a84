r"""Attention scores from queries and keys (docs/theory/normalizations.md).

``dot_scores`` gives :math:`C_{ij} = \langle q_i, W k_j\rangle / \tau`; ``gaussian_scores``
gives :math:`C_{ij} = -\|q_i - k_j\|_W^2 / (2\tau)` with :math:`\|x\|_W^2 = x^T W x`.
Sinkhorn of the two coincides (they differ by row and column constants); SoftMax differs.
"""

from __future__ import annotations

import torch

from sinkflow._backend import check_finite, check_float, check_number, from_torch, leading, to_torch

__all__ = ["dot_scores", "gaussian_scores", "dot_core", "gaussian_core"]


def _qkw(Q, K, W, temperature):
    q, numpy_out = leading(Q, "Q", K, W)
    check_float(q, "Q")
    k = to_torch(K, "K", like=q)
    if q.ndim < 2 or k.ndim < 2:
        raise ValueError(f"Q and K must have shape (..., n, d) and (..., m, d), got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"Q and K must share the feature dimension, got {q.shape[-1]} and {k.shape[-1]}")
    check_finite(q.detach(), "Q")
    check_finite(k.detach(), "K")
    w = None
    if W is not None:
        w = to_torch(W, "W", like=q)
        d = q.shape[-1]
        if w.shape[-2:] != (d, d):
            raise ValueError(f"W must have shape (..., {d}, {d}), got {tuple(w.shape)}")
        check_finite(w.detach(), "W")
    tau = check_number(temperature, "temperature", positive=True)
    return q, k, w, float(tau), numpy_out


def dot_scores(Q, K, W=None, temperature: float = 1.0):
    r"""Dot-product scores :math:`C_{ij} = q_i^T W k_j / \tau`.

    Parameters
    ----------
    Q : array (..., n, d)
        Queries (or tokens, with ``W = W_Q^T W_K``).
    K : array (..., m, d)
        Keys.
    W : array (..., d, d), optional
        Bilinear form (identity by default).
    temperature : float
        :math:`\tau > 0`.

    Returns
    -------
    C : array (..., n, m); torch if any input is (its device, graph kept), numpy otherwise

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.dot_scores(np.eye(2), np.eye(2), temperature=0.5)
    array([[2., 0.],
           [0., 2.]])
    """
    q, k, w, tau, numpy_out = _qkw(Q, K, W, temperature)
    return from_torch(dot_core(q, k, w, tau), numpy_out)


def dot_core(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, tau: float) -> torch.Tensor:
    """:func:`dot_scores` of checked torch tensors (no checks: a flow's loop calls it every step)."""
    C = (q if w is None else q @ w) @ k.transpose(-1, -2)
    return C if tau == 1.0 else C / tau  # no n x m pass for tau = 1


def gaussian_scores(Q, K, W=None, temperature: float = 1.0):
    r"""Gaussian-kernel scores :math:`C_{ij} = -\|q_i - k_j\|_W^2 / (2\tau)`.

    ``exp(C)`` is the Gaussian kernel of bandwidth :math:`\sqrt{\tau}`; with
    ``temperature = sqrt(p)`` it is Skyformer's kernel. ``W`` must be symmetric positive
    semi-definite for :math:`\|\cdot\|_W` to be a (semi-)norm.

    Parameters
    ----------
    Q : array (..., n, d)
    K : array (..., m, d)
    W : array (..., d, d), optional
        Metric (identity by default).
    temperature : float
        :math:`\tau > 0`.

    Returns
    -------
    C : array (..., n, m); torch if any input is (its device, graph kept), numpy otherwise; all entries ``<= 0``.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.gaussian_scores(np.array([[0.0], [2.0]]), np.array([[0.0]]))
    array([[ 0.],
           [-2.]])
    """
    q, k, w, tau, numpy_out = _qkw(Q, K, W, temperature)
    return from_torch(gaussian_core(q, k, w, tau), numpy_out)


def gaussian_core(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, tau: float) -> torch.Tensor:
    """:func:`gaussian_scores` of checked torch tensors (no checks: a flow's loop calls it every step)."""
    qw = q if w is None else q @ w
    kw = k if w is None else k @ w
    qq = (qw * q).sum(-1)
    kk = (kw * k).sum(-1)
    # Built in place on the one n x m buffer of the matrix product (no n x m temporaries).
    grad_mode = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or (w is not None and w.requires_grad))
    sq = qw @ k.transpose(-1, -2)
    if grad_mode:
        sq = (qq[..., :, None] + kk[..., None, :] - 2 * sq).clamp_min(0)
        return sq * (-0.5 / tau) + 0.0
    # + 0.0 turns -0.0 into 0.0
    return sq.mul_(-2.0).add_(qq[..., :, None]).add_(kk[..., None, :]).clamp_min_(0).mul_(-0.5 / tau).add_(0.0)
