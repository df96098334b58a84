"""Spectral quantities behind Skyformer's Nyström theorem: spectral norms and extreme
eigenvalues (dense or Lanczos), ridge leverage scores, the statistical dimension d_stat, the
landmark count the theorem requires, and binomial confidence intervals for failure rates.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sinkflow._checks import check_number

__all__ = [
    "LANDMARK_CONSTANT",
    "SHARP_LANDMARK_CONSTANT",
    "spectral_norm",
    "extreme_eigenvalues",
    "ridge_leverage_scores",
    "statistical_dimension",
    "beta_star",
    "landmarks_required",
    "binomial_interval",
]


def _check_fraction(value, name):
    """A probability-like parameter in (0, 1)."""
    if not (0 < check_number(value, name) < 1):
        raise ValueError(f"{name} must be in (0, 1), got {value}")
    return float(value)


def _check_trials(trials):
    return check_number(trials, "trials", integer=True, positive=True)


#: The theorem's constant c in m >= c (d_stat / beta) log(4n / delta) (docs/theory/nystrom.md).
LANDMARK_CONSTANT = 56.0 / 3.0


#: The constant the same matrix-Bernstein argument gives with tight summand and variance bounds.
SHARP_LANDMARK_CONSTANT = 28.0 / 3.0


_DENSE_LIMIT = 1024


def _np64(A, name="A"):
    if isinstance(A, torch.Tensor):
        if A.is_complex():
            raise TypeError(f"{name} must be real, got a tensor of dtype {A.dtype}")
        A = A.detach().cpu().double().numpy()
    if np.iscomplexobj(A):
        raise TypeError(f"{name} must be real, got a complex array")
    a = np.asarray(A, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a matrix, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} has non-finite entries")
    return a


def _v0(n, seed=0):
    # ARPACK's default start vector is random per call: fix it so results are deterministic.
    return np.random.default_rng(seed).standard_normal(n)


def _use_dense(shape, method, dense_limit):
    check_number(dense_limit, "dense_limit", integer=True, positive=True, allow_zero=True)
    if method not in ("auto", "dense", "lanczos"):
        raise ValueError(f"method must be 'auto', 'dense' or 'lanczos', got {method!r}")
    return method == "dense" or (method == "auto" and min(shape) <= dense_limit)


def spectral_norm(A, *, symmetric: bool = False, method: str = "auto", tol: float = 1e-12,
                  dense_limit: int = _DENSE_LIMIT) -> float:
    r"""Exact spectral norm :math:`\|A\|_2` (largest singular value), in float64.

    ``method="dense"`` uses LAPACK (``eigvalsh`` when ``symmetric``, else an SVD);
    ``"lanczos"`` uses ARPACK (``eigsh``/``svds``, ``k = 1``) to relative accuracy ``tol``,
    which is what makes ``n = 2048`` take seconds; ``"auto"`` picks dense up to
    ``dense_limit`` rows.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.spectral_norm(np.diag([3.0, -4.0]))
    4.0
    >>> round(sinkflow.spectral_norm(np.diag([3.0, -4.0]), method="lanczos"), 12)
    4.0
    """
    import scipy.sparse.linalg as spla  # lazy: 0.7 s of import time otherwise paid by `import sinkflow`

    a = _np64(A)
    tol = check_number(tol, "tol", positive=True, allow_zero=True)  # ARPACK: 0 is machine precision
    if _use_dense(a.shape, method, dense_limit) or min(a.shape) < 3:
        if symmetric:
            return float(np.abs(np.linalg.eigvalsh(a)[[0, -1]]).max())
        return float(np.linalg.norm(a, 2))
    if symmetric:
        return float(abs(spla.eigsh(a, k=1, which="LM", tol=tol, v0=_v0(a.shape[0]), return_eigenvectors=False)[0]))
    return float(spla.svds(a, k=1, tol=tol, v0=_v0(min(a.shape)), return_singular_vectors=False)[0])


def extreme_eigenvalues(S, *, method: str = "auto", tol: float = 1e-12, dense_limit: int = _DENSE_LIMIT):
    r"""Smallest and largest eigenvalue of a symmetric matrix (the Loewner checks' tool).

    The Lanczos path finds :math:`\lambda_{max}` directly and :math:`\lambda_{min}` as
    :math:`c - \lambda_{max}(cI - S)` with :math:`c = \|S\|_2`, so both are accurate to
    ``tol`` relative to :math:`\|S\|_2` even when the spectrum clusters at 0.

    Returns
    -------
    (float, float)
        :math:`(\lambda_{min}, \lambda_{max})`.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.extreme_eigenvalues(np.diag([-1.0, 0.5, 2.0]))
    (-1.0, 2.0)
    """
    import scipy.sparse.linalg as spla

    a = _np64(S, "S")
    tol = check_number(tol, "tol", positive=True, allow_zero=True)
    if a.shape[0] != a.shape[1]:
        raise ValueError(f"S must be square, got {a.shape}")
    if _use_dense(a.shape, method, dense_limit) or a.shape[0] < 3:
        w = np.linalg.eigvalsh(a)
        return float(w[0]), float(w[-1])
    v0 = _v0(a.shape[0])
    top = float(spla.eigsh(a, k=1, which="LA", tol=tol, v0=v0, return_eigenvectors=False)[0])
    c = max(abs(top), float(abs(spla.eigsh(a, k=1, which="LM", tol=tol, v0=v0, return_eigenvectors=False)[0])))
    shifted = spla.LinearOperator(a.shape, matvec=lambda x: c * x - a @ x, dtype=np.float64)
    low = c - float(spla.eigsh(shifted, k=1, which="LA", tol=tol, v0=v0, return_eigenvectors=False)[0])
    return low, top


def ridge_leverage_scores(Cbar, lam: float, method: str = "cholesky") -> np.ndarray:
    r"""Ridge leverage scores :math:`l_i = [\bar C(\bar C + \lambda I)^{-1}]_{ii}`, float64.

    ``"cholesky"`` (default, :math:`\tfrac23 N^3` flops) uses
    :math:`l_i = 1 - \lambda [(\bar C + \lambda I)^{-1}]_{ii}` and the inverse Cholesky factor;
    ``"eigh"`` uses the eigendecomposition (a reference, ~10x slower).

    Raises ``numpy.linalg.LinAlgError`` (a ``ValueError``) naming ``Cbar`` when it is not positive
    semi-definite (the Cholesky factor of :math:`\bar C + \lambda I` does not exist).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.ridge_leverage_scores(np.diag([1.0, 3.0]), 1.0)
    array([0.5 , 0.75])
    """
    import scipy.linalg

    a = _np64(Cbar, "Cbar")
    lam = float(check_number(lam, "lam", positive=True))
    if a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise ValueError(f"Cbar must be a non-empty square (PSD kernel) matrix, got shape {a.shape}")
    if method == "eigh":
        w, U = np.linalg.eigh(a)
        w = np.clip(w, 0.0, None)
        return (U * U) @ (w / (w + lam))
    if method != "cholesky":
        raise ValueError(f"method must be 'cholesky' or 'eigh', got {method!r}")
    try:
        L = scipy.linalg.cholesky(a + lam * np.eye(a.shape[0]), lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        low = float(np.linalg.eigvalsh(0.5 * (a + a.T))[0])
        raise np.linalg.LinAlgError(
            f"Cbar must be positive semi-definite (a kernel matrix): Cbar + lam I is not positive definite, Cbar's "
            f"smallest eigenvalue is {low:.3g} <= -lam = {-lam:.3g}; ridge leverage scores are defined for PSD "
            "matrices only") from None
    Linv, info = scipy.linalg.lapack.dtrtri(L, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"triangular inverse failed (info={info})")
    return 1.0 - lam * np.einsum("ij,ij->j", Linv, Linv)


def statistical_dimension(Cbar, lam: float) -> float:
    r""":math:`d_{stat} = \mathrm{tr}(\bar C(\bar C + \lambda I)^{-1}) = \sum_i l_i`.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.statistical_dimension(np.diag([1.0, 3.0]), 1.0)
    1.25
    """
    return float(ridge_leverage_scores(Cbar, lam).sum())


def beta_star(leverage) -> float:
    r"""Largest admissible :math:`\beta = d_{stat} / (N \max_i l_i)` for uniform sampling.

    Examples
    --------
    >>> import sinkflow
    >>> round(sinkflow.beta_star([0.5, 0.75]), 12)   # 1.25 / (2 * 0.75)
    0.833333333333
    """
    lev = np.asarray(leverage)
    if lev.dtype.kind not in "iuf":
        raise TypeError(f"leverage must be an array of real leverage scores, got dtype {lev.dtype}")
    lev = lev.astype(np.float64)
    if lev.ndim != 1 or lev.size == 0:
        raise ValueError(f"leverage must be a non-empty 1-D array of scores, got shape {lev.shape}")
    if not np.isfinite(lev).all():
        raise ValueError("leverage has non-finite entries")
    if not lev.max() > 0:
        raise ValueError(f"leverage must have a positive score (all are <= 0, max {lev.max():g}): beta* = "
                         "d_stat / (N max l_i) is then undefined")
    return float((lev / lev.max()).mean())  # sum / (N max), without the sum overflowing


def landmarks_required(d_stat: float, beta: float, n_points: int, delta: float,
                       constant: float = LANDMARK_CONSTANT) -> int:
    r"""The theorem's landmark count :math:`\lceil c\,(d_{stat}/\beta) \log(2N/\delta) \rceil`.

    ``n_points`` is :math:`N = n_q + n_k` (``2n`` for self-attention, so the log is
    :math:`\log(4n/\delta)`). See the module docstring for the constant.

    Examples
    --------
    >>> import math, sinkflow
    >>> sinkflow.landmarks_required(10.0, 0.5, 200, 0.1) == math.ceil(56 / 3 * 20 * math.log(4000))
    True
    """
    delta = _check_fraction(delta, "delta")
    d_stat, beta = check_number(d_stat, "d_stat", positive=True), check_number(beta, "beta", positive=True)
    n_points = check_number(n_points, "n_points", integer=True, positive=True)
    constant = check_number(constant, "constant", positive=True)
    return int(math.ceil(constant * (d_stat / beta) * math.log(2 * n_points / delta)))


def binomial_interval(successes: int, trials: int, confidence: float = 0.95, method: str = "exact"):
    """Confidence interval of a binomial proportion (Clopper–Pearson ``"exact"``, or Wilson's score
    interval ``"wilson"``, ``"wilsoncc"`` with continuity correction), as ``scipy.stats.binomtest``
    gives it.

    The exact interval is two quantiles of Beta laws, from ``scipy.special`` (importing
    ``scipy.stats`` costs a second of CPU; the test suite checks the two agree).

    Examples
    --------
    >>> import sinkflow
    >>> lo, hi = sinkflow.binomial_interval(0, 20)
    >>> lo, round(hi, 4)
    (0.0, 0.1684)
    """
    from scipy.special import betaincinv

    n = _check_trials(trials)
    k = check_number(successes, "successes", integer=True, positive=True, allow_zero=True)
    if k > n:
        raise ValueError(f"successes must be at most trials ({n}), got {k}")
    confidence = _check_fraction(confidence, "confidence")
    if method in ("wilson", "wilsoncc"):
        return _wilson_interval(k, n, confidence, method == "wilsoncc")
    if method != "exact":
        raise ValueError(f"method must be 'exact', 'wilson' or 'wilsoncc', got {method!r}")
    alpha = (1 - confidence) / 2  # P(X >= k | lo) = alpha = P(X <= k | hi): Beta(k, n-k+1) and Beta(k+1, n-k) quantiles
    lo = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, alpha))
    hi = 1.0 if k == n else 1.0 - float(betaincinv(n - k, k + 1, alpha))
    return lo, hi


def _wilson_interval(k: int, n: int, confidence: float, correction: bool) -> tuple[float, float]:
    """Wilson's score interval (Newcombe 1998, methods 3 and 4); 0 at k = 0 and 1 at k = n, as binomtest."""
    from scipy.special import ndtri

    z = float(ndtri(0.5 + 0.5 * confidence))
    p, denom = k / n, 2 * (n + z * z)
    center = (2 * n * p + z * z) / denom
    if correction:
        lo = 0.0 if k == 0 else center - (1 + z * math.sqrt(z * z - 2 - 1 / n + 4 * p * (n * (1 - p) + 1))) / denom
        hi = 1.0 if k == n else center + (1 + z * math.sqrt(z * z + 2 - 1 / n + 4 * p * (n * (1 - p) - 1))) / denom
    else:
        delta = z / denom * math.sqrt(4 * n * p * (1 - p) + z * z)
        lo, hi = (0.0 if k == 0 else center - delta), (1.0 if k == n else center + delta)
    return lo, hi
