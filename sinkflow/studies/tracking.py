r"""Trackers for attention during training (docs/theory/training.md).

* :class:`AttentionRecorder` — forward hooks on every :class:`sinkflow.nn.AttentionKernel`
  of a model; collects the attention matrices (before dropout) of each forward pass.
* :func:`stochasticity_summary` — how doubly stochastic a batch of attention matrices is:
  mean sorted column sums (the Sinkformers RQ1 plot), mean :math:`|\text{col sum} - 1|`,
  KL to the Sinkhorn projection.
* :func:`update_instability` — the Skyformer paper's instability score (its Appendix F, after
  Liu et al. 2020): squared change of the token embeddings after the layers over the squared
  change of all the weights across one optimizer step, on that step's batch.
* :func:`instability_score` — a random-perturbation proxy: squared change of the model
  output over squared change of the query/key weights under a small Gaussian perturbation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from sinkflow._summary import Summarized, number, span
from sinkflow.bounds._stochasticity import kl_to_sinkhorn
from sinkflow.nn.attention import AttentionKernel, MultiheadAttention

__all__ = ["AttentionRecorder", "StochasticitySummary", "stochasticity_summary", "instability_score",
           "update_instability"]


class AttentionRecorder:
    """Capture attention matrices of every :class:`AttentionKernel` in ``model``.

    Use as a context manager (hooks are removed on exit). ``matrices[name]`` is a list
    with one ``(batch, heads, n, m)`` tensor per forward call (detached, on the CPU when
    ``to_cpu``). Output-only normalizations (Nyström) record nothing.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies import AttentionRecorder, PatchViT
    >>> model = PatchViT(8, 2, 1, 10, dim=16)
    >>> with AttentionRecorder(model) as rec:
    ...     _ = model(torch.zeros(3, 1, 8, 8))
    >>> list(rec.matrices), tuple(rec.matrices["blocks.0.attn.kernel"][0].shape)
    (['blocks.0.attn.kernel'], (3, 1, 17, 17))
    """

    def __init__(self, model: nn.Module, to_cpu: bool = True):
        self.model, self.to_cpu = model, to_cpu
        self.matrices: dict[str, list[torch.Tensor]] = {}
        self._handles = []
        for name, module in model.named_modules():
            if isinstance(module, AttentionKernel):
                self._handles.append(module.register_forward_hook(self._hook(name)))
        if not self._handles:
            raise ValueError("model has no sinkflow attention modules (sinkflow.nn.AttentionKernel) to record")

    def _hook(self, name):
        def hook(module, inputs, output):
            weights = output[1]
            if weights is not None:
                w = weights.detach()
                self.matrices.setdefault(name, []).append(w.cpu() if self.to_cpu else w)
        return hook

    def clear(self) -> None:
        self.matrices = {}

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


@dataclass(frozen=True, repr=False)
class StochasticitySummary(Summarized):
    """Doubly-stochasticity of a batch of square attention matrices (means over the batch).

    Its ``repr`` states the three deviations and the range of the sorted column sums.

    With a mask, each matrix is measured on its ``n'`` admissible rows and ``m'`` admissible
    columns (those with an admissible entry) against sinkflow's masked marginals: rows sum
    to 1, columns to ``n' / m'`` (the mass of the rows spread over the columns; 1 unmasked).

    Attributes
    ----------
    column_deviation : float
        Mean of :math:`|\\sum_i K_{ij} - n'/m'|` over admissible keys and matrices.
    row_deviation : float
        Same for row sums against 1 (0 for SoftMax and odd Sinkhorn ``n_iter``).
    kl : float
        Mean generalized :math:`\\mathrm{KL}(K \\| \\mathrm{Sinkhorn}(K))` per row (:func:`sinkflow.kl_to_sinkhorn`;
        NaN when not computed).
    sorted_column_sums : numpy.ndarray, shape (m,)
        Admissible column sums over their target ``n'/m'``, sorted increasingly, averaged over
        matrices (the paper's curve; a position no matrix has columns for is NaN).
    """

    column_deviation: float
    row_deviation: float
    kl: float
    sorted_column_sums: np.ndarray

    def _facts(self):
        sums = np.asarray(self.sorted_column_sums, dtype=float)
        head = (f"column deviation {number(self.column_deviation)}, row deviation {number(self.row_deviation)}, "
                f"KL {number(self.kl)}")
        return head, [[("sorted column sums", f"{sums.size} columns, {span(sums)} of their target")]]


def stochasticity_summary(K: torch.Tensor, with_kl: bool = True, *,
                          mask: torch.Tensor | None = None) -> StochasticitySummary:
    """Summarize how doubly stochastic attention matrices ``K (..., n, n)`` are.

    Computed in float64 on the matrices' device (the KL needs a converged Sinkhorn
    projection, tolerance 1e-9). ``mask`` (bool, broadcastable to ``K``, ``True`` =
    admissible, as the attention took it) measures a padded batch on its real tokens: a
    padded key's empty column is not a deviation (see :class:`StochasticitySummary`).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies import stochasticity_summary
    >>> s = stochasticity_summary(torch.full((2, 4, 4), 0.25))
    >>> s.column_deviation, s.kl < 1e-12, s.sorted_column_sums.tolist()
    (0.0, True, [1.0, 1.0, 1.0, 1.0])
    >>> keys = torch.tensor([True, True, True, False])   # key 3 padded: 4 rows over 3 columns
    >>> s = stochasticity_summary(torch.tensor([[1 / 3] * 3 + [0.0]] * 4), mask=keys)
    >>> round(s.column_deviation, 12), s.sorted_column_sums.tolist()[:3]
    (0.0, [1.0, 1.0, 1.0])
    """
    K = K.detach().to(torch.float64)
    if K.ndim < 2 or K.shape[-1] != K.shape[-2]:
        raise ValueError(f"attention matrices must be square (self-attention), got shape {tuple(K.shape)}")
    if mask is not None and (not torch.is_tensor(mask) or mask.dtype != torch.bool):
        raise TypeError(f"mask must be a boolean tensor (True = admissible), got {getattr(mask, 'dtype', type(mask))}")
    full = torch.ones((), dtype=torch.bool, device=K.device) if mask is None else mask.to(K.device)
    try:
        full = torch.broadcast_to(full, K.shape).reshape(-1, *K.shape[-2:])
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to K {tuple(K.shape)}") from None
    K = K.reshape(-1, *K.shape[-2:])
    rows, cols = full.any(-1), full.any(-2)
    n_rows, n_cols = rows.sum(-1, keepdim=True).to(K.dtype), cols.sum(-1, keepdim=True).clamp_min(1).to(K.dtype)
    target = n_rows / n_cols  # the column mass of a masked doubly stochastic matrix
    col_sums = K.sum(-2)
    col = ((col_sums - target).abs() * cols).sum(-1) / n_cols[:, 0]
    row = ((K.sum(-1) - 1).abs() * rows).sum(-1) / n_rows[:, 0].clamp_min(1)
    kl = float(kl_to_sinkhorn(K).mean()) if with_kl else float("nan")
    curve = torch.where(cols, col_sums / target, torch.inf).sort(-1).values
    curve = torch.nanmean(curve.masked_fill(torch.isinf(curve), torch.nan), 0)
    return StochasticitySummary(float(col.mean()), float(row.mean()), kl, curve.cpu().numpy())


def _attention_parameters(model: nn.Module):
    params = []
    for module in model.modules():
        if isinstance(module, MultiheadAttention):  # the query and key blocks (views of torch's packed weight)
            e = module.embed_dim
            w = module.in_proj_weight
            params += [w[:e], w[e:2 * e]] if w is not None else [module.q_proj_weight, module.k_proj_weight]
    if not params:
        raise ValueError("model has no sinkflow.nn.MultiheadAttention modules to perturb")
    return params


@torch.no_grad()
def instability_score(model: nn.Module, inputs, eps: float = 1e-3, n_draws: int = 4, seed: int = 0) -> float:
    r"""Sensitivity of the output to a random perturbation of the query and key weights.

    .. math:: S = \mathbb E_\delta \frac{\|f_{\theta + \delta}(x) - f_\theta(x)\|^2 / B}{\|\delta\|^2},

    with :math:`\delta` i.i.d. Gaussian of standard deviation ``eps`` on the query and key
    projection weights of every attention module (where the normalization acts), ``f`` the
    model output on the batch ``inputs`` of size ``B`` (eval mode, torch's random state reset to
    ``seed`` before every forward pass, so random landmarks do not count). For small ``eps`` it is
    the mean squared directional derivative of the output along random weight
    directions. It is *not* the Skyformer paper's instability score (that one follows the
    optimizer's updates of all the weights and the embeddings after the layers:
    :func:`update_instability`), and its ratios to SoftMax are not comparable with the
    paper's: the logits of an unnormalized (Gaussian-kernel) attention move with the sum,
    not the mean, of the value vectors, so this proxy grows with the sequence length.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies import PatchViT, instability_score
    >>> torch.manual_seed(0) and None
    >>> model = PatchViT(8, 2, 1, 10, dim=16)
    >>> instability_score(model, torch.rand(8, 1, 8, 8)) > 0
    True
    """
    if eps <= 0 or n_draws < 1:
        raise ValueError("eps must be positive and n_draws at least 1")
    was_training = model.training
    model.eval()
    params = _attention_parameters(model)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    devices = sorted({p.device.index or 0 for p in params if p.device.type == "cuda"})

    def forward():  # same random state every call: Nyström landmarks must not count as instability
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return model(inputs).float()

    base = forward()
    batch = base.shape[0]
    scores = []
    try:
        for _ in range(n_draws):
            deltas = [eps * torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.device, p.dtype)
                      for p in params]
            saved = [p.detach().clone() for p in params]  # (p + d) - d != p in floating point
            for p, d in zip(params, deltas, strict=True):
                p.add_(d)
            try:
                out = forward()
            finally:
                for p, s in zip(params, saved, strict=True):
                    p.copy_(s)
            num = float(((out - base) ** 2).sum()) / batch
            den = float(sum((d.float() ** 2).sum() for d in deltas))
            scores.append(num / den)
    finally:
        model.train(was_training)
    return float(np.mean(scores))


def _same_randomness(model: nn.Module, seed: int, fn):
    """``fn()`` with torch's random state set to ``seed`` and restored afterwards (CPU and CUDA)."""
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return fn()


