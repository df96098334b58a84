r"""The attention vector field on particles (docs/theory/gradient_flows.md).

Particles :math:`x_1..x_n` with weights :math:`a` (the measure :math:`\mu = \sum_i a_i \delta_{x_i}`),
scores :math:`C_{ij} = x_i^T W x_j / \tau` with :math:`W = W_Q^T W_K`, values :math:`W_V x_j`.
The field is

.. math:: T(x_i) = \sum_j K_{ij} W_V x_j, \qquad K_{ij} = a_j\, k(x_i, x_j),

with the kernels of docs/theory/gradient_flows.md: ``"unnormalized"`` :math:`K^0_{ij} = a_j e^{C_{ij}}`;
``"softmax"`` :math:`K^1`, the rows of :math:`K^0` normalized; ``"sinkhorn"`` with ``n_iter``
half-iterations from :math:`K^0` (``None``: the doubly stochastic limit :math:`K^\infty`,
rows sum to 1 and :math:`a^T K = a^T`); ``"gaussian"`` Skyformer's unnormalized Gaussian
kernel :math:`a_j e^{-\|x_i - x_j\|_W^2 / (2\tau)}`.

Large ``n`` switches to :mod:`sinkflow.particles` (blocks of rows, never an ``n x n`` matrix).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from sinkflow._backend import check_finite, fast_paths_enabled, lift_half, to_torch, torch_threads, transform_entry
from sinkflow._summary import Summarized, describe_array, number, shape_text
from sinkflow.attention._normalizations import solve_sinkhorn
from sinkflow.attention._scores import dot_core, gaussian_core
from sinkflow.attention._symmetric_sinkhorn import _kernel, fixed_count, fixed_symmetric, solve_kernel, solve_symmetric
from sinkflow.attention._variants import get_attention
from sinkflow.bounds._stochasticity import marginal_errors
from sinkflow.fields._blockwise_fields import lazy_attention_field
from sinkflow.fields._causal import key_targets
from sinkflow.fields._lowrank_fields import lowrank_attention_field

__all__ = ["ATTENTIONS", "FieldEvaluation", "attention_field", "dense_limit", "check_matrix", "check_weights",
           "single_thread_if_small"]

#: The built-in particle attentions (any name of :func:`sinkflow.available_attentions` works).
ATTENTIONS = ("softmax", "sinkhorn", "unnormalized", "gaussian")

#: Above this many bytes for one ``n x n`` matrix the field is evaluated block-wise.
DENSE_BYTES_LIMIT = 512 * 2**20


#: Iterations of the symmetric Sinkhorn solver before a system falls back to the general one
#: (it needs 9-13 from any start; see :mod:`sinkflow.attention._symmetric_sinkhorn`).
SYMMETRIC_BUDGET = 200


#: One CPU system of at most this many particles goes from positions to velocity in numpy
#: (:func:`_small_symmetric_field`): below n ~ 300 torch's per-call overhead is several times numpy's,
#: and up to n = 1,024 numpy's float64 ``exp`` takes half the time of torch's (R^2, n = 1,024, one
#: thread: a step to tolerance 0.19 s against 0.28 s through the torch solver, 12 steps).
NUMPY_N = 1024


#: Problems with at most this many particles run on one CPU thread (see below).
SMALL_N = 256


@contextlib.contextmanager
def single_thread_if_small(n: int, device) -> None:
    """Run small CPU problems on one thread, restoring the setting afterwards.

    For ``n <= SMALL_N`` torch's thread pool costs more than it saves, and on a loaded
    machine its spin-waiting made small operations 10-150x slower (docs/performance.md;
    measured here: 100 sphere steps at n = 32 took 0.50 s on 2 threads, 0.09 s on 1; 8.8x on a loaded
    machine, ``benchmarks/bench_tricks.py``). A speed trick: off with :func:`sinkflow.fast_paths`.
    """
    if torch.device(device).type != "cpu" or n > SMALL_N or not fast_paths_enabled():
        yield
        return
    with torch_threads(1):
        yield


def check_matrix(M, name: str, d: int, like: torch.Tensor, batched: bool = False) -> torch.Tensor | None:
    """A ``(d, d)`` matrix (``(..., d, d)`` if ``batched``) as a finite tensor on ``like``'s device and
    dtype (``None`` stays ``None``)."""
    if M is None:
        return None
    t = to_torch(M, name, like=like)
    if t.shape[-2:] != (d, d) or (t.ndim != 2 and not batched):
        lead = "(..., " if batched else "("
        raise ValueError(f"{name} must have shape {lead}{d}, {d}) to act on particles of dimension {d}, "
                         f"got {tuple(t.shape)}")
    check_finite(t.detach(), name)
    return t


def check_weights(weights, like: torch.Tensor, name: str = "weights", batched: bool = False) -> torch.Tensor | None:
    """Particle weights: shape ``(n,)`` (``(..., n)`` if ``batched``, one measure per system),
    positive, summing to 1 (``None`` stays ``None``)."""
    if weights is None:
        return None
    n = like.shape[-2]
    a = to_torch(weights, name, like=like)
    if a.ndim < 1 or a.shape[-1] != n or (a.ndim != 1 and not batched):
        raise ValueError(f"{name} must have shape {'(..., ' if batched else '('}{n},), one per particle, "
                         f"got {tuple(a.shape)}")
    check_finite(a, name)
    if bool((a <= 0).any()):
        raise ValueError(f"{name} must be positive (a particle of weight 0 is not in the measure; drop it)")
    worst = float((a.detach().sum(-1) - 1).abs().max())
    if worst > (1e-10 if a.dtype == torch.float64 else 1e-5):
        raise ValueError(f"{name} must sum to 1 (a probability measure), got sums off by up to {worst:.3g}")
    return a


def dense_limit(dtype: torch.dtype) -> int:
    """Largest ``n`` for which an ``n x n`` matrix of ``dtype`` stays under the dense budget."""
    itemsize = torch.finfo(dtype).bits // 8
    return int(math.isqrt(DENSE_BYTES_LIMIT // itemsize))


@dataclass(frozen=True, repr=False)
class FieldEvaluation(Summarized):
    """One evaluation of the field: velocity plus what the monitors need (torch tensors).

    Its ``repr`` states the shapes, the Sinkhorn iterations and convergence and the marginal
    errors, never the tensors.
    """

    velocity: torch.Tensor
    attention: torch.Tensor | None  # the n x n matrix, None when evaluated block-wise
    g: torch.Tensor | None  # Sinkhorn column potential (for warm starts)
    n_iter: int
    converged: bool
    row_error: float
    column_error: float

    def _facts(self):
        head = f"velocity {shape_text(self.velocity.shape)}, {describe_array(self.velocity)}"
        attention = "not formed (block-wise)" if self.attention is None else shape_text(self.attention.shape)
        return head, [[("attention", attention), ("n_iter", str(self.n_iter)),
                       ("converged", str(bool(self.converged)))],
                      [("row error", number(self.row_error) if math.isfinite(self.row_error) else "not measured"),
                       ("column error",
                        number(self.column_error) if math.isfinite(self.column_error) else "not measured")]]


def attention_field(x: torch.Tensor, attention, W: torch.Tensor | None, W_V: torch.Tensor | None, *,
                    n_iter=None, weights: torch.Tensor | None = None, temperature: float = 1.0,
                    init_g: torch.Tensor | None = None, tol: float = 1e-10, max_iter: int = 20_000,
                    chunked: bool = False, need_errors: bool = False, landmarks=None,
                    mask: torch.Tensor | None = None, symmetric: bool = False) -> FieldEvaluation:
    """Evaluate :math:`T(x_i) = \\sum_j K_{ij} W_V x_j` on torch tensors (internal building block).

    ``attention`` is a name or :class:`sinkflow.attention.AttentionVariant`. ``W`` and
    ``W_V`` are ``(d, d)`` tensors (``None`` = identity); inputs are assumed validated (see
    :func:`sinkflow.simulate` for the checked public entry point). ``weights=None`` means
    uniform. ``landmarks`` (a count or index tensor) selects the ``O(n m)`` approximation
    of :mod:`sinkflow.particles`. Differentiable by autograd in the dense mode. ``mask`` (boolean
    ``(n, n)``, ``True`` = particle ``i`` attends to ``j``; :func:`sinkflow.particles.causal_mask`)
    restricts the attention, dense mode only; Sinkhorn then targets the key marginals of uniform
    attention under the mask, weighted by the particles' masses (docs/theory/causal.md). ``symmetric``
    says that ``W`` is symmetric positive semi-definite (None counts): the dense unmasked Sinkhorn
    field is then solved by :mod:`sinkflow.attention._symmetric_sinkhorn` (one exponential pass).
    """
    with transform_entry(x, W, W_V, weights, init_g, mask):
        grad = torch.is_grad_enabled() and (x.requires_grad or (W is not None and W.requires_grad))
        evaluate = field_evaluator(x, attention, W, W_V, n_iter=n_iter, weights=weights, temperature=temperature,
                                   tol=tol, max_iter=max_iter, chunked=chunked, need_errors=need_errors,
                                   landmarks=landmarks, mask=mask, symmetric=symmetric, grad=grad)
        return evaluate(x, init_g)


def field_evaluator(like: torch.Tensor, attention, W, W_V, *, n_iter, weights, temperature, tol, max_iter, chunked,
                    need_errors, landmarks, mask, symmetric, grad: bool) -> Callable[..., FieldEvaluation]:
    """:func:`attention_field` with its path chosen once: ``evaluate(x, init_g) -> FieldEvaluation`` for states
    ``x`` of ``like``'s shape, dtype and device (a flow's every step), whose settings (the variant, the checks, the
    solver, the weights' logarithm) were resolved here. ``grad``: whether the states or the matrices carry an
    autograd graph (the symmetric solver does not differentiate)."""
    variant = _checked_variant(attention, landmarks, chunked, mask)
    if landmarks is not None:
        return lambda x, init_g: _landmark_field(x, _values(x, W_V), variant, W, n_iter, weights, temperature, init_g,
                                                 tol, max_iter, landmarks)
    if chunked:
        return lambda x, init_g: _blockwise_field(x, _values(x, W_V), variant, W, n_iter, weights, temperature, init_g,
                                                  tol, max_iter)
    # n_iter=1 is SoftMax
    if (symmetric and mask is None and variant.solver == "sinkhorn" and n_iter != 1 and not grad
            and like.dtype in (torch.float32, torch.float64)):
        return _symmetric_evaluator(like, variant, W, W_V, n_iter, weights, temperature, tol, max_iter, need_errors)
    return _DenseEvaluator(like, variant, W, W_V, n_iter, weights, temperature, tol, max_iter, need_errors, mask)


def _checked_variant(attention, landmarks, chunked, mask):
    """The variant of ``attention``, refused where the asked evaluation cannot take it."""
    variant = get_attention(attention)
    if mask is not None and (landmarks is not None or chunked):
        raise ValueError("a masked (causal) flow is evaluated densely: pass chunked=False and no landmarks")
    if landmarks is None and variant.approximates is not None:
        raise ValueError(f"attention {variant.name!r} approximates {variant.approximates!r} with landmarks; pass "
                         "landmarks=m")
    if landmarks is None and not chunked and variant.normalize is None:
        raise ValueError(f"attention {variant.name!r} was registered with heads only (for models); register a "
                         "normalize(scores, n_iter, mask) to use it on particles")
    return variant


def _values(x, W_V):
    return x if W_V is None else x @ W_V.mT


def _scores(like, kind: str, W, tau: float):
    """The scores :math:`C = x W x^T / \\tau` of a state ``x`` like ``like`` as one function: for dot scores of
    one system or a flat batch the temperature scales the product inside it (``addmm`` / ``baddbmm`` with
    ``alpha = 1 / tau``, no pass over the ``n x n`` scores of its own); Gaussian scores and other batch
    shapes through :func:`~sinkflow.attention._scores.gaussian_core` / :func:`~sinkflow.attention._scores.dot_core`."""
    if kind == "gaussian":
        return lambda x: gaussian_core(x, x, W, tau)
    if like.ndim not in (2, 3):
        return lambda x: dot_core(x, x, W, tau)
    product, zero, alpha = torch.addmm if like.ndim == 2 else torch.baddbmm, like.new_zeros(()), 1.0 / tau
    if W is None:
        return lambda x: product(zero, x, x.mT, beta=0, alpha=alpha)
    return lambda x: product(zero, x @ W, x.mT, beta=0, alpha=alpha)


def _symmetric_evaluator(like, variant, W, W_V, n_iter, weights, temperature, tol, max_iter, need_errors):
    """The Sinkhorn field of a symmetric PSD problem: one small CPU system in numpy where it converges there
    (:func:`_small_symmetric_field`), else :func:`_symmetric_field`."""
    core = gaussian_core if variant.scores == "gaussian" else dot_core
    small = like.ndim == 2 and like.device.type == "cpu" and like.shape[0] <= NUMPY_N

    def evaluate(x, init_g):
        V = _values(x, W_V)
        if small:
            ev = _small_symmetric_field(_numpy_scores(x, W, temperature, variant.scores), V, n_iter, weights, init_g,
                                        tol, max_iter, need_errors)
            if ev is not None:
                return ev
        return _symmetric_field(core(x, x, W, float(temperature)), V, n_iter, weights, init_g, tol, max_iter,
                                need_errors)

    return evaluate


class _DenseEvaluator:
    """The dense field through the variant's ``normalize`` (SoftMax of dot or Gaussian scores straight through
    ``torch.softmax``); the kernel :math:`a_j e^{C_{ij}}` takes the weights' logarithm, computed once."""

    def __init__(self, like, variant, W, W_V, n_iter, weights, temperature, tol, max_iter, need_errors, mask):
        self.scores = _scores(like, variant.scores, W, float(temperature))
        self.W_V, self.weights, self.mask = W_V, weights, mask
        self.options = dict(n_iter=n_iter, mask=mask, weights=weights, tol=tol, max_iter=max_iter)
        self.normalize = variant.normalize
        self.row = variant.solver == "row" and mask is None  # sinkflow's own SoftMax: torch's fused kernel
        self.log_a = None
        if weights is not None or not variant.normalized:
            a = weights if weights is not None else torch.full(like.shape[-2:-1], 1.0 / like.shape[-2],
                                                               dtype=like.dtype, device=like.device)
            self.log_a = torch.log(a)[..., None, :]  # kernel a_j e^{C_ij}
        self.errors = need_errors

    def __call__(self, x, init_g) -> FieldEvaluation:
        V = x if self.W_V is None else x @ self.W_V.mT
        C = self.scores(x) if self.log_a is None else self.scores(x) + self.log_a
        if self.row:
            K = torch.softmax(C, -1)
            g, count, converged = None, 1, True
        else:
            res = self.normalize(C, init_g=init_g, **self.options)
            K, g, count, converged = res.attention, res.g, res.n_iter, res.converged
        row_err = col_err = math.nan
        if self.errors:
            row_err, col_err = self._errors(K.detach(), x)
        return FieldEvaluation(K @ V, K, g, count, converged, row_err, col_err)

    def velocity(self, x):
        """The velocity alone, the solve from zero potentials (the lean steps of
        :meth:`~sinkflow.fields.ParticleField.euler_stepper`: no evaluation to report)."""
        V = x if self.W_V is None else x @ self.W_V.mT
        C = self.scores(x) if self.log_a is None else self.scores(x) + self.log_a
        K = torch.softmax(C, -1) if self.row else self.normalize(C, init_g=None, **self.options).attention
        return K @ V

    def _errors(self, K, x):
        if self.mask is None:
            return _errors(K, self.weights)
        err = marginal_errors(K, self.weights, key_targets(self.mask, self.weights, x))
        return float(err.row), float(err.column)


