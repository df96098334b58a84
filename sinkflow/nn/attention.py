r"""Multi-head attention with a pluggable normalization (docs/theory/normalizations.md and docs/theory/nystrom.md).

One module, :class:`MultiheadAttention`, shape-compatible with
``torch.nn.MultiheadAttention`` (``batch_first``, ``key_padding_mask`` with ``True = pad``,
``attn_mask``, ``need_weights``, ``average_attn_weights``), whose attention matrix is
produced by one of

``"softmax"``
    Row-stochastic :math:`K = N_R(\exp C)` with :math:`C = Q K^T/\sqrt p`
    (:func:`sinkflow.softmax`).
``"sinkhorn"``
    ``n_iter`` alternating half-iterations :math:`N_R, N_C, N_R, \dots` of
    :math:`\exp C` (:func:`sinkflow.sinkhorn`, unrolled and differentiable; ``n_iter=1``
    is SoftMax exactly, the Sinkformer convention).
``"gaussian"``
    Skyformer's kernelized attention without normalization,
    :math:`K_{ij} = \exp(-\|q_i - k_j\|^2 / (2\sqrt p))` (:func:`sinkflow.gaussian_scores`
    with temperature :math:`\sqrt p`).

``"skyformer"``
    Skyformer: the Gaussian-kernel attention above approximated by lifted Nyström with
    ``landmarks`` points and the iterative inverse (:func:`sinkflow.nystrom_attention`);
    O(n m) memory, no attention matrix.
``"nystromformer"``
    Nyströmformer's segment-mean approximation of SoftMax attention
    (:func:`sinkflow.nystromformer_attention`); no attention matrix.

The variants are those of :mod:`sinkflow.attention` (also ``"unnormalized"``, :math:`e^C`);
more plug in through :func:`sinkflow.register_attention` (a ``normalize(scores, n_iter,
mask) -> K`` that then also drives particle flows and the heat layer) or
:func:`register_normalization` (an output-only ``(q, k, v, mask, n_iter) -> output`` on
per-head tensors, models only).

Precision: scores and normalization always run in at least float32, with autocast
disabled inside, so bf16/fp16 training keeps Sinkhorn and SoftMax stable; the product
with the values returns to the dtype of ``v``.

Masks: inside this module masks follow sinkflow's convention (``True = admissible``);
the public module converts torch's ``key_padding_mask`` (``True = pad``). Masked keys get
exactly zero weight; a query whose keys are partly masked gets a finite row; a query
with no admissible key gets a zero row and a zero output (never NaN).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.module import _global_forward_hooks

from sinkflow.attention import _sinkhorn as _builtin_sinkhorn
from sinkflow.attention import available_attentions, compute_dtype, get_attention, register_attention
from sinkflow.nn._factored_sinkhorn import sinkhorn_attention
from sinkflow.scores import dot_scores, gaussian_scores

__all__ = [
    "available_normalizations",
    "register_normalization",
    "attention_weights",
    "scaled_attention",
    "AttentionKernel",
    "MultiheadAttention",
]


def attention_weights(q: torch.Tensor, k: torch.Tensor, normalization: str = "softmax", *,
                      n_iter: int = 3, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""Attention matrix of queries ``q`` and keys ``k`` for a weight-producing normalization.

    Parameters
    ----------
    q : torch.Tensor, shape (..., n, p)
    k : torch.Tensor, shape (..., m, p)
    normalization : str or AttentionVariant
        A variant that forms the matrix: ``"softmax"``, ``"sinkhorn"``, ``"gaussian"``,
        ``"unnormalized"`` or one registered with a ``normalize``.
    n_iter : int
        Sinkhorn half-iterations (ignored by the others).
    mask : bool tensor broadcastable to (..., n, m), optional
        ``True`` where query ``i`` may attend to key ``j``.

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
    with torch.autocast(device_type=q.device.type, enabled=False):
        scores = _scores(q, k, variant)
        if variant.normalize is _builtin_sinkhorn:  # the training hot path (not a user's override)
            return sinkhorn_attention(scores, n_iter, mask)  # factored fast path, the solver otherwise
        return variant.normalize(scores, n_iter=n_iter, mask=mask).attention


def _scores(q, k, variant):
    """Scores of a variant in float32 (float64 for float64 inputs); call with autocast disabled."""
    dtype = compute_dtype(q, k)
    q32, k32 = q.to(dtype), k.to(dtype)
    p = q.shape[-1]
    if variant.scores == "gaussian":
        return gaussian_scores(q32, k32, temperature=math.sqrt(p))
    # Scale the (n, p) queries rather than the (n, m) scores: one full-matrix pass less
    # forward and backward; same scores as dot_scores(q, k, temperature=sqrt(p)) up to rounding.
    return dot_scores(q32 * (1.0 / math.sqrt(p)), k32)


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
    >>> register_normalization("mean", lambda q, k, v, mask, n_iter: v.mean(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1]))
    >>> out, w = MultiheadAttention(8, 2, normalization="mean")(torch.ones(1, 3, 8), torch.ones(1, 3, 8), torch.ones(1, 3, 8))
    >>> out.shape, w is None
    (torch.Size([1, 3, 8]), True)
    """
    if not callable(fn):
        raise TypeError("fn must be callable: fn(q, k, v, mask, n_iter) -> output")

    def heads(q, k, v, mask, n_iter, landmarks):
        return fn(q, k, v, mask, n_iter)

    register_attention(name, heads=heads, overwrite=overwrite)


