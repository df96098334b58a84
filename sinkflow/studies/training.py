r"""Seeded training loop that tracks doubly stochasticity, accuracy, loss and time per epoch.

:func:`train` fits a classifier with Adam and cross-entropy and records, at epoch 0
(initialization) and after every epoch, on a fixed probe batch of the test set: the
attention matrices of the first attention layer summarized by
:func:`sinkflow.studies.stochasticity_summary`, and the perturbation proxy
:func:`sinkflow.studies.instability_score`; optionally, over the first optimizer steps, the
Skyformer paper's instability score :func:`sinkflow.studies.update_instability`. The result is a
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

from sinkflow._summary import Summarized, number
from sinkflow.studies.data import Dataset
from sinkflow.studies.tracking import AttentionRecorder, instability_score, stochasticity_summary, update_instability

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


@dataclass(frozen=True, repr=False)
class TrainingHistory(Summarized):
    """Per-epoch records; index 0 is the initialization, index ``e`` is after epoch ``e``.

    Its ``repr`` states the epochs, the final loss and accuracies and the attention's
    doubly-stochasticity at the start and the end, never the arrays.

    Attributes
    ----------
    loss : numpy.ndarray (E + 1,)
        Mean training loss over the epoch (index 0: loss of the initial model on the train set).
    train_accuracy, test_accuracy : numpy.ndarray (E + 1,)
    epoch_time : numpy.ndarray (E,)
        Seconds of optimization per epoch (forward + backward + step; no evaluation).
    column_deviation, row_deviation, kl : numpy.ndarray (E + 1,)
        :class:`~sinkflow.studies.StochasticitySummary` of the first attention layer on the probe batch.
    sorted_column_sums : numpy.ndarray (E + 1, n)
    instability : numpy.ndarray (E + 1,)
        :func:`~sinkflow.studies.instability_score` (NaN when not computed).
    update_instability : numpy.ndarray (S,)
        :func:`~sinkflow.studies.update_instability` of the first ``S`` optimizer steps
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

    def _facts(self):
        epochs = len(self.loss) - 1

        def last(a):
            return number(np.asarray(a)[-1]) if np.size(a) else "none"

        def ends(a):
            return f"{number(np.asarray(a)[0])} -> {number(np.asarray(a)[-1])}" if np.size(a) else "none"

        seconds = f"{number(np.mean(self.epoch_time))} s" if np.size(self.epoch_time) else "none"
        return f"{epochs} epoch{'s' * (epochs != 1)}", [
            [("final loss", last(self.loss)), ("train accuracy", last(self.train_accuracy)),
             ("test accuracy", last(self.test_accuracy))],
            [("column deviation", ends(self.column_deviation)), ("time per epoch", seconds)],
        ]

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
def evaluate(model: nn.Module, data: Dataset, batch_size: int = 256, device="cpu",
             amp: bool = False) -> tuple[float, float]:
    """``(mean cross-entropy, accuracy)`` of ``model`` on ``data`` (eval mode).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies import PatchViT, evaluate
    >>> from sinkflow.studies.data import digits
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


def train(model: nn.Module, train_data: Dataset, test_data: Dataset,
          config: TrainConfig = TrainConfig()) -> TrainingHistory:
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
    >>> from sinkflow.studies import PatchViT, TrainConfig, train
    >>> from sinkflow.studies.data import digits, split
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
    run = _Run(model, opt, config, device, torch.Generator().manual_seed(config.seed))
    rec = _Recorder(model, test_data, config, device)
    rec.record(*evaluate(model, train_data, device=device, amp=config.amp))
    train_x, train_y = train_data.inputs.to(device), train_data.labels.to(device)
    epochs = _epoch_bar(config)
    bar = epochs if config.progress and not isinstance(epochs, range) else None
    model.train()
    for _ in epochs:
        loss, accuracy = run.epoch(train_x, train_y)
        rec.record(loss, accuracy)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.3f}", acc=f"{rec.rows['test_accuracy'][-1]:.3f}",
                            coldev=f"{rec.rows['column_deviation'][-1]:.3f}")
    return rec.history(run.times, run.update_taus)


def _epoch_bar(config: TrainConfig):
    """The epochs to run, behind a progress bar when asked (a bare GPU machine may lack tqdm)."""
    epochs = range(1, config.epochs + 1)
    if not config.progress:
        return epochs
    try:
        from sinkflow._progress import progress_bar
    except ImportError:
        return epochs
    return progress_bar(epochs, desc="epochs", unit="ep", file=sys.stderr, leave=False)


class _Recorder:
    """The per-epoch trajectory: losses, accuracies, and the stochasticity of the probe batch's attention."""

    KEYS = ("loss", "train_accuracy", "test_accuracy", "column_deviation", "row_deviation", "kl",
            "sorted_column_sums", "instability")

    def __init__(self, model, test_data, config, device):
        self.model, self.test_data, self.config, self.device = model, test_data, config, device
        self.probe = test_data.inputs[: config.probe_size].to(device)
        self.rows = {k: [] for k in self.KEYS}

    def record(self, loss: float, train_accuracy: float) -> None:
        summary, inst = _probe(self.model, self.probe, self.config, self.device)
        self.rows["loss"].append(loss)
        self.rows["train_accuracy"].append(train_accuracy)
        self.rows["test_accuracy"].append(evaluate(self.model, self.test_data, device=self.device,
                                                   amp=self.config.amp)[1])
        for k in ("column_deviation", "row_deviation", "kl", "sorted_column_sums"):
            missing = None if k == "sorted_column_sums" else float("nan")
            self.rows[k].append(missing if summary is None else getattr(summary, k))
        self.rows["instability"].append(inst)

    def history(self, times, update_taus) -> TrainingHistory:
        rows = self.rows
        scs = rows["sorted_column_sums"]
        scs = np.stack(scs) if all(s is not None for s in scs) else np.full((len(scs), 0), np.nan)
        arrays = {k: np.array(rows[k]) for k in self.KEYS if k != "sorted_column_sums"}
        return TrainingHistory(**arrays, sorted_column_sums=scs, epoch_time=np.array(times),
                               update_instability=np.array(update_taus, dtype=float))


