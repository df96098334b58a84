"""Landmark-approximated flows: exact with every point a landmark, close with few, never NaN."""

import itertools

import numpy as np
import pytest
import torch

import sinkflow
import sinkflow.fields._landmarks as landmarks_module
import sinkflow.fields._lowrank_fields as lowrank_fields
from sinkflow.fields._dense_fields import attention_field
from sinkflow.fields._lowrank_fields import NystromPositivityError, lowrank_attention_field

W = torch.tensor([[0.8, 0.2], [0.2, 0.5]], dtype=torch.float64)
EXACT = {"skyformer": "gaussian", "nystromformer": "softmax"}


def _weights(n, seed=0):
    a = torch.tensor(np.random.default_rng(seed).uniform(0.5, 1.5, n))
    return a / a.sum()


@pytest.mark.parametrize("attention,every_point", [("sinkhorn", 1), ("softmax", 1), ("unnormalized", 1),
                                                    ("gaussian", 2), ("skyformer", 2), ("nystromformer", 1)])
@pytest.mark.parametrize("n_iter", [None, 3, 4])
def test_every_point_a_landmark_is_the_exact_field(attention, every_point, n_iter):
    n = 25
    x = torch.tensor(np.random.default_rng(1).normal(size=(n, 2)))
    a = None if attention == "nystromformer" else _weights(n)
    exact = attention_field(x, EXACT.get(attention, attention), W, W, n_iter=n_iter, weights=a, temperature=1.5,
                            tol=1e-13).velocity
    approx = attention_field(x, attention, W, W, n_iter=n_iter, weights=a, temperature=1.5, tol=1e-13,
                             landmarks=every_point * n).velocity
    torch.testing.assert_close(approx, exact, rtol=0, atol=1e-8 * float(exact.abs().max()))


@pytest.mark.parametrize("attention", ["sinkhorn", "softmax", "gaussian"])
def test_error_falls_with_the_number_of_landmarks(attention):
    x = torch.tensor(np.random.default_rng(2).normal(size=(600, 2)))
    exact = attention_field(x, attention, None, None, n_iter=10).velocity
    errors = [float((attention_field(x, attention, None, None, n_iter=10, landmarks=m).velocity - exact).norm()
                    / exact.norm()) for m in (16, 64, 256)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-2


def test_approximate_trajectories_match_exact_ones_with_all_landmarks():
    x0 = sinkflow.random_particles(20, 2, seed=5)
    exact = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=6, n_iter=None)
    approx = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=6, n_iter=None, landmarks=20)
    np.testing.assert_allclose(approx.positions, exact.positions, atol=1e-8)
    assert approx.landmarks == 20 and approx.converged


# farthest-point landmarks with m = n are all n particles: exact for the lifted kernel of [x; x] too
@pytest.mark.parametrize("normalization,factor", [("sinkhorn", 1), ("unnormalized", 2), ("unnormalized", 1),
                                                  ("softmax_gaussian", 1)])
def test_heat_flow_with_all_landmarks_is_the_exact_heat_flow(normalization, factor):
    x0 = np.random.default_rng(6).normal(size=(40, 1))
    exact = sinkflow.heat_flow(x0, 0.02, 0.1, 0.01, normalization, tol=1e-9)
    approx = sinkflow.heat_flow(x0, 0.02, 0.1, 0.01, normalization, tol=1e-9, landmarks=factor * 40)
    np.testing.assert_allclose(approx, exact, atol=1e-7)


def test_heat_flow_with_few_landmarks_still_diffuses():
    # variance grows by 2t (the heat equation), also through a 64-landmark kernel
    x0 = np.random.default_rng(7).normal(size=(3000, 1))
    x1 = sinkflow.heat_flow(x0, 0.1, 0.2, 0.05, "sinkhorn", landmarks=64)
    assert abs((x1.var() - x0.var()) - 0.2) < 0.03


