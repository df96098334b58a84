"""Plain re-implementations written from the formulas, used as independent oracles by the tests.

Nothing here calls sinkflow: every function is a few lines of numpy/scipy that a reader can
check against the definitions in docs/theory (and the boolean mask patterns, in torch, that
the attention tests share, and the count of bytes autograd saves for backward).
"""

import numpy as np
import torch
from scipy.special import logsumexp


def sinkhorn_log(C, n_half, a=None, b=None, g0=None):
    """``K = exp(f_i + C_ij + g_j)`` after exactly ``n_half`` half-iterations (row step first).

    Row step: ``f_i = -logsumexp_j(C_ij + g_j)``; column step:
    ``g_j = log b_j - logsumexp_i(log a_i + f_i + C_ij)``. Everything stays in the log
    domain (no exponential of an unshifted score), so it is exact at any temperature.
    Returns ``(K, f, g)``.
    """
    C = np.asarray(C, dtype=np.float64)
    n, m = C.shape
    a = np.full(n, 1.0 / n) if a is None else np.asarray(a, dtype=np.float64)
    b = np.full(m, 1.0 / m) if b is None else np.asarray(b, dtype=np.float64)
    f = np.zeros(n)
    g = np.zeros(m) if g0 is None else np.asarray(g0, dtype=np.float64).copy()
    for k in range(n_half):
        if k % 2 == 0:
            f = -logsumexp(C + g[None, :], axis=1)
        else:
            g = np.log(b) - logsumexp(np.log(a)[:, None] + f[:, None] + C, axis=0)
    return np.exp(f[:, None] + C + g[None, :]), f, g


def uniform_attention_marginal(mask, a=None):
    """Column marginal ``a^T U`` of uniform attention ``U = mask / (row counts)``: the key targets
    of masked Sinkhorn attention (plain numpy; rows with no admissible key carry no weight)."""
    M = np.asarray(mask, dtype=np.float64)
    counts = M.sum(-1, keepdims=True)
    U = np.divide(M, counts, out=np.zeros_like(M), where=counts > 0)
    a = np.ones(M.shape[-2]) if a is None else np.asarray(a, dtype=np.float64)
    a = a * (counts[..., 0] > 0)
    return np.einsum("...i,...ij->...j", a / a.sum(-1, keepdims=True), U)


def kl(p, q):
    """Kullback-Leibler divergence of two non-negative arrays of equal total mass (0 log 0 = 0)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    s = p > 0
    return float(np.sum(p[s] * np.log(p[s] / q[s])))


def mask_patterns(shape, g):
    """None, key padding, key and query padding, causal, a random pattern and an empty row."""
    n, m = shape[-2:]
    keys = torch.rand(shape[:-2] + (1, m), generator=g) > 0.3
    keys[..., 0] = True
    queries = torch.rand(shape[:-2] + (n, 1), generator=g) > 0.3
    empty_row = torch.ones(shape, dtype=torch.bool)
    empty_row[..., 1, :] = False
    return {"none": None, "keys": keys, "keys+queries": keys & queries,
            "causal": torch.ones(n, m, dtype=torch.bool).tril(), "random": torch.rand(shape, generator=g) > 0.4,
            "empty row": empty_row}


def saved_bytes(fn):
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs (a saved-tensors hook)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]
