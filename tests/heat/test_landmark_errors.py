"""Error of landmark-approximated flows: spectral error, field error, Grönwall estimate, energy, heat variance."""

import numpy as np
import pytest

import sinkflow
from sinkflow.heat._landmark_errors import heat_variance_errors, landmark_flow_errors, nystrom_spectral_error


def test_spectral_error_matches_a_plain_nystrom_in_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    J = np.array([0, 3, 7, 11, 20, 33])
    tau = 0.7
    G = np.exp(-((x[:, None, :] - x[None, :, :]) ** 2).sum(-1) / (2 * tau))
    approx = G[:, J] @ np.linalg.pinv(G[np.ix_(J, J)]) @ G[J, :]
    oracle = np.linalg.norm(G - approx, 2) / np.linalg.norm(G, 2)
    # Measured over 30 draws (x and J from seeds 0-29): relative differences up to 2.2e-14, i.e.
    # rounding. Bound 1e-12, 45x that, as rounding moves with the BLAS build (a float32 step fails).
    assert nystrom_spectral_error(x, J, temperature=tau) == pytest.approx(oracle, rel=1e-12)


@pytest.fixture(scope="module")
def study():
    x0 = sinkflow.random_particles(24, 2, seed=0)
    return landmark_flow_errors(x0, (6, 12, 24), h=0.05, steps=8)


def test_deviation_stays_under_the_gronwall_estimate_and_vanishes_with_all_landmarks(study):
    assert np.all(study.deviation <= study.bound_estimate + 1e-12)
    # All 24 particles as landmarks: rounding and the 1e-11 solves only. Measured on starts of seeds
    # 0-15: deviation up to 1.5e-10 and field error up to 1.13e-9 (seed 0: 3.3e-11, 2.0e-10).
    # Bounds: 2x the worst of those seeds.
    assert study.deviation[-1].max() < 3e-10 and study.field_error[-1] < 2.5e-9
    # more landmarks: smaller spectral error, field error and deviation
    assert np.all(np.diff(study.spectral_error) < 0) and np.all(np.diff(study.field_error) < 0)
    assert np.all(np.diff(study.deviation[:, -1]) < 0)
    # short times: e_1 = h delta_1 is the bound's first step; the bound is loose later (ratio grows)
    ratio = study.bound_estimate[0, 1:] / study.deviation[0, 1:]
    assert ratio[-1] > ratio[0]


def test_energy_decreases_along_the_approximate_sinkhorn_flow(study):
    assert np.all(np.diff(study.energy_exact) < 0)
    assert np.all(np.diff(study.energy[1:], axis=1) < 0)  # m = 12, 24


def test_heat_variance_error_of_the_landmark_layer_is_small():
    # the eps-bias of the Sinkhorn layer is O(eps t); sampling noise O(n^-1/2): mean over 4 seeds.
    # Measured over seeds 0-47 with the flows' farthest-point landmarks: one seed's error up to
    # 0.0065 (n = 1000) and 0.0056 (n = 4000); the mean of 4 consecutive seeds up to 0.0060 and
    # 0.0053 (12 groups). Bound: 2x that worst mean. (Uniform landmarks: group means up to 0.0112.)
    errors = np.mean([heat_variance_errors([1000, 4000], 64, t=0.1, eps=0.2, dt=0.05, seed=s) for s in range(4)], 0)
    assert np.all(errors < 0.012)


def test_2d_heat_figure_data_follow_the_mean_field_of_the_sinkhorn_layers():
    from sinkflow.plots.landmarks import LandmarkHeat2DConfig, _sinkhorn_layers_variance, compute_heat_2d

    cfg = LandmarkHeat2DConfig()
    d = compute_heat_2d(cfg)
    t = d["times"]
    # the oracle, continuous in time: rate 2 - eps / (2 s) + O(eps^2) with 1 <= s <= 1 + 2t, so the lag behind
    # the heat's growth 2t lies between eps t / (2 (1 + 2t)) and eps t / 2
    lag = 2 * t - (_sinkhorn_layers_variance(1.0, cfg.eps, 1e-4, t) - 1.0)
    assert np.all(lag > 0.9 * cfg.eps * t / (2 * (1 + 2 * t))) and np.all(lag < cfg.eps * t / 2)
    # the Nyström particles (n = 3000) follow the mean field of the same Euler layers (measured 0.0044 at t = 0.5,
    # 2e-4 at n = 10^5), 0.025 below the heat's growth; with m = 64 landmarks it was 0.24 off
    assert np.all(np.abs(d["growth_landmark"] - d["growth_mean_field"]) < 0.012)
    assert d["growth_heat"][-1] - d["growth_mean_field"][-1] > 0.02
    # radial density at the last time: L1 distance to the heat's Rayleigh law (measured 0.07; the start's law: 0.50)
    width = np.diff(d["radius"])[0]
    assert np.abs(d["density_landmark"] - d["density_heat"]).sum() * width < 0.15


