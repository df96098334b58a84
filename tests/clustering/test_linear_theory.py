"""The linear theory of clustering on the circle and the sphere (sinkflow.clustering).

Oracles: scipy quadrature of the linearized velocity on the circle (the Bessel identity of the
growth rates), a finite-difference linearization of the mean-field velocity, particles of
simulate from perturbed equispaced angles (growth at the linear rate) and zonal harmonics on
S^2 (Funk-Hecke), and planted clusters for the counts.
"""

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import iv

import sinkflow
from sinkflow.clustering import (
    angular_density,
    circle_growth_rate,
    count_clusters,
    fastest_mode,
    particle_cluster_count,
)


@pytest.mark.parametrize("beta", [0.5, 5.0, 12.0])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_circle_rate_bessel_identity_by_quadrature(k, beta):
    """lambda_k (unnormalized) = (1/2pi) k int e^{beta cos psi} sin psi sin(k psi) dpsi."""
    J = quad(lambda p: math.exp(beta * math.cos(p)) * math.sin(p) * math.sin(k * p), 0, 2 * math.pi, limit=200)[0]
    assert circle_growth_rate(k, beta, "unnormalized") == pytest.approx(k * J / (2 * math.pi), rel=1e-9)
    Z = quad(lambda p: math.exp(beta * math.cos(p)), 0, 2 * math.pi)[0] / (2 * math.pi)  # I_0, the SoftMax mass
    assert circle_growth_rate(k, beta, "softmax") == pytest.approx(k * J / (2 * math.pi) / Z, rel=1e-9)


