r"""Fixed-``n_iter`` Sinkhorn attention for training: multiplicative half-steps, hand-written backward.

For the unmasked attention case the solver's stable log-domain loop is not needed after the
first half-step: the first row step is a SoftMax (the only exponential pass), and every
further half-step divides by line sums, ``P <- P diag(b / colsum P)`` or
``P <- diag(1 / rowsum P) P``, with ``b = n / m`` (rows sum to 1, columns to ``n / m``).
Only the final matrix and the line sums are kept for backward: it walks the half-steps
back, rebuilding each earlier matrix by undoing its scaling, with the adjoints

* row step ``P' = diag(1/r) P``: ``dP = (G - rowsum(G * P')) / r``;
* column step ``P' = P diag(b/c)``: ``dP = (G - colsum(G * P') / b) * (b / c)``;
* SoftMax: ``dC = P (G - rowsum(G * P))``.

Division by line sums is exact in exact arithmetic and equals the log-domain iteration to
rounding while every line sum stays well inside the floating-point range; when one does
not (a column of the SoftMax underflowing at small temperature), :func:`sinkhorn_attention`
falls back to :func:`sinkflow.sinkhorn`, whose log-domain steps handle it.
"""

from __future__ import annotations

import torch

from sinkflow.normalizations import sinkhorn


class _Underflow(Exception):
    """A line sum left the range where multiplicative steps are exact to rounding."""


def _safe(s: torch.Tensor) -> torch.Tensor:
    finfo = torch.finfo(s.dtype)
    lo = finfo.tiny ** 0.5  # 1e-19 (float32): scaling by 1/s stays finite and normal
    if not bool(((s >= lo) & (s <= finfo.max)).all()):  # one sync; NaN fails both comparisons
        raise _Underflow
    return s


class _MultiplicativeSinkhorn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, n_iter):
        P = torch.softmax(scores, -1)
        n, m = scores.shape[-2:]
        target = n / m
        sums = []
        for t in range(1, n_iter):
            if t % 2:  # column step
                c = _safe(P.sum(-2, keepdim=True))
                P.mul_(target / c)
                sums.append(c)
            else:  # row step
                r = _safe(P.sum(-1, keepdim=True))
                P.div_(r)
                sums.append(r)
        ctx.target = target
        ctx.save_for_backward(P, *sums)
        return P

    @staticmethod
    def backward(ctx, grad):
        P, *sums = ctx.saved_tensors
        b = ctx.target
        G = None  # the first half-step writes fresh buffers (never the saved P or autograd's grad)
        for t in range(len(sums), 0, -1):
            s = sums[t - 1]
            g = grad if G is None else G
            if t % 2:  # column step: P_t = P_{t-1} * (b / c)
                v = torch.linalg.vecdot(g, P, dim=-2).unsqueeze(-2) / b
                f, undo = b / s, s / b
            else:  # row step: P_t = P_{t-1} / r
                v = torch.linalg.vecdot(g, P, dim=-1).unsqueeze(-1)
                f, undo = 1 / s, s
            G = torch.sub(g, v).mul_(f) if G is None else G.sub_(v).mul_(f)
            P = P * undo if t == len(sums) else P.mul_(undo)
        return G.sub_(torch.linalg.vecdot(G, P, dim=-1).unsqueeze(-1)).mul_(P), None


def sinkhorn_attention(scores: torch.Tensor, n_iter: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``sinkflow.sinkhorn(scores, n_iter=n_iter, mask=mask)``, by the multiplicative path when it applies.

    It applies to unmasked float32/float64 scores with ``n_iter >= 2`` whose line sums stay
    in range; otherwise (masks, ``n_iter = 1``, underflow) the solver runs.
    """
    if mask is None and n_iter >= 2 and scores.dtype in (torch.float32, torch.float64):
        try:
            return _MultiplicativeSinkhorn.apply(scores, int(n_iter))
        except _Underflow:
            pass
    return sinkhorn(scores, n_iter=n_iter, mask=mask)
