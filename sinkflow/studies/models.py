r"""Small Transformers for the validations, each with a pluggable attention normalization.

* :class:`PatchViT` — the Sinkformers RQ1 probe: attention-only ViT (one layer, one head
  by default) on image patches, pre-LayerNorm and a class token as in the paper's ViT;
  ``pre_norm=False, pooling="mean"`` gives the variant without LayerNorm and with mean
  pooling (docs/theory/training.md: there the column-sum deviation grows instead).
* :class:`SetClassifier` — Set-Transformer-style classifier of point clouds
  (permutation-invariant: no positions, pooled self-attention blocks).
* :class:`SequenceClassifier` — token classifier for long synthetic sequences.

All take ``normalization`` (``"softmax"``, ``"sinkhorn"``, ``"gaussian"``, ...) and
``n_iter``; their attention modules are :class:`sinkflow.nn.MultiheadAttention`, so
:class:`sinkflow.studies.AttentionRecorder` captures their attention matrices.
"""

from __future__ import annotations

import torch
from torch import nn

from sinkflow.nn.attention import MultiheadAttention

__all__ = ["AttentionBlock", "PatchViT", "SetClassifier", "SequenceClassifier"]


class AttentionBlock(nn.Module):
    """Residual attention block ``x + attn(LN(x))`` (pre-norm) or ``x + attn(x)``, optional MLP.

    Parameters
    ----------
    dim, heads : int
    normalization : str
    n_iter : int
    pre_norm : bool
        LayerNorm before attention (and before the MLP).
    mlp_ratio : int
        Hidden width of the feed-forward block as a multiple of ``dim``; 0 = attention only.
    dropout : float
        Dropout on attention weights and in the MLP.
    landmarks : int
        Nyström landmarks of ``"skyformer"`` / ``"nystromformer"``.

    Notes
    -----
    ``forward(x, key_padding_mask=None)`` maps ``(batch, n, dim)`` to ``(batch, n, dim)``;
    ``key_padding_mask`` (``True = pad``) also removes padded queries from Sinkhorn's column
    constraint.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies import AttentionBlock
    >>> block = AttentionBlock(16, heads=2, normalization="sinkhorn", mlp_ratio=2)
    >>> x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(0))
    >>> y = block(x)
    >>> y.shape
    torch.Size([3, 7, 16])
    >>> perm = torch.randperm(7, generator=torch.Generator().manual_seed(1))
    >>> bool(torch.allclose(block(x[:, perm]), y[:, perm], atol=1e-5))   # no positions: permutation-equivariant
    True
    """

    def __init__(self, dim: int, heads: int = 1, normalization: str = "softmax", n_iter: int = 3,
                 pre_norm: bool = True, mlp_ratio: int = 0, dropout: float = 0.0, landmarks: int = 64):
        super().__init__()
        self.norm = nn.LayerNorm(dim) if pre_norm else nn.Identity()
        self.attn = MultiheadAttention(dim, heads, batch_first=True, dropout=dropout, normalization=normalization,
                                       n_iter=n_iter,
                                       landmarks=landmarks)
        self.mlp = None
        if mlp_ratio:
            self.mlp = nn.Sequential(nn.LayerNorm(dim) if pre_norm else nn.Identity(), nn.Linear(dim, mlp_ratio * dim),
                                     nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x, key_padding_mask=None):
        h = self.norm(x)
        x = x + self.attn(h, h, h, key_padding_mask=key_padding_mask, need_weights=False,
                          query_padding_mask=key_padding_mask)[0]
        if self.mlp is not None:
            x = x + self.mlp(x)
        return x


def _pool(x, pooling: str, key_padding_mask=None):
    if pooling == "cls":
        return x[:, 0]
    if key_padding_mask is None:
        return x.mean(1) if pooling == "mean" else x.amax(1)
    keep = (~key_padding_mask)[..., None].to(x.dtype)
    if pooling == "mean":
        return (x * keep).sum(1) / keep.sum(1).clamp_min(1)
    return x.masked_fill(key_padding_mask[..., None], -torch.inf).amax(1)


