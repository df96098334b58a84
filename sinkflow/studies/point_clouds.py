r"""Set Transformer blocks on sinkflow's attention, and the Sinkformers paper's point-cloud study in shape.

The Sinkformers paper classifies ModelNet40 point clouds with a Set Transformer (Lee et al.,
2019: two ISAB blocks with inducing points, PMA pooling) whose attention is SoftMax or
Sinkhorn. ModelNet40 cannot be downloaded here, so :func:`shape_classes` generates a stand-in:
``K`` shape classes (sphere, ellipsoid, cube, cylinder, cone, torus, square pyramid,
octahedron), points sampled on each surface, stretched by a random factor per axis, noised,
rotated by a random angle about the vertical axis, centred and scaled to unit RMS radius
(:func:`sinkflow.studies.data.point_clouds`).

Blocks (``(batch, n, d)`` in, permutation-equivariant or -invariant in the points):

* :class:`MAB` -- multihead attention block, ``H = LN(q + Att(q, Y, Y))``,
  ``out = LN(H + relu(W H))`` with ``q`` the projected queries (Lee et al.'s Eq. 6-7).
* :class:`SAB` -- ``MAB(X, X)``, equivariant, quadratic in ``n``.
* :class:`ISAB` -- ``MAB(X, MAB(I, X))`` through ``m`` learned inducing points, linear in ``n``.
* :class:`PMA` -- ``MAB(S, X)`` with ``k`` learned seeds: invariant pooling to ``k`` vectors.

Attention is :class:`sinkflow.nn.MultiheadAttention` with ``normalization="softmax"`` or
``"sinkhorn"``; for a rectangular ``m x n`` score matrix Sinkhorn's rows sum to 1 and its
columns to ``n / m``. A PMA with one seed under Sinkhorn is therefore mean pooling of the
values (one query: every column gets the same mass).

:func:`point_cloud_study` trains :class:`SetTransformer` with both normalizations on the same
data, initialization and batch order per seed and reports the paired accuracy gap with a
Student-t interval (:func:`sinkflow.studies.intervals.t_interval`).

Differences from the official Sinkformer code (``michaelsdr/sinkformers``, ``set_transformer/``):
there the Sinkhorn blocks use the transport plan itself (total mass 1, so each row sums to
``1 / n_queries``) where sinkflow's rows sum to 1, and its SoftMax model has no LayerNorm while its
Sinkhorn model has them; here both normalizations share one architecture. The point-wise
embedding and the norm feature are ours (see :class:`SetTransformer`). Measured while sizing the
study: on these centred clouds a mean-pooling DeepSets model stayed at chance for 200 steps
where max pooling left it within 100, so Sinkhorn's one-seed PMA (mean pooling, above) starts
from the slower pooling.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sinkflow.nn.attention import MultiheadAttention
from sinkflow.studies.data import Dataset, point_clouds
from sinkflow.studies.intervals import t_interval

__all__ = ["SHAPE_CLASSES", "shape_classes", "MAB", "SAB", "ISAB", "PMA", "SetTransformer", "point_cloud_study",
           "point_cloud_report"]

#: The generated stand-in's classes, in label order.
SHAPE_CLASSES = ("sphere", "ellipsoid", "cube", "cylinder", "cone", "torus", "pyramid", "octahedron")


def shape_classes(n_per_class: int, n_points: int = 256, shapes=SHAPE_CLASSES, *, noise: float = 0.03,
                  scale: tuple[float, float] = (0.75, 1.25), rotate: bool | str = "z", seed: int = 0,
                  dtype: torch.dtype = torch.float32) -> Dataset:
    """Balanced, seeded point clouds of ``len(shapes)`` generated shape classes (the ModelNet40 stand-in).

    Parameters
    ----------
    n_per_class, n_points : int
        Clouds per class and points per cloud.
    shapes : sequence of str
        Class names, keys of :data:`sinkflow.studies.data.SHAPES`; label ``i`` is ``shapes[i]``.
    noise : float
        Standard deviation of the Gaussian noise added to every point (before normalization).
    scale : (float, float)
        Range of the independent stretch factor of each axis (anisotropic scaling).
    rotate : {"z", True, False}
        ``"z"`` (default): a uniform rotation about the vertical axis, the shapes stay upright as
        ModelNet40's objects do; ``True``: uniform over all rotations (a harder task: the Set
        Transformer sat at chance about twice as long before learning).
    seed : int
    dtype : torch.dtype

    Returns
    -------
    Dataset
        ``inputs`` ``(n_per_class * K, n_points, 3)``, shuffled; exactly ``n_per_class`` per class.

    Examples
    --------
    >>> from sinkflow.studies.point_clouds import shape_classes
    >>> d = shape_classes(3, 64, seed=1)
    >>> tuple(d.inputs.shape), d.n_classes, d.labels.bincount().tolist()
    ((24, 64, 3), 8, [3, 3, 3, 3, 3, 3, 3, 3])
    """
    return point_clouds(n_per_class, n_points, tuple(shapes), noise=noise, rotate=rotate, seed=seed, dtype=dtype,
                        scale=scale)


class MAB(nn.Module):
    """Multihead attention block of the Set Transformer: queries ``X`` attend to ``Y``.

    Parameters
    ----------
    dim_q, dim_kv, dim : int
        Widths of the queries, of the keys/values, and of the output.
    heads : int
    normalization : str
        ``"softmax"`` or ``"sinkhorn"`` (any :class:`sinkflow.nn.MultiheadAttention` normalization).
    n_iter : int
        Sinkhorn half-iterations.
    ln : bool
        The two LayerNorms (the official Sinkformer point-cloud model uses them).

    Notes
    -----
    ``forward(x, y, key_padding_mask=None, query_padding_mask=None)``: masks ``(batch, n)``,
    ``True = pad``; padded keys get no weight, padded queries leave Sinkhorn's column constraint.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies.point_clouds import MAB
    >>> mab = MAB(3, 5, 8, heads=2, normalization="sinkhorn")
    >>> mab(torch.randn(2, 4, 3), torch.randn(2, 9, 5)).shape
    torch.Size([2, 4, 8])
    """

    def __init__(self, dim_q: int, dim_kv: int, dim: int, heads: int = 4, normalization: str = "softmax",
                 n_iter: int = 7, ln: bool = True):
        super().__init__()
        self.fc_q = nn.Linear(dim_q, dim)
        self.attn = MultiheadAttention(dim, heads, kdim=dim_kv, vdim=dim_kv, batch_first=True,
                                       normalization=normalization, n_iter=n_iter)
        self.fc_o = nn.Linear(dim, dim)
        self.ln0, self.ln1 = (nn.LayerNorm(dim), nn.LayerNorm(dim)) if ln else (nn.Identity(), nn.Identity())

    def forward(self, x, y, key_padding_mask=None, query_padding_mask=None):
        q = self.fc_q(x)
        h = self.ln0(q + self.attn(q, y, y, key_padding_mask=key_padding_mask, need_weights=False,
                                   query_padding_mask=query_padding_mask)[0])
        return self.ln1(h + F.relu(self.fc_o(h)))


class SAB(nn.Module):
    """Set attention block ``MAB(X, X)``: permutation-equivariant self-attention.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies.point_clouds import SAB
    >>> sab = SAB(3, 8, heads=2)
    >>> x, perm = torch.randn(2, 6, 3), torch.tensor([5, 0, 3, 1, 4, 2])
    >>> bool(torch.allclose(sab(x)[:, perm], sab(x[:, perm]), atol=1e-5))
    True
    """

    def __init__(self, dim_in: int, dim: int, heads: int = 4, normalization: str = "softmax", n_iter: int = 7,
                 ln: bool = True):
        super().__init__()
        self.mab = MAB(dim_in, dim_in, dim, heads, normalization, n_iter, ln)

    def forward(self, x, key_padding_mask=None):
        return self.mab(x, x, key_padding_mask, key_padding_mask)


class ISAB(nn.Module):
    """Induced set attention block ``MAB(X, MAB(I, X))`` with ``inducing`` learned points: equivariant, O(n m).

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies.point_clouds import ISAB
    >>> ISAB(3, 8, heads=2, inducing=4)(torch.randn(2, 10, 3)).shape
    torch.Size([2, 10, 8])
    """

    def __init__(self, dim_in: int, dim: int, heads: int = 4, inducing: int = 16, normalization: str = "softmax",
                 n_iter: int = 7, ln: bool = True):
        super().__init__()
        self.inducing = nn.Parameter(torch.empty(1, inducing, dim))
        nn.init.xavier_uniform_(self.inducing)
        self.mab0 = MAB(dim, dim_in, dim, heads, normalization, n_iter, ln)
        self.mab1 = MAB(dim_in, dim, dim, heads, normalization, n_iter, ln)

    def forward(self, x, key_padding_mask=None):
        h = self.mab0(self.inducing.expand(x.shape[0], -1, -1).to(x.dtype), x, key_padding_mask=key_padding_mask)
        return self.mab1(x, h, query_padding_mask=key_padding_mask)


class PMA(nn.Module):
    """Pooling by multihead attention ``MAB(S, X)`` with ``seeds`` learned queries: permutation-invariant.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies.point_clouds import PMA
    >>> PMA(8, heads=2, seeds=1)(torch.randn(2, 10, 8)).shape
    torch.Size([2, 1, 8])
    """

    def __init__(self, dim: int, heads: int = 4, seeds: int = 1, normalization: str = "softmax", n_iter: int = 7,
                 ln: bool = True):
        super().__init__()
        self.seeds = nn.Parameter(torch.empty(1, seeds, dim))
        nn.init.xavier_uniform_(self.seeds)
        self.mab = MAB(dim, dim, dim, heads, normalization, n_iter, ln)

    def forward(self, x, key_padding_mask=None):
        return self.mab(self.seeds.expand(x.shape[0], -1, -1).to(x.dtype), x, key_padding_mask=key_padding_mask)


class SetTransformer(nn.Module):
    r"""Point-cloud classifier of the Sinkformers paper's ModelNet40 runs: encoder blocks, dropout, PMA,
    dropout, linear.

    Parameters
    ----------
    in_dim, n_classes : int
    dim, heads : int
        Width and heads of every block (the paper: 256 and 4).
    inducing : int
        Inducing points per ISAB (the paper's script: 16); 0 uses SABs instead.
    depth : int
        Encoder blocks (the paper: 2).
    normalization : str
    n_iter : int
        Sinkhorn half-iterations (the official script's default: 7).
    ln : bool
    dropout : float
        Before and after the pooling (the official model: 0.5).
    embed : bool
        A point-wise feed-forward embedding ``Linear(in_dim, dim), ReLU, Linear(dim, dim)`` before the
        first block (not in the official model). The clouds are centred, so at initialization, when
        attention is near uniform, a block fed raw coordinates averages them to 0 and passes no signal:
        without the embedding both normalizations sat at chance for hundreds of steps here.
    radial : bool
        Append each point's norm :math:`\|x\|` to its coordinates (ours too): a rotation-invariant cue,
        as :class:`sinkflow.studies.SetClassifier`'s ``radial_feature``.

    Examples
    --------
    >>> import torch
    >>> from sinkflow.studies.point_clouds import SetTransformer
    >>> model = SetTransformer(n_classes=8, dim=16, heads=2, inducing=4, normalization="sinkhorn").eval()
    >>> x = torch.randn(3, 50, 3)
    >>> logits = model(x)
    >>> logits.shape, bool(torch.allclose(logits, model(x[:, torch.randperm(50)]), atol=1e-5))
    (torch.Size([3, 8]), True)
    """

    def __init__(self, in_dim: int = 3, n_classes: int = 8, dim: int = 64, heads: int = 4, inducing: int = 16,
                 depth: int = 2, normalization: str = "softmax", n_iter: int = 7, ln: bool = True,
                 dropout: float = 0.5, embed: bool = True, radial: bool = True):
        super().__init__()
        if depth < 1 or inducing < 0:
            raise ValueError(f"depth must be >= 1 and inducing >= 0, got {depth}, {inducing}")
        self.radial, width = radial, in_dim + radial
        self.embed = nn.Sequential(nn.Linear(width, dim), nn.ReLU(), nn.Linear(dim, dim)) if embed else nn.Identity()
        widths = [dim if embed else width] + [dim] * depth
        self.encoder = nn.ModuleList(
            ISAB(a, dim, heads, inducing, normalization, n_iter, ln) if inducing else
            SAB(a, dim, heads, normalization, n_iter, ln) for a in widths[:-1])
        self.pool = PMA(dim, heads, 1, normalization, n_iter, ln)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, points, key_padding_mask=None):
        x = torch.cat([points, points.norm(dim=-1, keepdim=True)], -1) if self.radial else points
        x = self.embed(x)
        for block in self.encoder:
            x = block(x, key_padding_mask)
        return self.head(self.drop(self.pool(self.drop(x), key_padding_mask)[:, 0]))


def _run(train_data, test_data, normalization: str, seed: int, cfg: dict) -> np.ndarray:
    """Test accuracy after each epoch (index 0: initialization) of one seeded Adam run on cross-entropy.

    The epochs of :func:`sinkflow.studies.train` (its seeded batches), without its attention probe:
    that tracks the first attention matrix as self-attention, and the ISAB's are rectangular.
    """
    from sinkflow.studies.training import TrainConfig, _Run, evaluate

    torch.manual_seed(seed)
    model = SetTransformer(3, train_data.n_classes, cfg["dim"], cfg["heads"], cfg["inducing"], 2, normalization,
                           cfg["n_iter"] if normalization == "sinkhorn" else 1, True, cfg["dropout"])
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    run = _Run(model, opt, TrainConfig(batch_size=cfg["batch_size"], seed=seed), torch.device("cpu"),
               torch.Generator().manual_seed(seed))
    curve = [evaluate(model, test_data)[1]]
    for _ in range(cfg["epochs"]):
        model.train()
        run.epoch(train_data.inputs, train_data.labels)
        curve.append(evaluate(model, test_data)[1])
    return np.asarray(curve)


#: The study's sizes: ``quick`` runs in about a minute a seed on one thread, ``full`` in a few minutes.
SIZES = {
    "quick": {"n_train": 100, "n_test": 50, "n_points": 128, "epochs": 10, "dim": 32, "heads": 4, "inducing": 8},
    "full": {"n_train": 125, "n_test": 50, "n_points": 64, "epochs": 120, "dim": 32, "heads": 4, "inducing": 16},
}


def point_cloud_study(seeds=(0, 1, 2), *, size: str = "quick", n_iter: int = 7, lr: float = 1e-3,
                      batch_size: int = 64, dropout: float = 0.5, tail: int = 3, **overrides) -> dict:
    """SoftMax against Sinkhorn Set Transformers on :func:`shape_classes`, paired by seed, with t-intervals.

    Both normalizations train on the same generated clouds (training set seed 1, test set seed 2),
    from the same initialization seed and batch order; a run's accuracy is the mean test accuracy
    of its last ``tail`` epochs.

    Parameters
    ----------
    seeds : sequence of int
        Model seeds (at least 2 for an interval).
    size : {"quick", "full"}
        Sizes of :data:`SIZES` (clouds per class for training and testing, points per cloud,
        epochs, width, heads, inducing points).
    n_iter : int
        Sinkhorn half-iterations (the official point-cloud script's default, 7).
    lr, batch_size, dropout : float, int, float
        Adam (the paper: 1e-3, batch 64, dropout 0.5).
    tail : int
    **overrides
        Replace entries of the size (``epochs=1``, ``n_points=32``, ...).

    Returns
    -------
    dict
        ``setting``, per-seed ``accuracy`` per normalization with mean and 95% t-interval
        (``mean``, ``ci95``), the paired ``difference`` (Sinkhorn - SoftMax) with ``difference_ci95``,
        the mean test-accuracy ``curve`` per normalization, and ``seconds`` per run.

    Examples
    --------
    >>> from sinkflow.studies.point_clouds import point_cloud_study
    >>> r = point_cloud_study((0, 1), n_train=2, n_test=2, n_points=16, epochs=1, dim=8, inducing=2, tail=1)
    >>> sorted(r["accuracy"]), len(r["accuracy"]["softmax"]), len(r["curve"]["sinkhorn"])
    (['sinkhorn', 'softmax'], 2, 2)
    """
    if size not in SIZES or not set(overrides) <= set(SIZES[size]):
        raise ValueError(f"size must be one of {list(SIZES)} and overrides among {list(SIZES['quick'])}, "
                         f"got {size!r}, {sorted(overrides)}")
    cfg = {**SIZES[size], **overrides, "n_iter": n_iter, "lr": lr, "batch_size": batch_size, "dropout": dropout}
    train_data = shape_classes(cfg["n_train"], cfg["n_points"], seed=1)
    test_data = shape_classes(cfg["n_test"], cfg["n_points"], seed=2)
    curves, seconds = {"softmax": [], "sinkhorn": []}, {"softmax": [], "sinkhorn": []}
    for s in seeds:
        for a in curves:
            t0 = time.perf_counter()
            curves[a].append(_run(train_data, test_data, a, s, cfg))
            seconds[a].append(time.perf_counter() - t0)
    tail = min(tail, cfg["epochs"])
    acc = {a: [float(c[-tail:].mean()) for c in cs] for a, cs in curves.items()}
    diff = np.asarray(acc["sinkhorn"]) - np.asarray(acc["softmax"])
    return {"setting": {**cfg, "size": size, "tail": tail, "classes": list(SHAPE_CLASSES), "seeds": list(seeds)},
            "accuracy": acc, "mean": {a: float(np.mean(v)) for a, v in acc.items()},
            "ci95": {a: t_interval(v)[1:] for a, v in acc.items()},
            "difference": float(diff.mean()), "difference_ci95": t_interval(diff)[1:],
            "curve": {a: np.stack(cs).mean(0).round(4).tolist() for a, cs in curves.items()}, "seconds": seconds}


def point_cloud_report(seeds=(0, 1, 2, 3, 4), *, size: str = "quick", **study) -> dict:
    """:func:`point_cloud_study` as the JSON report ``docs/data/point_cloud_*.json`` holds: the result, the
    command, the wall time and the machine (threads, CPU model, load) at the start and the end.

    Examples
    --------
    >>> from sinkflow.studies.point_clouds import point_cloud_report
    >>> r = point_cloud_report((0,), n_train=1, n_test=1, n_points=8, epochs=1, dim=8, inducing=2, tail=1)
    >>> r["study"], r["size"], r["machine"]["threads"] >= 1
    ('point_cloud', 'quick', True)
    """
    from sinkflow.studies.paper import machine

    start, t0 = machine(), time.perf_counter()
    result = point_cloud_study(tuple(seeds), size=size, **study)
    args = "".join(f", {k}={v!r}" for k, v in study.items())
    return {"study": "point_cloud", "task": "point_cloud", "mode": "study", "complete": True, "size": size,
            "command": f"point_cloud_study(seeds={tuple(seeds)}, size={size!r}{args})",
            "wall_time": time.perf_counter() - t0, "machine": start, "machine_end": machine(), **result}
