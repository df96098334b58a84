r"""Orthostochastic attention: :math:`K = Q \odot Q` of an orthogonal matrix :math:`Q` built from the scores.

For an orthogonal :math:`Q` every row and column of :math:`Q \odot Q` sums to
:math:`\sum_j Q_{ij}^2 = 1`: the matrix is doubly stochastic by construction, to rounding, with no
iteration (Born, Skogh, Rhrissorrakrai, Utro, Wagner, Sobczyk, "Quantum doubly stochastic
transformers", NeurIPS 2025, arXiv:2504.16275; their classical variant takes :math:`Q` from a QR
decomposition of the scores). Three ways to get :math:`Q` from square scores :math:`C`:

``"skew"`` (default)  :math:`Q = \exp(C - C^T)`, the exponential of a skew-symmetric matrix.
                      Defined for every :math:`C`, smooth, permutation-equivariant
                      (:math:`\Pi C \Pi^T \mapsto \Pi K \Pi^T`), sees the temperature; the identity
                      for every symmetric :math:`C`.
``"polar"``           the orthogonal polar factor :math:`U V^T` of :math:`C - \bar C` (SVD
                      :math:`C - \bar C = U \Sigma V^T`, :math:`\bar C` the mean entry). Equivariant
                      and unique only where :math:`C - \bar C` is nonsingular; blind to a positive
                      temperature; the identity on symmetric positive definite scores.
``"qr"``              the paper's classical variant: :math:`Q` of :math:`C - \bar C = QR`, signs fixed by
                      :math:`R_{ii} \ge 0`. Not permutation-equivariant (QR orthogonalizes the
                      columns in their order), blind to a positive temperature, the identity on
                      upper-triangular scores with a positive diagonal.

Scores are defined up to an additive constant (SoftMax and Sinkhorn ignore it; the particle
flows and the heat layer add :math:`\log(1/n)` to them), hence the centring by the mean entry
:math:`\bar C`: ``"skew"`` needs none (a constant cancels in :math:`C - C^T`). Every method is
:math:`O(n^3)` per head (a matrix exponential, an SVD, a QR) against :math:`O(n^2)` for a Sinkhorn
step: docs/theory/doubly_stochastic_variants.md has the measured times, errors per dtype and
the gradient-flow measurements.
"""

from __future__ import annotations

import torch

from sinkflow._checks import check_choice
from sinkflow.attention._variants import AttentionVariant, Normalized, _add, compute_dtype

__all__ = ["orthostochastic", "ORTHOSTOCHASTIC_METHODS"]

#: The constructions of the orthogonal factor, default first.
ORTHOSTOCHASTIC_METHODS = ("skew", "polar", "qr")


def _orthogonal(C: torch.Tensor, method: str) -> torch.Tensor:
    if method == "skew":
        Q = torch.linalg.matrix_exp(C - C.mT)
        # Scaling and squaring loses orthogonality with the norm of C - C^T (float32, n = 1,024: rows of Q * Q
        # off by 1e-3); two Newton-Schulz steps Q <- Q (3 I - Q^T Q) / 2 bring it back (6e-7), equivariantly.
        for _ in range(2):
            Q = 1.5 * Q - 0.5 * Q @ (Q.mT @ Q)
        return Q
    centred = C - C.mean(dim=(-2, -1), keepdim=True)
    if method == "polar":
        U, _, Vh = torch.linalg.svd(centred)
        return U @ Vh
    Q, R = torch.linalg.qr(centred)
    sign = torch.where(torch.diagonal(R, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(Q.dtype)
    return Q * sign[..., None, :]


def orthostochastic(scores: torch.Tensor, method: str = "skew") -> torch.Tensor:
    r"""Doubly stochastic :math:`K = Q \odot Q` of an orthogonal :math:`Q` made from square scores.

    Parameters
    ----------
    scores : torch.Tensor, shape (..., n, n)
        Scores :math:`C`; leading dimensions (batch, heads) are independent problems.
    method : {"skew", "polar", "qr"}
        How :math:`Q` is made (module docstring): :math:`\exp(C - C^T)` (default), the polar
        factor or the QR factor of the mean-centred scores.

    Returns
    -------
    torch.Tensor, shape (..., n, n)
        In the scores' dtype; computed in float32 (float64 for float64 scores). Rows and
        columns sum to 1 to rounding (measured at n = 1,024: 1e-14 in float64, 2e-6 in float32).

    Raises
    ------
    ValueError
        If the scores are not square (an orthostochastic matrix is square) or ``method`` is unknown.

    Examples
    --------
    >>> import torch, sinkflow
    >>> C = torch.randn(2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> K = sinkflow.orthostochastic(C)
    >>> float((K.sum(-1) - 1).abs().max()) < 1e-12, float((K.sum(-2) - 1).abs().max()) < 1e-12
    (True, True)
    >>> bool(torch.allclose(sinkflow.orthostochastic(C + C.mT), torch.eye(6, dtype=torch.float64)))
    True
    """
    check_choice(method, "method", ORTHOSTOCHASTIC_METHODS)
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch tensor, got {type(scores).__name__}")
    if scores.ndim < 2 or scores.shape[-1] != scores.shape[-2]:
        raise ValueError(f"scores must be square (..., n, n) for orthostochastic attention, got {tuple(scores.shape)}")
    dtype = compute_dtype(scores)
    with torch.autocast(device_type=scores.device.type, enabled=False):
        Q = _orthogonal(scores.to(dtype), method)
    return (Q * Q).to(scores.dtype)


def _normalizer(method: str):
    name = "orthostochastic" if method == "skew" else f"orthostochastic_{method}"

    def normalize(C, *, n_iter=None, mask=None, weights=None, tol=None, max_iter=None, init_g=None):
        if mask is not None and not bool(torch.as_tensor(mask).all()):
            raise NotImplementedError(f"attention {name!r} takes no mask: Q * Q of an orthogonal Q has no zero "
                                      "pattern to impose (pass mask=None)")
        if weights is not None:
            raise NotImplementedError(f"attention {name!r} has uniform marginals only (an orthostochastic matrix is "
                                      "doubly stochastic); pass weights=None")
        return Normalized(orthostochastic(C, method), None, 0, True)

    normalize.__name__ = f"_{name}"
    return name, normalize


for _method in ORTHOSTOCHASTIC_METHODS:
    _name, _fn = _normalizer(_method)
    _add(AttentionVariant(_name, _fn, "dot"))
