"""Block-wise particle field: the shifted single-product passes equal the dense solver on every path.

Oracle: :func:`sinkflow.solve_sinkhorn` on the full score matrix (kernel ``a_j e^{C_ij}``).
"""

import math

import pytest
import torch

import sinkflow.fields._blockwise_fields as B
from sinkflow import solve_sinkhorn


def dense_velocity(x, scores, tau, n_iter, w=None, g0=None):
    C = x @ x.T / tau if scores == "dot" else -0.5 * torch.cdist(x, x) ** 2 / tau
    if w is not None:
        C = C + torch.log(w)[None, :]
    return solve_sinkhorn(C, n_iter=n_iter, a=w, b=w, init_g=g0, tol=1e-13, warn=False).attention @ x


@pytest.mark.parametrize("scores", ["dot", "gaussian"])
@pytest.mark.parametrize("tau", [1.0, 0.05, 0.002])  # warm, cold, so cold that the shifted sums fail
@pytest.mark.parametrize("n_iter", [1, 2, 5, 10])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_block_passes_equal_the_dense_solver(scores, tau, n_iter, rows):
    n = 40
    x = torch.randn(n, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    res = B.lazy_attention_field(x, scores=scores, temperature=tau, n_iter=n_iter, block_bytes=3 * n * 8 * rows)
    exact = dense_velocity(x, scores, tau, n_iter)
    torch.testing.assert_close(res.velocity, exact, rtol=0, atol=1e-10 * max(1.0, float(exact.abs().max())))


def test_uneven_weights_take_the_max_subtracted_row_pass(monkeypatch):
    n = 30
    x = torch.randn(n, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    w = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) + 1e-3
    w[0] = 1e-300  # log-spread beyond the row bound: no shift
    w = w / w.sum()
    assert not B._Passes(B._BlockScores(x, None, 1.0, "dot", torch.log(w)), x, w, 4).row_shift_ok
    calls = {"exact": 0}
    original = B._Passes._column_exact

    def counted(self, left):
        calls["exact"] += 1
        return original(self, left)

    monkeypatch.setattr(B._Passes, "_column_exact", counted)
    C = x @ x.T + torch.log(w)[None, :]
    for n_iter in (3, 6, None):  # ends on a row step, on a column step; until the row pass's column error <= tol
        res = B.lazy_attention_field(x, weights=w, n_iter=n_iter, tol=1e-12, block_bytes=3 * n * 8 * 4)
        K = solve_sinkhorn(C, n_iter=n_iter or res.n_iter, a=w, b=w, tol=1e-13, warn=False).attention
        torch.testing.assert_close(res.velocity, K @ x, rtol=0, atol=1e-10)
        # the weighted column sums sum_i a_i K_ij of the row pass (or of the final application): the column error
        assert res.column_error == pytest.approx(float((w @ K - w).abs().sum()), rel=1e-6, abs=1e-14)
    assert res.converged and res.column_error <= 1e-12
    cold = B.lazy_attention_field(x, temperature=0.002, scores="gaussian", n_iter=4, block_bytes=3 * n * 8 * 4)
    assert calls["exact"] > 0 and torch.isfinite(cold.velocity).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_size_does_not_change_the_field(dtype):
    n = 300
    x = torch.randn(n, 2, dtype=dtype, generator=torch.Generator().manual_seed(5))
    g0 = B.lazy_attention_field(x, n_iter=4).g
    ref = B.lazy_attention_field(x, n_iter=10, init_g=g0, block_bytes=3 * n * 8).velocity
    for size in (3 * n * 8 * 17, B.DEFAULT_BLOCK_BYTES, 64 * 2**20):
        v = B.lazy_attention_field(x, n_iter=10, init_g=g0, block_bytes=size).velocity
        torch.testing.assert_close(v, ref, rtol=0, atol=50 * torch.finfo(dtype).eps)


def test_cache_size_is_read_from_sysfs_then_sysconf_then_the_fallback(monkeypatch, tmp_path):
    sizes = {"index0": ("1", "Data", "32K"), "index2": ("2", "Unified", "512K"), "index3": ("3", "Unified", "32M")}
    for name, (level, kind, size) in sizes.items():
        (tmp_path / name).mkdir()
        for key, value in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / name / key).write_text(value + "\n")
    real_listdir, real_join = B.os.listdir, B.os.path.join
    monkeypatch.setattr(B.os, "listdir", lambda p: real_listdir(tmp_path) if p.endswith("cache") else real_listdir(p))
    monkeypatch.setattr(B.os.path, "join", lambda p, *r: real_join(str(tmp_path) if p.endswith("cache") else p, *r))
    assert B.cache_block_bytes() == 3 * 512 * 2**10
    monkeypatch.setattr(B.os, "listdir", lambda p: (_ for _ in ()).throw(OSError("no sysfs")))
    monkeypatch.setattr(B.os, "sysconf", lambda name: 2**20)
    assert B.cache_block_bytes() == 3 * 2**20
    monkeypatch.setattr(B.os, "sysconf", lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert B.cache_block_bytes(fallback=2**18) == 3 * 2**18
    assert B.DEFAULT_BLOCK_BYTES >= B.MIN_DEFAULT_BLOCK_BYTES


@pytest.mark.parametrize("scores", ["dot", "gaussian"])
def test_blocks_cleared_of_the_clamp_lie_above_the_exp_floor(scores):
    # oracle: the exponents of each block formed densely; a block whose clamp pass is skipped must have
    # every exponent above the floor, and the bound must clear warm blocks and keep cold ones
    n, rows = 60, 7
    x = torch.randn(n, 2, dtype=torch.float32, generator=torch.Generator().manual_seed(6))
    floor = math.log(torch.finfo(torch.float32).tiny) + 1.0
    cleared = {}
    for tau in (1.0, 0.01):
        S = B._BlockScores(x, None, tau, scores, None)
        row_bias = torch.linspace(-30.0, 5.0, n)
        left, bias = S.factors(row_bias), S.column_bias(torch.linspace(-20.0, 3.0, n))
        free = S.clamp_free(left, bias, rows, floor)
        exponents = left @ S.right + bias
        for b, ok in enumerate(free):
            if ok:
                assert float(exponents[b * rows:(b + 1) * rows].min()) > floor
        cleared[tau] = sum(free)
    assert cleared[1.0] == -(-n // rows) and cleared[0.01] < cleared[1.0]
