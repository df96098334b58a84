"""sinkflow.nn.MultiheadAttention where torch's own module is used: NaN inputs, TorchScript,
the ``dropout`` attribute, ``merge_masks``, and what autograd saves for backward.
"""

from __future__ import annotations

import pytest
import torch

from sinkflow.nn import AttentionKernel, MultiheadAttention, attention_weights, scaled_attention


def _with_nan(x, index):
    bad = x.clone()
    bad[index] = float("nan")
    return bad


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "eager"])
@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn", "gaussian", "nystromformer"])
def test_a_nan_input_is_refused_naming_the_argument_on_both_paths(normalization, need_weights):
    mha = MultiheadAttention(8, 2, batch_first=True, normalization=normalization, landmarks=2)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))
    bad = _with_nan(x, (1, 3, 4))
    cases = (((bad, x, x), "query"), ((x, bad, x), "key"), ((x, x, bad), "value"), ((bad, bad, bad), "query"))
    for args, name in cases:
        with pytest.raises(ValueError, match=f"^{name} has 1 non-finite entries"):
            mha(*args, need_weights=need_weights)


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn", "gaussian"])
def test_scaled_attention_refuses_a_non_finite_head_input_on_both_paths(normalization):
    q, k, v = torch.randn(3, 1, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    for need_weights in (False, True):
        for position, name in enumerate("qkv"):
            args = [q, k, v]
            args[position] = _with_nan(args[position], (0, 1, 2, 3))
            with pytest.raises(ValueError, match=f"^{name} has 1 non-finite"):
                scaled_attention(*args, normalization, need_weights=need_weights)
    with pytest.raises(ValueError, match="^k has 1 non-finite"):
        attention_weights(q, _with_nan(k, (0, 1, 2, 3)), normalization)
    inf = _with_nan(q, (0, 0, 0, 0)).nan_to_num(nan=float("inf"))
    with pytest.raises(ValueError, match="^q has 1 non-finite"):
        AttentionKernel(normalization)(inf, k, v, need_weights=False)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_torchscript_is_refused_with_the_reason_also_inside_a_model():
    mha = MultiheadAttention(8, 2, batch_first=True, normalization="sinkhorn")
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    layer.self_attn = mha
    for model in (mha, layer, torch.nn.Sequential(layer)):
        with pytest.raises(TypeError, match="cannot be compiled by torch.jit.script: its normalizations are Python"):
            torch.jit.script(model)
    torch.jit.script(torch.nn.MultiheadAttention(8, 2))  # torch's own module still scripts (the hook is ours)


def test_dropout_can_be_set_as_on_torchs_module():
    mha, ref = MultiheadAttention(8, 2, dropout=0.5), torch.nn.MultiheadAttention(8, 2, dropout=0.5)
    for module in (mha, ref):
        module.dropout = 0.0
        assert module.dropout == 0.0
    assert mha.kernel.dropout == 0.0
    x = torch.randn(4, 2, 8, generator=torch.Generator().manual_seed(0))
    mha.train()
    torch.testing.assert_close(mha(x, x, x)[0], mha.eval()(x, x, x)[0])  # no dropout left in training mode
    mha.dropout = 0.25
    assert mha.kernel.dropout == 0.25 and "dropout=0.25" in repr(mha.kernel)
    with pytest.raises(ValueError, match="dropout must be in \\[0, 1\\)"):
        mha.dropout = 1.0
    with pytest.raises(TypeError, match="dropout must be a number"):
        mha.dropout = "0.1"


def _masks(b, heads, n, kind, gen):
    """attn_mask (n, n), attn_mask (b * heads, n, n), key_padding_mask (b, n): boolean or float."""
    draws = (torch.randn(shape, generator=gen) for shape in ((n, n), (b * heads, n, n), (b, n)))
    return tuple(d > 0.5 if kind == "bool" else d for d in draws)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_merge_masks_is_torchs(kind):
    b, heads, n = 3, 2, 5
    ours, ref = MultiheadAttention(8, heads, batch_first=True), torch.nn.MultiheadAttention(8, heads, batch_first=True)
    query = torch.randn(b, n, 8)
    attn_2d, attn_3d, kpm = _masks(b, heads, n, kind, torch.Generator().manual_seed(0))
    for attn_mask in (None, attn_2d, attn_3d):
        for key_padding_mask in (None, kpm):
            got = ours.merge_masks(attn_mask, key_padding_mask, query)
            want = ref.merge_masks(attn_mask, key_padding_mask, query)
            assert got[1] == want[1]
            if want[0] is None:
                assert got[0] is None
            else:
                assert got[0].dtype == want[0].dtype
                torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


def _saved(module, query, key, value):
    """Bytes autograd saves for backward: per saved tensor (as counted by the issue) and per storage."""
    tensors, storages = [0], {}

    def pack(t):
        tensors[0] += t.numel() * t.element_size()
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(query, key, value, need_weights=False)
    return tensors[0], sum(storages.values())


@pytest.mark.parametrize("attention", ["self", "key_is_value"])
def test_a_softmax_training_step_saves_no_more_than_torchs_module(attention):
    """A training step with an input that requires grad, need_weights=False (the issue's case at
    n = 64 instead of 1,024): bytes counted per saved tensor and per storage, against torch's."""
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    ours = MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(4, 64, 16, requires_grad=True)
    memory = x if attention == "self" else torch.randn(4, 48, 16, requires_grad=True)
    query = x
    ours_tensors, ours_storage = _saved(ours, query, memory, memory)
    ref_tensors, ref_storage = _saved(ref, query, memory, memory)
    assert ours_tensors <= ref_tensors
    assert ours_storage <= ref_storage
