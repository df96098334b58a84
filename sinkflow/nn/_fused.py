r"""Attention outputs from fused block-wise kernels, without the ``n x m`` matrix.

Every pass here is one call of torch's fused scaled-dot-product attention, which walks key
blocks with an online log-sum-exp and keeps O(n p) for backward:

* SoftMax: :math:`Y = N_R(e^{C + B}) V` with :math:`C = q k^T / \sqrt p` is exactly
  ``torch.nn.functional.scaled_dot_product_attention`` with ``scale = 1/sqrt(p)`` (the
  scale of :func:`sinkflow.nn.scaled_attention`) and the boolean mask or additive bias
  :math:`B` as its ``attn_mask``;
* the unnormalized Gaussian kernel of ``"gaussian"``,
  :math:`K_{ij} = \exp(-\|q_i - k_j\|^2 / (2\tau))` with :math:`\tau = \sqrt p`, splits as
  :math:`\exp(a_i)\, \exp(q_i \cdot k_j / \tau + b_j)` with :math:`a_i = -\|q_i\|^2/(2\tau)`
  and :math:`b_j = -\|k_j\|^2/(2\tau)`. The fused pass with key bias :math:`b` returns the
  SoftMax output :math:`O` and the row log-sum-exp :math:`L`, and
  :math:`K V = \exp(L + a) \odot O` undoes the normalization (:math:`L + a \le \log m`:
  no overflow). Backward (:class:`ExpAttention`): with :math:`G = \exp(L + a) \odot dY`
  the fused backward gives :math:`\partial L/\partial C_{ij} = K_{ij}\, dY_i \cdot V_j`
  when it is handed a zero output (its row correction :math:`\sum_p dO \odot O` then
  vanishes, as it must for an unnormalized kernel), and the biases' gradients are line
  sums of that: :math:`\partial L / \partial a_i = dY_i \cdot Y_i`,
  :math:`\partial L / \partial b_j = V_j \cdot \partial L / \partial V_j`.

* Sinkhorn(``n_iter``) in the log domain, :math:`P_{ij} = \exp(C_{ij} + f_i + g_j)`:
  each row step a log-sum-exp pass over keys, each column step one over queries (``q`` and
  ``k`` swapped), the last row step merged into the output pass (SDPA-shaped with the
  column potential as key bias), and one combined flash backward
  (:mod:`sinkflow.nn._fused_sinkhorn`): O(n (p + n_iter)) saved for backward. Same marginals
  and masks as :mod:`sinkflow.nn._factored_sinkhorn` (rows sum to 1, columns to
  :math:`n'/m'` under padding, to uniform attention's column sums under causal and other
  masks, empty lines 0). Key or query padding masks become ``-inf`` line biases;
  other masks are passed as float masks (of the mask's size).

The passes run in float32 (float64 for float64 inputs) with autocast off, and return the
dtype of ``v``; a query with no admissible key gets a zero output. The eager path of
:func:`sinkflow.nn.scaled_attention` is the oracle (tests/nn/test_nn_fused.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sinkflow.attention._variants import (
    AttentionVariant,
    compute_dtype,
    get_attention,
)
from sinkflow.nn._flash import ExpAttention, as4d, flash_with_lse, one_width
from sinkflow.nn._float_mask import split_bias
from sinkflow.nn._fused_sinkhorn import sinkhorn_passes

__all__ = ["fused_available", "fused_kind", "fused_preferred", "fused_attention"]

def _kind(variant: AttentionVariant, n_iter: int) -> str | None:
    """Which fused pass computes a variant that sinkflow's own solvers compute (not a user's callable), or None."""
    if variant.solver == "row" or (variant.solver == "sinkhorn" and n_iter == 1):
        return "softmax"
    if variant.solver == "none" and variant.scores == "gaussian":
        return "gaussian"
    if variant.solver == "sinkhorn" and n_iter >= 2:
        return "sinkhorn"
    return None


def fused_kind(variant, n_iter: int = 1, device: torch.device | str = "cpu") -> str | None:
    """The fused pass (``"softmax"``, ``"gaussian"``, ``"sinkhorn"``) that computes ``variant`` on
    ``device``, or None: the variant classified once.

    SoftMax (and Sinkhorn with ``n_iter = 1``, which is SoftMax) on every device; the
    Gaussian kernel and Sinkhorn where torch's CPU flash kernel with log-sum-exp exists (CPU).

    Examples
    --------
    >>> from sinkflow.nn._fused import fused_kind
    >>> fused_kind("sinkhorn", 1), fused_kind("sinkhorn", 3), fused_kind("unnormalized")
    ('softmax', 'sinkhorn', None)
    """
    kind = _kind(get_attention(variant), n_iter)
    if kind in ("gaussian", "sinkhorn") and not flash_with_lse(device):
        return None
    return kind


def fused_available(variant, n_iter: int = 1, device: torch.device | str = "cpu") -> bool:
    """Whether :func:`fused_attention` computes ``variant`` on ``device`` (see :func:`fused_kind`).

    Examples
    --------
    >>> from sinkflow.nn._fused import fused_available
    >>> fused_available("softmax"), fused_available("unnormalized")
    (True, False)
    """
    return fused_kind(variant, n_iter, device) is not None


def fused_preferred(variant, n_iter: int, q: torch.Tensor, k: torch.Tensor) -> str | None:
    """The fused pass :func:`sinkflow.nn.scaled_attention` takes for queries ``q`` and keys ``k``
    (None: the eager path), wherever one is available.

    Sinkhorn included: the log-domain passes with their combined backward were at least as
    fast as the factored path (which keeps the ``n x m`` SoftMax) at every length measured
    (``benchmarks/bench_attention.py --fused``), and keep O(n (p + n_iter)) per head.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn._fused import fused_preferred
    >>> short = torch.empty(8, 4, 256, 16)
    >>> fused_preferred("softmax", 1, short, short), fused_preferred("sinkhorn", 3, short, short)
    ('softmax', 'sinkhorn')
    """
    return fused_kind(variant, n_iter, q.device)


def _check(q, k, v, allowed, bias):
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"q, k, v must be (..., n, p), (..., m, p), (..., m, p_v) tensors of one rank, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"q and k must share p, and k and v the number of keys, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if allowed is not None and allowed.dtype != torch.bool:
        raise TypeError(f"allowed must be a boolean mask (True = may attend), got dtype {allowed.dtype}")
    if bias is not None and not bias.is_floating_point():
        raise TypeError(f"bias must be a floating-point additive mask, got dtype {bias.dtype}")


def _attn_mask(allowed, bias, dtype):
    """One ``attn_mask`` for SDPA from a boolean mask and an additive bias (None if neither), at
    least 2-D: SDPA reads the last two dimensions as (queries, keys), a 1-D mask is over keys."""
    if bias is None:
        mask = allowed
    else:
        bias = bias.to(dtype)
        mask = bias if allowed is None else bias.masked_fill(~allowed, -math.inf)
    return mask if mask is None or mask.dim() >= 2 else mask.reshape((1,) * (2 - mask.dim()) + mask.shape)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, variant="softmax", *, n_iter: int = 1,
                    allowed: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    r"""Output of an attention variant from fused kernels, never forming the ``n x m`` matrix.

    Parameters
    ----------
    q : torch.Tensor, shape (..., n, p)
    k : torch.Tensor, shape (..., m, p)
    v : torch.Tensor, shape (..., m, p_v)
    variant : str or AttentionVariant
        ``"softmax"`` (and ``"sinkhorn"`` with ``n_iter = 1``) on any device; ``"gaussian"``
        and ``"sinkhorn"`` on CPU; see :func:`fused_available`.
    n_iter : int
        Sinkhorn half-iterations.
    allowed : bool tensor broadcastable to (..., n, m), optional
        ``True`` where query ``i`` may attend to key ``j`` (sinkflow's convention).
    bias : float tensor broadcastable to (..., n, m), optional
        Added to the scores (torch's additive ``attn_mask``; ``-inf`` drops an entry), read
        as :func:`sinkflow.nn.scaled_attention` reads it: for Sinkhorn and the Gaussian
        kernel an entry whose exponential underflows (``-1e9``) is masked too, and NaN or
        ``+inf`` is refused (ValueError). Not differentiated.

    Returns
    -------
    torch.Tensor, shape (..., n, p_v), dtype of ``v``
        Equal to ``scaled_attention(q, k, v, variant, n_iter=n_iter, mask=allowed)[0]`` to
        rounding; queries with no admissible key give zeros.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn import scaled_attention
    >>> from sinkflow.nn._fused import fused_attention
    >>> q, k, v = torch.randn(3, 2, 6, 4, generator=torch.Generator().manual_seed(0))
    >>> eager = scaled_attention(q, k, v, "gaussian")[0]
    >>> bool(torch.allclose(fused_attention(q, k, v, "gaussian"), eager, atol=1e-6))
    True
    """
    kind = fused_kind(variant, n_iter, q.device)
    if kind is None:
        raise ValueError(f"no fused pass for {get_attention(variant).name!r} with n_iter={n_iter} on "
                         f"{q.device.type}; see fused_available")
    _check(q, k, v, allowed, bias)
    allowed, bias = split_bias(get_attention(variant), allowed, bias, compute_dtype(q, k))
    return fused_output(kind, q, k, v, n_iter, allowed, bias)


def fused_output(kind: str, q, k, v, n_iter, allowed=None, bias=None) -> torch.Tensor:
    """:func:`fused_attention` for a pass already chosen (:func:`fused_kind`, :func:`fused_preferred`)."""
    _check(q, k, v, allowed, bias)
    if bias is not None and bias.requires_grad:
        bias = bias.detach()
    dtype = compute_dtype(q, k, v)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q32, k32, v32 = q.to(dtype), k.to(dtype), v.to(dtype)
        if kind == "softmax":
            out = _softmax_pass(q32, k32, v32, _attn_mask(allowed, bias, dtype))
        elif kind == "gaussian":
            out = _gaussian_pass(q32, k32, v32, allowed, bias)
        else:
            out = sinkhorn_passes(q32, k32, v32, int(n_iter), allowed, bias)
    return out.to(v.dtype)


def _zeroes_empty_rows(device) -> bool:
    """Whether torch's fused kernels on ``device`` return 0 for a query with no admissible key (CPU: yes)."""
    return device.type == "cpu"


def _softmax_pass(q, k, v, attn_mask):
    """SoftMax attention with scores ``q k^T / sqrt(p)`` (plus the mask) through SDPA."""
    scale, p_v = 1.0 / math.sqrt(q.shape[-1]), v.shape[-1]
    q, k, v = one_width(q, k, v)
    empty = None
    if attn_mask is not None and not _zeroes_empty_rows(q.device):  # elsewhere such a row may be NaN:
        ok = attn_mask if attn_mask.dtype == torch.bool else attn_mask > -math.inf  # let it attend
        empty = ~ok.any(-1, keepdim=True)  # everywhere, then zero it (no gradient flows through it)
        attn_mask = attn_mask | empty if attn_mask.dtype == torch.bool else attn_mask.masked_fill(empty, 0.0)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)[..., :p_v]
    return out if empty is None else out.masked_fill(empty, 0.0)


def _gaussian_pass(q, k, v, allowed, bias):
    r"""Skyformer's unnormalized kernel ``exp(-|q_i - k_j|^2 / (2 sqrt p)) (* exp(bias))`` times ``v``."""
    tau = math.sqrt(q.shape[-1])
    batch, m, p_v = q.shape[:-2], k.shape[-2], v.shape[-1]
    mask = None
    if allowed is not None or bias is not None:
        mask = torch.zeros((), dtype=q.dtype, device=q.device) if bias is None else bias.to(q.dtype)
        mask = mask if allowed is None else mask.masked_fill(~allowed, -math.inf)
        mask = as4d(mask.expand(torch.broadcast_shapes(mask.shape, batch + (1, m))))
    q, k, v = (as4d(t) for t in one_width(q, k, v))
    row, col = q.square().sum(-1) * (-0.5 / tau), k.square().sum(-1) * (-0.5 / tau)
    y = ExpAttention.apply(q, k, v, row, col, mask, 1.0 / tau)
    return y.reshape(*batch, *y.shape[-2:])[..., :p_v]