def _errors(K, a):
    """Row and column marginal errors: floats for one system, tensors per system for a batch."""
    err = marginal_errors(K, a, a)
    return (float(err.row), float(err.column)) if err.row.ndim == 0 else (err.row, err.column)


def _symmetric_field(C, V, n_iter, weights, init_g, tol, max_iter, need_errors) -> FieldEvaluation:
    """The Sinkhorn field of a symmetric PSD problem (weights enter as marginals, not in the scores).

    Systems the symmetric solver leaves above ``tol`` (it gives up after ``SYMMETRIC_BUDGET``
    iterations) are solved again, each alone, by :func:`sinkflow.solve_sinkhorn`.
    """
    n = C.shape[-1]
    a = weights if weights is not None else torch.full((n,), 1.0 / n, dtype=C.dtype, device=C.device)
    if n_iter is None:
        res = solve_symmetric(C, a, init_g, tol, min(max_iter, SYMMETRIC_BUDGET))
        K, g, count, converged = res.attention, res.g, res.iterations, res.converged
        if not bool(converged.all()):
            K, g, count, converged = _general_fallback(C, a, tol, max_iter, K, g, count, converged)
        count, converged = (int(count), bool(converged)) if count.ndim == 0 else (count, converged)
    else:
        (K, g), count, converged = fixed_symmetric(C, a, int(n_iter), init_g), int(n_iter), True
    row_err, col_err = _errors(K, a) if need_errors else (math.nan, math.nan)
    return FieldEvaluation(K @ V, K, g, count, converged, row_err, col_err)


