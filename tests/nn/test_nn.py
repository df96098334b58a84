"""sinkflow.nn: attention modules, models, tracking, training (docs/theory/normalizations.md and
docs/theory/training.md)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracles import mask_patterns as _masks
from sinkflow.nn import MultiheadAttention, attention_weights

NORMS = ["softmax", "sinkhorn", "gaussian"]


def _inputs(b=2, n=7, d=12, scale=1.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(b, n, d, generator=g, dtype=dtype)


def _reference(mha: MultiheadAttention, x, normalization, n_iter, key_padding_mask=None):
    """Textbook multi-head attention in float64 with a naive normalization loop (the oracle)."""
    b, n, d = x.shape
    h, p = mha.num_heads, mha.head_dim
    split_heads = lambda t: t.view(b, n, h, p).transpose(1, 2)  # noqa: E731
    w, bias = mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3)  # torch's packed layout: q, k, v blocks
    q, k, v = (split_heads(x @ w[i].T + bias[i]) for i in range(3))
    keep = torch.ones(b, 1, 1, n, dtype=torch.bool) if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
    if normalization == "gaussian":
        K = torch.exp(-torch.cdist(q, k) ** 2 / (2 * math.sqrt(p))) * keep
    else:
        K = torch.exp(q @ k.transpose(-1, -2) / math.sqrt(p)) * keep
        K = K / K.sum(-1, keepdim=True)
        for t in range(1, n_iter if normalization == "sinkhorn" else 1):
            # column step: columns sum to n (uniform weights), then row step; masked keys stay 0
            K = K / K.sum(-2, keepdim=True).clamp_min(1e-300) if t % 2 else K / K.sum(-1, keepdim=True)
    out = (K @ v).transpose(1, 2).reshape(b, n, d)
    return mha.out_proj(out), K


# ----------------------------------------------------------------------------------------
# the module computes attention


@pytest.mark.parametrize("normalization,n_iter",
                         [("softmax", 1), ("sinkhorn", 1), ("sinkhorn", 2), ("sinkhorn", 5), ("gaussian", 1)])
def test_module_matches_reference_computation(normalization, n_iter):
    torch.manual_seed(0)
    mha = MultiheadAttention(12, 3, batch_first=True, normalization=normalization, n_iter=n_iter, dtype=torch.float64)
    x = _inputs()
    out, w = mha(x, x, x, average_attn_weights=False)
    ref_out, ref_w = _reference(mha, x, normalization, n_iter)
    # float64 throughout; differences are rounding of the log-domain vs naive loop (~1e-15 relative)
    torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)


def test_sinkhorn_with_one_half_iteration_is_softmax_attention():
    torch.manual_seed(0)
    soft = MultiheadAttention(16, 4, batch_first=True, normalization="softmax")
    sink = MultiheadAttention(16, 4, batch_first=True, normalization="sinkhorn", n_iter=1)
    sink.load_state_dict(soft.state_dict())
    x = _inputs(3, 9, 16, dtype=torch.float32)
    (a, wa), (b, wb) = soft(x, x, x), sink(x, x, x)
    assert torch.equal(wa, wb) and torch.equal(a, b)  # same operations: bitwise identical


def test_many_sinkhorn_iterations_give_doubly_stochastic_attention():
    torch.manual_seed(0)
    mha = MultiheadAttention(8, 2, batch_first=True, normalization="sinkhorn", n_iter=101, dtype=torch.float64)
    x = _inputs(2, 6, 8)
    _, w = mha(x, x, x, average_attn_weights=False)
    ones = torch.ones(2, 2, 6, dtype=torch.float64)
    # 50 full iterations at these score spreads reach the fixed point to ~1e-10
    torch.testing.assert_close(w.sum(-1), ones, rtol=0, atol=1e-8)
    torch.testing.assert_close(w.sum(-2), ones, rtol=0, atol=1e-8)


def test_softmax_module_is_a_drop_in_for_torch_multihead_attention():
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    ours = MultiheadAttention(16, 4, batch_first=True)
    ours.load_state_dict(ref.state_dict())  # same parameter names (tests/nn/test_nn_torch_mha.py: the full port)
    x = _inputs(2, 5, 16, dtype=torch.float32)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    ref.eval()
    a, wa = ref(x, x, x, key_padding_mask=kpm)
    b, wb = ours(x, x, x, key_padding_mask=kpm)
    # float32 rounding of differently ordered reductions
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(wb, wa, rtol=1e-5, atol=1e-6)


def test_sequence_first_layout_matches_batch_first():
    torch.manual_seed(0)
    bf = MultiheadAttention(8, 2, batch_first=True, normalization="sinkhorn")
    sf = MultiheadAttention(8, 2, normalization="sinkhorn", batch_first=False)
    sf.load_state_dict(bf.state_dict())
    x = _inputs(2, 5, 8, dtype=torch.float32)
    a, _ = bf(x, x, x)
    xt = x.transpose(0, 1)
    b, _ = sf(xt, xt, xt)
    # the same operations on a transposed view (packed self-attention projection in both)
    torch.testing.assert_close(a, b.transpose(0, 1), rtol=0, atol=1e-7)


def test_bad_arguments_are_rejected_with_a_reason():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        MultiheadAttention(10, 3, batch_first=True)
    with pytest.raises(ValueError, match="unknown normalization"):
        MultiheadAttention(8, 2, batch_first=True, normalization="sparsemax")
    with pytest.raises(ValueError, match="n_iter"):
        MultiheadAttention(8, 2, batch_first=True, normalization="sinkhorn", n_iter=0)
    mha = MultiheadAttention(8, 2, batch_first=True)
    x = torch.zeros(2, 4, 8)
    with pytest.raises(ValueError, match="key_padding_mask"):
        mha(x, x, x, key_padding_mask=torch.zeros(4, dtype=torch.bool))


@pytest.mark.parametrize("normalization,exact", [("skyformer", "gaussian"), ("nystromformer", "softmax")])
def test_nystrom_modules_approximate_their_exact_attention(normalization, exact):
    x = _inputs(2, 32, 16)
    errors = []
    for landmarks in (8, 64):
        torch.manual_seed(0)
        approx = MultiheadAttention(16, 2, batch_first=True, normalization=normalization, landmarks=landmarks,
                                    dtype=torch.float64)
        ref = MultiheadAttention(16, 2, batch_first=True, normalization=exact, dtype=torch.float64)
        ref.load_state_dict(approx.state_dict())
        out, w = approx(x, x, x)
        errors.append(float(((out - ref(x, x, x)[0]).norm() / ref(x, x, x)[0].norm()).detach()))
        assert w is None  # no attention matrix is ever formed
    # measured 0.37 -> 0.060 (skyformer: 2n = 64 lifted points, iterative inverse with ridge 0.1)
    # and 0.37 -> 0.026 (nystromformer: 32 segment means = the tokens, 6 Newton-Schulz steps)
    assert errors[1] < 0.1 and errors[1] < errors[0] / 3


def test_skyformer_respects_key_padding_and_nystromformer_refuses_it():
    torch.manual_seed(0)
    sky = MultiheadAttention(8, 2, batch_first=True, normalization="skyformer", landmarks=16)
    x = _inputs(2, 10, 8, dtype=torch.float32)
    kpm = torch.zeros(2, 10, dtype=torch.bool)
    kpm[1, 7:] = True
    x2 = x.clone()
    x2[kpm] = 50.0
    torch.manual_seed(1)
    out, _ = sky(x, x, x, key_padding_mask=kpm)
    torch.manual_seed(1)  # same landmarks
    out2, _ = sky(x, x, x2, key_padding_mask=kpm)
    # padded values have no influence (x2 holds 50 there): what is left is float32 rounding of the q, k projections
    # (one fused product for (x, x, x), separate ones for (x, x, x2)); measured 1.2e-6 on outputs up to 2.2
    torch.testing.assert_close(out2, out, rtol=0, atol=2e-6)
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in sky.parameters())
    nyf = MultiheadAttention(8, 2, batch_first=True, normalization="nystromformer", landmarks=4)
    with pytest.raises(NotImplementedError, match="padded keys"):
        nyf(x, x, x, key_padding_mask=kpm)


# ----------------------------------------------------------------------------------------
# masks


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=2), st.sampled_from(NORMS), st.integers(1, 6))
def test_masked_keys_get_exactly_zero_weight_and_rows_stay_finite(n_pad, normalization, n_iter):
    n = 6
    torch.manual_seed(1)
    mha = MultiheadAttention(8, 2, batch_first=True, normalization=normalization, n_iter=n_iter)
    x = _inputs(2, n, 8, scale=3.0, dtype=torch.float32)
    kpm = torch.arange(n)[None, :] >= n - torch.tensor(n_pad)[:, None]  # every row keeps >= 1 key
    out, w = mha(x, x, x, key_padding_mask=kpm, average_attn_weights=False)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (w.masked_select(kpm[:, None, None, :].expand_as(w)) == 0).all()
    # the values of masked keys cannot influence the output
    x2 = x.clone()
    x2[kpm] = 100.0
    out2, _ = mha(x, x, x2, key_padding_mask=kpm)
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-6)  # float32 rounding only
    if normalization == "softmax" or (normalization == "sinkhorn" and n_iter % 2):  # last step normalized rows
        torch.testing.assert_close(w.sum(-1)[..., : n - max(n_pad)], torch.ones_like(w.sum(-1)[..., : n - max(n_pad)]),
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("normalization", NORMS)
def test_a_query_without_keys_gets_a_zero_row_not_nan(normalization):
    mha = MultiheadAttention(8, 2, batch_first=True, normalization=normalization)
    x = _inputs(1, 4, 8, dtype=torch.float32)
    blocked = torch.zeros(4, 4, dtype=torch.bool)
    blocked[0] = True  # query 0 may attend to nothing
    out, w = mha(x, x, x, attn_mask=blocked)
    assert torch.isfinite(out).all()
    assert (w[:, 0] == 0).all()


@pytest.mark.parametrize("normalization", NORMS)
def test_gradients_are_finite_with_cold_scores_and_partial_masks(normalization):
    torch.manual_seed(0)
    mha = MultiheadAttention(8, 2, batch_first=True, normalization=normalization, n_iter=5)
    x = _inputs(2, 6, 8, scale=20.0, dtype=torch.float32).requires_grad_()  # scores spread ~ hundreds
    kpm = torch.tensor([[False] * 6, [False, False, True, True, True, True]])
    out, _ = mha(x, x, x, key_padding_mask=kpm, query_padding_mask=kpm)
    out.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in mha.parameters())


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_autocast_keeps_the_normalization_in_float32(normalization):
    torch.manual_seed(0)
    mha = MultiheadAttention(16, 2, batch_first=True, normalization=normalization, n_iter=3)
    x = _inputs(2, 8, 16, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, w = mha(x, x, x, average_attn_weights=False)
    assert w.dtype == torch.float32
    # rows of a float32 normalization sum to 1 to float32 precision, not bfloat16's 4e-3
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 8), rtol=0, atol=1e-6)
    assert torch.isfinite(out).all()


def test_attention_weights_follow_the_sinkflow_normalizations():
    import sinkflow

    q, k = _inputs(1, 5, 4)[0], _inputs(1, 5, 4, seed=1)[0]
    C = sinkflow.dot_scores(q, k, temperature=2.0)  # sqrt(p) with p = 4
    torch.testing.assert_close(attention_weights(q, k, "sinkhorn", n_iter=4), sinkflow.sinkhorn(C, n_iter=4))
    torch.testing.assert_close(attention_weights(q, k, "softmax"), sinkflow.softmax(C))


# ----------------------------------------------------------------------------------------
# models, data, tracking


# ----------------------------------------------------------------------------------------
# training: the trajectory, and the doubly stochastic drift of SoftMax (Sinkformers RQ1)


# ----------------------------------------------------------------------------------------
# CUDA (skipped without a device): the same code on the GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("normalization", NORMS)
def test_cuda_module_matches_cpu_and_autocast_keeps_float32(normalization):
    torch.manual_seed(0)
    mha = MultiheadAttention(32, 4, batch_first=True, normalization=normalization, n_iter=3)
    x = _inputs(2, 50, 32, dtype=torch.float32)
    kpm = torch.zeros(2, 50, dtype=torch.bool)
    kpm[1, 40:] = True
    out_cpu, _ = mha(x, x, x, key_padding_mask=kpm)
    mha = mha.cuda()
    out, w = mha(x.cuda(), x.cuda(), x.cuda(), key_padding_mask=kpm.cuda())
    torch.testing.assert_close(out.cpu(), out_cpu, rtol=1e-4, atol=1e-5)  # TF32/ordering differences only
    assert (w[1, :, 40:] == 0).all()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, w16 = mha(x.cuda(), x.cuda(), x.cuda(), average_attn_weights=False)
    assert w16.dtype == torch.float32


# ---------------------------------------------------------------- factored Sinkhorn, LRA tasks


@pytest.mark.parametrize("mask_kind", ["none", "keys", "keys+queries", "causal", "random", "empty row"])
@pytest.mark.parametrize("shape", [(2, 3, 9, 9), (4, 7, 5), (1, 40, 40)])
@pytest.mark.parametrize("n_iter", [2, 3, 4, 7])
def test_factored_sinkhorn_equals_the_solver_forward_and_gradients(shape, n_iter, mask_kind):
    # Both heads (the matrix, and the output P @ V that never forms P) against the solver's
    # log-domain unrolled steps, values and gradients, with and without masks.
    import sinkflow
    from sinkflow.nn._factored_sinkhorn import _FactoredSinkhorn, sinkhorn_attention

    g = torch.Generator().manual_seed(n_iter)
    mask = _masks(shape, g)[mask_kind]
    C = (2 * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()
    V = torch.randn(*shape[:-2], shape[-1], 3, generator=g, dtype=torch.float64).requires_grad_()
    W = torch.randn(*shape, generator=g, dtype=torch.float64)
    G = torch.randn(*shape[:-1], 3, generator=g, dtype=torch.float64)
    ref = sinkflow.sinkhorn(C, n_iter=n_iter, mask=mask)
    ref_out = torch.autograd.grad(((ref @ V) * G).sum(), (C, V), retain_graph=True)
    ref_grads = torch.autograd.grad((ref * W).sum() + ((ref @ V) * G).sum(), (C, V))
    P = sinkhorn_attention(C, n_iter, mask)
    out = sinkhorn_attention(C, n_iter, mask, values=V)
    grads = torch.autograd.grad((P * W).sum() + (out * G).sum(), (C, V))
    assert torch.allclose(P, ref, rtol=0, atol=1e-13)
    assert torch.allclose(out, ref @ V, rtol=0, atol=1e-13)
    for got, want in zip(grads, ref_grads, strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-12)
    (scores_only,) = torch.autograd.grad((sinkhorn_attention(C, n_iter, mask, values=V.detach()) * G).sum(), C)
    assert torch.allclose(scores_only, ref_out[0], rtol=0, atol=1e-12)  # values that need no gradient
    # float32: same numbers to float32 rounding
    C32, V32 = C.detach().float().requires_grad_(), V.detach().float().requires_grad_()
    out32 = sinkhorn_attention(C32, n_iter, mask, values=V32)
    g32 = torch.autograd.grad((out32 * G.float()).sum(), (C32, V32))
    assert torch.allclose(out32.double(), (ref @ V).detach(), atol=1e-5)
    assert all(torch.allclose(a.double(), b, atol=1e-5) for a, b in zip(g32, ref_out, strict=True))
    # the factored path itself ran (no fallback to the solver it is compared with)
    assert torch.allclose(_FactoredSinkhorn.apply(C.detach(), None, n_iter, mask), ref.detach(), rtol=0, atol=1e-13)
    direct = _FactoredSinkhorn.apply(C.detach(), V.detach(), n_iter, mask)
    assert torch.allclose(direct, (ref @ V).detach(), rtol=0, atol=1e-13)


def test_factored_path_itself_matches_the_log_domain_oracle():
    # Called directly, so a path that always fell back to the solver could not pass unseen.
    import numpy as np

    from oracles import sinkhorn_log
    from sinkflow.nn._factored_sinkhorn import _FactoredSinkhorn

    g = torch.Generator().manual_seed(3)
    C = 2 * torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    V = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    for n_iter in (2, 3, 4, 5):
        P_oracle = np.stack([sinkhorn_log(c, n_iter)[0] for c in C.numpy()])
        assert np.allclose(_FactoredSinkhorn.apply(C, None, n_iter).numpy(), P_oracle, rtol=0, atol=1e-13)
        assert np.allclose(_FactoredSinkhorn.apply(C, V, n_iter).numpy(), P_oracle @ V.numpy(), rtol=0, atol=1e-13)
        assert torch.autograd.gradcheck(lambda c, n_iter=n_iter: _FactoredSinkhorn.apply(c, None, n_iter),
                                        (C.clone().requires_grad_(),))
        assert torch.autograd.gradcheck(lambda c, v, n_iter=n_iter: _FactoredSinkhorn.apply(c, v, n_iter),
                                        (C.clone().requires_grad_(), V.clone().requires_grad_()))


def test_factored_sinkhorn_falls_back_to_the_solver_on_underflow_and_masks():
    import sinkflow
    from sinkflow.nn import _factored_sinkhorn as fs

    # column 2 underflows
    C = torch.tensor([[0.0, -300.0], [0.0, -300.0]], dtype=torch.float64).mul(10).requires_grad_()
    V = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    with pytest.raises(fs._OutOfRange):
        fs._FactoredSinkhorn.apply(C, V, 3)
    out = fs.sinkhorn_attention(C, 3)
    assert torch.equal(out, sinkflow.sinkhorn(C, n_iter=3)) and bool(torch.isfinite(out).all())
    assert torch.equal(fs.sinkhorn_attention(C, 3, values=V), out @ V)
    mask = torch.tensor([[True, False], [True, True]])
    assert torch.equal(fs.sinkhorn_attention(C, 3, mask), sinkflow.sinkhorn(C, n_iter=3, mask=mask))


@pytest.mark.parametrize("padded", [False, True])
def test_sinkhorn_layer_without_weights_is_the_same_layer_and_saves_what_softmax_saves(padded):
    # need_weights=False (the fused passes on CPU, the factored output path elsewhere): same output
    # and gradients as the matrix path, and autograd keeps at most one n x n matrix, not n_iter of them.
    from sinkflow.studies._cost import saved_bytes

    torch.manual_seed(0)
    x = torch.randn(2, 48, 16)
    mha = MultiheadAttention(16, 2, batch_first=True, normalization="sinkhorn", n_iter=3)
    pad = (torch.arange(48) >= 40).expand(2, 48) if padded else None
    results = []
    for need in (True, False):
        mha.zero_grad()
        nbytes, (out, w) = saved_bytes(lambda need=need: mha(x, x, x, key_padding_mask=pad, need_weights=need))
        out.square().mean().backward()
        results.append((nbytes, out.detach(), [p.grad.clone() for p in mha.parameters()], w))
    (_, out_w, grads_w, w), (nbytes, out_f, grads_f, none) = results
    assert w is not None and none is None
    assert torch.allclose(out_w, out_f, rtol=0, atol=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(grads_w, grads_f, strict=True))
    softmax = MultiheadAttention(16, 2, batch_first=True, normalization="softmax")
    softmax_bytes, _ = saved_bytes(lambda: softmax(x, x, x, need_weights=True))  # the eager (matrix) SoftMax
    matrix = 2 * 2 * 48 * 48 * 4  # batch x heads x n x n float32
    assert nbytes <= softmax_bytes + matrix // 4, (nbytes, softmax_bytes)


@pytest.mark.parametrize("n_iter", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_factored_sinkhorn_takes_minus_inf_as_a_masked_entry_for_every_n_iter(n_iter, dtype):
    # issue 19: an isolated -inf was accepted for n_iter >= 2 and refused for n_iter = 1. -inf is
    # torch's "masked" (torch.softmax gives it weight 0): the same as an explicit mask, everywhere.
    import sinkflow
    from sinkflow.nn._factored_sinkhorn import sinkhorn_attention

    torch.manual_seed(1)
    C = torch.randn(2, 5, 6, dtype=torch.float64)
    C[0, 1, 2] = C[1, 3, 0] = -math.inf
    C[1, 4] = -math.inf  # a whole row: an empty line, weight 0 (as a masked row), not NaN
    mask = torch.isfinite(C)
    scores = C.to(dtype).requires_grad_()
    P = sinkhorn_attention(scores, n_iter)
    expected = sinkflow.sinkhorn(torch.where(mask, C, 0.0), n_iter=n_iter, mask=mask)
    tol = {torch.float32: 1e-6, torch.float64: 1e-12, torch.bfloat16: 2e-2}[dtype]
    assert P.dtype == dtype and torch.allclose(P.double(), expected, rtol=0, atol=tol)
    assert P[0, 1, 2] == 0 and P[1, 3, 0] == 0 and not P[1, 4].any()
    if n_iter == 1:  # torch's own convention as the oracle
        rows = torch.softmax(C[0], -1)
        assert torch.allclose(P[0].double(), rows, rtol=0, atol=tol)
    V = torch.randn(2, 6, 3, dtype=dtype)
    out = sinkhorn_attention(scores, n_iter, values=V)
    assert torch.allclose(out.double(), expected @ V.double(), rtol=0, atol=10 * tol)
    (grad,) = torch.autograd.grad(out.float().square().sum(), scores)
    assert bool(torch.isfinite(grad).all()) and grad[0, 1, 2] == 0 and not grad[1, 4].any()
    for bad in (math.inf, math.nan):
        C_bad = C.clone()
        C_bad[0, 0, 0] = bad
        with pytest.raises(ValueError, match="non-finite"):
            sinkhorn_attention(C_bad.to(dtype), n_iter)


def test_factored_sinkhorn_refuses_bad_arguments():
    from sinkflow.nn._factored_sinkhorn import sinkhorn_attention

    C = torch.randn(3, 3)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="n_iter"):
            sinkhorn_attention(C, bad)
    with pytest.raises(TypeError, match="boolean"):
        sinkhorn_attention(C, 3, torch.ones(3, 3, dtype=torch.int64))


def test_global_forward_hook_sees_sinkhorn_weights():
    from torch.nn.modules.module import register_module_forward_hook

    from sinkflow.nn import AttentionKernel

    seen = []
    mha = MultiheadAttention(8, 2, batch_first=True, normalization="sinkhorn")
    handle = register_module_forward_hook(
        lambda module, inputs, output: seen.append(output[1]) if isinstance(module, AttentionKernel) else None)
    try:
        x = torch.randn(1, 4, 8)
        mha(x, x, x, need_weights=False)
    finally:
        handle.remove()
    assert len(seen) == 1 and seen[0] is not None and seen[0].shape == (1, 2, 4, 4)


