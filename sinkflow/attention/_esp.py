r"""ESP attention: an average of one-dimensional optimal transport plans over slices.

Shahbazi, Akbari, Salehi, Liu, NaderiAlizadeh, Kolouri, "ESPFormer: doubly-stochastic attention
with expected sliced transport plans", ICML 2025, arXiv:2502.07962. ESP is defined from the
point clouds (queries :math:`x_i`, keys :math:`y_j`), not from a score matrix: for each slice
direction :math:`\theta_l` the optimal plan between the projections :math:`\theta_l^T x_i` and
:math:`\theta_l^T y_j` of two uniform measures of ``n`` atoms is the permutation matching equal
ranks, :math:`\Gamma_l = P_l(x)^T P_l(y)` (:math:`P_l` the sorting permutation), and

.. math:: K = \sum_l w_l \Gamma_l, \qquad
          w = \mathrm{softmax}_l\big(-t \langle D, \Gamma_l \rangle\big), \quad D_{ij} = |x_i - y_j|,

a convex combination of permutations: doubly stochastic exactly (Birkhoff). The authors take
axis-aligned slices (:math:`\theta = I`, one per coordinate of a head) and, to differentiate,
replace :math:`P_l` by a soft sort, :math:`P_l[i, j] = \mathrm{softmax}_j(-(s_j - s_{(i)})^2/\tau)`
(:math:`s_{(i)}` the sorted projections, :math:`\tau = 10^{-3}`): rows of each soft sort sum to 1,
columns only approximately, so the soft plan is doubly stochastic only in the hard-sort limit.
``hard=True`` uses the exact sorting permutation in the forward pass (a straight-through gradient
from the soft sort), doubly stochastic to rounding; ties are broken by a stable sort, so each
slice's plan is a permutation even where two projections coincide.

Since ESP needs the positions, it is registered for models only (``heads``): particle flows
and the heat layer receive scores and refuse it; :func:`esp_plan` on positions is the flow's
definition (docs/theory/doubly_stochastic_variants.md measures whether it is a gradient flow).
"""

from __future__ import annotations

import math

import torch

from sinkflow._checks import check_number
from sinkflow.attention._variants import AttentionVariant, _add, compute_dtype

__all__ = ["esp_plan"]


def _sorts(s: torch.Tensor, tau: float, hard: bool) -> torch.Tensor:
    """Soft (or hard, straight-through) sorting matrices ``P[..., l, i, j]`` (token ``j`` has rank ``i``) of
    projections ``s`` (..., n, L)."""
    s = s.mT  # (..., L, n)
    ordered = torch.sort(s, dim=-1, stable=True)
    soft = torch.softmax(-(s[..., None, :] - ordered.values[..., :, None]) ** 2 / tau, dim=-1)
    if not hard:
        return soft
    exact = torch.zeros_like(soft).scatter_(-1, ordered.indices[..., None], 1.0)
    return exact + (soft - soft.detach())  # forward: exactly the permutation (a - a == 0)


