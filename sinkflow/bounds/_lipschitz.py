r"""The local Lipschitz constant of self-attention against the sequence length (docs/theory/lipschitz.md).

Castin, Ablin and Peyré, "How Smooth Is Attention?" (ICML 2024, arXiv:2312.14820) study the map
:math:`f(X)_i = \sum_j K_{ij} W_V x_j` with :math:`K = \mathrm{normalize}(X A^\top X^\top)` and
:math:`A = W_K^\top W_Q / \sqrt{d_{head}}` (so the score of query :math:`i` on key :math:`j` is
:math:`x_j^\top A x_i`), and its local Lipschitz constant, the spectral norm of the Jacobian
:math:`\|Df(X)\|_2` over :math:`\mathbb{R}^{n \times d}` with the Frobenius norm. Here:

- :func:`attention_lipschitz`: :math:`\|Df(X)\|_2` for any registered normalization (SoftMax,
  Sinkhorn to ``n_iter`` half-steps, unrolled, or to tolerance, by implicit gradients of the converged map),
  with or without a mask: the dense Jacobian's exact norm for small ``n d``, else power iteration
  on :math:`J^\top J` (``torch.func.jvp`` and the ``torch.func.vjp`` of one forward pass, no vmap);
- :func:`adversarial_input`: the paper's construction :math:`x_1 = R u`, :math:`x_{j \ge 2} = R u / 2`
  (``u`` the top eigenvector of ``A``), or its mirrored form;
- :func:`lipschitz_upper_bound`: the paper's explicit bound at ``X``,
  :math:`\sum_h \|W_V^h\|_2 \sqrt{R_h^2 r^2 (n + 1) + n}` (row-stochastic attention only), with
  :math:`R_h` over both :math:`A_h x_i` and :math:`A_h^\top x_i` (the authors' code takes the first
  only, which adversarial inputs exceed).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from sinkflow._checks import check_number, check_seed
from sinkflow._summary import Summarized, number

__all__ = ["LipschitzEstimate", "attention_lipschitz", "adversarial_input", "lipschitz_upper_bound",
           "query_key_matrix"]

#: Largest ``n * d`` whose Jacobian ``method="auto"`` builds densely.
EXACT_LIMIT = 256


def _as64(x, name: str, ndim: tuple) -> torch.Tensor:
    """A real float64 CPU-free copy (detached) of an array or tensor with ``ndim`` in ``ndim``."""
    if isinstance(x, torch.Tensor):
        if x.is_complex() or not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"{name} must be a real floating tensor, got dtype {x.dtype}")
        t = x.detach().to(torch.float64)
    else:
        a = np.asarray(x)
        if np.iscomplexobj(a) or a.dtype.kind not in "fiu":
            raise TypeError(f"{name} must be a real array, got dtype {a.dtype}")
        t = torch.as_tensor(a.astype(np.float64))
    if t.ndim not in ndim:
        want = " or ".join(map(str, ndim))
        raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} has non-finite entries")
    return t


def _weights(W_Q, W_K, W_V, d: int | None = None):
    """Per-head ``(heads, d_head, d)``, ``(heads, d_head, d)``, ``(heads, d_v, d)`` float64 weights."""
    Q, K, V = (_as64(W, name, (2, 3)) for W, name in ((W_Q, "W_Q"), (W_K, "W_K"), (W_V, "W_V")))
    Q, K, V = (W if W.ndim == 3 else W[None] for W in (Q, K, V))
    if Q.shape != K.shape:
        raise ValueError(f"W_Q and W_K must have the same shape, got {tuple(Q.shape)} and {tuple(K.shape)}")
    if V.shape[0] != Q.shape[0] or V.shape[2] != Q.shape[2]:
        raise ValueError(f"W_V must be (heads, d_v, d) with heads = {Q.shape[0]}, d = {Q.shape[2]}, "
                         f"got shape {tuple(V.shape)}")
    if d is not None and Q.shape[2] != d:
        raise ValueError(f"W_Q must act on tokens of dimension {d} (the last axis of x), got shape {tuple(Q.shape)}")
    return Q, K, V


def query_key_matrix(W_Q, W_K) -> np.ndarray:
    r"""The paper's :math:`A = W_K^\top W_Q / \sqrt{d_{head}}`, one per head.

    The score of query ``x_i`` on key ``x_j`` is :math:`x_j^\top A x_i = (W_Q x_i) \cdot (W_K x_j) / \sqrt{d_{head}}`.

    Parameters
    ----------
    W_Q, W_K : array_like, shape (d_head, d) or (heads, d_head, d)

    Returns
    -------
    A : numpy float64 array, shape (d, d) or (heads, d, d)

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.bounds import query_key_matrix
    >>> query_key_matrix(np.eye(2), 2 * np.eye(2))
    array([[1.41421356, 0.        ],
           [0.        , 1.41421356]])
    """
    Q, K, _ = _weights(W_Q, W_K, W_Q)
    A = K.transpose(1, 2) @ Q / math.sqrt(Q.shape[1])
    A = A.numpy()
    return A if np.ndim(W_Q) == 3 else A[0]


def _normalizer(attention, n_iter, tol, max_iter):
    """``(name, C, mask) -> K`` from a registered variant name or a callable on dense scores."""
    if callable(attention):
        return getattr(attention, "__name__", "callable"), lambda C, mask: attention(C) if mask is None \
            else attention(C, mask=mask)
    from sinkflow.attention import available_attentions, get_attention

    if not isinstance(attention, str) or attention not in available_attentions():
        raise ValueError(f"attention must be a registered attention name or a callable, got {attention!r}")
    variant = get_attention(attention)
    if variant.normalize is None or variant.scores != "dot":
        raise ValueError(f"attention {attention!r} has no dense dot-product normalization")
    kwargs = {}
    if variant.solver == "sinkhorn":
        if n_iter is not None:
            check_number(n_iter, "n_iter", integer=True, positive=True)
        kwargs = {"n_iter": n_iter, "tol": 1e-9 if tol is None else check_number(tol, "tol", positive=True),
                  "max_iter": check_number(max_iter, "max_iter", integer=True, positive=True)}
    name = attention if variant.solver != "sinkhorn" else (
        f"{attention}(n_iter={n_iter})" if n_iter is not None else f"{attention}(tol={kwargs['tol']:g})")
    if variant.solver == "sinkhorn" and n_iter is None and attention == "sinkhorn":
        # to tolerance: the derivative of the converged map (implicit gradients), not of the last steps
        from sinkflow.attention._normalizations import solve_sinkhorn

        return name, lambda C, mask: solve_sinkhorn(C, None, kwargs["tol"], kwargs["max_iter"], mask=mask, warn=False,
                                                    backward="implicit").attention
    return name, lambda C, mask: variant.normalize(C, mask=mask, **kwargs).attention


def _attention_map(normalize, Q, K, V, mask):
    """``X (n, d) -> (n, heads * d_v)``: the heads' outputs side by side."""
    scale = 1.0 / math.sqrt(Q.shape[1])

    def f(X):
        q = torch.einsum("hed,nd->hne", Q, X)
        k = torch.einsum("hed,nd->hne", K, X)
        v = torch.einsum("hed,nd->hne", V, X)
        out = [normalize(q[h] @ k[h].T * scale, mask) @ v[h] for h in range(Q.shape[0])]
        return torch.cat(out, dim=1)

    return f


