r"""The Sinkhorn solves of the harmonic fields on their features (the mathematics is in ``_harmonic_fields.py``).

Everything is written on rows: weights ``W`` ``(c, n)``, moments :math:`W\Phi` ``(c, r)`` and kernel sums
:math:`(M\Lambda)\Phi^T` ``(c, n)``, as numpy arrays on the CPU (a numpy call costs a fifth of a torch
call at n = 1,024, where a step is a few dozen calls: docs/performance.md) and torch tensors elsewhere.
:class:`_Passes` runs the two products block by block; the small dense algebra of Newton's step runs
on the host (``r``-vectors).

One iteration of the symmetric solve is two passes (sums of the current point, then moments of the
next scaling); every decision (stop, Newton's Jacobian, the numerators riding along) is taken between
them, on the whole marginal error rather than a block's.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import linalg

from sinkflow.particles._harmonic_kernels import _Factored

_NEWTON_RATIO = 1e-2  # Newton's block: the modes of eigenvalue above this fraction of the largest
_NEWTON_MAX = 400  # and at most this many (its Gram matrix costs n * rows^2, or r on the circle)
_NEWTON_FAR = 1e-3  # marginal error above which the Jacobian is formed anew at every step
_ROW_BY_ROW = 2**18  # two-row products over more entries than this: one matrix-vector product per row (faster)


def _dot(A, B):
    """``A @ B`` for a short ``A``; on the CPU two rows against a large ``B`` one matrix-vector product
    each (OpenBLAS's small-``m`` gemm is up to 2x slower there: benchmarks/bench_harmonic.py)."""
    if isinstance(A, np.ndarray) and A.shape[0] == 2 and B.size > _ROW_BY_ROW:
        return np.stack([A[0] @ B, A[1] @ B])
    return A @ B


class _Passes:
    """The products of :math:`\\tilde K = \\Phi \\Lambda \\Phi^T` over the blocks of a ``_Factored``, on rows.

    Attributes: ``a`` (n,), ``lam`` (r,), ``X1`` ``(1 + d, n)`` (ones, then the coordinates: the
    weights of the sums and numerators of the field), ``xp`` (numpy or torch); all on the CPU as numpy.
    """

    def __init__(self, F: _Factored, a: torch.Tensor):
        self.factored, self.cpu = F, F.X.device.type == "cpu"
        self.xp = np if self.cpu else torch
        self.a, self.lam = self.array(a), self.array(F.lam[:, 0])
        X = self.array(F.X)
        self.X1 = self.xp.concatenate([self.xp.ones_like(X[:, 0])[None], X.T])
        self.stored = None if F.stored is None else [self.array(f) for f in F.stored]

    def array(self, t: torch.Tensor):
        """A float64 tensor as this object's array (numpy on the CPU, shared memory)."""
        return t.numpy() if self.cpu else t

    def host(self, M) -> np.ndarray:
        return M if self.cpu else M.cpu().numpy()

    def device(self, M: np.ndarray):
        return M if self.cpu else torch.as_tensor(M, device=self.factored.X.device)

    def _blocks(self):
        for b, (i0, i1) in enumerate(self.factored.blocks):
            F = self.stored[b] if self.stored is not None else self.array(self.factored._features(b, i0, i1))
            yield i0, i1, F

    def moments(self, W):
        """:math:`W \\Phi`, ``(c, r)``, for weights ``W`` ``(c, n)``."""
        out = 0
        for i0, i1, F in self._blocks():
            out = out + _dot(W[:, i0:i1], F.T)
        return out

    def sums(self, M):
        """:math:`(M \\Lambda) \\Phi^T`, ``(c, n)``: the kernel applied to the weights of moments ``M``."""
        LM = M * self.lam
        parts = [_dot(LM, F) for _, _, F in self._blocks()]
        return parts[0] if len(parts) == 1 else self.xp.concatenate(parts, 1)

    def gram(self, rows: np.ndarray, s) -> np.ndarray:
        """:math:`\\Phi_R^T \\mathrm{diag}(s) \\Phi_R` over the feature rows ``R`` (host)."""
        G = 0
        for i0, i1, F in self._blocks():
            FR = F[self.device(rows)]
            G = G + FR * s[i0:i1] @ FR.T
        return self.host(G)

    def field(self, s):
        """Row-normalized field of the kernel with column scaling ``s``: velocity ``(d, n)`` and row sums."""
        S = self.sums(self.moments(self.a * s * self.X1))
        return S[1:] / S[0], S[0]

    def apply(self, s):
        """:math:`\\tilde K (a s)`."""
        return self.sums(self.moments((self.a * s)[None]))[0]

    def column_error(self, row_sums, s) -> float:
        """:math:`\\sum_j |\\sum_i a_i K_{ij} - a_j|` for rows normalized, :math:`K_{ij} = \\tilde K_{ij} a_j s_j / r_i`."""
        return float(abs(self.a * s * self.apply(1 / row_sums) - self.a).sum())


class _Newton:
    """Newton's correction on the leading modes ``rows`` of the moment map (``_harmonic_fields.py``).

    On the circle the Gram matrix of products :math:`\\cos j\\theta \\cos k\\theta = \\frac12(\\cos(j-k)\\theta
    + \\cos(j+k)\\theta)` (and the like) comes from the moments of ``a u^2`` up to order ``2 max(rows)``:
    one more row in the moments pass instead of ``n |R|^2`` products (``from_moments``).
    """

    def __init__(self, P: _Passes):
        lam = P.host(P.lam)
        kernel = P.factored.kernel
        candidates = np.arange(lam.size)
        if kernel.d == 2:  # the row of sin 0 is zero
            candidates = candidates[candidates != kernel.order + 1]
        order = candidates[np.argsort(-lam[candidates], kind="stable")]
        count = min(_NEWTON_MAX, int((lam[order] > _NEWTON_RATIO * lam[order[0]]).sum()))
        self.rows = np.sort(order[:count])
        self.lam = lam[self.rows]
        self.rate = float(lam[order[count]] / lam[order[0]]) if count < order.size else 0.0  # the plain modes'
        self.lu, self.K = None, kernel.order
        if kernel.d == 2:
            self.m = np.where(self.rows <= self.K, self.rows, self.rows - self.K - 1)
            self.sine = self.rows > self.K
        self.from_moments = kernel.d == 2 and 2 * int(self.m.max()) <= self.K

    def factor(self, P: _Passes, s, moments_of_s=None) -> None:
        """Factor :math:`I + G_{RR}\\Lambda_R` at :math:`G = \\Phi^T \\mathrm{diag}(s) \\Phi` (``moments_of_s``:
        :math:`s\\Phi`, on the host, when ``from_moments``)."""
        G = self._circle_gram(moments_of_s) if self.from_moments else P.gram(self.rows, s)
        self.lu = linalg.lu_factor(np.eye(self.rows.size) + G * self.lam, check_finite=False)

    def _circle_gram(self, moments: np.ndarray) -> np.ndarray:
        C, S = moments[:self.K + 1], moments[self.K + 1:]
        m, sine = self.m, self.sine
        plus, minus = m[:, None] + m[None, :], m[:, None] - m[None, :]
        c_minus, c_plus, s_plus = C[np.abs(minus)], C[plus], S[plus]
        s_minus = np.sign(minus) * S[np.abs(minus)]  # sin((j - k) theta), signed
        both_cos, both_sin = ~sine[:, None] & ~sine[None, :], sine[:, None] & sine[None, :]
        G = np.where(both_cos, c_minus + c_plus, 0.0) + np.where(both_sin, c_minus - c_plus, 0.0)
        G += np.where(~sine[:, None] & sine[None, :], s_plus - s_minus, 0.0)  # cos j sin k
        G += np.where(sine[:, None] & ~sine[None, :], s_plus + s_minus, 0.0)  # sin j cos k
        return 0.5 * G

    def correction(self, f: np.ndarray) -> np.ndarray:
        """:math:`t`: :math:`t_R = (I + G_{RR}\\Lambda_R)^{-1} f_R - f_R`, 0 elsewhere."""
        t = np.zeros_like(f)
        t[self.rows] = linalg.lu_solve(self.lu, f[self.rows], check_finite=False) - f[self.rows]
        return t


def symmetric_sinkhorn(P: _Passes, u, tol: float, max_iter: int, memory: dict | None = None):
    """The symmetric scaling :math:`u_i (\\tilde K a u)_i = 1` by the moment map with Newton's correction.

    Iteration ``j``: the sums of the current scaling ``u`` (its marginal error; the field's numerators
    when its moments carry them) and of the next point ``x = M + t`` (one pass), then the moments of
    ``u_next = 1 / (Phi Lambda x)`` (one pass), with ``a u_next^2`` for the circle's Gram matrix when
    the Jacobian is formed anew, and ``a u_next x`` (the numerators) when ``u_next`` is predicted to
    converge: by ``memory["sweeps"]`` (those of the previous solve in a flow, written back) or by the
    plain modes' rate after a Newton step. Else one more application computes the numerators for the converged ``u``.
    The start is first scaled to :math:`(a u)^T \\tilde K (a u) = 1` (which the fixed point satisfies):
    the scaling mode, which the plain step does not contract, is then right from the start.

    Returns ``(velocity (d, n), row sums (n,), u, kernel applications, converged, marginal error)``.
    """
    xp, a, newton = P.xp, P.a, _Newton(P)
    memory = {} if memory is None else memory
    expect = memory.get("sweeps")
    M = P.moments((a * u)[None])
    scale = 1 / math.sqrt(float((M[0] * P.lam * M[0]).sum()))
    u, M = u * scale, M * scale
    t, done, err, previous = None, 0, math.inf, math.inf
    while done < max_iter:
        done += 1
        S = P.sums(M if t is None else xp.concatenate([M, M[:1] + P.device(t)]))
        E = S[0]
        err = float((a * abs(u * E - 1)).sum()); print("   err", done, err, M.shape[0]) if __import__("os").environ.get("H28DBG") else None
        if err <= tol or not math.isfinite(err) or done == max_iter:
            break
        if t is not None and not bool((S[-1] > 0).all()):  # the corrected point went too far: the plain step
            t, newton.lu = None, None
        u_next = 1 / (E if t is None else S[-1])
        refresh = newton.lu is None or err > _NEWTON_FAR or err > 0.1 * previous  # far, or the last step gained < 10x
        carry = (expect is not None and done + 1 >= expect) or (t is not None and err * newton.rate <= tol)
        W = a * u_next * P.X1 if carry else (a * u_next)[None]
        gram_row = refresh and newton.from_moments
        Mn = P.moments(xp.concatenate([W, (a * u_next * u_next)[None]]) if gram_row else W)
        f = P.host(Mn[0] - M[0]) - (0 if t is None else t)  # H(x) - x
        if refresh:
            newton.factor(P, a * u_next * u_next, P.host(Mn[-1]) if gram_row else None)
        previous = math.inf if refresh else err  # a new Jacobian: no verdict on the last step
        t = newton.correction(f)
        u, M = u_next, Mn[:W.shape[0]]
    if err <= tol:
        memory["sweeps"] = done
    if M.shape[0] > 1:  # the numerators rode along
        return S[1:M.shape[0]] / E, E, u, done, err <= tol, err
    velocity = P.sums(P.moments(a * u * P.X1[1:])) / E
    return velocity, E, u, done + 1, err <= tol, err


def alternating_sinkhorn(P: _Passes, gamma, n_iter: int, need_errors: bool):
    """``n_iter`` half-iterations, row step first from the column scaling ``gamma``:
    :math:`K = \\mathrm{diag}(\\alpha) \\tilde K \\mathrm{diag}(a \\gamma)`, :math:`\\alpha = 1/\\tilde K(a\\gamma)`,
    :math:`\\gamma = 1/\\tilde K(a\\alpha)`. Returns ``(velocity (d, n), gamma, row error, column error)``."""
    alpha = None
    for step in range(1, n_iter):  # all but the last half-step
        if step % 2:
            alpha = 1 / P.apply(gamma)
        else:
            gamma = 1 / P.apply(alpha)
    if n_iter % 2:  # the last step normalizes the rows: fused with the velocity
        velocity, sums = P.field(gamma)
        return velocity, gamma, 0.0 if need_errors else math.nan, P.column_error(sums, gamma) if need_errors else math.nan
    gamma = 1 / P.apply(alpha)  # ended on a column step: K applied as it is
    velocity, sums = P.field(gamma)
    row_sums = alpha * sums
    row = float((P.a * abs(row_sums - 1)).sum()) if need_errors else math.nan
    col = P.column_error(1 / alpha, gamma) if need_errors else math.nan
    return velocity * row_sums, gamma, row, col
