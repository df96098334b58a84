"""torch's own test suites with sinkflow.nn.MultiheadAttention inside torch's layers.

Written for this project after torch's ``test/nn/test_multihead_attention.py`` (CPU cases),
``test/test_transformers.py::TestTransformers`` (CPU cases) and the module samples of
``torch.testing._internal.common_modules.module_db`` for ``MultiheadAttention``,
``TransformerEncoderLayer``, ``TransformerDecoderLayer`` and ``Transformer`` (their
constructor and forward arguments are regenerated here: torch's internal testing package
needs ``expecttest`` and is not a stable API).

Oracle: the same model with torch's own attention and the same weights. Every torch
``MultiheadAttention`` of a model is swapped for sinkflow's (``normalization="softmax"``,
weights loaded), and outputs and gradients (inputs and every parameter) must equal torch's
in float64 (rtol 1e-7, atol 1e-9), in training and eval mode, with and without autograd
(torch's eval-mode fast paths run then for torch's model). Sinkhorn attention has no torch
counterpart: there the samples check torch's laws that do not depend on the normalization
(an unbatched input is the batch of one; eval under no_grad equals the autograd path).
"""

from __future__ import annotations

import copy
import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F

from sinkflow.nn import MultiheadAttention

F64 = {"rtol": 1e-7, "atol": 1e-9}
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning",
                                        "ignore:enable_nested_tensor is True:UserWarning")


def _swapped(torch_mha, normalization, n_iter):
    ours = MultiheadAttention(torch_mha.embed_dim, torch_mha.num_heads, torch_mha.dropout,
                              torch_mha.in_proj_bias is not None, torch_mha.bias_k is not None, torch_mha.add_zero_attn,
                              torch_mha.kdim, torch_mha.vdim, torch_mha.batch_first,
                              dtype=torch_mha.out_proj.weight.dtype, normalization=normalization, n_iter=n_iter)
    ours.load_state_dict(torch_mha.state_dict())
    return ours.train(torch_mha.training)


def with_sinkflow(model, normalization="softmax", n_iter=3):
    """A copy of ``model`` whose torch MultiheadAttention modules (itself included) are sinkflow's, same weights."""
    if type(model) is torch.nn.MultiheadAttention:
        return _swapped(model, normalization, n_iter)
    model = copy.deepcopy(model)
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.MultiheadAttention:
                setattr(parent, name, _swapped(child, normalization, n_iter))
                swapped += 1
    assert swapped, f"no torch MultiheadAttention in {type(model).__name__}"
    return model


# ----------------------------------------------------------------------------------------
# module samples (module_db)

_KPM = torch.tensor([False, False, True])
_ATTN = torch.tensor([False, False, True]).expand(3, 3)


def _mha_samples():
    for bias, bias_kv, zero_attn, kpm, attn, batch_first in itertools.product(
            (True, False), (True, False), (True, False), (None, _KPM), (None, _KPM.expand(3, 3, 3)), (True, False)):
        ctor = {"embed_dim": 3, "num_heads": 3, "batch_first": batch_first, "bias": bias, "add_bias_kv": bias_kv,
                "add_zero_attn": zero_attn}
        yield torch.nn.MultiheadAttention, ctor, [(3, 3)] * 3, {"key_padding_mask": kpm, "attn_mask": attn}


