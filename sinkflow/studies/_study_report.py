"""Markdown of the Sinkformers paper's own studies run by ``sinkflow sinkformers``: the
patch-size study (:func:`sinkflow.studies.patch_study.patch_size_report`) and the point-cloud
study (:func:`sinkflow.studies.point_clouds.point_cloud_report`), each with its verdict line
(:func:`study_section`); :func:`sinkflow.studies.pages.reproducing_page` puts them on the page.
"""

from __future__ import annotations

import numpy as np

from sinkflow.studies._paper_numbers import SINKFORMERS, _f
from sinkflow.studies.intervals import t_interval

__all__ = ["study_section"]


def _machine_line(m: dict) -> str:
    load = ", ".join(f"{v:.1f}" for v in m["loadavg"])
    return f"{m['threads']} thread(s), {m['cpu']} ({m['cores']} cores), load {load}"


def _ci(lo, hi, scale: float = 100.0, fmt: str = "{:+.1f}") -> str:
    """``[lo, hi]`` scaled to points, ``[-, -]`` without an interval (one seed)."""
    return f"[{_f(None if lo != lo else scale * lo, fmt)}, {_f(None if hi != hi else scale * hi, fmt)}]"


def _direction(gap: float, lo: float, hi: float) -> str:
    """The sign of a Sinkhorn - SoftMax gap as its 95% interval supports it."""
    if lo != lo:
        return "one seed: no interval"
    if lo > 0:
        return "Sinkhorn ahead (interval above 0)"
    return "SoftMax ahead (interval below 0)" if hi < 0 else "no difference resolved (interval contains 0)"


def _machine_of(study: dict) -> str:
    m = study.get("machine")
    return f"; {study['wall_time']:.0f} s on {_machine_line(m)}" if m else ""


def _curve_line(curve: dict, every: int) -> str:
    """Mean test accuracy (%) every ``every`` epochs per normalization, to show where it plateaus."""
    epochs = range(every, len(curve["softmax"]), every)
    return "; ".join(f"{name} " + ", ".join(f"{e}: {100 * curve[name][e]:.0f}" for e in epochs)
                     for name in ("softmax", "sinkhorn"))


def _patch_trend(rows: list[dict]) -> str:
    """Does the gap grow as the patch shrinks? Paired by seed: gap at the smallest patch minus at the largest."""
    small, large = min(rows, key=lambda r: r["patch_size"]), max(rows, key=lambda r: r["patch_size"])
    gap = lambda r: np.asarray(r["accuracy"]["sinkhorn"]) - np.asarray(r["accuracy"]["softmax"])  # noqa: E731
    mean, lo, hi = t_interval(gap(small) - gap(large))
    verdict = ("grows as the patch shrinks, the paper's direction" if lo > 0 else
               "shrinks as the patch shrinks, against the paper's direction" if hi < 0 else
               "does not change resolvably with the patch size: the paper's direction is not shown")
    return (f"**Verdict.** The gap at patch {small['patch_size']} minus the gap at patch {large['patch_size']}, paired "
            f"by seed: {100 * mean:+.1f} points {_ci(lo, hi)} (95% t-interval): the gap {verdict}.")


def _patch_failed_runs(rows: list[dict], floor: float = 0.8) -> list[str]:
    """Runs that did not learn (below ``floor``), and the gap without their seeds: the paper's plotting script
    (``vit-pytorch/plot_results_mnist.py``) drops every run below 80%."""
    out = []
    for r in rows:
        soft, sink = (np.asarray(r["accuracy"][a]) for a in ("softmax", "sinkhorn"))
        keep = (soft >= floor) & (sink >= floor)
        if keep.all() or keep.sum() < 2:
            continue
        mean, lo, hi = t_interval(sink[keep] - soft[keep])
        out.append(f"At patch {r['patch_size']}, {int((soft < floor).sum())} SoftMax and {int((sink < floor).sum())} "
                   f"Sinkhorn run(s) stayed below {100 * floor:.0f}% (did not learn); without their seeds (the "
                   f"paper's plotting script drops such runs) the gap is {100 * mean:+.1f} points {_ci(lo, hi)} over "
                   f"{int(keep.sum())} seeds, {_direction(mean, lo, hi)}.")
    return out


