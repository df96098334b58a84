r"""Spectral-norm error of Skyformer's Nyström and the theorem that bounds it (docs/theory/nystrom.md).

Notation: :math:`\bar C = \kappa(X, X)`, :math:`X = [Q; K]`, :math:`N = n_q + n_k` points
(:math:`N = 2n` for self-attention), :math:`C = \bar C_{1:n_q, n_q+1:N}`, landmark
indices :math:`J` drawn uniformly with replacement, :math:`\tilde{\bar C}` the Nyström
approximation and :math:`E = \bar C - \tilde{\bar C}`.

- Always: :math:`\|C - \tilde C\|_2 \le \|E\|_2` (a block of :math:`E`) and, with the exact
  pseudo-inverse, :math:`E \succeq 0` (:math:`\tilde{\bar C} \preceq \bar C`).
- Ridge leverage scores :math:`l_i = [\bar C(\bar C + \lambda I)^{-1}]_{ii}`, statistical
  dimension :math:`d_{stat} = \sum_i l_i`, :math:`\beta^\star = d_{stat} / (N \max_i l_i)`.
- **Theorem** (Skyformer, after Musco & Musco 2017): with :math:`\lambda = \varepsilon \|C\|_2`
  and :math:`m \ge c\,(d_{stat}/\beta) \log(2N/\delta)` (:math:`= \log(4n/\delta)`),
  with probability :math:`\ge 1 - \delta`:
  :math:`\tilde{\bar C} \preceq \bar C \preceq \tilde{\bar C} + \lambda I` and
  :math:`\|C - \tilde C\|_2 \le \lambda`.

Where the constant comes from (re-derived here)
-----------------------------------------------
Write :math:`\bar C = B B^T`, :math:`\psi_i = (B^T B + \lambda I)^{-1/2} b_i` (so
:math:`\|\psi_i\|^2 = l_i` and :math:`\sum_i \psi_i \psi_i^T = P`, :math:`\|P\| \le 1`), and
:math:`Y = \frac{N}{m} \sum_{k=1}^m \psi_{j_k} \psi_{j_k}^T` for the uniform draws. If
:math:`Y \succeq P - t I` then every :math:`x` orthogonal to the sampled directions has
:math:`x^T B^T B x \le \frac{t}{1-t} \lambda \|x\|^2`, i.e. :math:`\|E\|_2 \le \frac{t}{1-t}\lambda`;
:math:`t = 1/2` gives exactly :math:`\lambda`. Matrix Bernstein with summands bounded by
:math:`L` and variance :math:`\sigma^2`, both :math:`\le R/m` with :math:`R = N \max_i l_i = d_{stat}/\beta^\star`,
gives :math:`P(\|Y - P\| \ge t) \le 2N \exp(-m t^2 / (2R(1 + t/3)))`, so
:math:`m \ge \frac{2(1+t/3)}{t^2} R \log(2N/\delta) = \frac{28}{3} R \log(4n/\delta)` suffices
(:data:`SHARP_LANDMARK_CONSTANT`). The theory page's :math:`56/3` (:data:`LANDMARK_CONSTANT`,
the default) is what the same argument gives with the cruder bounds :math:`L, \sigma^2 \le 2R/m`
(:math:`\frac{4(1+t/3)}{t^2} = 56/3` at :math:`t = 1/2`): valid, twice as many landmarks as
needed. Only the lower tail is needed, so even :math:`\log(2n/\delta)` would do.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from sinkflow._backend import exp_floor
from sinkflow._checks import check_number, check_seed
from sinkflow._summary import Summarized, number
from sinkflow.attention._inverses import _check_gamma, _check_inverse, _check_iter, _iterative_inverse, _pinv_rtol
from sinkflow.attention._kernelized import _check_pair, _kernel, _stack
from sinkflow.attention._nystrom import sample_landmarks
from sinkflow.bounds._spectral import (
    LANDMARK_CONSTANT,
    _check_fraction,
    _check_trials,
    beta_star,
    binomial_interval,
    extreme_eigenvalues,
    landmarks_required,
    ridge_leverage_scores,
    spectral_norm,
)

__all__ = ["NystromErrors", "nystrom_errors", "NystromCheck", "nystrom_check", "smallest_sufficient_landmarks"]


# --------------------------------------------------------------------------- Monte Carlo
def _lifted64(Q, K):
    q, k, _ = _check_pair(Q, K)
    if q.ndim != 2 or k.ndim != 2:
        raise ValueError(f"the bound checks take one head: Q (n_q, p) and K (n_k, p), got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    for name, t, what in (("Q", q, "query"), ("K", k, "key")):
        if t.shape[0] == 0 or t.shape[1] == 0:
            raise ValueError(f"{name} must hold at least one {what} of dimension p >= 1, got shape {tuple(t.shape)}")
    q, k = q.detach().cpu().double(), k.detach().cpu().double()
    x = _stack(q, k)
    return _kernel(x, x, q.shape[-1]).numpy(), q.shape[0], q.shape[-1]


def _clamp_artefact(Cbar, scale):
    r"""A message when the kernel's float64 underflow clamp is not negligible next to ``scale``, else None.

    :func:`sinkflow.attention._kernelized._kernel` floors the exp argument at ``exp_floor`` (one unit above
    log of the smallest normal), so an entry whose true value underflows reads :math:`e^{floor}` instead.
    The clamped entries perturb :math:`\bar C` by at most ``sqrt(count) e^{floor}`` in spectral norm; next
    to a ``scale`` (:math:`\lambda`, or :math:`\|C\|_2`) within a factor 1e6 of it, errors and verdicts
    are decided by the clamp, not by the data.
    """
    floor = math.exp(exp_floor(torch.float64))
    count = int((Cbar <= floor * (1 + 1e-9)).sum())
    if count == 0 or math.sqrt(count) * floor <= 1e-6 * scale:
        return None
    return (f"Q and K underflow the kernel: {count} of the {Cbar.size} entries of exp(-|x - y|^2 / (2 sqrt p)) are "
            f"below float64's smallest normal and read as the clamp e^{math.log(floor):.1f} = {floor:.2g}, not "
            f"negligible next to {scale:.3g}, so the errors (and any verdict) would be clamp artefacts; scale Q and K "
            "down (the kernel's length scale is (4 p)^(1/4))")


@dataclass(frozen=True, eq=False, repr=False)
class NystromErrors(Summarized):
    """Errors of repeated landmark draws.

    Its ``repr`` summarizes the draws (mean and worst error, relative to :math:`\\|C\\|_2`, the
    lifted eigenvalues); the per-draw arrays stay attributes.

    Attributes
    ----------
    errors : ndarray (trials,)
        :math:`\\|C - \\tilde C\\|_2` per draw.
    lifted_min, lifted_max : ndarray (trials,)
        Extreme eigenvalues of :math:`E = \\bar C - \\tilde{\\bar C}` per draw
        (:math:`\\lambda_{max} = \\|E\\|_2` when :math:`E \\succeq 0`; in float64 :math:`\\lambda_{min}` may
        be negative by rounding, up to about ``1e-8 * norm_Cbar``, and then
        :math:`\\|E\\|_2 = \\max(\\lambda_{max}, -\\lambda_{min})`).
    norm_C, norm_Cbar : float
        :math:`\\|C\\|_2` and :math:`\\|\\bar C\\|_2`.
    landmarks : int
    inverse : str
    """

    errors: np.ndarray
    lifted_min: np.ndarray
    lifted_max: np.ndarray
    norm_C: float
    norm_Cbar: float
    landmarks: int
    inverse: str

    def _facts(self):
        errors = np.asarray(self.errors, dtype=float)
        head = f"{errors.size} draws of m={self.landmarks} landmarks ({self.inverse})"
        return head, [
            [("||C - C~||_2", f"mean {number(errors.mean())}, max {number(errors.max())}"),
             ("relative", f"{number(errors.mean() / self.norm_C)} of ||C||_2 = {number(self.norm_C)}")],
            [("lifted E = Cbar - Cbar~", f"lambda_max mean {number(np.nanmean(self.lifted_max))}, "
                                         f"lambda_min min {number(np.nanmin(self.lifted_min))}")],
        ]


def _errors_from_lifted(Cbar, n_q, m, trials, inverse, n_iter, gamma, rng, method, progress, lifted=True):
    from sinkflow._progress import progress_bar

    N = Cbar.shape[0]
    lows, highs, errs = np.full(trials, np.nan), np.full(trials, np.nan), np.empty(trials)
    for t in progress_bar(range(trials), enabled=progress, desc=f"Nyström draws (m={m})", leave=False):
        J = sample_landmarks(N, m, generator=rng)
        if inverse == "pinv":
            # G M^+ G^T is the projection onto the span of the landmarks' columns: repeats change
            # nothing and cost O(m^3) (m = 10,000 for N = 400: 13 minutes; at most N^3 now).
            J = np.unique(J)
        G = Cbar[:, J]
        if inverse == "pinv":
            W = np.linalg.pinv(Cbar[np.ix_(J, J)], rcond=_pinv_rtol(torch.float64), hermitian=True)
        else:
            W = _iterative_inverse(torch.from_numpy(np.ascontiguousarray(Cbar[np.ix_(J, J)])), n_iter, gamma).numpy()
        E = Cbar - G @ W @ G.T
        E = 0.5 * (E + E.T)
        errs[t] = spectral_norm(E[:n_q, n_q:], method=method)
        if lifted:
            lows[t], highs[t] = extreme_eigenvalues(E, method=method)
    return errs, lows, highs


def _check_landmarks_fit(m, N, inverse):
    """Landmarks beyond the N stacked points: the pseudo-inverse keeps the distinct ones (exact once all N
    are drawn); the iterative inverse of a block of m > N repeated points is refused (O(m^3) per draw)."""
    if m <= N:
        return
    if inverse != "pinv":
        raise ValueError(f"landmarks={m} exceeds the N = {N} stacked queries and keys: the iterative inverse "
                         f"of an {m} x {m} block of repeated points costs O(m^3) per draw; take m <= N, or "
                         "inverse='pinv' (which keeps the distinct landmarks, exact once all N are drawn)")
    warnings.warn(f"landmarks={m} exceeds the N = {N} stacked queries and keys: the draws with replacement "
                  "repeat points (as the theorem allows; its landmark count often exceeds N). Repeats change "
                  "nothing (the pseudo-inverse keeps the distinct landmarks), and a draw that holds all N "
                  "points is the exact lifted kernel (error 0).", UserWarning, stacklevel=3)


def nystrom_errors(Q, K, landmarks: int, trials: int = 20, *, inverse: str = "pinv", n_iter: int = 6,
                   gamma: float = 0.1, seed=0, method: str = "auto", progress: bool = False) -> NystromErrors:
    r"""Exact spectral errors of ``trials`` independent lifted-Nyström draws (float64).

    Parameters
    ----------
    Q : array (n_q, p)
    K : array (n_k, p)
        One head (loop over heads yourself).
    landmarks : int
        ``m``, drawn uniformly with replacement from the ``N = n_q + n_k`` stacked points. The
        pseudo-inverse keeps the distinct ones (repeats do not change its estimate), so
        ``m > N`` costs at most what ``N`` does, and a draw holding all ``N`` points is the
        exact kernel; the iterative inverse refuses ``m > N`` (ValueError).
    trials : int
        Independent draws.
    inverse, n_iter, gamma :
        As in :func:`sinkflow.nystrom_factors`.
    seed : int or numpy.random.Generator
        Randomness of the draws.
    method : {"auto", "dense", "lanczos"}
        Eigen/singular value solver (see :func:`spectral_norm`).

    Examples
    --------
    A block is no larger than the whole: ``errors <= max(lifted_max, -lifted_min)`` (:math:`\|E\|_2`, up to
    the rounding of the norms, ~1e-15 relative). :math:`E \succeq 0` holds in exact arithmetic only; in
    float64 the pseudo-inverse leaves :math:`\lambda_{min}(E)` negative by up to about ``1e-8 * norm_Cbar``
    (see ``loewner_tol`` of :func:`nystrom_check`), so ``errors <= lifted_max`` holds to that tolerance,
    not exactly: the seeded draws below have :math:`|\lambda_{min}|` of the size of :math:`\lambda_{max}`.

    >>> import numpy as np, sinkflow
    >>> r = np.random.default_rng(3)
    >>> Q, K = 0.05 * r.normal(size=(12, 1)), 0.05 * r.normal(size=(10, 1))
    >>> res = sinkflow.nystrom_errors(Q, K, 17, trials=5, seed=0)
    >>> whole = np.maximum(res.lifted_max, -res.lifted_min)   # ||E||_2
    >>> bool((res.errors <= whole * (1 + 1e-12)).all())
    True
    >>> bool((res.errors <= res.lifted_max + 1e-8 * res.norm_Cbar).all())   # E >= 0 up to rounding
    True

    Warns (``RuntimeWarning``) when ``Q`` and ``K`` underflow the kernel so far that the errors are
    artefacts of its float64 clamp (:func:`nystrom_check` then raises).
    """
    from sinkflow.attention._nystrom import _as_count

    m = _as_count(landmarks)
    trials = _check_trials(trials)
    _check_inverse(inverse)
    Cbar, n_q, _ = _lifted64(Q, K)
    _check_landmarks_fit(m, Cbar.shape[0], inverse)
    rng = np.random.default_rng(check_seed(seed))
    norm_C = spectral_norm(Cbar[:n_q, n_q:], method=method)
    artefact = _clamp_artefact(Cbar, norm_C)
    if artefact:
        warnings.warn(artefact, RuntimeWarning, stacklevel=2)
    errs, lows, highs = _errors_from_lifted(Cbar, n_q, m, trials, inverse, _check_iter(n_iter), _check_gamma(gamma),
                                            rng, method, progress)
    return NystromErrors(errs, lows, highs, norm_C,
                         spectral_norm(Cbar, symmetric=True, method=method), m, inverse)


@dataclass(frozen=True, eq=False, repr=False)
class NystromCheck(Summarized):
    r"""The theorem checked on one's own ``Q, K``: observed error against what it promises.

    ``repr(check)`` is a short verdict: the measured error beside :math:`\lambda`, whether the
    bound held in the draws *and* whether the theorem applies at this ``m`` (a bound that holds
    where the theorem does not apply confirms nothing), and the Loewner checks.
    :meth:`summary` is the full report (what ``sinkflow nystrom-check`` prints).

    Attributes
    ----------
    n_queries, n_keys, dim, landmarks, trials : int
    eps, delta : float
        The theorem's accuracy and failure probability.
    norm_C : float
        :math:`\|C\|_2`.
    lam : float
        :math:`\lambda = \varepsilon \|C\|_2`.
    observed_error : float
        Mean of :math:`\|C - \tilde C\|_2` over the draws (``errors`` holds each draw).
    relative_error : float
        ``observed_error / norm_C``.
    max_error : float
        Worst draw.
    lifted_error : float
        Mean :math:`\lambda_{max}(\bar C - \tilde{\bar C})`.
    d_stat, beta, max_leverage : float
        Statistical dimension, :math:`\beta^\star` and :math:`\max_i l_i` at :math:`\lambda`.
    m_required : int
        :func:`landmarks_required` with ``constant``.
    theorem_applies : bool
        ``landmarks >= m_required`` (otherwise the theorem promises nothing).
    failures : int
        Draws with :math:`\|C - \tilde C\|_2 > \lambda`.
    failure_rate : float
        ``failures / trials``, the Monte-Carlo estimate of :math:`P(\|C - \tilde C\|_2 > \lambda)`.
    failure_ci : (float, float)
        Its ``confidence`` interval (``ci_method``).
    loewner_failures : int
        Draws violating :math:`\bar C \preceq \tilde{\bar C} + \lambda I`.
    loewner_lower : bool
        :math:`\tilde{\bar C} \preceq \bar C` in every draw, to ``loewner_tol``. Always true in
        exact arithmetic, with either inverse :math:`Z` of the landmark block
        :math:`M = \bar C_{J,J}`. Proof: write :math:`\bar C = B B^T` and :math:`B_J` the landmark
        rows, so :math:`M = B_J B_J^T` and :math:`\tilde{\bar C} = B (B_J^T Z B_J) B^T`; it
        suffices that :math:`B_J^T Z B_J \preceq I`. For :math:`Z = M^+`, :math:`B_J^T M^+ B_J` is
        the orthogonal projector onto the row space of :math:`B_J`. For the iterative inverse,
        :math:`0 \preceq Z \preceq (M + \gamma I)^{-1}` (its Newton-Schulz iterates are spectral
        functions :math:`f` of the rescaled matrix with :math:`0 \le \sigma f(\sigma) \le 1`), and
        :math:`B_J^T (B_J B_J^T + \gamma I)^{-1} B_J = (B_J^T B_J + \gamma I)^{-1} B_J^T B_J`
        has eigenvalues :math:`\sigma^2/(\sigma^2 + \gamma) < 1`. (Not via
        :math:`(M + \gamma I)^{-1} \preceq M^+`: that fails on the null space of a singular
        :math:`M`, e.g. with repeated landmarks, where :math:`M^+` vanishes.)
    min_lifted_eigenvalue : float
        Smallest :math:`\lambda_{min}(\bar C - \tilde{\bar C})` over the draws.
    bound_holds : bool
        ``failure_rate <= delta``: the promised event was observed at this ``m``. Read it with
        ``theorem_applies``: below ``m_required`` the theorem promises nothing, and the bound
        holding (or not) says nothing about the theorem.
    consistent : bool
        False only if the theorem applies and the interval lies entirely above ``delta``
        (a refutation of the theorem at this confidence).
    """

    n_queries: int
    n_keys: int
    dim: int
    landmarks: int
    trials: int
    eps: float
    delta: float
    inverse: str
    norm_C: float
    lam: float
    observed_error: float
    relative_error: float
    max_error: float
    lifted_error: float
    d_stat: float
    beta: float
    max_leverage: float
    constant: float
    m_required: int
    theorem_applies: bool
    failures: int
    failure_rate: float
    failure_ci: tuple
    confidence: float
    loewner_failures: int
    loewner_lower: bool
    min_lifted_eigenvalue: float
    loewner_tol: float
    bound_holds: bool
    consistent: bool
    errors: np.ndarray = field(repr=False)

    _summary_hint = ".summary(): the full report (d_stat, beta*, failure-rate interval)"

    def _facts(self):
        head = (f"n_q={self.n_queries}, n_k={self.n_keys}, p={self.dim}; m={self.landmarks} landmarks "
                f"({self.inverse}), {self.trials} draws")
        if self.theorem_applies:
            theorem = f"theorem applies: m = {self.landmarks} >= {self.m_required} required landmarks"
        else:
            theorem = (f"theorem does not apply: m = {self.landmarks} < {self.m_required} required landmarks, "
                       "it promises nothing here")
        held = f"error <= lambda in {self.trials - self.failures}/{self.trials} draws (needs >= {1 - self.delta:.0%})"
        verdict = f"{'holds' if self.bound_holds else 'FAILS'}, {held}"
        if not self.consistent:
            verdict += f"; THEOREM REFUTED at {self.confidence:.0%} confidence"
        return head, [
            [("||C - C~||_2", f"{number(self.observed_error)} mean, {number(self.max_error)} max"),
             ("lambda = eps ||C||_2", f"{number(self.lam)} (eps {number(self.eps)})")],
            [("bound", verdict)],
            [("", f"({theorem})")],
            [("Loewner", f"Cbar~ <= Cbar in all draws: {self.loewner_lower}; Cbar <= Cbar~ + lambda I failed in "
                         f"{self.loewner_failures}/{self.trials}")],
        ]

    def summary(self) -> str:
        """The full report in a few human-readable lines (what ``sinkflow nystrom-check`` prints).

        Returns
        -------
        str
            Sizes, :math:`\\|C\\|_2`, the observed error (mean, max, relative), :math:`\\lambda`,
            :math:`d_{stat}` and :math:`\\beta^\\star`, the landmarks the theorem requires and whether
            it applies, the failure rate with its interval, the Loewner checks and the verdict.
            ``repr(check)`` is the short form of the same verdict.

        Examples
        --------
        >>> import numpy as np, sinkflow
        >>> Q, K = 0.5 * np.random.default_rng(0).normal(size=(2, 32, 8))
        >>> check = sinkflow.nystrom_check(Q, K, landmarks=16, trials=5)
        >>> print(check.summary())  # doctest: +ELLIPSIS
        kernelized attention: n_q=32, n_k=32, p=8; Nyström (pinv) with m=16 landmarks, 5 draws
        ...
        bound ...: error <= lambda in .../5 draws (needs >= 90%)
        >>> print(check)  # doctest: +ELLIPSIS
        <NystromCheck> n_q=32, n_k=32, p=8; m=16 landmarks (pinv), 5 draws
          ||C - C~||_2: ... mean, ... max; lambda = eps ||C||_2: ... (eps 0.1)
          bound: ...
          (theorem does not apply: m = 16 < ... required landmarks, it promises nothing here)
          Loewner: ...
          .summary(): the full report (d_stat, beta*, failure-rate interval)
        """
        lo, hi = self.failure_ci
        verdict = "holds" if self.bound_holds else "fails"
        applies = "m >= m required: the theorem applies" if self.theorem_applies else \
            "m < m required: the theorem promises nothing here"
        N = self.n_queries + self.n_keys
        if self.m_required > N:
            applies += (f"; m required exceeds the N = {N} stacked points (draws with replacement), where "
                        f"m >= {N} distinct landmarks is already the exact kernel")
        return "\n".join([
            f"kernelized attention: n_q={self.n_queries}, n_k={self.n_keys}, p={self.dim}; "
            f"Nyström ({self.inverse}) with m={self.landmarks} landmarks, {self.trials} draws",
            f"||C||_2                 = {self.norm_C:.6g}",
            f"observed ||C - C~||_2   = {self.observed_error:.6g} (mean; max {self.max_error:.6g}; "
            f"relative {self.relative_error:.3g})",
            f"lambda = eps ||C||_2    = {self.lam:.6g} (eps={self.eps:g})",
            f"d_stat                  = {self.d_stat:.6g} (beta*={self.beta:.4g}, "
            f"max leverage={self.max_leverage:.4g})",
            f"m required (delta={self.delta:g}) = {self.m_required} (c={self.constant:.4g}); {applies}",
            f"P(||C - C~||_2 > lambda) ~ {self.failure_rate:.3g} ({self.failures}/{self.trials}; "
            f"{self.confidence:.0%} CI [{lo:.3g}, {hi:.3g}])",
            f"Loewner: Cbar~ <= Cbar in all draws: {self.loewner_lower}; Cbar <= Cbar~ + lambda I failed in "
            f"{self.loewner_failures}/{self.trials} draws",
            f"bound {verdict}: error <= lambda in {self.trials - self.failures}/{self.trials} draws "
            f"(needs >= {1 - self.delta:.0%})" + ("" if self.consistent else "; THEOREM REFUTED at this confidence"),
        ])


def nystrom_check(Q, K, landmarks: int, eps: float = 0.1, delta: float = 0.1, trials: int = 20, *,
                  inverse: str = "pinv", n_iter: int = 6, gamma: float = 0.1, seed=0, confidence: float = 0.95,
                  ci_method: str = "exact", constant: float = LANDMARK_CONSTANT, method: str = "auto",
                  loewner_tol: float = 1e-6, progress: bool = False) -> NystromCheck:
    r"""Check Skyformer's spectral-norm theorem on given queries and keys.

    ``C`` is the kernelized attention matrix of docs/theory/nystrom.md (queries and keys
    scaled by :math:`p^{-1/4}`, unit Gaussian bandwidth). Draws ``trials`` landmark sets
    of size ``landmarks``, measures the exact :math:`\|C - \tilde C\|_2` and the extreme
    eigenvalues of :math:`\bar C - \tilde{\bar C}`, and compares with
    :math:`\lambda = \varepsilon \|C\|_2`, :math:`d_{stat}` and the theorem's ``m``.

    Parameters
    ----------
    Q : array (n_q, p)
    K : array (n_k, p)
    landmarks : int
        Number of landmarks ``m`` (uniform with replacement over the ``N`` stacked points;
        ``m > N`` as in :func:`nystrom_errors`: a warning, the distinct ones kept).
    eps, delta : float
        Accuracy (:math:`\lambda = \varepsilon\|C\|_2`) and failure probability.
    trials : int
        Monte-Carlo draws for the failure probability.
    inverse, n_iter, gamma :
        Estimator (the theorem is about ``"pinv"``; ``"iterative"`` is Skyformer's practice).
    seed : int or numpy.random.Generator
    confidence, ci_method :
        The failure-rate interval (Clopper–Pearson ``"exact"`` or ``"wilson"``).
    constant : float
        The theorem's ``c`` (:data:`LANDMARK_CONSTANT`; :data:`SHARP_LANDMARK_CONSTANT`).
    method : {"auto", "dense", "lanczos"}
        Eigensolver (see :func:`spectral_norm`).
    loewner_tol : float
        Tolerance, relative to :math:`\|\bar C\|_2`, of :math:`\lambda_{min}(\bar C - \tilde{\bar C}) \ge 0`
        (the float64 rounding floor of the pseudo-inverse is ~ sqrt(machine eps), measured up to 4e-9).

    Returns
    -------
    NystromCheck

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> rng = np.random.default_rng(0)
    >>> Q, K = 0.5 * rng.normal(size=(2, 64, 16))
    >>> res = sinkflow.nystrom_check(Q, K, landmarks=32, eps=0.1, delta=0.1, trials=10)
    >>> res.bound_holds, res.loewner_lower, res.m_required > 32
    (True, True, True)
    """
    from sinkflow.attention._nystrom import _as_count

    m = _as_count(landmarks)
    trials = _check_trials(trials)
    _check_inverse(inverse)
    eps, delta = check_number(eps, "eps", positive=True), _check_fraction(delta, "delta")
    confidence, constant = _check_fraction(confidence, "confidence"), check_number(constant, "constant", positive=True)
    loewner_tol = check_number(loewner_tol, "loewner_tol", positive=True, allow_zero=True)
    Cbar, n_q, p = _lifted64(Q, K)
    N = Cbar.shape[0]
    _check_landmarks_fit(m, N, inverse)
    norm_C = spectral_norm(Cbar[:n_q, n_q:], method=method)
    norm_Cbar = spectral_norm(Cbar, symmetric=True, method=method)
    lam = float(eps) * norm_C
    artefact = _clamp_artefact(Cbar, lam)
    if artefact:
        raise ValueError(artefact + "; no verdict is given")
    lev = ridge_leverage_scores(Cbar, lam)
    d_stat, beta = float(lev.sum()), beta_star(lev)
    m_req = landmarks_required(d_stat, beta, N, delta, constant)
    rng = np.random.default_rng(check_seed(seed))
    errs, lows, highs = _errors_from_lifted(Cbar, n_q, m, trials, inverse, _check_iter(n_iter), _check_gamma(gamma),
                                            rng, method, progress)
    failures = int((errs > lam).sum())
    ci = binomial_interval(failures, trials, confidence, ci_method)
    applies = m >= m_req
    return NystromCheck(
        n_queries=n_q, n_keys=N - n_q, dim=p, landmarks=m, trials=trials, eps=float(eps), delta=float(delta),
        inverse=inverse, norm_C=norm_C, lam=lam, observed_error=float(errs.mean()),
        relative_error=float(errs.mean() / norm_C), max_error=float(errs.max()), lifted_error=float(highs.mean()),
        d_stat=d_stat, beta=beta, max_leverage=float(lev.max()), constant=float(constant), m_required=m_req,
        theorem_applies=applies, failures=failures, failure_rate=failures / trials, failure_ci=ci,
        confidence=float(confidence), loewner_failures=int((highs > lam).sum()),
        loewner_lower=bool(lows.min() >= -loewner_tol * norm_Cbar), min_lifted_eigenvalue=float(lows.min()),
        loewner_tol=float(loewner_tol), bound_holds=failures / trials <= delta,
        consistent=not (applies and ci[0] > delta), errors=errs,
    )


def smallest_sufficient_landmarks(Q, K, eps: float = 0.1, delta: float = 0.1, trials: int = 20, *,
                                  inverse: str = "pinv", n_iter: int = 6, gamma: float = 0.1, seed=0,
                                  m_max: int | None = None, method: str = "auto") -> int | None:
    r"""Smallest ``m`` whose empirical failure rate :math:`P(\|C - \tilde C\|_2 > \lambda)` is ``<= delta``.

    Doubling from ``m = 1`` then bisection (the failure rate decreases with ``m`` up to
    Monte-Carlo noise; each candidate uses the same ``seed``). ``m_required / result`` is the
    looseness factor of the theorem. Returns ``None`` if even ``m_max`` (default ``8 N``; draws
    are with replacement, so ``m > N`` is allowed) fails.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> rng = np.random.default_rng(0)
    >>> Q, K = 0.5 * rng.normal(size=(2, 32, 16))
    >>> m = sinkflow.smallest_sufficient_landmarks(Q, K, trials=10)
    >>> 1 <= m <= 64
    True
    """
    Cbar, n_q, _ = _lifted64(Q, K)
    trials = _check_trials(trials)
    _check_inverse(inverse)
    eps, delta, seed = check_number(eps, "eps", positive=True), _check_fraction(delta, "delta"), check_seed(seed)
    lam = float(eps) * spectral_norm(Cbar[:n_q, n_q:], method=method)
    artefact = _clamp_artefact(Cbar, lam)
    if artefact:
        raise ValueError(artefact + "; no landmark count is given")
    m_max = 8 * Cbar.shape[0] if m_max is None else check_number(m_max, "m_max", integer=True, positive=True)

    def ok(m):
        errs, _, _ = _errors_from_lifted(Cbar, n_q, m, trials, inverse, _check_iter(n_iter), _check_gamma(gamma),
                                         np.random.default_rng(seed), method, False,
                                         lifted=False)
        return (errs > lam).mean() <= delta

    lo, hi = 0, 1
    while not ok(hi):
        lo = hi
        if hi >= m_max:
            return None
        hi = min(2 * hi, m_max)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi
