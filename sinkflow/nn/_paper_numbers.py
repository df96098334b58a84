"""The Skyformer paper's published Long Range Arena numbers (accuracy, cost, instability), which
sinkflow's reports are put beside, and how a missing number is printed.
"""

from __future__ import annotations


__all__ = ["PAPER"]


#: Skyformer paper, Table 1 and Appendix F (2 layers, embedding 64, FFN 128, 2 heads, 128
#: landmarks, 50k steps, 3 seeds); accuracy in %, instability relative to SoftMax.
PAPER = {
    "listops": {"accuracy": {"softmax": 38.37, "gaussian": 38.78, "nystromformer": 38.51, "skyformer": 38.69},
                "instability_ratio": {"gaussian": 0.77, "nystromformer": 1.01, "skyformer": 0.79}},
    "pathfinder": {"accuracy": {"softmax": 65.26, "gaussian": 70.73, "nystromformer": 69.48, "skyformer": 70.73},
                   "instability_ratio": {"gaussian": 0.74, "nystromformer": 0.99, "skyformer": 0.79}},
    # Skyformer: 4.2-4.5x faster than SoftMax at LRA lengths, 6.5x less memory (text classification).
    "skyformer_speedup": (4.2, 4.5), "skyformer_memory_saving": 6.5,
    # Sinkformers: Sinkhorn attention ~2.5% more time per epoch than SoftMax (3m25 vs 3m20).
    "sinkhorn_time_ratio": 205 / 200,
}


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)
