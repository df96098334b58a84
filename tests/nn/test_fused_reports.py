"""The fused torch kernels that keep their own passes share the one solver's report of a fixed count: the
marginal error read when asked, against the plan's marginals summed by plain torch (the oracle)."""

import pytest
import torch

import sinkflow
from sinkflow.attention._solver import SolveReport
from sinkflow.nn._factored_sinkhorn import sinkhorn_attention
from sinkflow.nn._fused_sinkhorn import sinkhorn_passes


def oracle_error(P, n_iter, mask):
    """The L1 deviation of the marginal the last half-step left, with weight 1/n' per admissible row: columns
    against uniform attention's column sums under the mask (n / m without one) after a row step, else rows
    against 1; the largest over the leading dimensions."""
    n, m = P.shape[-2:]
    M = torch.ones(n, m, dtype=torch.bool) if mask is None else mask
    rows = M.any(-1)
    if n_iter % 2:
        Md = M.double()
        target = (Md / Md.sum(-1, keepdim=True).clamp_min(1)).sum(-2)  # n / m each without a mask
        e = (P.sum(-2) - target).abs().sum(-1)
    else:
        e = ((P.sum(-1) - 1).abs() * rows).sum(-1)
    return float((e / rows.sum()).max())


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("n_iter", [2, 3, 4, 5])
def test_fused_kernels_report_the_plans_marginal_error(n_iter, masked):
    gen = torch.Generator().manual_seed(n_iter)
    q, k, v = torch.randn(3, 2, 3, 7, 4, generator=gen, dtype=torch.float64).unbind(0)
    mask = torch.ones(7, 7, dtype=torch.bool).tril() if masked else None
    C = q @ k.transpose(-1, -2) / 2
    P = sinkflow.sinkhorn(C, n_iter=n_iter, mask=mask)
    expected = oracle_error(P, n_iter, mask)
    assert expected > 1e-6  # a few half-steps: far from converged, so the error is a real number to compare
    out, report = sinkhorn_attention(C, n_iter, mask, values=v, report=True)
    assert torch.equal(out, sinkhorn_attention(C, n_iter, mask, values=v))  # the report changes nothing
    results = [report]
    for chain in (False, True):
        y, r = sinkhorn_passes(q, k, v, n_iter, allowed=mask, chain=chain, report=True)
        torch.testing.assert_close(y, P @ v, rtol=0, atol=1e-12)
        results.append(r)
    for r in results:
        assert isinstance(r, SolveReport) and r.n_iter == n_iter and r.converged
        assert r.marginal_error == pytest.approx(expected, rel=1e-10, abs=1e-14)


def test_the_fallback_path_reports_too():
    # scores whose SoftMax columns underflow: the factored path gives way to the solver, the report stays
    C = torch.tensor([[0.0, -900.0], [-900.0, 0.0], [0.0, -900.0]], dtype=torch.float64)
    out, report = sinkhorn_attention(C, 4, report=True)
    assert report.marginal_error == pytest.approx(oracle_error(out, 4, None), abs=1e-14)
    softmax_error = oracle_error(torch.softmax(C, -1), 1, None)
    assert sinkhorn_attention(C, 1, report=True)[1].marginal_error == pytest.approx(softmax_error, abs=1e-14)
