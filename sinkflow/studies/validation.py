r"""Full-model validations of the Sinkformers and Skyformer claims (docs/theory/training.md).

A task is data + model + optimization settings in a quick (CPU, < 2 min for the default
sweep on 2 cores) and a full (GPU-size) version. :func:`run_validation` trains every
(attention, n_iter, seed) combination and returns a JSON-ready report with the
per-epoch trajectories and a summary table.

Tasks
-----
``digits``
    Sinkformers RQ1 probe: attention-only one-layer one-head ViT (pre-LayerNorm, class
    token) on scikit-learn's 8x8 digits in 2x2 patches (16 tokens + class token).
    quick: 1200 images, dim 64, 20 epochs, batch 64. full: all 1797 images, dim 64,
    60 epochs, batch 64.
``digits-mean``
    The same without LayerNorm and with mean pooling (docs/theory/training.md: there the
    column-sum deviation grows during training instead).
``pointclouds``
    Set-Transformer-style classifier (2 pre-LN blocks, 4 heads, max pooling, point norm as
    an extra input) on point clouds of shapes with noise and random rotations. quick:
    5 shapes, 80 clouds per shape, 32 points, dim 32, batch 16, 15 epochs. full: 8 shapes, 600 per shape, 512 points,
    dim 128, 40 epochs.
``retrieval``
    Needle retrieval in long token sequences (marked tokens carry the label), one pre-LN
    block with 2 heads and a class token. quick: length 128, 720 sequences, one needle,
    8 classes, dim 32, 6 epochs. full: length 1024, 8000 sequences, two needles whose
    classes add modulo 4, dim 64, 30 epochs.
``listops``, ``pathfinder``
    Long Range Arena tasks of the Skyformer paper (:mod:`sinkflow.studies.lra`, data from
    :mod:`sinkflow.datasets`). full: the paper's model (2 layers, embedding 64, FFN 128,
    2 heads of dimension 32, mean pooling, 128 landmarks) on LRA-size data (ListOps
    lengths 500-2,000, 12,000 expressions, 5 epochs; Pathfinder 32 x 32, 20,000 images,
    10 epochs). quick (chosen so that a run fits the CPU budget and ListOps learns above
    chance in it, never tuned toward the paper's numbers): embedding 32, 32 landmarks;
    ListOps of depth 3, at most 4 arguments and 6 to 39 tokens (2,000 expressions, 6 epochs
    of batch 32, learning rate 3e-3: about 280 steps); Pathfinder 10 x 10 with two 2-dash
    paths and no distractor (1,200 images, 4 epochs, learning rate 1e-3: about 115 steps).
    Pathfinder stays at chance in that budget although a pixel MLP separates the same quick
    images (the label is in the data): the Transformer plateau lasts longer than quick mode.
    Reports add time per step, step memory, the paper's instability score (its Appendix F:
    the first 20 optimizer steps of every run, ratio to SoftMax) and a comparison with the
    paper (``"paper_comparison"``).

    learn (``--learn``; a CPU setting that learns clearly above the majority class in
    minutes per run, picked from the small search in ``docs/data/learn_search.json``, never
    toward the paper's numbers): the official padding mask (token 0 out of attention and
    pooling), embedding 32, 2 layers, 32 landmarks, batch 32, constant learning rate.
    ListOps of depth 4, at most 5 arguments and 11 to 63 tokens (4,000 expressions, 8
    epochs, lr 3e-3, torch's N(0, 1) token embeddings); Pathfinder 12 x 12 with two 2-dash
    paths and no distractor (3,000 images, 20 epochs, lr 2e-3, the official N(0, 0.02^2)
    embeddings, without which the search's runs stayed near chance). Reports carry the
    majority baseline (:func:`majority_baseline`) and every run's machine (threads, CPU,
    load).

``sinkflow validate listops pathfinder --paper`` runs, on a CPU, what needs the paper's
setting but no GPU: cost per training step and the instability score of the first 20 steps
(:mod:`sinkflow.studies.paper`, docs/instability.md).

Full-size settings are meant for a GPU: ``sinkflow validate TASK --full --device cuda``
(optionally ``--amp`` for bfloat16 autocast; the normalizations stay float32).
"""

