"""Bruno et al.'s experiment at their scale, and its summary: cluster counts and positions against the prediction.

``python -m sinkflow.clustering.prediction_study --normalization softmax --out docs/data/clustering/cluster_predictions_softmax.json``
runs :func:`sinkflow.clustering.plateau_clusters` for every (seed, beta) of the grid (seeds outer, so a
partial run covers every beta) and rewrites the JSON after each run; :func:`summarize` turns the runs
into agreement rates with exact (Clopper-Pearson) 95% intervals (:func:`sinkflow.bounds.binomial_interval`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from sinkflow.clustering._predictions import plateau_clusters

__all__ = ["BETAS", "run", "summarize"]

#: The inverse temperatures of the experiment (Bruno, Pasqualotto and Agazzi, ICLR 2025).
BETAS = (1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 16.0, 32.0)


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--normalization", default="softmax", choices=("softmax", "sinkhorn"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--betas", type=float, nargs="*", default=list(BETAS))
    parser.add_argument("--tol", type=float, default=1e-10)
    args = parser.parse_args(argv)
    run(Path(args.out), args.normalization, args.betas, range(args.first_seed, args.first_seed + args.seeds), args.n,
        args.tol)


if __name__ == "__main__":
    main()
