r"""Fixed-``n_iter`` Sinkhorn attention in factored form, for training.

Every half-step after the first rescales the SoftMax matrix :math:`S = N_R(e^C)` by a
diagonal: after ``n_iter`` half-steps the attention is

.. math:: P = \mathrm{diag}(\alpha)\, S\, \mathrm{diag}(\beta),

with the column steps :math:`\beta = b / (S^T \alpha)` and the row steps
:math:`\alpha = 1 / (S \beta)` (rows sum to 1, columns to :math:`b = n / m`, the convention
of :func:`sinkflow.sinkhorn`). Each half-step is one matrix-vector product with ``S``; the
output :math:`P V = \alpha \odot S (\beta \odot V)` never forms ``P``, and the last row
step's sums come with that product (one matmul with one extra column). Forward: SoftMax,
then ``n_iter - 2`` products with ``S``, then the output product.

Backward keeps only ``S`` (as SoftMax attention does) and the line sums. Each half-step
contributes a rank-one term to :math:`\partial L / \partial S` and one product with ``S``
to the adjoint of the previous scaling, so

.. math:: \partial L / \partial S = [\,dY \mid x_1 \dots x_k\,]\,[\,W \mid y_1 \dots y_k\,]^T
          \;(+\ \mathrm{diag}(\alpha) (G \odot \dots) \mathrm{diag}(\beta) \text{ for the matrix}),

one matmul of inner width ``p_v + k``. The SoftMax backward needs no row correction:
:math:`P` is unchanged when a row of :math:`e^C` is rescaled, so
:math:`\sum_j S_{ij} (\partial L / \partial S)_{ij} = 0` once the SoftMax's own row
normalization is one of the terms, and :math:`\partial L / \partial C = S \odot \partial L / \partial S`.

Masks (any boolean pattern: key or query padding, causal) keep the form: ``S`` is the masked
SoftMax, and with ``n'`` admissible rows and ``m'`` admissible columns the columns of a padding
mask sum to ``n' / m'``, those of any other mask to the column sums of uniform attention under
it, as in :func:`sinkflow.sinkhorn`; a line with no admissible entry gets scaling 0.

Division by line sums equals the log-domain iteration to rounding while every admissible
line sum is well inside the floating-point range; when one is not (a column of the SoftMax
underflowing at small temperature), :func:`sinkhorn_attention` runs :func:`sinkflow.sinkhorn`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sinkflow._backend import branch_free, first_order
from sinkflow.attention._log_steps import _masked_softmax
from sinkflow.attention._marginals import is_padding, uniform_attention_marginal
from sinkflow.attention._normalizations import sinkhorn, softmax
from sinkflow.attention._solver import fixed_report


class _OutOfRange(Exception):
    """A line sum left the range where multiplicative steps are exact to rounding."""


def _in_range(sums: list[torch.Tensor], marg) -> bool:
    """Every admissible line sum in [sqrt(tiny), max] (NaN fails): one synchronization for all."""
    if marg.rows is not None:  # an empty line has sum 0 and scaling 0 by definition
        sums = [torch.where(marg.cols if i % 2 == 0 else marg.rows, s, 1.0) for i, s in enumerate(sums)]
    lo, hi = torch.stack(torch.aminmax(torch.cat([s.reshape(-1) for s in sums]))).tolist()
    finfo = torch.finfo(sums[0].dtype)
    return finfo.tiny ** 0.5 <= lo and hi <= finfo.max  # 1 / sum stays finite and normal (NaN: False)


@dataclass(frozen=True)
class _Marginals:
    """Column targets ``b`` (a number without a mask) and the admissible rows and columns (None without)."""

    b: torch.Tensor | float
    rows: torch.Tensor | None = None
    cols: torch.Tensor | None = None

    @staticmethod
    def of(mask, shape, dtype):
        n, m = shape[-2:]
        if mask is None:
            return _Marginals(n / m)
        mask = torch.broadcast_to(mask, shape)
        rows, cols = mask.any(-1), mask.any(-2)
        if not is_padding(mask, rows, cols):  # causal and other masks: the marginal of uniform attention
            ones = torch.ones((), dtype=dtype, device=mask.device)
            mass = uniform_attention_marginal(mask, ones.expand(rows.shape), ones.expand(cols.shape))
            return _Marginals(mass, rows, cols)
        ratio = rows.sum(-1, keepdim=True).to(dtype) / cols.sum(-1, keepdim=True).clamp_min(1).to(dtype)
        return _Marginals(cols * ratio, rows, cols)

    def scale(self, t, s):
        """Scaling of half-step ``t`` from its line sums: ``b / s`` (columns) or ``1 / s`` (rows); 0 on empty lines."""
        num = self.b if t % 2 else 1.0
        ok = self.cols if t % 2 else self.rows
        return num / s if ok is None else torch.where(ok, num / torch.where(ok, s, 1), 0)


def _matvec(S, x):
    return (S @ x.unsqueeze(-1)).squeeze(-1)


def _vecmat(x, S):
    return (x.unsqueeze(-2) @ S).squeeze(-2)


def _forward(S, n_iter, marg, V):
    """Half-steps 2..n_iter: line sums, row scalings ``alphas[t]`` (even t) and column scalings
    ``betas[t]`` (odd t; t = 0: ones); with values, also ``Y = S (beta V)`` (the last row sums fused in)."""
    last = n_iter - 1
    fuse = V is not None and last % 2 == 0
    sums, Y = [], None
    alphas, betas = {0: S.new_ones(S.shape[:-1])}, {0: S.new_ones(S.shape[:-2] + S.shape[-1:])}
    for t in range(1, n_iter):
        alpha, beta = alphas[max(alphas)], betas[max(betas)]
        if t % 2:  # column step
            s = S.sum(-2) if t == 1 else _vecmat(alpha, S)
        elif fuse and t == last:  # the last row step: its sums are one more column of the output product
            YR = S @ torch.cat([beta.unsqueeze(-1) * V, beta.unsqueeze(-1)], -1)
            Y, s = YR[..., :-1], YR[..., -1]
        else:  # row step
            s = _matvec(S, beta)
        (betas if t % 2 else alphas)[t] = marg.scale(t, s)
        sums.append(s)
    if V is not None and Y is None:  # the last step was a column step
        Y = S @ (betas[max(betas)].unsqueeze(-1) * V)
    return sums, alphas, betas, Y


class _FactoredSinkhorn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, values, n_iter, mask=None, stats=None):
        S = _masked_softmax(scores, mask)[0]
        marg = _Marginals.of(mask, scores.shape, scores.dtype)
        sums, alphas, betas, Y = _forward(S, n_iter, marg, values)
        if not _in_range(sums, marg):
            raise _OutOfRange
        alpha, beta = alphas[max(alphas)], betas[max(betas)]
        if stats is not None:  # asked: the marginal the last half-step left, one more product with S
            last_row = n_iter % 2 == 1
            stats["error"] = _plan_error(beta * _vecmat(alpha, S) if last_row else alpha * _matvec(S, beta),
                                         last_row, marg, S.shape[-2])
        ctx.n_iter, ctx.marg, ctx.matrix = n_iter, marg, values is None
        ctx.sums, ctx.alphas, ctx.betas = sums, alphas, betas  # intermediates (not inputs or outputs)
        if values is None:
            ctx.save_for_backward(S)
            return alpha.unsqueeze(-1) * S * beta.unsqueeze(-2)
        ctx.save_for_backward(S, values)
        ctx.Y = Y
        return alpha.unsqueeze(-1) * Y

    @staticmethod
    @first_order
    def backward(ctx, grad):
        if ctx.matrix:
            (S,) = ctx.saved_tensors
            return _matrix_backward(ctx, grad, S), None, None, None, None
        S, V = ctx.saved_tensors
        dC, dV = _output_backward(ctx, grad, S, V)
        return dC, dV, None, None, None


def _plan_error(sums, columns: bool, marg: _Marginals, n: int) -> float:
    """The solver's marginal error of a plan from its column sums (``columns``) or row sums: the L1
    deviation weighted by uniform query weights (``1 / n'`` over the ``n'`` admissible rows), the largest
    over the leading dimensions (:class:`~sinkflow.attention._solver.SolveReport`)."""
    with torch.no_grad():
        ok = marg.cols if columns else marg.rows
        e = (sums - (marg.b if columns else 1.0)).abs()
        e = e if ok is None else torch.where(ok, e, 0.0)
        count = n if marg.rows is None else marg.rows.sum(-1).clamp_min(1).to(e.dtype)
        return float((e.sum(-1) / count).amax())


def _sum_adjoint(d_scale, scale, s):
    """Adjoint of a line sum ``s`` whose scaling is ``scale = num / s`` (0 on an empty line)."""
    return -d_scale * scale / torch.where(scale != 0, s, 1)


def _reverse(S, sums, alphas, betas, t0, d_alpha, d_beta, xs, ys):
    """Walk half-steps t0..1 back: rank-one terms of dL/dS into ``xs``, ``ys``; returns d(alpha_0)."""
    for t in range(t0, 0, -1):
        s = sums[t - 1]
        if t % 2:  # beta_t = b / s,  s = S^T alpha_{t-1}
            ds = _sum_adjoint(d_beta, betas[t], s)
            xs.append(alphas[t - 1])
            ys.append(ds)
            d_alpha = d_alpha + _matvec(S, ds)
            d_beta = torch.zeros_like(d_beta)
        else:  # alpha_t = 1 / s,  s = S beta_{t-1}
            ds = _sum_adjoint(d_alpha, alphas[t], s)
            xs.append(ds)
            ys.append(betas[t - 1])
            d_beta = d_beta + _vecmat(ds, S)
            d_alpha = torch.zeros_like(d_alpha)
    return d_alpha


def _low_rank(xs, ys, d_alpha0, left=None, right=None):
    """``[left | xs | -d_alpha0] @ [right | ys | 1]^T``: dL/dS from the factors (plus the SoftMax's own row step)."""
    X = torch.stack(xs + [-d_alpha0], -1)
    Yt = torch.stack(ys + [torch.ones_like(ys[0])], -2)
    if left is not None:
        X, Yt = torch.cat([left, X], -1), torch.cat([right.transpose(-1, -2), Yt], -2)
    return X @ Yt


def _output_backward(ctx, grad, S, V):
    sums, alphas, betas, Y = ctx.sums, ctx.alphas, ctx.betas, ctx.Y
    last = ctx.n_iter - 1
    alpha, beta = alphas[max(alphas)], betas[max(betas)]
    d_alpha = torch.linalg.vecdot(grad, Y)
    dY = alpha.unsqueeze(-1) * grad
    W = beta.unsqueeze(-1) * V
    xs, ys = [], []
    if last % 2 == 0:  # fused last row step: its adjoint product rides on S^T dY
        ds = _sum_adjoint(d_alpha, alpha, sums[-1])
        xs.append(ds)
        ys.append(betas[last - 1])
        M = S.transpose(-1, -2) @ torch.cat([dY, ds.unsqueeze(-1)], -1)
        dW, d_beta = M[..., :-1], M[..., -1]
        d_alpha, t0 = torch.zeros_like(d_alpha), last - 1
    else:
        dW = S.transpose(-1, -2) @ dY
        d_beta, t0 = torch.zeros_like(beta), last
    d_beta = d_beta + torch.linalg.vecdot(dW, V)
    d_alpha0 = _reverse(S, sums, alphas, betas, t0, d_alpha, d_beta, xs, ys)
    dC = _low_rank(xs, ys, d_alpha0, dY, W).mul_(S) if ctx.needs_input_grad[0] else None
    dV = beta.unsqueeze(-1) * dW if ctx.needs_input_grad[1] else None
    return dC, dV


def _matrix_backward(ctx, grad, S):
    sums, alphas, betas = ctx.sums, ctx.alphas, ctx.betas
    alpha, beta = alphas[max(alphas)], betas[max(betas)]
    H = grad * S
    d_alpha, d_beta = _matvec(H, beta), _vecmat(alpha, H)
    xs, ys = [], []
    d_alpha0 = _reverse(S, sums, alphas, betas, ctx.n_iter - 1, d_alpha, d_beta, xs, ys)
    return _low_rank(xs, ys, d_alpha0).mul_(S).add_(H.mul_(alpha.unsqueeze(-1)).mul_(beta.unsqueeze(-2)))


def sinkhorn_attention(scores: torch.Tensor, n_iter: int, mask: torch.Tensor | None = None,
                       values: torch.Tensor | None = None, report: bool = False):
    """``sinkflow.sinkhorn(scores, n_iter=n_iter, mask=mask)``, times ``values`` when given.

    With ``report=True`` it returns ``(output, SolveReport)``: the one solver's report of a fixed count
    (:func:`~sinkflow.attention._solver.fixed_report`), whose marginal error (of the marginal the last
    half-step did not normalize, as the solver reads it) costs one more product, computed only when asked.

    The factored path runs for float32/float64 scores (any boolean mask) with ``n_iter >= 2``
    whose admissible line sums stay in range, and then never forms the matrix when
    ``values`` are given; ``n_iter = 1`` is SoftMax; otherwise (underflow, non-finite
    scores) the solver runs, and so it does under torch.compile (the range check is a
    branch on data, which would break the graph).

    A ``-inf`` score means a masked entry, torch's convention (``torch.softmax``,
    ``scaled_dot_product_attention``), for every ``n_iter`` and dtype: its SoftMax weight is 0
    in the factored path, and a line of ``-inf`` scores (whose sum 0 fails the range check)
    or any other path folds them into ``mask``, so a line of ``-inf`` scores is an empty line
    (weight 0, as a masked line), not NaN. ``+inf`` and NaN scores are refused
    (ValueError), as by the solver.
    """
    if isinstance(n_iter, bool) or int(n_iter) != n_iter or n_iter < 1:
        raise ValueError(f"n_iter must be a positive integer (Sinkhorn half-iterations), got {n_iter!r}")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = attend), got dtype {mask.dtype}")
    stats = {} if report else None
    out = _attention(scores, int(n_iter), mask, values, stats)
    return (out, fixed_report(int(n_iter), stats["error"])) if report else out


