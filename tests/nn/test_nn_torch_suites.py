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
            yield cls, {"d_model": 4, "nhead": 2, "dim_feedforward": dim_ff, "dropout": 0.0, **extra}, [(2, 3, 4)] * n_inputs, {}
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
        for g, r in zip(grads, ref_grads):
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
