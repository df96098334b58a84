r"""Attention normalizations: SoftMax and log-stable Sinkhorn.

Notation (docs/theory/normalizations.md). Scores :math:`C` of shape ``(..., n, m)``, query weights
:math:`a` (``n``), key weights :math:`b` (``m``), uniform by default. Sinkhorn returns

.. math:: K_{ij} = \exp(f_i + C_{ij} + g_j), \qquad \sum_j K_{ij} = 1, \qquad \sum_i a_i K_{ij} = b_j,

so :math:`\pi = \mathrm{diag}(a) K` is the entropic optimal transport plan between
:math:`a` and :math:`b` for the cost :math:`-C` and regularization 1
(``ot.sinkhorn(a, b, -C, reg=1)``). For square uniform problems :math:`K` is doubly
stochastic. Half-iterations alternate a row step (``f``) and a column step (``g``),
starting with a row step from ``g = 0``: one half-iteration is exactly SoftMax.

How the solver stays stable and fast
------------------------------------
The potentials ``f, g`` live in the log domain and every step that could lose accuracy
is a log-sum-exp step. Between such steps the matrix :math:`K` itself is rescaled
multiplicatively (one reduction and one scaling pass instead of ``n m`` exponentials),
which is exact to rounding as long as (i) the marginal about to be divided is far above
the underflow threshold and (ii) entries that underflowed at the last exponentiation
cannot have grown back into relevance. Both are checked at every half-iteration; when
either fails the solver re-exponentiates from ``C + f + g`` (the absorption trick of
Schmitzer 2019). The result never contains NaN or inf, at any temperature. Without autograd
the rescaling is not even applied: the matrix is kept as ``diag(u) K diag(v)`` and each
half-step is one matrix-vector product with ``K`` (:mod:`sinkflow.attention`, within
1.3x of that kernel-domain floor, docs/performance.md); under autograd each half-step's matrix
is kept for the backward. A symmetric problem (square symmetric scores, ``a = b``) starts from
the symmetric fixed point's guess instead of the epsilon-scaling schedule.

Exponent arguments (after subtracting the line maximum) are clamped one unit above the
logarithm of the smallest normal number: float32 ``exp`` is ~9x slower on arguments below
-87 (docs/performance.md), and the clamp changes each entry by less than 3x the float's
smallest normal, far below the resolution of any line sum that is used.

Run-to-tolerance (``n_iter=None``) is accelerated three ways, all converging to the same
(unique) fixed point: epsilon scaling (the scores are multiplied by an increasing schedule
``s_0 < s_1 < ... < 1``, factor 4 between stages, warm-starting the scaled potentials, as
geomloss does; each stage solved to a tolerance that tightens with the multiplier);
over-relaxation with ``omega`` adapted to the observed rate; and Newton steps on the dual
whenever the observed rate predicts more than a few hundred further half-iterations. The
Newton system is Jacobi-scaled (tiny masses no longer make it singular) and gauge-fixed,
and solved densely for small problems, by a sparse factorization when the plan is nearly
sparse (cold problems, any size) and by conjugate gradients otherwise. A stage that stalls
is split in two. Measured on 40 x 40 Gaussian scores at tolerance 1e-9: scores x30 in 466
half-iterations (plain: 9,178); on POT's cold 1D test problem (100 bins, ``reg = 1e-3``)
in 544 half-iterations and 54 Newton steps, where the plain loop stalls at error 2e-3.

Precision: the default tolerance follows the dtype (:func:`default_tolerance`); float16 and
bfloat16 are solved in float32. A solve that cannot reach its tolerance says so (a
:class:`SinkhornWarning`, ``converged=False``) as soon as its rate shows it, instead of
spinning to ``max_iter``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings

import numpy as np
import torch

from sinkflow._backend import (
    branch_free,
    check_finite,
    check_float,
    check_number,
    data_readable,
    finite_or_nan,
    from_torch,
    leading,
    to_torch,
    transform_entry,
    transformed,
    vmapped,
)
from sinkflow._checks import check_numpy_float
from sinkflow.attention._implicit import ImplicitSinkhorn, check_backward, forward_mode_only
from sinkflow.attention._log_steps import _masked_softmax
from sinkflow.attention._marginals import is_padding, uniform_attention_marginal
from sinkflow.attention._operators import (
    _final_error,
    _fixed_iterations,
    _scaling_schedule,
    _symmetric_start,
    dense_operator,
)
from sinkflow.attention._result import SinkhornResult, SinkhornWarning
from sinkflow.attention._solver import _failure_message, sinkhorn_solve
from sinkflow.attention._tolerances import _compute_dtype, _resolve_tolerance

__all__ = ["softmax", "sinkhorn", "solve_sinkhorn"]


# ----------------------------------------------------------------------------------------
# input checks


_MASK_HINT = "use a mask (True = admissible) to exclude entries"


def _prepare(scores, mask, a, b, init_g=None):
    check_numpy_float(scores, "scores")
    C, numpy_out = leading(scores, "scores", mask, a, b, init_g)  # torch out if any input is torch
    check_float(C, "scores")
    if C.ndim < 2:
        raise ValueError(f"scores must have shape (..., n, m) with at least 2 dimensions, got shape {tuple(C.shape)}")
    n, m = C.shape[-2], C.shape[-1]
    if n == 0 or m == 0:
        raise ValueError(f"scores must be non-empty, got shape {tuple(C.shape)}")
    if mask is not None:
        mask = to_torch(mask, "mask").to(C.device)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be boolean (True = attend), got dtype {mask.dtype}")
        try:
            mask = torch.broadcast_to(mask, C.shape)
        except RuntimeError as err:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to scores "
                             f"{tuple(C.shape)}") from err
        C = finite_or_nan(C, "scores (unmasked entries)", _MASK_HINT, mask)
    else:
        C = finite_or_nan(C, "scores", _MASK_HINT)
    a = _weights(a, n, C, "a", "queries")
    b = _weights(b, m, C, "b", "keys")
    return C, mask, a, b, numpy_out


def _weights(w, size, C, name, what):
    dtype = _compute_dtype(C.dtype)
    if w is None:
        return torch.full((size,), 1.0 / size, dtype=dtype, device=C.device)
    w = to_torch(w, name).to(device=C.device)
    check_float(w, name)
    if w.ndim == 0 or w.shape[-1] != size:
        raise ValueError(f"weights {name} must have last dimension {size} (one per {what}), got shape {tuple(w.shape)}")
    check_finite(w, name)
    if bool((w < 0).any()):
        raise ValueError(f"weights {name} must be non-negative")
    total = w.double().sum(-1)  # checked in the precision the weights were given in
    atol = 1e-10 if w.dtype == torch.float64 else max(1e-6, 4 * torch.finfo(w.dtype).eps)
    if not bool(torch.allclose(total, torch.ones_like(total), rtol=0, atol=atol)):
        raise ValueError(f"weights {name} must sum to 1 along the last dimension "
                         f"(sums: {total.detach().cpu().numpy()})")
    return w.to(dtype)


def _effective_weights(a, b, mask, shape, b_given=True):
    """Broadcast weights to the batch; queries (keys) with no admissible key (query) get 0.

    Under a mask that is not a padding mask, default key weights (``b_given=False``) become the
    column marginal of uniform attention under the mask (docs/theory/causal.md).
    """
    batch = shape[:-2]
    try:
        a = torch.broadcast_to(a, batch + a.shape[-1:]).clone()
        b = torch.broadcast_to(b, batch + b.shape[-1:]).clone()
    except RuntimeError as err:
        raise ValueError(f"weights a {tuple(a.shape)} and b {tuple(b.shape)} must broadcast to the batch shape "
                         f"{tuple(batch)} of the scores {tuple(shape)}") from err
    if mask is not None:
        rows, cols = mask.any(-1), mask.any(-2)
        a = a * rows
        sa = a.sum(-1, keepdim=True)
        a = torch.where(sa > 0, a / torch.where(sa > 0, sa, 1), a)
        b = b * cols if b_given or is_padding(mask, rows, cols) else uniform_attention_marginal(mask, a, b)
        sb = b.sum(-1, keepdim=True)
        b = torch.where(sb > 0, b / torch.where(sb > 0, sb, 1), b)
    return a, b


def _exclude_empty_lines(mask, a, b):
    """The mask with every line of weight 0 (``a_i = 0`` or ``b_j = 0``) excluded, or ``mask`` itself.

    A line of weight 0 must be exactly empty and leave the other lines as if it were not
    there, from the first half-step on: the first row step (SoftMax) would otherwise spread
    mass onto a column of weight 0 and shift every row potential, and the multiplicative
    column step cannot take that mass back (its factor ``b_j / c_j`` is kept at 1 where
    ``b_j = 0``). Excluded like a masked line, it is absent from every step (log-domain,
    multiplicative, Newton, epsilon-scaling schedule) and from the gradients. One sync when
    no weight is zero (none under torch.compile: the lines of weight 0 are then always excluded).
    """
    if not branch_free() and bool(torch.minimum(a.amin(), b.amin()) > 0):  # under compile / torch.func: no branch
        return mask
    keep = (a > 0)[..., :, None] & (b > 0)[..., None, :]
    return keep if mask is None else mask & keep


# ----------------------------------------------------------------------------------------
# numerical kernels


def _check_counts(n_iter, max_iter):
    check_number(n_iter, "n_iter (half-iterations)", integer=True, positive=True, allow_none=True)
    check_number(max_iter, "max_iter", integer=True, positive=True)


def _initial_g(init_g, C):
    g = torch.zeros(C.shape[:-2] + C.shape[-1:], dtype=C.dtype, device=C.device)
    if init_g is None:
        return g
    g0 = to_torch(init_g, "init_g", like=C).detach()
    check_finite(g0, "init_g")
    try:
        return (g + g0).contiguous()
    except RuntimeError as err:
        raise ValueError(f"init_g of shape {tuple(g0.shape)} does not broadcast to {tuple(g.shape)}") from err


# ----------------------------------------------------------------------------------------
# public API


def softmax(scores, mask=None):
    """Row-stochastic SoftMax normalization, max-subtracted (never overflows).

    Parameters
    ----------
    scores : array_like or torch.Tensor, shape (..., n, m)
        Attention scores (logits), floating dtype.
    mask : bool array, broadcastable to ``scores``, optional
        ``True`` where a query may attend to a key. A query with no admissible key gets
        a zero row (never NaN).

    Returns
    -------
    K : same type, dtype and device as ``scores``
        ``K[..., i, j] = exp(C_ij) / sum_j exp(C_ij)``.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> K = sinkflow.softmax(np.array([[0.0, np.log(3.0)]]))
    >>> K.round(3)
    array([[0.25, 0.75]])
    """
    C, mask, _, _, numpy_out = _prepare(scores, mask, None, None)
    return from_torch(_masked_softmax(C, mask)[0], numpy_out)


def solve_sinkhorn(scores, n_iter=None, tol=None, max_iter=20_000, *, mask=None, a=None, b=None,
                   init_g=None, epsilon_scaling=True, warn=True, backward="unrolled",
                   _diagnostics=True) -> SinkhornResult:
    r"""Sinkhorn normalization with the full result (potentials, errors, convergence).

    Parameters
    ----------
    scores : array_like or torch.Tensor, shape (..., n, m)
        Scores :math:`C`; leading dimensions (batch, heads) are independent problems.
    n_iter : int or None
        Number of half-iterations (row, column, row, ...). ``1`` is SoftMax exactly.
        ``None`` iterates until the marginal error is below ``tol`` (with epsilon scaling).
    tol : float or None
        Target marginal error (L1 norm of the plan's marginal deviation, see
        :class:`SinkhornResult`). ``None`` takes :func:`default_tolerance` of the scores'
        dtype and size (float64: 1e-9, float32: 1e-5, float16: 1e-3, bfloat16: 1e-2). A
        ``tol`` below what the dtype can reach (:func:`attainable_error`) is raised to it,
        with a :class:`SinkhornWarning` up front. With a fixed ``n_iter`` it only sets
        ``converged``. ``tol=0`` (POT's ``stopThr=0``) disables the stopping test: exactly
        ``max_iter`` half-iterations of the plain alternating loop (POT's ``numItermax``
        counts row-column pairs, so ``max_iter = 2 * numItermax``), no warning, and
        ``converged`` is True only if the marginal error is exactly 0.
    max_iter : int
        Budget of half-iterations for ``n_iter=None``. When it runs out, or earlier when the
        observed rate shows it cannot be met (a stall), ``converged`` is False and a
        :class:`SinkhornWarning` says why.
    mask : bool array broadcastable to ``scores``, optional
        ``True`` = admissible pair. Excluded entries are exactly 0; a query with no
        admissible key gets a zero row and weight 0 (the others are renormalized),
        likewise for keys. Key padding therefore gives the ``m - pads`` real keys weight
        ``1 / (m - pads)`` each: after a column step (even ``n_iter``) their columns sum to
        ``n / (m - pads)``. The Sinkformers NLP code keeps ``1 / m`` for every key, so its
        columns sum to 1: multiply by ``(m - pads) / n`` to compare (rows agree after odd
        ``n_iter``). Any other mask (causal, per pair) targets, with ``b`` not given, the
        column marginal of uniform attention under the mask: key ``j`` gets
        :math:`\sum_i a_i M_{ij} / \sum_{j'} M_{ij'}` (causal: :math:`\frac1n \sum_{i \ge j}
        \frac{1}{i+1}`), so constant scores give the masked average at every ``n_iter`` and
        the limit does not collapse (docs/theory/causal.md).
    a, b : arrays of shape (..., n) and (..., m), optional
        Query and key weights (non-negative, summing to 1 in their own precision);
        uniform by default. A query (key) of weight 0 gets an exactly zero row (column),
        potential 0 and no gradient, and the rest is the solution without it, at every
        ``n_iter`` and at the same cost to tolerance (it is excluded as by the mask).
        A given ``b`` is the exact key marginal (renormalized over admissible keys), whatever
        the mask: under a causal mask a uniform ``b`` is reachable only by the identity, so
        the iterations then collapse to each query attending to itself as ``n_iter`` grows.
    init_g : array (..., m), optional
        Warm start for the column potential ``g`` (e.g. the previous step of a particle
        flow). The first half-iteration is a row step from it; with ``n_iter=None`` a warm
        start skips the epsilon-scaling schedule (not the other accelerations). Changes the
        result of a fixed ``n_iter``.
    epsilon_scaling : bool
        Accelerate ``n_iter=None``: epsilon scaling, over-relaxation and Newton steps on the
        dual (same fixed point, far fewer iterations at cold temperature). ``False`` runs the
        plain alternating loop (still stopping early on a stall).
    warn : bool
        Whether to issue :class:`SinkhornWarning` (unreachable ``tol``, stall, budget).
    backward : {"unrolled", "implicit"}
        How torch inputs that require grad are differentiated. ``"unrolled"`` (the default, for
        a fixed ``n_iter`` and to tolerance alike): autograd through the iterations, the exact
        derivative of what was computed. ``"implicit"``: the solver runs without autograd (all
        accelerations) and the backward solves the linear system of the first-order conditions
        at the returned matrix (docs/theory/implicit.md): the derivative of the converged map,
        memory independent of the iteration count, with respect to ``scores`` and the weights
        ``a``, ``b`` (those of the map extended by scale invariance, ``K(a, b) = K(a / sum(a),
        b / sum(b))``: :math:`\langle a, \partial L/\partial a\rangle = 0`, likewise for ``b``,
        as the unrolled gradients of an iterate that ends on a row step); double backward
        (``create_graph=True``) and ``torch.func`` grad, vjp, jvp and hessian work (vmap with a
        fixed ``n_iter``). If the returned matrix has not converged (marginal error above
        ``tol``, also after a fixed ``n_iter``), a :class:`SinkhornWarning` says so (unless
        ``warn`` is False) and the gradient is still that of the conditions at the current
        iterate. Forward mode (``torch.func.jvp``, ``torch.autograd.forward_ad``) of a run to
        tolerance takes this implicit tangent with either choice: the unrolled tangent would
        follow the differentiable iterations, which have no Newton steps and stall on cold
        scores (with them, the tangent would be lost).

    Returns
    -------
    SinkhornResult
        Arrays in the input's type (numpy in, numpy out; torch keeps device and dtype).
        float16 and bfloat16 scores are solved in float32 and the results rounded back;
        ``marginal_error`` is that of the rounded matrix (with either ``backward``), and
        ``converged`` compares it with ``tol`` (default 1e-3 for float16 and 1e-2 for bfloat16,
        raised to :func:`attainable_error`, which for these includes the dtype's ``eps``). That
        error is an average over lines (L1 of the plan's marginals), not a bound on each: for
        bfloat16 scores ``10 * randn(1024, 1024)`` (seed 0) it is 5.8e-3 while the worst row sum
        is off by 8.7e-2, the worst column sum by 2.8e-2; rounding alone moves each line sum by
        up to ``eps / 2`` (3.9e-3 in bfloat16).

    Notes
    -----
    Differentiation: with torch inputs that require grad, the iterations are unrolled
    (out-of-place) and autograd differentiates through them, as a Sinkformer layer does
    (Newton steps are then not used).

    Precision: the marginal error of a float32 solve floors near ``eps sqrt(n)`` (rounding
    of the line sums), so float32 defaults to ``tol = 1e-5``; ask for float64 inputs for
    tighter solutions.

    Cold problems (scores spanning 1e4 and more, e.g. ``-M / reg`` for small ``reg``)
    converge through epsilon scaling with Newton steps once the half-iterations slow down:
    POT's 1D test problem (two Gaussian histograms on 100 bins, squared-distance cost)
    reaches 1e-9 at ``reg = 1e-3``, where plain iterations stall near 2e-3.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> C = np.random.default_rng(0).normal(size=(5, 5))
    >>> res = sinkflow.solve_sinkhorn(C)
    >>> res.converged, bool(np.allclose(res.attention.sum(0), 1))
    (True, True)
    """
    with transform_entry(scores, mask, a, b, init_g):
        return _solve_sinkhorn(scores, n_iter, tol, max_iter, mask, a, b, init_g, epsilon_scaling, warn, _diagnostics,
                               backward)


def _solve_sinkhorn(scores, n_iter, tol, max_iter, mask, a, b, init_g, epsilon_scaling, warn, _diagnostics,
                    backward="unrolled", route=True):
    b_given = b is not None
    check_backward(backward)
    C, mask, a, b, numpy_out = _prepare(scores, mask, a, b, init_g)
    # (taken for every torch input: a torch.func.jvp tangent does not show as requires_grad)
    implicit = backward == "implicit" and not numpy_out
    if vmapped(C):  # torch.func.vmap: no stopping test, no float diagnostics per sample
        if n_iter is None:
            raise RuntimeError("solve_sinkhorn runs to tolerance (n_iter=None) with a data-dependent stopping loop, "
                               "which torch.func.vmap cannot batch: pass a fixed n_iter (half-iterations), or loop "
                               "over the batch")
        _diagnostics = False
    out_dtype = C.dtype
    C = C.to(_compute_dtype(out_dtype))
    _check_counts(n_iter, max_iter)
    tol = _resolve_tolerance(tol, out_dtype, C.shape, warn and n_iter is None)
    run_out = n_iter is None and tol == 0  # tol=0: exactly max_iter half-iterations, no stopping test
    n_iter, warn = (max_iter, False) if run_out else (n_iter, warn)
    a, b = _effective_weights(a, b, mask, C.shape, b_given)
    mask = _exclude_empty_lines(mask, a, b)
    inplace = not (transformed() or torch.is_grad_enabled() and (C.requires_grad or a.requires_grad or b.requires_grad))
    # Forward mode (torch.func.jvp, forward_ad) of a run to tolerance: the implicit tangent. Unrolled, the
    # differentiable iterations run without Newton steps and stall on cold problems, and with the
    # accelerations (Newton steps, which drop the tangent) forward_ad's tangent would be wrong.
    routed = (route and not implicit and not numpy_out and n_iter is None and not run_out
              and forward_mode_only(C, a, b, init_g))
    if implicit or routed:
        return _implicit_solve(C, out_dtype, n_iter, tol, max_iter, mask, a, b, init_g, epsilon_scaling, warn,
                               run_out, numpy_out, "backward='implicit'" if implicit else
                               "forward-mode differentiation to tolerance (the implicit tangent)")
    f = torch.zeros(C.shape[:-1], dtype=C.dtype, device=C.device)
    g = _initial_g(init_g, C)
    if n_iter is not None:
        P, f, g, report = _fixed_iterations(C, f, g, a, b, mask, int(n_iter), inplace, _diagnostics)
    else:
        start = _symmetric_start(C, mask, a, b) if init_g is None and epsilon_scaling else None
        g = g if start is None else start
        # A warm start is already near the solution: no annealing, but the same acceleration.
        # Newton steps bridge larger jumps in the multiplier than half-iterations alone.
        schedule = (_scaling_schedule(C, mask, factor=4.0 if inplace else 2.0)
                    if epsilon_scaling and init_g is None and start is None else [1.0])
        # Rounding a half-precision result back costs up to eps / 2 of marginal error.
        inner_tol = tol - 0.5 * torch.finfo(out_dtype).eps if out_dtype != C.dtype else tol
        (P, f, g), report = sinkhorn_solve(dense_operator(C, a, b, mask, inplace), f, g, tol=inner_tol,
                                           max_iter=max_iter, schedule=schedule, accelerate=epsilon_scaling)
    P = P.to(out_dtype)
    # sinkhorn() with a fixed n_iter only wants the matrix: no diagnostic passes.
    err = _final_error(P.to(C.dtype), a, b) if _diagnostics else math.nan
    converged = err <= tol
    if n_iter is None and not converged and warn:
        report.marginal_error = err
        warnings.warn(_failure_message(report, tol, max_iter, out_dtype), SinkhornWarning, stacklevel=3)
    # Potentials of excluded queries / keys are reported as 0.
    f = torch.where(a > 0, f, torch.zeros_like(f))
    g = torch.where(b > 0, g, torch.zeros_like(g))
    errors = np.array(report.errors, dtype=float)
    return SinkhornResult(
        attention=from_torch(P, numpy_out), f=from_torch(f, numpy_out), g=from_torch(g, numpy_out),
        n_iter=report.n_iter, converged=bool(converged), marginal_error=err, errors=errors,
        scales=np.array(report.scales, dtype=float), tol=float(tol),
        a=from_torch(a, numpy_out), b=from_torch(b, numpy_out))


def _implicit_solve(C, out_dtype, n_iter, tol, max_iter, mask, a, b, init_g, epsilon_scaling, warn, run_out,
                    numpy_out, why):
    """The solve without autograd, then :class:`ImplicitSinkhorn` for the derivatives (``C``, ``a``, ``b``)."""
    batched = vmapped(C)
    # Rounding a half-precision result back costs up to eps / 2 of marginal error.
    half = out_dtype != C.dtype and n_iter is None and not run_out
    inner_tol = tol - 0.5 * torch.finfo(out_dtype).eps if half else tol
    # the forward needs no autograd: outside vmap it reads data freely (all accelerations, the stopping test)
    with torch.no_grad(), contextlib.nullcontext() if batched else data_readable():
        result = _solve_sinkhorn(C.detach(), None if run_out else n_iter, inner_tol, max_iter, mask, a.detach(),
                                 b.detach(), init_g, epsilon_scaling, warn, True, route=False)
    K = torch.as_tensor(result.attention)
    P = ImplicitSinkhorn.apply(C, K.to(C.dtype), a, b).to(out_dtype)
    if out_dtype != C.dtype and not batched:  # half inputs: the error of the returned (rounded) matrix, against tol
        err = _final_error(P.detach().to(C.dtype), a.detach(), b.detach())
        result = dataclasses.replace(result, marginal_error=err, converged=bool(err <= tol), tol=float(tol))
        if warn and result.converged is False and n_iter is None and err > inner_tol and not math.isnan(err):
            warnings.warn(f"Sinkhorn converged, but rounding the result to {out_dtype} moved the marginals "
                          f"(marginal error {err:.3g} > tol={tol:g})", SinkhornWarning, stacklevel=4)
    if warn and not result.converged and not math.isnan(result.marginal_error):  # (no error read under vmap)
        warnings.warn(f"{why}: the solve did not converge (marginal error {result.marginal_error:.3g}"
                      f" > tol={result.tol:g}); the derivative is that of the optimality conditions at the "
                      "returned iterate, not of the converged map", SinkhornWarning, stacklevel=4)
    return dataclasses.replace(result, attention=from_torch(P, numpy_out))


def sinkhorn(scores, n_iter=None, tol=None, max_iter=20_000, *, mask=None, a=None, b=None, backward="unrolled"):
    """Sinkhorn attention: alternate row and column normalizations of ``exp(scores)``.

    Same arguments as :func:`solve_sinkhorn`; returns only the normalized matrix. Use
    :func:`solve_sinkhorn` for potentials, iteration counts and the convergence flag.

    Parameters
    ----------
    scores : array_like or torch.Tensor, shape (..., n, m)
    n_iter : int or None
        Half-iterations; ``1`` equals :func:`softmax`, ``None`` runs to ``tol``.
    tol, max_iter, mask, a, b, backward
        See :func:`solve_sinkhorn`.

    Returns
    -------
    K : same type, dtype and device as ``scores``, shape (..., n, m)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> C = np.random.default_rng(0).normal(size=(4, 4))
    >>> K = sinkflow.sinkhorn(C)
    >>> np.allclose(K.sum(1), 1) and np.allclose(K.sum(0), 1)
    True
    >>> np.array_equal(sinkflow.sinkhorn(C, n_iter=1), sinkflow.softmax(C))
    True

    Gradients of the converged map (implicit differentiation, memory independent of the iterations):

    >>> import torch
    >>> X = torch.tensor(C, requires_grad=True)
    >>> sinkflow.sinkhorn(X, backward="implicit").square().sum().backward()
    >>> X.grad.shape
    torch.Size([4, 4])
    """
    return solve_sinkhorn(scores, n_iter, tol, max_iter, mask=mask, a=a, b=b, backward=backward,
                          _diagnostics=n_iter is None or backward == "implicit").attention
