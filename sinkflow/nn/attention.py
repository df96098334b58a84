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

import numbers

import torch
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear
from torch.nn.modules.module import _global_forward_hooks

from sinkflow._backend import transform_entry
from sinkflow.nn._torch_compat import (
    block_torch_fast_path,
    check_shapes,
    combined_masks,
    in_projection,
    nested_forward,
    to_batch_first,
    upgrade_state_dict,
)
from sinkflow.nn.functional import _model_variant, check_inputs, scaled_attention, solve_options

__all__ = ["AttentionKernel", "MultiheadAttention"]


_NOT_SCRIPTABLE = (
    "sinkflow.nn.MultiheadAttention cannot be compiled by torch.jit.script: its normalizations are Python "
    "callables looked up in a registry at run time (user-registered ones included), which TorchScript cannot "
    "type. Use torch.compile(model) instead (fullgraph=True works; TorchScript is deprecated in torch).")


def check_dropout(value) -> float:
    """``value`` as a dropout probability in [0, 1) (TypeError for a non-number, ValueError outside)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"dropout must be a number in [0, 1), got {type(value).__name__}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {value}")
    return float(value)


class AttentionKernel(nn.Module):
    """The normalization step as a module, so forward hooks can capture attention matrices.

    ``forward(q, k, v, mask, need_weights=True, bias=None) -> (output, weights)`` on per-head
    tensors (``bias``: an additive float mask); see :func:`scaled_attention`.
    :class:`sinkflow.studies.AttentionRecorder` hooks these modules: while a forward hook is
    registered (on the kernel, or for all modules with
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
    tol, max_iter, backward : keyword-only
        Sinkhorn to tolerance instead of ``n_iter`` half-iterations, and how it is differentiated
        (``"unrolled"`` or ``"implicit"``); see :func:`scaled_attention`. Sinkhorn only.

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

    def __init__(self, normalization: str = "softmax", n_iter: int = 3, dropout: float = 0.0, landmarks: int = 64, *,
                 tol: float | None = None, max_iter: int = 20_000, backward: str = "unrolled"):
        super().__init__()
        solve = solve_options(_model_variant(normalization), tol, max_iter, backward)
        if isinstance(n_iter, bool) or not isinstance(n_iter, int):
            raise TypeError(f"n_iter must be an integer (Sinkhorn half-iterations), got {n_iter!r}")
        if n_iter < 1:
            raise ValueError(f"n_iter must be a positive integer (Sinkhorn half-iterations), got {n_iter!r}")
        if isinstance(landmarks, bool) or not isinstance(landmarks, int) or landmarks < 1:
            raise ValueError(f"landmarks must be a positive integer, got {landmarks!r}")
        self.normalization = normalization
        self.n_iter = n_iter
        self.dropout = check_dropout(dropout)
        self.landmarks = landmarks
        self.tol, self.max_iter, self.backward = (None, int(max_iter), backward) if solve is None else solve

    def forward(self, q, k, v, mask=None, need_weights: bool = True, bias=None):
        need_weights = need_weights or bool(self._forward_hooks) or bool(_global_forward_hooks)
        return scaled_attention(q, k, v, self.normalization, n_iter=self.n_iter, mask=mask, dropout=self.dropout,
                                training=self.training, landmarks=self.landmarks, need_weights=need_weights,
                                bias=bias, tol=self.tol, max_iter=self.max_iter, backward=self.backward)

    def solve_repr(self) -> str:
        """``", tol=..., max_iter=..., backward=..."`` when Sinkhorn runs to tolerance, else ``""``."""
        if self.tol is None:
            return ""
        return f", tol={self.tol:g}, max_iter={self.max_iter}, backward={self.backward!r}"

    def extra_repr(self) -> str:
        it = f", n_iter={self.n_iter}" if self.normalization == "sinkhorn" and self.tol is None else ""
        it += self.solve_repr()
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
    tol : float, keyword-only, optional
        Sinkhorn only: run to this marginal error (:func:`sinkflow.solve_sinkhorn`, within
        ``max_iter`` half-iterations) instead of ``n_iter`` half-iterations; see
        :func:`scaled_attention`. Not converging gives a :class:`~sinkflow.attention.SinkhornWarning`.
    max_iter : int, keyword-only
        Budget of half-iterations of a run to ``tol``.
    backward : {"unrolled", "implicit"}, keyword-only
        With ``tol``: autograd through the iterations, or implicit gradients of the converged
        map (docs/theory/implicit.md; saved memory independent of the iteration count).

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
    weights, is disabled by a forward pre-hook this module registers. NestedTensor inputs
    (what ``torch.nn.TransformerEncoder`` passes in eval mode with a padding mask,
    ``batch_first=True``) are padded and their padding masks both keys and queries: each
    sequence's output is that of the sequence alone (for SoftMax, torch's padded result; for
    Sinkhorn, padded tokens also leave the column constraint), returned nested.

    Inputs holding NaN or inf are refused (ValueError naming ``query``, ``key`` or ``value``),
    on every path. ``torch.compile(module, fullgraph=True)`` traces every normalization in one
    graph (the checks become assertions in it); ``torch.jit.script`` is refused with the
    reason (TypeError). ``merge_masks`` is torch's.

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
                 normalization: str = "softmax", n_iter: int = 3, landmarks: int = 64, tol: float | None = None,
                 max_iter: int = 20_000, backward: str = "unrolled"):
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
        self.kernel = AttentionKernel(normalization, n_iter, dropout, landmarks, tol=tol, max_iter=max_iter,
                                      backward=backward)
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
    def tol(self) -> float | None:
        return self.kernel.tol

    @property
    def max_iter(self) -> int:
        return self.kernel.max_iter

    @property
    def backward(self) -> str:
        return self.kernel.backward

    @property
    def dropout(self) -> float:
        return self.kernel.dropout

    @dropout.setter
    def dropout(self, value: float) -> None:
        self.kernel.dropout = check_dropout(value)

    def merge_masks(self, attn_mask, key_padding_mask, query):
        """torch's ``merge_masks``: ``(mask, mask_type)`` from torch-convention masks.

        Only ``key_padding_mask`` (batch, seq): itself, type 1. With ``attn_mask`` ((seq, seq)
        or (batch * heads, seq, seq)), for a batched ``query`` (batch, seq, embed_dim): the mask
        expanded to (batch, heads, seq, seq), plus (boolean: or) the expanded key padding mask,
        type 2. Neither: ``(None, None)``.
        """
        merged, kind = (key_padding_mask, 1) if key_padding_mask is not None else (None, None)
        if attn_mask is None:
            return merged, kind
        b, n = query.shape[0], query.shape[1]
        merged = (attn_mask.view(b, -1, n, n) if attn_mask.dim() == 3
                  else attn_mask.view(1, 1, n, n).expand(b, self.num_heads, -1, -1))
        if key_padding_mask is not None:
            merged = merged + key_padding_mask.view(b, 1, 1, n).expand(-1, self.num_heads, -1, -1)
        return merged, 2

    def __prepare_scriptable__(self):
        """Called by ``torch.jit.script`` (also on a model holding this module): refuse with the reason."""
        raise TypeError(_NOT_SCRIPTABLE)

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
        if query.is_nested or key.is_nested or value.is_nested:
            return nested_forward(self, query, key, value, key_padding_mask, query_padding_mask,
                                  need_weights=need_weights, attn_mask=attn_mask,
                                  average_attn_weights=average_attn_weights, is_causal=is_causal)
        with transform_entry(query, key, value, *self.parameters()):
            return self._forward(query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                                 is_causal, query_padding_mask)

    def _forward(self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal,
                 query_padding_mask):
        query, key, value = check_inputs((query, key, value), ("query", "key", "value"))
        batched = check_shapes(self, query, key, value, key_padding_mask, attn_mask, query_padding_mask)
        query, key, value = to_batch_first(query, key, value, batched, self.batch_first)
        if not batched:
            key_padding_mask, query_padding_mask = (None if t is None else t[None]
                                                    for t in (key_padding_mask, query_padding_mask))
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
        extra += self.kernel.solve_repr()
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}{extra}"
