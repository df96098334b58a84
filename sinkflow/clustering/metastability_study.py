"""Dynamic metastability at scale: dwell times of the last plateau against beta, saddles and the energy staircase.

``python -m sinkflow.clustering.metastability_study --manifold circle --normalization softmax --seeds 10
--out docs/data/clustering/dwell_circle_softmax.json``
runs :func:`sinkflow.clustering.plateau_run` for every (seed, beta) of the grid (seeds outer), keeps the
runs already in ``--out`` and rewrites it after each run, so a study resumes. :func:`summarize` gives,
per beta, the measured and predicted 2-cluster dwell times, and per grid the fitted exponents with
bootstrap 95% intervals (:func:`sinkflow.clustering.fit_exponent`), the unstable directions found at
each plateau and the gap between the energy and the point-cluster staircase level.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sinkflow.clustering._metastability import fit_exponent, plateau_run

__all__ = ["DWELL_BETAS", "run", "summarize", "markdown", "handoff_agreement"]

#: Inverse temperatures of the dwell study: the last plateau (2 clusters) lasts ~e^{2 beta}.
DWELL_BETAS = (2.0, 2.5, 3.0, 3.5, 4.0)
_DIMENSION = {"circle": 2, "sphere": 3}


def run(out: Path, manifold: str = "circle", normalization: str = "softmax", betas=DWELL_BETAS, seeds=range(10),
        n: int = 256, clusters: int = 2, samples: int = 40, handoff: float | None = None) -> list:
    """All runs of the grid, appended to those already in ``out`` (JSON ``{"config": ..., "runs": [...]}``)."""
    out = Path(out)
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    done = {(r["beta"], r["seed"], r["n"]) for r in runs}
    config = dict(manifold=manifold, d=_DIMENSION[manifold], normalization=normalization, n=n,
                  h="0.9 x largest_safe_step", samples_per_chunk=samples,
                  chunk="max(20, e^(c beta)/5), c = 1 - cos(2 pi/clusters)", t_max="12 e^(c beta)", tol=1e-10,
                  clusters=clusters, handoff=handoff)
    if handoff is not None:
        config.update(chunk=20, handoff_rule=f"point_cluster_dwell once the plateau held a chunk within {handoff} rad")
    for seed in seeds:
        for beta in betas:
            if (float(beta), int(seed), int(n)) not in done:
                runs.append(plateau_run(beta, seed, n, _DIMENSION[manifold], normalization, clusters=clusters,
                                        samples=samples, handoff=handoff))
                out.write_text(json.dumps(dict(config=config, runs=runs)))
    return runs


def summarize(runs, settled: float = 0.01) -> dict:
    """Rows per beta (dwell times measured and predicted, their ratio, censored runs), the fitted exponents
    (measured, predicted; slope and 95% interval) and the plateau checks per count: plateaus, those
    ``settled`` (energy within that relative gap of :func:`~sinkflow.clustering.staircase_level`: the
    clusters are points; the others were caught forming), the unstable directions of the settled ones
    and their largest gap."""
    rows, fit_b, fit_t, fit_p = [], [], [], []
    for beta in sorted({r["beta"] for r in runs}):
        rs = [r for r in runs if r["beta"] == beta]
        ok = [r for r in rs if r["dwell"] is not None and r["predicted"] is not None]
        fit_b += [beta] * len(ok)
        fit_t += [r["dwell"] for r in ok]
        fit_p += [r["predicted"] for r in ok]
        ratios = [r["dwell"] / r["predicted"] for r in ok]
        rows.append(dict(beta=beta, runs=len(rs), measured=len(ok), censored=sum(r["censored"] for r in rs),
                         no_two_plateau=sum(r["masses"] is None for r in rs),
                         median_dwell=float(np.median([r["dwell"] for r in ok])) if ok else None,
                         median_predicted=float(np.median([r["predicted"] for r in ok])) if ok else None,
                         ratio_range=[float(min(ratios)), float(max(ratios))] if ratios else None,
                         median_ratio=float(np.median(ratios)) if ratios else None))
    fits = {}
    if len(set(fit_b)) >= 2:
        fits = dict(measured=fit_exponent(fit_b, fit_t), predicted=fit_exponent(fit_b, fit_p))
    saddles: dict = {}
    for r in runs:
        for p in r["plateaus"]:
            entry = saddles.setdefault(str(p["count"]), dict(plateaus=0, settled=0, positive={}, level_gap=0.0))
            entry["plateaus"] += 1
            gap = abs(p["energy"] - p["level"]) / abs(p["level"])
            if gap < settled:  # the clusters are points: the plateau sits on its staircase level
                entry["settled"] += 1
                entry["positive"][str(p["positive"])] = entry["positive"].get(str(p["positive"]), 0) + 1
                entry["level_gap"] = max(entry["level_gap"], gap)
    return dict(rows=rows, fits=fits, saddles=saddles)


def handoff_agreement(particles, handed) -> list:
    """``(beta, seed, ratio)``: dwell with the hand-off over the dwell of the particles run to the end, for the
    runs (same beta, seed and n: the same start) that both studies completed."""
    full = {(r["beta"], r["seed"], r["n"]): r["dwell"] for r in particles if r["dwell"]}
    return [(r["beta"], r["seed"], r["dwell"] / full[key]) for r in handed
            if r["dwell"] and (key := (r["beta"], r["seed"], r["n"])) in full]


def _interval(fit) -> str:
    return f"{fit[0]:.2f} [{fit[1]:.2f}, {fit[2]:.2f}]"


def markdown(paths) -> str:
    """The dwell table of the theory page: one block of rows per study file (its fits on its first row)."""
    lines = ["| manifold, normalization (plateau) | $\\beta$ | runs (no such plateau) | dwell, median | two-cluster "
             "law, median | measured / law, median [range] | fitted exponent, measured / law [95%] | settled plateaus: "
             "positive directions |", "|---|---|---|---|---|---|---|---|"]
    for path in paths:
        data = json.loads(Path(path).read_text())
        summary, cfg = summarize(data["runs"]), data["config"]
        fits = summary["fits"]
        fit = f"{_interval(fits['measured'])} / {_interval(fits['predicted'])}" if fits else "-"
        saddles = "; ".join(f"{c} clusters: " + ", ".join(f"{k} in {v}" for k, v in e["positive"].items())
                            for c, e in sorted(summary["saddles"].items()) if e["settled"])
        for i, r in enumerate(summary["rows"]):
            ratio = (f"{r['median_ratio']:.2f} [{r['ratio_range'][0]:.2f}, {r['ratio_range'][1]:.2f}]"
                     if r["ratio_range"] else "-")
            dwell = f"{r['median_dwell']:.0f}" if r["median_dwell"] else "-"
            law = f"{r['median_predicted']:.0f}" if r["median_predicted"] else "-"
            mode = ", hand-off" if cfg.get("handoff") else ""
            head = ""
            if i == 0:
                head = f"{cfg['manifold']}, {cfg['normalization']} ({cfg.get('clusters', 2)} clusters{mode})"
            lines.append(f"| {head} | {r['beta']:g} | {r['runs']} ({r['no_two_plateau']}) | {dwell} | {law} | {ratio} "
                         f"| {fit if i == 0 else ''} | {saddles if i == 0 else ''} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifold", default="circle", choices=tuple(_DIMENSION))
    parser.add_argument("--normalization", default="softmax", choices=("softmax", "sinkhorn"))
    parser.add_argument("--out")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--clusters", type=int, default=2, help="the plateau whose dwell is measured")
    parser.add_argument("--samples", type=int, default=40, help="counts per chunk")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--handoff", type=float, help="hand settled plateaus (this width, rad) to point_cluster_dwell")
    parser.add_argument("--betas", type=float, nargs="*", default=list(DWELL_BETAS))
    parser.add_argument("--summary", action="store_true", help="print the summary of --out and run nothing")
    parser.add_argument("--markdown", nargs="+", help="print the theory page's table of these study files")
    parser.add_argument("--agreement", nargs=2, metavar=("PARTICLES", "HANDED"),
                        help="print handoff_agreement of two study files and run nothing")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(args.markdown))
        return
    if args.agreement:
        runs = [json.loads(Path(p).read_text())["runs"] for p in args.agreement]
        ratios = handoff_agreement(*runs)
        print(f"{len(ratios)} runs; hand-off / particles: " + ", ".join(f"{r:.4f}" for _, _, r in ratios))
        return
    if not args.out:
        parser.error("--out is required")
    if args.summary:
        print(json.dumps(summarize(json.loads(Path(args.out).read_text())["runs"]), indent=1))
        return
    run(Path(args.out), args.manifold, args.normalization, args.betas, range(args.seeds), args.n, args.clusters,
        args.samples,
        args.handoff)


if __name__ == "__main__":
    main()
