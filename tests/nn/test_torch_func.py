"""torch.func over sinkflow's torch paths (issue 44, item 1), as a table: each transform on each function.

Oracles: vmap against a Python loop; grad / vjp / jacrev / jacfwd / jvp / hessian against torch.autograd
on the plain (untransformed) call, in float64 to 1e-10. With a fixed ``n_iter`` every transform must work;
run to tolerance (``n_iter=None``, a data-dependent stopping loop) grad / vjp / jvp work and the
vmap-based transforms raise an error that names ``n_iter``.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import sinkflow
from sinkflow.fields._dense_fields import attention_field
from sinkflow.nn import MultiheadAttention, scaled_attention
from sinkflow.particles import ParticleField, euler_step, rk4_step

TOL = 1e-10
D = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _mha(normalization, need_weights):
    torch.manual_seed(0)
    mha = MultiheadAttention(4, 2, batch_first=True, normalization=normalization, n_iter=3).to(D)
    return lambda x: mha(x, x, x, need_weights=need_weights)[0]


def _scaled(normalization, need_weights, n_iter=3, mask=None):
    def f(x):  # x: (n, p) -> per-head q = k = v = x
        return scaled_attention(x, x.flip(-2), x, normalization, n_iter=n_iter, need_weights=need_weights,
                                mask=mask)[0]
    return f


def _sinkhorn(n_iter, full=False):
    # To tolerance, forward mode takes the converged map's tangent (implicit) and reverse mode differentiates
    # the unrolled iterate: they agree to about the solve's tolerance, hence 1e-13 here (TOL = 1e-10).
    tol = 1e-13 if n_iter is None else None

    def f(x):  # x: (n, p): scores x x^T
        C = x @ x.mT
        return sinkflow.solve_sinkhorn(C, n_iter, tol).attention if full else sinkflow.sinkhorn(C, n_iter, tol)
    return f


def _field(n_iter, attention="sinkhorn"):
    return lambda x: attention_field(x, attention, None, None, n_iter=n_iter, tol=1e-13).velocity


def _step(step, n_iter):
    def f(x):
        field = ParticleField("sinkhorn", W=None, W_V=None, n_iter=n_iter, weights=None, temperature=1.0,
                              tol=1e-13, max_iter=20_000, chunked=False, landmarks=None, warm_start=False,
                              sphere=False, need_errors=False)
        return step(field, x, 0.1)[0]
    return f


FIXED = {  # name: (function of one (n, d) or (B, n, d) tensor, input shape)
    "mha-sinkhorn": (_mha("sinkhorn", False), (1, 5, 4)),
    "mha-sinkhorn-weights": (_mha("sinkhorn", True), (1, 5, 4)),
    "mha-softmax": (_mha("softmax", False), (1, 5, 4)),
    "scaled-sinkhorn-fused": (_scaled("sinkhorn", False), (5, 3)),
    "scaled-sinkhorn-weights": (_scaled("sinkhorn", True), (5, 3)),
    "scaled-sinkhorn-causal": (_scaled("sinkhorn", False, mask=torch.ones(5, 5, dtype=torch.bool).tril()), (5, 3)),
    "scaled-softmax": (_scaled("softmax", False), (5, 3)),
    "scaled-gaussian": (_scaled("gaussian", False), (5, 3)),
    "sinkhorn": (_sinkhorn(5), (4, 3)),
    "solve_sinkhorn": (_sinkhorn(6, full=True), (4, 3)),
    "attention_field": (_field(5), (4, 2)),
    "euler_step": (_step(euler_step, 5), (4, 2)),
    "rk4_step": (_step(rk4_step, 5), (4, 2)),
}
TO_TOL = {
    "sinkhorn-tol": (_sinkhorn(None), (4, 3)),
    "solve_sinkhorn-tol": (_sinkhorn(None, full=True), (4, 3)),
    "attention_field-tol": (_field(None), (4, 2)),
    "euler_step-tol": (_step(euler_step, None), (4, 2)),
    "rk4_step-tol": (_step(rk4_step, None), (4, 2)),
}
TRANSFORMS = ["vmap", "grad", "vjp", "jacrev", "jacfwd", "jvp", "hessian"]


def _input(shape, seed=0):
    return 0.7 * torch.randn(shape, dtype=D, generator=_gen(seed))


def _scalar(f):
    """A scalar of f's output with generic weights (a weighted sum of a doubly stochastic matrix with weights
    that are sums of a row and a column term would be constant)."""
    w = torch.rand(64, dtype=D, generator=_gen(5))

    def s(x):
        y = f(x)
        return (y * w[:y.numel()].view(y.shape)).sum() ** 2
    return s


def _check(transform, f, x, hessian_tol=1e-6):
    """Run ``transform`` on ``f`` at ``x`` and compare with its untransformed oracle."""
    if transform == "vmap":
        xs = torch.stack([x, _input(x.shape, 1), _input(x.shape, 2)])
        got, want = vmap(f)(xs), torch.stack([f(xi) for xi in xs])
    elif transform == "grad":
        s = _scalar(f)
        xr = x.clone().requires_grad_()
        got, want = grad(s)(x), torch.autograd.grad(s(xr), xr)[0]
    elif transform == "vjp":
        y, pull = vjp(f, x)
        u = _input(y.shape, 3)
        xr = x.clone().requires_grad_()
        got, want = pull(u)[0], torch.autograd.grad(f(xr), xr, u)[0]
    elif transform in ("jacrev", "jacfwd"):
        got = (jacrev if transform == "jacrev" else jacfwd)(f)(x)
        want = torch.autograd.functional.jacobian(f, x)
    elif transform == "jvp":
        t = _input(x.shape, 4)
        got = jvp(f, (x,), (t,))[1]
        J = torch.autograd.functional.jacobian(f, x)
        want = (J.reshape(-1, x.numel()) @ t.reshape(-1)).reshape(J.shape[:J.ndim - x.ndim])
    else:  # the oracle: central differences of autograd's gradient (double backward through sinkflow's
        # hand-written backwards is refused, see test_double_backward_is_refused)
        s = _scalar(f)
        got, want = hessian(s)(x), _hessian_by_differences(s, x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=hessian_tol, atol=hessian_tol * float(want.abs().max()))
        return
    assert got.shape == want.shape
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)


def _hessian_by_differences(s, x, h=1e-5):
    def g(y):
        y = y.clone().requires_grad_()
        return torch.autograd.grad(s(y), y)[0]
    cols = []
    for i in range(x.numel()):
        e = torch.zeros(x.numel(), dtype=D)
        e[i] = h
        e = e.view_as(x)
        cols.append((g(x + e) - g(x - e)) / (2 * h))
    return torch.stack(cols, -1).reshape(*x.shape, *x.shape)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("name", list(FIXED))
def test_fixed_n_iter_under_every_transform(name, transform):
    f, shape = FIXED[name]
    _check(transform, f, _input(shape))


def _to_tol_cases():
    """Every (function, transform) pair; the slowest (seconds: RK4 to tolerance, Hessians to tolerance) are slow."""
    for name in TO_TOL:
        for transform in TRANSFORMS:
            slow = transform == "hessian" or (name == "rk4_step-tol" and transform != "vmap")
            yield pytest.param(name, transform, marks=[pytest.mark.slow] if slow else [], id=f"{name}-{transform}")


@pytest.mark.parametrize(("name", "transform"), list(_to_tol_cases()))
def test_to_tolerance(name, transform):
    """A data-dependent stopping loop: vmap (batched primals) refuses, naming n_iter; jacrev, jacfwd and
    hessian batch only tangents and cotangents (the primal loop runs once, unbatched) and agree."""
    f, shape = TO_TOL[name]
    if transform == "vmap":
        with pytest.raises(RuntimeError, match=r"n_iter=None.*fixed n_iter"):
            _check(transform, f, _input(shape))
    else:  # hessian: the differences at x +- h may run a different number of half-iterations (tol 1e-9)
        _check(transform, f, _input(shape), hessian_tol=1e-5)


def test_issue_example_vmap_equals_loop():
    """The issue's measurement: vmap over the module (float32, torch's default) equals the loop."""
    torch.manual_seed(0)
    mha = MultiheadAttention(16, 4, batch_first=True)
    xs = torch.randn(3, 2, 6, 16)
    got = vmap(lambda x: mha(x, x, x, need_weights=False)[0])(xs)
    want = torch.stack([mha(x, x, x, need_weights=False)[0] for x in xs])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("entry", ["scaled_attention", "sinkhorn", "mha"])
def test_non_finite_input(entry):
    """Eager: ValueError naming the input. Under vmap (no error can be raised for one sample): that sample's
    result is all NaN, the others are the loop's."""
    x = _input((3, 5, 4))
    x[1, 2, 0] = float("nan")
    if entry == "scaled_attention":
        f, name = (lambda y: scaled_attention(y, y, y, "sinkhorn", n_iter=3, need_weights=False)[0]), "q"
    elif entry == "sinkhorn":
        f, name = (lambda y: sinkflow.sinkhorn(y @ y.mT, 3)), "scores"
    else:
        f, name = _mha("sinkhorn", False), "query"
    with pytest.raises(ValueError, match=name):
        f(x[1])
    out = vmap(f)(x)
    assert torch.isnan(out[1]).all()
    torch.testing.assert_close(out[[0, 2]], torch.stack([f(x[0]), f(x[2])]), rtol=TOL, atol=TOL)


def test_double_backward_is_refused():
    """Plain autograd through a hand-written backward cannot give second derivatives: it says so (before: a
    silently wrong Hessian, 0.70 off on entries of size 0.77); torch.func.hessian takes the plain path."""
    x = _input((4, 3)).requires_grad_()
    y = sinkflow.sinkhorn(x @ x.mT, 5)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad((y * y).sum(), x, create_graph=True)
    torch.testing.assert_close(hessian(lambda z: (sinkflow.sinkhorn(z @ z.mT, 5) ** 2).sum())(x.detach()),
                               _hessian_by_differences(lambda z: (sinkflow.sinkhorn(z @ z.mT, 5) ** 2).sum(),
                                                       x.detach()), rtol=1e-6, atol=1e-7)


def test_a_check_outside_the_entries_says_vmap():
    """A function without a transform entry that checks its input under vmap names the input and vmap
    (before: vmap's own "data-dependent control flow" error from inside the check)."""
    with pytest.raises(RuntimeError, match=r"Q cannot be checked .* torch\.func\.vmap"):
        vmap(lambda q: sinkflow.dot_scores(q, q))(_input((2, 3, 2)))
