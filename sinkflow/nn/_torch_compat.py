"""torch.nn.MultiheadAttention's conventions, for :class:`sinkflow.nn.MultiheadAttention`.

Shape checks (batched and unbatched inputs, as ``torch.nn.functional.multi_head_attention_forward``),
the batch-first layout, the input projections of torch's parameter layout, and torch's masks
(boolean ``True = masked out`` or additive float) turned into sinkflow's pair: a boolean mask
(``True = admissible``) and an additive float bias.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_shapes(mha, query, key, value, key_padding_mask, attn_mask, query_padding_mask) -> bool:
    """Refuse what torch refuses (with the expected shape); True for batched (3-D) inputs."""
    if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(f"query, key and value must be all 3-D (batched) or all 2-D (unbatched), got "
                         f"{query.dim()}-D, {key.dim()}-D and {value.dim()}-D")
    batched = query.dim() == 3
    for t, width, name in ((query, mha.embed_dim, "query"), (key, mha.kdim, "key"), (value, mha.vdim, "value")):
        if t.shape[-1] != width:
            raise ValueError(f"{name} must have {width} features in its last dimension, got shape {tuple(t.shape)}")
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(f"key and value must agree but in the features, got {tuple(key.shape)} and "
                         f"{tuple(value.shape)}")
    seq = (lambda t: t.shape[1 if mha.batch_first else 0]) if batched else (lambda t: t.shape[0])
    b = (query.shape[0 if mha.batch_first else 1],) if batched else ()
    n, m = seq(query), seq(key)
    if batched and key.shape[0 if mha.batch_first else 1] != b[0]:
        raise ValueError(f"query and key must have the same batch size, got {tuple(query.shape)} and "
                         f"{tuple(key.shape)}")
    for mask, shape, name in ((key_padding_mask, b + (m,), "key_padding_mask"),
                              (query_padding_mask, b + (n,), "query_padding_mask")):
        if mask is not None and tuple(mask.shape) != shape:
            raise ValueError(f"{name} must have shape {'(batch, ' if batched else '('}seq) = {shape}, got "
                             f"{tuple(mask.shape)}")
    heads = (b[0] * mha.num_heads,) if batched else (mha.num_heads,)
    if attn_mask is not None and tuple(attn_mask.shape) not in ((n, m), heads + (n, m)):
        lead = "batch * heads" if batched else "heads"
        raise ValueError(f"attn_mask must have shape (n, m) = {(n, m)} or ({lead}, n, m) = {heads + (n, m)}, "
                         f"got {tuple(attn_mask.shape)}")
    return batched


def nested_forward(mha, query, key, value, key_padding_mask, query_padding_mask, **kwargs):
    """The module on NestedTensors (what ``torch.nn.TransformerEncoder`` passes in eval mode with a padding mask).

    The sequences are padded, their padding becomes ``key_padding_mask`` and
    ``query_padding_mask`` (a token that is not there takes no part, also in Sinkhorn's
    column constraint), and the output is nested again: each sequence's result is that of
    the sequence alone. Weights, when asked for, are padded ``(batch, ..., n_max, m_max)``.
    """
    if not all(t.is_nested for t in (query, key, value)):
        raise ValueError("query, key and value must be all NestedTensors or all regular tensors")
    if query.dim() != 3:
        raise ValueError(f"a nested query must hold sequences of (seq, embed_dim) tokens, got a {query.dim()}-D one")
    if not mha.batch_first:
        raise ValueError("NestedTensor inputs need batch_first=True (each sequence is one entry of the batch)")
    if key_padding_mask is not None or query_padding_mask is not None:
        raise ValueError("NestedTensor inputs carry their own padding: pass no key_padding_mask or query_padding_mask")
    padded = {}
    for t in (query, key, value):
        padded.setdefault(id(t), torch.nested.to_padded_tensor(t, 0.0))
    q, k, v = padded[id(query)], padded[id(key)], padded[id(value)]
    lengths = [torch.tensor([s.shape[0] for s in t.unbind()], device=q.device) for t in (query, key)]
    pads = [torch.arange(p.shape[1], device=q.device) >= n[:, None] for p, n in zip((q, k), lengths, strict=True)]
    out, weights = mha(q, k, v, key_padding_mask=pads[1], query_padding_mask=pads[0], **kwargs)
    out = torch.nested.as_nested_tensor([o[:n] for o, n in zip(out, lengths[0].tolist(), strict=True)],
                                        layout=query.layout)
    return out, weights


def to_batch_first(query, key, value, batched: bool, batch_first: bool):
    """``(batch, seq, feature)`` views of the inputs; an input passed twice stays one object."""
    def layout(t):
        return t[None] if not batched else t if batch_first else t.transpose(0, 1)

    q = layout(query)
    k = q if key is query else layout(key)
    v = k if value is key else q if value is query else layout(value)
    return q, k, v


def in_projection(mha, query, key, value):
    """q, k, v from torch's parameter layout, as torch computes them.

    Self-attention (one tensor for query, key and value) is one product with
    ``in_proj_weight`` split in three; a key that is also the value, one product for both:
    autograd then saves the input once, as torch does (three products saved it three times).
    """
    w, bias = mha.in_proj_weight, mha.in_proj_bias
    dtype = (w if w is not None else mha.q_proj_weight).dtype
    if bias is not None and bias.dtype != dtype:  # e.g. a half bias on double weights: added in their dtype, as torch
        bias = bias.to(dtype)
    if mha._qkv_same_embed_dim and query is key and key is value:
        return F.linear(query, w, bias).chunk(3, -1)
    b_q, b_k, b_v = (None, None, None) if bias is None else bias.chunk(3)
    if mha._qkv_same_embed_dim:
        w_q, w_k, w_v = w.chunk(3)
        if key is value:
            e = mha.embed_dim
            k, v = F.linear(key, w[e:], None if bias is None else bias[e:]).chunk(2, -1)
            return F.linear(query, w_q, b_q), k, v
    else:
        w_q, w_k, w_v = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
    return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)


def torch_mask(mask, name: str):
    """A torch mask as ``(admissible, bias)``: boolean (``True = masked out``) or additive float."""
    if mask.dtype == torch.bool:
        return ~mask, None
    if not mask.is_floating_point():
        raise TypeError(f"{name} must be boolean (True = masked out) or floating (added to the scores), as in torch; "
                        f"got dtype {mask.dtype}")
    return None, mask


def _and(a, b):
    return b if a is None else a if b is None else a & b


def _add(a, b):
    return b if a is None else a if b is None else a + b


def combined_masks(b, n, m, heads, key_padding_mask, attn_mask, query_padding_mask, is_causal, extra_keys, device):
    """sinkflow's ``(admissible, bias)`` broadcastable to ``(b, heads, n, m + extra_keys)``, from batched torch masks.

    The extra keys (``add_bias_kv``, ``add_zero_attn``) are admissible with bias 0, as torch pads its masks.
    """
    allowed = bias = None
    if key_padding_mask is not None:
        allowed, bias = (None if t is None else t.to(device)[:, None, None, :]
                         for t in torch_mask(key_padding_mask, "key_padding_mask"))
    if attn_mask is None and is_causal:  # torch asks for the mask; here is_causal alone builds it
        attn_mask = torch.ones(n, m, dtype=torch.bool, device=device).triu(1)
    if attn_mask is not None:
        am = attn_mask.to(device)
        am = am.view(b, heads, n, m) if am.dim() == 3 else am
        am_allowed, am_bias = torch_mask(am, "attn_mask")
        allowed, bias = _and(allowed, am_allowed), _add(bias, am_bias)
    if extra_keys:
        allowed = None if allowed is None else F.pad(allowed, (0, extra_keys), value=True)
        bias = None if bias is None else F.pad(bias, (0, extra_keys), value=0.0)
    if query_padding_mask is not None:
        q_allowed, q_bias = torch_mask(query_padding_mask.to(device), "query_padding_mask")
        if q_bias is not None:
            raise TypeError("query_padding_mask must be boolean (True = pad)")
        allowed = _and(allowed, q_allowed[:, None, :, None])
    return allowed, bias


def block_torch_fast_path(module, args, kwargs=None):
    """A forward pre-hook that does nothing; its presence is what matters.

    ``torch.nn.TransformerEncoderLayer`` (eval mode, no grad) would otherwise run its fused
    ``torch._transformer_encoder_layer_fwd`` on the projection weights, i.e. torch's SoftMax
    attention whatever the normalization; it skips that path when a module of the layer has
    forward hooks.
    """
    return None


def upgrade_state_dict(state_dict, prefix: str, packed: bool) -> None:
    """Rename, in place, sinkflow's former ``q_proj``/``k_proj``/``v_proj`` Linear entries to torch's layout."""
    if prefix + "q_proj.weight" not in state_dict:
        return
    weights = [state_dict.pop(f"{prefix}{p}_proj.weight") for p in "qkv"]
    if packed:
        state_dict[prefix + "in_proj_weight"] = torch.cat(weights)
    else:
        state_dict.update({f"{prefix}{p}_proj_weight": w for p, w in zip("qkv", weights, strict=True)})
    if prefix + "q_proj.bias" in state_dict:
        state_dict[prefix + "in_proj_bias"] = torch.cat([state_dict.pop(f"{prefix}{p}_proj.bias") for p in "qkv"])