def _model_variant(name):
    try:
        return get_attention(name)
    except ValueError:
        raise ValueError(f"unknown normalization {name!r}; known: {', '.join(available_attentions())}") from None


def scaled_attention(q, k, v, normalization: str = "softmax", *, n_iter: int = 3, mask=None,
                     dropout: float = 0.0, training: bool = False, landmarks: int = 64, need_weights: bool = True):
    r"""Per-head attention ``(output, weights)`` for ``q (..., n, p)``, ``k (..., m, p)``, ``v (..., m, p_v)``.

    ``weights`` is the normalized matrix before dropout (None for output-only
    normalizations, and for Sinkhorn when ``need_weights=False``); ``output =
    dropout(weights) @ v`` in the dtype of ``v``. ``landmarks`` is the number of Nyström
    landmarks (``"skyformer"``, ``"nystromformer"``).

    With ``need_weights=False`` and no dropout, Sinkhorn attention (masked or not) never forms the
    matrix: after ``n_iter`` half-steps it is :math:`\mathrm{diag}(\alpha) S
    \mathrm{diag}(\beta)` with :math:`S` the SoftMax, so the output is
    :math:`\alpha \odot S(\beta \odot v)`, the same numbers to rounding at about the cost
    of SoftMax attention.

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
    """
    variant = _model_variant(normalization)
    if variant.normalize is None:
        return variant.heads(q, k, v, mask, n_iter, landmarks).to(v.dtype), None
    from sinkflow.nn._fused import fused_attention, fused_preferred

    if not need_weights and not (dropout > 0 and training) and fused_preferred(variant, n_iter, q, k):
        return fused_attention(q, k, v, variant, n_iter=n_iter, allowed=mask), None  # SDPA: no n x m matrix
    if not need_weights and variant.normalize is _builtin_sinkhorn and not (dropout > 0 and training):
        with torch.autocast(device_type=q.device.type, enabled=False):
            scores = _scores(q, k, variant)
            out = sinkhorn_attention(scores, n_iter, mask, values=v.to(scores.dtype))
        return out.to(v.dtype), None
    K = attention_weights(q, k, variant, n_iter=n_iter, mask=mask)
    Kd = F.dropout(K, dropout, training) if dropout > 0 and training else K
    # The product with V may run in autocast precision; the weights were float32.
    out = torch.matmul(Kd.to(v.dtype), v) if v.dtype in (torch.float16, torch.bfloat16) else torch.matmul(Kd, v.to(Kd.dtype)).to(v.dtype)
    return out, K


