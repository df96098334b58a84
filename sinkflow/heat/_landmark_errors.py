r"""How far a landmark-approximated flow strays from the exact one, and why.

For one start :math:`x_0` and a range of landmark counts ``m`` (:mod:`sinkflow.particles`):

* the Nyström spectral error :math:`\|G - \tilde G\|_2 / \|G\|_2` of the Gaussian kernel
  matrix at :math:`x_0` (the quantity of Skyformer's bound);
* the field error :math:`\delta_m = \max_k \max_i |v_m(y_k)_i - v(y_k)_i|` along the approximate
  trajectory :math:`y_k`;
* the trajectory deviation :math:`e_k = \max_i |y_{k,i} - x_{k,i}|` of the two Euler flows
  (same step ``h``) and its discrete Grönwall estimate. With :math:`L` a Lipschitz constant of
  the exact field in the max-over-particles norm,
  :math:`e_{k+1} \le e_k + h(|v_m(y_k) - v(y_k)| + |v(y_k) - v(x_k)|) \le (1 + hL) e_k + h\delta_m`, so

  .. math:: e_k \le \frac{\delta_m}{L}\bigl((1 + hL)^k - 1\bigr) \le \frac{\delta_m}{L}(e^{L t_k} - 1).

  No certified Lipschitz constant of the Sinkhorn field is used: :math:`L` is the cheap
  estimate :func:`sinkflow.particles.lipschitz_scale`, maximized along the exact
  trajectory, so the result is a Grönwall *estimate* (``bound_estimate``), a bound only
  where the estimate holds. Measured against finite-difference Jacobians of the field
  (tests/heat/test_landmark_errors.py, docs/theory/landmark_flows.md): it exceeded the spectral
  norm on every sampled random and outlying configuration, but the max-over-particles
  constant the argument needs (bounded by block row sums) exceeded it on 2 of 40 outlying
  configurations at high temperature (up to 1.06x; up to 1.55x reported on others).
  The estimate is loose where the flow contracts (clustering makes the errors shrink, it
  only grows) and tight only for short times (:math:`e_k \approx k h \delta_m`).
* the energy :math:`F^\infty` along the approximate Sinkhorn flow (:math:`W_V = W`: the exact
  flow descends it);
* the heat-limit variance error of the approximate heat layer against the heat solution,
  for ``n`` beyond what the exact dense flow holds (:func:`heat_variance_errors`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from sinkflow._backend import check_number, check_seed
from sinkflow._summary import Summarized, number, span
from sinkflow.attention._kernelized import _kernel
from sinkflow.attention._nystrom import nystrom_factors
from sinkflow.fields._dense_fields import attention_field
from sinkflow.fields._landmarks import _flow_landmarks, gaussian_coordinates
from sinkflow.heat._references import GaussianMixture
from sinkflow.heat._rescaled_flow import heat_flow
from sinkflow.particles._energies import energy_inf
from sinkflow.particles._simulate import simulate
from sinkflow.particles._step_size import lipschitz_scale

__all__ = ["LandmarkFlowErrors", "landmark_flow_errors", "nystrom_spectral_error", "heat_variance_errors"]


@dataclass(frozen=True, repr=False)
class LandmarkFlowErrors(Summarized):
    """Result of :func:`landmark_flow_errors` (arrays indexed by landmark count, then time).

    Its ``repr`` states the landmark counts and the ranges of the errors over them (at the final
    time for the deviation and its estimate), never the arrays.

    Attributes
    ----------
    landmarks : numpy.ndarray (k,)
    times : numpy.ndarray (steps + 1,)
    spectral_error : numpy.ndarray (k,)
        :math:`\\|G - \\tilde G\\|_2 / \\|G\\|_2` at the start.
    field_error : numpy.ndarray (k,)
        :math:`\\delta_m`, largest field error along the approximate trajectory.
    deviation, bound_estimate : numpy.ndarray (k, steps + 1)
        :math:`e_k` and the Grönwall estimate :math:`\\delta_m((1 + hL)^k - 1)/L` (a bound
        where :math:`L` is a Lipschitz constant; here it is an estimate, see the module docstring).
    lipschitz_estimate : float
        :math:`L`, :func:`sinkflow.particles.lipschitz_scale` maximized along the exact flow.
    energy : numpy.ndarray (k, steps + 1)
        :math:`F^\\infty` along each approximate flow; ``energy_exact`` along the exact one.
    """

    landmarks: np.ndarray
    times: np.ndarray
    spectral_error: np.ndarray
    field_error: np.ndarray
    deviation: np.ndarray
    bound_estimate: np.ndarray
    lipschitz_estimate: float
    energy: np.ndarray
    energy_exact: np.ndarray

    def _facts(self):
        m = np.asarray(self.landmarks)
        head = f"{m.size} landmark counts (m = {span(m).replace(' to ', '..')}) x {np.size(self.times)} times"
        return head, [[("spectral error", span(self.spectral_error)), ("field error", span(self.field_error))],
                      [("final deviation", span(np.asarray(self.deviation)[:, -1])),
                       ("its estimate", span(np.asarray(self.bound_estimate)[:, -1])),
                       ("Lipschitz estimate", number(self.lipschitz_estimate))]]


def nystrom_spectral_error(x, landmarks, W=None, temperature: float = 1.0, seed: int = 0,
                           sampling: str = "farthest") -> float:
    r"""Relative spectral error :math:`\|G - \tilde G\|_2 / \|G\|_2` of the particles' Gaussian kernel.

    ``G`` is the kernel :math:`e^{-\|x_i - x_j\|_W^2 / (2\tau)}` that every landmark flow
    approximates, ``landmarks`` a count (drawn as the flows draw them, ``sampling`` and ``seed``
    as in :func:`sinkflow.particles.landmark_indices`) or indices.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.heat import nystrom_spectral_error
    >>> x = np.random.default_rng(0).normal(size=(20, 2))
    >>> nystrom_spectral_error(x, 20) < 1e-8   # every point a landmark: exact
    True
    """
    X = torch.as_tensor(np.asarray(x, dtype=float))
    Wt = None if W is None else torch.as_tensor(np.asarray(W, dtype=float))
    temperature = float(check_number(temperature, "temperature", positive=True))
    z = gaussian_coordinates(X, Wt, temperature)
    idx = landmarks
    if np.ndim(landmarks) == 0:
        landmarks = check_number(landmarks, "landmarks", integer=True, positive=True)
        idx = _flow_landmarks(X, landmarks, "nystrom", Wt, temperature, sampling, check_seed(seed))
    G = _kernel(z, z, z.shape[-1])  # the exact kernel (what every landmark would give)
    approx = nystrom_factors(z, z, torch.as_tensor(idx), lift=False).matrix()
    return float(torch.linalg.matrix_norm(G - approx, 2) / torch.linalg.matrix_norm(G, 2))


def _euler(x0, W, h, steps, landmarks, temperature, n_iter):
    return simulate(x0, "sinkhorn", W_K=W, W_V=W, h=h, steps=steps, n_iter=n_iter, landmarks=landmarks,
                    temperature=temperature, tol=1e-11).positions


def _field(x, W, landmarks, temperature, n_iter):
    """The exact field, or the approximate one with the landmark indices of the flow."""
    Wt = torch.as_tensor(W)
    return attention_field(torch.as_tensor(x), "sinkhorn", Wt, Wt, n_iter=n_iter, temperature=temperature, tol=1e-11,
                           landmarks=landmarks).velocity.numpy()


def landmark_flow_errors(x0, landmarks=(8, 16, 32, 64), *, W=None, h: float = 0.05, steps: int = 40,
                         temperature: float = 1.0, n_iter=None) -> LandmarkFlowErrors:
    r"""Errors of the Nyström-approximated Sinkhorn flow against the exact flow (see the module docstring).

    Parameters
    ----------
    x0 : array (n, d)
        Start (float64; ``n`` small enough for the exact dense flow and ``n x n`` energies).
    landmarks : sequence of int
    W : array (d, d), optional
        Symmetric positive semi-definite :math:`W = W_Q^T W_K`, also the values (gradient flow).
    h, steps, temperature, n_iter
        Euler step, number of steps, :math:`\tau`, Sinkhorn half-iterations (None: doubly stochastic).

    Returns
    -------
    LandmarkFlowErrors

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> from sinkflow.heat import landmark_flow_errors
    >>> x0 = sinkflow.random_particles(24, 2, seed=0)
    >>> r = landmark_flow_errors(x0, (6, 24), h=0.05, steps=4)
    >>> bool(np.all(r.deviation <= r.bound_estimate + 1e-9)), bool(r.deviation[-1].max() < 1e-7)
    (True, True)
    """
    x0 = np.asarray(x0, dtype=float)
    d = x0.shape[1]
    W = np.eye(d) if W is None else np.asarray(W, dtype=float)
    exact = _euler(x0, W, h, steps, None, temperature, n_iter)
    L = max(lipschitz_scale(torch.as_tensor(x), torch.as_tensor(W), torch.as_tensor(W), temperature) for x in exact)
    k = np.arange(steps + 1)
    ms = np.array([check_number(m, "landmarks", integer=True, positive=True) for m in np.atleast_1d(landmarks)])
    out = {key: [] for key in ("spectral", "field", "deviation", "bound", "energy")}
    for m in ms:
        approx = _euler(x0, W, h, steps, int(m), temperature, n_iter)
        idx = _flow_landmarks(torch.as_tensor(x0), int(m), "nystrom", torch.as_tensor(W), temperature, "farthest", 0)
        delta = max(np.linalg.norm(_field(y, W, idx, temperature, n_iter) - _field(y, W, None, temperature, n_iter),
                                   axis=1).max() for y in approx[:-1])
        out["spectral"].append(nystrom_spectral_error(x0, idx, W, temperature))
        out["field"].append(delta)
        out["deviation"].append(np.linalg.norm(approx - exact, axis=2).max(1))
        out["bound"].append(delta * ((1 + h * L) ** k - 1) / L)
        out["energy"].append([energy_inf(y, W / temperature, tol=1e-12) for y in approx])
    return LandmarkFlowErrors(ms, k * h, np.array(out["spectral"]), np.array(out["field"]),
                              np.array(out["deviation"]), np.array(out["bound"]), float(L),
                              np.array(out["energy"]),
                              np.array([energy_inf(x, W / temperature, tol=1e-12) for x in exact]))


def heat_variance_errors(ns, landmarks: int, *, t: float = 0.1, eps: float = 0.2, dt: float = 0.05, d: int = 1,
                         tol: float = 1e-4, max_iter: int = 300, seed: int = 0) -> np.ndarray:
    r"""Error of the covariance growth of the landmark heat layer against the heat solution.

    Particles :math:`\mathcal N(0, I_d)`; the heat solution at time ``t`` has covariance
    :math:`(1 + 2t) I` (:meth:`sinkflow.GaussianMixture.evolve`). Returns, per ``n``,
    :math:`|\mathrm{tr}\,\mathrm{Cov}(x_t) - \mathrm{tr}\,\mathrm{Cov}(x_0) - 2 t d|`. Sinkhorn on the
    Nyström kernel converges slowly (no positivity, so no Hilbert-metric contraction): the
    solves stop at ``tol`` (a velocity error ~``3 tol / eps`` relative) or ``max_iter``.

    Examples
    --------
    >>> from sinkflow.heat import heat_variance_errors
    >>> float(heat_variance_errors([2000], 64)[0]) < 0.05
    True
    """
    d = check_number(d, "d", integer=True, positive=True)
    landmarks = check_number(landmarks, "landmarks", integer=True, positive=True)
    start = GaussianMixture.gaussian(np.zeros(d), np.eye(d))
    growth = float(np.trace(start.evolve(t).covs[0]) - np.trace(start.covs[0]))
    errors = []
    for n in ns:
        x0 = start.sample(int(n), seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # unconverged solves: see the docstring
            x1 = heat_flow(x0, t, eps, dt, "sinkhorn", landmarks=int(landmarks), tol=tol, max_iter=max_iter)
        observed = float(np.trace(np.atleast_2d(np.cov(x1.T))) - np.trace(np.atleast_2d(np.cov(x0.T))))
        errors.append(abs(observed - growth))
    return np.array(errors)
