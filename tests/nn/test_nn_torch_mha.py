"""sinkflow.nn.MultiheadAttention as a drop-in for torch.nn.MultiheadAttention.

Cases modelled on torch's own MultiheadAttention tests (random sizes with kdim/vdim,
add_bias_kv, add_zero_attn, key padding and attention masks against a NumPy reference;
3-D masks against per-sample 2-D masks; bias=False; invalid shapes; two masks at once),
plus state dicts both ways, seeds, unbatched inputs, float masks and torch's
TransformerEncoderLayer. With normalization="softmax" outputs and weights equal torch's to
float32 rounding: rtol=1e-5, atol=1e-6 (most cases agree bit for bit; torch's SDPA path for
need_weights=False differs by ~1e-7).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sinkflow.nn import MultiheadAttention, scaled_attention

F32 = {"rtol": 1e-5, "atol": 1e-6}


def _pair(*args, seed=0, **kwargs):
    """torch's module and ours with torch's weights (eval mode: no dropout)."""
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(*args, **kwargs).eval()
    ours = MultiheadAttention(*args, **kwargs).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _assert_same(ref_result, our_result):
    (a, wa), (b, wb) = ref_result, our_result
    torch.testing.assert_close(b, a, **F32)
    assert (wa is None) == (wb is None)
    if wa is not None:
        torch.testing.assert_close(wb, wa, **F32)


# ----------------------------------------------------------------------------------------
# parameters


@pytest.mark.parametrize("kwargs", [{}, {"kdim": 6, "vdim": 10}, {"add_bias_kv": True}, {"bias": False},
                                    {"add_zero_attn": True, "dropout": 0.1}])
def test_a_seed_gives_torchs_parameters_and_state_dicts_move_both_ways(kwargs):
    torch.manual_seed(3)
    ref = torch.nn.MultiheadAttention(16, 4, **kwargs)
    torch.manual_seed(3)
    ours = MultiheadAttention(16, 4, **kwargs)
    a, b = ref.state_dict(), ours.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)  # same draws, same order
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in ours.named_parameters()]
    other = MultiheadAttention(16, 4, **kwargs)
    other.load_state_dict(ref.state_dict())
    fresh = torch.nn.MultiheadAttention(16, 4, **kwargs)
    fresh.load_state_dict(other.state_dict())
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in a.items())
    assert ours._qkv_same_embed_dim == ref._qkv_same_embed_dim and ours.dropout == ref.dropout


def test_bias_false_removes_both_projection_biases():
    mha = MultiheadAttention(8, 4, bias=False)
    assert mha.in_proj_bias is None and mha.out_proj.bias is None
    assert mha(torch.rand(2, 2, 8), torch.rand(2, 2, 8), torch.rand(2, 2, 8))[0].shape == (2, 2, 8)


def test_separate_projection_weights_when_key_and_value_widths_differ():
    mha = MultiheadAttention(4, 4, kdim=2, vdim=3, dtype=torch.float64)
    assert mha.in_proj_weight is None and mha.q_proj_weight.shape == (4, 4)
    assert mha.k_proj_weight.shape == (4, 2) and mha.v_proj_weight.shape == (4, 3)
    q, k, v = (torch.rand(4, 5, 4, dtype=torch.float64), torch.rand(6, 5, 2, dtype=torch.float64),
               torch.rand(6, 5, 3, dtype=torch.float64))
    assert mha(q, k, v)[0].shape == (4, 5, 4)


def test_sinkflows_former_parameter_layout_still_loads():
    torch.manual_seed(0)
    mha = MultiheadAttention(8, 2, batch_first=True, normalization="sinkhorn")
    w, b = mha.in_proj_weight.detach().chunk(3), mha.in_proj_bias.detach().chunk(3)
    old = {f"{p}_proj.{t}": (w if t == "weight" else b)[i] for i, p in enumerate("qkv") for t in ("weight", "bias")}
    old.update({f"out_proj.{k}": v for k, v in mha.out_proj.state_dict().items()})
    other = MultiheadAttention(8, 2, batch_first=True, normalization="sinkhorn")
    other.load_state_dict(old)  # strict: every old key is renamed, none left over
    x = torch.randn(2, 5, 8)
    assert torch.equal(other(x, x, x)[0], mha(x, x, x)[0])


# ----------------------------------------------------------------------------------------
# forward: torch's results (modelled on torch's test_multihead_attention)


def _numpy_mha(mha, query, key, value, key_padding_mask, attn_mask, average):
    """Float64 NumPy multi-head attention, sequence-first inputs (the oracle of torch's own test)."""
    f = lambda t: t.detach().double().numpy()  # noqa: E731
    e, h = mha.embed_dim, mha.num_heads
    p = e // h
    if mha.in_proj_weight is not None:
        w_q, w_k, w_v = np.split(f(mha.in_proj_weight), 3)
    else:
        w_q, w_k, w_v = f(mha.q_proj_weight), f(mha.k_proj_weight), f(mha.v_proj_weight)
    b_q, b_k, b_v = np.split(f(mha.in_proj_bias), 3)
    q, k, v = (np.swapaxes(f(x), 0, 1) @ w.T + bias
               for x, w, bias in ((query, w_q, b_q), (key, w_k, b_k), (value, w_v, b_v)))
    batch, m = k.shape[0], k.shape[1]
    blocked = np.zeros((batch, 1, q.shape[1], m), dtype=bool)
    if key_padding_mask is not None:
        blocked |= key_padding_mask.numpy()[:, None, None, :]
    if attn_mask is not None:
        blocked |= np.isneginf(attn_mask.numpy())
    extra = []
    if mha.bias_k is not None:
        extra.append((f(mha.bias_k)[0], f(mha.bias_v)[0]))
    if mha.add_zero_attn:
        extra.append((np.zeros((1, e)), np.zeros((1, e))))
    for bk, bv in extra:
        k = np.concatenate([k, np.repeat(bk[None], batch, 0)], 1)
        v = np.concatenate([v, np.repeat(bv[None], batch, 0)], 1)
        blocked = np.concatenate([blocked, np.zeros(blocked.shape[:-1] + (1,), dtype=bool)], -1)
    heads = lambda t: t.reshape(batch, t.shape[1], h, p).transpose(0, 2, 1, 3)  # noqa: E731
    C = np.where(blocked, -np.inf, heads(q) @ heads(k).transpose(0, 1, 3, 2) / math.sqrt(p))
    K = np.exp(C - C.max(-1, keepdims=True))
    K /= K.sum(-1, keepdims=True)
    out = (K @ heads(v)).transpose(0, 2, 1, 3).reshape(batch, -1, e) @ f(mha.out_proj.weight).T + f(mha.out_proj.bias)
    return np.swapaxes(out, 0, 1), K.mean(1) if average else K


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("options", [{}, {"add_bias_kv": True}, {"add_zero_attn": True}, {"key_padding": True},
                                     {"key_padding": True, "add_bias_kv": True, "add_zero_attn": True},
                                     {"key_padding": True, "add_zero_attn": True, "same_embed_dim": True}])
def test_random_sizes_match_torch_and_a_numpy_reference(options, average):
    rng = np.random.default_rng(10 * len(options) + int(average))
    for trial in range(8):
        batch, seq = rng.integers(2, 8, size=2)
        heads = 2 * int(rng.integers(1, 3))
        embed = heads * int(rng.integers(3, 7))
        kv = embed if options.get("same_embed_dim") else int(rng.integers(5, 12))
        ref, ours = _pair(embed, heads, add_bias_kv=options.get("add_bias_kv", False),
                          add_zero_attn=options.get("add_zero_attn", False), kdim=kv, vdim=kv, seed=trial)
        query = torch.rand(1, batch, embed)  # one target position, as torch's test (decoder state)
        source = torch.rand(seq, batch, kv)
        kpm = pad = None
        if options.get("key_padding"):
            pad = torch.from_numpy(rng.integers(0, 2, (1, seq)) == 1).expand(batch, seq).clone()
            pad[:, 0] = False  # keep one key: torch gives NaN for a query without keys
            kpm = torch.zeros(batch, seq).masked_fill(pad, -math.inf)  # float, as the attention mask
        attn_mask = torch.zeros(1, seq).masked_fill(torch.from_numpy(rng.integers(0, 2, (1, seq)) == 0), -math.inf)
        attn_mask[0, 0] = 0.0
        args = (query, source, source)
        kw = {"key_padding_mask": kpm, "attn_mask": attn_mask, "average_attn_weights": average}
        _assert_same(ref(*args, **kw), ours(*args, **kw))
        out, w = ours(*args, **kw)
        ref_out, ref_w = _numpy_mha(ours, *args, pad, attn_mask, average)
        np.testing.assert_allclose(out.detach().numpy(), ref_out, rtol=1e-5, atol=1e-5)  # float32 vs float64
        np.testing.assert_allclose(w.detach().numpy(), ref_w, rtol=1e-5, atol=1e-5)


def test_a_3d_attention_mask_equals_each_sample_with_its_2d_mask():
    torch.manual_seed(0)
    mha = MultiheadAttention(8, 4, normalization="sinkhorn", n_iter=3)
    query, key = torch.rand(8, 2, 8), torch.rand(8, 3, 8)  # (batch, n, e)
    allowed = torch.randint(0, 2, (8, 2, 3)).bool()
    allowed[..., 0] = True
    mask = torch.zeros(8, 2, 3).masked_fill(~allowed, -math.inf)
    out_3d = mha(query.transpose(0, 1), key.transpose(0, 1), key.transpose(0, 1),
                 attn_mask=mask.repeat_interleave(4, dim=0))[0].transpose(0, 1)
    for i in range(8):
        out_2d = mha(query[i][:, None], key[i][:, None], key[i][:, None], attn_mask=mask[i])[0]
        torch.testing.assert_close(out_3d[i], out_2d[:, 0], rtol=0, atol=1e-6)  # float32 rounding


MASKS = ["none", "kpm_bool", "kpm_float", "kpm_-1e9", "kpm_finfo_min", "attn_2d_bool", "attn_2d_float",
         "attn_3d_bool", "attn_3d_float", "both"]


def _masks(kind, batch, heads, n, m, gen):
    pad = torch.zeros(batch, m, dtype=torch.bool)
    pad[min(1, batch - 1), -2:] = True
    blocked = torch.rand(n, m, generator=gen) > 0.6
    blocked[:, 0] = False
    blocked3 = torch.rand(batch * heads, n, m, generator=gen) > 0.6
    blocked3[..., 0] = False
    masks = {
        "kpm_bool": {"key_padding_mask": pad},
        "kpm_float": {"key_padding_mask": torch.randn(batch, m, generator=gen).masked_fill(pad, -math.inf)},
        "kpm_-1e9": {"key_padding_mask": torch.zeros(batch, m).masked_fill(pad, -1e9)},
        "kpm_finfo_min": {"key_padding_mask": torch.zeros(batch, m).masked_fill(pad, torch.finfo(torch.float32).min)},
        "attn_2d_bool": {"attn_mask": blocked},
        "attn_2d_float": {"attn_mask": torch.randn(n, m, generator=gen)},
        "attn_3d_bool": {"attn_mask": blocked3},
        "attn_3d_float": {"attn_mask": torch.randn(batch * heads, n, m,
                                                   generator=gen).masked_fill(blocked3, -math.inf)},
        "both": {"key_padding_mask": torch.randn(batch, m, generator=gen).masked_fill(pad, -math.inf),
                 "attn_mask": torch.randn(n, m, generator=gen).masked_fill(blocked, -math.inf)},
    }
    return masks.get(kind, {})


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kind", MASKS)
def test_masks_and_layouts_match_torch(kind, batch_first):
    gen = torch.Generator().manual_seed(1)
    batch, n, m, e = 3, 5, 6, 16
    ref, ours = _pair(e, 4, batch_first=batch_first, seed=2)
    shape = (lambda s: (batch, s, e)) if batch_first else (lambda s: (s, batch, e))
    q, kv = torch.randn(*shape(n), generator=gen), torch.randn(*shape(m), generator=gen)
    masks = _masks(kind, batch, 4, n, m, gen)
    for extra in ({}, {"average_attn_weights": False}, {"need_weights": False}):
        _assert_same(ref(q, kv, kv, **masks, **extra), ours(q, kv, kv, **masks, **extra))
    x = torch.randn(*shape(m), generator=gen)  # self-attention: one tensor three times
    masks = _masks(kind, batch, 4, m, m, gen)
    _assert_same(ref(x, x, x, **masks), ours(x, x, x, **masks))


@pytest.mark.parametrize("kind", ["none", "kpm_bool", "kpm_-1e9", "attn_2d_float", "attn_3d_bool"])
def test_unbatched_inputs_and_masks_match_torch(kind):
    gen = torch.Generator().manual_seed(4)
    ref, ours = _pair(16, 4, add_bias_kv=True, seed=5)
    masks = {k: v[0] if k == "key_padding_mask" else v[:4] if v.dim() == 3 else v
             for k, v in _masks(kind, 1, 4, 5, 6, gen).items()}  # (m,) and (heads, n, m) unbatched
    q, kv = torch.randn(5, 16, generator=gen), torch.randn(6, 16, generator=gen)
    for average in (True, False):
        (a, wa), (b, wb) = (ref(q, kv, kv, **masks, average_attn_weights=average),
                            ours(q, kv, kv, **masks, average_attn_weights=average))
        assert b.shape == (5, 16) and wb.shape == ((5, 7) if average else (4, 5, 7))
        _assert_same((a, wa), (b, wb))


def test_float64_and_two_boolean_masks_in_self_attention_match_torch():
    torch.manual_seed(0)
    ref, ours = _pair(14, 7, batch_first=True, dtype=torch.float64)
    x = torch.rand(8, 5, 14, dtype=torch.float64)
    attn_mask, kpm = torch.randint(0, 2, (5, 5)).bool(), torch.randint(0, 2, (8, 5)).bool()
    (a, wa), (b, wb) = (ref(x, x, x, attn_mask=attn_mask, key_padding_mask=kpm),
                        ours(x, x, x, attn_mask=attn_mask, key_padding_mask=kpm))
    empty = (attn_mask[None] | kpm[:, None, :]).all(-1)  # queries without keys: NaN in torch, zero rows here
    assert (torch.isnan(a[empty]).all() and (wb[empty] == 0).all()
            and torch.equal(b[empty], ours.out_proj.bias.expand_as(b[empty])))
    torch.testing.assert_close(b[~empty], a[~empty], rtol=1e-12, atol=1e-13)  # float64 rounding
    torch.testing.assert_close(wb[~empty], wa[~empty], rtol=1e-12, atol=1e-13)


def test_invalid_shapes_are_refused_with_the_expected_shape():
    mha = MultiheadAttention(4, 4)
    x = torch.randn(4, 4, 4)
    with pytest.raises(ValueError, match="all 3-D .batched. or all 2-D"):
        mha(x, torch.randn(4, 4), x)
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(batch, seq\) = \(4, 4\)"):
        mha(x, x, x, key_padding_mask=torch.tensor([False, False, True, True]))
    with pytest.raises(ValueError, match="attn_mask must have shape"):
        mha(x, x, x, attn_mask=torch.tensor([False, False, True, True]))
    u = torch.randn(4, 4)
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(seq\) = \(4,\)"):
        mha(u, u, u, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(heads, n, m\) = \(4, 4, 4\)"):
        mha(u, u, u, attn_mask=torch.zeros(5, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="key must have 4 features"):
        mha(x, torch.randn(4, 4, 3), torch.randn(4, 4, 3))
    with pytest.raises(TypeError, match="boolean .True = masked out. or floating"):
        mha(x, x, x, key_padding_mask=torch.zeros(4, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="NestedTensor"):
        nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged)
        mha(nt, nt, nt)


# ----------------------------------------------------------------------------------------
# float masks for every normalization


@pytest.mark.parametrize("normalization,n_iter", [("softmax", 1), ("sinkhorn", 1), ("sinkhorn", 2), ("sinkhorn", 5),
                                                  ("gaussian", 1), ("skyformer", 1)])
@pytest.mark.parametrize("value", [-math.inf, -1e9, torch.finfo(torch.float32).min])
def test_a_float_key_padding_mask_masks_like_the_boolean_mask(normalization, n_iter, value):
    torch.manual_seed(0)
    mha = MultiheadAttention(8, 2, batch_first=True, normalization=normalization, n_iter=n_iter, landmarks=8)
    x = torch.randn(2, 6, 8)
    pad = torch.tensor([[False] * 6, [False] * 3 + [True] * 3])
    torch.manual_seed(1)  # Skyformer's landmarks
    a, wa = mha(x, x, x, key_padding_mask=pad)
    torch.manual_seed(1)
    b, wb = mha(x, x, x, key_padding_mask=torch.zeros(2, 6).masked_fill(pad, value))
    torch.testing.assert_close(b, a, rtol=0, atol=1e-7)  # the same computation (SoftMax: -1e9 added, exp = 0)
    if wa is not None:
        torch.testing.assert_close(wb, wa, rtol=0, atol=1e-7)
        assert (wb[1, :, 3:] == 0).all() and torch.isfinite(wb).all()


def _sinkhorn_loop(C, n_iter):
    """Plain float64 Sinkhorn half-steps on exp(C): rows to 1, columns to n / m (the oracle)."""
    K = torch.exp(C - C.amax((-1, -2), keepdim=True))
    for t in range(n_iter):
        K = K / K.sum(-1, keepdim=True) if t % 2 == 0 else K / K.sum(-2, keepdim=True) * (C.shape[-2] / C.shape[-1])
    return K


@pytest.mark.parametrize("n_iter", [2, 3, 6])
def test_a_float_attention_mask_is_added_to_the_sinkhorn_log_kernel(n_iter):
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 5, 4, generator=gen, dtype=torch.float64)
    bias = 2 * torch.randn(5, 5, generator=gen, dtype=torch.float64)
    out, K = scaled_attention(q, k, v, "sinkhorn", n_iter=n_iter, bias=bias)
    ref = _sinkhorn_loop(q @ k.transpose(-1, -2) / 2 + bias, n_iter)
    torch.testing.assert_close(K, ref, rtol=1e-12, atol=1e-14)  # float64 rounding
    torch.testing.assert_close(out, ref @ v, rtol=1e-12, atol=1e-14)
    fused, none = scaled_attention(q, k, v, "sinkhorn", n_iter=n_iter, bias=bias, need_weights=False)
    assert none is None
    torch.testing.assert_close(fused, out, rtol=1e-12, atol=1e-14)


def test_a_finite_column_bias_gives_a_key_back_its_column_mass_and_an_underflowing_one_masks_it():
    # Sinkhorn's column step gives every column the mass n / m whatever a finite bias along it,
    # and its limit does not see such a bias at all; only an underflowing bias (-1e9) masks a key.
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 6, 4, generator=gen, dtype=torch.float64)
    column = torch.tensor([0.0, 0, 0, -30.0, -30.0, -30.0], dtype=torch.float64)
    _, K = scaled_attention(q, k, v, "sinkhorn", n_iter=2, bias=column)
    torch.testing.assert_close(K.sum(-2), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-12)
    limit = [scaled_attention(q, k, v, "sinkhorn", n_iter=400, bias=b)[1] for b in (None, column)]
    torch.testing.assert_close(limit[1], limit[0], rtol=0, atol=1e-8)  # converged to ~1e-10
    masked, K = scaled_attention(q, k, v, "sinkhorn", n_iter=2, bias=column * 1e8)
    ref, K_ref = scaled_attention(q, k, v, "sinkhorn", n_iter=2, mask=torch.tensor([True] * 3 + [False] * 3))
    assert torch.equal(masked, ref) and torch.equal(K, K_ref) and (K[:, 3:] == 0).all()
    torch.testing.assert_close(K.sum(-2)[:3], torch.full((3,), 2.0, dtype=torch.float64), rtol=0, atol=1e-12)  # n / m'


def test_output_only_normalizations_refuse_a_finite_float_bias():
    mha = MultiheadAttention(8, 2, batch_first=True, normalization="skyformer", landmarks=4)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="without a score matrix"):
        mha(x, x, x, key_padding_mask=torch.randn(2, 5))
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        scaled_attention(x, x, x, "softmax", bias=torch.full((5, 5), math.nan))


