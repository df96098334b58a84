"""How attention reads a float mask (torch's additive ``attn_mask``): one place for every path.

:func:`split_bias` turns an additive ``bias`` into what the normalizations take: its ``-inf``
entries, and for every normalization but SoftMax those whose exponential underflows in the
compute dtype (``-1e9``), become masked entries of a boolean mask; NaN and ``+inf`` are refused.
:func:`sinkflow.nn.scaled_attention` and the fused passes' own entry
(:func:`sinkflow.nn._fused.fused_attention`) both read it here.
"""

from __future__ import annotations

import torch

from sinkflow._backend import compiling, require

__all__ = ["split_bias"]


def split_bias(variant, mask, bias, dtype):
    """An additive ``bias`` as (boolean mask, finite bias or None): its ``-inf`` entries become
    masked entries and, except for SoftMax, so do those whose exponential underflows to 0 in
    ``dtype``; output-only variants refuse what remains."""
    if bias is None:
        return mask, None
    if not torch.is_tensor(bias) or not bias.is_floating_point():
        raise TypeError("bias must be a floating-point tensor (an additive mask), got "
                        f"{getattr(bias, 'dtype', type(bias))}")
    bias = bias.to(dtype)
    softmax_like = variant.normalize is not None and variant.normalization == "row"  # torch's result: only -inf masks
    dead = torch.isneginf(bias) if softmax_like else bias.exp() == 0
    if compiling():  # no branch on data: the masked entries always become mask entries, the checks assertions
        return _traced_split(variant, mask, bias, dead)
    flags = [(torch.isnan(bias) | torch.isposinf(bias)).any(), dead.any(), ((bias != 0) & ~dead).any()]
    bad, any_dead, kept = torch.stack(flags).tolist()  # one synchronization
    if bad:
        raise ValueError(_BAD_BIAS)
    if any_dead:
        mask = ~dead if mask is None else mask & ~dead
    if not kept:
        return mask, None
    bias = bias.masked_fill(dead, 0.0) if any_dead else bias
    if variant.normalize is None:
        raise ValueError(_OUTPUT_ONLY_BIAS.format(variant.name))
    return mask, bias


_BAD_BIAS = "bias (a float mask) must not hold NaN or +inf"
_OUTPUT_ONLY_BIAS = ("normalization {!r} computes its output without a score matrix: a float mask may only hold 0 "
                     "and -inf (or values whose exponential underflows, e.g. -1e9); pass a boolean mask")


def _traced_split(variant, mask, bias, dead):
    """:func:`split_bias` under torch.compile: the same result, with assertions in the graph for the refusals."""
    require(~(torch.isnan(bias) | torch.isposinf(bias)).any(), ValueError, _BAD_BIAS)
    mask = ~dead if mask is None else mask & ~dead
    if variant.normalize is None:
        require(~((bias != 0) & ~dead).any(), ValueError, _OUTPUT_ONLY_BIAS.format(variant.name))
        return mask, None
    return mask, bias.masked_fill(dead, 0.0)
