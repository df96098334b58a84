r"""Gaussian moment flows: the mean-field attention flow of a Gaussian, in closed form (docs/theory/gaussian_flows.md).

The mean-field equation :math:`\partial_t\mu + \nabla\cdot(\mu\, v[\mu]) = 0` of the particles of
:func:`sinkflow.simulate`, with :math:`v[\mu](x) = \sum_h W_V^h\, \mathbb E_{\pi_h}[y \mid x]`, keeps
a Gaussian :math:`\mathcal N(m, S)` Gaussian (Castin, Ablin, Carrillo and Peyré 2025): each head's
conditional mean is affine in :math:`x`, so the velocity is :math:`v(x) = Bx + c` and

.. math:: \dot m = Bm + c, \qquad \dot S = BS + SB^\top .

The conditional means, with :math:`A = W_Q^\top W_K / \tau` (:math:`A_s` its symmetric part):

* SoftMax, dot scores: the Gaussian tilted by :math:`e^{x^\top A y}`, :math:`m + S A^\top x`;
* SoftMax, Gaussian scores :math:`-(x-y)^\top A (x-y)/2`: :math:`(I + SA_s)^{-1}(m + SA_s x)`;
* Sinkhorn (either scores; Gaussian scores are dot scores with :math:`A_s` up to row and column
  constants): the entropic plan of :math:`\mathcal N(m, S)` with itself, cost :math:`-x^\top A y`,
  is Gaussian with cross-covariance :math:`\Gamma`, and
  :math:`\mathbb E[y\mid x] = m + \Gamma^\top S^{-1}(x - m)`,
  :math:`\Gamma^\top S^{-1} = 2\, S^{1/2}\big(I + (I + 4 S^{1/2} A^\top S A S^{1/2})^{1/2}\big)^{-1} S^{1/2} A^\top`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinkflow._checks import check_choice, check_number
from sinkflow._summary import Summarized, number

__all__ = ["GAUSSIAN_NORMALIZATIONS", "GAUSSIAN_SCORES", "AffineField", "GaussianMomentFlow",
           "gaussian_attention_field", "gaussian_moment_flow"]

#: Normalizations whose mean-field flow keeps Gaussians Gaussian (the unnormalized kernel does not:
#: its row mass varies with ``x``, so its field is not affine).
GAUSSIAN_NORMALIZATIONS = ("softmax", "sinkhorn")
#: Scores of :mod:`sinkflow.attention`: ``"dot"`` :math:`x^\top W y/\tau`, ``"gaussian"`` :math:`-\|x-y\|_W^2/(2\tau)`.
GAUSSIAN_SCORES = ("dot", "gaussian")
#: Relative tolerance on the symmetry and positive semi-definiteness of an input covariance.
COV_TOL = 1e-10
#: A moment this many times the largest initial one (at least 1) counts as a blow-up.
BLOW_UP = 1e12


@dataclass(frozen=True)
class AffineField:
    """The velocity :math:`v(x) = B x + c` of the mean-field flow at one Gaussian.

    Attributes
    ----------
    matrix : numpy.ndarray (d, d)
        :math:`B`.
    offset : numpy.ndarray (d,)
        :math:`c`.
    """

    matrix: np.ndarray
    offset: np.ndarray

    def __call__(self, x) -> np.ndarray:
        """The velocity at points ``x`` of shape ``(..., d)``."""
        return np.asarray(x, dtype=float) @ self.matrix.T + self.offset


@dataclass(frozen=True, repr=False)
class GaussianMomentFlow(Summarized):
    """Means and covariances of a Gaussian carried by the mean-field attention flow.

    Its ``repr`` states the attention, the times, the final mean and covariance spectrum and the
    ODE solve, never the arrays.

    Attributes
    ----------
    times : numpy.ndarray (T,)
    means : numpy.ndarray (T, d)
    covs : numpy.ndarray (T, d, d)
        Symmetric positive semi-definite.
    normalization, scores : str
    heads : int
    temperature : float
    rtol, atol : float
        Tolerances of the ODE solve (scipy's ``solve_ivp``, DOP853).
    n_evaluations : int
        Evaluations of the moment ODE's right-hand side.
    """

    times: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    normalization: str
    scores: str
    heads: int
    temperature: float
    rtol: float
    atol: float
    n_evaluations: int

    @property
    def final(self) -> tuple[np.ndarray, np.ndarray]:
        """The mean and covariance at the last time."""
        return self.means[-1], self.covs[-1]

    def _facts(self):
        times, (mean, cov) = np.asarray(self.times, dtype=float), self.final
        head = (f"{times.size} times x d = {mean.shape[-1]}: {self.normalization} attention ({self.scores} scores, "
                f"{self.heads} head{'s' * (self.heads != 1)}), temperature {number(self.temperature)}")
        shown = ", ".join(number(v) for v in mean[:4]) + (", ..." if mean.size > 4 else "")
        eig = np.linalg.eigvalsh((cov + cov.T) / 2)
        return head, [[("t", f"{number(times[0])} to {number(times[-1])}"), ("final mean", f"[{shown}]"),
                       ("final covariance eigenvalues", f"{number(eig[0])} to {number(eig[-1])}")],
                      [("ODE", f"DOP853, rtol {number(self.rtol)}, atol {number(self.atol)}, "
                               f"{self.n_evaluations} evaluations")]]


# ----------------------------------------------------------------------------------------
# the conditional mean of one head


def _sym_sqrt(S: np.ndarray) -> np.ndarray:
    w, U = np.linalg.eigh((S + S.T) / 2)
    return (U * np.sqrt(np.clip(w, 0.0, None))) @ U.T


def sinkhorn_slope(S: np.ndarray, A: np.ndarray) -> np.ndarray:
    r""":math:`\Gamma^\top S^{-1}`: the slope of :math:`\mathbb E[y \mid x]` under the entropic plan of
    :math:`\mathcal N(\cdot, S)` with itself for the cost :math:`-x^\top A y` (no inverse of ``S`` taken)."""
    R = _sym_sqrt(S)
    inner = np.eye(len(S)) + 4 * R @ A.T @ S @ A @ R
    return 2 * R @ np.linalg.solve(np.eye(len(S)) + _sym_sqrt(inner), R @ A.T)


def _conditional_mean(m, S, A, normalization, scores):
    """``(M, c)`` with :math:`\\mathbb E[y \\mid x] = Mx + c` for one head of bilinear form ``A``."""
    d = len(m)
    if normalization == "sinkhorn":
        M = sinkhorn_slope(S, (A + A.T) / 2 if scores == "gaussian" else A)
        return M, m - M @ m
    if scores == "dot":
        return S @ A.T, m
    As = (A + A.T) / 2
    P = np.eye(d) + S @ As  # the tilted precision S^{-1} + A_s, times S
    R = _sym_sqrt(S)
    if np.linalg.eigvalsh(np.eye(d) + R @ As @ R).min() <= 0:
        raise ValueError("Gaussian scores with this W_Q^T W_K do not tilt N(m, S) into a Gaussian "
                         "(S^{-1} + A_s is not positive definite): use a positive semi-definite W_Q^T W_K")
    return np.linalg.solve(P, S @ As), np.linalg.solve(P, m)


def _affine(m, S, heads_A, W_V, drift, normalization, scores) -> AffineField:
    B = np.zeros_like(S) if drift is None else drift.copy()
    c = np.zeros_like(m)
    for A, V in zip(heads_A, W_V, strict=True):
        M, off = _conditional_mean(m, S, A, normalization, scores)
        B += V @ M
        c += V @ off
    return AffineField(B, c)


# ----------------------------------------------------------------------------------------
# input checks


def _array(x, name: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an array of real numbers, got {type(x).__name__}") from None
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")
    return a


def _check_gaussian(mean, cov):
    m = _array(mean, "mean")
    if m.ndim != 1 or m.size == 0:
        raise ValueError(f"mean must have shape (d,), got {m.shape}")
    d = m.size
    S = _array(cov, "cov")
    if S.shape != (d, d):
        raise ValueError(f"cov must have shape ({d}, {d}) to match mean, got {S.shape}")
    scale = max(float(np.abs(S).max()), 1e-300)
    if np.abs(S - S.T).max() > COV_TOL * scale:
        raise ValueError("cov must be symmetric")
    if np.linalg.eigvalsh((S + S.T) / 2).min() < -COV_TOL * scale:
        raise ValueError("cov must be positive semi-definite")
    return m, (S + S.T) / 2


def _stack(W, name: str, heads: int, rows: int | None, d: int) -> np.ndarray:
    """``W`` as a ``(heads, rows, d)`` stack: one ``(rows, d)`` matrix per head (identity when ``None``)."""
    if W is None:
        return np.broadcast_to(np.eye(d), (heads, d, d))
    a = _array(W, name)
    if a.ndim == 2 and heads == 1:
        a = a[None]
    shape = f"{'k' if rows is None else rows}, {d})"
    want = f"({heads}, {shape}" if heads > 1 else f"({shape}"
    if a.ndim != 3 or a.shape[0] != heads or a.shape[2] != d or (rows is not None and a.shape[1] != rows):
        raise ValueError(f"{name} must have shape {want} (heads={heads}), got {a.shape}")
    return a


def _check_heads(W_Q, W_K, W_V, temperature, heads, d):
    heads = check_number(heads, "heads", integer=True, positive=True)
    tau = float(check_number(temperature, "temperature", positive=True))
    Q = _stack(W_Q, "W_Q", heads, None, d)
    K = _stack(W_K, "W_K", heads, Q.shape[1], d)
    V = _stack(W_V, "W_V", heads, d, d)
    return [q.T @ k / tau for q, k in zip(Q, K, strict=True)], V, heads, tau


def _check_drift(drift, d):
    if drift is None:
        return None
    D = _array(drift, "drift")
    if D.shape != (d, d):
        raise ValueError(f"drift must have shape ({d}, {d}), got {D.shape}")
    return D


def _check_times(times) -> np.ndarray:
    t = np.atleast_1d(_array(times, "times"))
    if t.ndim != 1 or t.size == 0:
        raise ValueError("times must be a float or a 1D array of output times")
    if t.min() < 0 or np.any(np.diff(t) < 0):
        raise ValueError("times must be >= 0 and sorted increasingly (the flow starts at t = 0)")
    return t


# ----------------------------------------------------------------------------------------
# public


def gaussian_attention_field(mean, cov, *, normalization: str, W_Q=None, W_K=None, W_V=None,
                             temperature: float = 1.0, heads: int = 1, scores: str = "dot",
                             drift=None) -> AffineField:
    r"""The mean-field attention velocity of :math:`\mathcal N(m, S)`: the affine map :math:`v(x) = Bx + c`.

    :math:`v(x) = Dx + \sum_h W_V^h\, \mathbb E_{\pi_h}[y \mid x]`, the velocity the particles of
    :func:`sinkflow.simulate` follow when they sample the Gaussian (``D`` = ``drift``, zero by default).
    Parameters as :func:`gaussian_moment_flow`.

    Returns
    -------
    AffineField

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> v = sinkflow.gaussian_attention_field([1.0], [[2.0]], normalization="softmax")
    >>> v.matrix, v.offset   # the tilted mean m + S x
    (array([[2.]]), array([1.]))
    """
    check_choice(normalization, "normalization", GAUSSIAN_NORMALIZATIONS)
    check_choice(scores, "scores", GAUSSIAN_SCORES)
    m, S = _check_gaussian(mean, cov)
    heads_A, V, _, _ = _check_heads(W_Q, W_K, W_V, temperature, heads, m.size)
    return _affine(m, S, heads_A, V, _check_drift(drift, m.size), normalization, scores)


def _solve(m0, S0, times, rhs, rtol, atol):
    from scipy.integrate import solve_ivp

    y0 = np.concatenate([m0, S0.ravel()])
    t_end = float(times[-1])
    if t_end == 0:
        return np.broadcast_to(y0, (times.size, y0.size)).copy(), 0
    limit = BLOW_UP * max(float(np.abs(y0).max()), 1.0)

    def blow_up(_, y):
        return limit - np.abs(y).max()

    blow_up.terminal = True
    sol = solve_ivp(rhs, (0.0, t_end), y0, method="DOP853", t_eval=times, rtol=rtol, atol=atol, events=blow_up)
    if sol.status != 0 or not np.all(np.isfinite(sol.y)):
        t_last = float(np.asarray(sol.t)[-1]) if np.size(sol.t) else 0.0
        if sol.status == 1:
            t_last = float(sol.t_events[0][0])
        raise FloatingPointError(f"the moment ODE stopped at t = {t_last:.6g} before t = {t_end:g} ({sol.message}): "
                                 "the moments blow up in finite time (e.g. SoftMax with W_V = I expands); "
                                 "ask for earlier times")
    return sol.y.T, sol.nfev


def gaussian_moment_flow(mean, cov, times, *, normalization: str, W_Q=None, W_K=None, W_V=None,
                         temperature: float = 1.0, heads: int = 1, scores: str = "dot", drift=None,
                         rtol: float = 1e-10, atol: float = 1e-12) -> GaussianMomentFlow:
    r"""Mean and covariance of a Gaussian under the mean-field attention flow, by their closed ODE.

    A Gaussian :math:`\mathcal N(m, S)` stays Gaussian under the mean-field limit of
    :func:`sinkflow.simulate` (SoftMax or Sinkhorn, one or several heads): the velocity is affine,
    :math:`v(x) = Bx + c` (:func:`gaussian_attention_field`), and :math:`\dot m = Bm + c`,
    :math:`\dot S = BS + SB^\top` (docs/theory/gaussian_flows.md).

    Parameters
    ----------
    mean : array (d,)
    cov : array (d, d)
        Symmetric positive semi-definite.
    times : float or increasing array of floats >= 0
        Output times (the flow starts at ``t = 0``).
    normalization : {"softmax", "sinkhorn"}
        Row-normalized or doubly stochastic (the limit :math:`n_{\rm iter} \to \infty` of
        :func:`sinkflow.simulate`).
    W_Q, W_K : arrays (k, d), or (heads, k, d) with ``heads > 1``; optional
        Query and key matrices (identity by default): scores :math:`x^\top W_Q^\top W_K y / \tau`
        (``scores="dot"``) or :math:`-\|x - y\|^2_{W}/(2\tau)`, :math:`W = W_Q^\top W_K` (``"gaussian"``).
    W_V : array (d, d), or (heads, d, d); optional
        Values (with each head's output projection); identity by default. The heads' velocities add.
    temperature : float
        :math:`\tau > 0`.
    heads : int
        Number of heads (the leading size of the stacked matrices).
    scores : {"dot", "gaussian"}
        Scores of :mod:`sinkflow.attention`. Gaussian scores need :math:`W_Q^\top W_K` positive
        semi-definite under SoftMax (the tilt must be a Gaussian).
    drift : array (d, d), optional
        A linear term :math:`Dx` added to the velocity: ``drift = (2/eps) I``,
        ``W_V = -(2/eps) I``, ``temperature = eps`` is the rescaled layer of
        :func:`sinkflow.heat_flow` and :func:`sinkflow.mean_field_flow`.
    rtol, atol : float
        Tolerances of the ODE solve (scipy's ``solve_ivp``, DOP853).

    Returns
    -------
    GaussianMomentFlow
        ``means`` (T, d), ``covs`` (T, d, d) at ``times``.

    Raises
    ------
    ValueError
        Shapes that do not match, a covariance that is not symmetric positive semi-definite,
        unsorted or negative times, unknown ``normalization`` or ``scores``.
    FloatingPointError
        The moments blow up before the last time (SoftMax can expand in finite time).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> r = sinkflow.gaussian_moment_flow([0.0], [[1.0]], [0.0, 0.2], normalization="softmax")
    >>> round(float(r.covs[-1, 0, 0]), 8)   # dS/dt = 2 S^2: S(t) = 1 / (1 - 2t)
    1.66666667
    >>> r = sinkflow.gaussian_moment_flow([1.0, 0.0], np.eye(2), 1.0, normalization="sinkhorn")
    >>> bool(np.allclose(r.means[-1], [np.e, 0]))   # dm/dt = W_V m for Sinkhorn
    True
    """
    check_choice(normalization, "normalization", GAUSSIAN_NORMALIZATIONS)
    check_choice(scores, "scores", GAUSSIAN_SCORES)
    m0, S0 = _check_gaussian(mean, cov)
    d = m0.size
    heads_A, V, heads, tau = _check_heads(W_Q, W_K, W_V, temperature, heads, d)
    D = _check_drift(drift, d)
    t = _check_times(times)
    rtol = float(check_number(rtol, "rtol", positive=True))
    atol = float(check_number(atol, "atol", positive=True))

    def rhs(_, y):
        m, S = y[:d], y[d:].reshape(d, d)
        S = (S + S.T) / 2
        v = _affine(m, S, heads_A, V, D, normalization, scores)
        BS = v.matrix @ S
        return np.concatenate([v.matrix @ m + v.offset, (BS + BS.T).ravel()])

    Y, nfev = _solve(m0, S0, t, rhs, rtol, atol)
    covs = Y[:, d:].reshape(-1, d, d)
    return GaussianMomentFlow(times=t, means=Y[:, :d].copy(), covs=(covs + covs.transpose(0, 2, 1)) / 2,
                              normalization=normalization, scores=scores, heads=heads, temperature=tau,
                              rtol=rtol, atol=atol, n_evaluations=int(nfev))
