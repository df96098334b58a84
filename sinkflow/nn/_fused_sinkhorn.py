r"""Sinkhorn(``n_iter``) attention in the log domain from fused flash passes, O(n (p + n_iter)) saved per head.

The plan after ``N = n_iter`` half-steps is :math:`P_{ij} = \exp(C_{ij} + M_{ij} + F_i + G_j)`
(:math:`C = q k^T / \sqrt p`, :math:`M` the mask): row steps
:math:`f_t = -\mathrm{LSE}_j(C_{ij} + M_{ij} + g_{t-1,j})`, column steps
:math:`g_t = \log b - \mathrm{LSE}_i(C_{ij} + M_{ij} + f_{t-1,i})`, :math:`g_0 = 0`; the
potentials :math:`F, G` are the last of each. Every step is one flash pass (its log-sum-exp;
a column step runs the kernel with ``q`` and ``k`` swapped). Each step's own matrix is the
plan modulated by a rank-one factor,

.. math:: P^{(t)}_{ij} = e^{C_{ij} + M_{ij} + r^t_i + c^t_j} = P_{ij}\, e^{r^t_i - F_i}\, e^{c^t_j - G_j},

with :math:`(r^t, c^t) = (f_t, g_{t-1})` for a row step and :math:`(f_{t-1}, g_t - \log b)`
for a column step.

Forward: for odd ``N`` the last row step is the output pass's own normalization
(:math:`P = \mathrm{softmax}_j(C + M + G)`, so :math:`Y = PV` is one SDPA-shaped pass with
key bias :math:`G` and :math:`F = -\mathrm{LSE}`): ``N`` passes; for even ``N``,
:math:`Y = e^{F + L} \odot \mathrm{softmax}_j(C + M + G) V`: ``N + 1`` passes.

Backward (:class:`_SinkhornPasses`): the adjoints of the potentials run back through the
steps; a step's adjoint :math:`\gamma` (:math:`-\partial L/\partial f_t` or
:math:`-\partial L/\partial g_t`) gives :math:`\partial C \mathrel{+}= \gamma \odot P^{(t)}` and,
to the potential it was computed from, a line sum of :math:`\gamma \odot P^{(t)}`: one forward
flash pass each (``N - 1`` for odd ``N``, with the output's :math:`P^T [dY, \gamma_N]`;
``N`` for even). Then all of :math:`\partial C` is the plan times a low-rank matrix,

.. math:: \partial C = P \odot \big([\,dY \mid u_1 \dots u_r\,]\,[\,V \mid w_1 \dots w_r\,]^T - D 1^T\big),

(the step factors above, :math:`D = dY \odot Y` summed for odd ``N``, else 0): ONE flash
backward of head width :math:`p + r` gives ``dq``, ``dk`` and ``dv``. The factors
:math:`e^{r^t - F}` grow where a column of the SoftMax all but vanishes (small temperature);
past :data:`FACTOR_LOG_LIMIT` the kernel's rounding of the plan's exponent would be
amplified, and the backward takes the chain of per-step flash backwards instead
(:func:`_sinkhorn_chain`, autograd through :class:`_LogSumExp`; also the tests' oracle).

Cold scores: both backwards round the potentials to :math:`\varepsilon |C|` in the exponent
and their steps' terms cancel, so their error grows with the scores' spread (float32, spread
600: 1e-3 relative, 450x the eager path's). Past :data:`SCORE_RANGE_LIMIT` (a bound on the
spread from the norms of ``q`` and ``k``) the fused pass declines the backward: it recomputes
the eager path's gradients (:func:`sinkflow.nn._factored_sinkhorn.sinkhorn_attention` on the
score matrix, O(n m) memory during that backward only). The forward is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sinkflow._backend import first_order
from sinkflow.attention._marginals import is_padding, uniform_attention_marginal
from sinkflow.attention._solver import fixed_report
from sinkflow.nn._factored_sinkhorn import sinkhorn_attention
from sinkflow.nn._flash import CPU_FLASH, CPU_FLASH_BACKWARD, ExpAttention, as4d, bias_mask, one_width

__all__ = ["FACTOR_LOG_LIMIT", "SCORE_RANGE_LIMIT", "sinkhorn_passes"]

# Largest spread of the scores (a bound, see _score_range) for which the fused backward is accurate:
# its potentials are rounded to eps |C| in the exponent and the steps' terms cancel, so its relative
# error grows with the spread. float32 on 1 x 2 x 12 x 12, p = 8, n_iter 2-5, 6 seeds, against a
# float64 oracle: within 10x of the eager path's below a spread of 400 (4e-7 to 7e-5), up to 450x
# (1e-3) near 600, 2,900x near 1,200. Past it the backward recomputes the eager path's gradients.
SCORE_RANGE_LIMIT = {torch.float32: 300.0, torch.float64: 300.0 * 2.0 ** 29}

# Largest log-factor of the combined backward (float32: e^30 ~ 1e13, the plan's exponent rounded
# to eps |x| ~ 2e-6 relative); past it the per-step chain runs.
FACTOR_LOG_LIMIT = {torch.float32: 30.0, torch.float64: 300.0}


@dataclass(frozen=True)
class _Lines:
    """Admissible rows ``(B, H, n)`` and columns ``(B, H, m)`` (None: all), the float masks of the
    row and column passes (None: padding only), and the column mass ``log b`` (``(B, H, 1)``
    for padding, ``(B, H, m)`` for other masks: uniform attention's column sums)."""

    rows: torch.Tensor | None
    cols: torch.Tensor | None
    row_mask: torch.Tensor | None
    col_mask: torch.Tensor | None
    log_b: torch.Tensor

    def potential(self, L, rows: bool, shift=None):
        """``shift - L`` on admissible lines, ``-inf`` on empty ones."""
        x = -L if shift is None else shift - L
        ok = self.rows if rows else self.cols
        return x if ok is None else torch.where(ok, x, -math.inf)

    def start(self, k):
        """``g_0``: 0 on admissible columns."""
        g = k.new_zeros(k.shape[:-1])
        return g if self.cols is None else g.masked_fill(~self.cols, -math.inf)


def _line_masks(allowed, bias, batch, n, m, dtype):
    """Admissible rows and columns, the float masks of the row and column passes (None when
    the mask is key/query padding only: -inf biases on the lines then do it) and the column
    masses of uniform attention under any other mask (else None). ``-inf`` in ``bias`` counts
    as masked."""
    if allowed is None and bias is None:
        return None, None, None, None, None
    full = torch.ones((), dtype=torch.bool, device=(allowed if bias is None else bias).device)
    full = full if allowed is None else full & allowed
    full = torch.broadcast_to(full if bias is None else full & (bias > -math.inf), batch + (n, m))
    rows, cols = full.any(-1), full.any(-2)
    line_mask = allowed is not None and (allowed.dim() < 2 or 1 in allowed.shape[-2:])  # padding: rows x cols
    padding = line_mask or is_padding(full, rows, cols)
    if bias is None and padding:
        return rows, cols, None, None, None
    drop = torch.zeros((), dtype=dtype, device=full.device) if bias is None else bias.to(dtype)
    drop = torch.broadcast_to(drop, batch + (n, m)).masked_fill(~full, -math.inf)
    ones = torch.ones((), dtype=dtype, device=full.device)
    mass = None if padding else uniform_attention_marginal(full, ones.expand(rows.shape), ones.expand(cols.shape))
    return rows, cols, as4d(drop), as4d(drop.transpose(-1, -2)), mass


def _lines(allowed, bias, batch, n, m, dtype, device) -> _Lines:
    rows, cols, row_mask, col_mask, mass = _line_masks(allowed, bias, batch, n, m, dtype)
    if rows is None:
        return _Lines(None, None, None, None, torch.full((1, 1, 1), math.log(n / m), dtype=dtype, device=device))
    rows, cols = as4d(rows.unsqueeze(-1)).squeeze(-1), as4d(cols.unsqueeze(-1)).squeeze(-1)
    if mass is not None:  # causal and other masks: the column sums of uniform attention (log 0 = -inf on empty columns)
        return _Lines(rows, cols, row_mask, col_mask, torch.log(as4d(mass.unsqueeze(-1)).squeeze(-1)))
    ratio = rows.sum(-1, keepdim=True).to(dtype) / cols.sum(-1, keepdim=True).clamp_min(1).to(dtype)
    return _Lines(rows, cols, row_mask, col_mask, torch.log(ratio))


def _lse(a, b, mask, key_pot, scale):
    """``L_i = log sum_j exp(scale a_i.b_j + mask_ij + key_pot_j)``: one flash pass (its output unused)."""
    return CPU_FLASH(a, b, b, attn_mask=bias_mask(key_pot, mask), scale=scale)[1]


def _line_sums(a, b, mask, key_pot, out_pot, x, scale):
    """``u_i = sum_j exp(scale a_i.b_j + mask_ij + key_pot_j + out_pot_i) x_j``: one flash pass (x: (B, H, m, w))."""
    a, b, xw = one_width(a, b, x)
    out, lse = CPU_FLASH(a, b, xw, attn_mask=bias_mask(key_pot, mask), scale=scale)[:2]
    return torch.exp(out_pot + lse).unsqueeze(-1) * out[..., :x.shape[-1]]


def _forward(q, k, v, n_iter, ln, scale):
    """Output and the steps' ``(r^t, c^t)``; the plan's potentials ``F, G``."""
    g, f, steps = ln.start(k), None, []
    for t in range(1, n_iter + 1 - n_iter % 2):  # odd n_iter: the output pass makes the last row step
        if t % 2:
            f = ln.potential(_lse(q, k, ln.row_mask, g, scale), rows=True)
            steps.append((f, g))
        else:
            L = _lse(k, q, ln.col_mask, f, scale)
            g = ln.potential(L, rows=False, shift=ln.log_b)
            steps.append((f, ln.potential(L, rows=False)))
    out, L = CPU_FLASH(q, k, v, attn_mask=bias_mask(g, ln.row_mask), scale=scale)[:2]
    if n_iter % 2:
        f = ln.potential(L, rows=True)
        steps.append((f, g))
        y = out if ln.rows is None else out * ln.rows.unsqueeze(-1)  # a padded query's row pass is not masked
    else:
        y = torch.exp(f + L).unsqueeze(-1) * out  # f = -inf on empty rows
    return y, steps, f, g


def _log_factor(pot, base, ok):
    """``pot - base`` on admissible lines, ``-inf`` elsewhere (both are ``-inf`` there)."""
    d = pot - base
    return d if ok is None else torch.where(ok, d, -math.inf)


class _SinkhornPasses(torch.autograd.Function):
    """``P V`` for the Sinkhorn(n_iter) plan of ``scale q k^T + M`` on 4-D tensors of one width (CPU)."""

    @staticmethod
    def forward(ctx, q, k, v, n_iter, ln, scale, stats=None):
        y, steps, F, G = _forward(q, k, v, n_iter, ln, scale)
        if stats is not None:
            stats["potentials"] = (F, G)
        ctx.n_iter, ctx.ln, ctx.scale = n_iter, ln, scale
        ctx.save_for_backward(q, k, v, y, F, G, *(p for step in steps for p in step))
        return y

    @staticmethod
    @first_order
    def backward(ctx, dy):
        q, k, v, y, F, G, *pots = ctx.saved_tensors
        if not float(_score_range(q, k, ctx.ln, ctx.scale)) <= SCORE_RANGE_LIMIT[q.dtype]:  # one sync; NaN too
            dq, dk, dv = _eager_backward(ctx, dy, q, k, v)
            return dq, dk, dv, None, None, None, None
        # dy of a sum is expanded (stride 0): the kernels misread it
        steps = list(zip(pots[::2], pots[1::2], strict=True))
        dq, dk, dv = _combined_backward(ctx, dy.contiguous(), q, k, v, y, F, G, steps)
        return dq, dk, dv, None, None, None, None


def _score_range(q, k, ln, scale):
    """A bound on the spread of the scores ``scale q_i.k_j`` (plus the finite float mask): O(n p), no matrix."""
    top = scale * q.norm(dim=-1).amax(-1) * k.norm(dim=-1).amax(-1)
    spread = 2.0 * top.amax()
    if ln.row_mask is not None:
        finite = ln.row_mask[torch.isfinite(ln.row_mask)]
        spread = spread + (finite.amax() - finite.amin() if finite.numel() else 0.0)
    return spread


def _eager_backward(ctx, dy, q, k, v):
    """The gradients of the eager path (the matrix of scores, multiplicative steps), recomputed."""
    ln = ctx.ln
    mask = None if ln.rows is None else ln.rows.unsqueeze(-1) & ln.cols.unsqueeze(-2)
    with torch.enable_grad():
        inputs = [t.detach().requires_grad_() for t in (q, k, v)]
        scores = (inputs[0] * ctx.scale) @ inputs[1].transpose(-1, -2)
        if ln.row_mask is not None:
            mask = mask & torch.isfinite(ln.row_mask)
            scores = scores + ln.row_mask.masked_fill(~mask, 0.0)
        y = sinkhorn_attention(scores, ctx.n_iter, mask, values=inputs[2])
        return torch.autograd.grad(y, inputs, dy)


def _reverse(ctx, dy, q, k, v, y, F, G, steps):
    """The steps' adjoints ``gamma`` back to step 1 (``{t: gamma}``; odd N: step N's term is the plan's ``D``)."""
    ln, scale, n_iter = ctx.ln, ctx.scale, ctx.n_iter

    def col_sums(pots, x):
        return _line_sums(k, q, ln.col_mask, pots[0], pots[1], x, scale)

    def row_sums(pots, x):
        return _line_sums(q, k, ln.row_mask, pots[1], pots[0], x, scale)

    dF = torch.linalg.vecdot(dy, y)
    if n_iter % 2:  # step N's matrix is the plan: its line sum rides on the output's P^T dY
        u = col_sums((F, G), torch.cat([dy, -dF.unsqueeze(-1)], -1))
        df, dg = None, torch.linalg.vecdot(v, u[..., :-1]) + u[..., -1]
    else:
        df, dg = dF, torch.linalg.vecdot(v, col_sums((F, G), dy))
    gammas = {}
    for t in range(n_iter - n_iter % 2, 0, -1):
        if t % 2:  # row step: f_t = -L_t(g_{t-1})
            gammas[t], df = -df, None
            dg = col_sums(steps[t - 1], gammas[t].unsqueeze(-1))[..., 0] if t > 1 else None
        else:  # column step: g_t = log b - L_t(f_{t-1})
            gammas[t], dg = -dg, None
            s = row_sums(steps[t - 1], gammas[t].unsqueeze(-1))[..., 0]
            df = s if df is None else df + s
    return gammas


def _combined_backward(ctx, dy, q, k, v, y, F, G, steps):
    """dq, dk, dv from one flash backward over the plan, the steps' terms as extra head columns."""
    ln, n_iter = ctx.ln, ctx.n_iter
    gammas = _reverse(ctx, dy, q, k, v, y, F, G, steps)
    left, right, top = [], [], F.new_zeros(())
    for t, gamma in gammas.items():
        r, c = _log_factor(steps[t - 1][0], F, ln.rows), _log_factor(steps[t - 1][1], G, ln.cols)
        top = torch.maximum(top, r.amax() + c.amax())
        left.append(torch.exp(r) * gamma if t % 2 else torch.exp(r))
        right.append(torch.exp(c) if t % 2 else torch.exp(c) * gamma)
    if not float(top) <= FACTOR_LOG_LIMIT[q.dtype]:  # one host sync; NaN too
        return _chain_backward(ctx, dy, q, k, v)
    width, extra = q.shape[-1], len(left)
    d_out = torch.cat([dy, torch.stack(left, -1)], -1)
    values = torch.cat([v, torch.stack(right, -1)], -1)
    out = one_width(y if n_iter % 2 else torch.zeros_like(y), width=width + extra)[0]  # D = dY.Y: step N's term
    qw, kw = one_width(q, k, width=width + extra)
    dq, dk, dv = CPU_FLASH_BACKWARD(d_out, qw, kw, values, out, (-F).contiguous(), 0.0, False,
                                    attn_mask=bias_mask(G, ln.row_mask), scale=ctx.scale)
    return dq[..., :width], dk[..., :width], dv[..., :width]


def _chain_backward(ctx, dy, q, k, v):
    """The gradients through the chain of per-step passes (autograd), recomputed."""
    with torch.enable_grad():
        inputs = [t.detach().requires_grad_() for t in (q, k, v)]
        y = _sinkhorn_chain(*inputs, ctx.n_iter, ctx.ln, ctx.scale)
        return torch.autograd.grad(y, inputs, dy)


class _LogSumExp(torch.autograd.Function):
    r"""``L_i = logsumexp_j(scale q_i.k_j + mask_ij + g_j)`` on 4-D (B, H, n, p) tensors (CPU), one flash pass.

    Backward: with values ``e_1`` and output gradient ``gamma e_1`` (and a zero output) the
    flash backward gives :math:`\partial C_{ij} = \gamma_i P_{ij}`, its ``dq``, ``dk``, and
    :math:`\partial g_j = \sum_i \gamma_i P_{ij}` as the first column of ``dv``.
    """

    @staticmethod
    def forward(ctx, q, k, g, mask, scale):
        attn = bias_mask(g, mask)
        lse = CPU_FLASH(q, k, k, attn_mask=attn, scale=scale)[1]
        ctx.scale = scale
        ctx.save_for_backward(q, k, attn, lse)
        return lse

    @staticmethod
    @first_order
    def backward(ctx, gamma):
        q, k, attn, lse = ctx.saved_tensors
        e1 = torch.zeros_like(k)
        e1[..., 0] = 1
        g = torch.zeros_like(q)
        g[..., 0] = gamma
        dq, dk, dv = CPU_FLASH_BACKWARD(g, q, k, e1, torch.zeros_like(q), lse, 0.0, False,
                                        attn_mask=attn, scale=ctx.scale)
        return dq, dk, dv[..., 0], None, None


def _sinkhorn_chain(q, k, v, n_iter, ln, scale, stats=None):
    """``P V`` as ``n_iter`` log-sum-exp passes and the output pass, each its own autograd node (the plan's
    potentials into ``stats`` when given: after an odd count ``f`` is the output pass's)."""
    g, f = ln.start(k), None
    for t in range(n_iter):
        if t % 2 == 0:
            f = ln.potential(_LogSumExp.apply(q, k, g, ln.row_mask, scale), rows=True)
        else:
            g = ln.potential(_LogSumExp.apply(k, q, f, ln.col_mask, scale), rows=False, shift=ln.log_b)
    if stats is not None:
        stats["potentials"] = (f, g)
    return ExpAttention.apply(q, k, v, f, g, ln.row_mask, scale)


def sinkhorn_passes(q, k, v, n_iter, allowed=None, bias=None, chain=False, report=False):
    r"""Sinkhorn(``n_iter``) attention :math:`P V` of ``(..., n, p)`` tensors (CPU) from flash passes.

    With ``report=True`` it returns ``(P V, SolveReport)``: the one solver's report of a fixed count
    (:func:`~sinkflow.attention._solver.fixed_report`), whose marginal error (of the marginal the last
    half-step did not normalize) costs one more log-sum-exp pass, computed only when asked.

    ``chain=True`` runs the per-step chain (its own backward for each pass) instead of the
    combined backward: the reference of the tests. Scores spread past
    :data:`SCORE_RANGE_LIMIT` (float32: 300) take the eager path's backward instead (see
    the module docstring): the fused backward would lose up to three digits there.

    Examples
    --------
    >>> import torch, sinkflow
    >>> from sinkflow.nn._fused_sinkhorn import sinkhorn_passes
    >>> q, k, v = torch.randn(3, 2, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> P = sinkflow.sinkhorn(q @ k.transpose(-1, -2) / 2, n_iter=3)
    >>> bool(torch.allclose(sinkhorn_passes(q, k, v, 3), P @ v))
    True
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    batch, n, m, p_v = q.shape[:-2], q.shape[-2], k.shape[-2], v.shape[-1]
    ln = _lines(allowed, bias, batch, n, m, q.dtype, q.device)
    q, k, v = (as4d(t) for t in one_width(q, k, v))
    stats = {} if report else None
    y = (_sinkhorn_chain(q, k, v, n_iter, ln, scale, stats) if chain
         else _SinkhornPasses.apply(q, k, v, int(n_iter), ln, scale, stats))
    y = y.reshape(*batch, *y.shape[-2:])[..., :p_v]
    return (y, fixed_report(int(n_iter), _passes_error(q, k, n_iter, ln, scale, *stats["potentials"]))) if report else y


def _passes_error(q, k, n_iter, ln, scale, f, g) -> float:
    """The solver's marginal error of the plan ``exp(scale q k^T + M + f_i + g_j)`` after ``n_iter`` half-steps:
    its columns against ``b`` after a row step, else its rows against 1 (one flash pass), the L1 deviation
    weighted by uniform query weights over the admissible rows, the largest over the leading dimensions."""
    with torch.no_grad():
        f, g = f.detach(), g.detach()
        if n_iter % 2:  # ended on a row step: the columns
            e, ok = (torch.exp(_lse(k, q, ln.col_mask, f, scale) + g) - torch.exp(ln.log_b)).abs(), ln.cols
        else:
            e, ok = (torch.exp(_lse(q, k, ln.row_mask, g, scale) + f) - 1.0).abs(), ln.rows
        e = e if ok is None else torch.where(ok, e, 0.0)
        count = q.shape[-2] if ln.rows is None else ln.rows.sum(-1).clamp_min(1).to(e.dtype)
        return float((e.sum(-1) / count).amax())
