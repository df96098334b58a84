r"""Multi-head attention with a pluggable normalization (docs/theory/normalizations.md and docs/theory/nystrom.md).

One module, :class:`MultiheadAttention`, a drop-in for ``torch.nn.MultiheadAttention``
(its constructor, defaults, parameter names and initialization, masks and unbatched
inputs), whose attention matrix is produced by one of

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

Masks: inside this module boolean masks follow sinkflow's convention (``True =
admissible``) and float masks are an additive ``bias`` on the scores; the public module
converts torch's ``key_padding_mask`` and ``attn_mask`` (boolean ``True = masked out``, or
float, added). Masked keys get exactly zero weight; a query whose keys are partly masked
gets a finite row; a query with no admissible key gets a zero row and a zero output
(never NaN).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear
from torch.nn.modules.module import _global_forward_hooks

from sinkflow.attention._variants import _sinkhorn as _builtin_sinkhorn
from sinkflow.attention._variants import available_attentions, compute_dtype, get_attention, register_attention
from sinkflow.nn._factored_sinkhorn import sinkhorn_attention
from sinkflow.nn._torch_compat import (
    block_torch_fast_path,
    check_shapes,
    combined_masks,
    in_projection,
    to_batch_first,
    upgrade_state_dict,
)
from sinkflow.attention._scores import dot_scores, gaussian_scores

__all__ = [
    "available_normalizations",
    "register_normalization",
    "attention_weights",
    "scaled_attention",
    "AttentionKernel",
    "MultiheadAttention",
]


def attention_weights(q: torch.Tensor, k: torch.Tensor, normalization: str = "softmax", *,
                      n_iter: int = 3, mask: torch.Tensor | None = None,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
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
    bias : float tensor broadcastable to (..., n, m), optional
        Added to the scores (the log-kernel) before the normalization, as torch's float
        ``attn_mask``; see :func:`scaled_attention` for ``-inf`` and underflowing entries.

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
    mask, bias = _split_bias(variant, mask, bias, compute_dtype(q, k))
    return _weights(q, k, variant, n_iter, mask, bias)


def _weights(q, k, variant, n_iter, mask, bias):
    with torch.autocast(device_type=q.device.type, enabled=False):
        scores = _scores(q, k, variant, bias)
        if variant.normalize is _builtin_sinkhorn:  # the training hot path (not a user's override)
            return sinkhorn_attention(scores, n_iter, mask)  # factored fast path, the solver otherwise
        return variant.normalize(scores, n_iter=n_iter, mask=mask).attention


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


def _split_bias(variant, mask, bias, dtype):
    """An additive ``bias`` as (boolean mask, finite bias or None): its ``-inf`` entries become
    masked entries and, except for SoftMax, so do those whose exponential underflows to 0 in
    ``dtype``; output-only variants refuse what remains."""
    if bias is None:
        return mask, None
    if not torch.is_tensor(bias) or not bias.is_floating_point():
        raise TypeError(f"bias must be a floating-point tensor (an additive mask), got {getattr(bias, 'dtype', type(bias))}")
    bias = bias.to(dtype)
    softmax_like = variant.normalize is not None and variant.normalization == "row"  # torch's result: only -inf masks
    dead = torch.isneginf(bias) if softmax_like else bias.exp() == 0
    flags = [(torch.isnan(bias) | torch.isposinf(bias)).any(), dead.any(), ((bias != 0) & ~dead).any()]
    bad, any_dead, kept = torch.stack(flags).tolist()  # one synchronization
    if bad:
        raise ValueError("bias (a float mask) must not hold NaN or +inf")
    if any_dead:
        mask = ~dead if mask is None else mask & ~dead
    if not kept:
        return mask, None
    bias = bias.masked_fill(dead, 0.0) if any_dead else bias
    if variant.normalize is None:
        raise ValueError(f"normalization {variant.name!r} computes its output without a score matrix: a float mask "
                         "may only hold 0 and -inf (or values whose exponential underflows, e.g. -1e9); "
                         "pass a boolean mask")
    return mask, bias


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
    >>> out, w = MultiheadAttention(8, 2, batch_first=True, normalization="mean")(torch.ones(1, 3, 8), torch.ones(1, 3, 8), torch.ones(1, 3, 8))
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
                     dropout: float = 0.0, training: bool = False, landmarks: int = 64, need_weights: bool = True,
                     bias=None):
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
    ``False`` in ``mask``. A Sinkhorn column step gives every column its mass :math:`n/m`
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
    >>> K = scaled_attention(q, k, v, "sinkhorn", bias=torch.tensor([0.0, -1e9, 0.0]))[1]   # -1e9: key 1 masked
    >>> float(K[..., 1].max()), torch.equal(K, scaled_attention(q, k, v, "sinkhorn", mask=torch.tensor([True, False, True]))[1])
    (0.0, True)
    """
    variant = _model_variant(normalization)
    mask, bias = _split_bias(variant, mask, bias, compute_dtype(q, k))
    if variant.normalize is None:
        return variant.heads(q, k, v, mask, n_iter, landmarks).to(v.dtype), None
    from sinkflow.nn._fused import fused_attention, fused_preferred

    fusable = not need_weights and not (dropout > 0 and training) and (bias is None or not bias.requires_grad)
    if fusable and fused_preferred(variant, n_iter, q, k):  # a learned float mask takes the eager path (its gradient)
        return fused_attention(q, k, v, variant, n_iter=n_iter, allowed=mask, bias=bias), None  # no n x m matrix
    if not need_weights and variant.normalize is _builtin_sinkhorn and not (dropout > 0 and training):
        with torch.autocast(device_type=q.device.type, enabled=False):
            scores = _scores(q, k, variant, bias)
            out = sinkhorn_attention(scores, n_iter, mask, values=v.to(scores.dtype))
        return out.to(v.dtype), None
    K = _weights(q, k, variant, n_iter, mask, bias)
    Kd = F.dropout(K, dropout, training) if dropout > 0 and training else K
    # The product with V may run in autocast precision; the weights were float32.
    out = torch.matmul(Kd.to(v.dtype), v) if v.dtype in (torch.float16, torch.bfloat16) else torch.matmul(Kd, v.to(Kd.dtype)).to(v.dtype)
    return out, K