class _Run:
    """The optimization: epochs of shuffled batches, timed, with the paper's update instability over the first steps."""

    def __init__(self, model, opt, config, device, generator):
        self.model, self.opt, self.config, self.device, self.gen = model, opt, config, device, generator
        self.times, self.update_taus, self.steps = [], [], 0

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def epoch(self, xs: torch.Tensor, ys: torch.Tensor) -> tuple[float, float]:
        """One pass over the inputs ``xs`` and labels ``ys`` (on the device); returns the mean loss and
        accuracy, and appends the epoch's seconds to ``times``."""
        self._sync()
        t0 = time.perf_counter()
        total = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        for idx in _batches(len(xs), self.config.batch_size, self.gen):
            idx = idx.to(self.device)
            x, y = xs[idx], ys[idx]
            with _autocast(self.device, self.config.amp):
                logits = self.model(x).float()
            loss = F.cross_entropy(logits, y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            t0 += self._step(x)
            total += loss.detach() * len(idx)
            correct += (logits.detach().argmax(-1) == y).sum()
        self._sync()
        self.times.append(time.perf_counter() - t0)
        return float(total) / len(xs), int(correct) / len(xs)

    def _step(self, x) -> float:
        """The optimizer step; returns the seconds spent measuring instability (not optimization time)."""
        self.steps += 1
        if self.steps > self.config.update_instability_steps:
            self.opt.step()
            return 0.0
        self._sync()  # the backward queued so far is optimization time
        t_extra = time.perf_counter()
        self.update_taus.append(update_instability(self.model, x, self.opt.step, seed=self.config.seed))
        self._sync()
        return time.perf_counter() - t_extra
