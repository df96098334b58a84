"""The semi-Lagrangian (remap) scheme of mean_field_flow (sinkflow/heat/_remap.py).

Oracles: exact cell integrals of a piecewise-linear function (closed form), the explicit
limited-upwind Heun scheme of the same solver at small steps, a reference run at a 32x finer
step for the order in dt, and the CFL step of the explicit scheme for "far above CFL".
"""

import math

import numpy as np
import pytest
import torch

import sinkflow.heat._mean_field as mf
from sinkflow.heat._mean_field import mean_field_flow
from sinkflow.heat._remap import remap, remap_cells

MIXTURE_Y = np.linspace(-6, 6, 241)


def mixture_cells(y):
    rho = (0.4 * np.exp(-(y + 1) ** 2 / 0.6) / math.sqrt(0.6 * math.pi)
           + 0.6 * np.exp(-(y - 0.8) ** 2 / 1.0) / math.sqrt(math.pi))
    return rho / (rho.sum() * (y[1] - y[0]))


def box_cells(y):
    """A discontinuous start: the indicator of [-1, 1] plus a narrow bump (stresses positivity)."""
    rho = (np.abs(y) < 1).astype(float) + 4 * np.exp(-(y - 2) ** 2 / 0.02)
    return rho / (rho.sum() * (y[1] - y[0]))


def test_remap_cells_integrates_the_linear_reconstruction_exactly():
    """Against int of rho_j + s_j (x - j - 1/2) over [u_i, u_{i+1}], summed piece by piece in numpy."""
    rng = np.random.default_rng(0)
    rho = rng.uniform(0.5, 2.0, 12)
    slope = rng.uniform(-0.5, 0.5, 12)
    u = np.sort(rng.uniform(0, 12, 9))
    u[0], u[-1] = 0.0, 12.0

    def integral(a, b):
        total = 0.0
        for j in range(12):
            lo, hi = max(a, j), min(b, j + 1)
            if hi > lo:  # antiderivative of the linear piece
                total += rho[j] * (hi - lo) + slope[j] * ((hi - j - 0.5) ** 2 - (lo - j - 0.5) ** 2) / 2
        return total

    def t(a):
        return torch.tensor(a, dtype=torch.float64)

    got = remap_cells(t(rho), t(slope), t(u)).numpy()
    assert got == pytest.approx([integral(a, b) for a, b in zip(u[:-1], u[1:], strict=True)], rel=1e-13, abs=1e-15)
    assert got.sum() == pytest.approx(rho.sum(), rel=1e-14)


def test_remap_refuses_crossed_faces_and_wraps_on_the_circle():
    rho = torch.rand(16, dtype=torch.float64) + 0.1
    assert remap(rho, torch.tensor([0.0, 3.0, 2.0] + list(range(3, 17)), dtype=torch.float64), False) is None
    shifted = remap(rho, torch.arange(17, dtype=torch.float64) + 16 * 5 + 3, True)  # five turns and 3 cells
    assert torch.allclose(shifted, torch.roll(rho, -3), rtol=1e-12)


@pytest.mark.parametrize("normalization, ratio", [("sinkhorn", 15), ("softmax_gaussian", 15), ("unnormalized", 0.5),
                                                  ("softmax_dot", 2)])
def test_mass_to_rounding_and_positivity_far_above_the_cfl_step(normalization, ratio):
    """Largest step against the explicit scheme's CFL step (measured 19x, 21x, 0.85x, 2.8x: the
    unnormalized field is fast in the bulk too, where accuracy sets both steps). The start has
    empty cells, which the support gains as it spreads (Sinkhorn starts them cold)."""
    y = MIXTURE_Y
    rho = box_cells(y)
    explicit = mean_field_flow(rho, y, [0.05], normalization=normalization, eps=0.1, scheme="explicit")
    cfl_step = explicit.dt_max  # the explicit scheme's step, cut to its CFL condition
    r = mean_field_flow(rho, y, [0.05, 0.25], normalization=normalization, eps=0.1)
    assert r.scheme == "semi_lagrangian" and r.converged
    assert r.dt_max > ratio * cfl_step, (r.dt_max, cfl_step)
    assert r.mass_error < 1e-14 and r.min_density >= 0
    assert bool((r.densities >= 0).all())


@pytest.mark.parametrize("normalization, tol", [("sinkhorn", 1e-5), ("softmax_gaussian", 1e-5),
                                                ("unnormalized", 1e-5)])
def test_agrees_with_the_explicit_scheme_at_small_steps(normalization, tol):
    """L1 distance at dt = 1e-3, t = 0.25 (measured 3.0e-6, 4.7e-6, 2.8e-6: the two spatial
    discretizations' difference; SoftMax-dot differs by 7e-3, its far-tail sensitivity)."""
    y, h = MIXTURE_Y, MIXTURE_Y[1] - MIXTURE_Y[0]
    rho = mixture_cells(y)
    ex = mean_field_flow(rho, y, [0.25], normalization=normalization, eps=0.1, scheme="explicit", dt=1e-3)
    sl = mean_field_flow(rho, y, [0.25], normalization=normalization, eps=0.1, dt=1e-3)
    assert np.abs(ex.final - sl.final).sum() * h < tol
    default = mean_field_flow(rho, y, [0.25], normalization=normalization, eps=0.1)  # controller's steps
    assert np.abs(ex.final - default.final).sum() * h < 5e-4 and default.n_steps < 30


