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
    dense = _grad(C, W, tol=TOL, mask=mask, a=a, b=b, backward="implicit")
    monkeypatch.setattr(imp, "_DENSE_MAX", 1)
    cg = _grad(C, W, tol=TOL, mask=mask, a=a, b=b, backward="implicit")
    assert torch.allclose(cg, dense, rtol=0, atol=1e-11)


def test_conjugate_gradients_warn_when_they_do_not_converge(monkeypatch):
    C, W, *_ = _problem((6, 8), seed=2)
    monkeypatch.setattr(imp, "_DENSE_MAX", 1)
    monkeypatch.setattr(imp, "_CG_RTOL", 1e-300)
    with pytest.warns(SinkhornWarning, match="conjugate gradients did not reach"):
        _grad(C, W, tol=TOL, backward="implicit")


def _saved_bytes(fn):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


def test_memory_is_independent_of_the_iteration_count():
    C = torch.randn(16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SinkhornWarning)  # n_iter=10 is not converged
        short = _saved_bytes(lambda: sinkflow.sinkhorn(C, n_iter=10, backward="implicit"))
    long = _saved_bytes(lambda: sinkflow.sinkhorn(C, n_iter=1000, backward="implicit"))
    tol = _saved_bytes(lambda: sinkflow.sinkhorn(C, tol=TOL, backward="implicit"))
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
    a = torch.full((4,), 0.25, dtype=torch.float64, requires_grad=True)
    with pytest.raises(NotImplementedError, match="weights a and b"):
        sinkflow.sinkhorn(C, a=a, backward="implicit")
    K = sinkflow.sinkhorn(C, backward="implicit")
    with pytest.raises(RuntimeError):  # once differentiable: no double backward
        (g,) = torch.autograd.grad(K.square().sum(), C, create_graph=True)
        g.sum().backward()


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
