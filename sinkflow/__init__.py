"""sinkflow: attention as interacting particles, made runnable and checkable.

Importing the package is instant: every public name below is loaded from its module on
first use (PEP 562 module ``__getattr__``), so ``sinkflow --help`` or ``import sinkflow``
never pay for torch, scipy or matplotlib they do not use. ``from sinkflow import X``,
``sinkflow.X``, ``sinkflow.__all__`` and ``dir(sinkflow)`` all behave as with eager imports.
Submodules (``sinkflow.nn``, ``sinkflow.plots``, ...) are loaded on first access too.

Every name in the ``__all__`` of a public subpackage (all but ``sinkflow.cli``) is exported
here, listed in :data:`_EXPORTS` by subpackage: a static table, so that ``import sinkflow``
imports no subpackage to learn its names. ``tests/test_exports.py`` holds the table to the
subpackages' ``__all__`` and prints the lines to paste when a name is added or removed.
A name that two subpackages export for different objects is listed once, under the
subpackage :data:`_CLASHES` names.
"""

from __future__ import annotations

import importlib
import pkgutil

__version__ = "0.1.0"

#: Names two public subpackages export for different objects -> the subpackage whose object is ``sinkflow.name``
#: (the other stays importable from its own subpackage).
_CLASHES: dict[str, str] = {
    # the tolerance of particle flows (simulate's default); sinkflow.heat.default_tol is the grid solvers'
    "default_tol": "sinkflow.particles",
}

