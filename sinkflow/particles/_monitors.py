"""Monitors of particle flows, recorded along a trajectory (as py-pde's trackers): energies,
marginal errors of the attention, cluster statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from sinkflow._backend import check_number, to_torch
from sinkflow._checks import check_choice
from sinkflow.fields._particle_field import ParticleField
from sinkflow.particles._energies import energy_0, energy_gaussian, energy_inf, energy_sphere

__all__ = ["MAX_MONITOR_N", "cluster_statistics", "cluster_labels", "attention_rank", "ATTENTION_RANK_RTOL",
           "MonitorContext", "MonitorRecords",
           "MONITOR_FUNCTIONS", "MONITORS",
           "MONITOR_KEYS"]


#: Energy and cluster monitors build n x n float64 matrices: allowed up to this n.
MAX_MONITOR_N = 8192


def cluster_statistics(x, *, manifold: str = "sphere", tol: float = 1e-3):
    r"""Fraction of clustered pairs and number of clusters.

    Pairs :math:`i < j` are clustered when :math:`\langle x_i, x_j\rangle > 1 - \delta`
    (sphere) or :math:`\|x_i - x_j\|^2 < 2 \delta\, \mathrm{mean}_k |x_k|^2` (Euclidean);
    clusters are the connected components of this relation.

    Parameters
    ----------
    x : array (n, d)
    manifold : {"sphere", "euclidean"}
    tol : float
        :math:`\delta` (docs/theory/sphere.md uses 1e-3).

    Returns
    -------
    (float, int)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> sinkflow.cluster_statistics(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    (0.3333333333333333, 2)
    """
    from scipy.sparse.csgraph import connected_components

    close = _close_pairs(x, manifold, tol)
    n = close.shape[0]
    pairs = (int(close.sum()) - n) // 2
    frac = pairs / (n * (n - 1) / 2) if n > 1 else 1.0
    count, _ = connected_components(close, directed=False)
    return float(frac), int(count)


def cluster_labels(x, *, manifold: str = "sphere", tol: float = 1e-3):
    r"""The cluster of every particle, numbered by decreasing size (0 is the largest).

    Clusters are those of :func:`cluster_statistics` (connected components of the relation
    "closer than ``tol``"); ties in size are numbered by their first particle.

    Parameters
    ----------
    x : array (n, d)
    manifold : {"sphere", "euclidean"}
    tol : float
        :math:`\delta` of :func:`cluster_statistics`.

    Returns
    -------
    numpy.ndarray (n,) of int

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.particles import cluster_labels
    >>> cluster_labels(np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])).tolist()
    [1, 0, 0]
    """
    from scipy.sparse.csgraph import connected_components

    _, raw = connected_components(_close_pairs(x, manifold, tol), directed=False)
    sizes = np.bincount(raw)
    first = np.array([np.flatnonzero(raw == c)[0] for c in range(sizes.size)])
    order = np.lexsort((first, -sizes))  # largest first, then by first particle
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[raw]


def _close_pairs(x, manifold: str, tol):
    """The relation of :func:`cluster_statistics` as a boolean ``n x n`` numpy matrix (diagonal True)."""
    check_choice(manifold, "manifold", ("sphere", "euclidean"))
    tol = check_number(tol, "tol", positive=True)
    X = to_torch(x, "x").detach()
    if manifold == "sphere":
        close = (X @ X.T) > 1 - tol
    else:
        sq = (X * X).sum(1)
        d2 = sq[:, None] + sq[None, :] - 2 * X @ X.T
        close = d2 < 2 * tol * float(sq.mean())
    close.fill_diagonal_(True)
    return close.cpu().numpy()


#: Relative tolerance of the numerical rank in the ``"attention_rank"`` monitor (singular values above
#: this fraction of the largest count).
ATTENTION_RANK_RTOL = 1e-3


def attention_rank(P, *, rtol: float = ATTENTION_RANK_RTOL) -> tuple[int, int]:
    r"""Numerical rank of an attention matrix and its number of leaders.

    The rank counts the singular values above ``rtol`` times the largest. A token :math:`j` is a
    *leader* when some token gives it more than half of its attention, :math:`\max_i P_{ij} > 1/2`:
    at a Boolean limit :math:`P^*` (each row one :math:`e_j^T`; Geshkovski, Letrouit, Polyanskiy and
    Rigollet, NeurIPS 2023, arXiv:2305.05465, Theorem 2.1 in :math:`d = 1`) these are the tokens whose
    column of :math:`P^*` is not zero, and the rank of :math:`P^*` equals their number
    (docs/theory/value_geometry.md). The ``"attention_rank"`` monitor of :func:`sinkflow.simulate`
    records both along a flow.

    Parameters
    ----------
    P : array (n, n) or torch.Tensor
        A row-stochastic attention matrix (finite; computed on in float64).
    rtol : float
        Relative singular-value threshold (> 0, < 1).

    Returns
    -------
    (int, int)
        ``(rank, leaders)``.

    Raises
    ------
    ValueError
        ``P`` is not a finite square matrix, or ``rtol`` is outside (0, 1).

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.particles import attention_rank
    >>> P = np.array([[1.0, 0, 0], [1.0, 0, 0], [0, 0, 1.0]])   # tokens 0 and 2 lead
    >>> attention_rank(P)
    (2, 2)
    >>> attention_rank(np.full((4, 4), 0.25))   # uniform attention: rank 1, nobody above 1/2
    (1, 0)
    """
    rtol = check_number(rtol, "rtol", positive=True)
    if rtol >= 1:
        raise ValueError(f"rtol must be in (0, 1), got {rtol}")
    M = to_torch(P, "P").detach().to(torch.float64)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"P must be a square (n, n) matrix, got shape {tuple(M.shape)}")
    if not bool(torch.isfinite(M).all()):
        raise ValueError("P must be finite")
    if M.shape[0] == 0:
        return 0, 0
    s = torch.linalg.svdvals(M)
    rank = int((s > rtol * s[0]).sum()) if float(s[0]) > 0 else 0
    leaders = int((M.max(0).values > 0.5).sum())
    return rank, leaders


@dataclass
class MonitorContext:
    """What the monitors need besides the state: the energy's form, weights, options."""

    field: ParticleField
    energy_kind: str
    W_energy: torch.Tensor
    weights64: torch.Tensor | None
    manifold: str
    cluster_tol: float