def _check_pooling(pooling, allowed):
    if pooling not in allowed:
        raise ValueError(f"pooling must be one of {allowed}, got {pooling!r}")


class PatchViT(nn.Module):
    """Vision Transformer on non-overlapping patches, attention-only by default.

    Parameters
    ----------
    image_size, patch_size, channels : int
        Square images of ``image_size`` pixels cut into ``(image_size / patch_size)^2`` tokens.
    n_classes : int
    dim, heads, depth : int
        Token width, attention heads, number of blocks (the paper's probe: 1 head, 1 layer).
    normalization : str
    n_iter : int
    pre_norm : bool
        Pre-LayerNorm blocks and a LayerNorm before the head (the paper's ViT).
    pooling : {"cls", "mean"}
        Class token (paper) or mean over patch tokens.
    mlp_ratio : int
        0 = attention only.
    dropout : float

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies import PatchViT
    >>> model = PatchViT(8, 2, 1, 10, dim=16, normalization="sinkhorn", n_iter=3)
    >>> model(torch.zeros(5, 1, 8, 8)).shape
    torch.Size([5, 10])
    """

    def __init__(self, image_size: int = 8, patch_size: int = 2, channels: int = 1, n_classes: int = 10, dim: int = 64,
                 heads: int = 1, depth: int = 1, normalization: str = "softmax", n_iter: int = 3,
                 pre_norm: bool = True, pooling: str = "cls", mlp_ratio: int = 0, dropout: float = 0.0):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size ({image_size}) must be a multiple of patch_size ({patch_size})")
        _check_pooling(pooling, ("cls", "mean"))
        self.patch_size, self.pooling = patch_size, pooling
        n_patches = (image_size // patch_size) ** 2
        self.embed = nn.Linear(channels * patch_size**2, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if pooling == "cls" else None
        self.pos = nn.Parameter(0.02 * torch.randn(1, n_patches + (pooling == "cls"), dim))
        self.blocks = nn.ModuleList(AttentionBlock(dim, heads, normalization, n_iter, pre_norm, mlp_ratio, dropout)
                                    for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(dim) if pre_norm else nn.Identity(), nn.Linear(dim, n_classes))

    def patches(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W) -> (B, n_patches, C p^2)`` in row-major patch order."""
        p = self.patch_size
        b, c, h, w = images.shape
        x = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, (h // p) * (w // p), c * p * p)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(self.patches(images))
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1)
        x = x + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(_pool(x, self.pooling))


class SetClassifier(nn.Module):
    r"""Set-Transformer-style classifier: point-wise embedding, self-attention blocks, pooling.

    Permutation invariant (no positional encoding). Parameters as :class:`PatchViT`, plus
    ``in_dim`` (3 for point clouds), ``pooling`` in ``{"mean", "max"}`` and
    ``radial_feature`` (append the rotation-invariant :math:`\|x\|` to each point's input,
    which shortens the initial plateau on randomly rotated shapes).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies import SetClassifier
    >>> model = SetClassifier(3, 5, dim=16, heads=2)
    >>> x = torch.randn(4, 30, 3)
    >>> bool(torch.allclose(model(x), model(x[:, torch.randperm(30)]), atol=1e-5))
    True
    """

    def __init__(self, in_dim: int = 3, n_classes: int = 5, dim: int = 64, heads: int = 4, depth: int = 2,
                 normalization: str = "softmax", n_iter: int = 3, pooling: str = "max", mlp_ratio: int = 2,
                 dropout: float = 0.0, radial_feature: bool = False):
        super().__init__()
        _check_pooling(pooling, ("mean", "max"))
        self.pooling, self.radial_feature = pooling, radial_feature
        self.embed = nn.Sequential(nn.Linear(in_dim + radial_feature, dim), nn.GELU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(AttentionBlock(dim, heads, normalization, n_iter, True, mlp_ratio, dropout)
                                    for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, n_classes))

    def forward(self, points: torch.Tensor, key_padding_mask=None) -> torch.Tensor:
        if self.radial_feature:  # the rotation-invariant norm |x| as an extra input channel
            points = torch.cat([points, points.norm(dim=-1, keepdim=True)], -1)
        x = self.embed(points)
        for block in self.blocks:
            x = block(x, key_padding_mask)
        return self.head(_pool(x, self.pooling, key_padding_mask))


class SequenceClassifier(nn.Module):
    """Transformer classifier of token sequences (learned positions, pre-LN blocks with an MLP).

    ``pooling="cls"`` reads a prepended class token; ``pooling="mean"`` averages the token
    states (the LRA models of the Skyformer paper), over non-padded tokens when a
    ``key_padding_mask`` is given. As in the Skyformer paper's LRA model, a final LayerNorm
    normalizes every token state before pooling; :meth:`features` returns these normalized
    token states (the "embedding after the layers" of the paper's instability score,
    :func:`sinkflow.studies.update_instability`). ``landmarks`` sets the Nyström landmarks.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies import SequenceClassifier
    >>> model = SequenceClassifier(48, 64, 8, dim=16, heads=2, normalization="gaussian")
    >>> model(torch.zeros(3, 64, dtype=torch.long)).shape
    torch.Size([3, 8])
    """

    def __init__(self, vocab_size: int, max_len: int, n_classes: int, dim: int = 64, heads: int = 2, depth: int = 1,
                 normalization: str = "softmax", n_iter: int = 3, mlp_ratio: int = 2, dropout: float = 0.0,
                 pooling: str = "cls", landmarks: int = 64):
        super().__init__()
        _check_pooling(pooling, ("cls", "mean"))
        self.pooling = pooling
        self.tokens = nn.Embedding(vocab_size, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if pooling == "cls" else None
        self.pos = nn.Parameter(0.02 * torch.randn(1, max_len + (pooling == "cls"), dim))
        self.blocks = nn.ModuleList(AttentionBlock(dim, heads, normalization, n_iter, True, mlp_ratio, dropout,
                                                   landmarks) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, n_classes))

    def _padding(self, key_padding_mask, b):
        if self.cls_token is not None and key_padding_mask is not None:
            return torch.cat([key_padding_mask.new_zeros(b, 1), key_padding_mask], 1)
        return key_padding_mask

    def features(self, tokens: torch.Tensor, key_padding_mask=None) -> torch.Tensor:
        """Token states after the blocks and the final LayerNorm, ``(batch, length (+1), dim)``.

        Parameters
        ----------
        tokens : torch.Tensor of int64, shape (batch, length)
        key_padding_mask : torch.Tensor of bool, shape (batch, length), optional
            ``True`` = padding (excluded from attention and pooling).

        Returns
        -------
        torch.Tensor
            One row per token (the class token first with ``pooling="cls"``).

        Examples
        --------
        >>> import torch
        >>> from sinkflow.studies import SequenceClassifier
        >>> model = SequenceClassifier(48, 64, 8, dim=16, pooling="mean")
        >>> model.features(torch.zeros(3, 64, dtype=torch.long)).shape
        torch.Size([3, 64, 16])
        """
        b, n = tokens.shape
        x = self.tokens(tokens)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(b, -1, -1), x], 1)
        key_padding_mask = self._padding(key_padding_mask, b)
        x = x + self.pos[:, : x.shape[1]]
        for block in self.blocks:
            x = block(x, key_padding_mask)
        return self.head[0](x)

    def forward(self, tokens: torch.Tensor, key_padding_mask=None) -> torch.Tensor:
        x = self.features(tokens, key_padding_mask)
        return self.head[1](_pool(x, self.pooling, self._padding(key_padding_mask, tokens.shape[0])))