def _layer_samples():
    enc, dec = torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer
    for cls, n_inputs in ((enc, 1), (dec, 2)):
        for extra in ({}, {"activation": F.gelu}, {"bias": False}):
            dim_ff = 16 if not extra else 8
            ctor = {"d_model": 4, "nhead": 2, "dim_feedforward": dim_ff, "dropout": 0.0, **extra}
            yield cls, ctor, [(2, 3, 4)] * n_inputs, {}
    for cls in (enc, dec, torch.nn.Transformer):
        for attn, kpm, norm_first, batch_first, bias in itertools.product(
                (None, _ATTN), (None, _KPM), (True, False), (True, False), (True, False)):
            ctor = {"d_model": 4, "nhead": 2, "dim_feedforward": 8, "dropout": 0.0, "batch_first": batch_first,
                    "norm_first": norm_first, "bias": bias}
            if cls is torch.nn.Transformer:
                ctor.update(num_encoder_layers=1, num_decoder_layers=1)
            names = {enc: ("src_mask", "src_key_padding_mask"), dec: ("tgt_mask", "tgt_key_padding_mask"),
                     torch.nn.Transformer: ("src_mask", "src_key_padding_mask")}[cls]
            kwargs = {names[0]: attn, names[1]: kpm}
            if cls is dec:
                kwargs.update(memory_mask=attn, memory_key_padding_mask=kpm)
            if cls is torch.nn.Transformer:
                kwargs.update(tgt_mask=attn, tgt_key_padding_mask=kpm)
            n_inputs = 1 if cls is enc else 2
            yield cls, ctor, [(3, 4)] * n_inputs, kwargs  # unbatched
            if cls is not enc:  # batched, the padding masks expanded to the batch
                batched = {k: v.expand(2, 3) if v is not None and "padding" in k else v for k, v in kwargs.items()}
                shape = (2, 3, 4) if batch_first else (3, 2, 4)
                yield cls, ctor, [shape] * n_inputs, batched


SAMPLES = list(_mha_samples()) + list(_layer_samples())


def _sample_id(sample):
    cls, ctor, shapes, kwargs = sample
    masks = "+".join(k for k, v in kwargs.items() if v is not None) or "nomask"
    flags = ",".join(f"{k}={v}" for k, v in ctor.items() if isinstance(v, bool))
    return f"{cls.__name__}[{flags}][{'x'.join(map(str, shapes[0]))}][{masks}]"


def _inputs(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]


