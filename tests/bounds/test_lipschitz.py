"""attention_lipschitz against independent oracles (docs/theory/lipschitz.md).

Oracles: a plain numpy re-implementation of the attention map (SoftMax, masked SoftMax, Sinkhorn
by alternate row/column normalizations), its dense Jacobian by central finite differences and
numpy.linalg.norm(J, 2); the paper's bound re-implemented with explicit loops (the authors' form).
No fixed slope in n is tested: at a fixed radius the adversarial constant rises then falls.
"""

import math

import numpy as np
import pytest
import torch

from sinkflow.bounds import (
    LipschitzEstimate,
    adversarial_input,
    attention_lipschitz,
    lipschitz_upper_bound,
    query_key_matrix,
)
from sinkflow.bounds import _lipschitz as lip
from sinkflow.particles import causal_mask

FD_RTOL = 1e-6  # central differences, h = 1e-5, float64: truncation ~1e-10, round-off ~1e-11


def _weights(d=4, d_head=3, heads=1, scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    shape = (heads, d_head, d) if heads > 1 else (d_head, d)
    return tuple(scale * rng.standard_normal(shape) for _ in range(3))


def _np_normalize(C, kind, mask=None, n_iter=None):
    C = np.where(mask, C, -np.inf) if mask is not None else C
    K = np.exp(C - C.max(1, keepdims=True))
    if kind == "softmax":
        return K / K.sum(1, keepdims=True)
    for t in range(n_iter):  # half-steps: rows first (n_iter = 1 is SoftMax), columns to 1 (n x n, uniform)
        K = K / K.sum(1 - t % 2, keepdims=True)
    return K


def _np_attention(X, WQ, WK, WV, kind="softmax", mask=None, n_iter=None):
    WQ, WK, WV = (W if W.ndim == 3 else W[None] for W in (WQ, WK, WV))
    out = []
    for Q, K, V in zip(WQ, WK, WV, strict=True):
        C = (X @ Q.T) @ (X @ K.T).T / math.sqrt(Q.shape[0])
        out.append(_np_normalize(C, kind, mask, n_iter) @ (X @ V.T))
    return np.concatenate(out, 1)


def _fd_norm(f, X, h=1e-5):
    cols = []
    for k in range(X.size):
        E = np.zeros(X.size)
        E[k] = h
        E = E.reshape(X.shape)
        cols.append(((f(X + E) - f(X - E)) / (2 * h)).ravel())
    return float(np.linalg.norm(np.stack(cols, 1), 2))


def _loop_bound(X, WQ, WK, WV, form="both"):
    """The paper's bound with explicit loops: sum_h ||V_h||_2 sqrt(R_h^2 r^2 (n + 1) + n)."""
    WQ, WK, WV = (W if W.ndim == 3 else W[None] for W in (WQ, WK, WV))
    n = len(X)
    r = max(np.linalg.norm(X[i] - X[j]) for i in range(n) for j in range(n))
    total = 0.0
    for Q, K, V in zip(WQ, WK, WV, strict=True):
        A = K.T @ Q / math.sqrt(Q.shape[0])
        keys = max(np.linalg.norm(A @ X[i]) for i in range(n))  # the authors' code: ||A x_i||
        queries = max(np.linalg.norm(A.T @ X[i]) for i in range(n))
        R_h = {"both": max(keys, queries), "code": keys, "transposed": queries}[form]
        total += np.linalg.norm(V, 2) * math.sqrt(R_h**2 * r**2 * (n + 1) + n)
    return total


CASES = [("softmax", False, None), ("softmax", True, None), ("sinkhorn", False, 5), ("sinkhorn", False, 1)]


@pytest.mark.parametrize("kind, causal, n_iter", CASES)
@pytest.mark.parametrize("n, heads", [(2, 1), (9, 2), (32, 1)])
def test_exact_norm_matches_finite_differences(kind, causal, n, heads, n_iter):
    WQ, WK, WV = _weights(heads=heads, seed=n)
    X = np.random.default_rng(100 + n).standard_normal((n, 4))
    M = np.tril(np.ones((n, n), bool)) if causal else None
    oracle = _fd_norm(lambda Y: _np_attention(Y, WQ, WK, WV, kind, M, n_iter), X)
    res = attention_lipschitz(X, kind, WQ, WK, WV, mask=None if M is None else causal_mask(n), n_iter=n_iter,
                              method="exact")
    assert res.method == "exact"
    assert res.estimate == pytest.approx(oracle, rel=FD_RTOL)


@pytest.mark.slow
def test_sinkhorn_to_tolerance_is_the_converged_map():
    """To tolerance, the Jacobian is the converged map's (implicit gradients): the unrolled solver was off
    by 1.6e-4 here (docs/theory/lipschitz.md). Oracle: finite differences of 4,000 numpy half-steps."""
    WQ, WK, WV = _weights(seed=3)
    X = np.random.default_rng(3).standard_normal((12, 4))
    oracle = _fd_norm(lambda Y: _np_attention(Y, WQ, WK, WV, "sinkhorn", n_iter=4000), X)
    res = attention_lipschitz(X, "sinkhorn", WQ, WK, WV, tol=1e-13)
    assert res.attention == "sinkhorn(tol=1e-13)" and res.bound is None
    assert abs(res.estimate / oracle - 1) < 1e-7  # measured 1.3e-9 (the unrolled solver: 1.6e-4)
    power = attention_lipschitz(X, "sinkhorn", WQ, WK, WV, tol=1e-13, method="power iteration")
    assert abs(power.estimate / oracle - 1) < 1e-7  # torch.func.jvp through the forward-mode rule
    # the fixed-n_iter derivative tends to the converged map's as n_iter grows
    long = attention_lipschitz(X, "sinkhorn", WQ, WK, WV, n_iter=4001).estimate
    assert abs(long / oracle - 1) < 1e-7


@pytest.mark.parametrize("kind, causal, n_iter", CASES + [("sinkhorn", True, 6)])
def test_power_iteration_matches_the_dense_spectral_norm(kind, causal, n_iter):
    n = 20
    WQ, WK, WV = _weights(heads=2, scale=1.5, seed=7)
    X = np.random.default_rng(7).standard_normal((n, 4))
    M = causal_mask(n) if causal else None
    exact = attention_lipschitz(X, kind, WQ, WK, WV, mask=M, n_iter=n_iter, method="exact")
    power = attention_lipschitz(X, kind, WQ, WK, WV, mask=M, n_iter=n_iter, method="power iteration")
    assert power.method == "power iteration" and power.converged and power.iterations > 0
    assert power.estimate == pytest.approx(exact.estimate, rel=1e-6)
    assert power.estimate <= exact.estimate * (1 + 1e-9)  # a Rayleigh quotient never overshoots


def test_auto_method_switches_at_exact_limit():
    WQ, WK, WV = _weights()
    X = np.random.default_rng(0).standard_normal((6, 4))
    assert attention_lipschitz(X, "softmax", WQ, WK, WV, exact_limit=24).method == "exact"
    assert attention_lipschitz(X, "softmax", WQ, WK, WV, exact_limit=23).method == "power iteration"


def _inputs():
    """Random inputs at several radii and the paper's adversarial inputs (plain and mirrored)."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        for n in (2, 5, 17):
            heads = 1 + seed % 2
            W = _weights(heads=heads, scale=1 + seed, seed=seed)
            for R in (0.3, 2.0, 6.0):
                yield W, R * rng.standard_normal((n, 4)) / 2
            for R in (1.0, 3.0):
                for mirror in (False, True):
                    yield W, adversarial_input(n, W[0], W[1], R, mirror=mirror)


@pytest.mark.parametrize("causal", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_below_the_papers_bound_on_random_and_adversarial_inputs(causal):
    ratios, code_ratios = [], []
    for (WQ, WK, WV), X in _inputs():
        n = len(X)
        res = attention_lipschitz(X, "softmax", WQ, WK, WV, mask=causal_mask(n) if causal else None)
        assert res.bound == pytest.approx(_loop_bound(X, WQ, WK, WV), rel=1e-12)
        for form in ("code", "transposed"):
            assert lipschitz_upper_bound(X, WQ, WK, WV, form=form) == pytest.approx(
                _loop_bound(X, WQ, WK, WV, form), rel=1e-12)
        ratios.append(res.ratio)
        code_ratios.append(res.estimate / _loop_bound(X, WQ, WK, WV, "code"))
        assert res.estimate < _loop_bound(X, WQ, WK, WV, "transposed")
    assert 0.0 < min(ratios) and max(ratios) < 1.0  # measured max 0.71 (SoftMax), 0.69 (causal)
    if not causal:
        # the authors' code form (R_h from A x_i only) is exceeded where A is far from normal
        assert max(code_ratios) > 10.0  # measured 21.6, on a mirrored adversarial input with n = 2


def test_adversarial_input_is_the_papers_construction():
    WQ, WK, _ = _weights(d=5, d_head=5, seed=11)
    A = query_key_matrix(WQ, WK)
    assert np.allclose(A, WK.T @ WQ / math.sqrt(5))
    vals = np.linalg.eigvals(A)
    real = vals.real[np.abs(vals.imag) < 1e-12]
    for mirror in (False, True):
        X = adversarial_input(7, WQ, WK, 2.5, mirror=mirror)
        u = X[1] / np.linalg.norm(X[1])
        lam = real.min() if mirror else real.max()
        assert np.allclose(A @ u, lam * u, atol=1e-10)
        assert np.allclose(X[1:], X[1])
        assert np.allclose(X[0], -X[1] if mirror else 2 * X[1])
        assert np.linalg.norm(X[0]) == pytest.approx(2.5)
    # the authors' rule: the plain form unless the negative eigenvalue dominates (lambda_max <= -8 lambda_min)
    rule = not real.max() > -8 * real.min()
    assert np.array_equal(adversarial_input(7, WQ, WK, 2.5), adversarial_input(7, WQ, WK, 2.5, mirror=rule))


@pytest.mark.slow  # several seconds: with the slow tests (the README's command stays under 5 minutes)
def test_adversarial_constant_peaks_near_the_balance_point():
    """At fixed R the constant rises from n = 2 and falls after n ~ exp(lambda R^2 / 4) (no fixed slope)."""
    WQ, WK, WV = np.diag([2.0, 0.5]), np.eye(2), np.eye(2)
    lam = float(np.linalg.eigvals(query_key_matrix(WQ, WK)).real.max())
    R = 2 * math.sqrt(math.log(20) / lam)  # token 1 balances the others at n - 1 = 19; the peak is near 40
    L = {n: attention_lipschitz(adversarial_input(n, WQ, WK, R), "softmax", WQ, WK, WV).estimate
         for n in (2, 40, 2000)}
    assert L[40] > 2 * L[2] and L[40] > 2 * L[2000]  # measured 6.55 against 1.49 and 2.39


def test_a_planted_bug_fails_the_oracle(monkeypatch):
    """Dropping the 1/sqrt(d_head) scale in the map must be caught by the finite-difference oracle."""
    WQ, WK, WV = _weights(seed=5)
    X = np.random.default_rng(5).standard_normal((8, 4))
    oracle = _fd_norm(lambda Y: _np_attention(Y, WQ, WK, WV), X)
    good = lip._attention_map

    def unscaled(normalize, Q, K, V, mask):
        return good(normalize, Q * math.sqrt(Q.shape[1]), K, V, mask)

    monkeypatch.setattr(lip, "_attention_map", unscaled)
    bad = attention_lipschitz(X, "softmax", WQ, WK, WV).estimate
    assert abs(bad - oracle) > 1e3 * FD_RTOL * oracle


def test_non_convergence_warns_and_says_so():
    WQ, WK, WV = _weights(seed=2)
    X = np.random.default_rng(2).standard_normal((10, 4))
    with pytest.warns(UserWarning, match="power_iter = 2"):
        res = attention_lipschitz(X, "softmax", WQ, WK, WV, method="power iteration", power_iter=2)
    assert not res.converged and res.iterations == 2


def test_inputs_of_any_dtype_and_grad_state():
    WQ, WK, WV = _weights(seed=1)
    X = np.random.default_rng(1).standard_normal((6, 4))
    ref = attention_lipschitz(X, "softmax", WQ, WK, WV).estimate
    xt = torch.tensor(X, dtype=torch.float32, requires_grad=True)
    got = attention_lipschitz(xt, "softmax", *(torch.tensor(W, dtype=torch.bfloat16) for W in (WQ, WK, WV)))
    assert isinstance(got.estimate, float) and got.estimate == pytest.approx(ref, rel=2e-2)
    assert xt.grad is None


def test_a_callable_normalization_and_the_summary():
    WQ, WK, WV = _weights(seed=4)
    X = np.random.default_rng(4).standard_normal((5, 4))
    via_name = attention_lipschitz(X, "softmax", WQ, WK, WV)
    via_fn = attention_lipschitz(X, lambda C: torch.softmax(C, -1), WQ, WK, WV)
    assert via_fn.estimate == pytest.approx(via_name.estimate, rel=1e-12) and via_fn.bound is None
    assert isinstance(via_name, LipschitzEstimate)
    text = repr(via_name)
    assert text.startswith("<LipschitzEstimate> softmax, n = 5, d = 4") and len(text.splitlines()) <= 6


@pytest.mark.parametrize("call, match", [
    (lambda X, W: attention_lipschitz(X[0], "softmax", *W), "x must have 2 dimensions"),
    (lambda X, W: attention_lipschitz(X, "nope", *W), "attention must be a registered"),
    (lambda X, W: attention_lipschitz(X, "softmax", *W, method="svd"), "method must be"),
    (lambda X, W: attention_lipschitz(X, "softmax", *W, mask=np.ones((3, 3), bool)), "mask must be a boolean"),
    (lambda X, W: attention_lipschitz(X, "softmax", *W, mask=np.eye(6, dtype=bool)[::-1] & False),
     "mask leaves a query"),
    (lambda X, W: attention_lipschitz(X, "sinkhorn", *W, n_iter=0), "n_iter"),
    (lambda X, W: attention_lipschitz(X, "softmax", *W, power_iter=0), "power_iter"),
    (lambda X, W: attention_lipschitz(X[:, :3], "softmax", *W), "W_Q must act on tokens of dimension 3"),
    (lambda X, W: attention_lipschitz(X, "softmax", W[0], W[1][:2], W[2]), "W_Q and W_K must have the same shape"),
    (lambda X, W: adversarial_input(1, W[0], W[1], 1.0), "n must be at least 2"),
    (lambda X, W: adversarial_input(3, W[0], W[1], -1.0), "R"),
    (lambda X, W: lipschitz_upper_bound(X * np.nan, *W), "x has non-finite entries"),
])
def test_argument_errors_name_the_argument(call, match):
    W = _weights()
    X = np.random.default_rng(0).standard_normal((6, 4))
    with pytest.raises((ValueError, TypeError), match=match):
        call(X, W)


def test_no_real_eigenvalue_is_refused():
    rot = np.array([[0.0, -1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="no real eigenvalue"):
        adversarial_input(4, rot, np.eye(2), 1.0)