class AttentionKernel(nn.Module):
    """The normalization step as a module, so forward hooks can capture attention matrices.

    ``forward(q, k, v, mask, need_weights=True) -> (output, weights)`` on per-head tensors;
    see :func:`scaled_attention`. :class:`sinkflow.nn.AttentionRecorder` hooks these
    modules: while a forward hook is registered (on the kernel, or for all modules with
    ``torch.nn.modules.module.register_module_forward_hook``), the weights are formed even
    when the caller does not need them, so the hook sees them.

    Parameters
    ----------
    normalization : str
        ``"softmax"``, ``"sinkhorn"``, ``"gaussian"``, ``"skyformer"``, ``"nystromformer"``
        or a registered name.
    n_iter : int
        Sinkhorn half-iterations.
    dropout : float
        Dropout on the weights (training mode only).
    landmarks : int
        Nyström landmarks of ``"skyformer"`` / ``"nystromformer"``.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn import AttentionKernel
    >>> kernel = AttentionKernel("sinkhorn", n_iter=3)
    >>> q, k, v = torch.randn(3, 2, 4, 5, 8, generator=torch.Generator().manual_seed(0))   # (batch, heads, n, p)
    >>> out, w = kernel(q, k, v)
    >>> out.shape, w.shape, bool(torch.allclose(w.sum(-1), torch.ones(2, 4, 5)))   # odd n_iter ends on rows
    (torch.Size([2, 4, 5, 8]), torch.Size([2, 4, 5, 5]), True)
    >>> kernel(q, k, v, need_weights=False)[1] is None
    True
    >>> seen = []
    >>> handle = kernel.register_forward_hook(lambda module, inputs, output: seen.append(output[1]))
    >>> _ = kernel(q, k, v, need_weights=False)   # a hook is registered: the weights are formed for it
    >>> handle.remove()
    >>> bool(torch.allclose(seen[0], w))
    True
    """

    def __init__(self, normalization: str = "softmax", n_iter: int = 3, dropout: float = 0.0, landmarks: int = 64):
        super().__init__()
        _model_variant(normalization)
        if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1:
            raise ValueError(f"n_iter must be a positive integer (Sinkhorn half-iterations), got {n_iter!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if isinstance(landmarks, bool) or not isinstance(landmarks, int) or landmarks < 1:
            raise ValueError(f"landmarks must be a positive integer, got {landmarks!r}")
        self.normalization = normalization
        self.n_iter = n_iter
        self.dropout = dropout
        self.landmarks = landmarks

    def forward(self, q, k, v, mask=None, need_weights: bool = True):
        need_weights = need_weights or bool(self._forward_hooks) or bool(_global_forward_hooks)
        return scaled_attention(q, k, v, self.normalization, n_iter=self.n_iter, mask=mask, dropout=self.dropout,
                                training=self.training, landmarks=self.landmarks, need_weights=need_weights)

    def extra_repr(self) -> str:
        it = f", n_iter={self.n_iter}" if self.normalization == "sinkhorn" else ""
        it += f", landmarks={self.landmarks}" if self.normalization in ("skyformer", "nystromformer") else ""
        return f"normalization={self.normalization!r}{it}, dropout={self.dropout}"


class MultiheadAttention(nn.Module):
    r"""Drop-in for ``torch.nn.MultiheadAttention`` with a pluggable normalization.

    Parameters
    ----------
    embed_dim, num_heads : int
        Model width and number of heads (``embed_dim % num_heads == 0``).
    dropout : float
        Dropout on the attention weights (training mode only).
    bias : bool
        Biases of the four projections.
    kdim, vdim : int, optional
        Key and value input widths (``embed_dim`` by default).
    batch_first : bool
        ``(batch, seq, feature)`` inputs when True (the default here, unlike torch).
    normalization : str
        ``"softmax"``, ``"sinkhorn"``, ``"gaussian"``, ``"skyformer"``, ``"nystromformer"``
        or a registered name.
    n_iter : int
        Sinkhorn half-iterations (1 = SoftMax; the Sinkformer default for ViT is 3).
    landmarks : int
        Nyström landmarks of ``"skyformer"`` / ``"nystromformer"`` (capped by the sequence).
    device, dtype
        Factory arguments for the parameters.

    Notes
    -----
    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, query_padding_mask=None)`` returns ``(output, weights)`` like
    torch. ``key_padding_mask`` is ``(batch, m)`` with ``True = pad``; ``attn_mask`` is a
    ``(n, m)`` or ``(batch * heads, n, m)`` boolean mask (``True = not allowed``) or an
    additive float mask. ``query_padding_mask`` (``True = pad``) additionally removes padded
    queries from Sinkhorn's column constraint (their rows become zero); torch has no such
    argument, and SoftMax does not need it.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn import MultiheadAttention
    >>> mha = MultiheadAttention(16, 4, normalization="sinkhorn", n_iter=3)
    >>> x = torch.randn(2, 10, 16)
    >>> out, w = mha(x, x, x, key_padding_mask=(torch.arange(10) >= 8).expand(2, 10))
    >>> out.shape, w.shape, float(w[..., 8:].detach().abs().max())
    (torch.Size([2, 10, 16]), torch.Size([2, 10, 10]), 0.0)
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None, batch_first: bool = True,
                 normalization: str = "softmax", n_iter: int = 3, landmarks: int = 64, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.batch_first = batch_first
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.kernel = AttentionKernel(normalization, n_iter, dropout, landmarks)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # As torch.nn.MultiheadAttention: Xavier-uniform on the stacked (3E, E) input
        # projection (so each block has bound sqrt(6 / 4E)), zero biases.
        bound = math.sqrt(6.0 / (4 * self.embed_dim))
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.uniform_(lin.weight, -bound, bound)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    @property
    def normalization(self) -> str:
        return self.kernel.normalization

    @property
    def n_iter(self) -> int:
        return self.kernel.n_iter

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, -1).transpose(1, 2)

    def _mask(self, b, n, m, key_padding_mask, attn_mask, query_padding_mask, device):
        """Combine the torch-convention masks into one admissibility mask (True = attend)."""
        allowed = None
        if key_padding_mask is not None:
            if key_padding_mask.shape != (b, m):
                raise ValueError(f"key_padding_mask must have shape (batch, m) = {(b, m)}, got {tuple(key_padding_mask.shape)}")
            kpm = key_padding_mask.to(device)
            if kpm.dtype != torch.bool:  # torch also accepts float masks with -inf for pads
                kpm = torch.isneginf(kpm) if kpm.is_floating_point() else kpm.bool()
            allowed = (~kpm)[:, None, None, :]
        if query_padding_mask is not None:
            if query_padding_mask.shape != (b, n):
                raise ValueError(f"query_padding_mask must have shape (batch, n) = {(b, n)}, got {tuple(query_padding_mask.shape)}")
            q_ok = (~query_padding_mask.to(device).bool())[:, None, :, None]
            allowed = q_ok if allowed is None else allowed & q_ok
        if attn_mask is not None:
            am = attn_mask.to(device)
            if am.dim() == 3:
                if am.shape[0] != b * self.num_heads:
                    raise ValueError(f"3-D attn_mask must have shape (batch * heads, n, m), got {tuple(am.shape)}")
                am = am.view(b, self.num_heads, n, m)
            elif am.dim() != 2:
                raise ValueError(f"attn_mask must be 2-D or 3-D, got shape {tuple(am.shape)}")
            if am.dtype == torch.bool:
                allowed = ~am if allowed is None else allowed & ~am
            else:  # additive float mask: only 0 (keep) and -inf (drop) have a meaning for every normalization
                finite = torch.isfinite(am)
                if bool((am.masked_fill(~finite, 0.0) != 0).any()):
                    raise ValueError("a float attn_mask may only contain 0 and -inf here (additive biases are "
                                     "SoftMax-specific); pass a boolean mask")
                allowed = finite if allowed is None else allowed & finite
        return allowed

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False, query_padding_mask=None):
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        if query.dim() != 3:
            raise ValueError(f"expected 3-D (batch, seq, feature) inputs, got shape {tuple(query.shape)}")
        b, n, _ = query.shape
        m = key.shape[1]
        if is_causal and attn_mask is None:
            attn_mask = torch.ones(n, m, dtype=torch.bool, device=query.device).triu(1)
        q = self._heads(self.q_proj(query))
        k = self._heads(self.k_proj(key))
        v = self._heads(self.v_proj(value))
        allowed = self._mask(b, n, m, key_padding_mask, attn_mask, query_padding_mask, query.device)
        out, weights = self.kernel(q, k, v, allowed, need_weights)
        out = self.out_proj(out.transpose(1, 2).reshape(b, n, self.embed_dim))
        if not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights or weights is None:
            return out, None
        return out, (weights.mean(1) if average_attn_weights else weights)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"
