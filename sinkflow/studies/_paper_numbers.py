"""The Skyformer paper's published Long Range Arena numbers (accuracy, cost, instability), which
sinkflow's reports are put beside, and how a missing number is printed.
"""

from __future__ import annotations

__all__ = ["PAPER", "SINKFORMERS"]


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


#: Sinkformers paper (Sander et al., AISTATS 2022). Table 1, ModelNet40 test accuracy in % over 4 runs
#: (best, median, mean, worst) of the Set Transformer (2 ISABs, 16 inducing points, width 256, 4 heads, PMA) and
#: its Sinkformer; its MNIST patch-size figure gives no table (5 seeds, patch sizes 1 to 28, one-layer one-head
#: attention-only ViT, Sinkhorn with 5 iterations against SoftMax). The ModelNet40 digits were entered without
#: a copy of the paper to check them against; the direction (Sinkformer ahead) is the paper's stated claim.
SINKFORMERS = {
    "modelnet40": {"softmax": {"best": 87.8, "median": 86.3, "mean": 85.8, "worst": 84.7},
                   "sinkhorn": {"best": 89.1, "median": 88.4, "mean": 88.3, "worst": 88.1}, "runs": 4},
}