def _attention(scores, n_iter, mask, values, stats):
    """The attention of :func:`sinkhorn_attention`; the marginal error into ``stats`` (a dict) when given."""
    if n_iter > 1 and scores.dtype in (torch.float32, torch.float64) and not branch_free():  # its range check syncs
        try:  # an isolated -inf is a zero of the SoftMax, as a masked entry; a line of them fails the range check
            return _FactoredSinkhorn.apply(scores, values, n_iter, mask, stats)
        except _OutOfRange:
            pass
    scores, mask = _fold_neg_inf(scores, mask)
    P = softmax(scores, mask) if n_iter == 1 else sinkhorn(scores, n_iter=n_iter, mask=mask)
    if stats is not None:
        last_row = n_iter % 2 == 1
        Pf = P.detach().float() if P.dtype.itemsize < 4 else P.detach()  # half precision: summed in float32
        marg = _Marginals.of(mask, scores.shape, Pf.dtype)
        stats["error"] = _plan_error(Pf.sum(-2) if last_row else Pf.sum(-1), last_row, marg, P.shape[-2])
    return _times(P, values)


def _fold_neg_inf(scores, mask):
    """``-inf`` scores as masked entries: the scores with those set to 0 and the mask without them."""
    neg = torch.isneginf(scores)
    return scores.masked_fill(neg, 0.0), ~neg if mask is None else mask & ~neg


def _times(P, values):
    return P if values is None else P @ values