def test_is_causal_alone_builds_the_causal_mask():
    ref, ours = _pair(8, 2, batch_first=True)
    x = torch.randn(2, 4, 8)
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    _assert_same(ref(x, x, x, attn_mask=causal, is_causal=True), ours(x, x, x, is_causal=True))


# ----------------------------------------------------------------------------------------
# inside torch's TransformerEncoderLayer


@pytest.mark.parametrize("norm_first", [False, True])
def test_torchs_encoder_layer_fast_path_does_not_replace_the_normalization(norm_first):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True,
                                             norm_first=norm_first)
    sinkhorn = MultiheadAttention(16, 4, batch_first=True, normalization="sinkhorn", n_iter=4)
    sinkhorn.load_state_dict(layer.self_attn.state_dict())
    x = torch.randn(2, 7, 16)
    pad = torch.tensor([[False] * 7, [False] * 5 + [True] * 2])
    layer.eval()
    with torch.no_grad():  # torch's own layer, its fused path
        softmax_out = layer(x, src_key_padding_mask=pad)
    layer.self_attn = sinkhorn
    layer.train()  # eager: _sa_block calls our module
    eager = layer(x, src_key_padding_mask=pad).detach()
    layer.eval()
    with torch.no_grad():
        fast = layer(x, src_key_padding_mask=pad)
    torch.testing.assert_close(fast, eager, rtol=0, atol=1e-6)  # float32 rounding
    assert (fast - softmax_out).abs().max() > 1e-2


