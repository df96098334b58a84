r"""The attention vector field on particles, evaluated densely, block by block, with landmarks, by
harmonic expansion, or for a batch of small systems.

Each module is one way to evaluate the same field :math:`v_i = \sum_j K_{ij} V x_j`: densely
(``_dense_fields.py``: :func:`attention_field`, which chooses among the others), block by block without an
``n x n`` matrix (``_blockwise_fields.py``), with ``m`` Nystrom landmarks in ``O(n m)`` (``_lowrank_fields.py``, the
landmarks chosen in ``_landmarks.py``), exactly in ``O(n r)`` on the circle and :math:`S^2` by harmonic expansion
(``_harmonic_fields.py`` on ``_harmonic_kernels.py``, ``_harmonic_bases.py`` and ``_harmonic_solvers.py``), or for
a batch of small systems at once (``_ensemble_fields.py``); causal masks in ``_causal.py``. A run's field, the
callable its integrator steps on with the warm start of the Sinkhorn potentials, is a :class:`ParticleField`
(``_particle_field.py``). The Sinkhorn solves run on :func:`sinkflow.attention` 's one solver. The flows that
integrate these fields are in :mod:`sinkflow.particles`.
"""

from sinkflow.fields._blockwise_fields import (
    DEFAULT_BLOCK_BYTES,
    LazyField,
    cache_block_bytes,
    lazy_attention_field,
)
from sinkflow.fields._causal import causal_mask, renyi_centers
from sinkflow.fields._dense_fields import (
    ATTENTIONS,
    FieldEvaluation,
    attention_field,
    check_matrix,
    check_weights,
    dense_limit,
    single_thread_if_small,
)
from sinkflow.fields._harmonic_fields import (
    HARMONIC_MIN_N,
    HarmonicField,
    HarmonicParticleField,
    harmonic_attention_field,
    harmonic_choice,
)
from sinkflow.fields._harmonic_kernels import (
    HarmonicKernel,
    harmonic_kernel,
)
from sinkflow.fields._landmarks import (
    FPS_BLOCK,
    LANDMARK_METHODS,
    LANDMARK_SAMPLINGS,
    farthest_point_indices,
    gaussian_coordinates,
    landmark_indices,
)
from sinkflow.fields._lowrank_fields import (
    LowRankField,
    NystromPositivityError,
    lowrank_attention_field,
)
from sinkflow.fields._particle_field import ParticleField

__all__ = [
    "LazyField",
    "lazy_attention_field",
    "DEFAULT_BLOCK_BYTES",
    "cache_block_bytes",
    "LANDMARK_METHODS",
    "LANDMARK_SAMPLINGS",
    "FPS_BLOCK",
    "landmark_indices",
    "farthest_point_indices",
    "gaussian_coordinates",
    "NystromPositivityError",
    "LowRankField",
    "lowrank_attention_field",
    "ATTENTIONS",
    "FieldEvaluation",
    "attention_field",
    "dense_limit",
    "check_matrix",
    "check_weights",
    "single_thread_if_small",
    "ParticleField",
    "causal_mask",
    "renyi_centers",
    "HARMONIC_MIN_N",
    "HarmonicKernel",
    "HarmonicField",
    "HarmonicParticleField",
    "harmonic_kernel",
    "harmonic_attention_field",
    "harmonic_choice",
]
