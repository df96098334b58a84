"""The Sinkhorn solves of the harmonic fields (``_harmonic_solvers.py``) against independent oracles:
the dense Sinkhorn field, Gram matrices from numpy's cos / sin, the plain product; and the iteration
counts a flow's solve is sized by."""

import copy

import numpy as np
import pytest
import torch

import sinkflow
from sinkflow.fields import _harmonic_solvers, attention_field, harmonic_attention_field, harmonic_kernel
from sinkflow.fields._harmonic_fields import HarmonicParticleField
from sinkflow.fields._harmonic_kernels import _Factored
from sinkflow.fields._harmonic_solvers import _newton_plan, passes


def _flow_field(kernel, attention="sinkhorn"):
    return HarmonicParticleField(attention, None, None, None, None, 1 / kernel.beta, 1e-10, 20_000, False, None,
                                 True, True, False, symmetric=True, kernel=kernel)


def _dense_sinkhorn(x, beta):
    return attention_field(x, "sinkhorn", None, None, temperature=1 / beta, tol=1e-13).velocity


@pytest.mark.parametrize("beta", [5.0, 32.0])
def test_circle_gram_from_moments_is_the_direct_gram(beta):
    """The Gram matrix of Newton's rows gathered from the moments of ``s`` (products of cos / sin as sums
    of cos / sin) against ``sum_i s_i phi_j phi_k`` with numpy's cos k theta, sin k theta."""
    kernel = harmonic_kernel(1 / beta, 2, 1e-10, 1e-3)
    K = kernel.order
    lam = kernel.eigenvalues(torch.empty(0, dtype=torch.float64)).numpy()
    rows, _, gather = _newton_plan(2, K, np.ascontiguousarray(lam).tobytes())
    assert gather is not None and (K + 1) not in rows  # the zero row of sin 0 is left out
    theta, s = np.random.default_rng(1).uniform(0, 2 * np.pi, (2, 300))
    k = np.arange(K + 1)[:, None]
    Phi = np.concatenate([np.cos(k * theta), np.sin(k * theta)])  # (2K + 2, n)
    first, second, sign = gather
    moments = Phi @ s
    gathered = 0.5 * (moments[first] + sign * moments[second])
    direct = (Phi[rows] * s) @ Phi[rows].T
    np.testing.assert_allclose(gathered, direct, atol=1e-11 * np.abs(direct).max())