def _encoder(normalization, nested):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested)
    for block in encoder.layers:
        block.self_attn = MultiheadAttention(16, 4, batch_first=True, normalization=normalization, n_iter=3)
    return encoder.eval()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn", "gaussian"])
def test_torchs_encoder_with_nested_tensors_gives_each_sequence_its_result_alone(normalization):
    """torch's defaults (enable_nested_tensor=True), eval, no_grad, a padding mask: the layers get
    NestedTensors. Oracle: each sequence through the encoder alone, unpadded; for SoftMax also
    torch's padded path (without nested tensors). Padded positions come back 0, as from torch."""
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1))
    lengths = [7, 4, 2]
    pad = torch.arange(7)[None] >= torch.tensor(lengths)[:, None]
    encoder = _encoder(normalization, nested=True)
    with torch.no_grad():
        out = encoder(x, src_key_padding_mask=pad)
        for i, n in enumerate(lengths):
            torch.testing.assert_close(out[i, :n], encoder(x[i:i + 1, :n])[0], rtol=1e-5, atol=1e-6)
        assert not out[pad].any()
        if normalization == "softmax":
            padded = _encoder(normalization, nested=False)(x, src_key_padding_mask=pad)
            torch.testing.assert_close(out[~pad], padded[~pad], rtol=1e-5, atol=1e-6)