def _numpy_scores(x, W, temperature, scores):
    """The scores of one CPU system as a numpy array: dot scores computed in numpy (the flow validated
    ``x``; torch's product costs ~20 us at n = 16), Gaussian ones in torch."""
    if scores == "gaussian":
        return gaussian_core(x.detach(), x.detach(), None if W is None else W.detach(), float(temperature)).numpy()
    X = x.detach().numpy()
    C = (X if W is None else X @ W.detach().numpy()) @ X.T
    return C if temperature == 1.0 else C / temperature


def _small_symmetric_field(Cn, V, n_iter, weights, init_g, tol, max_iter, need_errors) -> FieldEvaluation | None:
    """:func:`_symmetric_field` of one small CPU system, from numpy scores ``Cn`` to velocity in numpy
    (torch's per-call overhead is several times numpy's at this size, and a particle step is a few
    dozen calls): the same operators on numpy arrays. None where the general solver has to finish (left
    to :func:`_symmetric_field`), or when :func:`sinkflow.fast_paths` are off."""
    if not fast_paths_enabled():
        return None
    n = Cn.shape[-1]
    a = np.full(n, 1.0 / n, dtype=Cn.dtype) if weights is None else weights.detach().numpy()
    g0 = None if init_g is None else init_g.detach().numpy()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a blown-up system: not converged
        if n_iter is None:
            E, half = _kernel(Cn)
            op, report = solve_kernel(E, half, a, g0, tol, min(max_iter, SYMMETRIC_BUDGET))
            if not report.converged:
                return None
            K, g, count = E * (op.u / op.s[:, None]), op.w - half, int(op.systems.iterations)
        else:
            (K, g), count = fixed_count(Cn, a, g0, int(n_iter)), int(n_iter)
    velocity = torch.from_numpy(K @ V.numpy()) if not V.requires_grad else torch.from_numpy(K) @ V
    K, g = torch.from_numpy(K), torch.from_numpy(g)
    row_err = col_err = math.nan
    if need_errors:
        row_err, col_err = _errors(K, weights if weights is not None else torch.from_numpy(a))
    return FieldEvaluation(velocity, K, g, count, True, row_err, col_err)