def _energy_monitor(kind: str):
    def monitor(Y, ev, ctx: MonitorContext) -> dict:
        Y = Y.detach().to(torch.float64)  # energies are theory checks: always float64
        which = ctx.energy_kind if kind == "energy" else kind
        a = ctx.weights64
        if which == "energy_sphere":
            value = energy_sphere(Y, 1.0 / ctx.field.temperature, a)
        elif which == "energy_0":
            value = energy_0(Y, ctx.W_energy, a)
        elif which == "energy_gaussian":
            value = energy_gaussian(Y, ctx.W_energy, a)
        else:
            value = energy_inf(Y, ctx.W_energy, a, tol=1e-12)
        return {kind: float(value)}

    return monitor


def _marginal_error_monitor(Y, ev, ctx: MonitorContext) -> dict:
    if ev is None:
        _, ev = ctx.field.velocity(Y)
    return {"row_error": ev.row_error, "column_error": ev.column_error}


def _cluster_monitor(Y, ev, ctx: MonitorContext) -> dict:
    frac, count = cluster_statistics(Y, manifold=ctx.manifold, tol=ctx.cluster_tol)
    return {"cluster_fraction": frac, "cluster_count": count}


def _attention_rank_monitor(Y, ev, ctx: MonitorContext) -> dict:
    field = ctx.field
    if not hasattr(field, "evaluate"):
        raise ValueError("the 'attention_rank' monitor needs the attention matrix of one system; ensembles do not "
                         "keep it (simulate each system alone)")
    P = None if ev is None else getattr(ev, "attention", None)
    if P is None:  # block-wise, or the forced last record: one dense evaluation (n <= MAX_MONITOR_N)
        P = replace(field, chunked=False, history={}).evaluate(Y.detach(), None).attention
    if P is None:
        raise ValueError("the 'attention_rank' monitor needs the n x n attention matrix, which this field never "
                         "forms (landmark / low-rank evaluation); run the dense path (landmarks=None)")
    rank, leaders = attention_rank(P)
    return {"attention_rank": rank, "attention_leaders": leaders}