def test_nested_inputs_that_cannot_be_read_are_refused():
    mha = MultiheadAttention(8, 2, batch_first=True)
    nested = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(2, 8)])
    with pytest.raises(ValueError, match="all NestedTensors"):
        mha(nested, torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="carry their own padding"):
        mha(nested, nested, nested, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="batch_first=True"):
        MultiheadAttention(8, 2)(nested, nested, nested)


def test_a_learned_float_mask_gets_torchs_gradient_and_sinkhorns_passes_gradcheck():
    ref, ours = _pair(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    grads = []
    for module in (ref, ours):
        bias = torch.randn(2 * 2, 5, 5, generator=torch.Generator().manual_seed(0)).requires_grad_()
        out, w = module(x, x, x, attn_mask=bias)
        (out.square().sum() + w.square().sum()).backward()
        grads.append(bias.grad)
    torch.testing.assert_close(grads[1], grads[0], **F32)
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 4, 3, generator=gen, dtype=torch.float64)
    bias = torch.randn(4, 4, generator=gen, dtype=torch.float64).requires_grad_()
    for need in (True, False):  # the matrix path and the factored output path
        assert torch.autograd.gradcheck(lambda b, need=need: scaled_attention(q, k, v, "sinkhorn", n_iter=4, bias=b,
                                                                              need_weights=need)[0], (bias,))