def esp_plan(x: torch.Tensor, y: torch.Tensor, *, slices: torch.Tensor | None = None, tau: float = 1e-3,
             temperature: float = 10.0, hard: bool = False) -> torch.Tensor:
    r"""Expected sliced transport plan between two clouds of ``n`` points (ESPFormer's attention).

    Parameters
    ----------
    x, y : torch.Tensor, shapes (..., n, p)
        Queries and keys (same ``n``: uniform measures matched by ranks); leading dimensions
        (batch, heads) are independent problems.
    slices : torch.Tensor, shape (L, p), optional
        Slice directions :math:`\theta_l`; default the ``p`` coordinate axes (the authors' choice).
    tau : float
        Soft-sort temperature (the authors' 1e-3); ignored in the forward pass when ``hard``.
    temperature : float
        Inverse temperature :math:`t \ge 0` of the slice weights :math:`\mathrm{softmax}_l(-t \langle D,
        \Gamma_l\rangle)` (0: plain average; the authors' attention module uses 10). As in the authors'
        code, :math:`\langle D, \Gamma_l \rangle` is ``n`` times the transport cost of slice ``l``.
    hard : bool
        Exact sorting permutations (doubly stochastic to rounding) instead of the soft sort.

    Returns
    -------
    torch.Tensor, shape (..., n, n)
        The plan scaled to rows summing to 1 (``n`` times the coupling of the two uniform
        measures), differentiable, in the dtype of the inputs (their promotion), as every
        other variant: computed in float32 (float64 for float64 inputs) and, for float16 and
        bfloat16 inputs, rounded back (line sums then off by at most about ``eps / 2`` of
        that dtype; the models' ``"esp"`` / ``"esp_hard"`` use the float32 plan).

    Examples
    --------
    >>> import torch, sinkflow
    >>> g = torch.Generator().manual_seed(0)
    >>> x, y = torch.randn(7, 3, generator=g, dtype=torch.float64), torch.randn(7, 3, generator=g, dtype=torch.float64)
    >>> K = sinkflow.esp_plan(x, y, hard=True)
    >>> float((K.sum(-1) - 1).abs().max()) < 1e-12, float((K.sum(-2) - 1).abs().max()) < 1e-12
    (True, True)
    >>> bool(torch.equal(sinkflow.esp_plan(x, x, hard=True), torch.eye(7, dtype=torch.float64)))  # a cloud with itself
    True
    """
    return _plan(x, y, slices, tau, temperature, hard).to(torch.promote_types(x.dtype, y.dtype))


def _plan(x, y, slices, tau, temperature, hard):
    """:func:`esp_plan` in float32 (float64 for float64 inputs)."""
    for t, name in ((x, "x"), (y, "y")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise ValueError(f"{name} must have shape (..., n, p), got {tuple(t.shape)}")
    if x.shape[-2:] != y.shape[-2:]:
        raise ValueError(f"x and y must have the same number of points and dimension (ESP matches ranks of two "
                         f"uniform measures of n atoms), got {tuple(x.shape)} and {tuple(y.shape)}")
    tau = check_number(tau, "tau", positive=True)
    temperature = check_number(temperature, "temperature", positive=True, allow_zero=True)
    dtype = compute_dtype(x, y)
    with torch.autocast(device_type=x.device.type, enabled=False):
        x, y = x.to(dtype), y.to(dtype)
        if slices is not None:
            slices = torch.as_tensor(slices, dtype=dtype, device=x.device)
            if slices.ndim != 2 or slices.shape[1] != x.shape[-1]:
                raise ValueError(f"slices must have shape (L, {x.shape[-1]}), got {tuple(slices.shape)}")
            sx, sy = x @ slices.T, y @ slices.T
        else:
            sx, sy = x, y
        Px, Py = _sorts(sx, tau, hard), _sorts(sy, tau, hard)  # (..., L, n, n)
        plans = Px.mT @ Py  # Gamma_l[a, b]: query a and key b of equal rank along slice l
        cost = torch.cdist(x, y)  # (..., n, n)
        sliced = (plans * cost[..., None, :, :]).sum((-2, -1))  # <D, Gamma_l>: n x each slice's transport cost
        w = torch.softmax(-temperature * sliced, dim=-1)
        return (w[..., :, None, None] * plans).sum(-3)


def _esp_heads(hard: bool):
    name = "esp_hard" if hard else "esp"

    def heads(q, k, v, mask, n_iter, landmarks):
        if mask is not None and not bool(torch.as_tensor(mask).all()):
            raise NotImplementedError(f"attention {name!r} takes no mask (a masked token would still be matched by "
                                      "rank); pass mask=None")
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"attention {name!r} needs as many queries as keys (ESP matches ranks), got "
                             f"{q.shape[-2]} and {k.shape[-2]}")
        dtype = compute_dtype(q, k, v)
        scale = 1.0 / math.sqrt(q.shape[-1])  # the authors' q / sqrt(p), k / sqrt(p)
        plan = _plan(q.to(dtype) * scale, k.to(dtype) * scale, None, 1e-3, 10.0, hard)
        return plan @ v.to(dtype)

    heads.__name__ = f"_{name}_heads"
    return name, heads


for _hard in (False, True):
    _name, _heads = _esp_heads(_hard)
    _add(AttentionVariant(_name, None, "dot", heads=_heads))
