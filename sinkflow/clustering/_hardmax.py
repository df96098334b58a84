r"""The hardmax limit of self-attention as Frank-Wolfe steps (docs/theory/hardmax.md).

Tokens :math:`x_1..x_n` in :math:`\mathbb R^d`, a symmetric key-query matrix :math:`B`, one layer

.. math:: x_i \leftarrow x_i + h_t\,(s_i - x_i), \qquad s_i = \sum_j K_{ij} x_j, \quad
          K = \mathrm{hardmax}(X B X^T),

each token steps toward the token that maximizes :math:`\langle B x_i, x_j\rangle` (ties shared equally,
:func:`sinkflow.hardmax`): a Frank-Wolfe step on :math:`\frac12 x^T B x` over the convex hull of the current
tokens (Alcalde, Geshkovski and Ruiz-Balet, *Attention's forward pass and Frank-Wolfe*, ICML 2026,
arXiv:2508.09628). With ``beta`` the same layer runs SoftMax of :math:`\beta X B X^T` (finite temperature).

- :func:`hardmax_flow`: the layers (constant step ``h`` or Frank-Wolfe's :math:`h_t = 2/(t+2)`).
- :func:`hardmax_targets`: for positive semidefinite :math:`B`, each token's dominant point and straight path.
- :func:`frank_wolfe_energy`: for negative semidefinite :math:`B`, the energy gap and the Frank-Wolfe bound.
- :func:`hardmax_dwell`: at finite :math:`\beta`, how long tokens stay near their hardmax targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sinkflow._checks import check_number
from sinkflow._summary import Summarized, number
from sinkflow.attention._variants import get_attention

__all__ = ["hardmax_flow", "HardmaxTargets", "hardmax_targets", "frank_wolfe_energy", "hardmax_dwell"]


def _points(x, name="x0") -> np.ndarray:
    x = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"{name} must be an array (n, d) of tokens, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} must be finite")
    return x


def _matrix(B, d: int, definite: str | None = None) -> np.ndarray:
    B = np.asarray(B.detach().cpu() if isinstance(B, torch.Tensor) else B, dtype=np.float64)
    if B.shape != (d, d):
        raise ValueError(f"B must be a ({d}, {d}) matrix, got shape {B.shape}")
    if not np.isfinite(B).all() or not np.allclose(B, B.T, rtol=0, atol=1e-12 * max(1.0, np.abs(B).max())):
        raise ValueError("B must be finite and symmetric")
    if definite is not None:
        eig = np.linalg.eigvalsh(B)
        tol = 1e-12 * max(1.0, np.abs(eig).max())
        if definite == "psd" and eig.min() < -tol:
            raise ValueError(f"B must be positive semidefinite, got smallest eigenvalue {eig.min():.3g}")
        if definite == "nsd" and eig.max() > tol:
            raise ValueError(f"B must be negative semidefinite, got largest eigenvalue {eig.max():.3g}")
    return B


def _step(h, t: int) -> float:
    return 2.0 / (t + 2.0) if isinstance(h, str) else h


def hardmax_flow(x0, B, h=0.5, steps: int = 20, *, beta: float | None = None) -> np.ndarray:
    r"""Tokens under ``steps`` hardmax layers :math:`x_i \leftarrow x_i + h_t (s_i - x_i)` (module docstring).

    Parameters
    ----------
    x0 : array (n, d)
        Initial tokens (computed in float64).
    B : array (d, d)
        Symmetric key-query matrix: the scores are :math:`\langle B x_i, x_j\rangle`.
    h : float in (0, 1] or "frank-wolfe"
        Step of every layer, or Frank-Wolfe's :math:`h_t = 2/(t+2)` (:math:`t = 0, 1, ...`). A step in
        :math:`(0, 1]` keeps every token in the convex hull of the tokens before the layer.
    steps : int
    beta : float, optional
        Finite inverse temperature: the registered ``"softmax"`` of :math:`\beta X B X^T` replaces
        ``"hardmax"`` (the process whose metastability :func:`hardmax_dwell` measures).

    Returns
    -------
    numpy.ndarray (steps + 1, n, d)
        Positions after each layer, ``x0`` first.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import hardmax_flow
    >>> x = hardmax_flow([[1.0, 0.0], [0.0, 1.0], [0.2, 0.1]], np.eye(2), h=0.5, steps=2)
    >>> x[:, 2]                      # (0.2, 0.1) is a vertex outside its own cell: it moves to (1, 0)
    array([[0.2  , 0.1  ],
           [0.6  , 0.05 ],
           [0.8  , 0.025]])
    """
    x = _points(x0)
    B = _matrix(B, x.shape[1])
    steps = check_number(steps, "steps", integer=True, positive=True, allow_zero=True)
    if isinstance(h, str):
        if h != "frank-wolfe":
            raise ValueError(f"h must be a step in (0, 1] or 'frank-wolfe', got {h!r}")
    else:
        h = check_number(h, "h", positive=True)
        if h > 1:
            raise ValueError(f"h must be in (0, 1] (a convex combination), got {h!r}")
    if beta is None:
        variant, scale = get_attention("hardmax"), 1.0
    else:
        variant, scale = get_attention("softmax"), check_number(beta, "beta", positive=True)
    out = np.empty((steps + 1,) + x.shape)
    out[0] = x
    for t in range(steps):
        C = torch.from_numpy(scale * (x @ B @ x.T))
        K = variant.normalize(C, n_iter=None, mask=None).attention.numpy()
        x = x + _step(h, t) * (K @ x - x)
        out[t + 1] = x
    return out


@dataclass(frozen=True, repr=False)
class HardmaxTargets(Summarized):
    r"""Result of :func:`hardmax_targets`: where each token goes under hardmax layers (positive semidefinite B).

    Attributes
    ----------
    x0 : numpy.ndarray (n, d)
    index : numpy.ndarray (n,) of int
        The token :math:`j^*(i) = \arg\max_j \langle B x_i, x_j\rangle` that token :math:`i` moves to (-1 where
        not predicted).
    targets : numpy.ndarray (n, d)
        :math:`x_{j^*(i)}` (NaN where not predicted).
    predicted : numpy.ndarray (n,) of bool
        The maximum is unique and :math:`x_{j^*}` lies in its own cell (:math:`j^*(j^*) = j^*`): the target is
        stationary and token :math:`i` moves on the segment to it, staying in its cell.
    stationary : numpy.ndarray (n,) of bool
        Tokens in their own cell (:math:`j^*(i) = i`): fixed points of every layer.
    """

    x0: np.ndarray
    index: np.ndarray
    targets: np.ndarray
    predicted: np.ndarray
    stationary: np.ndarray

    def path(self, t, h: float) -> np.ndarray:
        r"""Predicted positions after layers ``t`` (int or array) with constant step ``h``:
        :math:`x_{j^*} + (1-h)^t (x_i(0) - x_{j^*})`, shape ``t.shape + (n, d)``."""
        h = check_number(h, "h", positive=True)
        t = np.asarray(t, dtype=np.float64)[..., None, None]
        return self.targets + (1.0 - h) ** t * (self.x0 - self.targets)

    def _facts(self):
        n = len(self.index)
        cells = np.unique(self.index[self.predicted]).size
        return f"hardmax targets of {n} tokens", [
            [("predicted", f"{int(self.predicted.sum())} of {n}"), ("dominant points", number(cells))],
            [("stationary", number(int(self.stationary.sum())))],
        ]


def hardmax_targets(x0, B) -> HardmaxTargets:
    r"""Each token's dominant point and straight path under hardmax layers, for positive semidefinite :math:`B`.

    Token :math:`i` steps toward :math:`x_{j^*(i)}`, :math:`j^*(i) = \arg\max_j \langle B x_i, x_j\rangle`. Where
    that token lies in its own cell (:math:`j^*(j^*) = j^*`, a stationary vertex of the hull), the segment from
    :math:`x_i` to it stays in the cell: along it :math:`\langle B x, y\rangle` is maximized over the initial hull
    at :math:`x_{j^*}` (a convex combination of two points whose maximizer it is), and every later token lies in
    that hull. So token :math:`i` moves on a straight line, :math:`x_i(t) = x_{j^*} + \prod_s (1 - h_s)
    (x_i(0) - x_{j^*})`: exponential convergence for a step bounded away from zero. A vertex outside its own
    cell is not stationary (``B = I``, tokens :math:`(1,0), (0,1), (0.2,0.1)`: the third moves to the first);
    tokens pointing at such a vertex, or with tied maxima, are left unpredicted.

    Parameters
    ----------
    x0 : array (n, d)
    B : array (d, d), symmetric positive semidefinite

    Returns
    -------
    HardmaxTargets

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import hardmax_targets
    >>> r = hardmax_targets([[1.0, 0.0], [0.0, 1.0], [0.2, 0.1]], np.eye(2))
    >>> r.index, r.stationary
    (array([0, 1, 0]), array([ True,  True, False]))
    >>> r.path(2, 0.5)[2]
    array([0.8  , 0.025])
    """
    x = _points(x0)
    B = _matrix(B, x.shape[1], "psd")
    scores = x @ B @ x.T
    index = scores.argmax(1)
    top = scores[np.arange(len(x)), index]
    unique = (scores >= top[:, None] - 1e-12 * np.maximum(1.0, np.abs(top[:, None]))).sum(1) == 1
    stationary = (index == np.arange(len(x))) & unique
    predicted = unique & stationary[index]
    index = np.where(predicted, index, -1)
    targets = np.where(predicted[:, None], x[np.maximum(index, 0)], np.nan)
    return HardmaxTargets(x, index, targets, predicted, stationary)


def _hull_minimum(x: np.ndarray, A: np.ndarray) -> float:
    """:math:`\\min_{y \\in conv(x)} \\frac12 y^T A y` for positive semidefinite ``A`` (a small QP, SLSQP)."""
    from scipy.optimize import minimize

    G = x @ A @ x.T
    n = len(x)
    w0 = np.full(n, 1.0 / n)
    res = minimize(lambda w: 0.5 * w @ G @ w, w0, jac=lambda w: G @ w, bounds=[(0.0, 1.0)] * n,
                   constraints={"type": "eq", "fun": lambda w: w.sum() - 1.0, "jac": lambda w: np.ones(n)},
                   method="SLSQP", options={"ftol": 1e-16, "maxiter": 1000})
    vertex = 0.5 * np.einsum("ij,jk,ik->i", x, A, x).min()
    return float(min(max(res.fun, 0.0), vertex))


def frank_wolfe_energy(positions, B) -> tuple[np.ndarray, np.ndarray]:
    r"""The energy gap of a hardmax flow with negative semidefinite :math:`B`, and Frank-Wolfe's bound.

    With :math:`f(y) = -\frac12 y^T B y` (convex), each token runs Frank-Wolfe on :math:`f` over the hull
    :math:`\mathcal K_t` of the current tokens. The energy is the worst token's gap

    .. math:: E(t) = \max_i f(x_i(t)) - \min_{\mathcal K_t} f,

    non-increasing for any step in :math:`[0, 1]` (:math:`f` convex: :math:`\max_i f` cannot grow; the hulls are
    nested: the minimum cannot fall). With :math:`h_t = 2/(t+2)` the classical argument (the hulls' minima only
    rise) gives :math:`E(t) \le 2 C / (t + 2)`, :math:`C = \lambda_{\max}(-B)\, \mathrm{diam}(\mathcal K_0)^2`.

    Parameters
    ----------
    positions : array (T, n, d)
        A flow (:func:`hardmax_flow` with ``h="frank-wolfe"``).
    B : array (d, d), symmetric negative semidefinite

    Returns
    -------
    energy, bound : numpy.ndarray (T,)
        :math:`E(t)` (the hull minimum by a small quadratic program, SLSQP) and :math:`2C/(t+2)`.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import hardmax_flow, frank_wolfe_energy
    >>> x0 = np.random.default_rng(0).normal(size=(8, 2))
    >>> E, bound = frank_wolfe_energy(hardmax_flow(x0, -np.eye(2), "frank-wolfe", 50), -np.eye(2))
    >>> bool(np.all(np.diff(E) <= 1e-12) and np.all(E <= bound))
    True
    """
    X = np.asarray(positions, dtype=np.float64)
    if X.ndim != 3:
        raise ValueError(f"positions must be an array (T, n, d), got shape {X.shape}")
    A = -_matrix(B, X.shape[2], "nsd")
    f = 0.5 * np.einsum("tij,jk,tik->ti", X, A, X)
    energy = np.array([f[t].max() - _hull_minimum(X[t], A) for t in range(len(X))])
    diam2 = max(float(((X[0][:, None] - X[0][None]) ** 2).sum(-1).max()), 0.0)
    C = float(np.linalg.eigvalsh(A).max()) * diam2
    return np.maximum(energy, 0.0), 2.0 * C / (np.arange(len(X)) + 2.0)


def hardmax_dwell(x0, B, beta, h: float = 0.5, *, radius: float = 0.05, max_steps: int = 100_000) -> int:
    r"""Layers that SoftMax tokens at inverse temperature :math:`\beta` stay near their hardmax targets.

    Runs :func:`hardmax_flow` with ``beta`` and returns the first layer after which some predicted token
    (:func:`hardmax_targets`) lies farther than ``radius`` from its target, having been within ``radius`` of it:
    ``max_steps`` if they never leave, 0 if they never all arrive (``beta`` too small for ``radius``). The paper
    proves the dwell grows exponentially in :math:`\beta`, with no constant given: fit :math:`\log` dwell against
    :math:`\beta`. (The layers here are SoftMax in numpy: the registered variant's per-call cost dominates at
    ``n ~ 10`` over ``10^4`` layers.)

    Parameters
    ----------
    x0 : array (n, d)
    B : array (d, d), symmetric positive semidefinite
    beta : float
    h : float in (0, 1]
    radius : float
    max_steps : int

    Returns
    -------
    int

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import hardmax_dwell
    >>> x0 = [[1.0, 0.0], [-0.5, 0.8], [-0.5, -0.8], [0.3, 0.1]]
    >>> hardmax_dwell(x0, np.eye(2), 7.0, radius=0.1), hardmax_dwell(x0, np.eye(2), 8.0, radius=0.1)
    (198, 820)
    """
    x = _points(x0)
    B = _matrix(B, x.shape[1], "psd")
    beta = check_number(beta, "beta", positive=True)
    h = check_number(h, "h", positive=True)
    radius = check_number(radius, "radius", positive=True)
    max_steps = check_number(max_steps, "max_steps", integer=True, positive=True)
    pred = hardmax_targets(x, B)
    if not pred.predicted.any():
        raise ValueError("x0 has no token with a predicted hardmax target (hardmax_targets(x0, B).predicted)")
    targets = pred.targets[pred.predicted]
    arrived = False
    for t in range(max_steps):
        S = beta * (x @ B @ x.T)
        K = np.exp(S - S.max(1, keepdims=True))
        x = x + h * (K @ x / K.sum(1, keepdims=True) - x)
        far = np.sqrt(((x[pred.predicted] - targets) ** 2).sum(-1)).max() > radius
        if not arrived and not far:
            arrived = True
        elif arrived and far:
            return t + 1
    return max_steps if arrived else 0
