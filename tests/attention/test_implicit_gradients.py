"""Implicit Sinkhorn gradients, ``backward="implicit"`` (docs/theory/implicit.md).

Oracles: autograd through a long fixed ``n_iter`` (the unrolled map at convergence), central finite
differences of the converged map (float64, tol 1e-13), torch.autograd.gradcheck, and a plain numpy
solve of the full (n + m) first-order system by least squares (minimum-norm solution, which handles
the gauge independently of the Schur complement used by the package).
"""

import warnings

import numpy as np
import pytest
import torch

import sinkflow
from oracles import saved_bytes
from sinkflow.attention import SinkhornWarning
from sinkflow.attention import _implicit as imp

TOL = 1e-13  # converged forward (float64)
GRAD_ATOL = 1e-8  # implicit vs unrolled autograd at convergence, float64 (issue: 1e-8)
FD_RTOL = 1e-6  # central differences, h = 1e-5: truncation ~1e-10, round-off ~1e-11 / 1e-5


def _problem(shape, seed, masked=False, weights=False):
    gen = torch.Generator().manual_seed(seed)
    C = torch.randn(shape, generator=gen, dtype=torch.float64)
    W = torch.randn(shape, generator=gen, dtype=torch.float64)
    n, m = shape[-2], shape[-1]
    mask = a = b = None
    if masked:
        mask = torch.rand(shape, generator=gen) > 0.3
        mask[..., :, 0] = True
        mask[..., 0, :] = True
    if weights:
        a = torch.rand(n, generator=gen, dtype=torch.float64) + 0.2
        b = torch.rand(m, generator=gen, dtype=torch.float64) + 0.2
        a, b = a / a.sum(), b / b.sum()
    return C, W, mask, a, b


def _grad(C, W, **kw):
    C = C.clone().requires_grad_()
    K = sinkflow.sinkhorn(C, **kw)
    (g,) = torch.autograd.grad((K * W).sum(), C)
    return g


def _numpy_kkt_vjp(K, a, G):
    """dL/dC from the full first-order system [[diag(a), diag(a) K], [K^T diag(a), diag(b)]] (lstsq)."""
    K, a, G = (np.asarray(t, dtype=float) for t in (K, a, G))
    n, m = K.shape
    b = a @ K
    A = np.block([[np.diag(a), a[:, None] * K], [K.T * a[None, :], np.diag(b)]])
    H = G * K
    lam_mu = np.linalg.lstsq(A, np.concatenate([H.sum(1), H.sum(0)]), rcond=None)[0]
    lam, mu = lam_mu[:n], lam_mu[n:]
    return H - a[:, None] * K * (lam[:, None] + mu[None, :])


CASES = [((5, 7), False, False), ((8, 8), True, False), ((2, 6, 4), False, True), ((2, 3, 9, 9), True, True)]


@pytest.mark.parametrize("shape, masked, weights", CASES)
def test_implicit_equals_unrolled_autograd_at_convergence(shape, masked, weights):
    C, W, mask, a, b = _problem(shape, seed=len(shape) + 10 * masked + 20 * weights, masked=masked, weights=weights)
    gi = _grad(C, W, tol=TOL, mask=mask, a=a, b=b, backward="implicit")
    gu = _grad(C, W, n_iter=2001, mask=mask, a=a, b=b)  # unrolled, long enough to be converged
    assert torch.allclose(gi, gu, rtol=0, atol=GRAD_ATOL)
    if mask is not None:
        assert bool((gi[~mask] == 0).all())


@pytest.mark.parametrize("shape, masked, weights", CASES[:3])
def test_implicit_matches_finite_differences_of_converged_map(shape, masked, weights):
    C, W, mask, a, b = _problem(shape, seed=3, masked=masked, weights=weights)
    gi = _grad(C, W, tol=TOL, mask=mask, a=a, b=b, backward="implicit")

    def loss(X):
        return float((sinkflow.sinkhorn(X, tol=TOL, mask=mask, a=a, b=b) * W).sum())

    gen = torch.Generator().manual_seed(7)
    h = 1e-5
    for _ in range(3):
        E = torch.randn(C.shape, generator=gen, dtype=torch.float64)
        fd = (loss(C + h * E) - loss(C - h * E)) / (2 * h)
        assert float((gi * E).sum()) == pytest.approx(fd, rel=FD_RTOL, abs=1e-9)


