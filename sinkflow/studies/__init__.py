"""Studies built on the attention layers: models, generated data, training that tracks doubly
stochasticity, and the papers' validations (docs/theory/training.md, docs/reproducing.md).

Start reading at :mod:`~sinkflow.studies.models` (small models on :class:`sinkflow.nn.MultiheadAttention`),
then :mod:`~sinkflow.studies.data` (generated data) and :mod:`~sinkflow.studies.tracking`
(attention recorders, doubly-stochasticity summaries, instability scores) ->
:mod:`~sinkflow.studies.training` (seeded training) -> :mod:`~sinkflow.studies.validation`
(the tasks behind ``sinkflow validate``). The Long Range Arena settings are in ``lra.py`` and
``paper.py`` (the papers' sizes and their cost rows, ``_cost.py``), the Sinkformers paper's studies in
``patch_study.py`` and ``point_clouds.py``; the markdown reports in ``paper_report.py`` and
``_study_report.py``, the papers' own numbers in ``_paper_numbers.py``.
"""

from sinkflow.studies.models import AttentionBlock, PatchViT, SequenceClassifier, SetClassifier
from sinkflow.studies.tracking import (
    AttentionRecorder,
    StochasticitySummary,
    instability_score,
    stochasticity_summary,
    update_instability,
)
from sinkflow.studies.training import TrainConfig, TrainingHistory, evaluate, train

__all__ = [
    # models
    "AttentionBlock", "PatchViT", "SetClassifier", "SequenceClassifier",
    # tracking
    "AttentionRecorder", "StochasticitySummary", "stochasticity_summary", "instability_score",
    "update_instability",
    # training
    "TrainConfig", "TrainingHistory", "train", "evaluate",
]
