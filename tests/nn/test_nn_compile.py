"""sinkflow.nn.MultiheadAttention under torch.compile(fullgraph=True): no graph break, eager's numbers.

``fullgraph=True`` turns any graph break (a Python branch on tensor data, ``.item()``, a
generator object) into an error, so compiling at all is the test that the module traces in
one graph; outputs and gradients are then compared with the eager module's. Every
normalization, on the fused path (``need_weights=False``) and the eager one (the weights
formed), with a key padding mask, with and without autograd.

Backend: ``"eager"`` in the default suite (dynamo's tracing, custom autograd functions'
backward included, run by eager kernels: everything that breaks a graph breaks there, at
1-4 s per case on CPU); ``"aot_eager"`` (AOTAutograd's traced joint graph too) and inductor,
torch's default backend that generates C++ (20-80 s on a loaded CPU), in the slow suite.
"""

from __future__ import annotations

import pytest
import torch

from sinkflow.nn import MultiheadAttention

BACKENDS = ["eager", pytest.param("aot_eager", marks=pytest.mark.slow)]
NORMALIZATIONS = ["softmax", "sinkhorn", "gaussian", "unnormalized", "skyformer", "nystromformer"]


def _module(normalization, seed=0):
    torch.manual_seed(seed)
    return MultiheadAttention(8, 2, batch_first=True, normalization=normalization, n_iter=3, landmarks=3)


def _inputs(normalization):
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True  # Nyströmformer's segment means cannot exclude keys: no mask for it
    return x, None if normalization == "nystromformer" else pad


def _run(mha, x, pad, need_weights, seed=2):
    torch.manual_seed(seed)  # Skyformer's landmarks come from torch's global RNG
    xg = x.clone().requires_grad_()
    out, w = mha(xg, xg, xg, key_padding_mask=pad, need_weights=need_weights)
    (out.square().sum() + (0 if w is None else w.sum())).backward()
    return out.detach(), xg.grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "eager"])
@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_fullgraph_compile_matches_eager_forward_and_backward(normalization, need_weights, backend):
    torch._dynamo.reset()
    mha, (x, pad) = _module(normalization), _inputs(normalization)
    compiled = torch.compile(mha, fullgraph=True, backend=backend)
    out, grad = _run(compiled, x, pad, need_weights)
    if normalization == "skyformer":  # eager draws landmarks through a generator: other draws, same law
        assert torch.isfinite(out).all() and torch.isfinite(grad).all()
        torch.testing.assert_close(_run(compiled, x, pad, need_weights), (out, grad))  # the seed reproduces it
        return
    ref_out, ref_grad = _run(mha, x, pad, need_weights)
    # Sinkhorn runs log-domain steps under torch.compile (multiplicative ones eagerly): rounding apart
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("normalization", [pytest.param("sinkhorn", marks=pytest.mark.slow), "softmax"])
def test_fullgraph_compile_without_autograd(normalization):
    """no_grad takes other solver paths (in-place, the kernel domain eagerly)."""
    torch._dynamo.reset()
    mha, (x, pad) = _module(normalization), _inputs(normalization)
    compiled = torch.compile(mha, fullgraph=True, backend="eager")
    with torch.no_grad():
        for need_weights in (False, True):
            kwargs = {"key_padding_mask": pad, "need_weights": need_weights}
            torch.testing.assert_close(compiled(x, x, x, **kwargs), mha(x, x, x, **kwargs), rtol=1e-5, atol=1e-6)


def test_non_finite_input_is_refused_inside_the_compiled_graph():
    torch._dynamo.reset()
    mha, (x, _) = _module("sinkhorn"), _inputs("sinkhorn")
    compiled = torch.compile(mha, fullgraph=True, backend="eager")
    compiled(x, x, x, need_weights=False)
    bad = x.clone()
    bad[0, 2, 3] = float("nan")
    with pytest.raises(RuntimeError, match="query has non-finite entries"):
        compiled(bad, bad, bad, need_weights=False)


@pytest.mark.slow
def test_inductor_compiles_the_fused_sinkhorn_layer():
    torch._dynamo.reset()
    mha, (x, pad) = _module("sinkhorn"), _inputs("sinkhorn")
    compiled = torch.compile(mha, fullgraph=True)
    torch.testing.assert_close(_run(compiled, x, pad, False), _run(mha, x, pad, False), rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # several seconds: with the slow tests (the README's command stays under 5 minutes)
def test_fullgraph_compile_of_torchs_encoder_with_a_padding_mask():
    """torch's TestTransformers case: the encoder's fast-path checks on the mask trace too."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    layer.self_attn = MultiheadAttention(16, 4, batch_first=True, normalization="sinkhorn")
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(1))
    pad = torch.rand(2, 9, generator=torch.Generator().manual_seed(2)) > 0.5
    pad[:, 0] = False
    compiled = torch.compile(encoder, fullgraph=True, backend="eager")
    with torch.no_grad():  # eval without grad: where torch's encoder decides on its fast path
        torch.testing.assert_close(compiled(x, src_key_padding_mask=pad), encoder(x, src_key_padding_mask=pad),
                                   rtol=1e-5, atol=1e-6)


def test_fullgraph_compile_with_a_float_mask():
    """A float attn_mask's reading (underflowing entries become masked ones) traces without a branch."""
    torch._dynamo.reset()
    mha, (x, _) = _module("sinkhorn"), _inputs("sinkhorn")
    mask = torch.zeros(6, 6)
    mask[:, 4], mask[0, 1] = -1e9, -0.5
    compiled = torch.compile(mha, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, x, x, attn_mask=mask, need_weights=False),
                               mha(x, x, x, attn_mask=mask, need_weights=False), rtol=1e-5, atol=1e-6)
