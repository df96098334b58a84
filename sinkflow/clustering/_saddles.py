r"""Plateaus as saddles: the Hessian of the energy a flow on the sphere climbs, in tangent coordinates.

docs/theory/clustering.md. With :math:`Q = K = V = I` on :math:`S^{d-1}` (the circle for :math:`d = 2`):

- SoftMax particles climb :math:`E_\beta = \frac{1}{2\beta}\sum_{ij} a_i a_j e^{\beta\langle x_i, x_j\rangle}` in a
  positive diagonal metric (:math:`\dot x_i = \nabla_i E_\beta / (a_i Z_i)`), here scaled by :math:`e^{-\beta}`;
- Sinkhorn particles descend :math:`F^\infty = \tfrac12\mathrm{OT}_1(\mu, \mu)` with the cost
  :math:`-\beta\langle x, y\rangle` (:func:`sinkflow.energy_inf`; :math:`\dot x_i = -\nabla_i F^\infty/(\beta a_i)`),
  so they climb :math:`-F^\infty`. Writing :math:`s = \log u` for the symmetric scaling,
  :math:`s_i + \log\sum_j a_j e^{s_j + \beta\langle x_i, x_j\rangle} = 0`, :math:`F^\infty = \sum_i a_i s_i`,
  :math:`\nabla_m F^\infty = -\beta\sum_j \pi_{mj} x_j` with
  :math:`\pi_{mj} = a_m a_j e^{s_m + s_j + \beta\langle x_m, x_j\rangle}`,
  and the second derivative carries :math:`\partial s/\partial x` from the implicit function theorem,
  :math:`(I + P)\,\partial s = -\partial_x G` (:math:`P_{ij} = \pi_{ij}/a_i`).

By Sylvester's law of inertia the number of directions in which a critical configuration is unstable
is the number of positive eigenvalues of the Hessian of the climbed energy (:func:`unstable_directions`).
The Riemannian Hessian on the product of spheres is the Euclidean one projected on the tangent spaces,
minus :math:`\langle x_i, \nabla_i\rangle` on the diagonal; it is returned in the orthonormal tangent
basis of each particle (the angle on the circle), ``n (d - 1)`` coordinates.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from sinkflow._checks import check_choice, check_number

__all__ = ["energy_hessian", "unstable_directions", "tangent_basis"]


def _points(x) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    if arr.ndim == 1:
        return np.stack([np.cos(arr), np.sin(arr)], 1)
    if arr.ndim != 2 or arr.shape[1] < 2:
        raise ValueError(f"x must be angles (n,) or unit vectors (n, d), d >= 2, got shape {arr.shape}")
    return arr / np.linalg.norm(arr, axis=1, keepdims=True)


def tangent_basis(x) -> np.ndarray:
    """Orthonormal bases ``(n, d, d - 1)`` of the tangent spaces of unit vectors ``x`` ((-sin, cos) on the circle)."""
    X = _points(x)
    if X.shape[1] == 2:
        return np.stack([-X[:, 1], X[:, 0]], 1)[:, :, None]
    eye = np.broadcast_to(np.eye(X.shape[1]), (X.shape[0],) + (X.shape[1],) * 2)
    Q = np.linalg.qr(np.concatenate([X[:, :, None], eye], 2))[0]  # first column +-x: the rest span its complement
    return Q[:, :, 1:]


def _weights(weights, n):
    if weights is None:
        return np.full(n, 1.0 / n)
    a = np.asarray(weights, dtype=float)
    if a.shape != (n,) or np.any(a <= 0):
        raise ValueError(f"weights must be {n} positive numbers")
    return a / a.sum()


def energy_hessian(x, beta: float, weights=None, normalization: str = "softmax") -> np.ndarray:
    r"""Hessian of the energy the flow climbs, in tangent coordinates (``n (d - 1)`` square).

    ``"softmax"``: :math:`e^{-\beta} E_\beta`; ``"sinkhorn"``: :math:`-F^\infty` (module docstring). Its
    positive eigenvalues are the directions that leave a plateau (:func:`unstable_directions`).

    Parameters
    ----------
    x : array (n,) of angles or (n, d) of unit vectors
    beta : float
        Inverse temperature (> 0).
    weights : array (n,), optional
        Particle masses (uniform by default).
    normalization : {"softmax", "sinkhorn"}

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import energy_hessian
    >>> H = energy_hessian(2 * np.pi * np.arange(3) / 3, 4.0)   # three points, an equilateral triangle
    >>> ev = np.linalg.eigvalsh(H)   # a rotation (0) and two climbing directions
    >>> bool(abs(ev[0]) < 1e-15), bool(ev[1] > 0), bool(np.isclose(ev[1], ev[2]))
    (True, True, True)
    """
    X = _points(x)
    beta = float(check_number(beta, "beta", positive=True))
    check_choice(normalization, "normalization", ("softmax", "sinkhorn"))
    a, B = _weights(weights, X.shape[0]), tangent_basis(X)
    C = np.einsum("mdb,jd->mbj", B, X)  # C[m, b, j] = <B_m e_b, x_j>
    H = (_softmax_blocks if normalization == "softmax" else _sinkhorn_blocks)(X, a, B, C, beta)
    n, k = X.shape[0], X.shape[1] - 1
    return H.reshape(n * k, n * k)


def _softmax_blocks(X, a, B, C, beta):
    w = np.outer(a, a) * np.exp(beta * (X @ X.T - 1))
    np.fill_diagonal(w, 0.0)  # the self term is constant on the sphere
    H = np.einsum("mk,mbk,kam->mbka", beta * w, C, C) + np.einsum("mk,mdb,kda->mbka", w, B, B)
    diag = beta * np.einsum("mj,mbj,maj->mba", w, C, C) - (w * (X @ X.T)).sum(1)[:, None, None] * np.eye(C.shape[1])
    idx = np.arange(X.shape[0])
    H[idx, :, idx, :] = diag
    return H


def _symmetric_scaling(S, a, tol=1e-14, max_iter=100_000):
    """``s`` with ``s_i + log sum_j a_j e^{s_j + S_ij} = 0`` (damped symmetric fixed point in the log domain,
    then Newton steps on ``(I + P) ds = -r`` once the residual is below ``1e-3``)."""
    la, s = np.log(a), -0.5 * np.diag(S).max() * np.ones(a.size)
    for _ in range(max_iter):
        L = S + (la + s)[None, :]
        r = s + logsumexp(L, axis=1)
        if np.abs(r).max() < tol:
            return s
        if np.abs(r).max() < 1e-3:  # P_ij = a_j e^{s_i + s_j + S_ij} = e^{L_ij + s_i}, row-stochastic at the solution
            s -= np.linalg.solve(np.eye(a.size) + np.exp(L + s[:, None]), r)
        else:
            s -= 0.5 * r
    raise RuntimeError(f"the symmetric Sinkhorn scaling did not reach {tol:g} in {max_iter} iterations")


def _sinkhorn_blocks(X, a, B, C, beta):
    n, k = X.shape[0], C.shape[1]
    S = beta * (X @ X.T)
    s = _symmetric_scaling(S, a)
    pi = np.exp(S + (np.log(a) + s)[:, None] + (np.log(a) + s)[None, :])
    P = pi / a[:, None]
    Y = np.einsum("mdb,md->mb", B, pi @ X)  # B_m^T sum_j pi_mj x_j
    # R[i, (q, c)] = dG_i / d(x_q along B_q e_c) = beta (delta_iq <P_i x, B_q e_c> + P_iq <x_i, B_q e_c>)
    R = beta * P[:, :, None] * np.transpose(C, (2, 0, 1))
    idx = np.arange(n)
    R[idx, idx, :] += beta * np.einsum("qcd,qd->qc", np.transpose(B, (0, 2, 1)), P @ X)
    sig = -np.linalg.solve(np.eye(n) + P, R.reshape(n, n * k)).reshape(n, n, k)
    H = Y[:, :, None, None] * sig[:, None, :, :] + np.einsum("mj,mbj,jqc->mbqc", pi, C, sig)
    H += beta * np.einsum("mq,mbq,qcm->mbqc", pi, C, C) + np.einsum("mq,mdb,qdc->mbqc", pi, B, B)
    H[idx, :, idx, :] += beta * np.einsum("mj,mbj,mcj->mbc", pi, C, C)
    H *= beta  # the Hessian of -F^inf: F's is -beta (...) ...
    H[idx, :, idx, :] -= beta * ((pi @ X) * X).sum(1)[:, None, None] * np.eye(k)  # ... minus <x_m, grad_m F>
    return H


def _rotations(X, B) -> np.ndarray:
    """Tangent coordinates ``(n (d - 1), r)`` of the infinitesimal rotations of the whole configuration."""
    d = X.shape[1]
    gens = []
    for p in range(d):
        for q in range(p + 1, d):
            A = np.zeros((d, d))
            A[p, q], A[q, p] = 1.0, -1.0
            gens.append(np.einsum("ndb,nd->nb", B, X @ A.T).ravel())
    return np.stack(gens, 1)


def unstable_directions(x, beta: float, weights=None, normalization: str = "softmax", *,
                        rel_tol: float = 1e-10) -> tuple[int, int, int]:
    """``(positive, zero, negative)`` eigenvalues of :func:`energy_hessian`: directions that climb (leave
    the plateau), flat ones, and ones that fall.

    The rotations of the whole configuration that move it (symmetries of the energy, flat at a critical
    point) are counted as ``zero`` and taken out first: the signs are those of the Hessian on their
    orthogonal complement, zero meaning within ``rel_tol`` of its largest magnitude (clusters that are not
    yet points would otherwise tilt the flat rotations either way). A rotation that moves the particles by
    less than ``1e-3`` of the largest one (two clusters spinning about their common axis) stays in: it only
    spreads the clusters.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import unstable_directions
    >>> two = np.repeat([0.0, np.pi], 4) + np.tile(np.linspace(-1e-3, 1e-3, 4), 2)   # two clusters of 4
    >>> unstable_directions(two, 5.0), unstable_directions(two, 5.0, normalization="sinkhorn")
    ((1, 1, 6), (1, 1, 6))
    """
    from scipy.linalg import null_space, orth

    X = _points(x)
    H = energy_hessian(X, beta, weights, normalization)
    rot = orth(_rotations(X, tangent_basis(X)), rcond=1e-3)
    N = null_space(rot.T)
    ev = np.linalg.eigvalsh(N.T @ H @ N)
    tiny = rel_tol * np.abs(ev).max()
    return int((ev > tiny).sum()), int((np.abs(ev) <= tiny).sum()) + rot.shape[1], int((ev < -tiny).sum())
