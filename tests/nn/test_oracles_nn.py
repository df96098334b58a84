"""MultiheadAttention against a per-head re-implementation written in the test, with padded
queries and keys (different per batch entry) and the log-domain Sinkhorn oracle."""

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp

from oracles import sinkhorn_log
from sinkflow.nn import MultiheadAttention


def linear(x, weight, bias):
    return x @ weight.detach().numpy().T + bias.detach().numpy()


def projections(mha):
    """(weight, bias) of the query, key and value projections, from torch's packed layout."""
    return list(zip(mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3), strict=True))


def reference_heads(C, normalization, n_iter, rows, cols):
    """Attention of one head restricted to real queries ``rows`` and real keys ``cols``."""
    K = np.zeros_like(C)
    sub = C[np.ix_(rows, cols)]
    if normalization == "sinkhorn":  # padded queries leave the column constraint
        K[np.ix_(rows, cols)] = sinkhorn_log(sub, n_iter)[0]
    else:
        K[np.ix_(rows, cols)] = np.exp(sub - logsumexp(sub, axis=1, keepdims=True))
    return K


def reference_mha(mha, x, normalization, n_iter, n_real_q, n_real_k):
    b, n, e = x.shape
    h = mha.num_heads
    p = e // h
    outs, weights = [], []
    for s in range(b):
        q, k, v = (linear(x[s], *wb).reshape(n, h, p).transpose(1, 0, 2) for wb in projections(mha))
        rows, cols = np.arange(n_real_q[s]), np.arange(n_real_k[s])
        Ks = np.stack([reference_heads(q[j] @ k[j].T / math.sqrt(p), normalization, n_iter, rows, cols)
                       for j in range(h)])
        heads = Ks @ v  # (h, n, p)
        outs.append(linear(heads.transpose(1, 0, 2).reshape(n, e), mha.out_proj.weight, mha.out_proj.bias))
        weights.append(Ks.mean(0))
    return np.stack(outs), np.stack(weights)


@pytest.mark.parametrize("normalization, n_iter", [("sinkhorn", 2), ("sinkhorn", 3), ("sinkhorn", 6), ("softmax", 1)])
def test_padded_queries_leave_the_column_constraint_and_get_zero_rows(normalization, n_iter):
    torch.manual_seed(0)
    b, n, e = 3, 7, 8
    mha = MultiheadAttention(e, 2, batch_first=True, normalization=normalization, n_iter=n_iter, dtype=torch.float64)
    for bias in (mha.in_proj_bias, mha.out_proj.bias):
        torch.nn.init.normal_(bias)  # non-zero biases: a padded query's output is out_proj's bias
    x = torch.randn(b, n, e, dtype=torch.float64)
    n_real_q, n_real_k = [7, 5, 3], [6, 7, 4]
    qpm = torch.arange(n)[None, :] >= torch.tensor(n_real_q)[:, None]  # True = pad
    kpm = torch.arange(n)[None, :] >= torch.tensor(n_real_k)[:, None]
    out, w = mha(x, x, x, key_padding_mask=kpm, query_padding_mask=qpm)
    ref_out, ref_w = reference_mha(mha, x.numpy(), normalization, n_iter, n_real_q, n_real_k)
    assert np.abs(w.detach().numpy() - ref_w).max() <= 1e-12
    assert np.abs(out.detach().numpy() - ref_out).max() <= 1e-12
    # Real queries of the Sinkhorn layer: columns over real keys carry n_real_q / n_real_k
    # after a column step (uniform weights over real queries only).
    if normalization == "sinkhorn" and n_iter % 2 == 0:
        for s in range(b):
            cols = w[s, : n_real_q[s], : n_real_k[s]].sum(0).detach().numpy()
            assert np.allclose(cols, n_real_q[s] / n_real_k[s], atol=1e-12)


def test_training_dropout_zeroes_weights_and_is_unbiased():
    # Inverted dropout with p = 0.5: each weight is 0 or twice its value, so with V = I the
    # output entries are exactly {0, 2 K_ij}, about half of them 0, and their mean is K.
    from sinkflow.nn import scaled_attention

    torch.manual_seed(1)
    q, k = torch.randn(2, 64, 6, 4, dtype=torch.float64).unbind(0)
    eye = torch.eye(6, dtype=torch.float64).expand(64, 6, 6)
    out, K = scaled_attention(q, k, eye, "sinkhorn", n_iter=3, dropout=0.5, training=True)
    zero = out == 0
    assert torch.allclose(out[~zero], 2 * K[~zero], rtol=1e-12, atol=0)
    assert 0.4 < zero.double().mean() < 0.6
    assert (out.mean(0) - K.mean(0)).abs().max() < 0.1  # 64 heads average to the weights
    evaluated, _ = scaled_attention(q, k, eye, "sinkhorn", n_iter=3, dropout=0.5, training=False)
    assert torch.equal(evaluated, K)
