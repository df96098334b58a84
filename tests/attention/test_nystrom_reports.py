"""Nyström variants report their row sums (and renormalize on request); the iterative inverses report their
convergence (``tol=``: residual ||I - S Z||_F, :class:`sinkflow.NystromWarning` naming ``n_iter``).

Oracles are written here in numpy, independently of sinkflow: segment means, SoftMax blocks and the Gaussian
kernel from their formulas, the pseudo-inverse by ``numpy.linalg.pinv``, residuals by ``numpy.linalg.norm``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import sinkflow


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _segment_means(x, m):
    n = x.shape[0]
    seg = np.arange(n) * m // n
    return np.stack([x[seg == s].mean(0) for s in range(m)])


def _nystromformer_dense(Q, K, m):
    """F pinv(A) B written from Xiong et al.'s formulas, with numpy's pseudo-inverse."""
    tau = math.sqrt(Q.shape[1])
    qm, km = _segment_means(Q, m), _segment_means(K, m)
    F, A, B = _softmax(Q @ km.T / tau), _softmax(qm @ km.T / tau), _softmax(qm @ K.T / tau)
    return F @ np.linalg.pinv(A, rcond=math.sqrt(np.finfo(float).eps)) @ B, A


def _gauss(x, y):
    d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    return np.exp(-d2 / (2 * math.sqrt(x.shape[1])))


def _data(n=48, p=8, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return tuple(scale * rng.standard_normal((n, p)) for _ in range(3))


# --------------------------------------------------------------------------- row sums
def test_nystromformer_row_sums_match_the_dense_oracle():
    """With the exact inverse the rows sum to 1 (A 1 = 1 gives A^{-1} 1 = 1, then F 1 = 1); with the iterative
    inverse Z they sum to 1 - F (I - Z A) 1: the row-sum error is the inverse's residual seen through F."""
    Q, K, _ = _data()
    dense, A = _nystromformer_dense(Q, K, 8)
    exact = sinkflow.nystromformer_factors(Q, K, 8, inverse="pinv")
    np.testing.assert_allclose(exact.row_sums(), dense.sum(-1), rtol=1e-8)
    np.testing.assert_allclose(exact.row_sums(), 1.0, rtol=1e-8)
    F = sinkflow.nystromformer_factors(Q, K, 8)  # the paper's 6 iterations
    Z = sinkflow.newton_schulz_pinv(A, n_iter=6)
    tau = math.sqrt(Q.shape[1])
    left = _softmax(Q @ _segment_means(K, 8).T / tau)
    expected = 1 - left @ ((np.eye(8) - Z @ A) @ np.ones(8))
    np.testing.assert_allclose(F.row_sums(), expected, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(F.row_sums(), F.matrix().sum(-1), rtol=1e-8, atol=1e-10)
    assert np.abs(F.row_sums() - 1).max() > 1e-3  # 6 iterations: rows do not sum to 1 (Nystromformer issue 14)


def test_skyformer_row_sums_match_the_dense_oracle():
    Q, K, _ = _data(n=12, p=4, seed=1)
    idx = np.array([0, 3, 7, 13, 18, 22])  # landmarks among the 24 stacked points
    X = np.concatenate([Q, K])
    dense = _gauss(Q, X[idx]) @ np.linalg.pinv(_gauss(X[idx], X[idx])) @ _gauss(X[idx], K)
    F = sinkflow.nystrom_factors(Q, K, idx)
    np.testing.assert_allclose(F.row_sums(), dense.sum(-1), rtol=1e-6, atol=1e-9)
    # Skyformer's target is the exact kernel's row sums C 1, not 1
    exact = sinkflow.kernelized_attention(Q, K, np.ones((12, 1)))[:, 0]
    np.testing.assert_allclose(exact, _gauss(Q, K).sum(-1), rtol=1e-10)


def test_row_sums_torch_batched_keeps_dtype():
    q, k = torch.randn(2, 3, 32, 8), torch.randn(2, 3, 32, 8)
    F = sinkflow.nystromformer_factors(q, k, 8)
    rs = F.row_sums()
    assert rs.shape == (2, 3, 32) and rs.dtype == torch.float32
    torch.testing.assert_close(rs, F.matrix().sum(-1), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- renormalize
@pytest.mark.parametrize("inverse", ["pinv", "iterative"])
def test_nystromformer_renormalize_divides_rows_by_their_sums(inverse):
    Q, K, V = _data(seed=2)
    F = sinkflow.nystromformer_factors(Q, K, 8, inverse=inverse)
    M = F.matrix()
    expected = (M @ V) / M.sum(-1, keepdims=True)
    out = sinkflow.nystromformer_attention(Q, K, V, 8, inverse=inverse, renormalize=True)
    np.testing.assert_allclose(out, expected, rtol=1e-8, atol=1e-10)
    ones = sinkflow.nystromformer_attention(Q, K, np.ones((48, 3)), 8, inverse=inverse, renormalize=True)
    np.testing.assert_allclose(ones, 1.0, rtol=0, atol=1e-12)  # rows sum to 1 to rounding
    # default output unchanged
    np.testing.assert_allclose(sinkflow.nystromformer_attention(Q, K, V, 8, inverse=inverse), M @ V, rtol=1e-8,
                               atol=1e-10)


def test_nystromformer_renormalize_against_numpy_pinv_oracle():
    Q, K, V = _data(seed=3)
    dense, _ = _nystromformer_dense(Q, K, 8)
    out = sinkflow.nystromformer_attention(Q, K, V, 8, inverse="pinv", renormalize=True)
    np.testing.assert_allclose(out, dense @ V / dense.sum(-1, keepdims=True), rtol=1e-6, atol=1e-8)


def test_skyformer_renormalize_and_torch_half():
    Q, K, V = _data(n=24, p=4, seed=4, scale=0.5)
    F = sinkflow.nystrom_factors(Q, K, np.arange(0, 48, 3))
    M = F.matrix()
    out = sinkflow.nystrom_attention(Q, K, V, np.arange(0, 48, 3), renormalize=True)
    np.testing.assert_allclose(out, (M @ V) / M.sum(-1, keepdims=True), rtol=1e-7, atol=1e-9)
    q, k, v = (torch.tensor(a, dtype=torch.bfloat16) for a in (Q, K, np.ones_like(V)))
    half = sinkflow.nystrom_attention(q, k, v, 16, generator=0, inverse="iterative", renormalize=True)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), torch.ones(24, 4), rtol=0, atol=2e-2)