from __future__ import annotations

import dataclasses
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from sinkflow.studies._cost import step_memory
from sinkflow.studies.data import Dataset, digits, point_clouds, retrieval_sequences, retrieval_vocab_size, split
from sinkflow.studies.lra import PAPER, lra_data, lra_model, paper_comparison
from sinkflow.studies.models import PatchViT, SequenceClassifier, SetClassifier
from sinkflow.studies.paper import machine
from sinkflow.studies.training import TrainConfig, train

__all__ = ["TaskSize", "Task", "TASKS", "variant_label", "run_validation", "summarize", "majority_baseline",
           "PAPER_INSTABILITY_STEPS"]

#: Optimizer steps over which the Skyformer paper's instability score is recorded and
#: averaged (its Appendix F: the first 20 steps of training).
PAPER_INSTABILITY_STEPS = 20


@dataclass(frozen=True)
class TaskSize:
    """Sizes of one mode of a task (data, model width, optimization)."""

    n_samples: int
    dim: int
    epochs: int
    batch_size: int = 64
    lr: float = 2e-3
    seq_len: int = 0
    n_classes: int = 0
    probe_size: int = 64
    n_needles: int = 1
    depth: int = 1
    heads: int = 2
    mlp_ratio: int = 2
    landmarks: int = 64
    data: tuple = ()  # generator parameters as (name, value) pairs
    mask: bool = False  # LRA tasks: the official padding mask (token 0 left out of attention and features)
    embed_std: float | None = None  # LRA tasks: token and position embeddings N(0, std^2) (official: 0.02)


@dataclass(frozen=True)
class Task:
    """A validation task: ``data(size, seed) -> (train, test)``, ``model(size, data, normalization, n_iter)``."""

    name: str
    description: str
    data: Callable[[TaskSize, int], tuple[Dataset, Dataset]]
    model: Callable[[TaskSize, Dataset, str, int], torch.nn.Module]
    quick: TaskSize
    full: TaskSize
    learn: TaskSize | None = None  # ``--learn``: a CPU setting chosen to learn above the majority class


def _digits_data(size: TaskSize, seed: int):
    d = digits()
    return split(d.subset(slice(0, size.n_samples)), 0.25, seed=0)  # fixed split: seeds vary the model only


def _vit(pre_norm: bool, pooling: str):
    def make(size: TaskSize, data: Dataset, normalization: str, n_iter: int):
        return PatchViT(8, 2, 1, data.n_classes, dim=size.dim, heads=1, depth=1, normalization=normalization,
                        n_iter=n_iter, pre_norm=pre_norm, pooling=pooling)
    return make