class AttentionKernel(nn.Module):
    """The normalization step as a module, so forward hooks can capture attention matrices.

    ``forward(q, k, v, mask, need_weights=True, bias=None) -> (output, weights)`` on per-head
    tensors (``bias``: an additive float mask); see :func:`scaled_attention`.
    :class:`sinkflow.nn.AttentionRecorder` hooks these modules: while a forward hook is registered (on the kernel, or for all modules with
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

    def forward(self, q, k, v, mask=None, need_weights: bool = True, bias=None):
        need_weights = need_weights or bool(self._forward_hooks) or bool(_global_forward_hooks)
        return scaled_attention(q, k, v, self.normalization, n_iter=self.n_iter, mask=mask, dropout=self.dropout,
                                training=self.training, landmarks=self.landmarks, need_weights=need_weights,
                                bias=bias)

    def extra_repr(self) -> str:
        it = f", n_iter={self.n_iter}" if self.normalization == "sinkhorn" else ""
        it += f", landmarks={self.landmarks}" if self.normalization in ("skyformer", "nystromformer") else ""
        return f"normalization={self.normalization!r}{it}, dropout={self.dropout}"


class MultiheadAttention(nn.Module):
    r"""Drop-in for ``torch.nn.MultiheadAttention`` with a pluggable normalization.

    torch's constructor (same arguments, order and defaults, ``batch_first=False``
    included), parameters (``in_proj_weight``/``in_proj_bias``, or ``q_proj_weight``,
    ``k_proj_weight``, ``v_proj_weight`` when ``kdim``/``vdim`` differ; ``out_proj``; ``bias_k``,
    ``bias_v``) and initialization, so ``load_state_dict`` moves weights both ways and a seed
    gives torch's weights; torch's ``forward``, masks and unbatched inputs. With
    ``normalization="softmax"`` the outputs and weights are torch's to float32 rounding
    (tests/nn/test_nn_torch_mha.py).

    Parameters
    ----------
    embed_dim, num_heads : int
        Model width and number of heads (``embed_dim % num_heads == 0``).
    dropout : float
        Dropout on the attention weights (training mode only).
    bias : bool
        Biases of the input and output projections.
    add_bias_kv : bool
        Append a learned key and value (``bias_k``, ``bias_v``) to every sequence, as torch.
    add_zero_attn : bool
        Append a zero key and value to every sequence (after ``bias_k``), as torch.
    kdim, vdim : int, optional
        Key and value input widths (``embed_dim`` by default).
    batch_first : bool
        ``(batch, seq, feature)`` inputs and outputs when True; ``(seq, batch, feature)``
        when False (torch's default, and the default here).
    device, dtype
        Factory arguments for the parameters.
    normalization : str, keyword-only
        ``"softmax"``, ``"sinkhorn"``, ``"gaussian"``, ``"skyformer"``, ``"nystromformer"``
        or a registered name.
    n_iter : int, keyword-only
        Sinkhorn half-iterations (1 = SoftMax; the Sinkformer default for ViT is 3).
    landmarks : int, keyword-only
        Nyström landmarks of ``"skyformer"`` / ``"nystromformer"`` (capped by the sequence).

    Notes
    -----
    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False, query_padding_mask=None)`` returns
    ``(output, weights)`` like torch: ``weights`` is ``(batch, n, m)`` averaged over heads,
    ``(batch, heads, n, m)`` with ``average_attn_weights=False``, without the batch dimension
    for unbatched ``(n, embed_dim)`` inputs, and float32 (float64 for float64 inputs).

    Masks follow torch: ``key_padding_mask`` ``(batch, m)`` (``(m,)`` unbatched) and
    ``attn_mask`` ``(n, m)`` or ``(batch * heads, n, m)`` (``(heads, n, m)`` unbatched), each
    boolean (``True = masked out``) or float, **added to the scores** (the log-kernel) for
    every normalization: SoftMax gives torch's result; Sinkhorn iterates from
    :math:`e^{C + B}`. ``-inf`` entries are masked entries exactly as ``True`` in a boolean
    mask; for the normalizations other than SoftMax, so are entries whose exponential
    underflows to 0 (``-1e9``, ``finfo.min``): a Sinkhorn column step would otherwise give
    a padded key its full column mass back (see :func:`scaled_attention`). Output-only
    normalizations (Nyström) accept no other finite float entries. Masked keys get exactly
    zero weight; a query with no admissible key gets a zero row and a zero attention
    output, where torch gives NaN. ``is_causal=True`` without ``attn_mask`` builds the
    causal mask (torch asks for it). ``query_padding_mask`` (boolean, ``True = pad``, shaped
    like ``key_padding_mask`` for the queries) additionally removes padded queries from
    Sinkhorn's column constraint (their rows become zero); torch has no such argument.

    The returned weights are those before dropout (torch returns them after dropout in
    training mode). Inside ``torch.nn.TransformerEncoderLayer`` (``layer.self_attn = ...``)
    torch's fused eval-mode path, which would compute torch's SoftMax attention from the
    weights, is disabled by a forward pre-hook this module registers; NestedTensor inputs
    are refused.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn import MultiheadAttention
    >>> mha = MultiheadAttention(16, 4, batch_first=True, normalization="sinkhorn", n_iter=3)
    >>> x = torch.randn(2, 10, 16)
    >>> out, w = mha(x, x, x, key_padding_mask=(torch.arange(10) >= 8).expand(2, 10))
    >>> out.shape, w.shape, float(w[..., 8:].detach().abs().max())
    (torch.Size([2, 10, 16]), torch.Size([2, 10, 10]), 0.0)
    >>> ref = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    >>> softmax = MultiheadAttention(16, 4, batch_first=True)
    >>> softmax.load_state_dict(ref.state_dict())    # torch's parameter names
    <All keys matched successfully>
    >>> bool(torch.allclose(softmax(x, x, x)[0], ref(x, x, x)[0], atol=1e-6))
    True
    >>> softmax(x[0], x[0], x[0])[0].shape           # unbatched (seq, feature)
    torch.Size([10, 16])
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None, *,
                 normalization: str = "softmax", n_iter: int = 3, landmarks: int = 64):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.batch_first = batch_first
        # torch's parameters, in torch's order (the random draws of out_proj, then _reset_parameters)
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **factory)
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
            self.bias_v = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self.kernel = AttentionKernel(normalization, n_iter, dropout, landmarks)
        self._reset_parameters()
        self.register_forward_pre_hook(block_torch_fast_path)

    def _reset_parameters(self) -> None:
        """torch.nn.MultiheadAttention's: Xavier-uniform projections, zero biases, Xavier-normal bias_k/v."""
        if self._qkv_same_embed_dim:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)
        for b in (self.bias_k, self.bias_v):
            if b is not None:
                nn.init.xavier_normal_(b)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        upgrade_state_dict(state_dict, prefix, self._qkv_same_embed_dim)  # sinkflow's former q_proj/k_proj/v_proj
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def normalization(self) -> str:
        return self.kernel.normalization

    @property
    def n_iter(self) -> int:
        return self.kernel.n_iter

    @property
    def dropout(self) -> float:
        return self.kernel.dropout

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def _extra_keys(self, k, v):
        """torch's ``add_bias_kv`` then ``add_zero_attn``: keys and values appended to every sequence."""
        b = k.shape[0]
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.to(k.dtype).expand(b, 1, -1)], 1)
            v = torch.cat([v, self.bias_v.to(v.dtype).expand(b, 1, -1)], 1)
        if self.add_zero_attn:
            k, v = torch.cat([k, k.new_zeros(b, 1, k.shape[-1])], 1), torch.cat([v, v.new_zeros(b, 1, v.shape[-1])], 1)
        return k, v

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False, query_padding_mask=None):
        batched = check_shapes(self, query, key, value, key_padding_mask, attn_mask, query_padding_mask)
        query, key, value = to_batch_first(query, key, value, batched, self.batch_first)
        if not batched:
            key_padding_mask, query_padding_mask = (None if t is None else t[None] for t in (key_padding_mask, query_padding_mask))
        b, n, m = query.shape[0], query.shape[1], key.shape[1]
        q, k, v = in_projection(self, query, key, value)
        k, v = self._extra_keys(k, v)
        allowed, bias = combined_masks(b, n, m, self.num_heads, key_padding_mask, attn_mask, query_padding_mask,
                                       is_causal, k.shape[1] - m, query.device)
        out, weights = self.kernel(self._heads(q), self._heads(k), self._heads(v), allowed, need_weights, bias=bias)
        out = self.out_proj(out.transpose(1, 2).reshape(b, n, self.embed_dim))
        weights = None if not need_weights or weights is None else weights.mean(1) if average_attn_weights else weights
        if not batched:
            return out[0], None if weights is None else weights[0]
        return (out if self.batch_first else out.transpose(0, 1)), weights

    def extra_repr(self) -> str:
        extra = "".join(f", {a}={getattr(self, a)}" for a in ("kdim", "vdim") if getattr(self, a) != self.embed_dim)
        extra += ", add_bias_kv=True" if self.bias_k is not None else ""
        extra += ", add_zero_attn=True" if self.add_zero_attn else ""
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}{extra}"
