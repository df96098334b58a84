"""Attention primitives: scores, normalizations and the one registry of attention variants.

Everything the dynamics and the models compute starts here. ``_scores.py`` turns queries and
keys into a score matrix (dot product or Gaussian); ``_normalizations.py`` turns scores into
attention: SoftMax, and Sinkhorn's algorithm, log-stable, to a fixed number of half-steps
or to tolerance; ``_kernelized.py`` has the exact Gaussian-kernel attention of Skyformer,
``_nystrom.py`` its Nyström approximations (and Nyströmformer's), with the inverses of
``_inverses.py``; ``_variants.py`` is the registry (:func:`register_attention`) through which
particles, the heat layer and :mod:`sinkflow.nn` use every variant, defined once.
``_orthostochastic.py``, ``_esp.py`` and ``_lot.py`` register doubly stochastic variants that need
no full Sinkhorn loop (docs/theory/doubly_stochastic_variants.md).

Start reading at ``_variants.py`` (what an attention variant is), then
``_normalizations.py`` (SoftMax and the Sinkhorn solver's entry points). The solver's parts:
``_solver.py`` (the one Sinkhorn solver over kernel operators: the loop, the stopping rule, epsilon
scaling, the report), ``_operators.py`` (the dense operators: log domain and kernel domain, the
unrolled backward), ``_newton.py`` (Newton steps), ``_tolerances.py`` and ``_result.py``.
"""

# Doubly stochastic variants without a full Sinkhorn loop (each file registers itself once).
from sinkflow.attention._esp import esp_plan  # noqa: E402
from sinkflow.attention._hardmax import hardmax  # registers "hardmax"
from sinkflow.attention._inverses import (
    NystromWarning,
    inverse_residual,
    iterative_inverse,
    newton_schulz_pinv,
)
from sinkflow.attention._kernelized import (
    gaussian_kernel,
    kernelized_attention,
    kernelized_attention_matrix,
    lifted_kernel,
)
from sinkflow.attention._lot import LOT_RANK, lot_attention  # noqa: E402
from sinkflow.attention._normalizations import (
    sinkhorn,
    softmax,
    solve_sinkhorn,
)
from sinkflow.attention._nystrom import (
    NystromFactors,
    landmark_block,
    nystrom_attention,
    nystrom_factors,
    nystrom_matrix,
    nystromformer_attention,
    nystromformer_factors,
    nystromformer_matrix,
    sample_landmarks,
    segment_means,
)
from sinkflow.attention._orthostochastic import ORTHOSTOCHASTIC_METHODS, orthostochastic  # noqa: E402
from sinkflow.attention._prefix_sinkhorn import prefix_sinkhorn
from sinkflow.attention._result import (
    SinkhornResult,
    SinkhornWarning,
)
from sinkflow.attention._scores import (
    dot_scores,
    gaussian_scores,
)
from sinkflow.attention._tolerances import (
    attainable_error,
    default_tolerance,
)
from sinkflow.attention._variants import (
    AttentionVariant,
    Normalized,
    available_attentions,
    get_attention,
    register_attention,
)

__all__ = [
    "dot_scores", "gaussian_scores", "SinkhornWarning", "SinkhornResult", "attainable_error",
    "default_tolerance", "softmax", "sinkhorn", "solve_sinkhorn", "prefix_sinkhorn", "gaussian_kernel",
    "kernelized_attention_matrix", "kernelized_attention", "lifted_kernel", "iterative_inverse",
    "newton_schulz_pinv", "inverse_residual", "NystromWarning",
    "sample_landmarks", "NystromFactors", "nystrom_factors", "nystrom_matrix",
    "nystrom_attention", "segment_means", "nystromformer_factors", "nystromformer_matrix",
    "nystromformer_attention", "landmark_block", "Normalized", "AttentionVariant", "register_attention",
    "get_attention", "available_attentions", "orthostochastic", "ORTHOSTOCHASTIC_METHODS", "esp_plan",
    "lot_attention", "LOT_RANK", "hardmax",
]