@pytest.mark.parametrize("normalization", ["sinkhorn", "row", "none"])
def test_kept_and_recomputed_factors_give_the_same_field(monkeypatch, normalization):
    # B = L A^{+1/2} kept in memory (small n) or L recomputed block by block with A^+ in between (large n)
    x = torch.tensor(np.random.default_rng(4).normal(size=(300, 2)))
    idx = sinkflow.particles.landmark_indices(300, 40, generator=2)
    kw = dict(normalization=normalization, W=W, temperature=0.7, weights=_weights(300), n_iter=7, block_bytes=4000)
    kept = lowrank_attention_field(x, x, idx, **kw)
    monkeypatch.setattr(lowrank_fields, "CACHE_BYTES", 0)
    recomputed = lowrank_attention_field(x, x, idx, **kw)
    torch.testing.assert_close(recomputed.velocity, kept.velocity, rtol=1e-9, atol=1e-9)
    assert recomputed.row_error == pytest.approx(kept.row_error, rel=1e-6, abs=1e-12)


def _dense_nystrom_field(x, V, idx, tau, a, n_iter, normalization, scores, restore=False, metric=W):
    """The same scalings on the dense Nystrom matrix L pinv(A) L^T of the kernel exp(-|x_i - x_j|_W^2 / (2 tau))
    (``restore``: plus the diagonal that makes it exact there, 1 - G~_ii >= 0)."""
    z = x @ torch.linalg.cholesky(metric.to(x.dtype)) / tau ** 0.5
    G = torch.exp(-torch.cdist(z, z) ** 2 / 2)
    Gt = G[:, idx] @ torch.linalg.pinv(G[idx][:, idx], rtol=torch.finfo(x.dtype).eps ** 0.5, hermitian=True) @ G[idx]
    if restore:
        Gt = Gt + torch.diag((1 - torch.diagonal(Gt)).clamp_min(0))
    half_sq = 0.5 * ((x @ metric.to(x.dtype)) * x).sum(1) / tau if scores == "dot" else torch.zeros_like(x[:, 0])
    pw = a * torch.exp(half_sq)  # e^{x_i^T W x_j / tau} a_j = e^{half_sq_i} G_ij pw_j
    if normalization == "none":
        return torch.exp(half_sq)[:, None] * (Gt @ (pw[:, None] * V))
    for k in range(n_iter):
        if k % 2 == 0:
            u = 1 / (Gt @ pw)
        else:
            pw = a / (Gt @ (a * u))
    return u[:, None] * (Gt @ (pw[:, None] * V))


@pytest.mark.parametrize("cache_bytes", [lowrank_fields.CACHE_BYTES, 0])
@pytest.mark.parametrize("normalization,n_iter", [("sinkhorn", 2), ("sinkhorn", 3), ("sinkhorn", 4), ("sinkhorn", 7),
                                                  ("row", None), ("none", None)])
@pytest.mark.parametrize("dtype,tol,spread,scores", [(torch.float64, 1e-8, 1, "dot"), (torch.float32, 1e-4, 1, "dot"),
                                                     (torch.float64, 1e-8, 10, "gaussian"),
                                                     (torch.float32, 1e-4, 4, "gaussian")])
