"""Skyformer's low-rank operator after its speed-up: the spectral Newton-Schulz inverse, the one-pass
kernel-block backward and the byte-wise padding-mask split give the official algorithm's outputs
and gradients (oracle: a plain re-implementation of its loop, differentiated by autograd)."""

import pytest
import torch

import sinkflow
from sinkflow.attention import _inverses, _variants
from sinkflow.attention._nystrom import _kernel_block


def official_loop(q, k, v, landmarks, n_iter=6, gamma=0.1):
    """Skyformer's code path written out plainly: stacked scaled points, dense kernel, ridge, symmetric
    row-sum scaling, n_iter cubic Newton-Schulz products from S^T / max column sum."""
    p = q.shape[-1]
    x = torch.cat([q, k], -2) * p ** -0.25
    xj = x[..., landmarks, :]
    kern = torch.exp(-torch.cdist(x, xj).square() / 2)
    n = q.shape[-2]
    r = torch.exp(-torch.cdist(xj, xj).square() / 2) + gamma * torch.eye(len(landmarks), dtype=q.dtype)
    d = r.sum(-1).rsqrt()
    S = d[..., :, None] * r * d[..., None, :]
    Z = S.transpose(-1, -2) / S.sum(-2).amax(-1)[..., None, None]
    eye = torch.eye(S.shape[-1], dtype=q.dtype)
    for _ in range(n_iter):
        SZ = S @ Z
        Z = 0.25 * Z @ (13 * eye - SZ @ (15 * eye - SZ @ (7 * eye - SZ)))
    W = d[..., :, None] * Z * d[..., None, :]
    return kern[..., :n, :] @ (W @ (kern[..., n:, :].transpose(-1, -2) @ v))


def _problem(dtype, seed, n=24, p=8, m=20, duplicates=False):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, n, p, generator=gen, dtype=dtype) for _ in range(3))
    landmarks = torch.randint(0, 2 * n, (m,), generator=gen)
    if duplicates:  # sampling with replacement repeats landmarks: repeated eigenvalues of the block
        landmarks[1] = landmarks[0]
        landmarks[5] = landmarks[0]
    return q, k, v, landmarks


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-11), (torch.float32, 1e-4)])
@pytest.mark.parametrize("duplicates", [False, True])
def test_outputs_and_gradients_equal_the_official_loop(dtype, tol, duplicates):
    q, k, v, landmarks = _problem(dtype, 0, duplicates=duplicates)
    G = torch.randn(2, 3, 24, 8, generator=torch.Generator().manual_seed(1), dtype=dtype)
    results = []
    for fn in (lambda *a: sinkflow.nystrom_attention(*a, landmarks, inverse="iterative"),
               lambda *a: official_loop(*a, landmarks)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        results.append((out.detach(), *torch.autograd.grad((out * G).sum(), leaves)))
    for ours, theirs in zip(*results, strict=True):
        assert float((ours - theirs).abs().max() / theirs.abs().max()) <= tol


def _plain_iteration(M, n_iter, gamma, c_of=lambda S: S.sum(-2).amax(-1)):
    r = M + gamma * torch.eye(M.shape[-1], dtype=M.dtype)
    d = r.sum(-1).rsqrt()
    S = d[..., :, None] * r * d[..., None, :]
    Z = S.transpose(-1, -2) / c_of(S)[..., None, None]
    eye = torch.eye(S.shape[-1], dtype=M.dtype)
    for _ in range(n_iter):
        SZ = S @ Z
        Z = 0.25 * Z @ (13 * eye - SZ @ (15 * eye - SZ @ (7 * eye - SZ)))
    return d[..., :, None] * Z * d[..., None, :]


@pytest.mark.parametrize("n_iter", [0, 1, 3, 6, 12])
def test_spectral_inverse_is_the_iteration_with_its_gradient_in_every_direction(n_iter):
    # A gradient G that is not symmetric and an input block treated entry by entry (M[i, j] and M[j, i]
    # independent): the skew part of the derivative counts too.
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 16, 4, generator=gen, dtype=torch.float64)
    x[:, 3] = x[:, 7]  # a repeated landmark
    M = _kernel_block(x, x, 4)
    G = torch.randn(3, 16, 16, generator=gen, dtype=torch.float64)
    assert _inverses._spectral(M)
    grads = []
    for fn in (lambda a: _inverses._iterative_inverse(a, n_iter, 0.1), lambda a: _plain_iteration(a, n_iter, 0.1)):
        leaf = M.clone().requires_grad_()
        Z = fn(leaf)
        grads.append((Z.detach(), torch.autograd.grad((Z * G).sum(), leaf)[0]))
    (Z1, g1), (Z2, g2) = grads
    torch.testing.assert_close(Z1, Z2, rtol=1e-11, atol=1e-12 * float(Z2.abs().max()))
    torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-11 * float(g2.abs().max()))


def test_non_symmetric_blocks_keep_the_products():
    M = torch.rand(2, 6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 1
    assert not _inverses._spectral(M)
    torch.testing.assert_close(sinkflow.iterative_inverse(M), _plain_iteration(M, 6, 0.1), rtol=1e-12, atol=0)


def test_kernel_block_backward_against_finite_differences():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 7, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(1, 9, 5, generator=gen, dtype=torch.float64, requires_grad=True)  # broadcast batch
    assert torch.autograd.gradcheck(lambda a, b: _kernel_block(a, b, 5), (x, y))
    assert torch.autograd.gradcheck(lambda a: _kernel_block(a, a, 5), (x,))  # the landmark block of x with itself
    torch.testing.assert_close(_kernel_block(x, y, 5), torch.exp(-torch.cdist(x, y).square() / (2 * 5**0.5)),
                               rtol=1e-12, atol=1e-14)


def test_padding_mask_split_against_its_definition():
    gen = torch.Generator().manual_seed(5)
    for trial in range(60):
        q, k = (torch.rand(2, 1, size, generator=gen) < 0.6 for size in (5, 7))
        mask = q[..., :, None] & k[..., None, :]
        if trial % 2:  # one flipped entry: no longer an outer product (unless the flip is undone by the any's)
            mask = mask.clone()
            mask.view(-1)[int(torch.randint(0, mask.numel(), (1,), generator=gen))] ^= True
        outer = bool((mask == (mask.any(-1, keepdim=True) & mask.any(-2, keepdim=True))).all())
        if outer:
            queries, keys = _variants._padding_masks(mask, 5, 7)
            assert torch.equal(queries, mask.any(-1, keepdim=True)) and torch.equal(keys, mask.any(-2, keepdim=True))
        else:
            with pytest.raises(NotImplementedError, match="padding masks only"):
                _variants._padding_masks(mask, 5, 7)


def test_second_derivatives_through_the_operator_against_finite_differences():
    # create_graph (Hessian-vector products, torch.func.hessian): the spectral inverse's backward then
    # differentiates the products themselves; the kernel blocks' backward is made of differentiable ops.
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 6, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(1, 4, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda a: _inverses._iterative_inverse(_kernel_block(a, a, 2), 3, 0.1), (x,))
    assert torch.autograd.gradgradcheck(lambda a, b: _kernel_block(a, b, 2), (x, y))
