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
from sinkflow.energies import (
    energy_0,
    energy_gaussian,
    energy_inf,
    energy_log_partition,
    energy_sphere,
    entropic_ot,
    gradient_flow_error,
    jacobian_asymmetry,
)
from sinkflow.particles import Trajectory, cluster_statistics, random_particles, simulate

from sinkflow.nystrom import (
    NystromFactors,
    gaussian_kernel,
    iterative_inverse,
    kernelized_attention,
    kernelized_attention_matrix,
    landmark_block,
    lifted_kernel,
    newton_schulz_pinv,
    nystrom_attention,
    nystrom_factors,
    nystrom_matrix,
    nystromformer_attention,
    nystromformer_factors,
    nystromformer_matrix,
    sample_landmarks,
    segment_means,
)
from sinkflow.nystrom_bounds import (
    LANDMARK_CONSTANT,
    SHARP_LANDMARK_CONSTANT,
    NystromCheck,
    NystromErrors,
    beta_star,
    binomial_interval,
    extreme_eigenvalues,
    landmarks_required,
    nystrom_check,
    nystrom_errors,
    ridge_leverage_scores,
    smallest_sufficient_landmarks,
    spectral_norm,
    statistical_dimension,
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
from sinkflow.sweeps import SweepError, plot_sweep, sweep
from sinkflow import datasets  # noqa: E402  (submodule: sinkflow.datasets.listops, .pathfinder)

__version__ = "0.1.0"

__all__ = [
    # normalizations
    "softmax", "sinkhorn", "solve_sinkhorn", "SinkhornResult", "SinkhornWarning",
    # scores
    "dot_scores", "gaussian_scores",
    # doubly stochasticity
    "MarginalErrors", "marginal_errors", "sorted_column_sums", "kl_to_sinkhorn",
    "hilbert_diameter", "birkhoff_hopf_rate", "asymptotic_rate", "observed_rate",
    # kernelized attention and Nyström (Skyformer, Nyströmformer)
    "gaussian_kernel", "kernelized_attention_matrix", "kernelized_attention", "lifted_kernel",
    "sample_landmarks", "iterative_inverse", "newton_schulz_pinv", "NystromFactors", "nystrom_factors",
    "nystrom_matrix", "nystrom_attention", "segment_means", "nystromformer_factors", "nystromformer_matrix",
    "nystromformer_attention", "landmark_block",
    # Nyström spectral-norm error bounds
    "LANDMARK_CONSTANT", "SHARP_LANDMARK_CONSTANT", "spectral_norm", "extreme_eigenvalues",
    "ridge_leverage_scores", "statistical_dimension", "beta_star", "landmarks_required", "binomial_interval",
    "NystromErrors", "nystrom_errors", "NystromCheck", "nystrom_check", "smallest_sufficient_landmarks",
    # particle flows and their energies
    "simulate", "Trajectory", "random_particles", "cluster_statistics",
    "energy_0", "energy_gaussian", "energy_inf", "energy_log_partition", "energy_sphere", "entropic_ot",
    "gradient_flow_error", "jacobian_asymmetry",
    # heat-diffusion limit: references, rescaled flows, distances
    "GaussianMixture", "Barenblatt", "GridHeatSolution", "solve_heat_grid",
    "heat_flow", "heat_trajectory", "heat_velocity", "heat_reference", "barycentric_map", "HeatFlowResult",
    "wasserstein2", "moment_errors", "kde_l1", "fit_loglog_slope", "convergence_study",
    # parameter sweeps (experiments live in sinkflow.experiments)
    "sweep", "plot_sweep", "SweepError",
]
