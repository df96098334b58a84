r"""One point of a heat-limit study: Sinkhorn (or a contrast) particles against the heat equation.

docs/theory/heat_limit.md: particles drawn from :math:`\mathcal N(0, I_d)` and moved by the
rescaled attention flow for a time ``t`` should match :math:`\mathcal N(0, (1 + 2t) I_d)`;
the error has a bias :math:`O(\varepsilon)` and a Monte-Carlo part :math:`O(n^{-1/2})`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["heat_limit_point"]


def heat_limit_point(n: int = 500, eps: float = 0.1, t: float = 0.25, dt: float = 0.025, dim: int = 1,
                     seed: int = 0, normalization: str = "sinkhorn") -> dict:
    r"""Run one rescaled attention flow from a standard Gaussian and measure its error.

    Parameters
    ----------
    n : int
        Number of particles.
    eps : float
        Kernel bandwidth :math:`\varepsilon` (kernel :math:`e^{-|x-y|^2/(2\varepsilon)}`).
    t, dt : float
        Final time and Euler step.
    dim : int
        Space dimension.
    seed : int
        Seed of the initial sample.
    normalization : str
        ``"sinkhorn"``, ``"softmax_gaussian"``, ``"softmax_dot"`` or ``"unnormalized"``.

    Returns
    -------
    dict
        ``variance_error`` (relative error of the mean per-axis variance against
        ``1 + 2t``, the heat solution), ``w2`` (Wasserstein-2 distance to the heat solution
        :math:`\mathcal N(0, (1+2t) I)`), ``w2_floor`` (the same for an i.i.d. sample of
        that size: the Monte-Carlo floor).

    Examples
    --------
    >>> from sinkflow.experiments import heat_limit_point
    >>> r = heat_limit_point(n=300, eps=0.1, t=0.2, dt=0.02)
    >>> abs(r["variance_error"]) < 0.1
    True
    """
    from sinkflow.heat._distances import wasserstein2
    from sinkflow.heat._references import GaussianMixture
    from sinkflow.heat._rescaled_flow import heat_flow

    start = GaussianMixture.isotropic([1.0], np.zeros((1, dim)), 1.0)
    x0 = start.sample(int(n), seed=seed)
    xt = heat_flow(x0, t, eps, dt, normalization=normalization)
    target = start.evolve(t)
    variance = float(np.mean(np.var(xt, axis=0)))
    exact = 1.0 + 2.0 * t
    w2 = wasserstein2(xt, target, floor=True, seed=seed)
    return {"variance_error": (variance - exact) / exact, "w2": float(w2.value), "w2_floor": float(w2.floor)}
