"""Causality in information of every registered attention (issue 44, item 4).

With a causal mask, perturbing tokens after position ``i`` must leave the outputs of tokens ``0..i``
unchanged (to rounding) on every path: the functional :func:`sinkflow.nn.scaled_attention` (the matrix
path and the fused / output path), :class:`sinkflow.nn.MultiheadAttention` (``is_causal``) and the particle
flows (``simulate(..., causal=True)``), or the variant must refuse the causal mask. The oracle is the
definition itself: the same call on a sequence that differs only after ``i``.

Causal Sinkhorn (``"sinkhorn"``) is NOT causal in information (its column scalings sum over every query):
the test asserts the leak, so that the documentation stays honest. ``"sinkhorn_prefix"`` is.
"""

from __future__ import annotations

import pytest
import torch

import sinkflow
from sinkflow.attention._variants import _REGISTRY
from sinkflow.nn import MultiheadAttention, scaled_attention

D = torch.float64
N, LAST = 7, 3  # tokens; positions 0..LAST must not see the perturbation of LAST+1..N-1
ROUNDING = 1e-12
LEAKS = {"sinkhorn"}  # global column scalings: a documented leak


@pytest.fixture(scope="module", autouse=True)
def user_variant():
    """A variant a user registers (a callable on dense scores): a sharpened masked SoftMax."""
    def sharp(C, n_iter, mask):
        return torch.softmax((2 * C).masked_fill(~mask, -torch.inf) if mask is not None else 2 * C, -1)
    sinkflow.register_attention("user_sharp_softmax", sharp, overwrite=True)
    yield
    _REGISTRY.pop("user_sharp_softmax", None)


VARIANTS = [*sinkflow.available_attentions(), "user_sharp_softmax"]
VARIANTS = list(dict.fromkeys(VARIANTS))


def _pair(shape, seed=0):
    """Two inputs equal on tokens 0..LAST and different after (the token axis is -2)."""
    x = torch.randn(shape, dtype=D, generator=torch.Generator().manual_seed(seed))
    y = x.clone()
    y[..., LAST + 1:, :] += torch.randn(y[..., LAST + 1:, :].shape, dtype=D, generator=torch.Generator().manual_seed(9))
    return x, y


def _causal():
    return torch.ones(N, N, dtype=torch.bool).tril()


def _run(path, variant, x):
    if path == "functional":  # the matrix path
        return scaled_attention(x, x, x, variant, n_iter=5, mask=_causal(), landmarks=4)[0]
    if path == "fused":  # need_weights=False: the fused / output-only path where one exists
        return scaled_attention(x, x, x, variant, n_iter=5, mask=_causal(), landmarks=4, need_weights=False)[0]
    if path == "module":
        torch.manual_seed(0)
        mha = MultiheadAttention(4, 2, batch_first=True, normalization=variant, n_iter=5, landmarks=4).to(D)
        return mha(x, x, x, need_weights=False, is_causal=True, attn_mask=~_causal())[0]  # torch: True = masked
    x = x / x.norm(dim=-1, keepdim=True)
    return sinkflow.simulate(x, variant, h=0.1, steps=3, causal=True, manifold="sphere", n_iter=5).final


def _leak(path, variant):
    shape = (2, N, 4) if path != "particles" else (N, 3)
    x, y = _pair(shape)
    try:
        out_x, out_y = _run(path, variant, x), _run(path, variant, y)
    except (ValueError, NotImplementedError, RuntimeError) as refusal:
        return refusal
    assert torch.isfinite(out_x).all()
    return float((out_x[..., :LAST + 1, :] - out_y[..., :LAST + 1, :]).detach().abs().max())


@pytest.mark.parametrize("path", ["functional", "fused", "module", "particles"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_prefix_outputs_do_not_see_later_tokens(variant, path):
    leak = _leak(path, variant)
    if isinstance(leak, Exception):  # a refusal must say why
        assert any(w in str(leak).lower() for w in ("mask", "causal", "landmark")), leak
        return
    if variant in LEAKS:
        assert leak > 1e-6, f"{variant} on {path} is documented as leaking but did not"
    else:
        assert leak <= ROUNDING, f"{variant} on {path}: tokens 0..{LAST} moved by {leak:.3g}"


def test_the_test_sees_a_leak():
    """Planted: unmasked SoftMax attends to later tokens; the measure must see it."""
    x, y = _pair((2, N, 4))
    out_x, out_y = (scaled_attention(t, t, t, "softmax")[0] for t in (x, y))
    assert float((out_x[..., :LAST + 1, :] - out_y[..., :LAST + 1, :]).abs().max()) > 1e-3