def _jacobian_norms(x, W, tau, step=1e-6):
    """Spectral norm and largest block row sum (max_i sum_k |J_ik|_2, the Lipschitz constant in the
    max-over-particles norm is at most this) of the exact Sinkhorn field's Jacobian, by central differences."""
    import torch

    from sinkflow.fields._dense_fields import attention_field

    Wt = torch.as_tensor(W)

    def field(y):
        return attention_field(torch.as_tensor(y), "sinkhorn", Wt, Wt, temperature=tau, tol=1e-13).velocity.numpy()

    n, d = x.shape
    J = np.empty((n, d, n, d))
    for k in range(n):
        for c in range(d):
            e = np.zeros_like(x)
            e[k, c] = step
            J[:, :, k, c] = (field(x + e) - field(x - e)) / (2 * step)
    spectral = np.linalg.norm(J.reshape(n * d, n * d), 2)
    rows = np.linalg.norm(J.transpose(0, 2, 1, 3), 2, axis=(2, 3)).sum(1).max()
    return spectral, rows


def _configuration(rng, outlying):
    n, d = 8, 2
    x = rng.normal(size=(n, d)) * (rng.choice([0.1, 0.3, 1.0]) if outlying else 1.0)
    if outlying:  # one or two particles 2 to 8 away from a small cloud
        k = int(rng.integers(1, 3))
        x[:k] = rng.normal(size=(k, d))
        x[:k] *= rng.uniform(2, 8, size=(k, 1)) / np.linalg.norm(x[:k], axis=1, keepdims=True)
    A = rng.normal(size=(d, d))
    W = A @ A.T / d + 0.1 * np.eye(d) if rng.random() < 0.5 else np.eye(d)
    return x, W, float(rng.choice([0.25, 1.0, 4.0]))


@pytest.mark.slow  # 6 s
def test_lipschitz_estimate_of_the_gronwall_estimate_is_measured_not_certified():
    # issue 19: the Grönwall "bound" used lipschitz_scale as if it were a Lipschitz constant. It is an
    # estimate; this measures how often it holds, against finite-difference Jacobians of the exact
    # Sinkhorn field (W_V = W), on 16 random and 16 outlying configurations (n = 8, d = 2).
    # Measured (seed 0): spectral norm / estimate at most 0.59 (random) and 0.56 (outlying), block row
    # sum / estimate at most 0.82 and 0.71: the estimate held on 32 of 32. It is still no constant: an
    # exploratory draw of 40 outlying configurations (temperatures 0.1 to 4) had 2 whose block row sum
    # exceeded it (1.05x and 1.06x, both at temperature 4), and the issue measured up to 1.55x.
    # Asserted: what held here, with the row sums allowed the worst case on a few.
    import torch

    from sinkflow.particles import lipschitz_scale

    rng = np.random.default_rng(0)
    ratios = {False: [], True: []}
    for outlying in (False, True):
        for _ in range(16):
            x, W, tau = _configuration(rng, outlying)
            L = lipschitz_scale(torch.as_tensor(x), torch.as_tensor(W), torch.as_tensor(W), tau)
            spectral, rows = _jacobian_norms(x, W, tau)
            ratios[outlying].append((spectral / L, rows / L))
    random_, outl = np.array(ratios[False]), np.array(ratios[True])
    assert (random_ <= 1).all() and (outl[:, 0] <= 1).all()
    assert (outl[:, 1] <= 1).mean() >= 0.9 and outl[:, 1].max() < 1.6
