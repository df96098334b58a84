r"""The rule a classroom can check: cluster counts of small runs on the circle against :math:`k^*(\beta)`.

``python -m sinkflow.clustering.classroom_study`` prints the table of docs/classroom.md: for SoftMax
and Sinkhorn, :math:`\beta \in \{5, 9\}` and 10 seeds, ``n = 64`` tokens from the starts of
:func:`sinkflow.circle_demo` (:func:`sinkflow.random_particles` with that seed, ``h = 0.05``), the
prediction :math:`k^*` (:func:`sinkflow.fastest_mode`) beside the count of every seed
(:func:`sinkflow.count_clusters` of :func:`sinkflow.angular_density`) at the formation time
:math:`t_f` (:func:`sinkflow.clustering.formation_time`: the end of the linear phase), at
:math:`2 t_f` (where :func:`sinkflow.clustering.particle_cluster_count` counts) and at the end of
the run. The runs of one row advance together as one ensemble, each as it would alone; the table
is deterministic (seeded starts, one thread).
"""

from __future__ import annotations

import argparse

import numpy as np

from sinkflow.clustering._linear_theory import angular_density, count_clusters, fastest_mode, formation_time

__all__ = ["NORMALIZATIONS", "classroom_counts", "markdown"]

#: The two normalizations of :func:`sinkflow.circle_demo`, by the name a table gives them.
NORMALIZATIONS = {"softmax": "SoftMax", "sinkhorn": "Sinkhorn"}


def _count(x) -> int:
    return count_clusters(angular_density(np.arctan2(x[:, 1], x[:, 0])))


def classroom_counts(betas=(5.0, 9.0), seeds=range(10), n: int = 64, t_end: float = 20.0, h: float = 0.05) -> list:
    r"""One row per (normalization, :math:`\beta`): the prediction and the counts of every seed.

    Returns
    -------
    list of dict
        Keys ``normalization``, ``beta``, ``k_star``, ``t_f``, ``seeds`` and the counts of every
        seed (numpy arrays of int) ``at_t_f``, ``at_2t_f``, ``at_end`` (at ``t_end``).

    Examples
    --------
    >>> from sinkflow.clustering.classroom_study import classroom_counts
    >>> row = classroom_counts(betas=(5.0,), seeds=range(2), n=16, t_end=1.0)[0]
    >>> row["normalization"], row["k_star"], row["at_end"].shape
    ('softmax', 3, (2,))
    """
    import sinkflow

    seeds = [int(s) for s in seeds]
    x0 = np.stack([sinkflow.random_particles(n, 2, seed=s, manifold="sphere") for s in seeds])
    steps = int(round(t_end / h))
    rows = []
    with sinkflow.torch_threads(1):
        for kind in NORMALIZATIONS:
            for beta in betas:
                traj = sinkflow.simulate(x0, kind, manifold="sphere", temperature=1.0 / beta, h=h, steps=steps)
                P, times = np.asarray(traj.positions), np.asarray(traj.times)
                t_f = formation_time(beta, n, kind)
                last = len(times) - 1  # a run shorter than 2 t_f: its end
                when = {"at_t_f": min(np.searchsorted(times, t_f), last),
                        "at_2t_f": min(np.searchsorted(times, 2 * t_f), last), "at_end": last}
                at = {key: np.array([_count(P[i, j]) for j in range(len(seeds))]) for key, i in when.items()}
                rows.append(dict(normalization=kind, beta=float(beta), k_star=fastest_mode(beta, kind), t_f=t_f,
                                 seeds=seeds, t_end=float(times[-1]), **at))
    return rows


def markdown(rows) -> str:
    """The rows of :func:`classroom_counts` as a Markdown table: every seed's count, and how many equal :math:`k^*`."""

    def cell(counts, k):
        return f"{' '.join(map(str, counts))} ({int(np.sum(counts == k))}/{len(counts)})"

    out = ["| attention | $\\beta$ | $k^*$ | $t_f$ | count at $t_f$ | count at $2t_f$ | count at $t = "
           f"{rows[0]['t_end']:g}$ |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        k = r["k_star"]
        out.append(f"| {NORMALIZATIONS[r['normalization']]} | {r['beta']:g} | {k} | {r['t_f']:.1f} | "
                   f"{cell(r['at_t_f'], k)} | {cell(r['at_2t_f'], k)} | {cell(r['at_end'], k)} |")
    return "\n".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--betas", type=float, nargs="+", default=[5.0, 9.0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. SEEDS - 1")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--t-end", type=float, default=20.0)
    args = parser.parse_args(argv)
    rows = classroom_counts(args.betas, range(args.seeds), args.n, args.t_end)
    print(f"n = {args.n}, seeds 0-{args.seeds - 1}, h = 0.05; each cell: the count of every seed (how many = k*)")
    print()
    print(markdown(rows))


if __name__ == "__main__":
    main()
