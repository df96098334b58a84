"""The many-particle limit: rescaled attention flows against the heat (or porous-medium) equation.

``_references.py`` has exact references (Gaussian mixtures, Barenblatt, an FFT grid
solver); ``_heat_velocity.py`` the rescaled layer's velocity, ``_rescaled_flow.py`` its flow
(:func:`heat_flow`, and the largest safe step), ``_limits.py`` the equations it tends to (the
time scale, :func:`heat_reference`, the barycentric map of a density);
``_distances.py`` W2, moment and KDE errors with fitted rates; ``_landmark_errors.py``
how far a landmark flow strays from the exact one; ``_mean_field.py`` the mean-field PDE
between particles and heat (:func:`mean_field_flow`, its velocity on a grid in
``_grid_fields.py``, on the circle in ``_circle_field.py``, its semi-Lagrangian step in ``_remap.py``;
``_gaussian_flows.py`` its closed form for a Gaussian (:func:`gaussian_moment_flow`, the moment ODE);
the linear theory of clustering on the circle and the sphere is one floor up, in :mod:`sinkflow.clustering`);
:mod:`sinkflow.heat.symbolic` the sympy
derivations used as test oracles (loaded on its own: it imports sympy).
Start reading at ``_rescaled_flow.py``.
"""

from sinkflow.heat._circle_field import (
    CIRCLE_NORMALIZATIONS,
    STEP,
    CircleVelocity,
    circle_field,
    uniform_angles,
)
from sinkflow.heat._distances import (
    ConvergenceStudy,
    MomentErrors,
    W2Result,
    convergence_study,
    fit_loglog_slope,
    grid_quantiles,
    kde_l1,
    moment_errors,
    wasserstein2,
    wasserstein2_to_grid,
)
from sinkflow.heat._gaussian_flows import (
    GAUSSIAN_NORMALIZATIONS,
    AffineField,
    GaussianMomentFlow,
    gaussian_attention_field,
    gaussian_moment_flow,
)
from sinkflow.heat._grid_fields import (
    EuclideanVelocity,
    default_tol,
    separable_apply,
    symmetric_sinkhorn_scaling,
)
from sinkflow.heat._heat_velocity import (
    HEAT_LAYERS,
    NORMALIZATIONS,
    heat_velocity,
)
from sinkflow.heat._landmark_errors import (
    LandmarkFlowErrors,
    heat_variance_errors,
    landmark_flow_errors,
    nystrom_spectral_error,
)
from sinkflow.heat._limits import (
    LIMIT_EQUATIONS,
    BarycentricMapResult,
    barycentric_map,
    heat_reference,
    limit_time_factor,
)
from sinkflow.heat._mean_field import (
    CFL,
    EUCLIDEAN_NORMALIZATIONS,
    MANIFOLDS,
    MeanFieldResult,
    flux_divergence,
    mean_field_flow,
)
from sinkflow.heat._references import (
    Barenblatt,
    GaussianMixture,
    GridHeatSolution,
    solve_heat_grid,
)
from sinkflow.heat._rescaled_flow import (
    HeatFlowResult,
    heat_flow,
    heat_trajectory,
    largest_safe_dt,
)

__all__ = [
    "GaussianMixture", "Barenblatt", "GridHeatSolution", "solve_heat_grid", "W2Result", "wasserstein2",
    "grid_quantiles", "wasserstein2_to_grid", "MomentErrors", "moment_errors", "kde_l1", "fit_loglog_slope",
    "ConvergenceStudy", "convergence_study", "NORMALIZATIONS", "HEAT_LAYERS", "heat_velocity", "HeatFlowResult",
    "heat_trajectory", "heat_flow", "largest_safe_dt", "LIMIT_EQUATIONS", "limit_time_factor", "heat_reference",
    "BarycentricMapResult", "barycentric_map", "LandmarkFlowErrors", "landmark_flow_errors",
    "nystrom_spectral_error", "heat_variance_errors", "symmetric_sinkhorn_scaling", "default_tol",
    "separable_apply", "EuclideanVelocity", "mean_field_flow", "MeanFieldResult", "EUCLIDEAN_NORMALIZATIONS",
    "MANIFOLDS", "flux_divergence", "CFL", "CIRCLE_NORMALIZATIONS", "CircleVelocity", "circle_field",
    "uniform_angles", "STEP", "GAUSSIAN_NORMALIZATIONS", "AffineField", "GaussianMomentFlow",
    "gaussian_attention_field", "gaussian_moment_flow",
]
