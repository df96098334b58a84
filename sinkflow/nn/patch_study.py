r"""The Sinkformers paper's patch-size study in shape, on the 8 x 8 digits the package ships.

The paper trains a one-layer, one-head, attention-only Transformer on MNIST cut into patches
of decreasing size and reports that Sinkformer's advantage over SoftMax grows as the patch
shrinks (more, smaller tokens). :func:`patch_size_study` trains
:class:`sinkflow.nn.PatchViT` (one layer, one head, pre-LayerNorm, class token) with SoftMax
and Sinkhorn attention on scikit-learn's digits at patch sizes 1, 2 and 4 (64, 16 and 4
tokens), the same seeds for both, and gives per patch size the paired accuracy difference
(Sinkhorn minus SoftMax) with a 95% Student-t confidence interval over the seeds.
"""

from __future__ import annotations

import numpy as np
import torch

from sinkflow.nn.data import digits, split
from sinkflow.nn.models import PatchViT
from sinkflow.nn.training import TrainConfig, train

__all__ = ["patch_size_study"]


def _accuracy(train_data, test_data, patch: int, attention: str, n_iter: int, seed: int, epochs: int, dim: int,
              lr: float) -> float:
    torch.manual_seed(seed)
    model = PatchViT(8, patch, 1, train_data.n_classes, dim=dim, heads=1, depth=1, normalization=attention,
                     n_iter=n_iter)
    config = TrainConfig(epochs=epochs, batch_size=64, lr=lr, seed=seed, track_kl=False, instability_eps=None,
                         probe_size=16)
    return float(train(model, train_data, test_data, config).test_accuracy[-1])


def _interval(diff: np.ndarray) -> tuple[float, float]:
    """95% Student-t interval of the mean of the paired differences (NaN with one seed)."""
    from scipy import stats

    if diff.size < 2:
        return float("nan"), float("nan")
    half = stats.t.ppf(0.975, diff.size - 1) * diff.std(ddof=1) / np.sqrt(diff.size)
    return float(diff.mean() - half), float(diff.mean() + half)


def patch_size_study(patch_sizes=(1, 2, 4), seeds=(0, 1, 2), *, quick: bool = True, n_iter: int = 3,
                     epochs: int | None = None, dim: int = 64, lr: float = 2e-3) -> list[dict]:
    """Test accuracy of SoftMax and Sinkhorn one-layer one-head attention per patch size, paired by seed.

    Parameters
    ----------
    patch_sizes : sequence of int
        Divisors of 8.
    seeds : sequence of int
        Model seeds (both attentions get the same initialization seed and batch order).
    quick : bool
        600 images and 8 epochs (default); ``False``: all 1,797 images, 30 epochs.
    n_iter : int
        Sinkhorn half-iterations.
    epochs : int, optional
        Overrides the mode's epochs.
    dim, lr : int, float

    Returns
    -------
    list of dict
        Per patch size: ``tokens``, the accuracies per seed, their means, the paired
        difference ``sinkhorn - softmax`` (mean and 95% t-interval).

    Examples
    --------
    >>> from sinkflow.nn.patch_study import patch_size_study
    >>> rows = patch_size_study((4,), seeds=(0,), epochs=1, dim=8)
    >>> rows[0]["tokens"], sorted(rows[0]["accuracy"])
    (4, ['sinkhorn', 'softmax'])
    """
    if any(8 % p for p in patch_sizes):
        raise ValueError(f"patch sizes must divide 8, got {list(patch_sizes)}")
    data = digits()
    train_data, test_data = split(data.subset(slice(0, 600 if quick else len(data))), 0.25, seed=0)
    epochs = epochs or (8 if quick else 30)
    rows = []
    for p in patch_sizes:
        acc = {a: [_accuracy(train_data, test_data, p, a, n_iter if a == "sinkhorn" else 1, s, epochs, dim, lr)
                   for s in seeds] for a in ("softmax", "sinkhorn")}
        diff = np.asarray(acc["sinkhorn"]) - np.asarray(acc["softmax"])
        rows.append({"patch_size": p, "tokens": (8 // p) ** 2, "seeds": list(seeds), "epochs": epochs,
                     "n_train": len(train_data), "accuracy": acc,
                     "mean": {a: float(np.mean(v)) for a, v in acc.items()},
                     "difference": float(diff.mean()), "difference_ci95": _interval(diff)})
    return rows


if __name__ == "__main__":  # python -m sinkflow.nn.patch_study [--full] > docs/data/patch_size_quick.json
    import json
    import sys

    torch.set_num_threads(1)
    quick = "--full" not in sys.argv[1:]
    seeds = (0, 1, 2, 3, 4)
    print(json.dumps({"study": "patch_size", "task": "patch_size", "mode": "study", "complete": True,
                      "size": "quick" if quick else "full",
                      "command": f"patch_size_study((1, 2, 4), seeds={seeds}, quick={quick})",
                      "rows": patch_size_study((1, 2, 4), seeds, quick=quick)}, indent=1))
