"""Kernelized (Gaussian) attention, exact: the kernel exp(-|q - k|^2 / (2 sqrt p)) of Skyformer,
its attention matrix and output, and the lifted PSD 2n x 2n kernel that its Nyström method
approximates (docs/theory/nystrom.md).
"""

from __future__ import annotations

import math

import torch

from sinkflow._backend import (
    broadcast_shapes,
    check_finite,
    check_float,
    check_number,
    exp_floor,
    from_torch,
    leading,
    to_torch,
)
from sinkflow.attention._scores import gaussian_scores

__all__ = ["gaussian_kernel", "kernelized_attention_matrix", "kernelized_attention", "lifted_kernel"]


def _check_pair(Q, K, name_q="Q", name_k="K", V=None):
    q, numpy_out = leading(Q, name_q, K, V)  # torch out if any of Q, K, V is torch
    check_float(q, name_q)
    k = to_torch(K, name_k, like=q)
    if q.ndim < 2 or k.ndim < 2:
        raise ValueError(f"{name_q} and {name_k} must have shape (..., n, p), got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{name_q} and {name_k} must share the head dimension p, got {q.shape[-1]} and {k.shape[-1]}")
    try:
        broadcast_shapes(q.shape[:-2], k.shape[:-2])
    except RuntimeError:
        raise ValueError(f"batch shapes of {name_q} {tuple(q.shape[:-2])} and {name_k} {tuple(k.shape[:-2])} do not "
                         "broadcast") from None
    check_finite(q.detach(), name_q)
    check_finite(k.detach(), name_k)
    return q, k, numpy_out


def _check_values(V, k):
    v = to_torch(V, "V", like=k)
    if v.ndim < 2 or v.shape[-2] != k.shape[-2]:
        raise ValueError(f"V must have shape (..., n_keys={k.shape[-2]}, d_v), got {tuple(v.shape)}")
    check_finite(v.detach(), "V")
    return v


def _kernel(x, y, p):
    """Gaussian kernel exp(-||x - y||^2 / (2 sqrt p)) on torch tensors.

    ``exp(gaussian_scores(x, y, temperature=sqrt(p)))``, exponentiated in place (one n x m
    buffer), with the exp argument floored where float32 exp is fast (``exp_floor``).
    """
    s = gaussian_scores(x, y, temperature=math.sqrt(p))
    if torch.is_grad_enabled() and s.requires_grad:
        return s.clamp_min(exp_floor(s.dtype)).exp()
    return s.clamp_min_(exp_floor(s.dtype)).exp_()


def gaussian_kernel(X, Y, dim: int | None = None):
    r"""Skyformer's Gaussian kernel :math:`\kappa(x, y) = \exp(-\|x - y\|^2 / (2\sqrt{p}))`.

    Parameters
    ----------
    X : array (..., n, p)
    Y : array (..., m, p)
    dim : int, optional
        The head dimension :math:`p` setting the bandwidth (default: ``X.shape[-1]``).

    Returns
    -------
    array (..., n, m), entries in (0, 1]; torch if ``X`` or ``Y`` is, numpy otherwise.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> float(sinkflow.gaussian_kernel(np.zeros((1, 4)), np.ones((1, 4)))[0, 0])  # exp(-4 / 4)
    0.36787944117144233
    """
    x, y, numpy_out = _check_pair(X, Y, "X", "Y")
    p = x.shape[-1] if dim is None else check_number(dim, "dim", integer=True, positive=True)
    if p < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    return from_torch(_kernel(x, y, p), numpy_out)


def kernelized_attention_matrix(Q, K):
    r"""The kernelized attention matrix :math:`C = \exp(-\|q_i - k_j\|^2 / (2\sqrt p))`.

    Equals :math:`D_Q^{-1/2} \exp(Q K^T / \sqrt p) D_K^{-1/2}` with
    :math:`(D_Q)_{ii} = \exp(\|q_i\|^2 / \sqrt p)` (docs/theory/nystrom.md).

    Parameters
    ----------
    Q : array (..., n_q, p)
    K : array (..., n_k, p)

    Returns
    -------
    C : array (..., n_q, n_k)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> C = sinkflow.kernelized_attention_matrix(np.zeros((2, 4)), np.zeros((3, 4)))
    >>> C.shape, float(C.max())
    ((2, 3), 1.0)
    """
    q, k, numpy_out = _check_pair(Q, K)
    return from_torch(_kernel(q, k, q.shape[-1]), numpy_out)


def kernelized_attention(Q, K, V):
    r"""Exact kernelized attention :math:`C V` (no normalization), :math:`O(n^2 p)`.

    Parameters
    ----------
    Q : array (..., n_q, p)
    K : array (..., n_k, p)
    V : array (..., n_k, d_v)

    Returns
    -------
    array (..., n_q, d_v)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.kernelized_attention(np.zeros((2, 4)), np.zeros((3, 4)), np.ones((3, 1)))
    array([[3.],
           [3.]])
    """
    q, k, numpy_out = _check_pair(Q, K, V=V)
    v = _check_values(V, k)
    return from_torch(_kernel(q, k, q.shape[-1]) @ v, numpy_out)


def _stack(q, k):
    shape = broadcast_shapes(q.shape[:-2], k.shape[:-2])
    return torch.cat([q.expand(*shape, *q.shape[-2:]), k.expand(*shape, *k.shape[-2:])], dim=-2)


def lifted_kernel(Q, K):
    r"""The lifted PSD matrix :math:`\bar C = \kappa([Q; K], [Q; K])`, shape (..., N, N).

    :math:`N = n_q + n_k`; the kernelized attention matrix is ``Cbar[..., :n_q, n_q:]``.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> rng = np.random.default_rng(0)
    >>> Q, K = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    >>> Cbar = sinkflow.lifted_kernel(Q, K)
    >>> bool(np.allclose(Cbar[:3, 3:], sinkflow.kernelized_attention_matrix(Q, K)))
    True
    """
    q, k, numpy_out = _check_pair(Q, K)
    x = _stack(q, k)
    return from_torch(_kernel(x, x, q.shape[-1]), numpy_out)