def _run(model, shapes, kwargs, grad=True, seed=1):
    inputs = _inputs(shapes, seed)
    with torch.set_grad_enabled(grad):
        out = model(*inputs, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    if not grad:
        return out, []
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(out.sin().sum(), inputs + params, allow_unused=True)
    return out.detach(), grads


@pytest.mark.parametrize("sample", SAMPLES, ids=[_sample_id(s) for s in SAMPLES])
def test_module_samples_equal_torchs_with_softmax(sample):
    cls, ctor, shapes, kwargs = sample
    torch.manual_seed(0)
    ref = cls(**ctor, dtype=torch.float64)
    ours = with_sinkflow(ref)
    for training in (True, False):
        ref.train(training), ours.train(training)
        out, grads = _run(ours, shapes, kwargs)
        ref_out, ref_grads = _run(ref, shapes, kwargs)
        torch.testing.assert_close(out, ref_out, **F64, equal_nan=True)  # torch's fully masked rows: NaN both
        for g, r in zip(grads, ref_grads, strict=True):
            assert (g is None) == (r is None)
            if g is not None:
                torch.testing.assert_close(g, r, **F64, equal_nan=True)
    with torch.no_grad():  # eval and no grad: torch's fast paths, where its model has them
        torch.testing.assert_close(_run(ours, shapes, kwargs, grad=False)[0], _run(ref, shapes, kwargs, grad=False)[0],
                                   **F64, equal_nan=True)


def _as_batch_of_one(shapes, kwargs, batch_first):
    if len(shapes[0]) == 3:
        return None
    dim = 0 if batch_first else 1
    one = {k: v[None] if v is not None and "padding" in k else v for k, v in kwargs.items()}
    return dim, one


@pytest.mark.parametrize("sample", SAMPLES[::3], ids=[_sample_id(s) for s in SAMPLES[::3]])
def test_module_samples_keep_torchs_laws_with_sinkhorn(sample):
    """Every third sample (deterministic) with Sinkhorn(3): unbatched = batch of one, no_grad = autograd."""
    cls, ctor, shapes, kwargs = sample
    torch.manual_seed(0)
    model = with_sinkflow(cls(**ctor, dtype=torch.float64), "sinkhorn").eval()
    out, grads = _run(model, shapes, kwargs)
    assert all(g is None or torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(_run(model, shapes, kwargs, grad=False)[0], out, **F64)
    batch = _as_batch_of_one(shapes, kwargs, ctor.get("batch_first", False))
    if batch is not None:
        dim, one = batch
        inputs = [x.detach().unsqueeze(dim) for x in _inputs(shapes, 1)]
        batched = model(*inputs, **one)
        batched = batched[0] if isinstance(batched, tuple) else batched
        torch.testing.assert_close(batched.squeeze(dim).detach(), out, **F64)


# ----------------------------------------------------------------------------------------
# test_multihead_attention.py (CPU cases not already in tests/nn/test_nn_torch_mha.py)


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_invalid_shapes_are_refused_also_in_eval_mode_without_grad(normalization):
    mha = MultiheadAttention(4, 4, batch_first=True, normalization=normalization).eval()
    x, x2 = torch.randn(4, 4, 4), torch.randn(4, 4)
    cases = [((x, torch.randn(3, 3), x), {}, "all 3-D"), ((x, x, torch.randn(3, 3)), {}, "all 3-D"),
             ((x, x, x), {"key_padding_mask": torch.tensor([False, True, True])}, "key_padding_mask must have shape"),
             ((x, x, x), {"attn_mask": torch.tensor([False, True, True])}, "attn_mask must have shape"),
             ((x2, torch.randn(4, 4, 4), x2), {}, "all 3-D"),
             ((x2, x2, x2), {"key_padding_mask": torch.zeros(1, 8, dtype=torch.bool)}, "key_padding_mask must have"),
             ((x2, x2, x2), {"attn_mask": torch.zeros(5, 4, 4, dtype=torch.bool)}, r"\(heads, n, m\) = \(4, 4, 4\)")]
    with torch.no_grad():
        for args, kwargs, message in cases:
            with pytest.raises(ValueError, match=message):
                mha(*args, need_weights=False, **kwargs)


def _jagged(*lengths, width=10, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.nested.nested_tensor([torch.randn(n, width, generator=gen) for n in lengths], layout=torch.jagged)


@pytest.mark.parametrize("extra", [{}, {"add_bias_kv": True}, {"add_zero_attn": True},
                                   {"add_bias_kv": True, "add_zero_attn": True}])
def test_jagged_nested_inputs_outside_torchs_fast_path(extra):
    """torch takes jagged NestedTensors (query, key and value apart too) in any mode; each
    sequence's output is that sequence alone through the module."""
    torch.manual_seed(0)
    mha = MultiheadAttention(10, 5, batch_first=True, **extra).eval()
    q, k, v = _jagged(4, 6), _jagged(7, 16, seed=1), _jagged(7, 16, seed=2)
    for context in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        with context():
            for args in ((q, q, q), (q, k, v)):
                out = mha(*args)[0]
                assert out.is_nested and out.layout == torch.jagged
                for got, *single in zip(out.unbind(), *(a.unbind() for a in args), strict=True):
                    torch.testing.assert_close(got, mha(*(s[None] for s in single))[0][0], rtol=1e-5, atol=1e-6)
    for p in mha.parameters():
        p.requires_grad_(False)
    mha(q, q, q)
    with pytest.raises(ValueError, match="2-D or 3-D|1-D one"):
        empty = torch.nested.nested_tensor([])
        mha(empty, empty, empty)


def test_two_boolean_masks_without_grad_match_torchs_slow_path():
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(14, 7, batch_first=True).eval()
    ours = with_sinkflow(ref)
    x = torch.rand(8, 5, 14)
    attn_mask, kpm = torch.randint(0, 2, (5, 5)).bool(), torch.randint(0, 2, (8, 5)).bool()
    with torch.no_grad():
        got = ours(x, x, x, attn_mask=attn_mask, key_padding_mask=kpm)[0]
    want = ref.train()(x, x, x, attn_mask=attn_mask, key_padding_mask=kpm, need_weights=False)[0].detach()
    empty = (attn_mask[None] | kpm[:, None, :]).all(-1, keepdim=True)  # torch: NaN rows; sinkflow: zero rows
    torch.testing.assert_close(got.masked_fill(empty, 0.0), want.masked_fill(empty, 0.0), rtol=1e-5, atol=1e-6)
    assert not got.masked_fill(~empty, 0.0).any()  # sinkflow's empty rows are exactly 0


def test_projection_parameters_absent_or_of_another_dtype():
    x = torch.rand(2, 2, 2, dtype=torch.float64)
    with torch.no_grad():
        assert MultiheadAttention(2, 2, bias=False, dtype=torch.float64)(x, x, x)[0].shape == (2, 2, 2)
        separate = MultiheadAttention(4, 4, kdim=2, vdim=2, dtype=torch.float64)
        assert separate.in_proj_weight is None
        assert separate(torch.rand(4, 4, 4, dtype=torch.float64), torch.rand(4, 4, 2, dtype=torch.float64),
                        torch.rand(4, 4, 2, dtype=torch.float64))[0].dtype == torch.float64
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(4, 4, batch_first=True, dtype=torch.float64)
    ref.in_proj_bias = torch.nn.Parameter(ref.in_proj_bias.to(torch.half))
    ours = with_sinkflow(ref)
    q = torch.randn(4, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(ours(q, q, q)[0], ref(q, q, q)[0], **F64)


# ----------------------------------------------------------------------------------------
# TestTransformers (CPU cases)


def _cos_weights(module):
    """torch's deterministic weights for these tests: cos(0, 1, 2, ...) in each parameter's shape."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.cos(torch.arange(p.numel(), dtype=p.dtype)).view(p.shape))
    return module


@pytest.mark.parametrize("enable_nested_tensor", [True, False])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_stacks_equal_torchs(batch_first, training, enable_nested_tensor):
    layer = _cos_weights(torch.nn.TransformerEncoderLayer(4, 2, 16, 0.0, batch_first=batch_first, dtype=torch.float64))
    x = torch.rand(5, 2, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = x.transpose(0, 1) if batch_first else x
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, 1] = pad[1, 3] = pad[1, 4] = True
    for layers, norm in ((1, None), (2, None), (6, None), (2, torch.nn.LayerNorm(4, dtype=torch.float64))):
        ref = torch.nn.TransformerEncoder(layer, layers, norm=norm, enable_nested_tensor=enable_nested_tensor)
        ref.train(training)
        ours = with_sinkflow(ref)
        with torch.set_grad_enabled(training):
            for kwargs in ({}, {"mask": torch.zeros(5, 5, dtype=torch.bool)}, {"src_key_padding_mask": pad * False},
                           {"src_key_padding_mask": pad}):
                torch.testing.assert_close(ours(x, **kwargs), ref(x, **kwargs), **F64)


@pytest.mark.parametrize("training,grad", [(True, True), (False, True), (False, False)])
def test_square_inputs_and_a_boolean_source_mask_equal_torchs(training, grad):
    """batch size = sequence length (an ambiguous shape for mask broadcasting)."""
    layer = torch.nn.TransformerEncoderLayer(4, 2, 16, 0.0, batch_first=True, dtype=torch.float64)
    ref = _cos_weights(torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)).train(training)
    x = torch.arange(16, dtype=torch.float64).reshape(2, 2, 4)
    mask = torch.tensor([[False, True], [False, False]])
    with torch.set_grad_enabled(grad):
        torch.testing.assert_close(with_sinkflow(ref)(x, mask=mask), ref(x, mask=mask), **F64)


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float64])
def test_attention_in_training_mode_equals_eval_mode_without_grad(normalization, mask_dtype):
    gen = torch.Generator().manual_seed(0)
    draw = (lambda *s: torch.rand(*s, generator=gen) > 0.7) if mask_dtype == torch.bool else \
        (lambda *s: torch.randn(*s, generator=gen, dtype=mask_dtype))
    mha = MultiheadAttention(8, 4, batch_first=True, dtype=torch.float64, normalization=normalization)
    x = torch.randn(2, 4, 8, generator=gen, dtype=torch.float64)
    for attn_mask, kpm in itertools.product((None, draw(4, 4), draw(8, 4, 4)), (None, draw(2, 4))):
        train = mha.train()(x, x, x, attn_mask=attn_mask, key_padding_mask=kpm, need_weights=False)[0]
        with torch.no_grad():
            evaluated = mha.eval()(x, x, x, attn_mask=attn_mask, key_padding_mask=kpm, need_weights=False)[0]
        torch.testing.assert_close(evaluated, train.detach(), **F64)


@pytest.mark.parametrize("nhead", [1, 4, 8])
def test_encoder_layer_with_a_source_mask_equals_torchs_in_both_modes(nhead):
    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoderLayer(8, nhead, 32, batch_first=True, dtype=torch.float64)
    ours = with_sinkflow(ref)
    src, mask = torch.rand(2, 4, 8, dtype=torch.float64), torch.zeros(4, 4, dtype=torch.bool)
    ours.eval(), ref.eval()  # dropout 0.1 by default: compared in eval mode, with and without grad
    torch.testing.assert_close(ours(src, src_mask=mask), ref(src, src_mask=mask), **F64)
    with torch.no_grad():
        torch.testing.assert_close(ours(src, src_mask=mask), ref(src, src_mask=mask), **F64)


@pytest.mark.parametrize("nhead", [3, 4])
def test_a_hook_on_the_attention_sees_one_call_under_inference_mode(nhead):
    layer = with_sinkflow(torch.nn.TransformerEncoderLayer(12, nhead, 12, batch_first=True)).eval()
    seen = []
    handle = layer.self_attn.register_forward_hook(lambda module, inputs, output: seen.append(output[0]))
    with torch.inference_mode():
        layer(torch.rand(2, 4, 12))
    handle.remove()
    assert len(seen) == 1


def test_is_causal_with_its_mask_equals_the_mask_alone():
    torch.manual_seed(0)
    layer = with_sinkflow(torch.nn.TransformerEncoderLayer(3, 1, 6, batch_first=True), "sinkhorn").eval()
    x = torch.randn(1, 5, 3)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5)
    torch.testing.assert_close(layer(x, src_mask=mask, is_causal=True), layer(x, src_mask=mask))
    assert (layer(x) - layer(x, src_mask=mask)).abs().max() > 1e-3


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_padding_and_a_causal_mask_in_training_encoders_and_decoders(normalization):
    """torch's padding-plus-causal-mask cases, dropout 0.1 in training mode: no warning, finite, shapes kept."""
    torch.manual_seed(0)
    kwargs = {"d_model": 16, "nhead": 2, "dim_feedforward": 32, "dropout": 0.1, "batch_first": True}
    encoder = with_sinkflow(torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(**kwargs), 2,
                                                        torch.nn.LayerNorm(16)), normalization)
    decoder = with_sinkflow(torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(**kwargs), 2,
                                                        torch.nn.LayerNorm(16)), normalization)
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    causal = torch.ones(3, 3, dtype=torch.bool).triu_(1)
    pad = torch.arange(3)[None] >= torch.tensor([3, 2])[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = encoder(x, mask=causal, src_key_padding_mask=pad)
        dec = decoder(x, memory, tgt_mask=causal, tgt_key_padding_mask=pad, memory_key_padding_mask=pad)
    assert out.shape == dec.shape == x.shape and torch.isfinite(out).all() and torch.isfinite(dec).all()


def test_a_padding_mask_with_masked_trailing_columns_keeps_the_batch():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, activation="gelu", batch_first=False)
    encoder = with_sinkflow(torch.nn.TransformerEncoder(layer, 3, enable_nested_tensor=True))
    mask = torch.ones(6, 10, dtype=torch.bool)
    mask[0] = False
    for mode in (encoder.train, encoder.eval):
        mode()
        with torch.no_grad():
            out = encoder(torch.randn(10, 6, 32), src_key_padding_mask=mask)
        assert out.shape == (10, 6, 32)