def test_few_landmarks_match_a_dense_nystrom_reimplementation(monkeypatch, cache_bytes, normalization, n_iter,
                                                              dtype, tol, spread, scores):
    # float32: rounding amplified by the pseudo-inverse up to eps / cutoff = 1.2e-7 / 3.5e-4 relative; measured 2e-5.
    # m = 60 of n = 200 farthest-point landmarks; odd and even counts end on a row / a column step
    # (the velocity pass differs).
    # spread 1: no exponent reaches the exp floor, the clamp is skipped; 10 (float64) and 4 (float32): some
    # entries are clamped to exactly 0 (the dense oracle keeps e^{-700}, e^{-90}: below any tolerance), with
    # Gaussian scores (dot scores weigh the far particles by e^{|x|^2 / 2}, which m = 60 do not approximate)
    monkeypatch.setattr(lowrank_fields, "CACHE_BYTES", cache_bytes)
    x = spread * torch.tensor(np.random.default_rng(3).normal(size=(200, 2)))
    z = sinkflow.particles.gaussian_coordinates(x.to(dtype), W.to(dtype), 1.0)
    idx, a = sinkflow.particles.farthest_point_indices(z, 60, 0), _weights(200, seed=5)
    assert lowrank_fields._NystromKernel(z, idx).clamp == (spread > 1)
    V = torch.tensor(np.random.default_rng(4).normal(size=(200, 3)))
    exact = _dense_nystrom_field(x.to(dtype), V.to(dtype), idx, 1.0, a.to(dtype), n_iter or 1, normalization, scores)
    got = lowrank_attention_field(x.to(dtype), V.to(dtype), idx, normalization=normalization, W=W.to(dtype),
                                  scores=scores,
                                  weights=a.to(dtype), n_iter=n_iter, block_bytes=8000).velocity
    torch.testing.assert_close(got, exact, rtol=0, atol=tol * float(exact.abs().max()))


@pytest.mark.parametrize("cache_bytes", [lowrank_fields.CACHE_BYTES, 0])
def test_the_fallback_restores_the_exact_diagonal(monkeypatch, cache_bytes):
    # 400 normal points, 8 uniform landmarks, n_iter 5: a column mass of the plain Nystrom matrix
    # is not positive, so the solve is redone on G~ + diag(1 - G~_ii); against that matrix written
    # out densely (half the restored diagonal moved the velocity by 3%).
    monkeypatch.setattr(lowrank_fields, "CACHE_BYTES", cache_bytes)
    rng = np.random.default_rng(5)
    x = torch.tensor(rng.normal(size=(400, 2)))
    idx = torch.tensor(rng.choice(400, 8, replace=False))
    a = torch.full((400,), 1 / 400, dtype=x.dtype)
    restored = []
    restore = lowrank_fields._NystromKernel.restore_diagonal
    monkeypatch.setattr(lowrank_fields._NystromKernel, "restore_diagonal", lambda K: restored.append(restore(K)))
    got = lowrank_attention_field(x, x, idx, n_iter=5, block_bytes=8000).velocity
    assert len(restored) == 1  # the plain Nystrom scaling was undefined
    want = _dense_nystrom_field(x, x, idx, 1.0, a, 5, "sinkhorn", "dot", restore=True, metric=torch.eye(2))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9 * float(want.abs().max()))


@pytest.mark.parametrize("cache_bytes", [lowrank_fields.CACHE_BYTES, 0])
def test_particles_no_landmark_sees_keep_their_own_weight_never_nan(monkeypatch, cache_bytes):
    monkeypatch.setattr(lowrank_fields, "CACHE_BYTES", cache_bytes)
    # two far clusters, landmarks only in the first: rows of the second get no (or negative) Nyström
    # mass; with the exact diagonal restored each of them is isolated, K_ii = 1, as in the exact kernel
    x = torch.cat([torch.randn(10, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64),
                   100 + 10 * torch.randn(10, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)])
    with pytest.raises(NystromPositivityError):  # the plain Nyström scaling is undefined here
        lowrank_fields._scaled(lowrank_fields._NystromKernel(x, torch.arange(5)), x, torch.zeros(20, dtype=x.dtype),
                               torch.full((20,), 0.05, dtype=x.dtype), None, 1e-9, 100, None)
    r = lowrank_attention_field(x, x, torch.arange(5), normalization="sinkhorn", scores="gaussian", max_iter=200)
    assert torch.isfinite(r.velocity).all()
    torch.testing.assert_close(r.velocity[10:], x[10:], rtol=1e-6, atol=1e-6)
    with pytest.raises(NystromPositivityError, match="non-positive kernel mass"):
        lowrank_fields._positive(torch.tensor([1.0, 0.0]), "rows", 3)
    with pytest.raises(ValueError, match="positive semi-definite"):
        sinkflow.simulate(x.numpy(), "sinkhorn", W_K=-np.eye(2), h=1e-5, steps=1, landmarks=4)