#: The keys each monitor writes in :attr:`Trajectory.monitors` (integer counts, float otherwise).
MONITOR_KEYS = {"energy": ("energy",), "energy_inf": ("energy_inf",), "energy_0": ("energy_0",),
                "marginal_errors": ("row_error", "column_error"), "clusters": ("cluster_fraction", "cluster_count"),
                "attention_rank": ("attention_rank", "attention_leaders")}
_INTEGER_KEYS = ("cluster_count", "attention_rank", "attention_leaders")


class MonitorRecords(dict):
    """:attr:`Trajectory.monitors`: recorded arrays by key; a monitor's name as a key says which keys it wrote.

    Examples
    --------
    >>> import numpy as np
    >>> from sinkflow.particles import MonitorRecords
    >>> records = MonitorRecords(cluster_fraction=np.zeros(2), cluster_count=np.ones(2, dtype=int))
    >>> records["clusters"]
    Traceback (most recent call last):
    ...
    KeyError: "the monitor 'clusters' writes the keys 'cluster_fraction', 'cluster_count'"
    """

    def __missing__(self, key):
        if key in MONITOR_KEYS and MONITOR_KEYS[key] != (key,):
            raise KeyError(f"the monitor {key!r} writes the keys " + ", ".join(map(repr, MONITOR_KEYS[key])))
        raise KeyError(f"{key!r} was not recorded; recorded keys: {sorted(self)} (pass monitors=[...] to simulate)")


#: Monitors by name: ``monitor(Y, evaluation_or_None, context) -> {key: value}``.
MONITOR_FUNCTIONS = {"energy": _energy_monitor("energy"), "energy_inf": _energy_monitor("energy_inf"),
                     "energy_0": _energy_monitor("energy_0"), "marginal_errors": _marginal_error_monitor,
                     "clusters": _cluster_monitor, "attention_rank": _attention_rank_monitor}


MONITORS = tuple(MONITOR_FUNCTIONS)


def _energy_kind(variant, sphere: bool) -> str:
    """The energy whose descent the flow of this variant is checked against."""
    if sphere:
        return "energy_sphere"
    exact = variant.approximates or variant.name
    return {"unnormalized": "energy_0", "gaussian": "energy_gaussian"}.get(exact, "energy_inf")


class _Recorder:
    """Runs the monitors every ``every`` steps and collects their values (``times``: step indices)."""

    def __init__(self, names, every: int, ctx: MonitorContext):
        self.functions = [MONITOR_FUNCTIONS[m] for m in names]
        self.every, self.ctx = every, ctx
        self.records: dict[str, list] = {}
        self.times: list[float] = []

    def arrays(self) -> MonitorRecords:
        """The records as numpy arrays: integer counts, float64 otherwise."""
        return MonitorRecords({key: np.asarray(values, dtype=int if key in _INTEGER_KEYS else float)
                               for key, values in self.records.items()})

    def __call__(self, k: int, Y, ev, force: bool = False):
        if not self.functions or (k % self.every and not force):
            return
        if self.times and self.times[-1] == k:
            return
        self.times.append(k)
        for key, value in self.values(Y, ev).items():
            self.records.setdefault(key, []).append(value)

    def values(self, Y, ev) -> dict:
        out = {}
        for fn in self.functions:
            out.update(fn(Y, ev, self.ctx))
        return out


def _as_monitor_names(monitors) -> tuple:
    if isinstance(monitors, str):
        monitors = (monitors,)
    names = tuple(monitors)
    for m in names:
        check_choice(m, "each monitor", MONITORS)
    return names
