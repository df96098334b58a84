"""float16 / bfloat16 honesty (issue 44): computed in float32 at least, returned in the input dtype.

Oracles: the same computation on float32 inputs (the half result is its rounding), and line sums
re-measured here in float64.
"""

import pytest
import torch

import sinkflow
from sinkflow.nn import scaled_attention

HALF = [torch.bfloat16, torch.float16]


def _points(n=16, p=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, n, p, generator=g), torch.randn(2, n, p, generator=g)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("hard", [False, True])
def test_esp_plan_returns_the_input_dtype(dtype, hard):
    x, y = _points()
    K = sinkflow.esp_plan(x.to(dtype), y.to(dtype), hard=hard)
    ref = sinkflow.esp_plan(x.to(dtype).float(), y.to(dtype).float(), hard=hard)  # float32 on the same inputs
    assert K.dtype == dtype
    assert torch.equal(K, ref.to(dtype))  # the float32 plan, rounded once
    eps = torch.finfo(dtype).eps
    assert float((K.double().sum(-1) - ref.double().sum(-1)).abs().max()) <= eps  # rounding: at most ~eps / 2
    assert sinkflow.esp_plan(x.double(), y.double()).dtype == torch.float64
    assert sinkflow.esp_plan(x, y).dtype == torch.float32


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", ["esp", "esp_hard", "softmax", "sinkhorn", "gaussian", "nystromformer"])
def test_models_return_the_dtype_of_the_values(dtype, name):
    q, k = _points(seed=1)
    v = q.flip(-1)
    out, _ = scaled_attention(q.to(dtype), k.to(dtype), v.to(dtype), name, landmarks=4)
    ref, _ = scaled_attention(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), name, landmarks=4)
    assert out.dtype == dtype
    assert torch.allclose(out.float(), ref, rtol=0, atol=4 * torch.finfo(dtype).eps * float(ref.abs().max()) + 1e-6)


@pytest.mark.parametrize("dtype", HALF)
def test_sinkhorn_to_tolerance_reports_the_error_of_the_half_result(dtype):
    C = 3 * torch.randn(256, 256, generator=torch.Generator().manual_seed(2))
    res = sinkflow.solve_sinkhorn(C.to(dtype))
    P = res.attention.double()
    a = torch.full((256,), 1 / 256, dtype=torch.float64)
    measured = max(float((a * (P.sum(-1) - 1).abs()).sum()), float(((a @ P) - a).abs().sum()))
    assert res.attention.dtype == dtype
    assert res.tol == sinkflow.attention.default_tolerance(dtype, 256) >= torch.finfo(dtype).eps
    assert res.marginal_error == pytest.approx(measured, rel=1e-3)
    assert res.converged and measured <= res.tol
