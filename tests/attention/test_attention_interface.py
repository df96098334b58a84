"""One attention interface: the registry drives particles, the heat layer and models alike."""

import math

import numpy as np
import pytest
import torch

import sinkflow
from sinkflow.heat._heat_velocity import heat_velocity
from sinkflow.nn import MultiheadAttention, scaled_attention


def _half_temperature_softmax(C, n_iter=None, mask=None):
    """A user's variant, written without sinkflow: row softmax of C / 2."""
    C = C / 2
    if mask is not None:
        C = C.masked_fill(~mask, -math.inf)
    return torch.softmax(C, dim=-1)


@pytest.fixture(scope="module")
def user_variant():
    return sinkflow.register_attention("half_softmax", _half_temperature_softmax, overwrite=True)


def test_registered_variant_moves_particles_like_softmax_at_double_temperature(user_variant):
    x0 = sinkflow.random_particles(12, 2, seed=3)
    mine = sinkflow.simulate(x0, "half_softmax", h=0.05, steps=5).final
    oracle = sinkflow.simulate(x0, "softmax", h=0.05, steps=5, temperature=2.0).final
    np.testing.assert_allclose(mine, oracle, rtol=0, atol=1e-12)


def test_registered_variant_drives_the_heat_layer(user_variant):
    x = np.random.default_rng(4).normal(size=(30, 1))
    # Gaussian scores / eps halved = scores / (2 eps); the layer's prefactor is 2/eps
    np.testing.assert_allclose(heat_velocity(x, 0.2, "half_softmax"),
                               2 * heat_velocity(x, 0.4, "softmax_gaussian"), rtol=1e-12, atol=1e-12)
    x1 = sinkflow.heat_flow(x, 0.01, 0.2, 0.005, "half_softmax")
    assert np.isfinite(x1).all() and not np.allclose(x1, x)


def test_registered_variant_runs_in_multihead_attention(user_variant):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out, K = scaled_attention(q, k, v, "half_softmax")
    oracle = torch.softmax(q @ k.transpose(-1, -2) / (2 * math.sqrt(4)), dim=-1)
    torch.testing.assert_close(K, oracle)
    torch.testing.assert_close(out, oracle @ v)
    mha = MultiheadAttention(8, 2, batch_first=True, normalization="half_softmax")
    x = torch.randn(2, 6, 8, generator=g)
    y, w = mha(x, x, x)
    assert y.shape == (2, 6, 8) and torch.allclose(w.sum(-1), torch.ones(2, 6))


def test_strings_and_variants_are_interchangeable():
    x0 = sinkflow.random_particles(10, 2, seed=1)
    by_name = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=3, n_iter=5).final
    by_variant = sinkflow.simulate(x0, sinkflow.get_attention("sinkhorn"), h=0.05, steps=3, n_iter=5).final
    np.testing.assert_array_equal(by_name, by_variant)
    assert set(sinkflow.nn.available_normalizations()) == set(sinkflow.available_attentions())


def test_registry_errors_are_clear(user_variant):
    with pytest.raises(ValueError, match="already registered"):
        sinkflow.register_attention("softmax", _half_temperature_softmax)
    with pytest.raises(ValueError, match="attention must be one of"):
        sinkflow.simulate(np.zeros((3, 2)), "no_such_attention")
    with pytest.raises(ValueError, match="no block-wise evaluation"):
        sinkflow.simulate(np.eye(3), "half_softmax", steps=1, chunked=True)
    with pytest.raises(ValueError, match="pass landmarks"):
        sinkflow.simulate(np.eye(3), "skyformer", steps=1)
    with pytest.raises(ValueError, match="give normalize"):
        sinkflow.register_attention("empty")
    bad = sinkflow.register_attention("bad_shape", lambda C, n_iter, mask: C[:1], overwrite=True)
    with pytest.raises(ValueError, match="scores' shape"):
        sinkflow.simulate(np.eye(3), bad, steps=1)


def test_output_only_normalization_still_registers_for_models():
    sinkflow.nn.register_normalization("value_mean", lambda q, k, v, mask, n_iter: v.mean(-2, keepdim=True).expand(
        *q.shape[:-1], v.shape[-1]), overwrite=True)
    x = torch.ones(1, 3, 8)
    out, w = MultiheadAttention(8, 2, batch_first=True, normalization="value_mean")(x, x, x)
    assert out.shape == (1, 3, 8) and w is None
    with pytest.raises(ValueError, match="normalize"):
        sinkflow.simulate(np.eye(3), "value_mean", steps=1)