def test_landmarks_need_a_symmetric_interaction():
    with pytest.raises(ValueError, match="symmetric"):
        sinkflow.simulate(np.eye(2), "sinkhorn", W_K=np.array([[1.0, 1.0], [0.0, 1.0]]), steps=1, landmarks=2)


def _covering_radius(D, J):
    """max_i min_{j in J} D_ij by brute force."""
    return float(D[:, J].min(1).values.max())


def test_farthest_points_cover_the_cloud_and_certify_the_radius():
    # a Gaussian cloud plus a few far outliers, in the kernel's coordinates of an anisotropic W
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(300, 2, generator=g, dtype=torch.float64),
                   6 + torch.randn(4, 2, generator=g, dtype=torch.float64)])
    z = sinkflow.particles.gaussian_coordinates(x, W, 0.3)
    D = torch.cdist(z, z)
    full = sinkflow.particles.landmark_indices(len(x), 40, sampling="farthest", points=z, generator=1)
    assert len(set(full.tolist())) == 40
    radii = []
    for m in range(1, 40):
        J = sinkflow.particles.landmark_indices(len(x), m, sampling="farthest", points=z, generator=1)
        assert J.tolist() == full[:m].tolist()  # greedy: nested choices
        radii.append(_covering_radius(D, J))
        # the next pick is a farthest point, and the m + 1 chosen points are >= r_m apart: r_m <= 2 r*_m
        assert float(D[full[m], J].min()) == pytest.approx(radii[-1], rel=1e-9)
        pair = D[full[:m + 1]][:, full[:m + 1]] + torch.diag(torch.full((m + 1,), torch.inf, dtype=D.dtype))
        assert float(pair.min()) >= radii[-1] * (1 - 1e-9)
    assert all(b <= a for a, b in itertools.pairwise(radii))
    uniform = sinkflow.particles.landmark_indices(len(x), 39, points=z, generator=1)
    assert _covering_radius(D, uniform) > 1.5 * radii[-1]  # the outliers are what uniform draws miss
    assert sinkflow.particles.farthest_point_indices(z, 400).tolist() == list(range(len(x)))


@pytest.mark.parametrize("d, dtype", [(1, torch.float64), (2, torch.float64), (3, torch.float64),
                                      (2, torch.float32)])  # float32 in d = 2: rows gathered as int64
def test_blocked_farthest_point_search_makes_the_plain_greedy_picks(monkeypatch, d, dtype):
    # small blocks: most of them are skipped, by the bounding-box test, once the radius shrinks
    monkeypatch.setattr(landmarks_module, "FPS_BLOCK", 32)
    rng = np.random.default_rng(d)
    z = np.concatenate([rng.normal(size=(3000, d)), 8 + rng.normal(size=(5, d))])
    z = torch.tensor(z, dtype=dtype).double().numpy()  # the oracle sees the points the search sees
    idx = sinkflow.particles.farthest_point_indices(torch.tensor(z, dtype=dtype), 80, generator=3).tolist()
    picks, nearest = [idx[0]], ((z - z[idx[0]]) ** 2).sum(1)
    for _ in range(79):
        picks.append(int(nearest.argmax()))
        nearest = np.minimum(nearest, ((z - z[picks[-1]]) ** 2).sum(1))
    assert idx == picks


