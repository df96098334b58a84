"""sinkflow: attention as interacting particles, made runnable and checkable.

Importing the package is instant: every public name below is loaded from its module on
first use (PEP 562 module ``__getattr__``), so ``sinkflow --help`` or ``import sinkflow``
never pay for torch, scipy or matplotlib they do not use. ``from sinkflow import X``,
``sinkflow.X``, ``sinkflow.__all__`` and ``dir(sinkflow)`` all behave as with eager imports.
Submodules (``sinkflow.nn``, ``sinkflow.plots``, ...) are loaded on first access too.

To export a new name, add it to :data:`_EXPORTS` (one line per defining module).
"""

from __future__ import annotations

import importlib
import pkgutil

__version__ = "0.1.0"

#: Public names by the folder that defines them (the groups of the API reference).
_EXPORTS: dict[str, tuple[str, ...]] = {
    # scores, normalizations, the one attention interface, kernelized attention and Nyström
    "sinkflow.attention": ("softmax", "sinkhorn", "solve_sinkhorn", "SinkhornResult", "SinkhornWarning",
                           "dot_scores", "gaussian_scores",
                           "AttentionVariant", "register_attention", "get_attention", "available_attentions",
                           "gaussian_kernel", "kernelized_attention_matrix", "kernelized_attention", "lifted_kernel",
                           "sample_landmarks", "iterative_inverse", "newton_schulz_pinv", "NystromFactors",
                           "nystrom_factors", "nystrom_matrix", "nystrom_attention", "segment_means",
                           "nystromformer_factors", "nystromformer_matrix", "nystromformer_attention",
                           "landmark_block"),
    # doubly stochasticity; Nyström spectral-norm error bounds
    "sinkflow.bounds": ("MarginalErrors", "marginal_errors", "sorted_column_sums", "kl_to_sinkhorn",
                        "hilbert_diameter", "birkhoff_hopf_rate", "asymptotic_rate", "observed_rate",
                        "LANDMARK_CONSTANT", "SHARP_LANDMARK_CONSTANT", "spectral_norm", "extreme_eigenvalues",
                        "ridge_leverage_scores", "statistical_dimension", "beta_star", "landmarks_required",
                        "binomial_interval", "NystromErrors", "nystrom_errors", "NystromCheck",
                        "nystrom_check", "smallest_sufficient_landmarks"),
    # particle flows and their energies
    "sinkflow.particles": ("simulate", "Trajectory", "random_particles", "cluster_statistics", "cluster_labels",
                           "renyi_centers",
                           "energy_0", "energy_gaussian", "energy_inf", "energy_log_partition", "energy_sphere",
                           "entropic_ot", "gradient_flow_error", "jacobian_asymmetry", "harmonic_attention_field",
                           "harmonic_kernel"),
    # heat-diffusion limit: references, rescaled flows, distances
    "sinkflow.heat": ("GaussianMixture", "Barenblatt", "GridHeatSolution", "solve_heat_grid",
                      "heat_flow", "heat_trajectory", "heat_velocity", "heat_reference", "barycentric_map",
                      "HeatFlowResult",
                      "wasserstein2", "moment_errors", "kde_l1", "fit_loglog_slope", "convergence_study",
                      "wasserstein2_to_grid",
                      "mean_field_flow", "MeanFieldResult",
                      "gaussian_moment_flow", "GaussianMomentFlow", "gaussian_attention_field", "AffineField"),
    # clustering on the circle and the sphere: linear theory and cluster counts
    "sinkflow.clustering": ("circle_growth_rate", "predict_clusters", "fastest_mode", "sphere_growth_rate",
                            "count_clusters",
                            "angular_density", "phase_diagram", "energy_hessian", "unstable_directions",
                            "two_cluster_dwell", "point_cluster_dwell"),
    # parameter sweeps (experiments live in sinkflow.experiments) and the plot of their tables
    "sinkflow.sweeps": ("sweep", "SweepError"),
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
