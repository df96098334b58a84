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
from sinkflow.sweeps import SweepError, plot_sweep, sweep

__version__ = "0.1.0"

__all__ = [
    # normalizations
    "softmax", "sinkhorn", "solve_sinkhorn", "SinkhornResult", "SinkhornWarning",
    # scores
    "dot_scores", "gaussian_scores",
    # doubly stochasticity
    "MarginalErrors", "marginal_errors", "sorted_column_sums", "kl_to_sinkhorn",
    "hilbert_diameter", "birkhoff_hopf_rate", "asymptotic_rate", "observed_rate",
    # parameter sweeps (experiments live in sinkflow.experiments)
    "sweep", "plot_sweep", "SweepError",
]
