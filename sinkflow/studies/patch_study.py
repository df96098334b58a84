r"""The Sinkformers paper's patch-size study in shape, on the 8 x 8 digits the package ships.

The paper trains a one-layer, one-head, attention-only Transformer on MNIST cut into patches
of decreasing size and reports that Sinkformer's advantage over SoftMax grows as the patch
shrinks (more, smaller tokens). :func:`patch_size_study` trains
:class:`sinkflow.studies.PatchViT` (one layer, one head, pre-LayerNorm, class token) with SoftMax
and Sinkhorn attention on scikit-learn's digits at patch sizes 1, 2 and 4 (64, 16 and 4
tokens), the same seeds for both, and gives per patch size the paired accuracy difference
(Sinkhorn minus SoftMax) with a 95% Student-t confidence interval over the seeds.
"""

from __future__ import annotations

import numpy as np
import torch

from sinkflow.studies.data import digits, split
from sinkflow.studies.intervals import t_interval
from sinkflow.studies.models import PatchViT
from sinkflow.studies.training import TrainConfig, train

__all__ = ["patch_size_study", "patch_size_report"]


def _curve(train_data, test_data, patch: int, attention: str, n_iter: int, seed: int, epochs: int, dim: int,
           lr: float) -> np.ndarray:
    """Test accuracy after each epoch (index 0: initialization) of one seeded run."""
    torch.manual_seed(seed)
    model = PatchViT(8, patch, 1, train_data.n_classes, dim=dim, heads=1, depth=1, normalization=attention,
                     n_iter=n_iter)
    config = TrainConfig(epochs=epochs, batch_size=64, lr=lr, seed=seed, track_kl=False, instability_eps=None,
                         probe_size=16)
    return np.asarray(train(model, train_data, test_data, config).test_accuracy, dtype=float)


def _interval(diff: np.ndarray) -> tuple[float, float]:
    """95% Student-t interval of the mean of the paired differences (NaN with one seed)."""
    return t_interval(diff)[1:]


def _row(p: int, curves: dict, seeds, epochs: int, n_train: int, tail: int) -> dict:
    """One patch size: per-seed accuracies (mean of the last ``tail`` epochs), intervals, SoftMax's plateau."""
    acc = {a: [float(c[-tail:].mean()) for c in cs] for a, cs in curves.items()}
    diff = np.asarray(acc["sinkhorn"]) - np.asarray(acc["softmax"])
    soft = np.stack(curves["softmax"])
    gain = soft[:, -tail:].mean(1) - soft[:, -2 * tail:-tail].mean(1) if epochs >= 2 * tail else np.zeros(1)
    return {"patch_size": p, "tokens": (8 // p) ** 2, "seeds": list(seeds), "epochs": epochs, "n_train": n_train,
            "tail": tail, "accuracy": acc, "mean": {a: float(np.mean(v)) for a, v in acc.items()},
            "ci95": {a: _interval(np.asarray(v)) for a, v in acc.items()},
            "difference": float(diff.mean()), "difference_ci95": _interval(diff),
            "curve": {a: np.stack(cs).mean(0).round(4).tolist() for a, cs in curves.items()},
            "softmax_plateau_gain": float(gain.mean()), "softmax_plateau_gain_ci95": _interval(gain)}


def patch_size_study(patch_sizes=(1, 2, 4), seeds=(0, 1, 2), *, quick: bool = True, n_iter: int = 3,
                     epochs: int | None = None, dim: int = 64, lr: float = 2e-3, tail: int | None = None) -> list[dict]:
    """Test accuracy of SoftMax and Sinkhorn one-layer one-head attention per patch size, paired by seed.

    Parameters
    ----------
    patch_sizes : sequence of int
        Divisors of 8.
    seeds : sequence of int
        Model seeds (both attentions get the same initialization seed and batch order).
    quick : bool
        600 images and 8 epochs (default); ``False``: all 1,797 images, 60 epochs.
    n_iter : int
        Sinkhorn half-iterations.
    epochs : int, optional
        Overrides the mode's epochs.
    dim, lr : int, float
    tail : int, optional
        A run's accuracy is the mean test accuracy of its last ``tail`` epochs (quick: 1, the final
        epoch; full: 5, which smooths the epoch-to-epoch noise of a 450-image test set).

    Returns
    -------
    list of dict
        Per patch size: ``tokens``, the accuracies per seed, their means and 95% t-intervals
        (``ci95``), the paired difference ``sinkhorn - softmax`` (mean and 95% t-interval), the
        mean test-accuracy curve per attention (``curve``, index 0 = initialization) and
        ``softmax_plateau_gain``: SoftMax's last ``tail`` epochs minus the ``tail`` before them
        (with its interval), near 0 once SoftMax has plateaued.

    Examples
    --------
    >>> from sinkflow.studies.patch_study import patch_size_study
    >>> rows = patch_size_study((4,), seeds=(0,), epochs=1, dim=8)
    >>> rows[0]["tokens"], sorted(rows[0]["accuracy"]), len(rows[0]["curve"]["softmax"])
    (4, ['sinkhorn', 'softmax'], 2)
    """
    if any(8 % p for p in patch_sizes):
        raise ValueError(f"patch sizes must divide 8, got {list(patch_sizes)}")
    data = digits()
    train_data, test_data = split(data.subset(slice(0, 600 if quick else len(data))), 0.25, seed=0)
    epochs = epochs or (8 if quick else 60)
    tail = min(tail or (1 if quick else 5), epochs)
    rows = []
    for p in patch_sizes:
        curves = {a: [_curve(train_data, test_data, p, a, n_iter if a == "sinkhorn" else 1, s, epochs, dim, lr)
                      for s in seeds] for a in ("softmax", "sinkhorn")}
        rows.append(_row(p, curves, seeds, epochs, len(train_data), tail))
    return rows


def patch_size_report(seeds=(0, 1, 2, 3, 4), *, quick: bool = True, n_iter: int | None = None, **study) -> dict:
    """:func:`patch_size_study` at patch sizes 1, 2, 4 as the JSON report ``docs/data/patch_size_*.json`` holds:
    the rows, the command, the wall time and the machine (threads, CPU model, load).

    ``n_iter`` defaults to 3 in the quick mode and to 5 in the full one (the paper's MNIST runs);
    ``study`` (``epochs``, ``dim``, ``lr``, ``tail``) goes to :func:`patch_size_study`.

    Examples
    --------
    >>> from sinkflow.studies.patch_study import patch_size_report
    >>> r = patch_size_report((0,), epochs=1, dim=8)
    >>> [row["tokens"] for row in r["rows"]], r["machine"]["threads"] >= 1
    ([64, 16, 4], True)
    """
    import time

    from sinkflow.studies.paper import machine

    n_iter = n_iter or (3 if quick else 5)
    start, t0 = machine(), time.perf_counter()
    rows = patch_size_study((1, 2, 4), tuple(seeds), quick=quick, n_iter=n_iter, **study)
    return {"study": "patch_size", "task": "patch_size", "mode": "study", "complete": True,
            "size": "quick" if quick else "full", "n_iter": n_iter,
            "command": f"patch_size_study((1, 2, 4), seeds={tuple(seeds)}, quick={quick}, n_iter={n_iter}"
                       + "".join(f", {k}={v!r}" for k, v in study.items()) + ")",
            "wall_time": time.perf_counter() - t0, "machine": start, "machine_end": machine(), "rows": rows}


