r"""Clustering of attention dynamics on the circle and the sphere: the linear theory of the uniform
state and the clusters particles form (docs/theory/mean_field.md).

Tokens on the circle (or on :math:`S^2`) under :func:`sinkflow.simulate` with ``manifold="sphere"`` and
:math:`Q = K = V = I` leave the uniform state along its fastest-growing Fourier mode (spherical
harmonic on :math:`S^2`) and form that many clusters before they merge. Start reading at
``_linear_theory.py``: the growth rates :func:`circle_growth_rate` and :func:`sphere_growth_rate`,
the predicted count :func:`fastest_mode`, the formation time, and the cluster counts of particles
(:func:`particle_cluster_count`) and of densities (:func:`angular_density`, :func:`count_clusters`);
``_predictions.py`` predicts the count and the positions from an initial configuration
(:func:`predict_clusters`) and runs Bruno et al.'s experiment (:func:`plateau_clusters`);
``_metastability.py`` measures how long each count lasts (the two-cluster law :func:`two_cluster_dwell`,
the flow of point clusters :func:`point_cluster_dwell`, :func:`plateau_run`, :func:`fit_exponent`, the
staircase levels) and ``_saddles.py`` checks plateaus as
saddles of the climbed energy (:math:`E_\beta` for SoftMax, :math:`-F^\infty` for Sinkhorn; :func:`energy_hessian`,
:func:`unstable_directions`); ``prediction_study`` and ``metastability_study`` run the studies whose data
the theory page reads (``python -m sinkflow.clustering.<study> --help``);
``_phase_diagram.py``: the fraction of clustered systems against :math:`\beta` and :math:`t`
(:func:`phase_diagram`, a pandas table; :func:`clustered_fractions`, the same numbers as arrays;
thousands of systems per ensemble call).
The mean-field velocity on a circle grid that :func:`sinkflow.mean_field_flow` integrates stays in
:mod:`sinkflow.heat` (``_circle_field.py``), one floor down.
"""

from sinkflow.clustering._hardmax import (
    HardmaxTargets,
    frank_wolfe_energy,
    hardmax_dwell,
    hardmax_flow,
    hardmax_targets,
)
from sinkflow.clustering._linear_theory import (
    angular_density,
    circle_energy,
    circle_growth_rate,
    count_clusters,
    fastest_mode,
    formation_time,
    fourier_amplitude,
    particle_cluster_count,
    sphere_growth_rate,
)
from sinkflow.clustering._long_context import (
    CriticalScaling,
    critical_scaling,
    equiangular_cosine,
    selectivity_threshold,
)
from sinkflow.clustering._metastability import (
    count_history,
    dwell_times,
    fit_exponent,
    plateau_run,
    point_cluster_dwell,
    staircase_level,
    two_cluster_dwell,
)
from sinkflow.clustering._phase_diagram import clustered_fractions, phase_diagram
from sinkflow.clustering._predictions import (
    ClusterPrediction,
    cluster_centers,
    cluster_positions,
    mode_history,
    plateau_clusters,
    position_error,
    predict_clusters,
    sphere_mode_maxima,
    sphere_plateau_clusters,
)
from sinkflow.clustering._saddles import energy_hessian, tangent_basis, unstable_directions
from sinkflow.clustering._value_geometry import GEOMETRY_KINDS, LimitGeometry, limit_geometry

__all__ = ["circle_growth_rate", "fastest_mode", "sphere_growth_rate", "formation_time", "fourier_amplitude",
           "angular_density", "count_clusters", "circle_energy", "particle_cluster_count", "phase_diagram",
           "clustered_fractions", "ClusterPrediction", "predict_clusters", "cluster_positions", "position_error",
           "plateau_clusters", "sphere_plateau_clusters", "cluster_centers", "sphere_mode_maxima", "mode_history",
           "count_history", "dwell_times", "energy_hessian", "unstable_directions", "tangent_basis",
           "two_cluster_dwell", "point_cluster_dwell", "staircase_level", "fit_exponent", "plateau_run",
           "limit_geometry", "LimitGeometry", "GEOMETRY_KINDS",
           "hardmax_flow", "HardmaxTargets", "hardmax_targets", "frank_wolfe_energy", "hardmax_dwell",
           "equiangular_cosine", "CriticalScaling", "critical_scaling", "selectivity_threshold"]