def study_section(study: dict) -> list[str]:
    """A Sinkformers study report as markdown: the patch-size study
    (:func:`sinkflow.studies.patch_study.patch_size_report`), or the point-cloud study
    (:func:`sinkflow.studies.point_clouds.point_cloud_report`, ``study["study"] == "point_cloud"``)."""
    if study.get("study") == "point_cloud":
        return _point_cloud_section(study)
    first = study["rows"][0]
    tail = first.get("tail", 1)
    lines = [f"## Sinkformers: patch size (digits, {study.get('size', 'quick')}, CPU)", "",
             "One-layer, one-head, attention-only ViT on the shipped 8 x 8 digits, SoftMax against Sinkhorn "
             f"({study.get('n_iter', 3)} half-iterations), paired by seed (seeds {first['seeds']}, {first['epochs']} "
             f"epochs, {first['n_train']} training images, a run's accuracy the mean test accuracy of its last "
             f"{tail} epoch(s); `{study['command']}`{_machine_of(study)}). The paper (MNIST, 28 x 28, patch sizes 1 "
             "to 28, 5 seeds, Sinkhorn with 5 iterations) shows Sinkformer's advantage growing as the patch shrinks, "
             "in a figure without a table.", "",
             "| patch | tokens | SoftMax accuracy % (mean, 95% t-interval) | Sinkhorn accuracy % | gap, points "
             "(95% t-interval) | gap's sign | SoftMax's last-window gain, points |", "|---|---|---|---|---|---|---|"]
    for r in study["rows"]:
        ci = r.get("ci95", {"softmax": (None, None), "sinkhorn": (None, None)})
        acc = {a: f"{100 * r['mean'][a]:.1f}" + (" " + _ci(*ci[a], fmt="{:.1f}") if ci[a][0] is not None else "")
               for a in ("softmax", "sinkhorn")}
        chance = " (both at chance, 10%)" if max(r["mean"].values()) < 0.15 else ""
        plateau = (f"{100 * r['softmax_plateau_gain']:+.1f} {_ci(*r['softmax_plateau_gain_ci95'])}"
                   if "softmax_plateau_gain" in r else "-")
        lines.append(f"| {r['patch_size']} | {r['tokens']} | {acc['softmax']} | {acc['sinkhorn']} | "
                     f"{100 * r['difference']:+.1f} {_ci(*r['difference_ci95'])}{chance} | "
                     f"{_direction(r['difference'], *r['difference_ci95'])} | {plateau} |")
    lines.append("")
    if "curve" in first:
        lines += ["Mean test accuracy (%) by epoch: " + " / ".join(
            f"patch {r['patch_size']}: {_curve_line(r['curve'], max(1, r['epochs'] // 6))}" for r in study["rows"])
            + f". The last column is SoftMax's mean over the last {tail} epochs minus the {tail} before: near 0 "
            "once it has plateaued.", ""]
    lines += [_patch_trend(study["rows"]), *_patch_failed_runs(study["rows"]), ""]
    if study.get("size", "quick") == "quick":
        lines += ["The quick mode is too short for 64 one-pixel tokens (`sinkflow sinkformers patch-size --full`).",
                  ""]
    return lines


def _plateau_note(curve: dict, k: int) -> str:
    """Gain of the mean test accuracy over its last ``k`` epochs against the ``k`` before, per normalization."""
    gains = {a: 100 * (np.mean(c[-k:]) - np.mean(c[-2 * k:-k])) for a, c in curve.items()}
    rising = [a for a, g in gains.items() if g > 1]
    return (f"Last {k} epochs against the {k} before: " + ", ".join(f"{a} {g:+.1f} points" for a, g in gains.items())
            + (f"; {' and '.join(rising)} still rising: the gap is one of learning speed, not of plateaus."
               if rising else "; both have plateaued."))


