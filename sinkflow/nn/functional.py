"""Attention on per-head tensors, as functions: scores, the normalization of a registered
variant, the output (:func:`scaled_attention`, through fused passes when the weights are not
needed), and the registry of output-only normalizations for models.

Conventions as in :mod:`sinkflow.nn.attention`: boolean masks ``True = admissible``, float
masks an additive ``bias`` on the scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from sinkflow._backend import branch_free, check_number, finite_or_nan, transform_entry, transformed
from sinkflow.attention._implicit import check_backward
from sinkflow.attention._normalizations import solve_sinkhorn
from sinkflow.attention._scores import dot_scores, gaussian_scores
from sinkflow.attention._variants import available_attentions, compute_dtype, get_attention, register_attention
from sinkflow.nn._factored_sinkhorn import sinkhorn_attention
from sinkflow.nn._float_mask import split_bias as _split_bias
from sinkflow.nn._fused import fused_output, fused_preferred

__all__ = ["attention_weights", "available_normalizations", "register_normalization", "scaled_attention"]


def attention_weights(q: torch.Tensor, k: torch.Tensor, normalization: str = "softmax", *,
                      n_iter: int = 3, mask: torch.Tensor | None = None,
                      bias: torch.Tensor | None = None, tol: float | None = None, max_iter: int = 20_000,
                      backward: str = "unrolled") -> torch.Tensor:
    r"""Attention matrix of queries ``q`` and keys ``k`` for a weight-producing normalization.

    Parameters
    ----------
    q : torch.Tensor, shape (..., n, p)
    k : torch.Tensor, shape (..., m, p)
    normalization : str or AttentionVariant
        A variant that forms the matrix: ``"softmax"``, ``"sinkhorn"``, ``"gaussian"``,
        ``"unnormalized"`` or one registered with a ``normalize``.
    n_iter : int
        Sinkhorn half-iterations (ignored by the others, and by Sinkhorn when ``tol`` is given).
    mask : bool tensor broadcastable to (..., n, m), optional
        ``True`` where query ``i`` may attend to key ``j``.
    bias : float tensor broadcastable to (..., n, m), optional
        Added to the scores (the log-kernel) before the normalization, as torch's float
        ``attn_mask``; see :func:`scaled_attention` for ``-inf`` and underflowing entries.
    tol, max_iter, backward
        Sinkhorn to tolerance and its gradients; see :func:`scaled_attention`.

    Returns
    -------
    K : torch.Tensor, shape (..., n, m), float32 (float64 for float64 inputs)
        Masked entries are exactly 0.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn import attention_weights
    >>> q = k = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0))
    >>> K = attention_weights(q, k, "sinkhorn", n_iter=41)
    >>> bool(torch.allclose(K.sum(-2), torch.ones(2, 5), atol=1e-4))
    True
    """
    variant = get_attention(normalization)
    if variant.normalize is None:
        raise ValueError(f"attention_weights needs a variant that forms the matrix; {variant.name!r} is output-only")
    solve = solve_options(variant, tol, max_iter, backward)
    with transform_entry(q, k, mask, bias):
        q, k = check_inputs((q, k), ("q", "k"))
        mask, bias = _split_bias(variant, mask, bias, compute_dtype(q, k))
        return _weights(q, k, variant, n_iter, mask, bias, solve)


def solve_options(variant, tol, max_iter, backward):
    """``(tol, max_iter, backward)`` of a Sinkhorn run to tolerance, or None for the fixed ``n_iter``: checked
    here, at the entry (ValueError naming the argument; only Sinkhorn normalizations take them)."""
    check_backward(backward)
    check_number(max_iter, "max_iter", integer=True, positive=True)
    if tol is None and backward == "unrolled":
        return None
    if variant.solver != "sinkhorn":
        what = f"tol={tol!r}" if tol is not None else f"backward={backward!r}"
        raise ValueError(f"tol and backward apply to Sinkhorn normalization only, got {what} with normalization "
                         f"{variant.name!r}; pass tol=None and backward='unrolled'")
    if tol is None:
        raise ValueError(f"backward={backward!r} differentiates the converged Sinkhorn map: give tol (a run to "
                         "tolerance), or keep backward='unrolled' with a fixed n_iter")
    tol = check_number(tol, "tol", positive=True)
    return float(tol), int(max_iter), backward


def _weights(q, k, variant, n_iter, mask, bias, solve=None):
    with torch.autocast(device_type=q.device.type, enabled=False):
        scores = _scores(q, k, variant, bias)
        if solve is not None:  # to tolerance: the solver (epsilon scaling, Newton; implicit gradients)
            return _to_tolerance(scores, mask, *solve)
        if variant.solver == "sinkhorn":  # the training hot path (not a user's callable)
            return sinkhorn_attention(scores, n_iter, mask)  # factored fast path, the solver otherwise
        return variant.normalize(scores, n_iter=n_iter, mask=mask).attention


@torch.compiler.disable  # a data-dependent loop: one graph break rather than a recompilation per error read
def _to_tolerance(scores, mask, tol, max_iter, backward):
    return solve_sinkhorn(scores, None, tol, max_iter, mask=mask, backward=backward).attention


def _scores(q, k, variant, bias=None):
    """Scores of a variant in float32 (float64 for float64 inputs), plus ``bias``; call with autocast disabled."""
    dtype = compute_dtype(q, k)
    q32, k32 = q.to(dtype), k.to(dtype)
    p = q.shape[-1]
    if variant.scores == "gaussian":
        scores = gaussian_scores(q32, k32, temperature=math.sqrt(p))
    else:
        # Scale the (n, p) queries rather than the (n, m) scores: one full-matrix pass less
        # forward and backward; same scores as dot_scores(q, k, temperature=sqrt(p)) up to rounding.
        scores = dot_scores(q32 * (1.0 / math.sqrt(p)), k32)
    return scores if bias is None else scores + bias


def available_normalizations() -> tuple[str, ...]:
    """Names accepted by :class:`MultiheadAttention`: the variants of :mod:`sinkflow.attention`.

    Examples
    --------
    >>> from sinkflow.nn import available_normalizations
    >>> available_normalizations()[:6]
    ('softmax', 'sinkhorn', 'unnormalized', 'gaussian', 'skyformer', 'nystromformer')
    """
    return available_attentions()


def register_normalization(name: str, fn: Callable, *, overwrite: bool = False) -> None:
    """Add an attention normalization that computes the output directly (e.g. Nyström).

    ``fn(q, k, v, mask, n_iter) -> output`` on per-head tensors ``q (..., n, p)``,
    ``k (..., m, p)``, ``v (..., m, p_v)`` with ``mask`` (``True = admissible``, broadcastable
    to ``(..., n, m)``) or None; it returns ``(..., n, p_v)``. Such normalizations return no
    attention matrix (``need_weights`` gives None and trackers skip them).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn import register_normalization, MultiheadAttention
    >>> register_normalization("mean", lambda q, k, v, mask, n_iter:
    ...                        v.mean(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1]))
    >>> x = torch.ones(1, 3, 8)
    >>> out, w = MultiheadAttention(8, 2, batch_first=True, normalization="mean")(x, x, x)
    >>> out.shape, w is None
    (torch.Size([1, 3, 8]), True)
    """
    if not callable(fn):
        raise TypeError("fn must be callable: fn(q, k, v, mask, n_iter) -> output")

    def heads(q, k, v, mask, n_iter, landmarks):
        return fn(q, k, v, mask, n_iter)

    register_attention(name, heads=heads, overwrite=overwrite)


def _empty_attention(q, k, v, need_weights):
    """Attention of an empty sequence: an empty matrix, and zeros for queries without keys (torch's result)."""
    dtype = compute_dtype(q, k)
    K = q.to(dtype) @ k.to(dtype).transpose(-1, -2)  # (..., n, m) with no entries
    return (K @ v.to(dtype)).to(v.dtype), (K if need_weights else None)


def check_inputs(tensors, names) -> tuple:
    """ValueError naming the first input that holds NaN or inf, on every path (each tensor checked once);
    returns the tensors, under ``torch.func.vmap`` with each sample that holds NaN or inf all NaN
    (:func:`sinkflow._backend.finite_or_nan`: vmap allows no error for one sample)."""
    out = []
    for i, (t, name) in enumerate(zip(tensors, names, strict=True)):
        j = next((j for j, u in enumerate(tensors[:i]) if t is u), None)
        out.append(finite_or_nan(t, name) if j is None else out[j])
    return tuple(out)


def _model_variant(name):
    try:
        return get_attention(name)
    except ValueError:
        raise ValueError(f"unknown normalization {name!r}; known: {', '.join(available_attentions())}") from None


def scaled_attention(q, k, v, normalization: str = "softmax", *, n_iter: int = 3, mask=None,
                     dropout: float = 0.0, training: bool = False, landmarks: int = 64, need_weights: bool = True,
                     bias=None, tol: float | None = None, max_iter: int = 20_000, backward: str = "unrolled"):
    r"""Per-head attention ``(output, weights)`` for ``q (..., n, p)``, ``k (..., m, p)``, ``v (..., m, p_v)``.

    ``weights`` is the normalized matrix before dropout (None for output-only
    normalizations, and for Sinkhorn when ``need_weights=False``); ``output =
    dropout(weights) @ v`` in the dtype of ``v``. ``landmarks`` is the number of Nyström
    landmarks (``"skyformer"``, ``"nystromformer"``). ``mask`` is boolean (``True`` =
    admissible), broadcastable to ``(..., n, m)``.

    ``bias`` (a float tensor broadcastable to ``(..., n, m)``, torch's additive ``attn_mask``)
    is added to the scores, i.e. to the log-kernel, before every normalization: SoftMax of
    :math:`C + B` (torch's result), Sinkhorn iterations from :math:`e^{C + B}`, the
    kernels :math:`e^{C + B}`. Its ``-inf`` entries are masked entries, exactly as
    ``False`` in ``mask``. A Sinkhorn column step gives every column its mass (:math:`n/m`
    unmasked; under a causal or other mask, that of uniform attention, docs/theory/causal.md)
    whatever a finite bias along it (and the doubly stochastic limit does not see such a
    bias at all), so a finite key-padding bias such as ``-1e9`` would bring a padded key
    back with full weight; hence, for every normalization but SoftMax, an entry whose
    exponential underflows to 0 in the compute dtype (below about -104 in float32, -745 in
    float64: ``-1e9``, ``finfo.min``) is a masked entry too, and a key column masked that
    way is an empty line (scaling 0, marginals as with a boolean mask). Output-only
    normalizations accept no other finite bias (ValueError).

    With ``need_weights=False`` and no dropout, Sinkhorn attention (masked or not) never forms the
    matrix: after ``n_iter`` half-steps it is :math:`\mathrm{diag}(\alpha) S
    \mathrm{diag}(\beta)` with :math:`S` the SoftMax, so the output is
    :math:`\alpha \odot S(\beta \odot v)`, the same numbers to rounding at about the cost
    of SoftMax attention. On CPU it runs fused log-domain passes (O(n p) memory); their
    backward declines cold scores (float32: a spread of the scores past 300, where it would
    lose up to three digits) and recomputes this eager path's gradients instead.

    ``q``, ``k`` or ``v`` holding NaN or inf is refused on every path (ValueError naming it;
    under torch.compile an assertion in the graph, a RuntimeError with the same message).
    Under torch.compile Sinkhorn runs the log-domain steps of :func:`sinkflow.sinkhorn`, not
    the fused passes or the factored path, whose backward and range check choose their
    method from the data (a branch that would break the graph); same numbers to rounding.

    Sinkhorn to tolerance: with ``tol`` (a positive float; ``n_iter`` is then ignored) the matrix
    is :func:`sinkflow.solve_sinkhorn` run until its marginal error is at most ``tol`` within
    ``max_iter`` half-iterations (epsilon scaling, over-relaxation, Newton steps where autograd
    does not follow the steps), with the key marginals of the fixed-``n_iter`` path (a padding
    mask: uniform over the real keys; another mask: uniform attention's); masks, ``bias``,
    dropout and ``need_weights`` as above (the matrix is always formed: no fused pass). A solve
    that does not reach ``tol`` gives the solver's :class:`~sinkflow.attention.SinkhornWarning`.
    ``backward="unrolled"`` differentiates the iterations; ``backward="implicit"`` (needs ``tol``)
    differentiates the first-order conditions at the returned matrix (docs/theory/implicit.md):
    the gradients of the converged map, with saved memory independent of the iteration count.
    The data-dependent stopping loop runs eagerly under torch.compile (one graph break;
    ``fullgraph=True`` refuses it) and is refused by ``torch.func.vmap`` (which asks for a fixed
    ``n_iter``); ``torch.func`` grad, vjp and jvp work. ``tol`` or ``backward="implicit"`` with
    another normalization: ValueError.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn import scaled_attention
    >>> q = k = v = torch.eye(3)[None]
    >>> out, K = scaled_attention(q, k, v, "softmax")
    >>> bool(torch.allclose(out, K))
    True
    >>> fast, none = scaled_attention(q, k, v, "sinkhorn", need_weights=False)
    >>> bool(torch.allclose(fast, scaled_attention(q, k, v, "sinkhorn")[0])), none
    (True, None)
    >>> K = scaled_attention(q, k, v, "sinkhorn", bias=torch.tensor([0.0, -1e9, 0.0]))[1]   # -1e9: key 1 masked
    >>> masked = scaled_attention(q, k, v, "sinkhorn", mask=torch.tensor([True, False, True]))[1]
    >>> float(K[..., 1].max()), torch.equal(K, masked)
    (0.0, True)

    To tolerance, with the gradients of the converged map:

    >>> x = torch.randn(1, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    >>> out, K = scaled_attention(x, x, x, "sinkhorn", tol=1e-10, backward="implicit")
    >>> float((K.detach().sum(-2) - 1).abs().sum()) < 1e-9      # columns too: doubly stochastic
    True
    >>> out.sum().backward()
    """
    variant = _model_variant(normalization)
    solve = solve_options(variant, tol, max_iter, backward)
    with transform_entry(q, k, v, mask, bias):
        return _scaled_attention(q, k, v, variant, n_iter, mask, dropout, training, landmarks, need_weights, bias,
                                 solve)


def _scaled_attention(q, k, v, variant, n_iter, mask, dropout, training, landmarks, need_weights, bias, solve=None):
    q, k, v = check_inputs((q, k, v), ("q", "k", "v"))
    mask, bias = _split_bias(variant, mask, bias, compute_dtype(q, k))
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return _empty_attention(q, k, v, need_weights and variant.normalize is not None)
    if variant.normalize is None:
        return variant.heads(q, k, v, mask, n_iter, landmarks).to(v.dtype), None
    if solve is not None:  # to tolerance: the solver's matrix, then as below (dropout, the product with v)
        K = _weights(q, k, variant, n_iter, mask, bias, solve)
        return _output(K, v, dropout, training), (K if need_weights else None)
    fusable = not need_weights and not (dropout > 0 and training) and (bias is None or not bias.requires_grad)
    kind = fused_preferred(variant, n_iter, q, k) if fusable else None  # a learned float mask: eager (its gradient)
    if kind == "sinkhorn" and branch_free():  # its backward picks its method from the data: the log-domain steps
        kind = None
    if transformed():  # torch.func: no fused kernel (custom autograd Functions, no forward-mode rules)
        kind = None
    if kind is not None:
        return fused_output(kind, q, k, v, n_iter, allowed=mask, bias=bias), None  # no n x m matrix
    if not need_weights and variant.solver == "sinkhorn" and not (dropout > 0 and training):
        with torch.autocast(device_type=q.device.type, enabled=False):
            scores = _scores(q, k, variant, bias)
            out = sinkhorn_attention(scores, n_iter, mask, values=v.to(scores.dtype))
        return out.to(v.dtype), None
    K = _weights(q, k, variant, n_iter, mask, bias)
    return _output(K, v, dropout, training), K


def _output(K, v, dropout, training):
    """``dropout(K) @ v`` in the dtype of ``v``."""
    Kd = F.dropout(K, dropout, training) if dropout > 0 and training else K
    # The product with V may run in autocast precision; the weights were float32.
    if v.dtype in (torch.float16, torch.bfloat16):
        return torch.matmul(Kd.to(v.dtype), v)
    return torch.matmul(Kd, v.to(Kd.dtype)).to(v.dtype)
