r"""Long-context attention: the critical scaling :math:`\beta_n = \gamma \log n` and the selectivity threshold
(docs/theory/long_context.md).

- :func:`equiangular_cosine`: the output cosine of one attention layer on :math:`n` unit tokens with pairwise
  inner products :math:`\rho`, scores :math:`\beta_n \langle y_i, y_j\rangle`, :math:`\beta_n = \gamma \log n`
  (Chen, Lin, Polyanskiy and Rigollet, *Critical attention scaling in long-context transformers*, ICLR 2026,
  arXiv:2510.05554): closed form, transition at :math:`\gamma_c = 1/(1-\rho)`.
- :func:`critical_scaling`: the same layer measured with any registered attention (SoftMax, Sinkhorn, ...), on the
  equiangular tokens or on an ensemble of random tokens whose correlations are :math:`\rho` on average.
- :func:`selectivity_threshold`: :math:`\beta^*_n`, the inverse temperature at which the median largest attention
  weight is 1/2, for one query against :math:`n` i.i.d. uniform keys on :math:`S^{d-1}` (SoftMax) or for the
  :math:`n \times n` Sinkhorn plan of :math:`n` i.i.d. queries against :math:`n` keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sinkflow._checks import check_number, check_seed
from sinkflow._summary import Summarized, number
from sinkflow.attention._variants import get_attention

__all__ = ["equiangular_cosine", "CriticalScaling", "critical_scaling", "selectivity_threshold"]


def _rho(rho) -> float:
    rho = check_number(rho, "rho")
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must be in [0, 1), got {rho!r}")
    return rho


def equiangular_cosine(n, rho, gamma):
    r"""Cosine between two outputs of one attention layer on an equiangular input (closed form).

    Tokens :math:`y_1..y_n` unit, :math:`\langle y_i, y_j\rangle = \rho` (:math:`i \ne j`), scores
    :math:`\beta \langle y_i, y_j\rangle` with :math:`\beta = \gamma \log n`, row SoftMax (Sinkhorn gives the same
    matrix: it is already doubly stochastic). The self-weight is :math:`a = 1/(1 + (n-1) n^{-\gamma(1-\rho)})`,
    the others :math:`b = (1-a)/(n-1)`; with :math:`z_i = a y_i + b \sum_{j \ne i} y_j`,

    .. math:: \cos(z_i, z_k) = \frac{a^2\rho + 2ab\,(1 + (n-2)\rho) + b^2\,((n-2) + ((n-1)^2 - n + 2)\rho)}
                                    {a^2 + 2ab\,(n-1)\rho + b^2\,(n-1)(1 + (n-2)\rho)},

    from 1 (collapse, :math:`\gamma < \gamma_c = 1/(1-\rho)`) to :math:`\rho` (identity, :math:`\gamma > \gamma_c`)
    as :math:`n \to \infty`, in a window of width :math:`O(1/\log n)` in :math:`\gamma`.

    Parameters
    ----------
    n : int or array (>= 2)
    rho : float in [0, 1)
    gamma : float or array (>= 0)

    Returns
    -------
    float or numpy.ndarray (the broadcast shape of ``n`` and ``gamma``)

    Examples
    --------
    >>> from sinkflow.clustering import equiangular_cosine
    >>> [round(float(equiangular_cosine(10_000, 0.5, 2 * r)), 3) for r in (0.9, 1.0, 1.1)]
    [0.925, 0.8, 0.662]
    """
    rho = _rho(rho)
    n = np.asarray(n, dtype=np.float64)
    gamma = np.asarray(gamma, dtype=np.float64)
    if np.any(n < 2) or np.any(gamma < 0):
        raise ValueError("n must be >= 2 and gamma >= 0")
    a = 1.0 / (1.0 + (n - 1.0) * np.exp(-gamma * (1.0 - rho) * np.log(n)))
    b = (1.0 - a) / (n - 1.0)
    cross = a * a * rho + 2 * a * b * (1 + (n - 2) * rho) + b * b * ((n - 2) + ((n - 1) ** 2 - (n - 2)) * rho)
    norm = a * a + 2 * a * b * (n - 1) * rho + b * b * (n - 1) * (1 + (n - 2) * rho)
    out = cross / norm
    return float(out) if out.ndim == 0 else out


def _gram(n: int, d: int | None, rho: float, rng) -> np.ndarray:
    """Gram matrix of the tokens: exactly equiangular (d None) or y_i = sqrt(rho) u + sqrt(1 - rho) v_i."""
    if d is None:
        return rho + (1.0 - rho) * np.eye(n)
    v = rng.standard_normal((n, d - 1))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return rho + (1.0 - rho) * (v @ v.T)


@dataclass(frozen=True, repr=False)
class CriticalScaling(Summarized):
    r"""Result of :func:`critical_scaling`.

    Attributes
    ----------
    n, d : int (d None: the exact equiangular tokens)
    rho : float
    attention : str
    gammas : numpy.ndarray (G,)
    gamma_c : float
        :math:`1/(1-\rho)`.
    cosine : numpy.ndarray (S, G)
        Mean cosine between distinct outputs, per seed and :math:`\gamma`.
    self_weight : numpy.ndarray (S, G)
        Mean diagonal of the attention matrix.
    reference : numpy.ndarray (G,)
        :func:`equiangular_cosine` at ``n``, ``rho``, ``gammas``.
    """

    n: int
    d: int | None
    rho: float
    attention: str
    gammas: np.ndarray
    gamma_c: float
    cosine: np.ndarray
    self_weight: np.ndarray
    reference: np.ndarray

    def _facts(self):
        tokens = "equiangular" if self.d is None else f"d = {self.d}, {self.cosine.shape[0]} seeds"
        gap = np.abs(self.cosine.mean(0) - self.reference).max()
        return f"one {self.attention} layer at beta = gamma log n, n = {self.n}, rho = {number(self.rho)}", [
            [("tokens", tokens), ("gamma_c", number(self.gamma_c))],
            [("gammas", f"{number(self.gammas.min())} to {number(self.gammas.max())} ({self.gammas.size})"),
             ("max |cosine - closed form|", number(gap))],
        ]


def critical_scaling(n: int, d: int | None = None, rho: float = 0.5, gammas=None, *, attention="softmax",
                     seeds=(0,)) -> CriticalScaling:
    r"""Output cosine of one attention layer against :math:`\gamma`, scores :math:`\gamma \log n\,\langle y_i,
    y_j\rangle`.

    Parameters
    ----------
    n : int (>= 2)
        Tokens (one ``n x n`` matrix per seed and :math:`\gamma`: keep ``n`` to a few thousand).
    d : int, optional
        None: the exact equiangular tokens (:math:`\langle y_i, y_j\rangle = \rho`, any dimension ``>= n``;
        only the Gram matrix is formed). An int ``>= 2``: random unit tokens
        :math:`y_i = \sqrt\rho\, u + \sqrt{1-\rho}\, v_i`, :math:`v_i` uniform on the unit sphere of
        :math:`u^\perp` (:math:`\mathbb R^{d-1}`), correlations :math:`\rho \pm O((1-\rho)/\sqrt d)`, one draw per seed.
    rho : float in [0, 1)
        Use :math:`\rho > 0`: at :math:`\rho = 0` the collapse side has cosine 0 as well (no transition to see).
    gammas : array, optional
        Default: 31 points from :math:`0.5\gamma_c` to :math:`1.5\gamma_c`.
    attention : str or AttentionVariant
        Any variant with a dense ``normalize`` (``"softmax"``, ``"sinkhorn"`` to tolerance, ``"hardmax"``, ...).
    seeds : iterable of int
        One token draw each (only the first is used when ``d`` is None).

    Returns
    -------
    CriticalScaling

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.clustering import critical_scaling
    >>> r = critical_scaling(300, rho=0.5, gammas=[1.0, 2.0, 3.0])
    >>> bool(np.allclose(r.cosine[0], r.reference, atol=1e-10))
    True
    """
    n = check_number(n, "n", integer=True, positive=True)
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    if d is not None:
        d = check_number(d, "d", integer=True, positive=True)
        if d < 2:
            raise ValueError(f"d must be >= 2 (or None: equiangular tokens), got {d}")
    rho = _rho(rho)
    gamma_c = 1.0 / (1.0 - rho)
    gammas = np.linspace(0.5, 1.5, 31) * gamma_c if gammas is None else np.asarray(gammas, dtype=np.float64).ravel()
    if gammas.size == 0 or np.any(~np.isfinite(gammas)) or np.any(gammas < 0):
        raise ValueError("gammas must be a non-empty array of finite values >= 0")
    seeds = [check_seed(s, "seeds") for s in (seeds if np.ndim(seeds) else [seeds])]
    if d is None:
        seeds = seeds[:1]
    variant = get_attention(attention)
    if variant.normalize is None:
        raise ValueError(f"attention must form the matrix; {variant.name!r} is output-only")
    cos = np.empty((len(seeds), gammas.size))
    diag = np.empty_like(cos)
    off = ~np.eye(n, dtype=bool)
    for s, seed in enumerate(seeds):
        G = _gram(n, d, rho, np.random.default_rng(seed))
        Gt = torch.from_numpy(G)
        for g, gamma in enumerate(gammas):
            A = variant.normalize(gamma * np.log(n) * Gt, n_iter=None, mask=None).attention.to(torch.float64)
            Z = (A @ Gt @ A.T).numpy()
            norms = np.sqrt(np.diag(Z))
            cos[s, g] = (Z / np.outer(norms, norms))[off].mean()
            diag[s, g] = float(torch.diagonal(A).mean())
    return CriticalScaling(n, d, rho, variant.name, gammas, gamma_c, cos, diag, equiangular_cosine(n, rho, gammas))


def _uniform_scores(rng, size, d: int) -> np.ndarray:
    """:math:`\\langle q, k\\rangle`, unit ``q``, ``k`` uniform on :math:`S^{d-1}`: ``2 Beta((d-1)/2, (d-1)/2) - 1``."""
    return 2.0 * rng.beta((d - 1) / 2.0, (d - 1) / 2.0, size=size) - 1.0


def _root_one_query(gaps: np.ndarray) -> float:
    r"""The :math:`\beta` where the largest SoftMax weight is 1/2: :math:`\sum_{j \ne \max} e^{-\beta g_j} = 1`."""
    from scipy.optimize import brentq
    from scipy.special import logsumexp

    g = np.sort(gaps)
    phi = lambda beta: logsumexp(-beta * g)  # noqa: E731  decreasing from log(n - 1) > 0
    hi = max(np.log(g.size) / g[0], 1e-12)
    return brentq(phi, 0.0, hi, xtol=1e-12 * hi, rtol=1e-12) if g.size > 1 else brentq(phi, 0.0, hi)


def _sinkhorn_median_top(scores: torch.Tensor, beta: float, variant) -> float:
    P = variant.normalize(beta * scores, n_iter=None, mask=None, tol=1e-4, max_iter=100_000).attention
    return float(P.amax(-1).median())


def selectivity_threshold(n: int, d: int, *, attention="softmax", trials: int = 101, seed: int = 0) -> float:
    r"""The selectivity threshold :math:`\beta^*_n`: the inverse temperature at which the median largest attention
    weight is 1/2.

    ``"softmax"``: one query against ``n`` i.i.d. keys uniform on :math:`S^{d-1}`, weights
    :math:`\mathrm{softmax}(\beta\langle q, k_j\rangle)`; the median over ``trials`` draws of the largest weight.
    Each draw's largest weight increases with :math:`\beta`, so :math:`\beta^*` is the median of the draws' roots
    (each found by Brent's method). Predicted order: :math:`n^{2/(d-1)}` (*Scaling limits of long-context
    transformers*, 2026).

    ``"sinkhorn"``: ``n`` i.i.d. queries against ``n`` i.i.d. keys, the doubly stochastic plan of the scores
    :math:`\beta\langle q_i, k_j\rangle` (rows sum to 1); the median over rows and ``trials`` draws of each row's
    largest weight, bisected in :math:`\log\beta` to 1% (one Sinkhorn solve per step: keep ``n`` to about a thousand).

    Parameters
    ----------
    n : int (>= 2)
    d : int (>= 2)
    attention : {"softmax", "sinkhorn"}
    trials : int
        Independent draws (odd for SoftMax gives an exact median).
    seed : int

    Returns
    -------
    float

    Examples
    --------
    >>> from sinkflow.clustering import selectivity_threshold
    >>> b100, b1000 = selectivity_threshold(100, 3, trials=21), selectivity_threshold(1000, 3, trials=21)
    >>> 5 < b1000 / b100 < 20        # order n^{2/(d-1)} = n for d = 3
    True
    """
    n = check_number(n, "n", integer=True, positive=True)
    d = check_number(d, "d", integer=True, positive=True)
    trials = check_number(trials, "trials", integer=True, positive=True)
    if n < 2 or d < 2:
        raise ValueError(f"n and d must be >= 2, got n = {n}, d = {d}")
    rng = np.random.default_rng(check_seed(seed))
    name = getattr(attention, "name", attention)
    if name == "softmax":
        roots = []
        for _ in range(trials):
            s = _uniform_scores(rng, n, d)
            top = s.argmax()
            roots.append(_root_one_query(np.delete(s.max() - s, top)))
        return float(np.median(roots))
    if name != "sinkhorn":
        raise ValueError(f"attention must be 'softmax' or 'sinkhorn', got {attention!r}")
    variant = get_attention("sinkhorn")
    draws = []
    for _ in range(trials):
        q = rng.standard_normal((n, d))
        k = rng.standard_normal((n, d))
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        draws.append(q @ k.T)
    scores = torch.from_numpy(np.stack(draws))
    lo, hi = 1.0, 10.0
    while _sinkhorn_median_top(scores, hi, variant) < 0.5:
        lo, hi = hi, hi * 10.0
    for _ in range(20):  # to 1% in beta
        mid = np.sqrt(lo * hi)
        if _sinkhorn_median_top(scores, mid, variant) < 0.5:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.01:
            break
    return float(np.sqrt(lo * hi))