def _point_cloud_section(study: dict) -> list[str]:
    """The Sinkformers point-cloud study (:func:`sinkflow.studies.point_clouds.point_cloud_report`) beside
    ModelNet40."""
    s, paper = study["setting"], SINKFORMERS["modelnet40"]
    lines = [f"## Sinkformers: point clouds (generated shapes, {s['size']}, {s['epochs']} epochs, CPU)", "",
             f"Set Transformer (a point-wise embedding of the coordinates and their norm, 2 ISABs with "
             f"{s['inducing']} inducing points, width {s['dim']}, {s['heads']} heads, PMA with one seed, dropout "
             f"{s['dropout']}) with SoftMax or Sinkhorn ({s['n_iter']} half-iterations) attention, on "
             f"{len(s['classes'])} generated shape classes ({', '.join(s['classes'])}): {s['n_train']} training and "
             f"{s['n_test']} test clouds per class of {s['n_points']} points, stretched per axis, noised, rotated "
             f"about the vertical axis. Adam lr {s['lr']:g}, batch {s['batch_size']}, {s['epochs']} epochs; a run's "
             f"accuracy is the mean test accuracy of its last {s['tail']} epochs; seeds {s['seeds']}, paired (same "
             f"data, initialization and batches); `{study['command']}`{_machine_of(study)}"
             + (f"; {study['note']}" if study.get("note") else "") + ". ModelNet40 (the paper's Table 1: 40 classes, "
             "1,000 points, width 256, 4 runs, 16 inducing points) cannot be downloaded here: compare the gap, "
             "not the accuracies. The paper's column was entered from its Table 1 without a copy of the paper "
             "to check it against here: its direction (Sinkformer ahead) is the paper's stated claim, its "
             "digits should be checked against the paper.", "",
             "| attention | accuracy % (mean, 95% t-interval) | per seed | the paper's ModelNet40, median (mean) |",
             "|---|---|---|---|"]
    for a in ("softmax", "sinkhorn"):
        seeds = ", ".join(f"{100 * v:.1f}" for v in study["accuracy"][a])
        lines.append(f"| {a} | {100 * study['mean'][a]:.1f} {_ci(*study['ci95'][a], fmt='{:.1f}')} | {seeds} | "
                     f"{paper[a]['median']:.1f} ({paper[a]['mean']:.1f}) |")
    gap, (lo, hi) = study["difference"], study["difference_ci95"]
    p_med = paper["sinkhorn"]["median"] - paper["softmax"]["median"]
    p_mean = paper["sinkhorn"]["mean"] - paper["softmax"]["mean"]
    size = ("-" if lo != lo else "inside our interval" if 100 * lo <= p_med <= 100 * hi else
            "above our interval" if p_med > 100 * hi else "below our interval")
    agree = ("agrees with the paper's" if lo > 0 else "is opposite to the paper's" if hi < 0 else
             "is not resolved (the paper's sign is neither confirmed nor refuted)")
    lines += ["", f"Mean test accuracy (%) by epoch: {_curve_line(study['curve'], max(1, s['epochs'] // 8))}. "
              + _plateau_note(study["curve"], max(s["tail"], s["epochs"] // 8)), "",
              f"**Verdict.** Gap Sinkhorn - SoftMax: {100 * gap:+.1f} points {_ci(lo, hi)} (95% paired t-interval over "
              f"{len(s['seeds'])} seeds), {_direction(gap, lo, hi)}; the paper's ModelNet40 gap is {p_med:+.1f} points "
              f"(medians; {p_mean:+.1f} in means) over {paper['runs']} runs. Direction: ours {agree}; size: the "
              f"paper's gap is {size}.", ""]
    return lines
