r"""The Skyformer paper's LRA setting on a CPU: cost per training step and instability.

``sinkflow validate listops pathfinder --paper`` runs what needs the paper's settings but
no GPU: the time and memory of a training step (:func:`cost_rows`) and the instability
score of the first 20 optimizer steps (:func:`instability_rows`, the paper's Appendix F)
for every attention, at the paper's lengths (ListOps up to 2,000 tokens, Pathfinder
32 x 32 = 1,024). :func:`instability_decomposition` takes the Gaussian kernel's ratio to
SoftMax apart, one setting changed per row. Accuracy at 50,000 steps stays on the GPU path
(``--full --device cuda``).

The setting, :data:`OFFICIAL`, follows the official code (``src/config.py``, ``main.py``,
``models/model_transformer.py``, ``models/model_LRA.py``, ``models/attention.py`` of
pkuzengqi/Skyformer): 2 pre-LN layers, embedding 64, FFN 128 (GELU), 2 heads of dimension
32, learned positions, token and position embeddings initialized N(0, 0.02^2), dropout 0.1
(embeddings, attention weights, residual branches), a final LayerNorm whose output is
multiplied by the padding mask, mean pooling over all positions (padding included, as
zeros), a two-layer ReLU classifier (hidden 128); AdamW (betas 0.9, 0.999, eps 1e-6,
weight decay 0) under torch's ``OneCycleLR`` (linear, ``pct_start = warmup / 50,000``,
torch's defaults otherwise: start at ``lr / 25``, beta1 cycled 0.95 -> 0.85); ListOps batch
32, lr 1e-4, warm-up 1,000; Pathfinder batch 128, lr 2e-4, warm-up 312. The official mask
is ``token != 0`` on every task (``models/dataset_LRA.py``): ListOps padding, and on
Pathfinder every black pixel (about 94% of the 1,024 tokens of sinkflow's images), so the
official models attend among the drawn pixels only. Masked keys are removed from
attention and masked positions zeroed after the final LayerNorm, as there. Nyströmformer's
segment means cannot exclude masked keys here, so it attends to every token (stated in
the report). Dropout (0.1) acts on the embeddings, the attention weights and the FFN's hidden
layer; the official model also drops the attention branch's and the FFN's outputs, which
sinkflow's attention blocks do not.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sinkflow.datasets import LISTOPS_VOCAB, listops, listops_tokens, pathfinder, pathfinder_tokens
from sinkflow.studies._cost import attention_code_digest, step_bytes
from sinkflow.studies.models import SequenceClassifier
from sinkflow.studies.tracking import update_instability

__all__ = ["OFFICIAL", "PaperSetting", "PaperLRAClassifier", "paper_batches", "paper_model", "paper_optimizer",
           "machine", "cost_rows", "instability_rows", "instability_decomposition", "DECOMPOSITION",
           "residual_share", "residual_shares",
           "run_paper_setting"]

#: The official code's training settings per task (``src/config.py`` of pkuzengqi/Skyformer).
OFFICIAL = {
    "listops": {"seq_len": 2000, "batch_size": 32, "lr": 1e-4, "warmup": 1000, "total_steps": 50000},
    "pathfinder": {"seq_len": 1024, "batch_size": 128, "lr": 2e-4, "warmup": 312, "total_steps": 50000},
}


@dataclass(frozen=True)
class PaperSetting:
    """One setting of the LRA model and its first optimizer steps; the defaults are the paper's.

    Attributes
    ----------
    task : {"listops", "pathfinder"}
    batch_size : int or None
        None: the official batch (:data:`OFFICIAL`).
    embed_std : float or None
        Standard deviation of the token embedding at initialization (official: 0.02; None:
        torch's default N(0, 1), the package's quick setting).
    mask : bool
        Mask token 0 (ListOps padding, Pathfinder's black pixels) in attention and features
        as the official code does.
    dropout : float
    schedule : {"onecycle", "constant"}
        The official warm-up (OneCycleLR) or a constant learning rate.
    lr : float or None
        Peak learning rate (None: the official one).
    head : {"mlp", "linear"}
        Two-layer ReLU classifier (official) or one linear layer (the package's quick model).
    max_length : int or None
        ListOps expressions at most this long (None: the paper's 2,000; Pathfinder ignores it).
    """

    task: str = "listops"
    batch_size: int | None = None
    embed_std: float | None = 0.02
    mask: bool = True
    dropout: float = 0.1
    schedule: str = "onecycle"
    lr: float | None = None
    head: str = "mlp"
    max_length: int | None = None

    def official(self, key: str):
        """The official code's value of ``key`` for this task (:data:`OFFICIAL`)."""
        return OFFICIAL[self.task][key]


class PaperLRAClassifier(SequenceClassifier):
    """:class:`~sinkflow.studies.SequenceClassifier` as the official LRA model: padding mask from the tokens,
    features zeroed on padding, mean over all positions, embedding dropout.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies.paper import PaperLRAClassifier
    >>> model = PaperLRAClassifier(20, 12, 3, pad_id=0, dim=16, heads=2, depth=1, pooling="mean")
    >>> x = torch.tensor([[5] * 8 + [0] * 4])
    >>> bool(model.features(x)[0, 8:].abs().max() == 0)   # padded positions are zero
    True
    """

    def __init__(self, *args, pad_id: int | None = None, attend_mask: bool = True, embed_dropout: float = 0.0,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.pad_id, self.attend_mask = pad_id, attend_mask
        self.embed_dropout = nn.Dropout(embed_dropout)

    def padding(self, tokens):
        """``True`` where ``tokens`` are padding (None without a pad id)."""
        return None if self.pad_id is None else tokens == self.pad_id

    def features(self, tokens, key_padding_mask=None):
        pad = self.padding(tokens) if key_padding_mask is None else key_padding_mask
        x = self.embed_dropout(self.tokens(tokens) + self.pos[:, : tokens.shape[1]])
        attend = pad if self.attend_mask and pad is not None and bool(pad.any()) else None
        for block in self.blocks:
            x = block(x, attend)
        x = self.head[0](x)
        return x if pad is None else x * (~pad)[..., None].to(x.dtype)

    def forward(self, tokens, key_padding_mask=None):
        return self.head[1](self.features(tokens, key_padding_mask).mean(1))


def paper_batches(setting: PaperSetting, n_batches: int, seed: int = 0):
    """``n_batches`` batches ``(tokens, labels)`` of the setting's task (seeded, independent of the model)."""
    b = setting.batch_size or setting.official("batch_size")
    n = b * n_batches
    if setting.task == "listops":
        length = setting.max_length or OFFICIAL["listops"]["seq_len"]
        x, y = listops(n, seed=1000 + seed, min_length=min(500, length // 4), max_length=length)
        tokens = listops_tokens(x, length)
    elif setting.task == "pathfinder":
        images, y = pathfinder(n, seed=1000 + seed)
        tokens = pathfinder_tokens(images)
    else:
        raise ValueError(f"unknown task {setting.task!r}: 'listops' or 'pathfinder'")
    tokens, y = torch.as_tensor(tokens, dtype=torch.long), torch.as_tensor(y, dtype=torch.long)
    return [(tokens[i * b:(i + 1) * b], y[i * b:(i + 1) * b]) for i in range(n_batches)]


def paper_model(setting: PaperSetting, normalization: str, n_iter: int = 3, seq_len: int | None = None) -> nn.Module:
    """The official LRA model for ``setting`` (seed torch before calling it)."""
    listops_task = setting.task == "listops"
    vocab, classes = (len(LISTOPS_VOCAB), 10) if listops_task else (256, 2)
    seq_len = seq_len or (setting.max_length or OFFICIAL["listops"]["seq_len"] if listops_task else 1024)
    model = PaperLRAClassifier(vocab, seq_len, classes, dim=64, heads=2, depth=2, normalization=normalization,
                               n_iter=n_iter, mlp_ratio=2, dropout=setting.dropout, pooling="mean", landmarks=128,
                               pad_id=0 if setting.mask else None,
                               attend_mask=normalization != "nystromformer", embed_dropout=setting.dropout)
    if setting.embed_std is not None:
        with torch.no_grad():
            model.tokens.weight.normal_(0.0, setting.embed_std)
            model.pos.normal_(0.0, setting.embed_std)
    if setting.head == "mlp":
        model.head[1] = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, classes))
    return model


def paper_optimizer(model: nn.Module, setting: PaperSetting):
    """``(AdamW, scheduler)`` of the official code; ``schedule="constant"`` keeps the peak rate."""
    lr = setting.lr or setting.official("lr")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
    if setting.schedule == "constant":
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    if setting.schedule != "onecycle":
        raise ValueError(f"schedule must be 'onecycle' or 'constant', got {setting.schedule!r}")
    total = setting.official("total_steps")
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, pct_start=setting.official("warmup") / total,
                                                    anneal_strategy="linear", total_steps=total)


def machine() -> dict:
    """Threads, CPU model (/proc/cpuinfo) and load (/proc/loadavg) at the time of the call."""
    cpu = platform.processor() or "-"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
        with open("/proc/loadavg") as f:
            load = [float(v) for v in f.read().split()[:3]]
    except OSError:
        load = [float(v) for v in os.getloadavg()]
    return {"threads": torch.get_num_threads(), "cpu": cpu, "cores": os.cpu_count(), "loadavg": load}


def _loss(model, x, y):
    return F.cross_entropy(model(x).float(), y)


def _backward(model, x, y) -> None:
    _loss(model, x, y).backward()


def cost_rows(setting: PaperSetting, attentions, seeds=(0, 1, 2), steps: int = 3, n_iter: int = 3) -> list[dict]:
    """Time (median of ``steps`` training steps after one warm-up step) and memory of a training step.

    One row per (attention, seed): forward, backward and the AdamW step on the setting's
    batch, memory by :func:`sinkflow.studies._cost.step_bytes` (CPU: bytes saved for backward),
    and :func:`machine` read before the row. The attentions of a seed take their steps in
    turns (round robin), so a change of the machine's load falls on all of them alike.

    Examples
    --------
    >>> from sinkflow.studies.paper import PaperSetting, cost_rows
    >>> rows = cost_rows(PaperSetting("listops", batch_size=2, max_length=40), ["softmax"], seeds=[0], steps=1)
    >>> rows[0]["step_time"] > 0 and rows[0]["memory"] > 0
    True
    """
    rows = []
    for seed in seeds:
        x, y = paper_batches(setting, 1, seed)[0]
        runs = {}
        for attention in attentions:
            torch.manual_seed(seed)
            model = paper_model(setting, attention, n_iter)
            runs[attention] = (model, paper_optimizer(model, setting)[0], [], machine())
        for _ in range(steps + 1):
            for model, opt, times, _ in runs.values():
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                _loss(model, x, y).backward()
                opt.step()
                times.append(time.perf_counter() - t0)
        for attention, (model, _, times, env) in runs.items():
            memory, method = step_bytes(functools.partial(_backward, model, x, y), x.device)
            model.zero_grad(set_to_none=True)
            rows.append({"attention": attention, "seed": int(seed), "step_time": float(np.median(times[1:])),
                         "step_times": times[1:], "memory": memory, "memory_method": method,
                         "batch_size": int(x.shape[0]), "seq_len": int(x.shape[1]), **env})
    return rows


def _taus(setting: PaperSetting, attention: str, seed: int, steps: int, n_iter: int) -> list[float]:
    """:func:`update_instability` of the first ``steps`` optimizer steps from the seed's initialization."""
    torch.manual_seed(seed)
    model = paper_model(setting, attention, n_iter)
    opt, sched = paper_optimizer(model, setting)
    taus = []
    for x, y in paper_batches(setting, steps, seed):
        model.train()
        opt.zero_grad(set_to_none=True)
        _loss(model, x, y).backward()
        taus.append(update_instability(model, x, opt.step, seed=seed))
        sched.step()
    return taus


def instability_rows(setting: PaperSetting, attentions, seeds=(0, 1, 2), steps: int = 20,
                     n_iter: int = 3) -> list[dict]:
    """The paper's instability ratio (Appendix F) per attention: per seed, the mean over the
    first ``steps`` optimizer steps of :math:`\\tau_i / \\tau_i^{SoftMax}` (same initialization
    seed and batches); rows hold the per-seed ratios, their median, min and max.

    Examples
    --------
    >>> from sinkflow.studies.paper import PaperSetting, instability_rows
    >>> s = PaperSetting("listops", batch_size=2, max_length=24)
    >>> rows = instability_rows(s, ["softmax", "gaussian"], seeds=[0], steps=2)
    >>> rows[0]["ratio"]["median"], rows[1]["ratio"]["median"] > 0
    (1.0, True)
    """
    attentions = ["softmax"] + [a for a in attentions if a != "softmax"]
    taus = {a: {s: _taus(setting, a, s, steps, n_iter) for s in seeds} for a in attentions}
    rows = []
    for a in attentions:
        per_seed = [float(np.mean(np.asarray(taus[a][s]) / np.asarray(taus["softmax"][s]))) for s in seeds]
        rows.append({"attention": a, "seeds": [int(s) for s in seeds], "steps": steps, "ratios": per_seed,
                     "ratio": {"median": float(np.median(per_seed)), "min": float(min(per_seed)),
                               "max": float(max(per_seed))},
                     "tau_first": {str(s): taus[a][s][0] for s in seeds}})
    return rows


def residual_share(setting: PaperSetting, attention: str, seed: int = 0) -> float:
    """At initialization, ``||attention branch|| / ||residual stream||`` entering the first block's sum
    (Frobenius norms over the real tokens of the setting's first batch, eval mode).

    Examples
    --------
    >>> from sinkflow.studies.paper import PaperSetting, residual_share
    >>> residual_share(PaperSetting("listops", batch_size=2, max_length=24), "softmax") > 0
    True
    """
    torch.manual_seed(seed)
    model = paper_model(setting, attention).eval()
    x, _ = paper_batches(setting, 1, seed)[0]
    seen = {}
    block = model.blocks[0]

    def stream(module, args):  # hooks return None: the forward runs unchanged
        seen.setdefault("stream", args[0])

    def branch(module, args, out):
        seen.setdefault("branch", out[0])

    hooks = [block.register_forward_pre_hook(stream), block.attn.register_forward_hook(branch)]
    try:
        with torch.no_grad():
            model.features(x)
    finally:
        for h in hooks:
            h.remove()
    keep = torch.ones(x.shape, dtype=torch.bool) if model.padding(x) is None else ~model.padding(x)
    return float(seen["branch"][keep].norm() / seen["stream"][keep].norm())


def residual_shares(setting: PaperSetting, seeds=(0, 1, 2)) -> dict:
    """:func:`residual_share` of SoftMax and the Gaussian kernel, official and N(0, 1) embeddings (median over
    seeds)."""
    out = {}
    for label, std in (("official", setting.embed_std), ("N(0, 1)", None)):
        s = replace(setting, embed_std=std)
        out[label] = {a: float(np.median([residual_share(s, a, seed) for seed in seeds]))
                      for a in ("softmax", "gaussian")}
    return out


def _register_decomposition_variants() -> None:
    """Gaussian kernel with rows normalized, and divided by the number of keys (for the decomposition)."""
    from sinkflow.attention import register_attention, softmax

    def over_n(C, *, n_iter=None, mask=None):
        K = C.exp() if mask is None else C.exp().masked_fill(~mask, 0.0)
        count = K.shape[-1] if mask is None else mask.sum(-1, keepdim=True).clamp_min(1)
        return K / count

    register_attention("gaussian_rows", lambda C, n_iter=None, mask=None: softmax(C, mask=mask), scores="gaussian",
                       overwrite=True)
    register_attention("gaussian_over_n", over_n, scores="gaussian", overwrite=True)


#: The rows of :func:`instability_decomposition`: (label, attention, change to the base setting).
DECOMPOSITION = (
    ("paper setting", "gaussian", {}),
    ("rows normalized (Gaussian scores, SoftMax rows)", "gaussian_rows", {}),
    ("kernel divided by n (keys)", "gaussian_over_n", {}),
    ("no padding mask", "gaussian", {"mask": False}),
    ("short sequences (ListOps <= 12 tokens)", "gaussian", {"max_length": 12}),
    ("embedding init N(0, 1) (torch default)", "gaussian", {"embed_std": None}),
    ("no dropout", "gaussian", {"dropout": 0.0}),
    ("constant lr, no warm-up", "gaussian", {"schedule": "constant"}),
    ("batch 1 (as the paper-length rows)", "gaussian", {"batch_size": 1}),
    ("official batch (ListOps: 32)", "gaussian", {"batch_size": None}),
    ("package quick setting (N(0,1) init, no mask, no dropout, linear head, constant lr 3e-3)", "gaussian",
     {"embed_std": None, "mask": False, "dropout": 0.0, "head": "linear", "schedule": "constant", "lr": 3e-3}),
)


def instability_decomposition(base: PaperSetting, seeds=(0, 1, 2), steps: int = 20, rows=DECOMPOSITION) -> list[dict]:
    """The Gaussian kernel's instability ratio to SoftMax with one thing changed per row.

    Each row is :func:`instability_rows` of (SoftMax, the row's attention) on ``base`` with
    the row's changes (:data:`DECOMPOSITION`); the SoftMax reference gets the same changes.

    Examples
    --------
    >>> from sinkflow.studies.paper import PaperSetting, instability_decomposition, DECOMPOSITION
    >>> out = instability_decomposition(PaperSetting("listops", batch_size=2, max_length=24), seeds=[0], steps=2,
    ...                                 rows=DECOMPOSITION[:2])
    >>> [r["label"] for r in out]
    ['paper setting', 'rows normalized (Gaussian scores, SoftMax rows)']
    """
    _register_decomposition_variants()
    out = []
    for label, attention, change in rows:
        setting = replace(base, **change)
        row = instability_rows(setting, [attention], seeds, steps)[1]
        out.append({"label": label, "change": change, **row})
    return out


def _summary(cost: list[dict], attentions) -> list[dict]:
    """Median time and memory per attention and their ratios to SoftMax's medians."""
    med = {a: {k: float(np.median([r[k] for r in cost if r["attention"] == a])) for k in ("step_time", "memory")}
           for a in attentions}
    soft = med.get("softmax")
    return [{"attention": a, **med[a],
             "step_time_ratio": med[a]["step_time"] / soft["step_time"] if soft else None,
             "memory_ratio": med[a]["memory"] / soft["memory"] if soft else None} for a in attentions]


def _cost_section(rows, attentions, seeds, steps, batch_size, max_length) -> dict:
    """The ``cost`` part of a report, with the digest of the attention code it measured."""
    return {"batch_size": batch_size, "steps": steps, "seeds": list(seeds), "max_length": max_length,
            "code_digest": attention_code_digest(), "rows": rows, "summary": _summary(rows, attentions)}


def refresh_cost(report: dict, steps: int | None = None, log=None) -> dict:
    """``report`` with its cost rows measured again on today's code (instability kept as it is).

    Same task, attentions, seeds, batch and steps (``steps`` overrides); the machine and the
    attention code digest are recorded anew, and the report's note says which part is newer.
    This is the step to take after the attention code changes (``sinkflow validate listops
    pathfinder --paper --cost-only --out docs/data``).

    Examples
    --------
    >>> from sinkflow.studies.paper import refresh_cost, run_paper_setting
    >>> r = run_paper_setting("listops", ["softmax"], [0], cost_batch=1, cost_steps=1,
    ...                       instability_attentions=["softmax"], instability_batch=1, steps=1, max_length=16)
    >>> new = refresh_cost(r)
    >>> new["instability"] == r["instability"], new["cost"]["code_digest"] == r["cost"]["code_digest"]
    (True, True)
    """
    old = report["cost"]
    attentions = [row["attention"] for row in old["summary"]]
    steps = old["steps"] if steps is None else steps
    setting = PaperSetting(report["task"], batch_size=old["batch_size"], max_length=old.get("max_length"))
    t0 = time.perf_counter()
    rows = cost_rows(setting, attentions, old["seeds"], steps)
    (log or (lambda line: None))(f"{report['task']}: cost rows done ({time.perf_counter() - t0:.0f} s)")
    refreshed = {**report, "cost": _cost_section(rows, attentions, old["seeds"], steps, old["batch_size"],
                                                 old.get("max_length")), "machine": machine()}
    kept = [part for part in (report.get("note") or "").split("; ") if part and not part.startswith("cost re")]
    refreshed["note"] = "; ".join(kept + [f"cost re-measured by refresh_cost on torch {torch.__version__} "
                                          f"({time.perf_counter() - t0:.0f} s)"])
    return refreshed


def run_paper_setting(task: str, attentions=("softmax", "sinkhorn", "gaussian", "skyformer", "nystromformer"),
                      seeds=(0, 1, 2), *, cost_batch: int | None = None, cost_steps: int = 3,
                      instability_attentions=("softmax", "gaussian", "skyformer", "nystromformer"),
                      instability_batch: int | None = None, instability_seeds=None, steps: int = 20,
                      decomposition_length: int | None = None, decomposition_batch: int = 4,
                      max_length: int | None = None,
                      log=None) -> dict:
    """The ``--paper`` report of one task: cost table, instability ratios and (optionally) the decomposition.

    ``cost_batch`` / ``instability_batch`` reduce the official batch (None: official);
    ``decomposition_length`` (ListOps) runs :func:`instability_decomposition` on expressions
    of at most that many tokens; ``max_length`` shortens ListOps for the whole report (tests).
    The report states every reduction.

    Examples
    --------
    >>> from sinkflow.studies.paper import run_paper_setting
    >>> r = run_paper_setting("listops", ["softmax", "gaussian"], [0], cost_batch=1, cost_steps=1,
    ...                       instability_attentions=["softmax", "gaussian"], instability_batch=1, steps=1,
    ...                       max_length=16)
    >>> [row["attention"] for row in r["cost"]["summary"]], r["cost"]["rows"][0]["seq_len"]
    (['softmax', 'gaussian'], 16)
    """
    t0 = time.perf_counter()
    say = log or (lambda line: None)
    base = PaperSetting(task, max_length=max_length)
    cost = cost_rows(replace(base, batch_size=cost_batch), attentions, seeds, cost_steps)
    say(f"{task}: cost rows done ({time.perf_counter() - t0:.0f} s)")
    inst_seeds = list(seeds if instability_seeds is None else instability_seeds)
    inst = instability_rows(replace(base, batch_size=instability_batch), instability_attentions, inst_seeds, steps)
    say(f"{task}: instability done ({time.perf_counter() - t0:.0f} s)")
    report = {"task": task, "mode": "paper", "complete": True, "setting": OFFICIAL[task],
              "cost": _cost_section(cost, list(attentions), seeds, cost_steps,
                                    cost_batch or base.official("batch_size"), max_length),
              "instability": {"batch_size": instability_batch or base.official("batch_size"), "steps": steps,
                              "seeds": inst_seeds, "rows": inst},
              "machine": machine(), "torch": torch.__version__}
    if decomposition_length and task == "listops":
        dec = replace(base, batch_size=decomposition_batch, max_length=min(decomposition_length, max_length or 2000))
        report["decomposition"] = {"batch_size": decomposition_batch, "max_length": decomposition_length,
                                   "steps": steps, "seeds": list(seeds),
                                   "rows": instability_decomposition(dec, seeds, steps),
                                   "residual_share": residual_shares(dec, seeds)}
        say(f"{task}: decomposition done ({time.perf_counter() - t0:.0f} s)")
    report["total_time"] = time.perf_counter() - t0
    return report
