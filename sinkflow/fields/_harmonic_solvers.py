r"""The Sinkhorn solves of the harmonic fields on their features (the mathematics is in ``_harmonic_fields.py``).

Everything is written on rows: weights ``W`` ``(c, n)``, moments :math:`W\Phi` ``(c, r)`` and kernel sums
:math:`(M\Lambda)\Phi^T` ``(c, n)``, as numpy arrays on the CPU (a numpy call costs a third to a fifth of
a torch call: 1.2-1.6x on a Sinkhorn ``simulate`` on the circle at N = 2*10^4, ``benchmarks/bench_tricks.py``)
and torch tensors elsewhere, or with the speed tricks off (:func:`sinkflow.fast_paths`). :class:`_Passes`
runs the two products block by block; the small dense algebra of Newton's step runs on the host (``r``-vectors).

One iteration of the symmetric solve is one sweep by cache-sized block: the sums of the current
points, then, with the block's features still in cache, the moments of the next scaling. The
decisions (stop, Newton's Jacobian, the numerators riding along) are taken between sweeps, on the
whole marginal error rather than a block's.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from scipy.linalg import blas

from sinkflow._backend import fast_paths_enabled
from sinkflow.attention._solver import SolveReport, sinkhorn_solve
from sinkflow.fields._harmonic_kernels import _STORE_BYTES, _Factored

_NEWTON_RATIO = 1e-3  # Newton's block: the modes of eigenvalue above this fraction of the largest
_NEWTON_MAX = 400  # and at most this many (its Gram matrix costs n * rows^2, or r on the circle)
_NEWTON_FAR = 1e-3  # marginal error above which the Jacobian is formed anew at every step
_CACHE_BYTES = 2**20  # the products run on blocks of features this large: a sweep's second product finds them in a
# core's cache, and OpenBLAS's gemm with 3-6 rows runs up to 2x faster on them than on 4 MiB blocks


class _Passes:
    """The products of :math:`\\tilde K = \\Phi \\Lambda \\Phi^T` over the blocks of a ``_Factored``, on rows.

    Attributes: ``a`` (n,), ``lam`` (r,), ``X1`` ``(1 + d, n)`` (ones, then the coordinates: the
    weights of the sums and numerators of the field), ``xp`` (numpy or torch); all on the CPU as numpy.
    """

    def __init__(self, F: _Factored, a: torch.Tensor, keep: bool = True):
        self.factored, self.numpy = F, F.X.device.type == "cpu" and fast_paths_enabled()  # off: torch's ops
        self.xp = np if self.numpy else torch
        self.a, self.lam = self.array(a), self.array(F.lam[:, 0])
        X = self.array(F.X)
        self.X1 = self.xp.concatenate([self.xp.ones_like(X[:, 0])[None], X.T])
        self._keep(F, keep)

    def _keep(self, F: _Factored, keep: bool) -> None:
        rank, rows = F.kernel.rank, max(i1 - i0 for i0, i1 in F.blocks)
        if keep and 8 * F.X.shape[0] * rank <= _STORE_BYTES:  # the harmonics, formed once for all the passes
            self.stored = [self.array(F.harmonics(b, i0, i1, F.X.new_empty((rank, i1 - i0))))
                           for b, (i0, i1) in enumerate(F.blocks)]
        else:  # formed block by block at each pass, into one reused buffer
            self.stored, self.buffer = None, F.X.new_empty(rank * rows)

    def array(self, t: torch.Tensor):
        """A float64 tensor as this object's array (numpy on the CPU, shared memory)."""
        return t.numpy() if self.numpy else t

    def host(self, M) -> np.ndarray:
        return M if self.numpy else M.cpu().numpy()

    def device(self, M: np.ndarray):
        return M if self.numpy else torch.as_tensor(M, device=self.factored.X.device)

    def _blocks(self, nbytes: int = _CACHE_BYTES):
        """``(i0, i1, features)`` by block (the feature blocks cut into ``nbytes`` pieces)."""
        for b, (i0, i1) in enumerate(self.factored.blocks):
            F = self.stored[b] if self.stored is not None else self.array(
                self.factored.harmonics(b, i0, i1,
                                        self.buffer[:self.factored.kernel.rank * (i1 - i0)].view(-1, i1 - i0)))
            width = max(1, nbytes // (8 * F.shape[0]))
            for j0 in range(0, i1 - i0, width):
                j1 = min(i1 - i0, j0 + width)
                yield i0 + j0, i0 + j1, F[:, j0:j1]

    def carried(self, w, i0: int = 0, i1: int | None = None):
        """The weights whose moments carry the field's numerators, for weights ``w`` of particles ``i0:i1``:
        ``w [1, x]`` (on :math:`S^2`: ``w`` alone, their moments from those of ``w`` one degree higher)."""
        return w * self.X1[:, i0:i1]

    def moments(self, W, carried: bool = False):
        """:math:`W \\Phi`, ``(c, r)``, for weights ``W`` ``(c, n)`` (``carried``: :meth:`carried` weights)."""
        out = 0
        for i0, i1, F in self._blocks():
            out = out + W[:, i0:i1] @ F.T
        return out

    def sums(self, M):
        """:math:`(M \\Lambda) \\Phi^T`, ``(c, n)``: the kernel applied to the weights of moments ``M``."""
        LM = M * self.lam
        parts = [LM @ F for _, _, F in self._blocks()]
        return parts[0] if len(parts) == 1 else self.xp.concatenate(parts, 1)

    def gram(self, rows: np.ndarray, s) -> np.ndarray:
        r""":math:`\Phi_R^T \mathrm{diag}(s) \Phi_R` over the feature rows ``R`` (host), for ``s >= 0``: on whole
        feature blocks (long products), on the CPU by BLAS's symmetric rank-k update (half the products)."""
        if not self.numpy:
            return self.host(sum(F[self.device(rows)] * s[i0:i1] @ F[self.device(rows)].T
                                 for i0, i1, F in self._blocks(2**62)))
        G = np.zeros((rows.size, rows.size), order="F")
        for i0, i1, F in self._blocks(2**62):
            G = blas.dsyrk(1.0, F[rows] * np.sqrt(s[i0:i1]), beta=1.0, c=G, overwrite_c=1)
        return np.triu(G) + np.triu(G, 1).T

    def sweep(self, M, step, carried: bool = False):
        """The sums of moments ``M`` by cache-sized block, handed to ``step(i0, i1, sums)``; the weights it
        returns (:meth:`carried` weights when ``carried``) are accumulated into moments with the block's
        features still in cache (None if it returns None)."""
        LM, out = M * self.lam, None
        for i0, i1, F in self._blocks():
            W = step(i0, i1, LM @ F)
            if W is not None:
                out = W @ F.T if out is None else out + W @ F.T
        return out

    def field(self, s):
        """Row-normalized field of the kernel with column scaling ``s``: velocity ``(d, n)`` and row sums."""
        S = self.sums(self.moments(self.a * s * self.X1))
        return S[1:] / S[0], S[0]

    def apply(self, s):
        """:math:`\\tilde K (a s)`."""
        return self.sums(self.moments((self.a * s)[None]))[0]

    def column_error(self, row_sums, s) -> float:
        """:math:`\\sum_j |\\sum_i a_i K_{ij} - a_j|` for rows normalized,
        :math:`K_{ij} = \\tilde K_{ij} a_j s_j / r_i`."""
        return float(abs(self.a * s * self.apply(1 / row_sums) - self.a).sum())


class _BasisPasses(_Passes):
    """The products of :class:`_Passes` through the product basis of a ``_Factored`` on :math:`S^2`, without
    forming the harmonics (about 6x the basis's values per particle); the ``_Factored`` keeps its basis."""

    def _keep(self, F: _Factored, keep: bool) -> None:
        pass

    def tensor(self, A) -> torch.Tensor:
        """An array of this object as a torch tensor (shared memory)."""
        return torch.from_numpy(A) if self.numpy else A

    def carried(self, w, i0: int = 0, i1: int | None = None):
        return w[None]

    def moments(self, W, carried: bool = False):
        Wt = self.tensor(W).T
        return self.array(self.factored.position_moments(Wt[:, 0]) if carried else self.factored.moments(Wt)).T

    def sums(self, M):
        out = self.xp.empty((M.shape[0], self.a.shape[0]), dtype=self.a.dtype)

        def step(i0, i1, R):
            out[:, i0:i1] = self.array(R).T

        self.factored.sweep(self.tensor(M).T, step)
        return out

    def gram(self, rows: np.ndarray, s) -> np.ndarray:
        return self.factored.gram(torch.from_numpy(rows).to(self.factored.X.device), self.tensor(s)).cpu().numpy()

    def sweep(self, M, step, carried: bool = False):
        def rows(i0, i1, R):
            W = step(i0, i1, self.array(R).T)
            return None if W is None else self.tensor(W).T

        out = self.factored.sweep(self.tensor(M).T, rows, carried)
        return None if out is None else self.array(out).T


def passes(F: _Factored, a: torch.Tensor, keep: bool = True) -> _Passes:
    """The passes of the solvers over ``F``: on :math:`S^2` through its product basis, on the circle through
    the harmonics themselves (which its basis is)."""
    return _BasisPasses(F, a, keep) if F.kernel.d == 3 else _Passes(F, a, keep)


@functools.lru_cache(maxsize=16)
def _newton_plan(d: int, order: int, eigenvalues: bytes):
    r"""Newton's rows (leading modes, eigenvalue above :data:`_NEWTON_RATIO` of the largest, at most
    :data:`_NEWTON_MAX`; not the zero row of :math:`\sin 0`), their eigenvalues and, on the circle when
    ``2 max(m) <= K``, the gather of the Gram matrix from moments (else None):
    entry :math:`(j, k)` is half ``M[first] + sign * M[second]`` (module :class:`_Newton`)."""
    lam = np.frombuffer(eigenvalues)
    candidates = np.arange(lam.size)
    candidates = candidates[candidates != order + 1] if d == 2 else candidates
    ranked = candidates[np.argsort(-lam[candidates], kind="stable")]
    count = min(_NEWTON_MAX, int((lam[ranked] > _NEWTON_RATIO * lam[ranked[0]]).sum()))
    rows = np.sort(ranked[:count])
    m, sine = np.where(rows <= order, rows, rows - order - 1), rows > order
    if d != 2 or 2 * int(m.max()) > order:
        return rows, lam[rows], None
    plus, minus = m[:, None] + m[None, :], m[:, None] - m[None, :]
    same = sine[:, None] == sine[None, :]  # cos cos: C(j-k) + C(j+k); sin sin: C(j-k) - C(j+k)
    first = np.where(same, np.abs(minus), order + 1 + plus)  # cos sin: S(j+k) - S(j-k); sin cos: S(j+k) + S(j-k)
    second = np.where(same, plus, order + 1 + np.abs(minus))
    sign = np.where(same, np.where(sine[:, None], -1.0, 1.0), np.where(sine[:, None], 1.0, -1.0) * np.sign(minus))
    return rows, lam[rows], (first, second, sign)


class _Newton:
    r"""Newton's correction on the leading modes ``rows`` of the moment map (``_harmonic_fields.py``).

    On the circle the Gram matrix of products, :math:`\cos j\theta \cos k\theta = \frac12(\cos(j-k)\theta
    + \cos(j+k)\theta)` and the like, comes from the moments of ``a u^2`` up to order ``2 max(rows)``:
    one more row in the moments pass instead of ``n |R|^2`` products (``from_moments``).
    """

    def __init__(self, P: _Passes):
        kernel = P.factored.kernel
        lam = np.ascontiguousarray(P.host(P.lam))
        self.rows, self.lam, self.gather = _newton_plan(kernel.d, kernel.order, lam.tobytes())
        self.from_moments, self.inverse = self.gather is not None, None

    def factor(self, P: _Passes, s, moments_of_s=None) -> None:
        r"""Invert :math:`I + G_{RR}\Lambda_R` (eigenvalues at least 1) at :math:`G = \Phi^T \mathrm{diag}(s) \Phi`
        (``moments_of_s``: :math:`s\Phi` on the host, when ``from_moments``)."""
        if self.from_moments:
            first, second, sign = self.gather
            G = 0.5 * (moments_of_s[first] + sign * moments_of_s[second])
        else:
            G = P.gram(self.rows, s)
        self.inverse = np.linalg.inv(np.eye(self.rows.size) + G * self.lam)

    def correction(self, f: np.ndarray) -> np.ndarray:
        r""":math:`t`: :math:`t_R = (I + G_{RR}\Lambda_R)^{-1} f_R - f_R`, 0 elsewhere."""
        t = np.zeros_like(f)
        t[self.rows] = self.inverse @ f[self.rows] - f[self.rows]
        return t


def _weights(P: _Passes, u, carry: bool, gram: bool, i0: int = 0, i1: int | None = None):
    """The rows whose moments the next iteration needs, for particles ``i0:i1``: ``a u``, with ``a u x``
    (the field's numerators) when ``carry``, then ``a u^2`` (the circle's Gram matrix) when ``gram``."""
    w = P.a[i0:i1] * u
    W = P.carried(w, i0, i1) if carry else w[None]
    return P.xp.concatenate([W, (w * u)[None]]) if gram else W


def symmetric_sinkhorn(P: _Passes, u, tol: float, max_iter: int, memory: dict | None = None):
    r"""The symmetric scaling :math:`u_i (\tilde K a u)_i = 1` by the moment map with Newton's correction.

    One sweep per iteration, by cache-sized block: the sums of the current scaling ``u`` (its marginal
    error; the field's numerators when its moments carry them) and of the next point ``x = M + t``,
    then, with the block's features still in cache, the moments of ``u_next = 1 / (Phi Lambda x)``
    (:func:`_weights`). The numerators ride along when ``u_next`` is predicted to converge: by
    ``memory["sweeps"]`` (the sweeps of the previous solve in a flow, written back) or by the last two
    errors; else one more application computes them. A sweep whose scaling is predicted to converge
    skips the next moments (one more pass if it does not). On the circle the Jacobian is formed at every
    iteration (its Gram matrix rides along); on :math:`S^2` while far or slow (the gain of a corrected
    point under 10x), else the last solve's inverse is kept (``memory["newton"]``: in a flow the particles
    move little between solves, and its Gram matrix costs :math:`n|R|^2`, 2-3 applications at beta = 32). The start
    is scaled to :math:`(a u)^T \tilde K (a u) = 1`, which the fixed point satisfies (the plain step does
    not contract that mode).

    Runs on the one Sinkhorn solver (:func:`~sinkflow.attention._solver.sinkhorn_solve`) over
    :class:`_HarmonicSweeps`: its stopping rule (the error of the start read first, then after every
    step; a sweep whose error is not a number stops, not converged) and its report.

    Returns ``(velocity (d, n), row sums (n,), u, kernel applications, converged, marginal error)``;
    ``memory["report"]`` is the :class:`~sinkflow.attention._solver.SolveReport` (sweeps, error, converged).
    """
    memory = {} if memory is None else memory
    op = _HarmonicSweeps(P, tol, memory)
    out, report = sinkhorn_solve(op, None, u, tol=tol, max_iter=max(max_iter - 1, 0), accelerate=False, stall=False,
                                 read_start=True)
    memory["report"] = SolveReport(op.done, op.err, op.err <= tol, report.errors, report.scales)
    return out


class _HarmonicSweeps:
    """The kernel operator of :func:`symmetric_sinkhorn`: :meth:`error` is a sweep (the marginal error of
    ``u`` and the moments of the next scaling), :meth:`step` the update between two sweeps (Newton's
    correction, the swap to the next scaling). Scaling domain, on rows; ``potentials() = (None, u)``."""

    domain = "scaling"
    rescalable = False
    differentiable = False
    check_every = 1

    def __init__(self, P: _Passes, tol: float, memory: dict):
        self.P, self.a, self.b, self.tol, self.memory = P, P.a, P.a, tol, memory
        self.newton = newton = _Newton(P)
        self.expect, self.gram = memory.get("sweeps"), newton.from_moments
        kept = None if self.gram else memory.get("newton")  # the last solve's, if of these rows
        newton.inverse = kept if kept is not None and kept.shape == (newton.rows.size,) * 2 else None

    def reset(self, scale, f, u):
        P, xp = self.P, self.P.xp
        M = P.moments((self.a * u)[None])
        scale = 1 / math.sqrt(float((M[0] * P.lam * M[0]).sum()))
        self.u, self.M = u * scale, M * scale
        self.E, self.u_next, self.velocity = xp.empty_like(u), xp.empty_like(u), xp.empty_like(P.X1[1:])
        self.t, self.done, self.errs, self.previous, self.err = None, 0, [], math.inf, math.inf

    def error(self, row):
        """One sweep: the marginal error of ``u`` (0 for the solver when it is not a number: the solve stops)."""
        P, xp, a, gram, E, velocity = self.P, self.P.xp, self.a, self.gram, self.E, self.velocity
        u, u_next, M, t, errs = self.u, self.u_next, self.M, self.t, self.errs
        self.done += 1
        carried = M.shape[0] > 1
        carry = ((self.expect is not None and self.done + 1 >= self.expect)
                 or (len(errs) >= 2 and errs[-1] ** 3 <= self.tol * errs[-2] ** 2))
        state = self.state = {"err": 0.0, "positive": True}

        def step(i0, i1, S):  # (``P.sweep`` calls it before the loop moves on)
            E[i0:i1] = S[0]
            state["err"] += float((a[i0:i1] * abs(u[i0:i1] * S[0] - 1)).sum())
            if carried:
                velocity[:, i0:i1] = S[1:M.shape[0]] / S[0]
            point = S[0] if t is None else S[-1]
            state["positive"] &= bool((point > 0).all())
            xp.reciprocal(point, out=u_next[i0:i1])
            return None if carried else _weights(P, u_next[i0:i1], carry, gram, i0, i1)

        self.Mn = P.sweep(M if t is None else xp.concatenate([M, M[:1] + P.device(t)]), step, carry)
        self.carry = carry
        self.err = err = state["err"]
        errs.append(err)
        return err if math.isfinite(err) else 0.0

    def step(self, row, omega, fused):
        P, newton, gram, Mn, t = self.P, self.newton, self.gram, self.Mn, self.t
        if not self.state["positive"]:  # the corrected point went too far: the plain step from u
            t, newton.inverse, Mn = None, None, None
            P.xp.reciprocal(self.E, out=self.u_next)
        if Mn is None:  # predicted to converge and did not, or the plain step
            Mn = P.moments(_weights(P, self.u_next, self.carry, gram), self.carry)
        f = P.host(Mn[0] - self.M[0]) - (0 if t is None else t)  # H(x) - x
        err = self.err
        refresh = (gram or newton.inverse is None or err > _NEWTON_FAR
                   or err > 0.1 * self.previous)  # far, or gained < 10x
        if refresh:
            newton.factor(P, self.a * self.u_next * self.u_next, P.host(Mn[-1]) if gram else None)
        self.previous, self.t = (math.inf if refresh or t is None else err), newton.correction(f)
        self.u, self.u_next, self.M = self.u_next, self.u, Mn[:Mn.shape[0] - gram]

    def potentials(self):
        return None, self.u

    def finish(self):
        P, u, err, converged = self.P, self.u, self.err, self.err <= self.tol
        if converged:
            self.memory["sweeps"] = self.done
            self.memory["newton"] = None if self.gram else self.newton.inverse
        if self.M.shape[0] > 1:  # the numerators rode along
            return self.velocity, self.E, u, self.done, converged, err
        return P.sums(P.moments(P.carried(self.a * u), True)[1:]) / self.E, self.E, u, self.done + 1, converged, err


def alternating_sinkhorn(P: _Passes, gamma, n_iter: int, need_errors: bool):
    """``n_iter`` half-iterations, row step first from the column scaling ``gamma``:
    :math:`K = \\mathrm{diag}(\\alpha) \\tilde K \\mathrm{diag}(a \\gamma)`, :math:`\\alpha = 1/\\tilde K(a\\gamma)`,
    :math:`\\gamma = 1/\\tilde K(a\\alpha)`, on the one solver's lean fixed-count entry over
    :class:`_HarmonicAlternating` (the last half-step fused with the velocity).
    Returns ``(velocity (d, n), gamma, row error, column error)``."""
    (_, out), _ = sinkhorn_solve(_HarmonicAlternating(P, n_iter, need_errors), None, gamma, n_iter=n_iter)
    return out


class _HarmonicAlternating:
    """The kernel operator of :func:`alternating_sinkhorn`: scaling domain, one kernel application a half-step,
    the last one fused with the field (``potentials() = (log alpha or None, gamma)``)."""

    domain = "scaling"
    rescalable = False
    differentiable = False
    check_every = 1

    def __init__(self, P: _Passes, n_iter: int, need_errors: bool):
        self.P, self.a, self.b, self.n_iter, self.need_errors = P, P.a, P.a, n_iter, need_errors

    def reset(self, scale, f, gamma):
        self.gamma, self.alpha, self.done, self.out = gamma, None, 0, None

    def step(self, row, omega, fused):
        P = self.P
        self.done += 1
        if self.done < self.n_iter:  # all but the last half-step
            if row:
                self.alpha = 1 / P.apply(self.gamma)
            else:
                self.gamma = 1 / P.apply(self.alpha)
            return
        need = self.need_errors
        if row:  # the last step normalizes the rows: fused with the velocity
            velocity, sums = P.field(self.gamma)
            self.alpha = 1 / sums
            col = P.column_error(sums, self.gamma) if need else math.nan
            self.out = (velocity, self.gamma, 0.0 if need else math.nan, col)
            return
        self.gamma = 1 / P.apply(self.alpha)  # ended on a column step: K applied as it is
        velocity, sums = P.field(self.gamma)
        row_sums = self.alpha * sums
        row_err = float((P.a * abs(row_sums - 1)).sum()) if need else math.nan
        col = P.column_error(1 / self.alpha, self.gamma) if need else math.nan
        self.out = (velocity * row_sums, self.gamma, row_err, col)

    def error(self, row):
        """L1 error of the marginal the last half-step left (one more application)."""
        if row:
            return self.P.column_error(1 / self.alpha, self.gamma)
        return float((self.P.a * abs(self.alpha * self.P.apply(self.gamma) - 1)).sum())

    def potentials(self):
        return (None if self.alpha is None else self.P.xp.log(self.alpha)), self.gamma

    def finish(self):
        return None, self.out