# --------------------------------------------------------------------------- residuals and warnings
def test_inverse_residual_matches_numpy():
    rng = np.random.default_rng(5)
    M = rng.random((3, 6, 6)) + 6 * np.eye(6)
    Z = sinkflow.newton_schulz_pinv(M, n_iter=3)
    expected = [np.linalg.norm(np.eye(6) - M[i] @ Z[i]) for i in range(3)]
    np.testing.assert_allclose(sinkflow.inverse_residual(M, Z), expected, rtol=1e-10)
    Zg = sinkflow.iterative_inverse(M, n_iter=3, gamma=0.5)
    expected = [np.linalg.norm(np.eye(6) - (M[i] + 0.5 * np.eye(6)) @ Zg[i]) for i in range(3)]
    np.testing.assert_allclose(sinkflow.inverse_residual(M, Zg, gamma=0.5), expected, rtol=1e-10)
    np.testing.assert_allclose(sinkflow.inverse_residual(M, np.linalg.inv(M)), 0, atol=1e-12)


def _ill_block(cond=1e4, m=8, seed=6):
    """A SoftMax-like landmark block with a planted condition number: orthogonal x diag x orthogonal."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((m, m)))
    W, _ = np.linalg.qr(rng.standard_normal((m, m)))
    return U @ np.diag(np.geomspace(1, 1 / cond, m)) @ W.T


def test_ill_conditioned_block_six_iterations_warn_and_name_n_iter():
    A = _ill_block()
    with pytest.warns(sinkflow.NystromWarning, match=r"n_iter = 6") as rec:
        Z = sinkflow.newton_schulz_pinv(A, tol=1e-3)
    assert np.linalg.norm(np.eye(8) - A @ Z) > 1  # the oracle agrees: far from inverted
    assert "n_iter >= 12" in str(rec[0].message)  # residual >= 1: the norm bounds nothing, so "try 2 n_iter"
    Z40 = sinkflow.newton_schulz_pinv(A, n_iter=40)  # enough: numpy's pinv
    np.testing.assert_allclose(Z40, np.linalg.pinv(A), rtol=1e-6, atol=1e-6 * np.abs(np.linalg.pinv(A)).max())


def test_suggested_count_reaches_tol():
    A = _ill_block(cond=30)
    n0 = 6
    rho = np.linalg.norm(np.eye(8) - A @ sinkflow.newton_schulz_pinv(A, n_iter=n0))
    assert 1e-6 < rho < 1  # the regime where the bound holds
    with pytest.warns(sinkflow.NystromWarning) as rec:
        sinkflow.newton_schulz_pinv(A, n_iter=n0, tol=1e-8)
    count = int(str(rec[0].message).split("n_iter = ")[-1].split()[0])
    assert count > n0
    Z = sinkflow.newton_schulz_pinv(A, n_iter=count)
    assert np.linalg.norm(np.eye(8) - A @ Z) <= 1e-8
    np.testing.assert_allclose(Z, np.linalg.pinv(A), atol=1e-7 * np.abs(np.linalg.pinv(A)).max())


def test_converged_inverse_does_not_warn():
    A = _ill_block(cond=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Z = sinkflow.newton_schulz_pinv(A, n_iter=12, tol=1e-6)
        P = 3 * np.random.default_rng(9).standard_normal((8, 4))  # spread points: a well-conditioned Gaussian block
        Zg = sinkflow.iterative_inverse(_gauss(P, P), n_iter=12, gamma=0.1, tol=1e-6)
    np.testing.assert_allclose(Zg, np.linalg.inv(_gauss(P, P) + 0.1 * np.eye(8)), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(Z, np.linalg.pinv(A), atol=1e-9)


def test_iterative_inverse_warns_iff_scaled_residual_exceeds_tol():
    Q, K, _ = _data(n=16, p=4, seed=7, scale=0.3)  # close points: an ill-conditioned Gaussian block
    X = np.concatenate([Q, K])
    M = _gauss(X[:12], X[:12])
    R = M + 0.1 * np.eye(12)
    s = 1 / np.sqrt(R.sum(-1))
    S = s[:, None] * R * s[None, :]
    Z = sinkflow.iterative_inverse(M, n_iter=6, gamma=0.1)
    rho = np.linalg.norm(np.eye(12) - S @ (Z / s[:, None] / s[None, :]))  # Z_S = D^{1/2} Z D^{1/2}
    assert rho > 1e-3
    with pytest.warns(sinkflow.NystromWarning, match="iterative_inverse"):
        sinkflow.iterative_inverse(M, n_iter=6, gamma=0.1, tol=0.99 * rho)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sinkflow.iterative_inverse(M, n_iter=6, gamma=0.1, tol=1.01 * rho)
    np.testing.assert_array_equal(out, Z)  # the check changes nothing


def test_nystromformer_paper_settings_do_not_converge_on_lra_like_inputs():
    """The measurement docs/theory/nystrom.md reports: m = 64 segment means, p = 32, n = 1024, 6 iterations."""
    rng = np.random.default_rng(8)
    Q, K = rng.standard_normal((2, 1024, 32))
    A = sinkflow.landmark_block(Q, K, 64, kind="softmax")
    rho = np.linalg.norm(np.eye(64) - A @ sinkflow.newton_schulz_pinv(A, n_iter=6))
    assert rho > 5  # of at most sqrt(64) = 8: nearly nothing inverted
    assert np.linalg.cond(A) > 1e4
    with pytest.warns(sinkflow.NystromWarning):
        sinkflow.nystromformer_attention(Q, K, Q, 64, tol=0.1)


def test_tol_is_validated_and_skipped_when_branch_free(monkeypatch):
    """Under torch.compile / torch.func (``branch_free()``) the check reads no data: no warning, same result."""
    with pytest.raises(ValueError, match="tol"):
        sinkflow.newton_schulz_pinv(np.eye(2), tol=-1)
    from sinkflow.attention import _inverses

    A = torch.tensor(_ill_block())
    monkeypatch.setattr(_inverses, "branch_free", lambda: True)
    monkeypatch.setattr(_inverses, "_residual", None)  # would raise if called
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sinkflow.newton_schulz_pinv(A, tol=1e-3)
    monkeypatch.undo()
    torch.testing.assert_close(out, sinkflow.newton_schulz_pinv(A))


@pytest.mark.parametrize("normalization", ["skyformer", "nystromformer"])
def test_model_forward_never_warns(normalization):
    torch.manual_seed(0)
    mha = sinkflow.nn.MultiheadAttention(16, 2, batch_first=True, normalization=normalization, landmarks=8)
    x = torch.randn(2, 64, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sinkflow.NystromWarning)
        mha(x, x, x)


def test_tol_and_renormalize_compile_in_one_graph():
    """torch.compile(fullgraph=True) (backend "eager": dynamo's tracing, where a branch on data breaks the graph):
    the check is skipped, no warning, eager's numbers."""
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 2, 64, 8)
    f = torch.compile(lambda q, k, v: sinkflow.nystromformer_attention(q, k, v, 8, tol=1e-3, renormalize=True),
                      fullgraph=True, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", sinkflow.NystromWarning)
        out = f(q, k, v)
    torch.testing.assert_close(out, sinkflow.nystromformer_attention(q, k, v, 8, renormalize=True))


def test_half_precision_tol_below_rounding_is_said():
    A = torch.tensor(_ill_block(cond=3), dtype=torch.float16)
    with pytest.warns(sinkflow.NystromWarning, match="rounding"):
        out = sinkflow.newton_schulz_pinv(A, n_iter=12, tol=1e-9)
    assert out.dtype == torch.float16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sinkflow.newton_schulz_pinv(A, n_iter=12, tol=0.05)
