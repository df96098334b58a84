"""sinkhorn_prefix (issue 44, item 4): row i from the balanced plan of tokens 0..i.

Oracle: a plain numpy Sinkhorn on each prefix alone, with the causal mask and the closed-form key targets
of uniform attention (uniform weights: beta_j = (1/k) sum_{r >= j} 1/(r+1) on a prefix of k tokens), run
until its marginals are exact to 1e-13; its plan is doubly stochastic in that sense (checked), and the
variant's row i must equal the oracle plan's last row.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sinkflow
from sinkflow.attention import prefix_sinkhorn

D = torch.float64


def _oracle_plan(C, w=None):
    """Balanced plan of the causal problem on scores C (k x k): rows sum to 1, a^T P = beta (exact)."""
    k = C.shape[0]
    w = np.full(k, 1.0 / k) if w is None else w / w.sum()
    M = np.tril(np.ones((k, k)))
    beta = w * ((w / (M @ w)) @ M)  # uniform attention's column marginal, weighted
    beta /= beta.sum()
    K = np.exp(C - C.max()) * M
    for _ in range(100_000):
        K /= K.sum(1, keepdims=True)
        K *= beta / (w @ K)
        if np.abs(K.sum(1) - 1).max() < 1e-13:
            break
    K /= K.sum(1, keepdims=True)
    return K, w, beta


def _scores(n, seed=0):
    return torch.randn(n, n, dtype=D, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("weighted", [False, True])
def test_rows_are_the_prefix_plans(weighted):
    n = 7
    C = _scores(n)
    w = torch.rand(n, dtype=D, generator=torch.Generator().manual_seed(3)) + 0.2 if weighted else None
    K = prefix_sinkhorn(C, tol=1e-12, weights=w).attention
    for i in range(n):
        P, a, beta = _oracle_plan(C[:i + 1, :i + 1].numpy(), None if w is None else w[:i + 1].numpy())
        np.testing.assert_allclose(P.sum(1), 1, atol=1e-12)  # the prefix plan is balanced (the oracle's check)
        np.testing.assert_allclose(a @ P, beta, atol=1e-12)
        np.testing.assert_allclose(K[i, :i + 1].numpy(), P[i], atol=1e-9)
        assert not K[i, i + 1:].any()


def test_fixed_n_iter_is_the_solver_on_each_prefix():
    n = 6
    C = _scores(n, 1)
    K = prefix_sinkhorn(C, n_iter=4).attention
    for i in range(n):
        ref = sinkflow.sinkhorn(C[:i + 1, :i + 1], n_iter=4, mask=torch.ones(i + 1, i + 1, dtype=torch.bool).tril())
        torch.testing.assert_close(K[i, :i + 1], ref[i], rtol=1e-12, atol=1e-12)


def test_global_causal_sinkhorn_differs_but_the_last_row_agrees():
    """The last prefix is the whole sequence: its row is the global plan's; earlier rows differ (the leak)."""
    n = 6
    C = _scores(n, 2)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    K, G = prefix_sinkhorn(C, tol=1e-12).attention, sinkflow.sinkhorn(C, tol=1e-12, mask=mask)
    torch.testing.assert_close(K[-1], G[-1], rtol=0, atol=1e-9)
    assert float((K[:-1] - G[:-1]).abs().max()) > 1e-3


def test_refuses_non_square_scores():
    with pytest.raises(ValueError, match="square"):
        prefix_sinkhorn(torch.zeros(3, 4, dtype=D))


def test_batched_and_warm_started():
    C = torch.stack([_scores(5, s) for s in range(3)])
    res = prefix_sinkhorn(C, tol=1e-11)
    assert res.g.shape == (3, 5, 5) and res.converged
    warm = prefix_sinkhorn(C + 1e-3, tol=1e-11, init_g=res.g)
    cold = prefix_sinkhorn(C + 1e-3, tol=1e-11)
    torch.testing.assert_close(warm.attention, cold.attention, rtol=0, atol=1e-9)
    assert warm.n_iter < cold.n_iter


def test_self_weight_is_one_over_i():
    """Closed form: token i is the last key of its prefix, seen by row i alone, so a_i K_ii = beta_i
    = (1/i)(1/i) (tokens from 1): K_ii = 1/i whatever the scores (to tolerance). With and without warm starts."""
    C = 3 * _scores(9, 4)
    for warm in (True, False):
        K = prefix_sinkhorn(C, tol=1e-12, warm_start=warm).attention
        torch.testing.assert_close(K.diagonal(), 1 / torch.arange(1, 10, dtype=D), rtol=0, atol=1e-10)