def _cloud_data(size: TaskSize, seed: int):
    shapes = ("sphere", "cube", "torus", "cylinder", "cone", "octahedron", "helix", "plane")[: size.n_classes]
    d = point_clouds(size.n_samples // len(shapes), size.seq_len, shapes, noise=0.05, seed=1000)
    return split(d, 0.25, seed=0)


def _cloud_model(size: TaskSize, data: Dataset, normalization: str, n_iter: int):
    return SetClassifier(3, data.n_classes, dim=size.dim, heads=4, depth=2, normalization=normalization,
                         n_iter=n_iter, pooling="max", radial_feature=True)


def _retrieval_data(size: TaskSize, seed: int):
    d = retrieval_sequences(size.n_samples, size.seq_len, n_classes=size.n_classes, n_needles=size.n_needles, seed=1000)
    return split(d, 0.25, seed=0)


def _retrieval_model(size: TaskSize, data: Dataset, normalization: str, n_iter: int):
    return SequenceClassifier(retrieval_vocab_size(n_classes=data.n_classes), data.inputs.shape[1], data.n_classes,
                              dim=size.dim, heads=2, depth=1, normalization=normalization, n_iter=n_iter)


def _lra(task: str):
    def data(size: TaskSize, seed: int):
        return lra_data(task, size.n_samples, dict(size.data))

    def model(size: TaskSize, data: Dataset, normalization: str, n_iter: int):
        return lra_model(data, normalization, n_iter, size.dim, size.depth, size.heads, size.mlp_ratio, size.landmarks,
                         mask=size.mask, embed_std=size.embed_std)
    return data, model


# The paper's LRA model (Skyformer, Appendix F) in full mode; learning rates of its LRA setup.
_PAPER_MODEL = dict(dim=64, depth=2, heads=2, mlp_ratio=2, landmarks=128, batch_size=32, lr=1e-4)

#: The registered validation tasks by name.
TASKS: dict[str, Task] = {
    "digits": Task("digits", "one-layer attention-only ViT, pre-LN + class token, 8x8 digits (Sinkformers RQ1)",
                   _digits_data, _vit(True, "cls"),
                   quick=TaskSize(1200, 64, 20), full=TaskSize(1797, 64, 60)),
    "digits-mean": Task("digits-mean", "same ViT without LayerNorm, mean pooling (the variant where the claim fails)",
                        _digits_data, _vit(False, "mean"),
                        quick=TaskSize(1200, 64, 20), full=TaskSize(1797, 64, 60)),
    "pointclouds": Task("pointclouds", "Set-Transformer classifier of rotated noisy 3D shapes (ModelNet in spirit)",
                        _cloud_data, _cloud_model,
                        quick=TaskSize(400, 32, 15, lr=3e-3, seq_len=32, n_classes=5, batch_size=16, probe_size=32),
                        full=TaskSize(4800, 128, 40, seq_len=512, n_classes=8, batch_size=64, lr=1e-3)),
    "retrieval": Task("retrieval", "needle retrieval in long token sequences (Skyformer-style long-range task)",
                      _retrieval_data, _retrieval_model,
                      quick=TaskSize(720, 32, 6, seq_len=128, n_classes=8, batch_size=32, probe_size=16),
                      full=TaskSize(8000, 64, 30, seq_len=1024, n_classes=4, batch_size=32, lr=1e-3, probe_size=16,
                                    n_needles=2)),
    "listops": Task("listops",
                    "LRA ListOps: value of nested MAX/MIN/MED/SM expressions, 10 classes (Skyformer Table 1)",
                    *_lra("listops"),
                    quick=TaskSize(2000, 32, 6, batch_size=32, lr=3e-3, seq_len=39, n_classes=10, probe_size=16,
                                   depth=2, heads=2, mlp_ratio=2, landmarks=32,
                                   data=(("max_depth", 3), ("max_args", 4), ("min_length", 5), ("max_length", 40))),
                    full=TaskSize(12000, epochs=5, seq_len=1999, n_classes=10, probe_size=16, **_PAPER_MODEL),
                    learn=TaskSize(4000, 32, 8, batch_size=32, lr=3e-3, seq_len=63, n_classes=10, probe_size=16,
                                   depth=2, heads=2, mlp_ratio=2, landmarks=32, mask=True,
                                   data=(("max_depth", 4), ("max_args", 5), ("min_length", 10), ("max_length", 64)))),
    "pathfinder": Task("pathfinder", "LRA Pathfinder: do two markers lie on one dashed path? (Skyformer Table 1)",
                       *_lra("pathfinder"),
                       quick=TaskSize(1200, 32, 4, batch_size=32, lr=1e-3, seq_len=100, n_classes=2, probe_size=16,
                                      depth=2, heads=2, mlp_ratio=2, landmarks=32,
                                      data=(("resolution", 10), ("path_length", 2), ("n_distractors", 0))),
                       full=TaskSize(20000, epochs=10, seq_len=1024, n_classes=2, probe_size=16,
                                     **{**_PAPER_MODEL, "lr": 2e-4}),
                       learn=TaskSize(3000, 32, 20, batch_size=32, lr=2e-3, seq_len=144, n_classes=2, probe_size=16,
                                      depth=2, heads=2, mlp_ratio=2, landmarks=32, mask=True,
                                      embed_std=0.02,
                                      data=(("resolution", 12), ("path_length", 2), ("n_distractors", 0)))),
}


def variant_label(attention: str, n_iter: int) -> str:
    """``"sinkhorn(3)"`` for Sinkhorn, the plain name otherwise."""
    return f"{attention}({n_iter})" if attention == "sinkhorn" else attention


def _variants(attentions, n_iters):
    out = []
    for a in attentions:
        if a == "sinkhorn":
            out += [(a, int(k)) for k in n_iters]
        else:
            out.append((a, 1))
    return out


def run_validation(task: str, attentions=("softmax", "sinkhorn"), n_iters=(1, 3, 5), seeds=(0, 1, 2),
                   device: str = "cpu", quick: bool = True, amp: bool = False, epochs: int | None = None,
                   track_kl: bool = True, progress: bool = False, log: Callable[[str], None] | None = None,
                   on_run: Callable[[dict], None] | None = None, size_overrides: dict | None = None,
                   learn: bool = False) -> dict:
    """Train every (attention, n_iter, seed) on ``task``; return a JSON-ready report.

    Parameters
    ----------
    task : str
        A key of :data:`TASKS`.
    attentions : sequence of str
        Normalizations; ``"sinkhorn"`` expands to one variant per ``n_iters`` entry.
    n_iters : sequence of int
        Sinkhorn half-iterations (1 = SoftMax exactly: when ``"softmax"`` is also requested,
        the ``sinkhorn(1)`` entries reuse the SoftMax runs, marked ``"reused_from"``).
    seeds : sequence of int
        Model initialization and batch-order seeds (the data set and split are fixed).
    device : str
    quick : bool
        Quick (CPU) or full (GPU) sizes.
    amp : bool
        bfloat16 autocast on CUDA.
    epochs : int, optional
        Override the task's epoch count.
    track_kl, progress : bool
    log : callable, optional
        Receives one line per finished run.
    on_run : callable, optional
        Receives the partial report (``"complete": False``) after every run, e.g. to save it,
        so a run cut short by a time limit still leaves its results.
    size_overrides : dict, optional
        Replace fields of the task's :class:`TaskSize` (e.g. tiny sizes in tests).
    learn : bool
        The task's ``learn`` sizes (CPU, chosen to learn above the majority class: listops,
        pathfinder); overrides ``quick``. The report's mode is then ``"learn"``.

    Returns
    -------
    dict
        ``{"task", "mode", "complete", "config", "environment", "baseline", "runs": [...], "summary": [...]}``;
        each run holds a :meth:`TrainingHistory.as_dict` under ``"history"``, its wall time and
        the machine's threads, CPU model and load before it (:func:`sinkflow.studies.paper.machine`);
        ``"baseline"`` is :func:`majority_baseline` of the split.

    Examples
    --------
    >>> from sinkflow.studies.validation import run_validation
    >>> rep = run_validation("digits", ["softmax"], seeds=[0], epochs=1, track_kl=False)
    >>> rep["summary"][0]["variant"], len(rep["runs"][0]["history"]["loss"])
    ('softmax', 2)
    """
    spec = TASKS.get(task)
    mode, size = _task_size(task, spec, learn, quick, epochs, size_overrides)

    def report(complete: bool) -> dict:
        out = {
            "task": task, "description": spec.description, "mode": mode, "complete": complete,
            "config": {"size": dataclasses.asdict(size), "attentions": list(attentions),
                       "n_iters": [int(k) for k in n_iters], "seeds": [int(s) for s in seeds], "device": device,
                       "amp": amp, "n_train": len(train_data), "n_test": len(test_data)},
            "environment": {"torch": torch.__version__, "python": sys.version.split()[0],
                            "platform": platform.platform(),
                            "threads": torch.get_num_threads(),
                            "gpu": torch.cuda.get_device_name(0) if str(device).startswith("cuda") else None},
            "total_time": time.perf_counter() - t_start,
            "memory_method": memory_method[0],
            "baseline": baseline,
            "runs": runs,
            "summary": summarize(runs),
        }
        if task in PAPER:
            out["paper_comparison"] = paper_comparison(out)
        return out

    train_data, test_data = spec.data(size, 0)
    baseline = majority_baseline(train_data.labels, test_data.labels)
    n_batches = -(-len(train_data) // size.batch_size)
    memory_method = [None]
    runs = []
    t_start = time.perf_counter()
    # Seeds outer, variants inner: a run cut short by a time limit still compares every variant.
    for seed in seeds:
        for attention, n_iter in _variants(attentions, n_iters):
            if attention == "sinkhorn" and n_iter == 1 and "softmax" in attentions:
                # Sinkhorn with one half-iteration *is* SoftMax (bitwise; tests/nn/test_nn.py): reuse the run.
                soft = next(r for r in runs if r["variant"] == "softmax" and r["seed"] == seed)
                runs.append({**soft, "attention": "sinkhorn", "n_iter": 1, "variant": "sinkhorn(1)",
                             "reused_from": "softmax"})
                continue
            torch.manual_seed(seed)
            model = spec.model(size, train_data, attention, n_iter)
            cfg = TrainConfig(epochs=size.epochs, batch_size=size.batch_size, lr=size.lr, seed=seed, device=device,
                              amp=amp, probe_size=size.probe_size, track_kl=track_kl, progress=progress,
                              update_instability_steps=PAPER_INSTABILITY_STEPS if task in PAPER else 0)
            env = machine()
            t0 = time.perf_counter()
            hist = train(model, train_data, test_data, cfg)
            wall = time.perf_counter() - t0
            memory, memory_method[0] = step_memory(model, train_data.inputs[: size.batch_size].to(device),
                                                   train_data.labels[: size.batch_size].to(device))
            step_time = float(np.median(hist.epoch_time)) / n_batches if len(hist.epoch_time) else None
            run = {"attention": attention, "n_iter": n_iter, "variant": variant_label(attention, n_iter),
                   "seed": int(seed), "wall_time": wall, "step_time": step_time, "memory": memory,
                   "machine": env, "history": hist.as_dict()}
            runs.append(run)
            if log is not None:
                cd = hist.column_deviation
                log(f"{task} {run['variant']:<12} seed {seed}: test acc {hist.test_accuracy[-1]:.3f}, "
                    f"col dev {cd[0]:.3f}/{cd[min(1, len(cd) - 1)]:.3f}/{cd[-1]:.3f} (epoch 0/1/last), "
                    f"{np.median(hist.epoch_time) if len(hist.epoch_time) else float('nan'):.3f} s/epoch")
            if on_run is not None:
                on_run(report(False))
    return report(True)


def _task_size(task: str, spec, learn: bool, quick: bool, epochs, size_overrides) -> tuple[str, TaskSize]:
    """The mode (learn, quick or full) and the :class:`TaskSize` of a validation run, overrides applied."""
    if spec is None:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    if learn and spec.learn is None:
        raise ValueError(f"task {task!r} has no learn setting; tasks with one: "
                         f"{', '.join(t for t, v in TASKS.items() if v.learn is not None)}")
    mode = "learn" if learn else ("quick" if quick else "full")
    size = {"learn": spec.learn, "quick": spec.quick, "full": spec.full}[mode]
    if epochs is not None:
        size = dataclasses.replace(size, epochs=int(epochs))
    if size_overrides:
        size = dataclasses.replace(size, **size_overrides)
    return mode, size


def majority_baseline(train_labels, test_labels) -> dict:
    """What predicting one class gets: the training set's most frequent class and its test accuracy.

    ``test_majority`` is the largest class share of the test set (no constant prediction
    does better on it); an accuracy row means learning only clearly above both.

    Examples
    --------
    >>> from sinkflow.studies.validation import majority_baseline
    >>> majority_baseline([0, 1, 1, 2], [1, 0, 0, 0])
    {'class': 1, 'accuracy': 0.25, 'test_majority': 0.75}
    """
    train_labels = np.asarray(train_labels, dtype=np.int64).ravel()
    test_labels = np.asarray(test_labels, dtype=np.int64).ravel()
    if not train_labels.size or not test_labels.size:
        raise ValueError("majority_baseline needs non-empty train and test labels")
    cls = int(np.bincount(train_labels).argmax())
    return {"class": cls, "accuracy": float(np.mean(test_labels == cls)),
            "test_majority": float(np.bincount(test_labels).max() / test_labels.size)}


def _stats(values) -> dict:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"median": None, "min": None, "max": None}
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max())}


