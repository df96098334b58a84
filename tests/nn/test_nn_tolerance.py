"""Sinkhorn attention to tolerance in the layers: ``tol``, ``max_iter``, ``backward`` of
:func:`sinkflow.nn.scaled_attention`, :func:`sinkflow.nn.attention_weights`, :class:`AttentionKernel` and
:class:`MultiheadAttention`.

Oracles: a plain log-domain Sinkhorn written here (its own loop, 4,001 half-iterations, float64) for the
matrix and, through autograd, for the gradients at convergence; the package's unrolled run to tolerance;
saved-tensor bytes counted with ``torch.autograd.graph.saved_tensors_hooks``.
"""

import math
import warnings

import pytest
import torch

import sinkflow
from oracles import saved_bytes
from sinkflow.attention import SinkhornWarning
from sinkflow.nn import AttentionKernel, MultiheadAttention, attention_weights, scaled_attention

TOL = 1e-12  # float64 run to tolerance
GRAD_ATOL = 1e-8  # implicit vs unrolled autograd at convergence (issue 44)


def _plain_sinkhorn(C, keys=None, n_half=4001):
    """Rows sum to 1, real columns to n / m' (padded keys: weight 0); log domain, its own loop."""
    n, m = C.shape[-2], C.shape[-1]
    if keys is None:
        keys = torch.ones(m, dtype=torch.bool)
    C = C.masked_fill(~keys, -1e4)  # exp underflows to 0 (finite: no NaN in the gradients)
    log_b = math.log(n / int(keys.sum()))
    f = torch.zeros(C.shape[:-1], dtype=C.dtype)
    g = torch.zeros(C.shape[:-2] + (m,), dtype=C.dtype)
    for t in range(n_half):
        if t % 2 == 0:
            f = -torch.logsumexp(C + g[..., None, :], -1)
        else:
            g = torch.where(keys, log_b - torch.logsumexp(C + f[..., :, None], -2), torch.zeros_like(g))
    return torch.exp(f[..., :, None] + C + g[..., None, :])


def _qkv(seed, shape=(2, 3, 7, 4), scale=1.0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(shape, generator=gen, dtype=dtype) for _ in range(3)]


def _scores(q, k):
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def test_tol_gives_the_converged_matrix_with_a_padding_mask():
    q, k, v = _qkv(0)
    keys = torch.tensor([True] * 5 + [False] * 2)
    out, K = scaled_attention(q, k, v, "sinkhorn", mask=keys, tol=TOL)
    ref = _plain_sinkhorn(_scores(q, k), keys)
    assert torch.allclose(K, ref, rtol=0, atol=1e-11)
    assert bool((K[..., ~keys] == 0).all())
    assert torch.allclose(out, ref @ v, rtol=0, atol=1e-11)
    assert torch.allclose(attention_weights(q, k, "sinkhorn", mask=keys, tol=TOL), K, rtol=0, atol=0)
    # a float mask (-inf and an underflowing -1e9 mask a key; a finite bias shifts the scores)
    bias = torch.zeros(7, dtype=torch.float64)
    bias[5], bias[6] = -math.inf, -1e9
    assert torch.equal(scaled_attention(q, k, v, "sinkhorn", bias=bias, tol=TOL)[1], K)
    B = 0.3 * torch.randn(7, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    Kb = scaled_attention(q, k, v, "sinkhorn", bias=B, tol=TOL)[1]
    assert torch.allclose(Kb, _plain_sinkhorn(_scores(q, k) + B), rtol=0, atol=1e-11)


def test_need_weights_and_dropout_follow_the_fixed_n_iter_conventions():
    q, k, v = _qkv(2)
    out, K = scaled_attention(q, k, v, "sinkhorn", tol=TOL)
    out2, none = scaled_attention(q, k, v, "sinkhorn", tol=TOL, need_weights=False)
    assert none is None and torch.allclose(out2, out, rtol=0, atol=1e-14)
    torch.manual_seed(5)
    drop, Kd = scaled_attention(q, k, v, "sinkhorn", tol=TOL, dropout=0.5, training=True)
    torch.manual_seed(5)
    expected = torch.nn.functional.dropout(K, 0.5, True) @ v
    assert torch.allclose(Kd, K, rtol=0, atol=1e-14)  # weights before dropout
    assert torch.allclose(drop, expected, rtol=0, atol=1e-13)


def test_default_n_iter_path_is_unchanged():
    q, k, v = _qkv(3, dtype=torch.float32)
    for need in (True, False):
        a = scaled_attention(q, k, v, "sinkhorn", n_iter=3, need_weights=need)
        b = scaled_attention(q, k, v, "sinkhorn", n_iter=3, need_weights=need, tol=None, backward="unrolled")
        assert torch.equal(a[0], b[0])


def _grads(q, k, v, W, **kw):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = scaled_attention(*leaves, "sinkhorn", **kw)
    return torch.autograd.grad((out * W).sum(), leaves)


@pytest.mark.parametrize("masked", [False, True])
def test_implicit_gradients_equal_unrolled_autograd_at_convergence(masked):
    q, k, v = _qkv(4)
    W = torch.randn(v.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    keys = torch.tensor([True] * 6 + [False]) if masked else None
    implicit = _grads(q, k, v, W, mask=keys, tol=TOL, backward="implicit")
    unrolled = _grads(q, k, v, W, mask=keys, tol=TOL)  # the package's unrolled run to tolerance

    def plain(q_, k_, v_):  # the oracle: this file's loop, differentiated by autograd
        return ((_plain_sinkhorn(_scores(q_, k_), keys) @ v_) * W).sum()

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    oracle = torch.autograd.grad(plain(*leaves), leaves)
    for gi, gu, go in zip(implicit, unrolled, oracle, strict=True):
        assert torch.allclose(gi, go, rtol=0, atol=GRAD_ATOL)
        assert torch.allclose(gu, go, rtol=0, atol=GRAD_ATOL)


def test_implicit_saved_memory_is_independent_of_the_iteration_count():
    q, k, v = (t.requires_grad_() for t in _qkv(6, shape=(1, 2, 12, 4), scale=2.0))
    saved = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SinkhornWarning)  # max_iter=6 does not converge
        for backward in ("unrolled", "implicit"):
            for max_iter in (6, 20_000):
                saved[backward, max_iter] = saved_bytes(lambda m=max_iter, b=backward: scaled_attention(
                    q, k, v, "sinkhorn", tol=TOL, max_iter=m, backward=b))
    assert sinkflow.solve_sinkhorn(_scores(q, k).detach(), tol=TOL).n_iter > 10 * 6  # the runs differ in length
    assert saved["implicit", 6] == saved["implicit", 20_000]
    assert saved["unrolled", 20_000] > 5 * saved["unrolled", 6]  # (the measure sees the iterations)
    assert saved["implicit", 20_000] < saved["unrolled", 6]


def test_not_converging_warns_as_the_solver():
    q, k, v = _qkv(7, scale=3.0)
    for backward in ("unrolled", "implicit"):
        with pytest.warns(SinkhornWarning) as record:  # the solver's; implicit adds that its gradient is the iterate's
            scaled_attention(q, k, v, "sinkhorn", tol=TOL, max_iter=3, backward=backward)
        assert any("max_iter=3" in str(w.message) for w in record)


def test_half_inputs_run_in_float32():
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(8, dtype=torch.float32))
    out, K = scaled_attention(q, k, v, "sinkhorn", tol=1e-4, backward="implicit")
    assert out.dtype == torch.bfloat16 and K.dtype == torch.float32
    assert float(((K.sum(-2) - 1).abs().sum(-1) / 7).max()) <= 1e-4  # the solver's L1 marginal error


