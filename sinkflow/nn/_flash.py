"""torch's CPU flash-attention kernels (with log-sum-exp) and the layout helpers of the fused passes.

Each call walks key blocks with an online log-sum-exp: ``out, lse = flash(q, k, v, attn_mask,
scale)`` with ``lse_i = log sum_j exp(scale q_i.k_j + mask_ij)``, never the ``n x m`` matrix.
The kernels want one head width for ``q``, ``k`` and ``v`` and 4-D ``(B, H, n, p)`` tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sinkflow._backend import first_order

CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
CPU_FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def flash_with_lse(device) -> bool:
    """Whether the flash kernels with log-sum-exp run on ``device`` (CPU, when torch has them)."""
    return torch.device(device).type == "cpu" and CPU_FLASH is not None and CPU_FLASH_BACKWARD is not None


def one_width(*ts, width=None):
    """Zero-pad the last dimension of each tensor to one width (the widest, or ``width``)."""
    width = max(t.shape[-1] for t in ts) if width is None else width
    return tuple(t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1])) for t in ts)


def as4d(t):
    """``(..., a, b)`` as ``(B, H, a, b)``: a view up to four dimensions (the kernels' layout)."""
    return t.reshape((1,) * (4 - t.dim()) + t.shape) if t.dim() <= 4 else t.reshape(-1, *t.shape[-3:])


def bias_mask(col, mask):
    """The ``attn_mask`` of a key bias ``col (B, H, m)`` (plus a float mask): contiguous, since the
    kernels copy a strided mask to full size (a log-sum-exp comes out with strides (B, n, H))."""
    col = col.contiguous().unsqueeze(-2)
    return col if mask is None else mask + col


class ExpAttention(torch.autograd.Function):
    r"""``Y_i = sum_j exp(scale q_i.k_j + mask_ij + col_j + row_i) v_j`` on 4-D (B, 1, n, p) tensors (CPU)."""

    @staticmethod
    def forward(ctx, q, k, v, row, col, mask, scale):
        attn = bias_mask(col, mask)
        out, lse = CPU_FLASH(q, k, v, attn_mask=attn, scale=scale)[:2]
        r = torch.exp(lse + row)  # the row sums of the kernel, <= m
        y = r.unsqueeze(-1) * out
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, attn, lse, r, y)
        return y

    @staticmethod
    @first_order
    def backward(ctx, dy):
        q, k, v, attn, lse, r, y = ctx.saved_tensors
        g = (r.unsqueeze(-1) * dy).contiguous()
        # A zero "output" removes the kernel's SoftMax row correction: dC_ij = K_ij dy_i . v_j.
        dq, dk, dv = CPU_FLASH_BACKWARD(g, q, k, v, torch.zeros_like(y), lse, 0.0, False,
                                        attn_mask=attn, scale=ctx.scale)
        return dq, dk, dv, torch.linalg.vecdot(dy, y), torch.linalg.vecdot(v, dv), None, None
