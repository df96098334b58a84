r"""Seeded training loop that tracks doubly stochasticity, accuracy, loss and time per epoch.

:func:`train` fits a classifier with Adam and cross-entropy and records, at epoch 0
(initialization) and after every epoch, on a fixed probe batch of the test set: the
attention matrices of the first attention layer summarized by
:func:`sinkflow.nn.stochasticity_summary`, and the perturbation proxy
:func:`sinkflow.nn.instability_score`; optionally, over the first optimizer steps, the
Skyformer paper's instability score :func:`sinkflow.nn.update_instability`. The result is a
:class:`TrainingHistory`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sinkflow.nn.data import Dataset
from sinkflow.nn.tracking import AttentionRecorder, instability_score, stochasticity_summary, update_instability

__all__ = ["TrainConfig", "TrainingHistory", "train", "evaluate"]


@dataclass(frozen=True)
class TrainConfig:
    """Optimization and tracking settings (frozen, seeded).

    Attributes
    ----------
    epochs, batch_size : int
    lr, weight_decay : float
        Adam(W) settings.
    seed : int
        Seeds the batch order (the model's initialization is the caller's: seed before building it).
    device : str
        ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
    amp : bool
        bfloat16 autocast for the model (normalizations stay float32); CUDA only.
    probe_size : int
        Test examples in the fixed batch whose attention is tracked.
    track_kl : bool
        Also compute KL to the Sinkhorn projection (a converged solve per matrix).
    instability_eps : float or None
        Weight perturbation of :func:`instability_score` (None: not computed).
    update_instability_steps : int
        Record the Skyformer paper's instability score :func:`update_instability` on each of
        the first this many optimizer steps (the paper: 20; 0: not recorded). The model needs
        a ``features`` method; these steps' extra forward passes (and the updates they bracket)
        are not counted in ``epoch_time``.
    progress : bool
        tqdm bar over epochs.
    """

    epochs: int = 10
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "cpu"
    amp: bool = False
    probe_size: int = 64
    track_kl: bool = True
    instability_eps: float | None = 1e-3
    update_instability_steps: int = 0
    progress: bool = False


@dataclass(frozen=True)
class TrainingHistory:
    """Per-epoch records; index 0 is the initialization, index ``e`` is after epoch ``e``.

    Attributes
    ----------
    loss : numpy.ndarray (E + 1,)
        Mean training loss over the epoch (index 0: loss of the initial model on the train set).
    train_accuracy, test_accuracy : numpy.ndarray (E + 1,)
    epoch_time : numpy.ndarray (E,)
        Seconds of optimization per epoch (forward + backward + step; no evaluation).
    column_deviation, row_deviation, kl : numpy.ndarray (E + 1,)
        :class:`~sinkflow.nn.StochasticitySummary` of the first attention layer on the probe batch.
    sorted_column_sums : numpy.ndarray (E + 1, n)
    instability : numpy.ndarray (E + 1,)
        :func:`~sinkflow.nn.instability_score` (NaN when not computed).
    update_instability : numpy.ndarray (S,)
        :func:`~sinkflow.nn.update_instability` of the first ``S`` optimizer steps
        (``S = config.update_instability_steps``, fewer when training is shorter; empty when
        not recorded).
    """

    loss: np.ndarray
    train_accuracy: np.ndarray
    test_accuracy: np.ndarray
    epoch_time: np.ndarray
    column_deviation: np.ndarray
    row_deviation: np.ndarray
    kl: np.ndarray
    sorted_column_sums: np.ndarray
    instability: np.ndarray
    update_instability: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def as_dict(self) -> dict:
        """JSON-ready dict of lists (NaN, e.g. no attention matrix to track, becomes None)."""
        def clean(v):
            if isinstance(v, np.ndarray):
                v = v.tolist()
            if isinstance(v, list):
                return [clean(x) for x in v]
            return None if isinstance(v, float) and not np.isfinite(v) else v
        return {k: clean(v) for k, v in self.__dict__.items()}


def _batches(n, batch_size, generator):
    perm = torch.randperm(n, generator=generator)
    return [perm[i:i + batch_size] for i in range(0, n, batch_size)]


def _autocast(device: torch.device, amp: bool):
    if amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, batch_size: int = 256, device="cpu", amp: bool = False) -> tuple[float, float]:
    """``(mean cross-entropy, accuracy)`` of ``model`` on ``data`` (eval mode).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn import PatchViT, evaluate
    >>> from sinkflow.nn.data import digits
    >>> loss, acc = evaluate(PatchViT(dim=16), digits().subset(slice(0, 100)))
    >>> 0 <= acc <= 1 and loss > 0
    True
    """
    device = torch.device(device)
    was_training = model.training
    model.eval()
    total, correct, n = 0.0, 0, len(data)
    for i in range(0, n, batch_size):
        x = data.inputs[i:i + batch_size].to(device)
        y = data.labels[i:i + batch_size].to(device)
        with _autocast(device, amp):
            logits = model(x).float()
        total += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(-1) == y).sum())
    model.train(was_training)
    return total / n, correct / n


def _probe(model, x, cfg, device):
    """Stochasticity of the first attention layer and instability score on the probe batch."""
    was_training = model.training
    model.eval()
    with torch.no_grad(), AttentionRecorder(model, to_cpu=False) as rec, _autocast(device, cfg.amp):
        model(x)
    model.train(was_training)
    if rec.matrices:
        first = next(iter(rec.matrices.values()))[0]
        summary = stochasticity_summary(first, with_kl=cfg.track_kl)
    else:  # output-only normalization: no attention matrix to summarize
        summary = None
    inst = float("nan")
    if cfg.instability_eps is not None:
        with _autocast(device, cfg.amp):
            inst = instability_score(model, x, eps=cfg.instability_eps, seed=cfg.seed)
    return summary, inst


def train(model: nn.Module, train_data: Dataset, test_data: Dataset, config: TrainConfig = TrainConfig()) -> TrainingHistory:
    """Train ``model`` (Adam, cross-entropy) and record the per-epoch trajectory.

    Parameters
    ----------
    model : torch.nn.Module
        Maps ``inputs`` batches to logits; moved to ``config.device``.
    train_data, test_data : Dataset
    config : TrainConfig

    Returns
    -------
    TrainingHistory

    Examples
    --------
    >>> import torch
    >>> from sinkflow.nn import PatchViT, TrainConfig, train
    >>> from sinkflow.nn.data import digits, split
    >>> tr, te = split(digits().subset(slice(0, 300)), 0.3)
    >>> torch.manual_seed(0) and None
    >>> hist = train(PatchViT(dim=16), tr, te, TrainConfig(epochs=2, track_kl=False))
    >>> hist.loss.shape, hist.sorted_column_sums.shape
    ((3,), (3, 17))
    """
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config.device is CUDA but torch.cuda.is_available() is False")
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    gen = torch.Generator().manual_seed(config.seed)
    probe = test_data.inputs[: config.probe_size].to(device)
    train_x, train_y = train_data.inputs.to(device), train_data.labels.to(device)

    rec = {k: [] for k in ("loss", "train_accuracy", "test_accuracy", "column_deviation", "row_deviation", "kl",
                           "sorted_column_sums", "instability")}
    times = []
    update_taus, step_count = [], 0

    def record(loss, train_acc):
        summary, inst = _probe(model, probe, config, device)
        rec["loss"].append(loss)
        rec["train_accuracy"].append(train_acc)
        rec["test_accuracy"].append(evaluate(model, test_data, device=device, amp=config.amp)[1])
        if summary is None:
            for k in ("column_deviation", "row_deviation", "kl"):
                rec[k].append(float("nan"))
            rec["sorted_column_sums"].append(None)
        else:
            rec["column_deviation"].append(summary.column_deviation)
            rec["row_deviation"].append(summary.row_deviation)
            rec["kl"].append(summary.kl)
            rec["sorted_column_sums"].append(summary.sorted_column_sums)
        rec["instability"].append(inst)

    loss0, acc0 = evaluate(model, train_data, device=device, amp=config.amp)
    record(loss0, acc0)
    epochs = range(1, config.epochs + 1)
    bar = None
    if config.progress:
        try:
            from sinkflow._progress import progress_bar
        except ImportError:  # a bare GPU machine may lack tqdm: train without a bar
            pass
        else:
            epochs = bar = progress_bar(epochs, desc="epochs", unit="ep", file=sys.stderr, leave=False)
    model.train()
    for _ in epochs:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        total, correct = torch.zeros((), device=device), torch.zeros((), device=device, dtype=torch.long)
        for idx in _batches(len(train_data), config.batch_size, gen):
            idx = idx.to(device)
            x, y = train_x[idx], train_y[idx]
            with _autocast(device, config.amp):
                logits = model(x).float()
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if step_count < config.update_instability_steps:  # its forward passes are not optimization time
                if device.type == "cuda":  # the backward queued so far is optimization time
                    torch.cuda.synchronize(device)
                t_extra = time.perf_counter()
                update_taus.append(update_instability(model, x, opt.step, seed=config.seed))
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 += time.perf_counter() - t_extra
            else:
                opt.step()
            step_count += 1
            total += loss.detach() * len(idx)
            correct += (logits.detach().argmax(-1) == y).sum()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        record(float(total) / len(train_data), int(correct) / len(train_data))
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss'][-1]:.3f}", acc=f"{rec['test_accuracy'][-1]:.3f}",
                               coldev=f"{rec['column_deviation'][-1]:.3f}")

    scs = rec["sorted_column_sums"]
    scs = np.stack(scs) if all(s is not None for s in scs) else np.full((len(scs), 0), np.nan)
    return TrainingHistory(
        loss=np.array(rec["loss"]), train_accuracy=np.array(rec["train_accuracy"]),
        test_accuracy=np.array(rec["test_accuracy"]), epoch_time=np.array(times),
        column_deviation=np.array(rec["column_deviation"]), row_deviation=np.array(rec["row_deviation"]),
        kl=np.array(rec["kl"]), sorted_column_sums=scs, instability=np.array(rec["instability"]),
        update_instability=np.array(update_taus, dtype=float))
