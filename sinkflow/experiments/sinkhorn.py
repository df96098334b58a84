r"""How fast Sinkhorn converges: observed rate against :math:`\sigma_2(P)^2` and Birkhoff-Hopf.

docs/theory/normalizations.md: the marginal error of Sinkhorn contracts linearly; the Birkhoff-Hopf
bound :math:`\tanh(\Delta/4)^2` per full iteration always holds but is loose, while the
asymptotic rate is :math:`\sigma_2(P)^2` (Knight 2008), with :math:`P` the doubly
stochastic limit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["sinkhorn_convergence"]


def sinkhorn_convergence(n: int = 30, scale: float = 2.0, seed: int = 0, tol: float = 1e-12) -> dict:
    r"""One point of a Sinkhorn convergence study on random Gaussian scores.

    Draws scores :math:`C = s\,Z` with :math:`Z_{ij} \sim \mathcal N(0, 1)` i.i.d.
    (``n x n``, float64, seeded), solves Sinkhorn to ``tol`` with the plain alternating
    schedule (no epsilon scaling, so the error history is one geometric sequence) and
    compares the observed contraction per full iteration with its prediction
    :math:`\sigma_2(P)^2` and with the Birkhoff-Hopf bound.

    Parameters
    ----------
    n : int
        Number of queries and keys.
    scale : float
        Score multiplier :math:`s` (inverse temperature); larger is colder and slower.
    seed : int
        Seed of the scores.
    tol : float
        Marginal-error tolerance of the solve.

    Returns
    -------
    dict
        ``n_iter`` (half-iterations), ``converged``, ``marginal_error``,
        ``observed_rate``, ``asymptotic_rate`` (:math:`\sigma_2(P)^2`),
        ``birkhoff_hopf_rate`` (:math:`\tanh(\Delta/4)^2`), all per full iteration.

    Examples
    --------
    >>> from sinkflow.experiments import sinkhorn_convergence
    >>> r = sinkhorn_convergence(n=20, scale=1.0, seed=0)
    >>> r["converged"], r["observed_rate"] <= r["birkhoff_hopf_rate"]
    (True, True)
    >>> abs(r["observed_rate"] - r["asymptotic_rate"]) < 0.02
    True
    """
    from sinkflow.attention._normalizations import solve_sinkhorn
    from sinkflow.bounds._stochasticity import asymptotic_rate, birkhoff_hopf_rate, observed_rate

    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    scores = scale * np.random.default_rng(seed).standard_normal((int(n), int(n)))
    res = solve_sinkhorn(scores, tol=tol, epsilon_scaling=False, warn=False)
    return {
        "n_iter": int(res.n_iter),
        "converged": bool(res.converged),
        "marginal_error": float(res.marginal_error),
        "observed_rate": float(observed_rate(res.errors)),
        "asymptotic_rate": float(asymptotic_rate(res.attention)),
        "birkhoff_hopf_rate": float(birkhoff_hopf_rate(scores)),
    }
