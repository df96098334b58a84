r"""One attention interface: every attention variant is defined here, once.

A variant turns a score matrix :math:`C` (``n x m``) into an attention matrix :math:`K`;
where the scores come from is the caller's business:

* particle flows (:func:`sinkflow.simulate`): :math:`C_{ij} = x_i^T W x_j / \tau` (or
  Gaussian scores), plus :math:`\log a_j` for the particle weights;
* the heat-limit layer (:func:`sinkflow.heat_flow`): Gaussian scores
  :math:`-|x_i - x_j|^2 / (2\varepsilon)`;
* models (:class:`sinkflow.nn.MultiheadAttention`): :math:`C = q k^T / \sqrt p`.

Built-in variants

``"softmax"``      rows of :math:`e^C` normalized (:func:`sinkflow.softmax`).
``"sinkhorn"``     ``n_iter`` alternating half-iterations from :math:`e^C`, or the
                   doubly stochastic limit for ``n_iter=None`` (:func:`sinkflow.solve_sinkhorn`).
``"unnormalized"`` :math:`e^C` on dot-product scores.
``"gaussian"``     :math:`e^C` on Gaussian scores (Skyformer's kernel, no normalization).
``"skyformer"``    ``"gaussian"`` approximated by Skyformer's lifted Nyström (landmarks).
``"nystromformer"`` ``"softmax"`` approximated by Nyströmformer's segment means (landmarks).

Each variant also says how it is evaluated without an ``n x n`` matrix: block-wise
(:mod:`sinkflow.particles`, exact) and with ``m`` landmarks (:mod:`sinkflow.particles`,
``O(n m)``). A variant registered with :func:`register_attention` works in the three
callers above without touching sinkflow: its ``normalize(scores, n_iter=..., mask=...)``
receives the dense scores and returns :math:`K`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sinkflow._backend import broadcast_shapes, compiling, require
from sinkflow.attention._log_steps import _masked_softmax
from sinkflow.attention._marginals import uniform_attention_marginal
from sinkflow.attention._normalizations import solve_sinkhorn
from sinkflow.attention._nystrom import nystrom_attention, nystromformer_attention

__all__ = ["Normalized", "AttentionVariant", "register_attention", "get_attention", "available_attentions"]


@dataclass(frozen=True)
class Normalized:
    """An attention matrix and its solver diagnostics (``g``: Sinkhorn column potential)."""

    attention: torch.Tensor
    g: torch.Tensor | None = None
    n_iter: int = 0
    converged: bool = True
    marginal_error: float = 0.0


@dataclass(frozen=True)
class AttentionVariant:
    """One attention variant.

    Attributes
    ----------
    name : str
    normalize : callable or None
        ``normalize(C, *, n_iter, mask, weights, tol, max_iter, init_g) -> Normalized``: the
        dense attention matrix from scores ``C`` (``weights`` are Sinkhorn's marginals).
        None for output-only variants.
    scores : {"dot", "gaussian"}
        The scores a particle flow uses with this variant.
    normalization : {"row", "sinkhorn", "none"} or None
        How :math:`e^C` is normalized, for the block-wise and landmark evaluations (None:
        only the dense ``normalize`` is known).
    landmark_method : {"nystrom", "lifted", "segment_means"} or None
        The landmark approximation a particle flow uses when ``landmarks`` is given.
    approximates : str or None
        For approximation-only variants (Skyformer, Nyströmformer): the exact variant.
    heads : callable or None
        Output-only per-head evaluation for models, ``heads(q, k, v, mask, n_iter, landmarks)``.
    """

    name: str
    normalize: Callable | None
    scores: str = "dot"
    normalization: str | None = None
    landmark_method: str | None = None
    approximates: str | None = None
    heads: Callable | None = None

    @property
    def normalized(self) -> bool:
        """Whether :math:`K` is at least row-normalized (rows sum to 1)."""
        return self.normalization in ("row", "sinkhorn")

    @property
    def solver(self) -> str | None:
        """The normalization sinkflow itself computes for this variant (``"row"``, ``"sinkhorn"`` or
        ``"none"``), or None.

        A variant described by its data (its ``normalization``, as every built-in and a variant
        registered with ``normalization=``) is computed by sinkflow's own solvers, so every evaluation
        applies to it: dense, block-wise, landmarks, the harmonic field, batched ensembles, the fused
        torch passes. A variant given as a callable on dense scores (or output-only) has no solver
        here: it gets the dense path, its own function, never a built-in in its place.
        """
        return self.normalization if self.normalize is not None else None

    @property
    def batched(self) -> bool:
        """Whether an ensemble of its flows runs as one batched tensor flow."""
        return self.solver is not None

    @property
    def harmonic(self) -> bool:
        """Whether its field on the circle and :math:`S^2` has the exact harmonic expansion (SoftMax and
        Sinkhorn of dot-product scores)."""
        return self.solver in ("row", "sinkhorn") and self.scores == "dot"


def _softmax(C, *, n_iter=None, mask=None, weights=None, tol=None, max_iter=None, init_g=None):
    # the callers checked C and mask (a flow's loop, a layer's forward): SoftMax without the public checks
    return Normalized(_masked_softmax(C, mask)[0], None, 1, True)


def _sinkhorn(C, *, n_iter=None, mask=None, weights=None, tol=1e-9, max_iter=20_000, init_g=None):
    # Weighted particles under a mask: the key targets of uniform attention weighted by the masses.
    b = weights if weights is None or mask is None else uniform_attention_marginal(
        torch.broadcast_to(mask, C.shape), weights, weights)
    res = solve_sinkhorn(C, n_iter, tol, max_iter, mask=mask, a=weights, b=b, init_g=init_g, warn=False)
    return Normalized(res.attention, res.g, res.n_iter, res.converged, float(res.marginal_error))


def _exponential(C, *, n_iter=None, mask=None, weights=None, tol=None, max_iter=None, init_g=None):
    K = C.exp()
    return Normalized(K if mask is None else K.masked_fill(~mask, 0.0), None, 0, True)


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 stays float64; every lower precision is lifted to float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _padding_masks(mask, n, m):
    """Split an admissibility mask into query and key padding masks, or refuse.

    A few byte-wise passes over the mask: the rows and columns that hold an admissible entry
    (the queries and keys kept), and the check that every kept row admits every kept key, i.e.
    that the mask is their outer product (it always lies inside it).
    """
    if mask is None:
        return None, None
    mask = torch.broadcast_to(mask, broadcast_shapes(mask.shape, (n, m)))
    u = mask.view(torch.uint8)  # max / min of bytes: far faster than any / all over a boolean axis
    keys = u.amax(-2, keepdim=True)  # (..., 1, m)
    queries = u.amax(-1, keepdim=True)  # (..., n, 1)
    full = torch.maximum(u, 1 - queries).amin(-2, keepdim=True)  # 1 where a key is admitted by every kept query
    require((full >= keys).all(), NotImplementedError,
            "Nyström attention supports key/query padding masks only (no causal or per-pair masks)")
    return queries.bool(), keys.bool()


def _landmarks(q, k, m):
    """Skyformer's ``m`` landmark indices per head, drawn from torch's global RNG (torch.manual_seed reproduces them).

    Eager: through a generator seeded from it; under torch.compile (no generator objects
    there, no reading a seed back), from it directly.
    """
    size = broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (m,)
    points = q.shape[-2] + k.shape[-2]
    if compiling():
        return torch.randint(0, points, size, device=q.device)
    generator = torch.Generator(device=q.device).manual_seed(int(torch.randint(0, 2**62, (1,))))
    return torch.randint(0, points, size, generator=generator, device=q.device)


def _skyformer_heads(q, k, v, mask, n_iter, landmarks):
    """Skyformer's lifted Nyström of the Gaussian-kernel attention, per head (iterative inverse)."""
    dtype = compute_dtype(q, k, v)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q32, k32, v32 = q.to(dtype), k.to(dtype), v.to(dtype)
        queries, keys = _padding_masks(mask, q.shape[-2], k.shape[-2])
        if keys is not None:  # the kernel is not normalized: removing a key = zeroing its value
            v32 = v32 * keys.transpose(-1, -2).to(dtype)
        m = min(int(landmarks), q.shape[-2] + k.shape[-2])
        out = nystrom_attention(q32, k32, v32, _landmarks(q32, k32, m), inverse="iterative")
        if queries is not None:
            out = out * queries.to(dtype)
    return out


def _nystromformer_heads(q, k, v, mask, n_iter, landmarks):
    """Nyströmformer's segment-mean approximation of SoftMax attention, per head."""
    dtype = compute_dtype(q, k, v)
    with torch.autocast(device_type=q.device.type, enabled=False):
        queries, keys = _padding_masks(mask, q.shape[-2], k.shape[-2])
        if keys is not None:
            require(keys.all(), NotImplementedError,
                    "Nyströmformer's segment means cannot exclude padded keys; use 'skyformer' or exact attention")
        m = min(int(landmarks), q.shape[-2], k.shape[-2])
        out = nystromformer_attention(q.to(dtype), k.to(dtype), v.to(dtype), m, inverse="iterative")
        if queries is not None:
            out = out * queries.to(dtype)
    return out


_REGISTRY: dict[str, AttentionVariant] = {}


def _add(variant: AttentionVariant) -> None:
    _REGISTRY[variant.name] = variant


_add(AttentionVariant("softmax", _softmax, "dot", "row", "nystrom"))
_add(AttentionVariant("sinkhorn", _sinkhorn, "dot", "sinkhorn", "nystrom"))
_add(AttentionVariant("unnormalized", _exponential, "dot", "none", "nystrom"))
_add(AttentionVariant("gaussian", _exponential, "gaussian", "none", "lifted"))
_add(AttentionVariant("skyformer", None, "gaussian", "none", "lifted", approximates="gaussian", heads=_skyformer_heads))
_add(AttentionVariant("nystromformer", None, "dot", "row", "segment_means", approximates="softmax",
                      heads=_nystromformer_heads))


def _user_normalize(fn: Callable) -> Callable:
    def normalize(C, *, n_iter=None, mask=None, weights=None, tol=None, max_iter=None, init_g=None):
        K = fn(C, n_iter=n_iter, mask=mask)
        if not isinstance(K, torch.Tensor) or K.shape != C.shape:
            raise ValueError(f"a registered normalize must return a tensor of the scores' shape {tuple(C.shape)}, "
                             f"got {type(K).__name__} {tuple(getattr(K, 'shape', ()))}")
        return Normalized(K)

    normalize.__name__ = getattr(fn, "__name__", "normalize")
    return normalize


#: sinkflow's own normalization of the scores, by the name a variant declares (``normalization=``).
_SOLVERS = {"row": _softmax, "sinkhorn": _sinkhorn, "none": _exponential}


def register_attention(name: str, normalize: Callable | None = None, *, normalization: str | None = None,
                       scores: str = "dot", heads: Callable | None = None,
                       overwrite: bool = False) -> AttentionVariant:
    r"""Add an attention variant, usable by name in particle flows, the heat layer and models.

    Parameters
    ----------
    name : str
    normalize : callable, optional
        ``normalize(C, *, n_iter, mask) -> K``: the attention matrix (same shape as the
        torch scores ``C``; ``mask`` is None or boolean, ``True`` = admissible; ``n_iter`` is
        the caller's iteration count, free to ignore). Differentiable if ``C`` is. A variant given
        this way runs on the dense path only (sinkflow cannot evaluate an arbitrary function
        block-wise, with landmarks or harmonically); ``Trajectory.evaluation`` says so.
    normalization : {"row", "sinkhorn", "none"}, optional
        Instead of ``normalize``: describe the variant by its data, and sinkflow's own solvers
        compute it (SoftMax rows, Sinkhorn, or :math:`e^C` unnormalized, of ``scores``), on every
        evaluation path (block-wise, landmarks, the harmonic field, batched ensembles, fused torch
        passes), as fast as the built-ins.
    scores : {"dot", "gaussian"}
        Scores used by :func:`sinkflow.simulate` with this variant (the heat layer always
        uses Gaussian scores, models always :math:`qk^T/\sqrt p`).
    heads : callable, optional
        Output-only evaluation for models, ``heads(q, k, v, mask, n_iter, landmarks) -> output``
        (no attention matrix; the variant then works in models only unless ``normalize`` is given).
    overwrite : bool
        Replace an existing variant of that name.

    Returns
    -------
    AttentionVariant

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> v = sinkflow.register_attention("sharp_softmax", lambda C, n_iter, mask: sinkflow.softmax(2 * C),
    ...                                 overwrite=True)
    >>> traj = sinkflow.simulate(np.eye(3), "sharp_softmax", h=0.1, steps=2)
    >>> traj.positions.shape, traj.evaluation.name
    ((3, 3, 3), 'dense')
    >>> v = sinkflow.register_attention("gaussian_sinkhorn", normalization="sinkhorn", scores="gaussian",
    ...                                 overwrite=True)   # described by data: every path
    >>> v.solver, sinkflow.simulate(np.eye(3), v, h=0.1, steps=2, chunked=True).evaluation.name
    ('sinkhorn', 'block-wise')
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if normalization is not None:
        if normalization not in _SOLVERS:
            raise ValueError(f"normalization must be one of {tuple(_SOLVERS)}, got {normalization!r}")
        if normalize is not None:
            raise ValueError("give normalize (a callable on dense scores) or normalization (sinkflow's own "
                             "solver), not both")
    elif normalize is None and heads is None:
        raise ValueError("give normalize (scores -> attention matrix), normalization (\"row\", \"sinkhorn\", "
                         "\"none\") or heads (per-head output)")
    for fn, what in ((normalize, "normalize"), (heads, "heads")):
        if fn is not None and not callable(fn):
            raise TypeError(f"{what} must be callable")
    if scores not in ("dot", "gaussian"):
        raise ValueError(f"scores must be 'dot' or 'gaussian', got {scores!r}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"attention {name!r} is already registered (pass overwrite=True to replace it)")
    if normalization is not None:
        variant = AttentionVariant(name, _SOLVERS[normalization], scores, normalization,
                                   "lifted" if scores == "gaussian" else "nystrom", heads=heads)
    else:
        variant = AttentionVariant(name, None if normalize is None else _user_normalize(normalize), scores,
                                   heads=heads)
    _add(variant)
    return variant


def get_attention(name) -> AttentionVariant:
    """The registered variant called ``name`` (an :class:`AttentionVariant` passes through).

    Examples
    --------
    >>> import sinkflow
    >>> sinkflow.get_attention("sinkhorn").normalization
    'sinkhorn'
    """
    if isinstance(name, AttentionVariant):
        return name
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"attention must be one of {tuple(_REGISTRY)} (or a name added with "
                         f"sinkflow.register_attention), got {name!r}") from None


def available_attentions() -> tuple[str, ...]:
    """Names of the registered variants, built-ins first.

    Examples
    --------
    >>> import sinkflow
    >>> sinkflow.available_attentions()[:4]
    ('softmax', 'sinkhorn', 'unnormalized', 'gaussian')
    """
    return tuple(_REGISTRY)
