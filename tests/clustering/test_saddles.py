"""Hessians of the climbed energies against finite differences of energies written here (SoftMax's E_beta
and Sinkhorn's F^inf from a plain Sinkhorn loop), on the circle and on S^2, and the inertia of cluster
configurations."""

import numpy as np
import pytest

from sinkflow.clustering import energy_hessian, tangent_basis, unstable_directions


def _softmax_energy(x, a, beta):
    return a @ np.exp(beta * (x @ x.T - 1)) @ a / (2 * beta)


def _minus_sinkhorn_energy(x, a, beta):
    """-F^inf = -sum_i a_i s_i with s_i + log sum_j a_j e^{s_j + beta <x_i, x_j>} = 0 (plain damped loop)."""
    K, s = np.exp(beta * (x @ x.T - 1)), np.zeros(len(a))  # s shifted by beta / 2
    for _ in range(100_000):
        r = s + np.log(K @ (a * np.exp(s)))
        s -= 0.5 * r
        if np.abs(r).max() < 1e-15:
            break
    return -(a @ s - beta / 2)


def _exp_map(x, basis, xi):
    v = np.einsum("ndk,nk->nd", basis, xi)
    norm = np.linalg.norm(v, axis=1, keepdims=True)
    return np.cos(norm) * x + np.sinc(norm / np.pi) * v


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("normalization, energy", [("softmax", _softmax_energy), ("sinkhorn", _minus_sinkhorn_energy)])
def test_hessian_is_the_second_derivative_along_geodesics(d, normalization, energy):
    rng = np.random.default_rng(d)
    n, beta = 3, 2.5
    x = rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    a = rng.uniform(0.5, 1.0, n)
    a /= a.sum()
    basis, m = tangent_basis(x), n * (d - 1)

    def f(xi):
        return energy(_exp_map(x, basis, xi.reshape(n, d - 1)), a, beta)

    def second_differences(step):
        fd = np.empty((m, m))
        for i, j in np.ndindex(m, m):
            e_i, e_j = step * np.eye(m)[i], step * np.eye(m)[j]
            fd[i, j] = (f(e_i + e_j) - f(e_i - e_j) - f(e_j - e_i) + f(-e_i - e_j)) / (4 * step ** 2)
        return fd

    fd = (4 * second_differences(1e-3) - second_differences(2e-3)) / 3  # Richardson: O(step^4)
    H = energy_hessian(x, beta, a, normalization)
    np.testing.assert_allclose(H, fd, atol=1e-8 * np.abs(fd).max())
    assert np.abs(H - H.T).max() < 1e-12 * np.abs(H).max()


def test_tangent_bases_are_orthonormal_and_tangent():
    x = np.random.default_rng(0).normal(size=(50, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    B = tangent_basis(x)
    np.testing.assert_allclose(np.einsum("ndk,ndl->nkl", B, B), np.broadcast_to(np.eye(2), (50, 2, 2)), atol=1e-14)
    assert np.abs(np.einsum("ndk,nd->nk", B, x)).max() < 1e-14


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_k_clusters_on_the_circle_leave_along_k_minus_1_directions(normalization, k):
    m = 4
    theta = np.concatenate([2 * np.pi * c / k + np.linspace(-1e-3, 1e-3, m) for c in range(k)])
    assert unstable_directions(theta, 6.0, normalization=normalization) == (k - 1, 1, k * (m - 1))


@pytest.mark.parametrize("normalization", ["softmax", "sinkhorn"])
def test_two_antipodal_clusters_on_s2_leave_along_both_tangent_directions(normalization):
    rng = np.random.default_rng(1)
    pole = np.array([0.0, 0.0, 1.0])
    x = np.concatenate([pole + 1e-4 * rng.normal(size=(4, 3)), -pole + 1e-4 * rng.normal(size=(4, 3))])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    # the relative position (2 directions) climbs, the 2 tilts are set aside, the rest (spread) falls
    assert unstable_directions(x, 5.0, normalization=normalization) == (2, 2, 12)
    assert unstable_directions(np.repeat([pole, -pole], 4, axis=0), 5.0, normalization=normalization) == (2, 2, 12)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="normalization"):
        energy_hessian(np.zeros(3), 1.0, normalization="gaussian")
    with pytest.raises(ValueError, match="beta"):
        energy_hessian(np.zeros(3), -1.0)
    with pytest.raises(ValueError, match="weights"):
        energy_hessian(np.zeros(3), 1.0, weights=[1.0, -1.0, 1.0])
