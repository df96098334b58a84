"""Bruno et al.'s experiment at their scale, and its summary: cluster counts and positions against the prediction.

``python -m sinkflow.clustering.prediction_study --normalization softmax
--out docs/data/clustering/cluster_predictions_softmax.json``
runs :func:`sinkflow.clustering.plateau_clusters` for every (seed, beta) of the grid (seeds outer, so a
partial run covers every beta) and rewrites the JSON after each run; :func:`summarize` turns the runs
into agreement rates with exact (Clopper-Pearson) 95% intervals (:func:`sinkflow.bounds.binomial_interval`).
``--sphere`` runs :func:`sinkflow.clustering.sphere_plateau_clusters` instead (:math:`S^2`, ``N = 10^4``,
``beta`` 2, 5, 10); every run already in ``--out`` is kept and skipped, so a study resumes:
``python -m sinkflow.clustering.prediction_study --sphere --seeds 7 --out docs/data/clustering/sphere_clusters.json``.
``--modes`` records the race between the modes instead (:func:`sinkflow.clustering.mode_history`, both
normalizations, resumed the same way):
``python -m sinkflow.clustering.prediction_study --modes --betas 3 5 7 10 16 32
--out docs/data/clustering/mode_race.json``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from sinkflow.clustering._predictions import mode_history, plateau_clusters, sphere_mode_maxima, sphere_plateau_clusters

__all__ = ["BETAS", "SPHERE_BETAS", "run", "run_sphere", "run_modes", "formed_count", "summarize", "summarize_modes",
           "markdown_sphere", "markdown_modes"]

#: The inverse temperatures of the experiment (Bruno, Pasqualotto and Agazzi, ICLR 2025).
BETAS = (1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 16.0, 32.0)
#: The inverse temperatures of the S^2 counts (fastest zonal degree 2, 3, 4).
SPHERE_BETAS = (2.0, 5.0, 10.0)


def run(out: Path, normalization: str, betas=BETAS, seeds=range(5), n: int = 20_000, tol: float = 1e-10) -> list:
    """All runs of the grid, written to ``out`` (JSON: ``{"config": ..., "runs": [...]}``) as they finish."""
    runs = []
    config = dict(normalization=normalization, betas=list(betas), seeds=list(seeds), n=n, tol=tol, h="min(0.1, safe)",
                  plateau="2 x formation time")
    for seed in seeds:
        for beta in betas:
            runs.append(plateau_clusters(beta, seed, n, normalization, tol=tol))
            Path(out).write_text(json.dumps(dict(config=config, runs=runs), indent=1))
    return runs


def run_sphere(out: Path, betas=SPHERE_BETAS, seeds=range(5), n: int = 10_000, tol: float = 1e-8) -> list:
    """The :math:`S^2` counts of every (seed, beta), appended to the runs already in ``out`` (those are skipped;
    a kept run without ``mode_maxima`` gets it from its seed)."""
    from sinkflow.particles import random_particles

    out = Path(out)
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    for r in runs:
        if "mode_maxima" not in r:
            x0 = random_particles(r["n"], 3, seed=r["seed"], manifold="sphere")
            r["mode_maxima"] = len(sphere_mode_maxima(x0, r["l_star"]))
    done = {(r["beta"], r["seed"], r["n"]) for r in runs}
    config = dict(n=n, betas=list(betas), normalization="softmax", tol=tol, radius=0.05,
                  plateau="2 x log(sqrt n)/max rate")
    for seed in seeds:
        for beta in betas:
            if (float(beta), int(seed), int(n)) not in done:
                runs.append(sphere_plateau_clusters(beta, seed, n, tol=tol))
            out.write_text(json.dumps(dict(config=config, runs=runs), indent=1))
    return runs


def run_modes(out: Path, betas=(3.0, 10.0), seeds=range(5), n: int = 20_000, tol: float = 1e-6) -> list:
    """:func:`~sinkflow.clustering.mode_history` of every (seed, beta, normalization), resumed from ``out``."""
    out = Path(out)
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    done = {(r["beta"], r["seed"], r["n"], r["normalization"]) for r in runs}
    config = dict(n=n, tol=tol, samples=40, plateau="2 x formation time", modes=12, h="min(0.1, safe)")
    for seed in seeds:
        for beta in betas:
            for norm in ("sinkhorn", "softmax"):
                if (float(beta), int(seed), int(n), norm) not in done:
                    runs.append(mode_history(beta, seed, n, norm, tol=tol))
                    out.write_text(json.dumps(dict(config=config, runs=runs)))
    return runs


def formed_count(counts, min_samples: int = 3) -> int:
    """The largest count held for at least ``min_samples`` consecutive samples: the plateau that formed
    (later counts are lower once clusters merge).

    Examples
    --------
    >>> from sinkflow.clustering.prediction_study import formed_count
    >>> formed_count([0, 0, 1, 3, 3, 3, 3, 4, 2, 2, 2])
    3
    """
    best, run = 0, 0
    for i, c in enumerate(counts):
        run = run + 1 if i and c == counts[i - 1] else 1
        if run >= min_samples:
            best = max(best, int(c))
    return best


def summarize_modes(runs) -> list:
    """Per (normalization, beta) of :func:`run_modes`: k*, the counts formed (:func:`formed_count`) and at
    the plateau (2 t_f), the mode ahead at t_f, and the growth rates fitted while every
    :math:`|\\mu_k| < 0.05` (the linear stage) against :func:`~sinkflow.clustering.circle_growth_rate`
    (largest relative error over the modes within 20% of the fastest)."""
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["normalization"], r["beta"]), []).append(r)
    rows = []
    for (norm, beta), rs in sorted(groups.items()):
        rates = np.asarray(rs[0]["rates"])
        k_star, near = int(np.argmax(rates)) + 1, np.flatnonzero(rates >= 0.8 * rates.max())
        formed, final, ahead, errors = [], [], [], []
        for r in rs:
            t, amp = np.asarray(r["times"]), np.asarray(r["amplitudes"])
            formed.append(formed_count(r["counts"]))
            final.append(r["counts"][-1])
            ahead.append(int(np.argmax(amp[np.argmin(np.abs(t - r["formation_time"]))])) + 1)
            linear = np.flatnonzero(amp.max(1) < 0.05)
            if linear.size >= 4:
                fitted = np.polyfit(t[linear], np.log(amp[linear][:, near]), 1)[0]
                errors.append(float(np.abs(fitted / rates[near] - 1).max()))
        rows.append(dict(normalization=norm, beta=beta, k_star=k_star, runs=len(rs), formed=formed, plateau=final,
                         ahead_at_formation=ahead, formed_is_k_star=sum(f == k_star for f in formed),
                         plateau_is_k_star=sum(f == k_star for f in final),
                         largest_rate_error=max(errors) if errors else None))
    return rows


def summarize(runs) -> list:
    """Per (normalization, n, beta): runs, counts, agreement with k* and with the seeded count (rate and
    95% exact interval), median and largest position error where the count is k*, and the counts and
    median position error at the formation time."""
    from sinkflow.bounds import binomial_interval

    groups: dict = {}
    for r in runs:
        groups.setdefault((r["normalization"], r["n"], r["beta"]), []).append(r)
    rows = []
    for (norm, n, beta), rs in sorted(groups.items()):
        hits = sum(r["count"] == r["predicted"] for r in rs)
        seeded = sum(r["count"] == r["seeded"] for r in rs)
        errors = [r["error"] for r in rs if r["count"] == r["predicted"] and not math.isnan(r["error"])]
        early = [r["error_formation"] for r in rs if not math.isnan(r.get("error_formation", math.nan))]
        rows.append(dict(normalization=norm, n=n, beta=beta, runs=len(rs), predicted=rs[0]["predicted"],
                         counts=[r["count"] for r in rs], agree=hits,
                         agree_interval=list(binomial_interval(hits, len(rs))),
                         seeded_agree=seeded, seeded_interval=list(binomial_interval(seeded, len(rs))),
                         median_error=float(np.median(errors)) if errors else math.nan,
                         max_error=float(max(errors)) if errors else math.nan,
                         counts_formation=[r.get("count_formation") for r in rs],
                         median_error_formation=float(np.median(early)) if early else math.nan))
    return rows


def _share(hits: int, runs: int) -> str:
    from sinkflow.bounds import binomial_interval

    lo, hi = binomial_interval(hits, runs)
    return f"{hits}/{runs} [{100 * lo:.0f}, {100 * hi:.0f}]%"


def markdown_sphere(runs) -> str:
    """The theory page's S^2 table: per beta, l*, the counts, the maxima of the degree-l* part, agreement."""
    from sinkflow.clustering import sphere_growth_rate

    lines = ["| $\\beta$ | $l^*$ | second / first rate | runs | clusters at $2t_f$ | maxima of $f_{l^*}$ | count = "
             "maxima | count <= maxima |", "|---|---|---|---|---|---|---|---|"]
    for beta in sorted({r["beta"] for r in runs}):
        rs = sorted((r for r in runs if r["beta"] == beta), key=lambda r: r["seed"])
        rates = np.sort(sphere_growth_rate(np.arange(1, 4 * int(math.sqrt(max(beta, 1.0))) + 6), beta))[::-1]
        counts, maxima = [r["count"] for r in rs], [r["mode_maxima"] for r in rs]
        lines.append(f"| {beta:g} | {rs[0]['l_star']} | {rates[1] / rates[0]:.3f} | {len(rs)} | "
                     f"{', '.join(map(str, counts))} | {', '.join(map(str, maxima))} | "
                     f"{_share(sum(c == m for c, m in zip(counts, maxima, strict=True)), len(rs))} | "
                     f"{_share(sum(c <= m for c, m in zip(counts, maxima, strict=True)), len(rs))} |")
    return "\n".join(lines)


