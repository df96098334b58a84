"""The attention field of one run as a callable on positions (:class:`ParticleField`, in R^d or on
the sphere), with the warm start of its Sinkhorn potentials from one evaluation to the next."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sinkflow._backend import fast_paths_enabled, storage_free, transform_entry
from sinkflow.attention._variants import get_attention
from sinkflow.fields._dense_fields import field_evaluator

__all__ = ["ParticleField"]


@dataclass
class ParticleField:
    """The velocity field of one simulation: an attention variant and its options.

    ``velocity(Y)`` returns the (tangent) velocity and the :class:`~sinkflow.particles.FieldEvaluation`;
    Sinkhorn potentials are carried from one evaluation to the next when ``warm_start``.
    :func:`sinkflow.simulate` builds one per run from its checked arguments; the fields mirror
    its options (``W = W_Q^T W_K``, ``sphere`` for ``manifold="sphere"``, ``need_errors`` for the
    ``"marginal_errors"`` monitor, ``symmetric`` when ``W`` is symmetric positive semi-definite,
    ``stages`` the field evaluations per integrator step, whose potentials ``history`` keeps per
    stage for the warm start). ``Y`` may be a batch of systems ``(B, n, d)`` (ensembles).
    ``retract(Y)`` maps a state back to the manifold
    (renormalization on the sphere, the identity in Euclidean space).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.particles import ParticleField, default_tol
    >>> field = ParticleField("sinkhorn", W=None, W_V=None, n_iter=None, weights=None, temperature=1.0,
    ...                       tol=default_tol(torch.float64), max_iter=1000, chunked=False, landmarks=None,
    ...                       warm_start=True, sphere=False, need_errors=True)
    >>> X = torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> v, ev = field.velocity(X)
    >>> v.shape, ev.converged, ev.column_error < 1e-9, field.g is not None   # g: kept for the next call
    (torch.Size([6, 2]), True, True, True)
    >>> bool(torch.allclose(v.mean(0), X.mean(0)))   # doubly stochastic: the mean is kept
    True
    """

    attention: Any
    W: torch.Tensor | None
    W_V: torch.Tensor | None
    n_iter: int | None
    weights: torch.Tensor | None
    temperature: float
    tol: float
    max_iter: int
    chunked: bool
    landmarks: Any
    warm_start: bool
    sphere: bool
    need_errors: bool
    g: torch.Tensor | None = None
    mask: torch.Tensor | None = None  # (n, n) boolean, True = i attends to j (causal flows)
    symmetric: bool = False
    stages: int = 1
    history: dict = field(default_factory=dict)
    calls: int = 0

    #: The evaluation ``(Y, init_g) -> FieldEvaluation``, chosen at the first call (:meth:`evaluate`).
    _evaluator = None
    #: Whether an evaluation starts from and updates a carried potential: None until :meth:`evaluate` chose
    #: the evaluation, then False where none is ever carried (no ``warm_start``, or SoftMax and ``e^C``).
    _carries = None
    #: Whether the chosen evaluation runs on plain tensors: no autograd graph, no ``torch.func`` transform.
    _plain = False

    def velocity(self, Y: torch.Tensor):
        if self._carries is False:
            self.calls += 1
            ev = self.evaluate(Y, None)
        else:
            ev = self._carried_evaluation(Y)
        return self.tangent(ev.velocity, Y) if self.sphere else ev.velocity, ev

    def _carried_evaluation(self, Y: torch.Tensor):
        """The evaluation at ``Y`` started from the carried potential (:meth:`_start`), which it then updates."""
        stage = self.calls % self.stages
        self.calls += 1
        extrapolate = self.symmetric and self.n_iter is None and self.warm_start
        half = self._half_norms(Y) if extrapolate and stage in self.history else None  # none for SoftMax
        ev = self.evaluate(Y, self._start(stage, half))
        if ev.g is not None and self.warm_start:
            self.g = ev.g.detach()
            if extrapolate:
                half = self._half_norms(Y) if half is None else half
                self.history[stage] = _appended(self.history.get(stage), self.g, half)
        return ev

    def tangent(self, v: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """``v`` projected on the tangent spaces of the sphere at ``Y``: :math:`(I - y y^T) v`."""
        return tangent(v, Y)

    def evaluate(self, Y: torch.Tensor, init_g: torch.Tensor | None):
        """The :class:`~sinkflow.particles.FieldEvaluation` at ``Y`` (before any projection), the
        Sinkhorn solve started from ``init_g``.

        The path (the variant's solver, the checks, whether gradients are tracked, whether a
        ``torch.func`` transform wraps the inputs) is chosen at the first call, from this field's
        options and ``Y``'s shape, dtype and device, and kept for the run's every later step.
        """
        evaluator = self._evaluator
        if evaluator is None:
            evaluator = self._evaluator = self._choose_evaluator(Y)
        return evaluator(Y, init_g)

    def _choose_evaluator(self, Y: torch.Tensor):
        tensors = (Y, self.W, self.W_V, self.weights, self.mask)
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
        evaluate = field_evaluator(Y, self.attention, self.W, self.W_V, n_iter=self.n_iter, weights=self.weights,
                                   temperature=self.temperature, tol=self.tol, max_iter=self.max_iter,
                                   chunked=self.chunked, need_errors=self.need_errors, landmarks=self.landmarks,
                                   mask=self.mask, symmetric=self.symmetric, grad=grad)
        self._carries = self.warm_start and get_attention(self.attention).solver not in ("row", "none")
        transformed_inputs = storage_free(*tensors)
        self._plain = not (grad or transformed_inputs)
        if not transformed_inputs:
            return evaluate

        def transformed(Y, init_g):  # inputs wrapped by a torch.func transform: attention_field's entry, each call
            with transform_entry(Y, self.W, self.W_V, self.weights, init_g, self.mask):
                return evaluate(Y, init_g)

        return transformed

    def _half_norms(self, Y: torch.Tensor):
        r"""Half the diagonal of the scores, :math:`m_i / 2 = y_i^T W y_i / (2\tau)` (numpy for a CPU
        float tensor, as in :meth:`_start`)."""
        Y, W = Y.detach(), None if self.W is None else self.W.detach()
        if Y.device.type == "cpu" and Y.dtype in (torch.float32, torch.float64) and fast_paths_enabled():
            Y, W = Y.numpy(), None if W is None else W.numpy()
        WY = Y if W is None else Y @ W.swapaxes(-1, -2)
        return (WY * Y).sum(-1) * (0.5 / self.temperature)

    def _start(self, stage: int, half=None):
        r"""The warm start: the last potential, or, for a symmetric solve to tolerance, the
        extrapolation of this stage's last potentials :math:`w = g + m/2` (``half``: :math:`m/2` now,
        :meth:`_half_norms`; the symmetric problem's :math:`w` has no gauge and, unlike ``g``, does
        not carry the fast change of :math:`m_i = y_i^T W y_i / \tau` as particles spread in
        :math:`R^d`) by the polynomial through them: of degree 5 from six past potentials, an
        error :math:`O(h^6)` after which one Newton step reaches 1e-10 (measured in R^2 at
        n = 16-256, temperature 0.2, h = 0.05: 1e-11 where the quadratic extrapolation of ``g``
        left 1e-9 and needed a second step; from the ensembles' standard-normal starts in R^2,
        2,048 systems of n = 32, about 3e-6, still one Newton step)."""
        if not self.warm_start:
            return None
        past = self.history.get(stage)
        if half is None or past is None:
            return self.g
        w = _extrapolated(past)
        return torch.from_numpy(w - half) if isinstance(half, np.ndarray) else w - half

    def retract(self, Y: torch.Tensor) -> torch.Tensor:
        return Y / torch.linalg.vector_norm(Y, dim=-1, keepdim=True) if self.sphere else Y

    def euler_stepper(self, h):
        """The Euler step reduced to its tensor operations: ``step(X, out)`` writes ``retract(X + h v(X))`` into
        ``out`` (a new tensor for None) and returns it, the velocity projected on the sphere's tangent spaces.

        For the steps of a run after its first (which chose the evaluation, :meth:`evaluate`); None where a step
        is more than that: a potential carried from one evaluation to the next, an autograd graph or a
        ``torch.func`` transform, a subclass's own velocity or step, a tensor ``h``.

        Examples
        --------
        >>> import torch
        >>> from sinkflow.particles import ParticleField, euler_step
        >>> field = ParticleField("softmax", W=None, W_V=None, n_iter=None, weights=None, temperature=1.0,
        ...                       tol=1e-10, max_iter=1000, chunked=False, landmarks=None, warm_start=False,
        ...                       sphere=True, need_errors=False)
        >>> X = torch.nn.functional.normalize(torch.randn(5, 3, dtype=torch.float64), dim=1)
        >>> Y, _ = euler_step(field, X, 0.1)           # the first step chooses the evaluation
        >>> step = field.euler_stepper(0.1)
        >>> bool(torch.equal(step(X, None), Y))         # the same step, its operations only
        True
        """
        if type(self) is not ParticleField or self._carries is not False or not self._plain or type(h) is not float:
            return None
        evaluator = self._evaluator
        velocity = getattr(evaluator, "velocity", None) or (lambda x: evaluator(x, None).velocity)
        if not self.sphere:
            return lambda X, out: torch.add(X, velocity(X), alpha=h, out=out)

        def step(X, out):
            Y = torch.add(X, tangent(velocity(X), X), alpha=h)
            return torch.div(Y, torch.linalg.vector_norm(Y, dim=-1, keepdim=True), out=out)

        return step

    def moved(self, X: torch.Tensor, v: torch.Tensor, h) -> torch.Tensor:
        """``retract(X + h v)``: a step of size ``h`` (a float, or a tensor broadcasting against ``X``) along ``v``."""
        return self.retract(advanced(X, v, h))


def tangent(v: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """:math:`v - \\langle v, y\\rangle y` row by row (the tangent part on the unit sphere), in two operations."""
    return torch.addcmul(v, (v * Y).sum(-1, keepdim=True), Y, value=-1)


def advanced(X: torch.Tensor, v: torch.Tensor, h) -> torch.Tensor:
    """``X + h v`` in one operation for a float ``h`` (a tensor ``h`` broadcasts)."""
    return torch.add(X, v, alpha=h) if isinstance(h, float) else X + h * v


#: Past potentials a warm start extrapolates from (a polynomial of degree ``EXTRAPOLATED - 1``).
EXTRAPOLATED = 6

#: Coefficients of the polynomial extrapolation through the last ``k`` equally spaced values, oldest
#: first: :math:`p(t_{k}) = \sum_j (-1)^{k-1-j} \binom{k}{j} v_j` (the ``k``-th difference vanishes).
_EXTRAPOLATION = {k: np.array([(-1) ** (k - 1 - j) * math.comb(k, j) for j in range(k)], dtype=float)
                  for k in range(1, EXTRAPOLATED + 1)}


def _appended(past, g, half):
    """The potentials ``past`` (stacked along a first dimension, oldest first, at most ``EXTRAPOLATED``)
    with ``w = g + half`` appended (numpy when ``half`` is)."""
    w = (g.numpy() + half)[None] if isinstance(half, np.ndarray) else (g + half)[None]
    if past is None:
        return w
    past = past[1:] if len(past) == EXTRAPOLATED else past
    return np.concatenate((past, w)) if isinstance(w, np.ndarray) else torch.cat((past, w))


def _extrapolated(past):
    """The polynomial extrapolation one step ahead of the equally spaced values ``past[0], past[1], ...``."""
    coefficients = _EXTRAPOLATION[len(past)]
    if isinstance(past, np.ndarray):
        return (coefficients.astype(past.dtype, copy=False) @ past.reshape(len(past), -1)).reshape(past.shape[1:])
    coefficients = torch.as_tensor(coefficients, dtype=past.dtype, device=past.device)
    return torch.tensordot(coefficients, past, 1)
