"""Bounds and rates: how doubly stochastic an attention is, how fast Sinkhorn gets there, and
the spectral-norm error of Skyformer's Nyström approximation against its theorem.

``_stochasticity.py`` (marginal errors, Birkhoff-Hopf, sigma_2 rates), ``_spectral.py``
(spectral norms, leverage scores, d_stat, the landmark count) and ``_nystrom_bounds.py``
(observed Nyström errors against the theorem: ``nystrom_check``) and ``_lipschitz.py`` (the local
Lipschitz constant of self-attention against the sequence length: ``attention_lipschitz``).
"""

from sinkflow.bounds._lipschitz import (
    LipschitzEstimate,
    adversarial_input,
    attention_lipschitz,
    lipschitz_upper_bound,
    query_key_matrix,
)
from sinkflow.bounds._nystrom_bounds import (
    NystromCheck,
    NystromErrors,
    nystrom_check,
    nystrom_errors,
    smallest_sufficient_landmarks,
)
from sinkflow.bounds._spectral import (
    LANDMARK_CONSTANT,
    SHARP_LANDMARK_CONSTANT,
    beta_star,
    binomial_interval,
    extreme_eigenvalues,
    landmarks_required,
    ridge_leverage_scores,
    spectral_norm,
    statistical_dimension,
)
from sinkflow.bounds._stochasticity import (
    MarginalErrors,
    asymptotic_rate,
    birkhoff_hopf_rate,
    hilbert_diameter,
    kl_to_sinkhorn,
    marginal_errors,
    observed_rate,
    sorted_column_sums,
)

__all__ = [
    "MarginalErrors", "marginal_errors", "sorted_column_sums", "kl_to_sinkhorn", "hilbert_diameter",
    "birkhoff_hopf_rate", "asymptotic_rate", "observed_rate", "LANDMARK_CONSTANT", "SHARP_LANDMARK_CONSTANT",
    "spectral_norm", "extreme_eigenvalues", "ridge_leverage_scores", "statistical_dimension", "beta_star",
    "landmarks_required", "binomial_interval", "NystromErrors", "nystrom_errors", "NystromCheck",
    "nystrom_check", "smallest_sufficient_landmarks", "LipschitzEstimate", "attention_lipschitz",
    "adversarial_input", "lipschitz_upper_bound", "query_key_matrix",
]
