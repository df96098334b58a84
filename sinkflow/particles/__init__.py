"""Tokens as particles: the flows that the attention vector field drives.

``_simulate.py`` has :func:`simulate` (a residual attention layer is an explicit Euler
step): its keywords are checked once into small settings objects, and the evaluation path of the
field is chosen once, in one place, and recorded on the trajectory (``_settings.py``); one system
runs in ``_system.py``, an ensemble in ``_ensembles.py`` (batched, or system by system through the
same ``run_system``), with its integrators (``_integrators.py``), monitors (``_monitors.py``) and step-size
guard (``_step_size.py``); ``_energies.py`` has the energies and the gradient-flow checks, ``_placements.py``
where a normalization layer sits, ``_equiangular.py`` the flow of equiangular tokens. How the field is evaluated
(densely, block by block, with landmarks, by harmonic expansion, for ensembles) is :mod:`sinkflow.fields`; its
names stay importable from here too.
Start reading at ``_simulate.py``.
"""

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
from sinkflow.particles._integrators import (
    INTEGRATORS,
    euler_step,
    rk4_step,
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
    "energy_0",
    "energy_gaussian",
    "energy_inf",
    "energy_log_partition",
    "energy_sphere",
    "entropic_ot",
    "gradient_flow_error",
    "jacobian_asymmetry",
    "euler_step",
    "rk4_step",
    "INTEGRATORS",
    "MAX_MONITOR_N",
    "cluster_statistics",
    "cluster_labels",
    "MonitorContext",
    "MonitorRecords",
    "MONITOR_FUNCTIONS",
    "MONITORS",
    "MONITOR_KEYS",
    "attention_rank",
    "ATTENTION_RANK_RTOL",
    "lipschitz_scale",
    "largest_safe_step",
    "simulate",
    "Trajectory",
    "random_particles",
    "default_tol",
    "Placement",
    "placement",
    "PLACEMENTS",
    "PLACEMENT_NORMALIZATIONS",
    "equiangular_flow",
    "equiangular_start",
    "EquiangularFlow",
]


def __getattr__(name: str):
    """The field evaluators' names (:mod:`sinkflow.fields`), also reachable from here as before the split."""
    import sinkflow.fields

    if name in sinkflow.fields.__all__:
        return getattr(sinkflow.fields, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