def test_implicit_matches_numpy_kkt_oracle():
    C, W, _, a, _ = _problem((6, 9), seed=5, weights=True)
    K = sinkflow.sinkhorn(C, tol=TOL, a=a)
    gi = _grad(C, W, tol=TOL, a=a, backward="implicit")
    np.testing.assert_allclose(gi.numpy(), _numpy_kkt_vjp(K.numpy(), a.numpy(), W.numpy()), rtol=0, atol=1e-11)


def test_gradcheck_float64():
    C = torch.randn(2, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    assert torch.autograd.gradcheck(lambda X: sinkflow.sinkhorn(X, tol=TOL, backward="implicit"), (C,),
                                    eps=1e-6, atol=1e-7)


def test_conjugate_gradient_path_equals_dense(monkeypatch):
    C, W, mask, a, b = _problem((2, 7, 11), seed=4, masked=True, weights=True)
    dense = _all_grads(C, a, b, W, tol=TOL, mask=mask, backward="implicit")
    monkeypatch.setattr(imp, "_DENSE_MAX", 1)
    cg = _all_grads(C, a, b, W, tol=TOL, mask=mask, backward="implicit")
    for x, y in zip(cg, dense, strict=True):  # scores and weights
        assert torch.allclose(x, y, rtol=0, atol=1e-11)


def test_conjugate_gradients_warn_when_they_do_not_converge(monkeypatch):
    C, W, *_ = _problem((6, 8), seed=2)
    monkeypatch.setattr(imp, "_DENSE_MAX", 1)
    monkeypatch.setattr(imp, "_CG_RTOL", 1e-300)
    with pytest.warns(SinkhornWarning, match="conjugate gradients did not reach"):
        _grad(C, W, tol=TOL, backward="implicit")


def test_memory_is_independent_of_the_iteration_count():
    C = torch.randn(16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SinkhornWarning)  # n_iter=10 is not converged
        short = saved_bytes(lambda: sinkflow.sinkhorn(C, n_iter=10, backward="implicit"))
    long = saved_bytes(lambda: sinkflow.sinkhorn(C, n_iter=1000, backward="implicit"))
    tol = saved_bytes(lambda: sinkflow.sinkhorn(C, tol=TOL, backward="implicit"))
    assert short == long == tol <= 2 * 16 * 16 * 8


def test_not_converged_warns_and_returns_the_gradient_at_the_iterate():
    C, W, _, a, _ = _problem((5, 6), seed=8, weights=True)
    with pytest.warns(SinkhornWarning, match="did not converge"):
        gi = _grad(C, W, n_iter=3, a=a, backward="implicit")
    K = sinkflow.sinkhorn(C, n_iter=3, a=a)
    # the stated behaviour: the conditions' vjp at the iterate, with the target b (uniform here)
    expected = imp.implicit_vjp(K, a, torch.full((6,), 1 / 6, dtype=torch.float64), W)
    assert torch.allclose(gi, expected, rtol=0, atol=1e-12)
    with pytest.warns(SinkhornWarning) as record:  # the solver's budget warning, then the gradient's
        _grad(C, W, tol=1e-13, max_iter=4, a=a, backward="implicit")
    assert any("did not converge" in str(w.message) for w in record)


def test_dtypes_are_kept():
    C = torch.randn(5, 5, generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        X = C.to(dtype).detach().requires_grad_()
        K = sinkflow.sinkhorn(X, backward="implicit")
        K.float().square().sum().backward()
        assert K.dtype == dtype and X.grad.dtype == dtype and bool(torch.isfinite(X.grad).all())


def test_refusals():
    C = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="backward must be"):
        sinkflow.sinkhorn(C, backward="adjoint")


def test_no_grad_and_numpy_inputs_are_unchanged():
    C = np.random.default_rng(0).normal(size=(4, 5))
    np.testing.assert_array_equal(sinkflow.sinkhorn(C, backward="implicit"), sinkflow.sinkhorn(C))


def test_torch_func_grad_jvp_vmap():
    C, W, mask, a, b = _problem((5, 6), seed=9, masked=True, weights=True)
    kw = dict(mask=mask, a=a, b=b, backward="implicit")
    g = torch.func.grad(lambda X: (sinkflow.sinkhorn(X, tol=TOL, **kw) * W).sum())(C)
    assert torch.allclose(g, _grad(C, W, tol=TOL, **kw), rtol=0, atol=1e-14)
    E = torch.randn(C.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    _, tangent = torch.func.jvp(lambda X: sinkflow.sinkhorn(X, tol=TOL, **kw), (C,), (E,))
    h = 1e-5
    fd = (sinkflow.sinkhorn(C + h * E, tol=TOL, mask=mask, a=a, b=b)
          - sinkflow.sinkhorn(C - h * E, tol=TOL, mask=mask, a=a, b=b)) / (2 * h)
    assert torch.allclose(tangent, fd, rtol=0, atol=1e-9)
    # vmap (fixed n_iter: vmap cannot run the stopping loop) equals the per-sample gradients
    Cs, Ws = torch.stack([C, C.flip(0)]), torch.stack([W, -W])

    def loss(X, V):
        return (sinkflow.sinkhorn(X, n_iter=301, backward="implicit") * V).sum()

    per = torch.func.vmap(torch.func.grad(loss))(Cs, Ws)
    for i in range(2):
        assert torch.allclose(per[i], _grad(Cs[i], Ws[i], n_iter=301, backward="implicit"), rtol=0, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# gradients with respect to the weights a, b


def _all_grads(C, a, b, W, **kw):
    X, A, B = (t.clone().requires_grad_() for t in (C, a, b))
    K = sinkflow.sinkhorn(X, a=A, b=B, **kw)
    return torch.autograd.grad((K * W).sum(), (X, A, B))


def _plain_weighted(C, a, b, n_half):
    """This file's own log-domain loop with weights (rows to 1, columns a^T K = b), row step first."""
    f = torch.zeros(C.shape[:-1], dtype=C.dtype)
    g = torch.zeros(C.shape[:-2] + C.shape[-1:], dtype=C.dtype)
    for t in range(n_half):
        if t % 2 == 0:
            f = -torch.logsumexp(C + g[..., None, :], -1)
        else:
            g = torch.log(b) - torch.logsumexp(torch.log(a)[..., :, None] + C + f[..., :, None], -2)
    return torch.exp(f[..., :, None] + C + g[..., None, :])


@pytest.mark.parametrize("shape", [(5, 7), (2, 6, 4)])
def test_weight_gradients_equal_unrolled_autograd_at_convergence(shape):
    C, W, _, a, b = _problem(shape, seed=11, weights=True)
    implicit = _all_grads(C, a, b, W, tol=TOL, backward="implicit")
    # the oracle: this file's loop, 601 half-steps (ends on a row step), differentiated by autograd
    X, A, B = (t.clone().requires_grad_() for t in (C, a, b))
    oracle = torch.autograd.grad((_plain_weighted(X, A, B, 601) * W).sum(), (X, A, B))
    package = _all_grads(C, a, b, W, n_iter=601)  # the package's unrolled fixed n_iter
    for gi, go, gp in zip(implicit, oracle, package, strict=True):
        assert torch.allclose(gi, go, rtol=0, atol=GRAD_ATOL)
        assert torch.allclose(gp, go, rtol=0, atol=GRAD_ATOL)
    # scale invariance: no component along the weights themselves
    assert float((a * implicit[1]).sum().abs()) < 1e-12 and float((b * implicit[2]).sum().abs()) < 1e-12
    # an iterate that ends on a column step differs only off the simplex (a constant shift of the gradient)
    even = _all_grads(C, a, b, W, n_iter=600)
    for gi, ge in zip(implicit[1:], even[1:], strict=True):
        d = ge - gi
        assert torch.allclose(d, d.mean(-1, keepdim=True).expand_as(d), rtol=0, atol=GRAD_ATOL)


def test_weight_gradients_with_a_mask_equal_unrolled_autograd():
    C, W, mask, a, b = _problem((6, 8), seed=12, masked=True, weights=True)
    implicit = _all_grads(C, a, b, W, mask=mask, tol=TOL, backward="implicit")
    unrolled = _all_grads(C, a, b, W, mask=mask, n_iter=3001)
    for gi, gu in zip(implicit, unrolled, strict=True):
        assert torch.allclose(gi, gu, rtol=0, atol=GRAD_ATOL)


def test_weight_gradients_match_finite_differences():
    C, W, _, a, b = _problem((5, 6), seed=13, weights=True)
    _, ga, gb = _all_grads(C, a, b, W, tol=TOL, backward="implicit")
    gen = torch.Generator().manual_seed(3)
    h = 1e-6

    def loss(A, B):
        return float((sinkflow.sinkhorn(C, tol=TOL, a=A, b=B) * W).sum())

    for _ in range(2):
        Ea = torch.randn(5, generator=gen, dtype=torch.float64)
        Eb = torch.randn(6, generator=gen, dtype=torch.float64)
        Ea, Eb = Ea - Ea.mean(), Eb - Eb.mean()  # along the simplex: the weights still sum to 1
        fd = (loss(a + h * Ea, b + h * Eb) - loss(a - h * Ea, b - h * Eb)) / (2 * h)
        assert float((ga * Ea).sum() + (gb * Eb).sum()) == pytest.approx(fd, rel=FD_RTOL, abs=1e-8)


def test_weight_jvp_matches_finite_differences():
    C, _, _, a, b = _problem((5, 6), seed=14, weights=True)
    gen = torch.Generator().manual_seed(4)
    dC = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    da, db = torch.randn(5, generator=gen, dtype=torch.float64), torch.randn(6, generator=gen, dtype=torch.float64)
    da, db = da - da.mean(), db - db.mean()
    _, tangent = torch.func.jvp(lambda X, A, B: sinkflow.sinkhorn(X, tol=TOL, a=A, b=B, backward="implicit"),
                                (C, a, b), (dC, da, db))
    h = 1e-6
    fd = (sinkflow.sinkhorn(C + h * dC, tol=TOL, a=a + h * da, b=b + h * db)
          - sinkflow.sinkhorn(C - h * dC, tol=TOL, a=a - h * da, b=b - h * db)) / (2 * h)
    assert torch.allclose(tangent, fd, rtol=0, atol=1e-8)


# ---------------------------------------------------------------------------------------------
# forward mode to tolerance (issue 44): the implicit tangent, also with backward="unrolled"


def _cold(scale, seed=0, n=32, skip=0):
    gen = torch.Generator().manual_seed(seed)
    torch.randn(skip, n, n, generator=gen, dtype=torch.float64)
    C = scale * torch.randn(n, n, dtype=torch.float64, generator=gen)
    return C, torch.randn(n, n, dtype=torch.float64, generator=gen)


def _central(C, dC, h=1e-6):
    return (sinkflow.sinkhorn(C + h * dC, tol=TOL) - sinkflow.sinkhorn(C - h * dC, tol=TOL)) / (2 * h)


@pytest.mark.parametrize("backward", ["unrolled", "implicit"])
def test_jvp_to_tolerance_converges_on_cold_scores(backward):
    # unrolled, the differentiable iterations (no Newton steps) stalled here after 1,779 half-steps at marginal
    # error 3.7e-6 (a SinkhornWarning, 64 s under load), the tangent off finite differences by 1.6e-4
    C, dC = _cold(10.0, skip=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SinkhornWarning)
        P, tangent = torch.func.jvp(lambda X: sinkflow.sinkhorn(X, tol=1e-10, backward=backward), (C,), (dC,))
    assert torch.allclose(P, sinkflow.sinkhorn(C, tol=1e-10), rtol=0, atol=1e-9)
    assert torch.allclose(tangent, _central(C, dC), rtol=0, atol=1e-7)


def test_forward_ad_to_tolerance_is_the_converged_tangent():
    from torch.autograd import forward_ad

    C, dC = _cold(10.0, seed=1)  # with Newton steps, forward_ad's tangent was silently wrong (off by 0.4)
    with forward_ad.dual_level():
        tangent = forward_ad.unpack_dual(sinkflow.sinkhorn(forward_ad.make_dual(C, dC), tol=1e-10)).tangent
    assert torch.allclose(tangent, _central(C, dC), rtol=0, atol=1e-7)


def test_jvp_to_tolerance_equals_the_fixed_n_iter_limit():
    C, dC = _cold(2.0, seed=2, n=12)
    _, tol_tangent = torch.func.jvp(lambda X: sinkflow.sinkhorn(X, tol=1e-12), (C,), (dC,))
    _, limit = torch.func.jvp(lambda X: sinkflow.sinkhorn(X, n_iter=401), (C,), (dC,))  # converged (error 3e-13)
    assert torch.allclose(tol_tangent, limit, rtol=0, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# second derivatives


def test_double_backward_equals_the_hessian_of_the_unrolled_solve():
    C, W, mask, a, b = _problem((5, 6), seed=15, masked=True, weights=True)
    V = torch.randn(5, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    X = C.clone().requires_grad_()
    K = sinkflow.sinkhorn(X, tol=TOL, mask=mask, a=a, b=b, backward="implicit")
    (g,) = torch.autograd.grad((K * W).sum(), X, create_graph=True)
    (hv,) = torch.autograd.grad((g * V).sum(), X)

    def unrolled(Y):
        return (sinkflow.sinkhorn(Y, n_iter=401, mask=mask, a=a, b=b) * W).sum()

    def implicit(Y):
        return (sinkflow.sinkhorn(Y, tol=TOL, mask=mask, a=a, b=b, backward="implicit") * W).sum()

    # the oracle: torch.func's forward-over-reverse Hessian-vector product of the unrolled solve (converged)
    _, oracle = torch.func.jvp(torch.func.grad(unrolled), (C,), (V,))
    assert torch.allclose(hv, oracle, rtol=0, atol=GRAD_ATOL)
    _, func = torch.func.jvp(torch.func.grad(implicit), (C,), (V,))  # torch.func through the implicit rules
    assert torch.allclose(func, oracle, rtol=0, atol=GRAD_ATOL)


# ---------------------------------------------------------------------------------------------
# half precision: the reported error is that of the returned matrix


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_report_the_error_of_the_returned_matrix(dtype):
    C = 3 * torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    for backward in ("unrolled", "implicit"):
        X = C.to(dtype).requires_grad_()
        res = sinkflow.solve_sinkhorn(X, backward=backward)
        P = res.attention.detach().double()  # the returned matrix, re-measured here in float64
        a = torch.full((64,), 1 / 64, dtype=torch.float64)
        row = float((a * (P.sum(-1) - 1).abs()).sum())
        col = float(((a @ P) - a).abs().sum())
        assert res.attention.dtype == dtype
        assert res.marginal_error == pytest.approx(max(row, col), rel=1e-3)
        assert res.converged == (res.marginal_error <= res.tol)
        assert res.tol == sinkflow.attention.default_tolerance(dtype, 64)
        res.attention.float().square().sum().backward()
        assert X.grad.dtype == dtype and bool(torch.isfinite(X.grad).all())