#: Public names by the subpackage that exports them (its ``__all__``, in its order; the groups of the API reference).
_EXPORTS: dict[str, tuple[str, ...]] = {
    # scores, normalizations, the one attention interface, kernelized attention and Nyström
    "sinkflow.attention": (
        "dot_scores", "gaussian_scores", "SinkhornWarning", "SinkhornResult", "attainable_error", "default_tolerance",
        "softmax", "sinkhorn", "solve_sinkhorn", "prefix_sinkhorn", "gaussian_kernel", "kernelized_attention_matrix",
        "kernelized_attention", "lifted_kernel", "iterative_inverse", "newton_schulz_pinv", "inverse_residual",
        "NystromWarning", "sample_landmarks",
        "NystromFactors", "nystrom_factors", "nystrom_matrix", "nystrom_attention", "segment_means",
        "nystromformer_factors", "nystromformer_matrix", "nystromformer_attention", "landmark_block", "Normalized",
        "AttentionVariant", "register_attention", "get_attention", "available_attentions", "orthostochastic",
        "ORTHOSTOCHASTIC_METHODS", "esp_plan", "lot_attention", "LOT_RANK", "hardmax",
    ),
    # doubly stochasticity; Nyström spectral-norm error bounds
    "sinkflow.bounds": (
        "MarginalErrors", "marginal_errors", "sorted_column_sums", "kl_to_sinkhorn", "hilbert_diameter",
        "birkhoff_hopf_rate", "asymptotic_rate", "observed_rate", "LANDMARK_CONSTANT", "SHARP_LANDMARK_CONSTANT",
        "spectral_norm", "extreme_eigenvalues", "ridge_leverage_scores", "statistical_dimension", "beta_star",
        "landmarks_required", "binomial_interval", "NystromErrors", "nystrom_errors", "NystromCheck", "nystrom_check",
        "smallest_sufficient_landmarks", "LipschitzEstimate", "attention_lipschitz", "adversarial_input",
        "lipschitz_upper_bound", "query_key_matrix",
    ),
    # the attention field on particles: dense, block-wise, landmarks, harmonic, ensembles
    "sinkflow.fields": (
        "LazyField", "lazy_attention_field", "DEFAULT_BLOCK_BYTES", "cache_block_bytes", "LANDMARK_METHODS",
        "LANDMARK_SAMPLINGS", "FPS_BLOCK", "landmark_indices", "farthest_point_indices", "gaussian_coordinates",
        "NystromPositivityError", "LowRankField", "lowrank_attention_field", "ATTENTIONS", "FieldEvaluation",
        "attention_field", "dense_limit", "check_matrix", "check_weights", "single_thread_if_small", "ParticleField",
        "causal_mask", "renyi_centers", "HARMONIC_MIN_N", "HarmonicKernel", "HarmonicField", "HarmonicParticleField",
        "harmonic_kernel", "harmonic_attention_field", "harmonic_choice",
    ),
    # particle flows: simulate, integrators, monitors, energies, placements
    "sinkflow.particles": (
        "energy_0", "energy_gaussian", "energy_inf", "energy_log_partition", "energy_sphere", "entropic_ot",
        "gradient_flow_error", "jacobian_asymmetry", "euler_step", "rk4_step", "INTEGRATORS", "MAX_MONITOR_N",
        "cluster_statistics", "cluster_labels", "MonitorContext", "MonitorRecords", "MONITOR_FUNCTIONS", "MONITORS",
        "MONITOR_KEYS", "attention_rank", "ATTENTION_RANK_RTOL", "lipschitz_scale", "largest_safe_step", "simulate",
        "Trajectory", "random_particles", "default_tol", "Placement", "placement", "PLACEMENTS",
        "PLACEMENT_NORMALIZATIONS", "equiangular_flow", "equiangular_start", "EquiangularFlow",
    ),
    # heat-diffusion limit: references, rescaled flows, distances, mean-field and moment flows
    "sinkflow.heat": (
        "GaussianMixture", "Barenblatt", "GridHeatSolution", "solve_heat_grid", "W2Result", "wasserstein2",
        "grid_quantiles", "wasserstein2_to_grid", "MomentErrors", "moment_errors", "kde_l1", "fit_loglog_slope",
        "ConvergenceStudy", "convergence_study", "NORMALIZATIONS", "HEAT_LAYERS", "heat_velocity", "HeatFlowResult",
        "heat_trajectory", "heat_flow", "largest_safe_dt", "LIMIT_EQUATIONS", "limit_time_factor", "heat_reference",
        "BarycentricMapResult", "barycentric_map", "LandmarkFlowErrors", "landmark_flow_errors",
        "nystrom_spectral_error", "heat_variance_errors", "symmetric_sinkhorn_scaling", "separable_apply",
        "EuclideanVelocity", "mean_field_flow", "MeanFieldResult", "EUCLIDEAN_NORMALIZATIONS", "MANIFOLDS",
        "flux_divergence", "CFL", "CIRCLE_NORMALIZATIONS", "CircleVelocity", "circle_field", "uniform_angles", "STEP",
        "GAUSSIAN_NORMALIZATIONS", "AffineField", "GaussianMomentFlow", "gaussian_attention_field",
        "gaussian_moment_flow",
    ),
    # clustering on the circle and the sphere: linear theory, cluster counts, metastability
    "sinkflow.clustering": (
        "circle_growth_rate", "fastest_mode", "sphere_growth_rate", "formation_time", "fourier_amplitude",
        "angular_density", "count_clusters", "circle_energy", "particle_cluster_count", "phase_diagram",
        "clustered_fractions", "ClusterPrediction", "predict_clusters", "cluster_positions", "position_error",
        "plateau_clusters", "sphere_plateau_clusters", "cluster_centers", "sphere_mode_maxima", "mode_history",
        "count_history", "dwell_times", "energy_hessian", "unstable_directions", "tangent_basis", "two_cluster_dwell",
        "point_cluster_dwell", "staircase_level", "fit_exponent", "plateau_run", "limit_geometry", "LimitGeometry",
        "GEOMETRY_KINDS", "hardmax_flow", "HardmaxTargets", "hardmax_targets", "frank_wolfe_energy", "hardmax_dwell",
        "equiangular_cosine", "CriticalScaling", "critical_scaling", "selectivity_threshold",
    ),
    # torch attention layers
    "sinkflow.nn": (
        "MultiheadAttention", "AttentionKernel", "attention_weights", "scaled_attention", "available_normalizations",
        "register_normalization",
    ),
    # small models, training with doubly-stochasticity tracking
    "sinkflow.studies": (
        "AttentionBlock", "PatchViT", "SetClassifier", "SequenceClassifier", "AttentionRecorder",
        "StochasticitySummary", "stochasticity_summary", "instability_score", "update_instability", "TrainConfig",
        "TrainingHistory", "train", "evaluate",
    ),
    # Long Range Arena data sets, generated offline
    "sinkflow.datasets": (
        "cache_dir", "LISTOPS_VOCAB", "listops", "listops_tokens", "pathfinder", "pathfinder_tokens",
    ),
    # seeded experiments for sweeps
    "sinkflow.experiments": (
        "sinkhorn_convergence", "heat_limit_point",
    ),
    # parameter sweeps
    "sinkflow.sweeps": (
        "SweepError", "expand_grid", "resolve_experiment", "point_key", "local_client", "close_client", "sweep",
    ),
    # the plots of sweeps and particle flows; the figure registry (register, get, render, ...) stays in
    # sinkflow.plots, where its generic verbs say what they act on
    "sinkflow.plots": ("plot_sweep", "animate", "circle_demo", "ParticleAnimation"),
    # running a block on n torch threads (small problems; reductions split alike on every machine)
    "sinkflow._backend": ("torch_threads", "fast_paths", "fast_paths_enabled"),
}

_ORIGIN = {name: module for module, names in _EXPORTS.items() for name in names}
_SUBMODULES = frozenset(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))

__all__ = list(_ORIGIN)


def __getattr__(name: str):
    """Load a public name (or a submodule) on first access and keep it in the namespace."""
    if name in _ORIGIN:
        value = getattr(importlib.import_module(_ORIGIN[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)
