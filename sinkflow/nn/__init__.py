"""Torch attention layers with SoftMax, Sinkhorn, Gaussian-kernel or any registered normalization.

The drop-in :class:`MultiheadAttention` (``torch.nn.MultiheadAttention``'s arguments, defaults,
parameter names and masks) and the functional attention it runs. Start reading at
:mod:`~sinkflow.nn.functional` (attention on per-head tensors: :func:`scaled_attention`), then
:mod:`~sinkflow.nn.attention` (the modules). The kernels behind them: ``_fused.py`` (the flash
passes of SoftMax and the Gaussian kernel, chosen by ``fused_preferred``), ``_fused_sinkhorn.py``
(Sinkhorn from fused passes), ``_flash.py`` (torch's flash kernels with log-sum-exp),
``_factored_sinkhorn.py`` (the output from the SoftMax matrix and two scalings),
``_float_mask.py`` (how a float mask is read) and ``_torch_compat.py`` (torch's mask and layout
conventions). Models, training and the papers'
validations built on these layers live one floor up, in :mod:`sinkflow.studies`.
"""

from sinkflow.nn.attention import AttentionKernel, MultiheadAttention
from sinkflow.nn.functional import (
    attention_weights,
    available_normalizations,
    register_normalization,
    scaled_attention,
)

__all__ = ["MultiheadAttention", "AttentionKernel", "attention_weights", "scaled_attention",
           "available_normalizations", "register_normalization"]