def _general_fallback(C, a, tol, max_iter, K, g, count, converged):
    """Re-solve the unconverged systems of a symmetric batch with the general solver, one by one."""
    K, g, count, converged = K.clone(), g.clone(), count.clone(), converged.clone()
    flat = (K.view(-1, *K.shape[-2:]), g.view(-1, g.shape[-1]), count.view(-1), converged.view(-1))
    Cf, af = C.reshape(-1, *C.shape[-2:]), a.expand(C.shape[:-1]).reshape(-1, C.shape[-1])
    for i in torch.nonzero(~flat[3]).flatten().tolist():
        res = solve_sinkhorn(Cf[i], None, tol, max_iter, a=af[i], b=af[i], warn=False)
        flat[0][i], flat[1][i] = res.attention, res.g
        flat[2][i] += res.n_iter
        flat[3][i] = res.converged
    return K, g, count, converged


def _blockwise_field(x, V, variant, W, n_iter, weights, temperature, init_g, tol, max_iter) -> FieldEvaluation:
    if variant.normalization is None:
        raise ValueError(f"attention {variant.name!r} has no block-wise evaluation (only a dense normalize); "
                         "use chunked=False or landmarks")
    r = lazy_attention_field(x, V, W=W, normalization=variant.normalization, scores=variant.scores, n_iter=n_iter,
                             init_g=init_g, temperature=temperature, weights=weights, tol=tol, max_iter=max_iter)
    g = r.g if variant.normalization == "sinkhorn" else None
    return FieldEvaluation(r.velocity, None, g, r.n_iter, r.converged, r.row_error, r.column_error)


def _landmark_field(x, V, variant, W, n_iter, weights, temperature, init_g, tol, max_iter,
                    landmarks) -> FieldEvaluation:
    if variant.landmark_method is None:
        raise ValueError(f"attention {variant.name!r} has no landmark approximation; drop landmarks")
    out_dtype = x.dtype  # float16 / bfloat16 are computed in float32 (eigh, pinv), returned in their dtype
    x, V, W, weights, init_g = lift_half(x, V, W, weights, init_g)
    r = lowrank_attention_field(x, V, landmarks, normalization=variant.normalization, scores=variant.scores,
                                method=variant.landmark_method, W=W, temperature=temperature, weights=weights,
                                n_iter=n_iter, tol=tol, max_iter=max_iter, init_g=init_g)
    return FieldEvaluation(r.velocity.to(out_dtype), None, r.g, r.n_iter, r.converged, r.row_error, r.column_error)