@pytest.mark.parametrize("d", [2, 3])
def test_blockwise_gram_is_the_plain_product(d, monkeypatch):
    """The Gram matrix over feature blocks (BLAS's symmetric update on the CPU, torch's products
    elsewhere) against one plain product of all the features."""
    monkeypatch.setattr(sinkflow.fields._harmonic_kernels, "_BLOCK_BYTES", 8 * 200 * 37)  # several blocks
    x = torch.tensor(sinkflow.random_particles(500, d, seed=3, manifold="sphere"))
    kernel = harmonic_kernel(1 / 6.0, d, 1e-10, 1 / 500)
    s = torch.rand(500, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    F = _Factored(kernel, x)
    assert len(F.blocks) > 1
    rows = np.arange(0, kernel.rank, 3)
    Phi = kernel.features(x).numpy()[rows]
    direct = (Phi * s.numpy()) @ Phi.T
    for numpy in (True, False):
        with sinkflow.fast_paths(numpy):  # numpy's passes on the CPU, or torch's operations
            P = passes(F, torch.full((500,), 1 / 500, dtype=torch.float64))
            assert P.numpy is numpy
            np.testing.assert_allclose(P.gram(rows, P.array(s)), direct, atol=1e-12 * np.abs(direct).max())


@pytest.mark.parametrize("d", [2, 3])
def test_torch_operations_and_small_blocks_give_the_same_field(d, monkeypatch):
    """torch's path (that of other devices) and sweeps cut into blocks of 40 particles (decisions taken
    on the whole marginal error) give the numpy path's field, and the dense one."""
    beta = 7.0
    x = sinkflow.random_particles(400, d, seed=9, manifold="sphere")
    reference = {n_iter: harmonic_attention_field(x, "sinkhorn", temperature=1 / beta, n_iter=n_iter, tol=1e-12)
                 for n_iter in (None, 3)}
    dense = _dense_sinkhorn(torch.tensor(x), beta).numpy()
    np.testing.assert_allclose(reference[None].velocity, dense, atol=1e-10)
    rank = reference[None].kernel.rank
    for numpy, cache in ((False, _harmonic_solvers._CACHE_BYTES), (True, 8 * rank * 40)):
        monkeypatch.setattr(_harmonic_solvers, "_CACHE_BYTES", cache)
        for n_iter, ref in reference.items():
            with sinkflow.fast_paths(numpy):  # off: torch's operations, as on other devices
                other = harmonic_attention_field(x, "sinkhorn", temperature=1 / beta, n_iter=n_iter, tol=1e-12)
            np.testing.assert_allclose(other.velocity, ref.velocity, atol=1e-13)
            np.testing.assert_allclose(other.g, ref.g, atol=1e-12)
            assert other.n_iter == ref.n_iter


@pytest.mark.parametrize("d, beta", [(2, 5.0), (2, 32.0), (3, 5.0)])
def test_flow_solves_are_the_dense_field_in_three_applications(d, beta):
    """Inside a flow (warm start extrapolated from the last three solves, the numerators riding along
    by the last solve's count) every step's field is the dense Sinkhorn field, and from the fifth step
    on a solve takes 3 kernel applications, the field's included (5-7 before it: measured; 4 on S^2
    with Newton's modes down to 1e-2 of the largest eigenvalue instead of 1e-3); on S^2, where a solve
    starts from the previous solve's Newton inverse, from the sixth (4 at the fifth: measured)."""
    n, h = 600, 0.05
    x = torch.tensor(sinkflow.random_particles(n, d, seed=4, manifold="sphere"))
    field = _flow_field(harmonic_kernel(1 / beta, d, 1e-10, 1 / n))
    counts = []
    for _ in range(8):
        v, ev = field.velocity(x)
        dense = _dense_sinkhorn(x, beta)
        dense = dense - (dense * x).sum(1, keepdim=True) * x
        assert ev.converged and float((v - dense).abs().max()) < 1e-10
        counts.append(ev.n_iter)
        x = torch.nn.functional.normalize(x + h * v, dim=1)
    assert max(counts[4 if d == 2 else 5:]) <= 3, counts



def test_sphere_flow_reuses_the_last_newton_inverse_and_replaces_a_wrong_one(monkeypatch):
    """On S^2 a flow's solves run from the last solve's Newton inverse: no Gram matrix after the first
    two steps (far from the fixed point, they form it), the field the dense one; from a wrong inverse
    (half the identity, planted) a solve after a longer step (start error 4e-4: kept, not far) forms a
    new one and still gives the dense field."""
    beta, n = 7.0, 400
    x = torch.tensor(sinkflow.random_particles(n, 3, seed=5, manifold="sphere"))
    field = _flow_field(harmonic_kernel(1 / beta, 3, 1e-10, 1 / n))
    grams = []
    gram = _harmonic_solvers._BasisPasses.gram
    monkeypatch.setattr(_harmonic_solvers._BasisPasses, "gram", lambda P, rows, s: grams.append(1) or gram(P, rows, s))
    for step in range(6):
        grams.clear()
        v, ev = field.velocity(x)
        assert ev.converged and (step < 2 or not grams), (step, grams)
        x, previous = torch.nn.functional.normalize(x + 0.05 * v, dim=1), x
    for planted in (False, True):
        y = previous if not planted else torch.nn.functional.normalize(previous + 0.06 * v, dim=1)
        if planted:
            grams.clear()
            memory = field.memory[0][field.kernel.order]  # stage 0, this kernel's solves
            memory["newton"] = 0.5 * np.eye(memory["newton"].shape[0])
            v, ev = copy.deepcopy(field).velocity(y)
            assert len(grams) >= 1 and ev.converged, (grams, ev.n_iter)
        dense = _dense_sinkhorn(y, beta)
        dense = dense - (dense * y).sum(1, keepdim=True) * y
        assert float((v - dense).abs().max()) < 1e-10


@pytest.mark.parametrize("d", [2, 3])
def test_the_symmetric_solve_reports_like_the_one_solver(d):
    """The symmetric solve runs on the one solver: ``memory["report"]`` counts its sweeps (the kernel
    applications, less the field's own when the numerators did not ride along), its error is the returned
    one and the marginal error of ``u`` recomputed by one more application (``P.apply``), and a budget too
    small is reported as not converged."""
    n, beta = 300, 5.0
    x = torch.tensor(sinkflow.random_particles(n, d, seed=4, manifold="sphere"))
    kernel = harmonic_kernel(1 / beta, d, 1e-10, 1 / n)
    P = passes(_Factored(kernel, x, keep=d == 3), torch.full((n,), 1 / n, dtype=torch.float64), True)
    memory = {}
    _, _, u, applications, converged, err = _harmonic_solvers.symmetric_sinkhorn(P, P.xp.ones_like(P.a), 1e-10,
                                                                                200, memory)
    report = memory["report"]
    assert converged and report.converged and report.marginal_error == err <= 1e-10
    assert report.n_iter in (applications, applications - 1) and report.n_iter > 1
    assert float((P.a * abs(u * P.apply(u) - 1)).sum()) <= 1e-10  # the marginal of the returned scaling
    memory = {}
    _harmonic_solvers.symmetric_sinkhorn(P, P.xp.ones_like(P.a), 1e-10, 2, memory)
    assert memory["report"].n_iter == 2 and not memory["report"].converged


def test_the_fixed_count_reads_the_plain_loops_errors_when_asked():
    """The harmonic fixed count on the solver's fixed-count entry: asked for a report, the error after each
    half-step (of the marginal it did not normalize) is that of the plain log-domain loop on the dense scores
    beta x_i.x_j with weights a on the keys (oracle; the harmonic kernel is the dense one to ~1e-10)."""
    from oracles import sinkhorn_log
    from sinkflow.attention._solver import sinkhorn_solve

    n, beta = 200, 5.0
    x = torch.tensor(sinkflow.random_particles(n, 2, seed=6, manifold="sphere"))
    a = torch.full((n,), 1 / n, dtype=torch.float64)
    P = passes(_Factored(harmonic_kernel(1 / beta, 2, 1e-12, 1 / n), x, keep=False), a, True)
    op = _harmonic_solvers._HarmonicAlternating(P, 5, True)
    (_, out), report = sinkhorn_solve(op, None, P.xp.ones_like(P.a), n_iter=5, report=True)
    assert report.n_iter == 5 and len(report.errors) == 5
    C = beta * (x @ x.T).numpy() + np.log(a.numpy())[None, :]
    for k, err in enumerate(report.errors, 1):
        K = sinkhorn_log(C, k, a.numpy(), a.numpy())[0]
        rows, cols = (a.numpy() * np.abs(K.sum(1) - 1)).sum(), np.abs(a.numpy() @ K - a.numpy()).sum()
        assert err == pytest.approx(cols if k % 2 else rows, abs=1e-9)
    assert out[3] == pytest.approx(report.errors[-1], abs=1e-9)  # the column error the field reports
