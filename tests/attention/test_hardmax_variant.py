"""The registered "hardmax" attention: the one-hot argmax (ties shared), in flows, the heat layer and models."""

import numpy as np
import pytest
import torch

import sinkflow
from sinkflow.nn import MultiheadAttention, scaled_attention


def _oracle(C, mask=None):
    """Plain loops: each row uniform on its exactly maximal admissible entries."""
    C = np.asarray(C, dtype=np.float64)
    out = np.zeros_like(C)
    for i in range(C.shape[0]):
        keep = np.ones(C.shape[1], bool) if mask is None else np.asarray(mask[i], bool)
        if not keep.any():
            continue
        top = C[i][keep].max()
        winners = [j for j in range(C.shape[1]) if keep[j] and C[i, j] == top]
        out[i, winners] = 1.0 / len(winners)
    return out


def test_hardmax_is_the_one_hot_argmax_with_ties_shared():
    rng = np.random.default_rng(0)
    C = rng.normal(size=(7, 9))
    K = sinkflow.hardmax(torch.from_numpy(C)).numpy()
    np.testing.assert_array_equal(K, np.eye(9)[C.argmax(1)])  # no ties: one-hot
    C = rng.integers(0, 3, size=(7, 9)).astype(float)  # many ties
    mask = rng.random((7, 9)) < 0.7
    mask[3] = False
    np.testing.assert_array_equal(sinkflow.hardmax(torch.from_numpy(C), mask=torch.from_numpy(mask)).numpy(),
                                  _oracle(C, mask))


def test_hardmax_is_softmax_at_zero_temperature():
    C = torch.tensor([[0.3, 1.0, 1.0, -2.0], [2.0, 0.0, 1.9, 1.0]], dtype=torch.float64)
    np.testing.assert_allclose(torch.softmax(2000.0 * C, -1), sinkflow.hardmax(C), atol=1e-40 + 1e-12)


def test_hardmax_dtypes_and_gradients():
    C = torch.randn(3, 4, 5, dtype=torch.bfloat16, requires_grad=True)
    K = sinkflow.hardmax(C)
    assert K.dtype == torch.bfloat16 and not K.requires_grad
    assert torch.equal(K.float(), sinkflow.hardmax(C.detach().float()))
    with pytest.raises(TypeError, match="C must be a floating tensor"):
        sinkflow.hardmax(torch.ones(2, 2, dtype=torch.long))


def test_hardmax_variant_drives_particles_heat_and_models():
    assert "hardmax" in sinkflow.available_attentions()
    assert sinkflow.available_attentions()[:4] == ("softmax", "sinkhorn", "unnormalized", "gaussian")
    x0 = sinkflow.random_particles(6, 2, seed=0)
    traj = sinkflow.simulate(x0, "hardmax", h=0.1, steps=1)
    K = _oracle(x0 @ x0.T)
    np.testing.assert_allclose(traj.final, x0 + 0.1 * K @ x0, rtol=0, atol=1e-14)  # simulate's field: K x W_V
    assert traj.evaluation.name == "dense"
    x = np.random.default_rng(4).normal(size=(12, 1))
    assert np.array_equal(sinkflow.heat_flow(x, 0.01, 0.2, 0.005, "hardmax"), x)  # Gaussian scores: self wins
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out, W = scaled_attention(q, k, v, "hardmax")
    np.testing.assert_array_equal(W.numpy()[0], _oracle((q[0] @ k[0].T).numpy()))
    torch.testing.assert_close(out, W @ v)
    mha = MultiheadAttention(8, 2, batch_first=True, normalization="hardmax")
    x = torch.randn(2, 6, 8, generator=g, requires_grad=True)
    y, w = mha(x, x, x)
    y.sum().backward()  # forward works; gradients reach the inputs through the values only
    assert torch.allclose(w.sum(-1), torch.ones(2, 6)) and x.grad is not None