def markdown_modes(runs) -> str:
    """The theory page's mode-race table (:func:`summarize_modes`)."""
    lines = ["| normalization | $\\beta$ | $k^*$ | counts formed | counts at $2t_f$ | mode ahead at $t_f$ | formed = "
             "$k^*$ | at $2t_f$ = $k^*$ | largest rate error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in summarize_modes(runs):
        err = f"{100 * r['largest_rate_error']:.0f}%" if r["largest_rate_error"] is not None else "-"
        lines.append(f"| {r['normalization']} | {r['beta']:g} | {r['k_star']} | {', '.join(map(str, r['formed']))} | "
                     f"{', '.join(map(str, r['plateau']))} | {', '.join(map(str, r['ahead_at_formation']))} | "
                     f"{r['formed_is_k_star']}/{r['runs']} | {r['plateau_is_k_star']}/{r['runs']} | {err} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--normalization", default="softmax", choices=("softmax", "sinkhorn"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--betas", type=float, nargs="*", default=list(BETAS))
    parser.add_argument("--tol", type=float, default=None)
    parser.add_argument("--sphere", action="store_true", help="S^2 counts (sphere_plateau_clusters) instead")
    parser.add_argument("--modes", action="store_true", help="the race between the modes (mode_history) instead")
    parser.add_argument("--markdown", action="store_true", help="print the theory page's table of --out, run nothing")
    args = parser.parse_args(argv)
    if args.markdown:
        runs = json.loads(Path(args.out).read_text())["runs"]
        print(markdown_sphere(runs) if args.sphere else markdown_modes(runs) if args.modes else summarize(runs))
        return
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    if args.modes:
        run_modes(Path(args.out), args.betas, seeds, args.n, args.tol or 1e-6)
        return
    if args.sphere:
        betas = SPHERE_BETAS if args.betas == list(BETAS) else args.betas
        run_sphere(Path(args.out), betas, seeds, 10_000 if args.n == 20_000 else args.n, args.tol or 1e-8)
        return
    run(Path(args.out), args.normalization, args.betas, seeds, args.n, args.tol or 1e-10)


if __name__ == "__main__":
    main()
