"""Tokens as particles: the attention vector field and the flows it drives.

``_simulate.py`` has :func:`simulate` (a residual attention layer is an explicit Euler
step): its keywords are checked once into small settings objects, and the evaluation path of the
field is chosen once, in one place, and recorded on the trajectory (``_settings.py``); one system
runs in ``_system.py``, an ensemble in ``_ensembles.py`` (batched, or system by system through the
same ``run_system``), with its integrators (``_integrators.py``), monitors (``_monitors.py``) and step-size
guard (``_step_size.py``); the field on particles is evaluated densely
(``_dense_fields.py``), block by block without an ``n x n`` matrix
(``_blockwise_fields.py``) or with ``m`` Nyström landmarks in ``O(n m)``
(``_lowrank_fields.py``, the landmarks chosen in ``_landmarks.py``) or, on the circle and
:math:`S^2` with identity matrices, exactly in ``O(n r)`` by harmonic expansion
(``_harmonic_fields.py`` on ``_harmonic_kernels.py`` and ``_harmonic_bases.py``); ``_energies.py``
has the energies and the gradient-flow checks.
Start reading at ``_simulate.py``.
"""

from sinkflow.particles._blockwise_fields import (
    DEFAULT_BLOCK_BYTES,
    LazyField,
    cache_block_bytes,
    lazy_attention_field,
)
from sinkflow.particles._causal import causal_mask, renyi_centers
from sinkflow.particles._dense_fields import (
    ATTENTIONS,
    FieldEvaluation,
    attention_field,
    check_matrix,
    check_weights,
    dense_limit,
    single_thread_if_small,
)
from sinkflow.particles._energies import (
    energy_0,
    energy_gaussian,
    energy_inf,
    energy_log_partition,
    energy_sphere,
    entropic_ot,
    gradient_flow_error,
    jacobian_asymmetry,
)
from sinkflow.particles._equiangular import (
    EquiangularFlow,
    equiangular_flow,
    equiangular_start,
)
from sinkflow.particles._harmonic_fields import (
    HARMONIC_MIN_N,
    HarmonicField,
    HarmonicParticleField,
    harmonic_attention_field,
    harmonic_choice,
)
from sinkflow.particles._harmonic_kernels import (
    HarmonicKernel,
    harmonic_kernel,
)
from sinkflow.particles._integrators import (
    INTEGRATORS,
    ParticleField,
    euler_step,
    rk4_step,
)
from sinkflow.particles._landmarks import (
    FPS_BLOCK,
    LANDMARK_METHODS,
    LANDMARK_SAMPLINGS,
    farthest_point_indices,
    gaussian_coordinates,
    landmark_indices,
)
from sinkflow.particles._lowrank_fields import (
    LowRankField,
    NystromPositivityError,
    lowrank_attention_field,
)
from sinkflow.particles._monitors import (
    ATTENTION_RANK_RTOL,
    MAX_MONITOR_N,
    MONITOR_FUNCTIONS,
    MONITOR_KEYS,
    MONITORS,
    MonitorContext,
    MonitorRecords,
    attention_rank,
    cluster_labels,
    cluster_statistics,
)
from sinkflow.particles._placements import (
    PLACEMENT_NORMALIZATIONS,
    PLACEMENTS,
    Placement,
    placement,
)
from sinkflow.particles._simulate import (
    Trajectory,
    default_tol,
    random_particles,
    simulate,
)
from sinkflow.particles._step_size import (
    largest_safe_step,
    lipschitz_scale,
)

__all__ = [
    "LazyField", "lazy_attention_field", "DEFAULT_BLOCK_BYTES", "cache_block_bytes", "LANDMARK_METHODS",
    "LANDMARK_SAMPLINGS", "FPS_BLOCK", "landmark_indices", "farthest_point_indices", "gaussian_coordinates",
    "NystromPositivityError", "LowRankField", "lowrank_attention_field", "ATTENTIONS", "FieldEvaluation",
    "attention_field", "dense_limit", "check_matrix", "check_weights", "single_thread_if_small", "energy_0",
    "energy_gaussian", "energy_inf", "energy_log_partition", "energy_sphere", "entropic_ot",
    "gradient_flow_error", "jacobian_asymmetry", "ParticleField", "euler_step", "rk4_step", "INTEGRATORS",
    "MAX_MONITOR_N", "cluster_statistics", "cluster_labels", "MonitorContext", "MonitorRecords", "MONITOR_FUNCTIONS",
    "MONITORS", "MONITOR_KEYS", "attention_rank", "ATTENTION_RANK_RTOL",
    "lipschitz_scale", "largest_safe_step", "simulate", "Trajectory", "random_particles",
    "default_tol", "causal_mask", "renyi_centers",
    "HARMONIC_MIN_N", "HarmonicKernel", "HarmonicField", "HarmonicParticleField", "harmonic_kernel",
    "harmonic_attention_field", "harmonic_choice",
    "Placement", "placement", "PLACEMENTS", "PLACEMENT_NORMALIZATIONS", "equiangular_flow", "equiangular_start",
    "EquiangularFlow",
]