def test_half_precision_float_masks_under_autocast():
    torch.manual_seed(0)
    mha = MultiheadAttention(16, 2, batch_first=True, normalization="sinkhorn", n_iter=3)
    x = torch.randn(2, 6, 16)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        float_pad = torch.zeros(2, 6, dtype=torch.float16).masked_fill(pad, torch.finfo(torch.float16).min)
        _, w = mha(x, x, x, key_padding_mask=float_pad)
        _, w_bool = mha(x, x, x, key_padding_mask=pad)
    assert w.dtype == torch.float32 and torch.equal(w, w_bool) and (w[1, :, 4:] == 0).all()


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn", "gaussian", "skyformer", "nystromformer"])
@pytest.mark.parametrize("lengths", [(0, 0), (3, 0)])
@pytest.mark.parametrize("need_weights", [True, False])
def test_an_empty_sequence_gives_torchs_empty_result(normalization, lengths, need_weights):
    # No queries, or queries without keys: torch returns an empty output (zeros for queries
    # without keys) and empty weights; Sinkhorn divided by the zero key count before.
    n, m = lengths
    ref, _ = _pair(16, 4, batch_first=True)
    torch.manual_seed(0)
    ours = MultiheadAttention(16, 4, batch_first=True, normalization=normalization).eval()
    ours.load_state_dict(ref.state_dict())
    query, key = torch.randn(2, n, 16, requires_grad=True), torch.randn(2, m, 16)
    want_out, want_w = ref(query, key, key, need_weights=need_weights)
    out, w = ours(query, key, key, need_weights=need_weights)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    if w is not None:
        assert need_weights and w.shape == want_w.shape
    out.sum().backward()
    assert query.grad.shape == query.shape and not query.grad.any()


def test_n_iter_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="n_iter must be an integer"):
        MultiheadAttention(16, 4, n_iter="3")
    with pytest.raises(ValueError, match="n_iter"):
        MultiheadAttention(16, 4, n_iter=0)