@pytest.fixture(scope="module")
def heat_tails():
    """2000 normal points, eps = 0.05: uniform landmarks left the tails uncovered (NystromPositivityError)."""
    x0 = torch.randn(2000, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return x0, sinkflow.heat_flow(x0, 0.5, eps=0.05, dt=0.01)


@pytest.mark.parametrize("m,dtype", [(64, torch.float64), (256, torch.float64), (256, torch.float32)])
def test_heat_flow_with_farthest_landmarks_reaches_the_heat_variance(heat_tails, m, dtype):
    x0, exact = heat_tails
    t, eps = 0.5, 0.05
    x1 = sinkflow.heat_flow(x0.to(dtype), t, eps=eps, dt=0.01, landmarks=m)
    s0, s1 = float(x0.var()), float(x1.double().var())
    # heat equation: variance + 2t; the Sinkhorn layer's rate is 2 - eps / (2s) + O(eps^2) (sinkflow.heat.symbolic), so
    # the exact particles lag by at most eps t / (2 s0) = 0.013 (measured 0.006, Nyström 0.005-0.006)
    assert abs(s1 - (s0 + 2 * t)) < eps * t / (2 * s0)
    assert abs(s1 - float(exact.var())) < 2e-3  # the exact flow at the same n; measured 7e-4 (m = 64), 2e-4
    with pytest.raises(NystromPositivityError):
        sinkflow.heat_flow(x0.to(dtype), t, eps=eps, dt=0.01, landmarks=m, landmark_sampling="uniform")


def test_landmark_sampling_is_checked():
    x = np.random.default_rng(0).normal(size=(10, 1))
    with pytest.raises(ValueError, match="landmark_sampling"):
        sinkflow.simulate(x, "sinkhorn", steps=1, landmarks=4, landmark_sampling="random")
    with pytest.raises(ValueError, match="landmark_sampling"):
        sinkflow.heat_flow(x, 0.1, 0.1, 0.05, landmarks=4, landmark_sampling="kmeans")
    with pytest.raises(ValueError, match="needs points"):
        sinkflow.particles.landmark_indices(10, 4, sampling="farthest")
    with pytest.raises(ValueError, match="shape"):
        sinkflow.particles.farthest_point_indices(torch.zeros(5), 2)


def test_farthest_points_do_not_depend_on_where_the_cloud_sits():
    # float32 squared distances expanded as |z|^2 + |c|^2 - 2 z.c lose their digits far from
    # the origin (the picks of a cloud shifted by 1000 used to differ); the search centres first
    from sinkflow.fields._landmarks import farthest_point_indices

    z = torch.randn(5000, 2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(farthest_point_indices(z + 1000.0, 64, generator=0), farthest_point_indices(z, 64, generator=0))



@pytest.mark.parametrize("dtype, rtol", [(torch.float16, 4e-3), (torch.bfloat16, 3e-2)])
def test_landmark_field_takes_half_precision_and_returns_it(dtype, rtol):
    """Half input runs in float32 inside (no CPU eigh in half): the float32 field of the rounded input,
    rounded once more (relative tolerance a few units of the dtype's rounding; measured 5e-4 / 2.5e-3)."""
    x = torch.randn(60, 2, generator=torch.Generator().manual_seed(0)).to(dtype)
    ref = lowrank_attention_field(x.float(), x.float(), 12).velocity
    out = lowrank_attention_field(x, x, 12).velocity
    assert out.dtype == dtype
    assert float((out.float() - ref).abs().max()) <= rtol * float(ref.abs().max())


def test_landmark_field_reads_tensors_that_require_grad():
    x = torch.randn(60, 2, generator=torch.Generator().manual_seed(1))
    leaf = x.clone().requires_grad_()
    out = lowrank_attention_field(leaf, leaf, 12).velocity
    assert torch.equal(out, lowrank_attention_field(x, x, 12).velocity) and not out.requires_grad


def test_landmark_field_refuses_no_particles():
    with pytest.raises(ValueError, match="at least one particle"):
        lowrank_attention_field(torch.zeros(0, 2), torch.zeros(0, 2), 4)
