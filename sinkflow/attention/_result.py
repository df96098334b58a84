"""What a Sinkhorn solve returns and how it warns: :class:`SinkhornResult` (the attention, its
potentials, whether it converged and how far off it is) and :class:`SinkhornWarning`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sinkflow._summary import Summarized, describe_array, number, shape_text

__all__ = ["SinkhornWarning", "SinkhornResult"]


class SinkhornWarning(UserWarning):
    """Issued when a run-to-tolerance solve cannot deliver ``tol``.

    Either up front (``tol`` below what the dtype can reach) or at the end (the error
    stalled, or ``max_iter`` ran out); the result then has ``converged=False``.
    """


@dataclass(frozen=True, repr=False)
class SinkhornResult(Summarized):
    """Everything a Sinkhorn solve knows, returned instead of printed.

    Its ``repr`` is a short summary (shape, dtype, converged or not, the marginal error against
    ``tol``, the half-iterations), never the matrices; in Jupyter the same facts show as a table.

    Examples
    --------
    >>> import torch, sinkflow
    >>> res = sinkflow.solve_sinkhorn(torch.randn(5, 5, dtype=torch.float64))
    >>> res  # doctest: +ELLIPSIS
    <SinkhornResult> attention 5 x 5, torch float64
      converged: marginal error ... <= tol ...; n_iter: ... half-iterations
    >>> "<table" in res._repr_html_()
    True

    Attributes
    ----------
    attention : array, shape (..., n, m)
        The normalized matrix :math:`K` (rows sum to 1, :math:`a^T K = b`).
    f, g : arrays, shapes (..., n) and (..., m)
        Log potentials, :math:`K = \\exp(f_i + C_{ij} + g_j)`. Entries of queries (keys)
        excluded by the mask are 0. They have a gauge: :math:`(f + c, g - c)` gives the same
        :math:`K`, so compare potentials in a fixed gauge. In optimal-transport terms (cost
        :math:`C^{OT} = -\\varepsilon C`, plan :math:`a_i K_{ij} = a_i b_j
        e^{(F_i + G_j - C^{OT}_{ij})/\\varepsilon}`, the convention of geomloss and POT) the
        potentials are :math:`F = \\varepsilon (f + c)` and :math:`G = \\varepsilon (g - \\log b - c)`;
        the balanced gauge :math:`\\langle a, F\\rangle = \\langle b, G\\rangle` fixes :math:`c`, and in
        it transposition swaps them: :math:`F` of the solve of :math:`(C, a, b)` is :math:`G` of
        the solve of :math:`(C^T, b, a)`. The raw ``f`` and ``g`` do not swap (``f`` normalizes
        rows of :math:`K` to 1, ``g`` its columns to ``b``: they differ by a constant and
        :math:`\\log b`, 1.04 on geomloss's 2 x 2 symmetry case).
    n_iter : int
        Half-iterations performed (all epsilon-scaling stages counted).
    converged : bool
        Whether ``marginal_error <= tol``.
    marginal_error : float
        Final :math:`\\max(\\sum_i a_i |\\sum_j K_{ij} - 1|, \\sum_j |\\sum_i a_i K_{ij} - b_j|)`,
        the largest over batch entries.
    errors : numpy.ndarray
        Marginal error after each half-iteration (the L1 error of the plan's column marginal
        after a row step, and vice versa; with over-relaxation the larger of both). Newton
        polishing steps, when they run, append one entry each.
    scales : numpy.ndarray
        Score multiplier of each half-iteration (all ones without epsilon scaling).
    tol : float
        The tolerance the convergence flag refers to.
    a, b : arrays
        The query and key weights used (after masking and renormalization).
    """

    attention: Any
    f: Any
    g: Any
    n_iter: int
    converged: bool
    marginal_error: float
    errors: np.ndarray
    scales: np.ndarray
    tol: float
    a: Any
    b: Any

    @property
    def plan(self):
        """The transport plan ``a_i K_ij`` (computed on demand)."""
        return self.a[..., :, None] * self.attention

    def _facts(self):
        head = f"attention {shape_text(np.shape(self.attention))}, {describe_array(self.attention)}"
        if self.converged:
            state = ("converged", f"marginal error {number(self.marginal_error)} <= tol {number(self.tol)}")
        else:
            state = ("NOT converged", f"marginal error {number(self.marginal_error)} > tol {number(self.tol)}")
        facts = [state, ("n_iter", f"{self.n_iter} half-iterations")]
        stages = int(np.count_nonzero(np.diff(np.asarray(self.scales, dtype=float)))) + 1 if np.size(self.scales) else 1
        if stages > 1:
            facts.append(("epsilon scaling", f"{stages} stages"))
        return head, [facts]
