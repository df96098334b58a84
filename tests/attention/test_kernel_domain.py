"""Kernel-domain half-iterations with absorption equal the materialized log-stable loop.

The no-autograd path (``sinkflow.attention``) keeps ``P = diag(u) K diag(v)`` and does one
matrix-vector product per half-step; the oracle is the materialized loop it replaced (still the
autograd path, selected here with ``_KERNEL_DOMAIN = False``) and the plain log-domain loop of
``oracles.sinkhorn_log`` (float64 numpy).
"""

import math

import numpy as np
import pytest
import torch

import sinkflow.attention._operators as steps
from oracles import sinkhorn_log
from sinkflow import solve_sinkhorn

# float rounding of the two summation orders at a fixed n_iter, measured over these cases: float32
# <= 6.4e-6 (scores x1000 with zero and uneven weights, 41 half-steps; 8e-7 uniform), float64 <= 1e-13
ROUNDING = {torch.float32: 2e-5, torch.float64: 5e-13}


def both_paths(monkeypatch, C, **kw):
    kernel = solve_sinkhorn(C, warn=False, **kw)
    monkeypatch.setattr(steps, "_KERNEL_DOMAIN", False)
    materialized = solve_sinkhorn(C, warn=False, **kw)
    monkeypatch.setattr(steps, "_KERNEL_DOMAIN", True)
    return kernel, materialized


def case(kind, dtype, scale, gen):
    C = torch.randn(2, 14, 11, generator=gen, dtype=torch.float64) * scale
    kw = {}
    if kind in ("mask", "all"):
        mask = torch.rand(2, 14, 11, generator=gen) < 0.8
        mask[0, 3] = False  # a query with no key
        kw["mask"] = mask
    if kind in ("weights", "all"):
        a, b = torch.rand(14, generator=gen, dtype=torch.float64), torch.rand(2, 11, generator=gen, dtype=torch.float64)
        a[5], b[1, 2] = 0, 0  # zero weights, one in a batch entry
        kw["a"], kw["b"] = (a / a.sum()).to(dtype), (b / b.sum(-1, keepdim=True)).to(dtype)
    return C.to(dtype), kw


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["plain", "mask", "weights", "all"])
@pytest.mark.parametrize("scale", [1.0, 10.0, 1000.0])
@pytest.mark.parametrize("n_iter", [2, 3, 8, 41, None])
def test_kernel_domain_equals_the_materialized_loop(monkeypatch, dtype, kind, scale, n_iter):
    C, kw = case(kind, dtype, scale, torch.Generator().manual_seed(int(scale) + 7 * len(kind)))
    kernel, materialized = both_paths(monkeypatch, C, n_iter=n_iter, **kw)
    assert torch.isfinite(kernel.attention).all()
    # to tolerance both stop within tol of the fixed point (float32 x1000: 4.7e-5 apart, each ~3e-5 from
    # float64): entries of a line of weight a_i may move by tol / a_i
    atol = ROUNDING[dtype] if n_iter else 10 * C.shape[-2] * kernel.tol
    torch.testing.assert_close(kernel.attention, materialized.attention, rtol=0, atol=atol)
    # the same cost; to tolerance in float32 rounding may move the stop by a half-step or two (343 vs 342)
    slack = 0 if n_iter or dtype == torch.float64 else 2
    assert abs(kernel.n_iter - materialized.n_iter) <= slack
    assert abs(len(kernel.errors) - len(materialized.errors)) <= slack
    assert kernel.converged == materialized.converged
    # exactly zero where excluded (mask, lines of weight 0), in both, at every scale
    excluded = torch.zeros(C.shape, dtype=torch.bool)
    if "mask" in kw:
        excluded |= ~kw["mask"]
    if "a" in kw:
        excluded |= (kw["a"] == 0)[None, :, None] | (kw["b"] == 0)[:, None, :]
    assert not kernel.attention[excluded].any() and not materialized.attention[excluded].any()
    # Elsewhere the two flush different entries to 0 once the scores span more than the exponent range
    # (x1000: e^{-1000}): the materialized loop flushes exp(f_i + C_ij + g_j) below e * tiny at every step;
    # the kernel-domain path flushes K = exp(C + f0 + g0) at its last exponentiation and then multiplies
    # by scalings u_i v_j in [0, e^{2 beta}] (the absorption bound), so an entry one path flushed is a
    # nonzero of at most e * tiny * e^{2 beta} = e * eps / (3 max(n, m)) in the other (measured: 5e-30 in
    # float32, 1e-247 in float64; 0 differing entries at x1 and x10). Below that bound an entry cannot
    # move a unit line sum beyond rounding (sinkflow.attention._operators).
    differ = (kernel.attention == 0) != (materialized.attention == 0)
    flushed = math.e * torch.finfo(dtype).eps / (3 * max(C.shape[-2:]))
    assert float(torch.cat([kernel.attention[differ], materialized.attention[differ], torch.zeros(1, dtype=dtype)])
                 .max()) <= flushed
    assert scale == 1000.0 or not differ.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_iter", [2, 5, 20])
def test_cold_scores_do_not_overflow_and_match_the_log_domain(dtype, n_iter):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(40, 2)), rng.normal(size=(30, 2))
    S = -1000.0 * 0.5 * ((x[:, None] - y[None]) ** 2).sum(-1)  # scores x 1000
    res = solve_sinkhorn(torch.tensor(S, dtype=dtype), n_iter=n_iter)
    K = res.attention
    assert torch.isfinite(K).all() and torch.isfinite(res.f).all() and torch.isfinite(res.g).all()
    oracle, _, _ = sinkhorn_log(torch.tensor(S, dtype=dtype).double().numpy(), n_iter)
    # exp of arguments ~1e3 carries ~1e3 eps of relative rounding: measured 7e-14 (float64), <6e-6 (float32)
    np.testing.assert_allclose(K.double().numpy(), oracle, rtol=0, atol=1e-12 if dtype == torch.float64 else 2e-5)


def test_cold_scores_need_absorptions_and_stay_finite_to_tolerance():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(64, 2)), rng.normal(size=(64, 2))
    S = torch.tensor(-1000.0 * 0.5 * ((x[:, None] - y[None]) ** 2).sum(-1), dtype=torch.float32)
    a = torch.full((64,), 1 / 64)
    op = steps.dense_operator(S, a, a, None, True)
    assert op.domain == "scaling"
    (P, f, g), _ = steps.sinkhorn_solve(op, torch.zeros(64), torch.zeros(64), n_iter=30)
    assert op.fallbacks > 0 and torch.isfinite(P).all() and torch.isfinite(f).all()
    res = solve_sinkhorn(S)
    assert res.converged and torch.isfinite(res.attention).all()


def test_batched_problems_equal_one_by_one():
    gen = torch.Generator().manual_seed(5)
    C = torch.randn(3, 9, 9, generator=gen, dtype=torch.float64) * 5
    K = solve_sinkhorn(C, n_iter=7).attention
    for k in range(3):
        torch.testing.assert_close(K[k], solve_sinkhorn(C[k], n_iter=7).attention, rtol=0, atol=1e-14)
