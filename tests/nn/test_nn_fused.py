"""Fused attention passes (sinkflow.nn._fused) against the eager path and plain formulas."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from oracles import mask_patterns
from sinkflow.nn import MultiheadAttention, scaled_attention
from sinkflow.nn._fused import fused_attention, fused_available, fused_kind, fused_preferred
from sinkflow.nn._fused_sinkhorn import sinkhorn_passes
from sinkflow.studies._cost import saved_bytes

MASKS = ["none", "keys", "keys+queries", "causal", "random", "empty row"]
VARIANTS = [("softmax", 1), ("sinkhorn", 1), ("gaussian", 1)]
TOL = {torch.float64: 1e-12, torch.float32: 2e-6}


def _plain(q, k, v, variant, allowed=None, bias=None, n_iter=3):
    """The attention matrix written out in float64 from its formula (Sinkhorn: the solver's), then times v."""
    q, k, v = q.double(), k.double(), v.double()
    p = q.shape[-1]
    if variant == "sinkhorn":
        import sinkflow

        C = q @ k.transpose(-1, -2) / math.sqrt(p)
        return sinkflow.sinkhorn(C if bias is None else C + bias.double(), n_iter=n_iter, mask=allowed) @ v
    if variant == "gaussian":
        C = -((q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1) / (2 * math.sqrt(p))
    else:
        C = q @ k.transpose(-1, -2) / math.sqrt(p)
    C = C if bias is None else C + bias.double()
    E = torch.exp(C if variant == "gaussian" else C - C.amax(-1, keepdim=True).clamp_min(-1e300))
    E = E if allowed is None else E * allowed
    if variant != "gaussian":
        E = E / E.sum(-1, keepdim=True).clamp_min(1e-300)
    return E @ v


def _qkv(shape, dtype, g, p=4, p_v=None, scale=1.0):
    *batch, n, m = shape
    q = scale * torch.randn(*batch, n, p, generator=g, dtype=torch.float64)
    k = scale * torch.randn(*batch, m, p, generator=g, dtype=torch.float64)
    v = torch.randn(*batch, m, p_v or p, generator=g, dtype=torch.float64)
    return [t.to(dtype).requires_grad_() for t in (q, k, v)]


def _grads(out, inputs, w):
    return torch.autograd.grad((out * w).sum(), inputs, retain_graph=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("variant,n_iter", VARIANTS)
@pytest.mark.parametrize("shape", [(2, 3, 9, 9), (4, 7, 5), (1, 40, 33)])
def test_fused_equals_the_eager_path_forward_and_gradients(shape, variant, n_iter, mask_kind, dtype):
    # need_weights=False (fused) against need_weights=True (the matrix, then K @ V), over the
    # six mask patterns of the factored Sinkhorn tests, values and gradients of q, k, v.
    g = torch.Generator().manual_seed(len(shape) + len(mask_kind))
    mask = mask_patterns(shape, g)[mask_kind]
    q, k, v = _qkv(shape, dtype, g)
    w = torch.randn(*shape[:-1], v.shape[-1], generator=g, dtype=dtype)
    eager, K = scaled_attention(q, k, v, variant, n_iter=n_iter, mask=mask)
    fused, none = scaled_attention(q, k, v, variant, n_iter=n_iter, mask=mask, need_weights=False)
    assert K is not None and none is None and fused.dtype == dtype
    tol = TOL[dtype]  # relative to the largest entry (the Gaussian kernel's outputs are sums, not means)
    assert torch.allclose(fused, eager, rtol=0, atol=tol * max(1.0, float(eager.detach().abs().max())))
    assert torch.allclose(fused.double(), _plain(q, k, v, variant, mask, n_iter=n_iter), rtol=0,
                          atol=10 * tol * max(1.0, float(eager.detach().abs().max())))
    for got, want in zip(_grads(fused, (q, k, v), w), _grads(eager, (q, k, v), w), strict=True):
        assert torch.allclose(got, want, rtol=0, atol=5 * tol * max(1.0, float(want.detach().abs().max())))
    if mask_kind == "empty row":  # a query with no admissible key: zero output, zero gradient, no NaN
        assert torch.equal(fused[..., 1, :], torch.zeros_like(fused[..., 1, :]))


@pytest.mark.parametrize("bias", [False, True])
def test_softmax_zeroes_empty_rows_where_the_kernel_would_not(monkeypatch, bias):
    # Kernels other than CPU's may return NaN for a query with no admissible key: the pass then
    # lets such rows attend everywhere and zeroes them. Forced here on CPU: same values and gradients.
    import sinkflow.nn._fused as fused

    g = torch.Generator().manual_seed(8)
    q, k, v = _qkv((2, 3, 9, 9), torch.float64, g)
    mask = mask_patterns((2, 3, 9, 9), g)["empty row"] & mask_patterns((2, 3, 9, 9), g)["keys+queries"]
    extra = torch.randn(9, 9, generator=g, dtype=torch.float64) if bias else None
    w = torch.randn(2, 3, 9, 4, generator=g, dtype=torch.float64)
    want = fused_attention(q, k, v, allowed=mask, bias=extra)
    monkeypatch.setattr(fused, "_zeroes_empty_rows", lambda device: False)
    got = fused_attention(q, k, v, allowed=mask, bias=extra)
    assert torch.equal(got[..., 1, :], torch.zeros_like(got[..., 1, :]))
    assert torch.allclose(got, want, rtol=0, atol=1e-14)
    for a, b in zip(_grads(got, (q, k, v), w), _grads(want, (q, k, v), w), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-14)


@pytest.mark.parametrize("variant", ["softmax", "gaussian"])
def test_fused_with_an_additive_bias_is_the_biased_formula(variant):
    # torch's float attn_mask: added to the scores, -inf drops an entry; combined with a boolean mask.
    g = torch.Generator().manual_seed(3)
    q, k, v = _qkv((2, 6, 8), torch.float64, g)
    bias = torch.randn(6, 8, generator=g, dtype=torch.float64)
    bias[0, 2] = -math.inf
    allowed = torch.rand(2, 1, 8, generator=g) > 0.3
    allowed[..., 0] = True
    want = _plain(q, k, v, variant, allowed, bias)
    got = fused_attention(q, k, v, variant, allowed=allowed, bias=bias)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    w = torch.randn(2, 6, 4, generator=g, dtype=torch.float64)
    for a, b in zip(_grads(got, (q, k, v), w), _grads(want, (q, k, v), w), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant, n_iter", [("sinkhorn", 3), ("sinkhorn", 4), ("gaussian", 1), ("softmax", 1)])
def test_fused_reads_a_float_mask_as_scaled_attention_does(variant, n_iter):
    # -1e9 on a key is a masked key (its exponential underflows): the formula with that key
    # masked out (a Sinkhorn column step brought it back with full weight before, 0.3 off);
    # NaN and +inf are refused, not passed through.
    g = torch.Generator().manual_seed(7)
    q, k, v = _qkv((2, 6, 8), torch.float64, g)
    bias = torch.zeros(8, dtype=torch.float64)
    bias[[2, 5]] = -1e9
    want = _plain(q, k, v, variant, allowed=bias == 0, n_iter=n_iter)
    got = fused_attention(q, k, v, variant, n_iter=n_iter, bias=bias)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            fused_attention(q, k, v, variant, n_iter=n_iter, bias=torch.tensor([0.0, bad] * 4, dtype=torch.float64))


@pytest.mark.parametrize("variant, n_iter", VARIANTS + [("sinkhorn", 3)])
@pytest.mark.parametrize("kind", ["mask", "bias", "scalar bias"])
def test_fused_takes_a_mask_of_fewer_than_two_dimensions(variant, n_iter, kind):
    # Broadcastable masks (documented): a 1-D mask is over keys, a 0-D bias a constant. SDPA
    # reads its mask's last two dimensions (IndexError before, SoftMax and Sinkhorn n_iter = 1).
    g = torch.Generator().manual_seed(8)
    q, k, v = _qkv((2, 3, 6, 6), torch.float64, g)
    keys = torch.tensor([True, True, False, True, True, False])
    extra = {"mask": {"mask": keys}, "bias": {"bias": torch.where(keys, 0.0, -math.inf).double()},
             "scalar bias": {"bias": torch.tensor(0.5, dtype=torch.float64)}}[kind]
    scalar = kind == "scalar bias"
    want = _plain(q, k, v, variant, None if scalar else keys, extra["bias"] if scalar else None, n_iter)
    got = scaled_attention(q, k, v, variant, n_iter=n_iter, need_weights=False, **extra)[0]
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_gaussian_fused_is_exact_at_large_norms_and_another_value_width():
    # |q|^2 / (2 sqrt p) ~ 450 would overflow exp in float32 if the row factor were applied
    # outside the pass; p_v != p takes the zero-padding path; non-contiguous heads as in a layer.
    g = torch.Generator().manual_seed(4)
    x = 30 * torch.randn(2, 12, 3, 4, generator=g)
    q = x.transpose(1, 2).requires_grad_()  # (2, 3, 12, 4), not contiguous
    k = (q.detach() + 0.5 * torch.randn(2, 3, 12, 4, generator=g)).requires_grad_()
    v = torch.randn(2, 3, 12, 6, generator=g, requires_grad=True)
    got = fused_attention(q, k, v, "gaussian")
    want = _plain(q, k, v, "gaussian")
    # float32 rounds the exponent -|q - k|^2 / (2 tau) = (2 q.k - |q|^2 - |k|^2) / (2 tau) to about
    # eps |q|^2 / (2 tau) (~ 5e-4 here), relative, as the eager float32 scores do.
    rel = float(torch.finfo(torch.float32).eps * q.detach().square().sum(-1).max() / (2 * math.sqrt(4)))
    assert bool(torch.isfinite(got).all()) and want.abs().max() > 1e-3
    assert torch.allclose(got.double(), want, rtol=0, atol=rel * float(want.detach().abs().max()))
    w = torch.randn(2, 3, 12, 6, generator=g)
    for a, b in zip(_grads(got, (q, k, v), w), _grads(want, (q, k, v), w.double()), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=rel * float(b.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant,n_iter", [("softmax", 1), ("gaussian", 1), ("sinkhorn", 2), ("sinkhorn", 3)])
def test_fused_half_inputs_compute_in_float32_and_return_their_dtype(variant, n_iter, dtype):
    g = torch.Generator().manual_seed(5)
    q, k, v = _qkv((2, 16, 16), torch.float32, g)
    mask = mask_patterns((2, 16, 16), g)["keys"]
    qh, kh, vh = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    out = fused_attention(qh, kh, vh, variant, n_iter=n_iter, allowed=mask)
    want = _plain(qh, kh, vh, variant, mask, n_iter=n_iter)  # the same rounded inputs, in float64
    assert out.dtype == dtype
    assert torch.allclose(out.double(), want, rtol=0,
                          atol=2 * float(torch.finfo(dtype).eps) * (1 + float(want.detach().abs().max())))
    out.float().square().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == dtype and bool(torch.isfinite(t.grad).all())
               for t in (qh, kh, vh))


@pytest.mark.parametrize("normalization", ["softmax", "gaussian"])
def test_layer_without_weights_saves_what_torch_saves(normalization):
    # The fused layer keeps O(n p) for backward: within 1.2x torch.nn.MultiheadAttention's
    # (SoftMax), 1.8x for the Gaussian kernel (it adds the row sums and the key bias), and
    # far below one batch x heads x n x n float32 matrix (what the eager path keeps).
    torch.manual_seed(0)
    b, n, d, h = 2, 1024, 16, 2
    x = torch.randn(b, n, d)
    pad = (torch.arange(n) >= 800).expand(b, n)
    ours = MultiheadAttention(d, h, batch_first=True, normalization=normalization)
    ref = torch.nn.MultiheadAttention(d, h, batch_first=True)
    got, _ = saved_bytes(lambda: ours(x, x, x, key_padding_mask=pad, need_weights=False))
    want, _ = saved_bytes(lambda: ref(x, x, x, key_padding_mask=pad, need_weights=False))
    assert got <= (1.2 if normalization == "softmax" else 1.8) * want, (got, want)
    assert got < b * h * n * n * 4 / 8


def test_layer_matches_torch_multihead_attention_with_masks():
    # Same parameters loaded into torch's module: equal outputs and input gradients with a
    # key-padding mask and a causal boolean attn_mask (torch's True = not allowed).
    torch.manual_seed(1)
    b, n, d, h = 2, 10, 8, 2
    ours = MultiheadAttention(d, h, batch_first=True)
    ref = torch.nn.MultiheadAttention(d, h, batch_first=True)
    ref.load_state_dict(ours.state_dict())  # torch's parameter layout
    x = torch.randn(b, n, d, requires_grad=True)
    pad = (torch.arange(n) >= 7).expand(b, n)
    causal = torch.ones(n, n, dtype=torch.bool).triu(1)
    outs = [m(x, x, x, key_padding_mask=pad, attn_mask=causal, need_weights=False)[0] for m in (ours, ref)]
    assert torch.allclose(outs[0], outs[1], rtol=0, atol=1e-6)
    grads = [torch.autograd.grad(o.square().sum(), x)[0] for o in outs]
    assert torch.allclose(grads[0], grads[1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("n_iter", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("shape", [(2, 3, 9, 9), (4, 7, 5), (1, 40, 33)])
def test_fused_sinkhorn_equals_the_eager_factored_path(shape, n_iter, mask_kind, dtype):
    # The log-domain passes against the factored multiplicative path (values and gradients of
    # q, k, v) and against the solver's matrix times v, over the six mask patterns.
    import sinkflow
    from sinkflow.nn._factored_sinkhorn import sinkhorn_attention

    g = torch.Generator().manual_seed(n_iter + len(mask_kind))
    mask = mask_patterns(shape, g)[mask_kind]
    q, k, v = _qkv(shape, dtype, g, scale=1.5)
    w = torch.randn(*shape[:-1], v.shape[-1], generator=g, dtype=dtype)
    C = q @ k.transpose(-1, -2) / 2.0  # p = 4: the scores q k^T / sqrt(p)
    eager = sinkhorn_attention(C, n_iter, mask, values=v)
    fused = fused_attention(q, k, v, "sinkhorn", n_iter=n_iter, allowed=mask)
    tol = TOL[dtype]
    assert fused.dtype == dtype and torch.allclose(fused, eager, rtol=0, atol=tol)
    solver = sinkflow.sinkhorn(C.detach().double(), n_iter=n_iter, mask=mask) @ v.detach().double()
    assert torch.allclose(fused.double(), solver, rtol=0, atol=10 * tol)
    for got, want in zip(_grads(fused, (q, k, v), w), _grads(eager, (q, k, v), w), strict=True):
        assert torch.allclose(got, want, rtol=0, atol=5 * tol * max(1.0, float(want.detach().abs().max())))


def test_fused_sinkhorn_saves_linear_memory_and_takes_a_bias():
    # Memory saved for backward: O(n (p + n_iter)) per head, not the n x n SoftMax the
    # factored path keeps; a finite additive bias enters the scores (oracle: solver on C + B).
    import sinkflow
    from sinkflow.nn._factored_sinkhorn import sinkhorn_attention

    g = torch.Generator().manual_seed(6)
    q, k, v = _qkv((2, 2, 1024, 1024), torch.float32, g, p=8)
    mask = mask_patterns((2, 2, 1024, 1024), g)["keys"]
    nbytes, _ = saved_bytes(lambda: fused_attention(q, k, v, "sinkhorn", n_iter=3, allowed=mask))
    per_line = 2 * 2 * 1024 * 4  # batch x heads x n float32
    assert nbytes <= per_line * (4 * 8 + 3 * (3 + 1)), nbytes  # q, k, v, output; 3 line vectors per pass
    factored, _ = saved_bytes(lambda: sinkhorn_attention(q @ k.transpose(-1, -2), 3, mask, values=v))
    assert factored > 10 * nbytes
    q, k, v = _qkv((2, 6, 8), torch.float64, g)
    bias = torch.randn(6, 8, generator=g, dtype=torch.float64)
    C = q @ k.transpose(-1, -2) / 2.0 + bias
    want = sinkflow.sinkhorn(C, n_iter=4) @ v
    assert torch.allclose(fused_attention(q, k, v, "sinkhorn", n_iter=4, bias=bias), want, rtol=0, atol=1e-12)


def test_sinkhorn_layer_without_weights_takes_the_fused_passes():
    # need_weights=False: same output and parameter gradients as the matrix path (need_weights=True),
    # and a fraction of what the factored path (forced here) saves.
    import sinkflow.nn.functional as functional

    torch.manual_seed(2)
    x = torch.randn(2, 64, 16)
    pad = (torch.arange(64) >= 50).expand(2, 64)
    mha = MultiheadAttention(16, 2, batch_first=True, normalization="sinkhorn", n_iter=3)
    with mock.patch.object(functional, "fused_preferred", lambda *args: None):
        factored, _ = saved_bytes(lambda: mha(x, x, x, key_padding_mask=pad, need_weights=False))
    results = []
    for need in (True, False):
        mha.zero_grad()
        nbytes, (out, _) = saved_bytes(lambda need=need: mha(x, x, x, key_padding_mask=pad, need_weights=need))
        out.square().mean().backward()
        results.append((nbytes, out.detach(), [p.grad.clone() for p in mha.parameters()]))
    (_, out_w, grads_w), (nbytes, out_f, grads_f) = results
    assert torch.allclose(out_f, out_w, rtol=0, atol=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(grads_f, grads_w, strict=True))
    assert nbytes < factored / 2, (nbytes, factored)


@pytest.mark.parametrize("normalization,n_iter,kind", [("softmax", 1, "softmax"), ("gaussian", 1, "gaussian"),
                                                       ("sinkhorn", 3, "sinkhorn"), ("sinkhorn", 1, "softmax")])
def test_layer_takes_the_fused_pass_exactly_when_the_weights_are_not_needed(normalization, n_iter, kind):
    # A spy on the fused entry point of scaled_attention: one call per forward without weights,
    # with the pass classified once (its kind), none when the weights are returned.
    import sinkflow.nn.functional as functional

    mha = MultiheadAttention(8, 2, batch_first=True, normalization=normalization, n_iter=n_iter)
    x = torch.randn(2, 5, 8)
    with mock.patch.object(functional, "fused_output", wraps=functional.fused_output) as spy:
        mha(x, x, x, need_weights=False)
        assert spy.call_count == 1 and spy.call_args.args[0] == kind
        mha(x, x, x, need_weights=True)
        assert spy.call_count == 1


@pytest.mark.parametrize("p_v", [3, 4])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("n_iter", [2, 3, 4, 5])
def test_combined_sinkhorn_backward_equals_the_chain_of_passes(n_iter, mask_kind, p_v):
    # The one-flash-backward gradients against the per-step chain (each pass its own flash
    # backward, autograd between them), float64, with a float mask (bias) on the scores.
    g = torch.Generator().manual_seed(10 * n_iter + len(mask_kind))
    shape = (2, 2, 11, 8)
    mask = mask_patterns(shape, g)[mask_kind]
    q, k, v = _qkv(shape, torch.float64, g, p=4, p_v=p_v, scale=1.5)  # p_v = 3: padded values
    bias = torch.randn(11, 8, generator=g, dtype=torch.float64)
    w = torch.randn(*shape[:-1], p_v, generator=g, dtype=torch.float64)
    got = sinkhorn_passes(q, k, v, n_iter, allowed=mask, bias=bias)
    want = sinkhorn_passes(q, k, v, n_iter, allowed=mask, bias=bias, chain=True)
    assert torch.allclose(got, want, rtol=0, atol=1e-13)
    for a, b in zip(_grads(got, (q, k, v), w), _grads(want, (q, k, v), w), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v)), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)  # the gradient of a sum is expanded (stride 0)


@pytest.mark.parametrize("n_iter", [3, 4])
def test_combined_sinkhorn_backward_falls_back_to_the_chain_past_its_range(monkeypatch, n_iter):
    # Past FACTOR_LOG_LIMIT (forced: a limit below every factor) the chain runs (spied) and gives
    # the combined pass's gradients; at small temperature (scores ~ 50) the factors stay in
    # range (a row of S diag(b / S^T 1) sums to at most n) and both equal the solver's (float64).
    import sinkflow
    import sinkflow.nn._fused_sinkhorn as fs

    g = torch.Generator().manual_seed(11)
    q, k, v = _qkv((1, 2, 7, 6), torch.float64, g, p=4, scale=5.0)
    w = torch.randn(1, 2, 7, 4, generator=g, dtype=torch.float64)
    spy = mock.Mock(wraps=fs._chain_backward)
    monkeypatch.setattr(fs, "_chain_backward", spy)
    combined = _grads(sinkhorn_passes(q, k, v, n_iter), (q, k, v), w)
    assert spy.call_count == 0
    monkeypatch.setattr(fs, "FACTOR_LOG_LIMIT", {torch.float64: -math.inf})
    chain = _grads(sinkhorn_passes(q, k, v, n_iter), (q, k, v), w)
    assert spy.call_count == 1
    want = _grads(sinkflow.sinkhorn(q @ k.transpose(-1, -2) / 2.0, n_iter=n_iter) @ v, (q, k, v), w)
    for a, b, c in zip(combined, chain, want, strict=True):
        assert torch.allclose(a, c, rtol=0, atol=1e-10 * max(1.0, float(c.abs().max())))
        assert torch.allclose(b, c, rtol=0, atol=1e-10 * max(1.0, float(c.abs().max())))


@pytest.mark.parametrize("layout", ["unbatched", "batch_first=False"])
def test_fused_sinkhorn_layer_unbatched_and_sequence_first(layout):
    # The drop-in layouts through the fused passes: equal to the matrix path (need_weights=True).
    torch.manual_seed(3)
    mha = MultiheadAttention(8, 2, batch_first=False, normalization="sinkhorn", n_iter=3)
    x = torch.randn(9, 8) if layout == "unbatched" else torch.randn(9, 2, 8)
    pad = torch.arange(9) >= 7 if layout == "unbatched" else (torch.arange(9) >= 7).expand(2, 9)
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)
    outs, grads = [], []
    for need in (True, False):
        xi = x.clone().requires_grad_()
        out = mha(xi, xi, xi, key_padding_mask=pad, attn_mask=causal, need_weights=need)[0]
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), xi)[0])
    assert outs[1].shape == x.shape and torch.allclose(outs[1], outs[0], rtol=0, atol=1e-6)
    assert torch.allclose(grads[1], grads[0], rtol=0, atol=1e-5)


def test_fused_availability_and_refusals():
    q = k = v = torch.randn(2, 3, 4)
    assert fused_available("softmax") and fused_available("sinkhorn", 1) and fused_available("gaussian")
    assert fused_available("sinkhorn", 3) and not fused_available("unnormalized")
    assert [fused_kind(*a) for a in [("sinkhorn", 1), ("sinkhorn", 2), ("gaussian", 1), ("skyformer", 1)]] == \
        ["softmax", "sinkhorn", "gaussian", None]
    short, long = torch.empty(4, 2), torch.empty(16384, 1)  # Sinkhorn fused at every length now
    assert fused_preferred("sinkhorn", 3, short, short) == fused_preferred("sinkhorn", 3, long, long) == "sinkhorn"
    assert fused_preferred("softmax", 1, q, k) == "softmax" and fused_preferred("unnormalized", 1, long, long) is None
    with pytest.raises(ValueError, match="no fused pass"):
        fused_attention(q, k, v, "unnormalized")
    with pytest.raises(TypeError, match="boolean"):
        fused_attention(q, k, v, allowed=torch.ones(3, 3))
    with pytest.raises(TypeError, match="floating-point"):
        fused_attention(q, k, v, bias=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="share p"):
        fused_attention(q, torch.randn(2, 3, 5), v)


def _log_sinkhorn_output(q, k, v, n_iter):
    """The Sinkhorn(n_iter) output written from its formula in the log domain (float64, no mask)."""
    C = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n, m = C.shape[-2:]
    f, g = C.new_zeros(C.shape[:-1]), C.new_zeros(C.shape[:-2] + (m,))
    for t in range(n_iter):
        if t % 2 == 0:
            f = -torch.logsumexp(C + g.unsqueeze(-2), -1)
        else:
            g = math.log(n / m) - torch.logsumexp(C + f.unsqueeze(-1), -2)
    return torch.exp(C + f.unsqueeze(-1) + g.unsqueeze(-2)) @ v


@pytest.mark.parametrize("factor, seed", [(100, 4), (200, 1)])
@pytest.mark.parametrize("n_iter", [2, 3, 5])
def test_cold_float32_fused_gradients_are_within_10x_of_the_eager_path(factor, seed, n_iter):
    # Scores x100 and x200 (a spread of 600 to 1,600): the combined backward's potentials carry
    # eps |C| in the exponent and its steps' terms cancel (450x the eager error, 1e-3, before).
    # Oracle: the log-domain formula in float64 through autograd.
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, 1, 2, 12, 8, generator=g, dtype=torch.float64)
    q = q * factor
    w = torch.randn(1, 2, 12, 8, generator=g, dtype=torch.float64)

    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad((_log_sinkhorn_output(*inputs, n_iter) * w).sum(), inputs[:2])
    f32 = [t.float() for t in (q, k, v)]
    got = {}
    for need_weights in (False, True):
        def out(q, k, v, need_weights=need_weights):
            return scaled_attention(q, k, v, "sinkhorn", n_iter=n_iter, need_weights=need_weights)[0]

        inputs = [t.clone().requires_grad_() for t in f32]
        ds = torch.autograd.grad((out(*inputs) * w.float()).sum(), inputs[:2])
        got[need_weights] = max(float((d.double() - r).norm() / r.norm()) for d, r in zip(ds, want, strict=True))
    assert got[True] < 1e-3  # the eager path (the matrix)
    assert got[False] <= 10 * got[True]


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("mask_kind", MASKS)
def test_eager_backward_of_the_fused_pass_equals_its_combined_backward(monkeypatch, mask_kind, with_bias):
    # The backward that cold scores take (forced: a score range limit below every spread), with
    # masks, with and without a float mask, against the combined backward (float64).
    import sinkflow.nn._fused_sinkhorn as fs

    g = torch.Generator().manual_seed(len(mask_kind))
    shape = (2, 2, 9, 7)
    mask = mask_patterns(shape, g)[mask_kind]
    q, k, v = _qkv(shape, torch.float64, g, p=4, p_v=3, scale=1.5)
    bias = torch.randn(9, 7, generator=g, dtype=torch.float64) if with_bias else None
    w = torch.randn(*shape[:-1], 3, generator=g, dtype=torch.float64)
    combined = _grads(sinkhorn_passes(q, k, v, 3, allowed=mask, bias=bias), (q, k, v), w)
    spy = mock.Mock(wraps=fs._eager_backward)
    monkeypatch.setattr(fs, "_eager_backward", spy)
    monkeypatch.setattr(fs, "SCORE_RANGE_LIMIT", {torch.float64: -math.inf})
    eager = _grads(sinkhorn_passes(q, k, v, 3, allowed=mask, bias=bias), (q, k, v), w)
    assert spy.call_count == 1
    for a, b in zip(eager, combined, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