def update_instability(model: nn.Module, inputs, step, seed: int = 0) -> float:
    r"""The Skyformer paper's instability score of one optimizer step (its Appendix F).

    .. math:: \tau = \frac{\|f(x; W^+) - f(x; W)\|_F^2}{\|W^+ - W\|_F^2},

    where ``step()`` moves all the trainable weights from :math:`W` to :math:`W^+` (e.g.
    ``optimizer.step``; the gradients must already be computed), :math:`x` is ``inputs`` (the
    batch of that step) and :math:`f` is ``model.features`` (the token embeddings after the
    layers and the final LayerNorm, e.g. :meth:`sinkflow.studies.SequenceClassifier.features`).
    Both evaluations run without gradients, in eval mode, with torch's random state reset to
    ``seed`` (random Nyström landmarks do not count). The paper computes :math:`\tau_i` for
    the first 20 steps of training from the same initialization and batches, divides each
    by SoftMax's :math:`\tau_i` and averages the 20 ratios
    (:func:`sinkflow.studies.validation.summarize`, ``update_instability_ratio_to_softmax``).

    Parameters
    ----------
    model : torch.nn.Module
        Has a ``features(inputs)`` method.
    inputs : torch.Tensor
        The step's batch.
    step : callable
        Performs the update, e.g. ``optimizer.step``.
    seed : int

    Returns
    -------
    float
        :math:`\tau` (NaN when the step did not move the weights).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies import SequenceClassifier, update_instability
    >>> torch.manual_seed(0) and None
    >>> model = SequenceClassifier(10, 12, 3, dim=16, pooling="mean")
    >>> x, y = torch.randint(0, 10, (4, 12)), torch.tensor([0, 1, 2, 0])
    >>> opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    >>> torch.nn.functional.cross_entropy(model(x), y).backward()
    >>> update_instability(model, x, opt.step) > 0
    True
    """
    features = getattr(model, "features", None)
    if not callable(features):
        raise ValueError(f"{type(model).__name__} has no features(inputs) method (the embeddings after the layers)")
    params = [p for p in model.parameters() if p.requires_grad]
    was_training = model.training

    def embed():
        model.eval()
        try:
            with torch.no_grad():
                return _same_randomness(model, seed, lambda: features(inputs)).float()
        finally:
            model.train(was_training)

    before = embed()
    saved = [p.detach().clone() for p in params]
    step()
    after = embed()
    with torch.no_grad():
        num = float(((after - before) ** 2).sum())
        den = float(sum(((p.detach() - s).float() ** 2).sum() for p, s in zip(params, saved, strict=True)))
    return num / den if den > 0 else float("nan")