def _update_instability_ratio(run: dict, soft: dict | None) -> float | None:
    """Mean over the recorded steps of the run's update instability over SoftMax's at the same step."""
    if soft is None:
        return None
    a = np.asarray(run["history"].get("update_instability") or [], dtype=float)
    b = np.asarray(soft["history"].get("update_instability") or [], dtype=float)
    k = min(len(a), len(b))
    ratios = a[:k] / b[:k] if k else np.zeros(0)
    ratios = ratios[np.isfinite(ratios)]
    return float(ratios.mean()) if ratios.size else None


def summarize(runs: list[dict]) -> list[dict]:
    """One row per variant: final test accuracy, column deviation at epochs 0 / 1 / last,
    fraction of seeds where it decreased from epoch 1 to the end, epoch time, instability
    (and its ratio to SoftMax's median when SoftMax was run).

    ``update_instability_ratio_to_softmax`` is the Skyformer paper's instability ratio
    (Appendix F): per seed, the mean over the first optimizer steps of the variant's
    :func:`sinkflow.studies.update_instability` divided by SoftMax's at the same step (same seed,
    so same initialization and batches); the row holds the median over seeds (None without
    SoftMax runs or recorded steps). ``instability_ratio_to_softmax`` is the ratio of the
    final perturbation proxies :func:`sinkflow.studies.instability_score`."""
    rows = []
    order = list(dict.fromkeys(r["variant"] for r in runs))
    for variant in order:
        rs = [r for r in runs if r["variant"] == variant]
        h = [r["history"] for r in rs]
        cd = [np.asarray(x["column_deviation"], dtype=float) for x in h]
        rows.append({
            "variant": variant, "attention": rs[0]["attention"], "n_iter": rs[0]["n_iter"],
            "seeds": [r["seed"] for r in rs],
            "test_accuracy": _stats([x["test_accuracy"][-1] for x in h]),
            "column_deviation_epoch0": _stats([c[0] for c in cd]),
            "column_deviation_epoch1": _stats([c[min(1, len(c) - 1)] for c in cd]),
            "column_deviation_last": _stats([c[-1] for c in cd]),
            "decreased_from_epoch1": int(sum(bool(c[-1] < c[min(1, len(c) - 1)]) for c in cd)),
            "kl_last": _stats([x["kl"][-1] for x in h]),
            "epoch_time": _stats([np.median(x["epoch_time"]) for x in h if len(x["epoch_time"])]),
            "instability_last": _stats([x["instability"][-1] for x in h]),
            "step_time": _stats([r["step_time"] for r in rs if r.get("step_time") is not None]),
            "memory": _stats([r["memory"] for r in rs if r.get("memory") is not None]),
            "update_instability_ratio_to_softmax": _stats([
                _update_instability_ratio(r, next((s for s in runs
                                                   if s["variant"] == "softmax" and s["seed"] == r["seed"]), None))
                for r in rs])["median"],
        })
    ref = next((r for r in rows if r["variant"] == "softmax"), None)
    for r in rows:
        num, den = r["instability_last"]["median"], ref["instability_last"]["median"] if ref else None
        r["instability_ratio_to_softmax"] = num / den if num is not None and den else None
        for key in ("epoch_time", "step_time", "memory"):
            v, v0 = r[key]["median"], ref[key]["median"] if ref else None
            r[f"{key}_ratio_to_softmax"] = v / v0 if v is not None and v0 else None
    return rows
