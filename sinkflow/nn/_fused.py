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
  no overflow). Backward (:class:`_ExpAttention`): with :math:`G = \exp(L + a) \odot dY`
  the fused backward gives :math:`\partial L/\partial C_{ij} = K_{ij}\, dY_i \cdot V_j`
  when it is handed a zero output (its row correction :math:`\sum_p dO \odot O` then
  vanishes, as it must for an unnormalized kernel), and the biases' gradients are line
  sums of that: :math:`\partial L / \partial a_i = dY_i \cdot Y_i`,
  :math:`\partial L / \partial b_j = V_j \cdot \partial L / \partial V_j`.

* Sinkhorn(``n_iter``) in the log domain, :math:`P_{ij} = \exp(C_{ij} + f_i + g_j)`:
  each row step is a pass :math:`f_i = -\mathrm{LSE}_j(C_{ij} + g_j)` over keys, each
  column step a pass :math:`g_j = \log b_j - \mathrm{LSE}_i(C_{ij} + f_i)` over queries
  (the same kernel with ``q`` and ``k`` swapped), and the output is the unnormalized pass
  above with biases ``f`` and ``g``: ``n_iter + 1`` passes, O(n p) saved for backward
  (:class:`_LogSumExp`: the backward of a log-sum-exp pass is the fused backward with values
  :math:`e_1`). Same marginals and masks as :mod:`sinkflow.nn._factored_sinkhorn` (rows sum
  to 1, columns to :math:`n'/m'`, empty lines 0), but no range limit: nothing is divided.
  Key or query padding masks become ``-inf`` line biases; other masks are passed as float
  masks (of the mask's size).

The passes run in float32 (float64 for float64 inputs) with autocast off, and return the
dtype of ``v``; a query with no admissible key gets a zero output. The eager path of
:func:`sinkflow.nn.scaled_attention` is the oracle (tests/nn/test_nn_fused.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sinkflow.attention._variants import AttentionVariant, _exponential, _sinkhorn, _softmax, compute_dtype, get_attention

__all__ = ["fused_available", "fused_preferred", "fused_attention"]

_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CPU_FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def _kind(variant: AttentionVariant, n_iter: int) -> str | None:
    """Which fused pass computes a built-in variant (not a user's override), or None."""
    if variant.normalize is _softmax or (variant.normalize is _sinkhorn and n_iter == 1):
        return "softmax"
    if variant.normalize is _exponential and variant.scores == "gaussian":
        return "gaussian"
    if variant.normalize is _sinkhorn and n_iter >= 2:
        return "sinkhorn"
    return None


def fused_available(variant, n_iter: int = 1, device: torch.device | str = "cpu") -> bool:
    """Whether :func:`fused_attention` computes ``variant`` on ``device``.

    SoftMax (and Sinkhorn with ``n_iter = 1``, which is SoftMax) on every device; the
    Gaussian kernel and Sinkhorn where torch's CPU flash kernel with log-sum-exp exists (CPU).

    Examples
    --------
    >>> from sinkflow.nn._fused import fused_available
    >>> fused_available("softmax"), fused_available("unnormalized")
    (True, False)
    """
    kind = _kind(get_attention(variant), n_iter)
    if kind in ("gaussian", "sinkhorn"):
        return torch.device(device).type == "cpu" and _CPU_FLASH is not None and _CPU_FLASH_BACKWARD is not None
    return kind is not None


# Sinkhorn(n_iter) makes n_iter + 1 fused passes; the factored path makes one SoftMax pass and
# keeps the n x m matrix. On CPU (one thread, embedding 64, 4 heads, n_iter = 3) the factored
# path was the faster at every length measured (2.1-2.6x torch's SDPA per training step at
# n = 1,024 and 4,096, the fused passes 3.7-4x; at 16,384 the fused passes took 2.4x), so the
# fused passes take over only where the matrix the factored path keeps would pass this many bytes.
SINKHORN_MATRIX_BYTES = 2**30


def fused_preferred(variant, n_iter: int, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether :func:`sinkflow.nn.scaled_attention` takes the fused pass for queries ``q`` and keys ``k``.

    Always where it is available, except Sinkhorn: there only when the factored path's
    float32 (float64) ``(..., n, m)`` matrix would exceed ``SINKHORN_MATRIX_BYTES``.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn._fused import fused_preferred
    >>> short, long = torch.empty(8, 4, 256, 16), torch.empty(1, 4, 16384, 16)
    >>> fused_preferred("softmax", 1, short, short), fused_preferred("sinkhorn", 3, short, short)
    (True, False)
    >>> fused_preferred("sinkhorn", 3, long, long)
    True
    """
    if not fused_available(variant, n_iter, q.device):
        return False
    if _kind(get_attention(variant), n_iter) != "sinkhorn":
        return True
    itemsize = torch.finfo(compute_dtype(q, k)).bits // 8
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    return math.prod(batch) * q.shape[-2] * k.shape[-2] * itemsize > SINKHORN_MATRIX_BYTES


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
    """One ``attn_mask`` for SDPA from a boolean mask and an additive bias (None if neither)."""
    if bias is None:
        return allowed
    bias = bias.to(dtype)
    return bias if allowed is None else bias.masked_fill(~allowed, -math.inf)


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
        Added to the scores (torch's additive ``attn_mask``; ``-inf`` drops an entry). Not
        differentiated.

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
    var = get_attention(variant)
    if not fused_available(var, n_iter, q.device):
        raise ValueError(f"no fused pass for {var.name!r} with n_iter={n_iter} on {q.device.type}; "
                         "see fused_available")
    _check(q, k, v, allowed, bias)
    if bias is not None and bias.requires_grad:
        bias = bias.detach()
    dtype = compute_dtype(q, k, v)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q32, k32, v32 = q.to(dtype), k.to(dtype), v.to(dtype)
        kind = _kind(var, n_iter)
        if kind == "softmax":
            out = _softmax_pass(q32, k32, v32, _attn_mask(allowed, bias, dtype))
        elif kind == "gaussian":
            out = _gaussian_pass(q32, k32, v32, allowed, bias)
        else:
            out = _sinkhorn_pass(q32, k32, v32, int(n_iter), allowed, bias)
    return out.to(v.dtype)


def _one_width(q, k, v):
    """Zero-pad q and k or v to one head width (the fused kernels want it; scores and output unchanged)."""
    width = max(q.shape[-1], v.shape[-1])
    return tuple(t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))


def _zeroes_empty_rows(device) -> bool:
    """Whether torch's fused kernels on ``device`` return 0 for a query with no admissible key (CPU: yes)."""
    return device.type == "cpu"


def _softmax_pass(q, k, v, attn_mask):
    """SoftMax attention with scores ``q k^T / sqrt(p)`` (plus the mask) through SDPA."""
    scale, p_v = 1.0 / math.sqrt(q.shape[-1]), v.shape[-1]
    q, k, v = _one_width(q, k, v)
    empty = None
    if attn_mask is not None and not _zeroes_empty_rows(q.device):  # elsewhere such a row may be NaN:
        ok = attn_mask if attn_mask.dtype == torch.bool else attn_mask > -math.inf  # let it attend
        empty = ~ok.any(-1, keepdim=True)  # everywhere, then zero it (no gradient flows through it)
        attn_mask = attn_mask | empty if attn_mask.dtype == torch.bool else attn_mask.masked_fill(empty, 0.0)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)[..., :p_v]
    return out if empty is None else out.masked_fill(empty, 0.0)


def _bias_mask(col, mask):
    """The ``attn_mask`` of a key bias ``col (B, H, m)`` (plus a float mask): contiguous, since the
    kernels copy a strided mask to full size (a log-sum-exp comes out with strides (B, n, H))."""
    col = col.contiguous().unsqueeze(-2)
    return col if mask is None else mask + col


class _ExpAttention(torch.autograd.Function):
    r"""``Y_i = sum_j exp(scale q_i.k_j + mask_ij + col_j + row_i) v_j`` on 4-D (B, 1, n, p) tensors (CPU)."""

    @staticmethod
    def forward(ctx, q, k, v, row, col, mask, scale):
        attn = _bias_mask(col, mask)
        out, lse = _CPU_FLASH(q, k, v, attn_mask=attn, scale=scale)
        r = torch.exp(lse + row)  # the row sums of the kernel, <= m
        y = r.unsqueeze(-1) * out
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, attn, lse, r, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        q, k, v, attn, lse, r, y = ctx.saved_tensors
        g = (r.unsqueeze(-1) * dy).contiguous()
        # A zero "output" removes the kernel's SoftMax row correction: dC_ij = K_ij dy_i . v_j.
        dq, dk, dv = _CPU_FLASH_BACKWARD(g, q, k, v, torch.zeros_like(y), lse, 0.0, False,
                                         attn_mask=attn, scale=ctx.scale)
        return dq, dk, dv, torch.linalg.vecdot(dy, y), torch.linalg.vecdot(v, dv), None, None


def _as4d(t):
    """``(..., a, b)`` as ``(B, H, a, b)``: a view up to four dimensions (the kernels' layout)."""
    return t.reshape((1,) * (4 - t.dim()) + t.shape) if t.dim() <= 4 else t.reshape(-1, *t.shape[-3:])


def _gaussian_pass(q, k, v, allowed, bias):
    r"""Skyformer's unnormalized kernel ``exp(-|q_i - k_j|^2 / (2 sqrt p)) (* exp(bias))`` times ``v``."""
    tau = math.sqrt(q.shape[-1])
    batch, m, p_v = q.shape[:-2], k.shape[-2], v.shape[-1]
    mask = None
    if allowed is not None or bias is not None:
        mask = torch.zeros((), dtype=q.dtype, device=q.device) if bias is None else bias.to(q.dtype)
        mask = mask if allowed is None else mask.masked_fill(~allowed, -math.inf)
        mask = _as4d(mask.expand(torch.broadcast_shapes(mask.shape, batch + (1, m))))
    q, k, v = (_as4d(t) for t in _one_width(q, k, v))
    row, col = q.square().sum(-1) * (-0.5 / tau), k.square().sum(-1) * (-0.5 / tau)
    y = _ExpAttention.apply(q, k, v, row, col, mask, 1.0 / tau)
    return y.reshape(*batch, *y.shape[-2:])[..., :p_v]


class _LogSumExp(torch.autograd.Function):
    r"""``L_i = logsumexp_j(scale q_i.k_j + mask_ij + g_j)`` on 4-D (B, H, n, p) tensors (CPU), one flash pass.

    Backward: with values ``e_1`` and output gradient ``gamma e_1`` (and a zero output) the
    flash backward gives :math:`\partial C_{ij} = \gamma_i P_{ij}`, its ``dq``, ``dk``, and
    :math:`\partial g_j = \sum_i \gamma_i P_{ij}` as the first column of ``dv``.
    """

    @staticmethod
    def forward(ctx, q, k, g, mask, scale):
        attn = _bias_mask(g, mask)
        lse = _CPU_FLASH(q, k, k, attn_mask=attn, scale=scale)[1]  # the output (k as values) is not used
        ctx.scale = scale
        ctx.save_for_backward(q, k, attn, lse)
        return lse

    @staticmethod
    def backward(ctx, gamma):
        q, k, attn, lse = ctx.saved_tensors
        e1 = torch.zeros_like(k)
        e1[..., 0] = 1
        g = torch.zeros_like(q)
        g[..., 0] = gamma
        dq, dk, dv = _CPU_FLASH_BACKWARD(g, q, k, e1, torch.zeros_like(q), lse, 0.0, False,
                                         attn_mask=attn, scale=ctx.scale)
        return dq, dk, dv[..., 0], None, None


def _line_masks(allowed, bias, batch, n, m, dtype):
    """Admissible rows and columns, and the float masks of the row and column passes (None when
    the mask is key/query padding only: -inf biases on the lines then do it). ``-inf`` in
    ``bias`` counts as masked."""
    if allowed is None and bias is None:
        return None, None, None, None
    full = torch.ones((), dtype=torch.bool, device=(allowed if bias is None else bias).device)
    full = full if allowed is None else full & allowed
    full = torch.broadcast_to(full if bias is None else full & (bias > -math.inf), batch + (n, m))
    rows, cols = full.any(-1), full.any(-2)
    line_mask = allowed is not None and (allowed.dim() < 2 or 1 in allowed.shape[-2:])  # padding: rows x cols
    if bias is None and (line_mask or bool(torch.equal(full, rows.unsqueeze(-1) & cols.unsqueeze(-2)))):
        return rows, cols, None, None
    drop = torch.zeros((), dtype=dtype, device=full.device) if bias is None else bias.to(dtype)
    drop = torch.broadcast_to(drop, batch + (n, m)).masked_fill(~full, -math.inf)
    return rows, cols, _as4d(drop), _as4d(drop.transpose(-1, -2))


def _sinkhorn_pass(q, k, v, n_iter, allowed, bias):
    r"""Sinkhorn(n_iter) attention :math:`P V` in the log domain: ``n_iter`` log-sum-exp passes, one output pass."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    batch, n, m, p_v = q.shape[:-2], q.shape[-2], k.shape[-2], v.shape[-1]
    rows, cols, row_mask, col_mask = _line_masks(allowed, bias, batch, n, m, q.dtype)
    q, k, v = (_as4d(t) for t in _one_width(q, k, v))
    inf = torch.tensor(-math.inf, dtype=q.dtype, device=q.device)
    if rows is None:
        log_b, g = torch.full((), math.log(n / m), dtype=q.dtype, device=q.device), q.new_zeros(k.shape[:-1])
    else:
        rows, cols = _as4d(rows.unsqueeze(-1)).squeeze(-1), _as4d(cols.unsqueeze(-1)).squeeze(-1)
        ratio = rows.sum(-1, keepdim=True).to(q.dtype) / cols.sum(-1, keepdim=True).clamp_min(1).to(q.dtype)
        log_b, g = torch.log(ratio), torch.where(cols, 0.0, inf).to(q.dtype)
    f = None
    for t in range(n_iter):
        if t % 2 == 0:  # row step: f = -logsumexp_j(C_ij + g_j)
            lse = _LogSumExp.apply(q, k, g, row_mask, scale)
            f = -lse if rows is None else torch.where(rows, -lse, inf)
        else:  # column step: g = log b - logsumexp_i(C_ij + f_i)
            lse = _LogSumExp.apply(k, q, f, col_mask, scale)
            g = log_b - lse if cols is None else torch.where(cols, log_b - lse, inf)
    y = _ExpAttention.apply(q, k, v, f, g, row_mask, scale)
    return y.reshape(*batch, *y.shape[-2:])[..., :p_v]