def test_second_order_in_dt(monkeypatch):
    """Uniform steps (the error controller switched off): L1 error against T/256, fitted order
    (measured 1.76; 1.81 on 481 cells with T/16..T/64: the minmod limiter clips at extrema)."""
    monkeypatch.setattr(mf, "LOCAL_TOL", math.inf)
    y, h, T = MIXTURE_Y, MIXTURE_Y[1] - MIXTURE_Y[0], 0.25
    rho = mixture_cells(y)

    def run(dt):
        return mean_field_flow(rho, y, [T], normalization="sinkhorn", eps=0.1, dt=dt).final

    ref = run(T / 256)
    dts = np.array([T / 8, T / 16, T / 32])
    errs = [np.abs(run(dt) - ref).sum() * h for dt in dts]
    order = np.polyfit(np.log(dts), np.log(errs), 1)[0]
    assert 1.6 < order < 2.3, (order, errs)


def test_float32_matches_float64():
    y = MIXTURE_Y
    rho = mixture_cells(y)
    r64 = mean_field_flow(rho, y, [0.25], normalization="sinkhorn", eps=0.1)
    r32 = mean_field_flow(torch.tensor(rho, dtype=torch.float32), y, [0.25], normalization="sinkhorn", eps=0.1)
    assert r32.densities.dtype == torch.float32 and r32.min_density >= 0 and r32.mass_error < 1e-5
    assert np.abs(r32.final.numpy() - r64.final).max() < 1e-4 * rho.max()


def test_scheme_choice_is_checked():
    a = np.linspace(-5, 5, 41)
    rho = np.outer(np.exp(-a ** 2 / 2), np.exp(-a ** 2 / 2))
    rho /= rho.sum() * (a[1] - a[0]) ** 2
    assert mean_field_flow(rho, (a, a), [0.01], normalization="sinkhorn", eps=1.0).scheme == "explicit"
    with pytest.raises(ValueError, match="one-dimensional"):
        mean_field_flow(rho, (a, a), [0.01], normalization="sinkhorn", eps=1.0, scheme="semi_lagrangian")
    with pytest.raises(ValueError, match="scheme must be one of"):
        mean_field_flow(rho[0] / (rho[0].sum() * 0.25), a, [0.01], normalization="sinkhorn", eps=1.0, scheme="implicit")


def test_circle_energy_by_fft_matches_the_dense_double_sum():
    from sinkflow.clustering import circle_energy
    from sinkflow.heat import uniform_angles

    rng = np.random.default_rng(3)
    for G, beta in ((64, 5.0), (257, 12.0)):
        th = uniform_angles(G)
        rho = 1 + 0.5 * np.cos(3 * th + 1) + 0.2 * rng.uniform(size=G)
        rho /= rho.sum() * 2 * np.pi / G
        w = rho * 2 * np.pi / G
        dense = w @ np.exp(beta * np.cos(th[:, None] - th[None])) @ w / (2 * beta)
        assert circle_energy(rho, beta) == pytest.approx(dense, rel=1e-12)


def test_one_equispaced_check_for_every_grid():
    from sinkflow.heat._distances import equispaced_centres, grid_quantiles

    bad = np.array([0.0, 1.0, 2.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0])
    for call in (lambda: equispaced_centres(bad), lambda: grid_quantiles(np.ones(9), bad, 0.5),
                 lambda: mean_field_flow(np.full(9, 1 / 9), bad, [0.1], normalization="sinkhorn", eps=4.0)):
        with pytest.raises(ValueError, match="equispaced"):
            call()
    with pytest.raises(ValueError, match="one turn"):
        mean_field_flow(np.full(9, 1 / (2 * np.pi)), np.linspace(0, 6, 9), [0.1], normalization="softmax",
                        manifold="circle", temperature=1.0)
    assert equispaced_centres(torch.linspace(0, 1, 5)).tolist() == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])


def test_circle_remap_through_clustering_keeps_mass_and_sign_and_agrees_with_explicit():
    """beta = 5 from a near-uniform start to t = 15 and 20 (3 clusters have formed): the periodic remap against
    the explicit scheme."""
    from sinkflow.clustering import count_clusters
    from sinkflow.heat import uniform_angles

    th = uniform_angles(128)
    rho = (1 + 1e-3 * np.cos(3 * th) + 5e-4 * np.cos(2 * th + 1)) / (2 * np.pi)
    runs = [mean_field_flow(rho, th, [15.0, 20.0], normalization="softmax", temperature=0.2, manifold="circle",
                            scheme=scheme) for scheme in ("semi_lagrangian", "explicit")]
    sl, ex = runs
    assert sl.mass_error < 1e-13 and sl.min_density >= 0
    assert [count_clusters(d) for d in sl.densities] == [count_clusters(d) for d in ex.densities] == [3, 3]
    assert np.abs(sl.final - ex.final).sum() * 2 * np.pi / 128 < 0.01  # measured 2.0e-3 (1.9e-2 at t = 15)