@dataclass(frozen=True, repr=False)
class LipschitzEstimate(Summarized):
    """The local Lipschitz constant :math:`\\|Df(X)\\|_2` of self-attention at one input.

    Attributes
    ----------
    estimate : float
        The Jacobian's spectral norm (Frobenius norm on inputs and outputs). By power iteration it
        is a lower estimate that ``converged`` says has stopped moving.
    method : {"exact", "power iteration"}
    iterations : int
        Power-iteration steps (0 for ``"exact"``).
    converged : bool
        Whether the relative change of the estimate fell below ``rtol`` (always True for ``"exact"``).
    relative_change : float
        The last relative change of the estimate (0 for ``"exact"``).
    bound : float or None
        The paper's explicit bound at this input (:func:`lipschitz_upper_bound`); None where its
        hypotheses do not hold (a normalization that is not row-stochastic SoftMax).
    bound_note : str
        Why the bound is given or not.
    n, d : int
        Tokens and their dimension.
    attention : str
        The normalization (``"softmax"``, ``"sinkhorn(n_iter=3)"``, ``"sinkhorn(tol=1e-09)"``).
    masked : bool
    """

    estimate: float
    method: str
    iterations: int
    converged: bool
    relative_change: float
    bound: float | None
    bound_note: str
    n: int
    d: int
    attention: str
    masked: bool

    def _facts(self):
        head = f"{self.attention}{', masked' if self.masked else ''}, n = {self.n}, d = {self.d}"
        how = [("method", self.method)]
        if self.method == "power iteration":
            how += [("iterations", str(self.iterations)), ("converged", str(self.converged)),
                    ("relative change", number(self.relative_change, 2))]
        bound = [("paper's bound", number(self.bound))] if self.bound is not None else [("bound", self.bound_note)]
        return head, [[("||Df(X)||_2", number(self.estimate, 6))], how, bound]

    @property
    def ratio(self) -> float | None:
        """``estimate / bound`` (None without a bound)."""
        return None if self.bound is None else self.estimate / self.bound