def test_refusals_name_the_argument():
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match="tol=0.001 with normalization 'softmax'"):
        scaled_attention(q, k, v, "softmax", tol=1e-3)
    with pytest.raises(ValueError, match="backward='implicit' with normalization 'gaussian'"):
        attention_weights(q, k, "gaussian", backward="implicit")
    with pytest.raises(ValueError, match="give tol"):
        scaled_attention(q, k, v, "sinkhorn", backward="implicit")
    with pytest.raises(ValueError, match="backward must be"):
        scaled_attention(q, k, v, "sinkhorn", tol=1e-3, backward="adjoint")
    with pytest.raises(ValueError, match="tol must be positive"):
        scaled_attention(q, k, v, "sinkhorn", tol=-1.0)
    with pytest.raises(ValueError, match="max_iter must be >= 1"):
        AttentionKernel("sinkhorn", tol=1e-3, max_iter=0)
    with pytest.raises(ValueError, match="normalization 'skyformer'"):
        MultiheadAttention(8, 2, normalization="skyformer", tol=1e-3)
    # None / "unrolled" are accepted by every normalization
    scaled_attention(q, k, v, "softmax", tol=None, backward="unrolled")


def test_multihead_attention_to_tolerance():
    torch.manual_seed(0)
    kw = dict(batch_first=True, normalization="sinkhorn", dtype=torch.float64)
    implicit = MultiheadAttention(8, 2, tol=TOL, backward="implicit", **kw)
    unrolled = MultiheadAttention(8, 2, tol=TOL, **kw)
    unrolled.load_state_dict(implicit.state_dict())
    assert "tol=1e-12" in repr(implicit) and "backward='implicit'" in repr(implicit)
    assert "tol" not in repr(MultiheadAttention(8, 2, **kw))
    assert implicit.tol == TOL and implicit.backward == "implicit" and unrolled.backward == "unrolled"
    x = torch.randn(2, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    grads = []
    for mha in (implicit, unrolled):
        out, w = mha(x, x, x, key_padding_mask=pad)
        assert float(w[1, :, 4:].detach().abs().max()) == 0.0
        grads.append(torch.autograd.grad(out.square().sum(), list(mha.parameters())))
    for gi, gu in zip(*grads, strict=True):
        assert torch.allclose(gi, gu, rtol=0, atol=GRAD_ATOL)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SinkhornWarning)
        implicit(x, x, x)  # converges: no warning


@pytest.mark.slow  # compiling takes ~20 s on a loaded machine
def test_torch_compile_runs_the_solve_eagerly():
    torch.manual_seed(0)
    mha = MultiheadAttention(4, 2, batch_first=True, normalization="sinkhorn", tol=1e-5, backward="implicit")
    x = torch.randn(2, 5, 4, requires_grad=True)
    out = torch.compile(mha)(x, x, x)[0]
    (g,) = torch.autograd.grad(out.sum(), x)
    ref = mha(x, x, x)[0]
    (g_ref,) = torch.autograd.grad(ref.sum(), x)
    assert torch.allclose(out, ref, rtol=0, atol=1e-6) and torch.allclose(g, g_ref, rtol=0, atol=1e-6)
    torch.compiler.reset()  # (else the cached graphs of the first compile are reused)
    with pytest.raises(Exception, match="disable"):  # fullgraph: the stopping loop cannot be traced
        torch.compile(mha, fullgraph=True)(x, x, x)