def pot_circle_linear_rate(k, beta, normalization, G=96, delta=1e-5):
    """Growth of cos(k theta) from the nonlinear velocity, central differences, plain numpy / POT."""
    ot = pytest.importorskip("ot")
    th = 2 * np.pi * (np.arange(G) + 0.5) / G
    h = 2 * np.pi / G
    kernel = np.exp(beta * np.cos(th[:, None] - th[None]))
    sin = np.sin(th[None] - th[:, None])

    def minus_div_flux(d):
        rho = (1 + d * np.cos(k * th)) / (2 * np.pi)
        w = rho * h
        if normalization == "sinkhorn":
            plan = ot.sinkhorn(w, w, -beta * np.cos(th[:, None] - th[None]), reg=1.0, stopThr=1e-15, numItermax=100000)
            v = (plan * sin).sum(1) / w
        elif normalization == "softmax":
            v = (kernel * sin) @ w / (kernel @ w)
        else:
            v = (kernel * sin) @ w
        flux_hat = np.fft.rfft(rho * v)
        return np.fft.irfft(-1j * np.arange(G // 2 + 1) * flux_hat, G)  # spectral -d/dtheta

    drho = (minus_div_flux(delta) - minus_div_flux(-delta)) / (2 * delta)
    return (drho @ np.cos(k * th)) / ((np.cos(k * th) / (2 * np.pi)) @ np.cos(k * th))


@pytest.mark.parametrize("normalization", ["softmax", "unnormalized", "sinkhorn"])
@pytest.mark.parametrize("k, beta", [(1, 2.0), (3, 5.0), (4, 5.0)])
def test_circle_rate_formula_is_the_linearized_velocity(normalization, k, beta):
    measured = pot_circle_linear_rate(k, beta, normalization)
    assert circle_growth_rate(k, beta, normalization) == pytest.approx(measured, rel=1e-6)


def test_fastest_mode_is_the_argmax_of_the_bessel_rates():
    for beta in (1.0, 3.0, 5.0, 9.0, 20.0):
        ks = np.arange(1, 40)
        assert fastest_mode(beta, "softmax") == ks[np.argmax(ks ** 2 * iv(ks, beta))]
        assert fastest_mode(beta, "sinkhorn") == ks[np.argmax(ks ** 2 * iv(ks, beta) / (iv(0, beta) + iv(ks, beta)))]
    assert fastest_mode(5.0, "softmax") == 3  # the 3-periodic state of Bruno, Pasqualotto and Agazzi at beta = 5


@pytest.mark.parametrize("beta", [709.0, 710.0, 800.0, 5000.0])
def test_rates_and_fastest_modes_past_the_overflow_of_e_beta(beta):
    # The unnormalized rate's e^beta overflows float64 past 709.78: it was evaluated for every
    # normalization (OverflowError for SoftMax and Sinkhorn). Oracle: mpmath's Bessel functions.
    import mpmath

    ks = np.arange(1, int(4 * math.sqrt(beta)) + 5)
    bessel = [mpmath.besseli(int(k), beta) for k in ks]
    I0 = mpmath.besseli(0, beta)
    want = {"softmax": [k * k * i / (beta * I0) for k, i in zip(ks, bessel, strict=True)],
            "sinkhorn": [k * k * i / (beta * (I0 + i)) for k, i in zip(ks, bessel, strict=True)],
            "unnormalized": [k * k * i / beta for k, i in zip(ks, bessel, strict=True)]}
    for normalization, rates in want.items():
        assert fastest_mode(beta, normalization) == ks[int(np.argmax([float(r / rates[0]) for r in rates]))]
        if normalization == "unnormalized" and beta > 709.8:
            with pytest.raises(OverflowError, match="beyond float64 for beta > 709.8"):
                circle_growth_rate(ks, beta, normalization)
            continue
        np.testing.assert_allclose(circle_growth_rate(ks, beta, normalization), [float(r) for r in rates], rtol=1e-10)


def test_fastest_mode_predicts_the_metastable_cluster_count_of_particles():
    """12 runs (4 betas x 3 seeds, n = 256, i.i.d. uniform starts), counted at twice the formation time."""
    hits = [particle_cluster_count(beta, seed) == fastest_mode(beta)
            for beta in (3.0, 5.0, 8.0, 12.0) for seed in range(3)]
    assert np.mean(hits) >= 0.6, hits


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
@pytest.mark.parametrize("caps", [False, True])
def test_particle_cluster_count_of_several_seeds_is_each_seed_alone(normalization, caps, monkeypatch):
    """Several seeds run as ensembles, one per step size; ``caps``: a step cap that depends on the start
    (planted), so that the seeds split into two groups of different step counts."""
    if caps:
        monkeypatch.setattr(sinkflow.particles, "largest_safe_step", lambda x0, *a, **k: 0.08 if x0[0, 0] > 0 else 0.12)
    seeds = [3, 4, 5, 6, 7]
    counts = particle_cluster_count(6.0, seeds, 96, normalization, h=0.1)
    assert counts.dtype.kind == "i" and counts.shape == (5,)
    assert counts.tolist() == [_count_alone(6.0, s, 96, normalization, 0.1) for s in seeds]


def _count_alone(beta, seed, n, normalization, h):
    """The documented recipe, one start at a time: capped Euler steps to twice the formation time."""
    theta = np.random.default_rng(seed).uniform(0, 2 * np.pi, n)
    x0 = np.stack([np.cos(theta), np.sin(theta)], 1)
    h = min(h, sinkflow.particles.largest_safe_step(x0, normalization, temperature=1 / beta))
    steps = int(round(2 * math.log(math.sqrt(n)) / circle_growth_rate(fastest_mode(beta, normalization), beta,
                                                                          normalization) / h))
    x = sinkflow.simulate(x0, normalization, h=h, steps=steps, manifold="sphere", temperature=1 / beta).final
    return count_clusters(angular_density(np.arctan2(x[:, 1], x[:, 0])))


def test_particle_cluster_count_refuses_seeds_that_are_not_integers():
    with pytest.raises(ValueError, match="seed must be an int or a sequence of ints"):
        particle_cluster_count(6.0, [0.5, 1.5], 32)


def test_count_clusters_on_planted_clusters_and_uniform():
    rng = np.random.default_rng(0)
    centres = [0.3, 1.9, 3.5, 5.1]
    theta = np.concatenate([c + 0.02 * rng.normal(size=60) for c in centres])
    assert count_clusters(angular_density(theta)) == 4
    assert count_clusters(angular_density(rng.uniform(0, 2 * np.pi, 5000))) == 0


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_particles_from_perturbed_equispaced_angles_grow_at_the_linear_rate(normalization):
    """simulate on the sphere (d = 2): the displacement mode sin(k theta) grows at lambda_k too."""
    n, k, beta = 96, 2, 3.0
    th0 = 2 * np.pi * (np.arange(n) + 0.5) / n
    th = th0 + 1e-5 * np.sin(k * th0)
    lam = circle_growth_rate(k, beta, normalization)
    traj = sinkflow.simulate(np.stack([np.cos(th), np.sin(th)], 1), normalization, h=0.05, steps=int(1.5 / lam / 0.05),
                             manifold="sphere", temperature=1 / beta, integrator="rk4")
    ang = np.unwrap(np.arctan2(traj.positions[:, :, 1], traj.positions[:, :, 0]), axis=1)
    amp = [abs(np.fft.rfft(a - th0)[k]) for a in ang]
    assert np.polyfit(traj.times, np.log(amp), 1)[0] == pytest.approx(lam, rel=1e-4)


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_sphere_d3_zonal_harmonics_grow_at_the_funk_hecke_rate(normalization):
    """Particles on S^2 (Fibonacci lattice, n = 150): a displacement along grad P_2(z) grows at lambda_2."""
    from numpy.polynomial import legendre

    from sinkflow.clustering import sphere_growth_rate

    n, degree, beta, h = 150, 2, 4.0, 0.05
    k = np.arange(n) + 0.5
    z, phi = 1 - 2 * k / n, np.pi * (1 + 5 ** 0.5) * k
    x0 = np.stack([np.sqrt(1 - z ** 2) * np.cos(phi), np.sqrt(1 - z ** 2) * np.sin(phi), z], 1)
    dP = legendre.legval(z, legendre.legder(np.eye(degree + 1)[degree]))
    grad = dP[:, None] * (np.array([0.0, 0.0, 1.0]) - z[:, None] * x0)  # surface gradient of P_l(z)
    xp = x0 + 1e-6 * grad
    xp /= np.linalg.norm(xp, axis=1, keepdims=True)
    lam = sphere_growth_rate(degree, beta, normalization)

    def run(x):
        return sinkflow.simulate(x, normalization, h=h, steps=int(1.5 / lam / h), manifold="sphere",
                                 temperature=1 / beta, integrator="rk4").positions

    base, pert = run(x0), run(xp)  # the difference removes the lattice's own (non-uniform) drift
    amp = np.einsum("tij,ij->t", pert - base, grad) / (grad ** 2).sum()
    fit = np.polyfit(h * np.arange(amp.size), np.log(np.abs(amp)), 1)[0]
    assert fit == pytest.approx(lam, rel=2e-3)




@pytest.mark.parametrize("beta, ks", [(3.0, (2, 3)), (5.0, (3, 4)), (10.0, (4, 5, 6)), (32.0, (8, 9))])
def test_sinkhorn_rates_are_the_particle_field_linearized_around_equispaced_angles(beta, ks):
    """The Sinkhorn k* (the issue: runs end at SoftMax's): one velocity of a plain dense Sinkhorn written here,
    equispaced angles displaced by eps sin(k phi), projected on sin(k phi), is lambda_k eps."""
    n, eps = 400, 1e-7
    phi = 2 * np.pi * (np.arange(n) + 0.5) / n
    for k in ks:
        th = phi + eps * np.sin(k * phi)
        K, s = np.exp(beta * (np.cos(th[:, None] - th[None, :]) - 1)) / n, np.zeros(n)
        for _ in range(10_000):
            r = s + np.log(K @ np.exp(s))
            s -= 0.5 * r
            if np.abs(r).max() < 1e-15:
                break
        P = np.exp(s)[:, None] * K * np.exp(s)[None, :]
        v = (P * np.sin(th[None, :] - th[:, None])).sum(1) / P.sum(1)
        measured = 2 * np.mean(v * np.sin(k * phi)) / eps
        assert measured == pytest.approx(circle_growth_rate(k, beta, "sinkhorn"), rel=1e-5)