def _dense_norm(f, X):
    J = torch.autograd.functional.jacobian(f, X)
    J = J.reshape(-1, X.numel()).numpy()
    return float(np.linalg.norm(J, 2))


def _power_norm(f, X, max_iter, rtol, seed):
    """Power iteration on ``J^T J`` by ``torch.func`` products (``J v`` by jvp, ``J^T w`` by the vjp of one
    recorded forward pass); ``(norm, iterations, converged, change)``."""
    _, pullback = torch.func.vjp(f, X)
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(X.shape, generator=gen, dtype=X.dtype)
    v /= v.norm()
    mu_old, change = 0.0, math.inf
    for it in range(1, max_iter + 1):
        _, Jv = torch.func.jvp(f, (X,), (v,))
        (JTJv,) = pullback(Jv)
        mu = float(torch.dot(v.flatten(), JTJv.flatten()))  # Rayleigh quotient: ||J v||^2 <= ||J||^2
        nrm = JTJv.norm()
        if nrm == 0:
            return 0.0, it, True, 0.0
        v = JTJv / nrm
        change = abs(mu - mu_old) / max(abs(mu), 1e-300)
        mu_old = mu
        if change <= rtol:
            return math.sqrt(max(mu, 0.0)), it, True, change
    return math.sqrt(max(mu_old, 0.0)), max_iter, False, change


