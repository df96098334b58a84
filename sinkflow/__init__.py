"""sinkflow: attention as interacting particles, made runnable and checkable."""

from sinkflow.normalizations import SinkhornResult, SinkhornWarning, sinkhorn, softmax, solve_sinkhorn
from sinkflow.scores import dot_scores, gaussian_scores
from sinkflow.stochasticity import (
    MarginalErrors,
    asymptotic_rate,
    birkhoff_hopf_rate,
    hilbert_diameter,
    kl_to_sinkhorn,
    marginal_errors,
    observed_rate,
    sorted_column_sums,
)
from sinkflow.heat import Barenblatt, GaussianMixture, GridHeatSolution, solve_heat_grid
from sinkflow.heat_limit import (
    HeatFlowResult,
    barycentric_map,
    heat_flow,
    heat_reference,
    heat_trajectory,
    heat_velocity,
)
from sinkflow.distances import (
    convergence_study,
    fit_loglog_slope,
    kde_l1,
    moment_errors,
    wasserstein2,
)

__version__ = "0.1.0"

__all__ = [
    # normalizations
    "softmax", "sinkhorn", "solve_sinkhorn", "SinkhornResult", "SinkhornWarning",
    # scores
    "dot_scores", "gaussian_scores",
    # doubly stochasticity
    "MarginalErrors", "marginal_errors", "sorted_column_sums", "kl_to_sinkhorn",
    "hilbert_diameter", "birkhoff_hopf_rate", "asymptotic_rate", "observed_rate",
    # heat-diffusion limit: references, rescaled flows, distances (issue 4)
    "GaussianMixture", "Barenblatt", "GridHeatSolution", "solve_heat_grid",
    "heat_flow", "heat_trajectory", "heat_velocity", "heat_reference", "barycentric_map", "HeatFlowResult",
    "wasserstein2", "moment_errors", "kde_l1", "fit_loglog_slope", "convergence_study",
]
