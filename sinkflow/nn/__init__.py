"""Torch attention with SoftMax, Sinkhorn or Gaussian-kernel normalization, small models,
generated data, and training that tracks doubly stochasticity (docs/theory/training.md).

Layers: :mod:`~sinkflow.nn.functional` (attention on per-head tensors) ->
:mod:`~sinkflow.nn.attention` (modules) -> :mod:`~sinkflow.nn.models` ->
:mod:`~sinkflow.nn.data`, :mod:`~sinkflow.nn.tracking` -> :mod:`~sinkflow.nn.training` ->
:mod:`~sinkflow.nn.validation` (the tasks behind ``sinkflow validate``).
"""

from sinkflow.nn.attention import AttentionKernel, MultiheadAttention
from sinkflow.nn.functional import (
    attention_weights,
    available_normalizations,
    register_normalization,
    scaled_attention,
)
from sinkflow.nn.models import AttentionBlock, PatchViT, SequenceClassifier, SetClassifier
from sinkflow.nn.tracking import (
    AttentionRecorder,
    StochasticitySummary,
    instability_score,
    stochasticity_summary,
    update_instability,
)
from sinkflow.nn.training import TrainConfig, TrainingHistory, evaluate, train

__all__ = [
    # attention modules
    "MultiheadAttention", "AttentionKernel", "attention_weights", "scaled_attention",
    "available_normalizations", "register_normalization",
    # models
    "AttentionBlock", "PatchViT", "SetClassifier", "SequenceClassifier",
    # tracking
    "AttentionRecorder", "StochasticitySummary", "stochasticity_summary", "instability_score",
    "update_instability",
    # training
    "TrainConfig", "TrainingHistory", "train", "evaluate",
]