def attention_lipschitz(x, attention, W_Q, W_K, W_V, mask=None, *, n_iter=None, tol=None, max_iter=20_000,
                        method: str = "auto", power_iter: int = 500, rtol: float = 1e-10, seed: int = 0,
                        exact_limit: int = EXACT_LIMIT) -> LipschitzEstimate:
    r"""The local Lipschitz constant :math:`\|Df(X)\|_2` of self-attention at ``x``.

    The map is :math:`f(X) = [K^h X W_V^{h\top}]_h` (heads side by side) with
    :math:`K^h = \mathrm{normalize}(X W_Q^{h\top} (X W_K^{h\top})^\top / \sqrt{d_{head}})`, the
    setting of Castin, Ablin and Peyré (ICML 2024) with the normalization left free. The norm is
    the operator norm from :math:`(\mathbb{R}^{n \times d}, \|\cdot\|_F)` to the outputs with the
    Frobenius norm. Everything runs in float64 on a detached copy of the inputs (an analysis tool:
    half precisions are promoted, the result is a Python float).

    Parameters
    ----------
    x : array_like or torch.Tensor, shape (n, d)
        The tokens (rows).
    attention : str or callable
        A registered attention name with a dense dot-product normalization (``"softmax"``,
        ``"sinkhorn"``), or ``normalize(C[, mask=...]) -> K`` on a dense ``(n, n)`` score matrix.
        Sinkhorn is differentiated through its unrolled iterations as the solver runs them, to
        ``n_iter`` half-steps, or to ``tol`` when ``n_iter`` is None (the derivative of the converged map,
        by implicit differentiation: ``solve_sinkhorn(..., backward="implicit")``).
    W_Q, W_K : array_like, shape (d_head, d) or (heads, d_head, d)
    W_V : array_like, shape (d_v, d) or (heads, d_v, d)
    mask : bool array, shape (n, n), optional
        ``True`` where query ``i`` may attend to key ``j`` (causal: :func:`sinkflow.particles.causal_mask`).
    n_iter, tol, max_iter
        Sinkhorn's half-steps, or its tolerance and step cap (ignored by SoftMax).
    method : {"auto", "exact", "power iteration"}
        ``"exact"``: the dense Jacobian (``n d`` backward passes) and ``numpy.linalg.norm(J, 2)``;
        ``"power iteration"``: power iteration on :math:`J^\top J` with ``torch.func.jvp`` and the
        ``torch.func.vjp`` of one forward pass; ``"auto"``: exact when
        ``n * d <= exact_limit``.
    power_iter : int
        Most power-iteration steps; a run that stops there warns and reports ``converged=False``.
    rtol : float
        Power iteration stops when the Rayleigh quotient changes by less than ``rtol`` (relative).
    seed : int
        Seed of the power iteration's start vector.
    exact_limit : int

    Returns
    -------
    LipschitzEstimate
        ``estimate``, ``method``, ``iterations``, ``converged``, and the paper's ``bound`` where its
        hypotheses hold (SoftMax, masked or not; None for Sinkhorn and callables).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.bounds import attention_lipschitz
    >>> g = torch.Generator().manual_seed(0)
    >>> W_Q, W_K, W_V = (torch.randn(2, 3, generator=g, dtype=torch.float64) for _ in range(3))
    >>> x = torch.randn(5, 3, generator=g, dtype=torch.float64)
    >>> res = attention_lipschitz(x, "softmax", W_Q, W_K, W_V)
    >>> res.method, res.estimate <= res.bound
    ('exact', True)
    >>> power = attention_lipschitz(x, "softmax", W_Q, W_K, W_V, method="power iteration")
    >>> abs(power.estimate - res.estimate) < 1e-8 * res.estimate
    True
    """
    X = _as64(x, "x", (2,))
    n, d = X.shape
    Q, K, V = _weights(W_Q, W_K, W_V, d)
    if method not in ("auto", "exact", "power iteration"):
        raise ValueError(f"method must be 'auto', 'exact' or 'power iteration', got {method!r}")
    power_iter = check_number(power_iter, "power_iter", integer=True, positive=True)
    rtol = check_number(rtol, "rtol", positive=True)
    seed = check_seed(seed)
    exact_limit = check_number(exact_limit, "exact_limit", integer=True, positive=True, allow_zero=True)
    M = None
    if mask is not None:
        M = mask.detach().cpu() if isinstance(mask, torch.Tensor) else torch.as_tensor(np.asarray(mask))
        if M.dtype != torch.bool or tuple(M.shape) != (n, n):
            raise ValueError(f"mask must be a boolean (n, n) = ({n}, {n}) array, "
                             f"got {M.dtype} of shape {tuple(M.shape)}")
        if not M.any(1).all():
            raise ValueError("mask leaves a query with no key: every row of mask needs a True")
    name, normalize = _normalizer(attention, n_iter, tol, max_iter)
    f = _attention_map(normalize, Q, K, V, M)
    use_exact = method == "exact" or (method == "auto" and n * d <= exact_limit)
    if use_exact:
        est, its, conv, change = _dense_norm(f, X), 0, True, 0.0
    else:
        est, its, conv, change = _power_norm(f, X, power_iter, rtol, seed)
        if not conv:
            warnings.warn(f"attention_lipschitz: power iteration stopped at power_iter = {power_iter} with a relative "
                          f"change of {change:.2g} > rtol = {rtol:g}; the estimate is a lower bound", stacklevel=2)
    softmax_like = isinstance(attention, str) and attention == "softmax"
    if softmax_like:
        bound, note = lipschitz_upper_bound(X, Q, K, V), "row-stochastic SoftMax: the paper's bound applies"
    else:
        bound, note = None, "none: the paper's bound is proved for SoftMax only"
    return LipschitzEstimate(est, "exact" if use_exact else "power iteration", its, conv, change, bound, note,
                             n, d, name, M is not None)


_BOUND_FORMS = ("both", "code", "transposed")


def lipschitz_upper_bound(x, W_Q, W_K, W_V, *, form: str = "both") -> float:
    r"""The paper's explicit bound on :math:`\|Df(X)\|_2` for SoftMax self-attention at ``x``.

    .. math:: \sum_h \|W_V^h\|_2 \sqrt{R_h^2 r^2 (n + 1) + n}, \qquad r = \max_{i, j} \|x_i - x_j\|,

    with :math:`A_h = W_K^{h\top} W_Q^h / \sqrt{d_{head}}` (query ``i`` scores key ``j`` by
    :math:`x_j^\top A_h x_i`) and, by ``form``:

    - ``"both"`` (default): :math:`R_h = \max_i \max(\|A_h x_i\|, \|A_h^\top x_i\|)`: perturbing
      a key brings :math:`A_h x_i`, perturbing a query :math:`A_h^\top x_j`; never below the other two;
    - ``"code"``: :math:`R_h = \max_i \|A_h x_i\|`, the authors' ``compute_bound``. It is **not** an
      upper bound where :math:`A_h x_i` is small and :math:`A_h^\top x_i` is not: the input
      :math:`x_1 = -x_2` along the null eigenvector of a random :math:`A_h` exceeds it 21.6 times
      (docs/theory/lipschitz.md);
    - ``"transposed"``: :math:`R_h = \max_i \|A_h^\top x_i\|` (held on every input we tried).

    Both hold for any row-stochastic SoftMax, masked or not; the sum over heads bounds the heads
    side by side. Computed in float64.

    Parameters
    ----------
    x : array_like, shape (n, d)
    W_Q, W_K : array_like, shape (d_head, d) or (heads, d_head, d)
    W_V : array_like, shape (d_v, d) or (heads, d_v, d)
    form : {"both", "code", "transposed"}

    Returns
    -------
    float

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.bounds import lipschitz_upper_bound
    >>> x = np.array([[1.0, 0.0], [0.0, 0.0]])  # r = 1, R = ||A x_1|| = 1 with A = I
    >>> float(round(lipschitz_upper_bound(x, np.eye(2), np.sqrt(2) * np.eye(2), np.eye(2)), 6))  # sqrt(1 * 3 + 2)
    2.236068
    """
    if form not in _BOUND_FORMS:
        raise ValueError(f"form must be one of {_BOUND_FORMS}, got {form!r}")
    X = _as64(x, "x", (2,))
    n, d = X.shape
    Q, K, V = _weights(W_Q, W_K, W_V, d)
    A = K.transpose(1, 2) @ Q / math.sqrt(Q.shape[1])
    r = float(torch.cdist(X, X).max())
    total = 0.0
    for h in range(A.shape[0]):
        keys, queries = float((X @ A[h].T).norm(dim=1).max()), float((X @ A[h]).norm(dim=1).max())
        R_h = {"both": max(keys, queries), "code": keys, "transposed": queries}[form]
        total += float(torch.linalg.matrix_norm(V[h], 2)) * math.sqrt(R_h ** 2 * r ** 2 * (n + 1) + n)
    return total


