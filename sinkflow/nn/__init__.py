"""Torch modules for attention with SoftMax, Sinkhorn or Gaussian-kernel normalization, small models,
generated data, training with doubly-stochasticity tracking (THEORY.md sections 5 and 8)."""

from sinkflow.nn.attention import (
    AttentionKernel,
    MultiheadAttention,
    attention_weights,
    available_normalizations,
    register_normalization,
    scaled_attention,
)

__all__ = [
    "available_normalizations", "AttentionKernel", "MultiheadAttention", "attention_weights", "register_normalization",
    "scaled_attention",
]
from sinkflow.nn.models import AttentionBlock, PatchViT, SequenceClassifier, SetClassifier  # noqa: E402

__all__ += ["AttentionBlock", "PatchViT", "SetClassifier", "SequenceClassifier"]
from sinkflow.nn.tracking import AttentionRecorder, StochasticitySummary, instability_score, stochasticity_summary  # noqa: E402

__all__ += ["AttentionRecorder", "StochasticitySummary", "stochasticity_summary", "instability_score"]
from sinkflow.nn.training import TrainConfig, TrainingHistory, evaluate, train  # noqa: E402

__all__ += ["TrainConfig", "TrainingHistory", "train", "evaluate"]