def adversarial_input(n: int, W_Q, W_K, R: float, *, head: int = 0, mirror: bool | None = None) -> np.ndarray:
    r"""The paper's adversarial tokens for head ``head``: :math:`x_1 = R u`, :math:`x_2 = \dots = x_n = R u / 2`.

    ``u`` is the unit eigenvector of the largest real eigenvalue :math:`\lambda_{max}` of
    :math:`A = W_K^\top W_Q / \sqrt{d_{head}}`. When the most negative real eigenvalue
    :math:`\lambda_{min}` dominates (the authors' rule: :math:`\lambda_{max} \le -8 \lambda_{min}`
    fails), the mirrored form :math:`x_1 = -R u`, :math:`x_{j \ge 2} = R u` with ``u`` its eigenvector.
    At a fixed ``R`` the Lipschitz constant grows, peaks near :math:`n \approx e^{\lambda R^2 / 4}`
    (there query ``j >= 2`` weighs token 1 as much as the ``n - 1`` others), then decays.

    Parameters
    ----------
    n : int
        Tokens, at least 2.
    W_Q, W_K : array_like, shape (d_head, d) or (heads, d_head, d)
    R : float
        The radius, positive.
    head : int
        Which head's ``A``.
    mirror : bool or None
        Force the mirrored form (True) or the plain one (False); None applies the authors' rule.

    Returns
    -------
    x : numpy float64 array, shape (n, d)

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.bounds import adversarial_input
    >>> adversarial_input(3, np.diag([2.0, 1.0]), np.eye(2), R=2.0)  # A = diag(2, 1) / sqrt(2): u = e_1
    array([[2., 0.],
           [1., 0.],
           [1., 0.]])
    """
    n = check_number(n, "n", integer=True, positive=True)
    if n < 2:
        raise ValueError(f"n must be at least 2, got {n}")
    R = check_number(R, "R", positive=True)
    A = query_key_matrix(W_Q, W_K)
    if A.ndim == 3:
        if not (isinstance(head, (int, np.integer)) and 0 <= head < A.shape[0]):
            raise ValueError(f"head must be an integer in [0, {A.shape[0]}), got {head!r}")
        A = A[head]
    vals, vecs = np.linalg.eig(A)
    real = np.abs(vals.imag) <= 1e-12 * max(1.0, np.abs(vals).max())
    if not real.any():
        raise ValueError("A = W_K^T W_Q / sqrt(d_head) has no real eigenvalue: the construction needs one")
    vals, vecs = vals.real[real], vecs.real[:, real]
    lam_max, lam_min = vals.max(), vals.min()
    if mirror is None:
        mirror = not lam_max > -8 * lam_min
    u = vecs[:, np.argmin(vals) if mirror else np.argmax(vals)]
    u = u / np.linalg.norm(u)
    u = u if u[np.argmax(np.abs(u))] > 0 else -u  # eig's sign is arbitrary: fix it
    x = np.tile(R * u if mirror else R * u / 2, (n, 1))
    x[0] = -R * u if mirror else R * u
    return x + 0.0  # no negative zeros
