"""``sinkflow validate TASK``: train small Transformers with each attention normalization and
check the papers' claims (doubly stochastic drift, accuracy vs n_iter, time, instability).

Writes ``OUT/TASK_MODE.json`` (the report of :func:`sinkflow.studies.validation.run_validation`,
rewritten after every finished run with ``"complete": false`` until the task ends) and four
figures ``OUT/TASK_MODE_{column_sums,accuracy_vs_n_iter,epoch_time,instability}.png``; prints
the summary as a markdown table.

Examples::

    sinkflow validate digits --quick                       # CPU, < 2 min
    sinkflow validate listops pathfinder --learn --attention softmax skyformer   # CPU, learns above chance
    sinkflow validate digits-mean pointclouds retrieval --quick --out validation/
    sinkflow validate listops --paper --attention softmax sinkhorn gaussian skyformer nystromformer \\
        --batch-size 1 --cost-steps 2 --decomposition-length 128    # CPU, the paper's setting
    sinkflow validate digits --attention softmax sinkhorn gaussian --n-iter 1 3 5 9 \\
        --device cuda --full --seeds 0 1 2 3 4              # GPU, full sizes

``--learn`` (listops, pathfinder): a CPU setting that learns clearly above the majority class
(sizes in :mod:`sinkflow.studies.validation`); ``--data resolution=32`` and ``--epochs`` run it off
the setting (the report says what changed).

Full-size settings (``--full``; sizes in :mod:`sinkflow.studies.validation`): digits 60 epochs
on all 1797 images; point clouds 8 shapes x 600 clouds x 512 points, dim 128, 40 epochs;
retrieval 8000 sequences of length 1024 with two needles, 30 epochs. ``--amp`` adds
bfloat16 autocast on CUDA (normalizations stay float32).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def add_arguments(p) -> None:
    from sinkflow.studies.validation import TASKS

    p.add_argument("tasks", nargs="+", choices=sorted(TASKS), metavar="TASK",
                   help=f"one or more of: {', '.join(sorted(TASKS))}")
    p.add_argument("--attention", nargs="+", default=["softmax", "sinkhorn"],
                   help="normalizations: softmax, sinkhorn, gaussian, skyformer, nystromformer (or registered names); "
                        "default: softmax sinkhorn")
    p.add_argument("--n-iter", nargs="+", type=int, default=[1, 3, 5],
                   help="Sinkhorn half-iterations to sweep (1 = SoftMax); default: 1 3 5")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="model seeds (default: 0 1 2)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="quick", action="store_true", help="small CPU sizes (default)")
    mode.add_argument("--full", dest="quick", action="store_false", help="full (GPU) sizes")
    mode.add_argument("--learn", action="store_true",
                      help="listops/pathfinder: a CPU setting chosen (a small documented search) to learn clearly "
                           "above the majority class, the official padding mask, reduced lengths and model "
                           "(sinkflow.studies.validation.TASKS[task].learn); reports the majority baseline")
    mode.add_argument("--paper", action="store_true",
                      help="listops/pathfinder at the Skyformer paper's setting on CPU: cost per training step and "
                           "instability over the first 20 steps (sinkflow.studies.paper); accuracy needs --full "
                           "--device cuda")
    p.set_defaults(quick=True)
    p.add_argument("--batch-size", type=int, default=None,
                   help="--paper: batch of the cost and instability runs (default: the official 32 / 128, hours "
                        "on a CPU at 2,000 tokens; docs/reproducing.md ran --batch-size 1)")
    p.add_argument("--cost-only", action="store_true",
                   help="--paper: re-measure only the cost rows of OUT/TASK_paper.json on today's code, keeping its "
                        "instability rows (after attention code changes: --paper --cost-only --out docs/data)")
    p.add_argument("--cost-steps", type=int, default=3, help="--paper: timed training steps per cost row (default: 3)")
    p.add_argument("--instability-seeds", nargs="+", type=int, default=None,
                   help="--paper: seeds of the instability runs (default: --seeds)")
    p.add_argument("--decomposition-length", type=int, default=None,
                   help="--paper, listops: also take the Gaussian/SoftMax instability ratio apart on expressions "
                        "of at most this many tokens (sinkflow.studies.paper.instability_decomposition)")
    p.add_argument("--epochs", type=int, default=None, help="override the task's number of epochs")
    p.add_argument("--data", nargs="+", default=None, metavar="KEY=VALUE",
                   help="listops/pathfinder: override generator parameters, e.g. --data resolution=32 (the report "
                        "is then OUT/TASK_MODE_KEYVALUE.json)")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast on CUDA (normalizations stay float32)")
    p.add_argument("--no-kl", action="store_true", help="skip KL to the Sinkhorn projection (faster)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 on CPU, where small models run fastest; "
                        "torch's default on CUDA)")
    p.add_argument("--no-figures", action="store_true", help="write only the JSON report")
    p.add_argument("--out", default="validation", help="output folder (default: validation/)")


def _fmt(stat, digits=3):
    return "-" if stat is None or stat.get("median") is None else f"{stat['median']:.{digits}g}"


def summary_table(report) -> str:
    """The summary of a validation report as a markdown table."""
    lines = ["| variant | test acc (median [min, max]) | col dev epoch 0 / 1 / last | decreased 1->last | KL last | "
             "s/epoch | x SoftMax | instability | x SoftMax |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["summary"]:
        acc = r["test_accuracy"]
        ratio_t = "-" if r["epoch_time_ratio_to_softmax"] is None else f"{r['epoch_time_ratio_to_softmax']:.2f}"
        ratio_i = "-" if r["instability_ratio_to_softmax"] is None else f"{r['instability_ratio_to_softmax']:.2f}"
        lines.append(
            f"| {r['variant']} | {acc['median']:.3f} [{acc['min']:.3f}, {acc['max']:.3f}] | "
            f"{_fmt(r['column_deviation_epoch0'])} / {_fmt(r['column_deviation_epoch1'])} / "
            f"{_fmt(r['column_deviation_last'])} | {r['decreased_from_epoch1']}/{len(r['seeds'])} | "
            f"{_fmt(r['kl_last'])} | {_fmt(r['epoch_time'])} | {ratio_t} | {_fmt(r['instability_last'])} | {ratio_i} |")
    return "\n".join(lines)


def run(args) -> int:
    import torch

    problem = _check_arguments(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    threads = args.threads or (1 if args.device == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.paper:
        return _run_paper(args, out)
    if args.learn:
        from sinkflow.studies.validation import TASKS

        bad = [t for t in args.tasks if TASKS[t].learn is None]
        if bad:
            print(f"--learn has settings for {', '.join(t for t in TASKS if TASKS[t].learn)} only, not {bad}",
                  file=sys.stderr)
            return 2
    for task in args.tasks:
        _run_task(args, task, out)
    return 0


def _check_arguments(args) -> str | None:
    """What is wrong with the command line, or None."""
    import torch

    from sinkflow.nn import available_normalizations

    unknown = [a for a in args.attention if a not in available_normalizations()]
    if unknown:
        return f"unknown attention(s) {unknown}; known: {', '.join(available_normalizations())}"
    if any(k < 1 for k in args.n_iter):
        return "--n-iter values must be positive (Sinkhorn half-iterations)"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {args.device} requested but torch {torch.__version__} sees no CUDA device"
    return None


def _run_task(args, task: str, out: Path) -> None:
    """One validation task: its JSON report (saved after every run), markdown and figures, and a summary."""
    import torch

    from sinkflow.studies.validation import run_validation

    mode = "learn" if args.learn else ("quick" if args.quick else "full")
    t0 = time.perf_counter()
    print(f"# {task} ({mode}, {args.device}, {torch.get_num_threads()} thread(s))", file=sys.stderr)
    overrides, suffix = _data_overrides(args.data, task, mode)
    stem = out / f"{task}_{mode}{suffix}"
    path = stem.with_suffix(".json")

    def save(report):  # after every run, so a time limit still leaves results
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(path)

    report = run_validation(task, args.attention, args.n_iter, args.seeds, device=args.device, quick=args.quick,
                            amp=args.amp, epochs=args.epochs, track_kl=not args.no_kl, progress=True,
                            log=lambda line: print(line, file=sys.stderr), on_run=save, learn=args.learn,
                            size_overrides=overrides)
    save(report)
    written = [path] + _paper_report(report, stem) + ([] if args.no_figures else _report_figures(report, stem))
    print(f"\n## {task} ({mode}, {args.device}): {time.perf_counter() - t0:.1f} s\n")
    print(summary_table(report))
    print("\nwritten: " + ", ".join(str(p) for p in written))


def _data_overrides(pairs, task: str, mode: str) -> tuple[dict | None, str]:
    """``--data KEY=VALUE ...`` as :func:`run_validation`'s ``size_overrides`` (the task's generator
    parameters with these replaced; values parsed as int, then float) and the report name's suffix."""
    if not pairs:
        return None, ""
    from sinkflow.studies.validation import TASKS

    spec = TASKS[task]
    size = {"learn": spec.learn, "quick": spec.quick, "full": spec.full}[mode]
    params = dict(size.data)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in params:
            raise SystemExit(f"--data {pair!r}: expected KEY=VALUE with KEY one of {sorted(params)} ({task}, {mode})")
        try:
            params[key] = int(value)
        except ValueError:
            params[key] = float(value)
    changed = [(k, v) for k, v in params.items() if v != dict(size.data)[k]]
    if not changed:
        return None, ""
    overrides = {"data": tuple(params.items())}
    if "resolution" in params:
        overrides["seq_len"] = params["resolution"] ** 2
    elif "max_length" in params:
        overrides["seq_len"] = params["max_length"] - 1
    return overrides, "".join(f"_{k}{v}" for k, v in changed)


def _paper_report(report: dict, stem: Path) -> list:
    """LRA tasks: the markdown and the figure beside the paper's numbers."""
    if "paper_comparison" not in report:
        return []
    from sinkflow.studies.pages import write_paper_report

    written = write_paper_report(report, stem)
    try:
        from sinkflow.plots.training import write_paper_figure
    except ImportError:  # matplotlib missing on a bare GPU machine: the markdown is the report
        return written
    return written + write_paper_figure(report, stem)


def _report_figures(report: dict, stem: Path) -> list:
    try:
        from sinkflow.plots.style import style
        from sinkflow.plots.training import plot_report
    except ImportError as err:  # matplotlib missing on a bare GPU machine: keep the JSON
        print(f"figures skipped: {err}", file=sys.stderr)
        return []
    import matplotlib.pyplot as plt

    written = []
    with style():
        for suffix, fig in plot_report(report).items():
            p = Path(f"{stem}_{suffix}.png")
            fig.savefig(p, metadata={"Software": None})
            plt.close(fig)
            written.append(p)
    return written


def _run_paper(args, out: Path) -> int:
    """``--paper``: the cost and instability report of each LRA task (``OUT/TASK_paper.json`` and ``.md``)."""
    from sinkflow.studies.paper import OFFICIAL, refresh_cost, run_paper_setting

    bad = [t for t in args.tasks if t not in OFFICIAL]
    if bad:
        print(f"--paper runs the Skyformer paper's LRA tasks only ({', '.join(OFFICIAL)}), not {bad}", file=sys.stderr)
        return 2
    if args.device != "cpu":
        print("--paper is the CPU path; accuracy at the paper's 50,000 steps: --full --device cuda", file=sys.stderr)
        return 2
    for task in args.tasks:
        path = out / f"{task}_paper.json"
        if args.cost_only:
            if not path.exists():
                print(f"--cost-only updates {path}, which does not exist: run --paper first", file=sys.stderr)
                return 2
            _write_paper(refresh_cost(json.loads(path.read_text()), log=lambda line: print(line, file=sys.stderr)),
                         path)
            continue
        report = run_paper_setting(task, args.attention, args.seeds, cost_batch=args.batch_size,
                                   cost_steps=args.cost_steps, instability_batch=args.batch_size,
                                   instability_seeds=args.instability_seeds,
                                   decomposition_length=args.decomposition_length,
                                   log=lambda line: print(line, file=sys.stderr))
        _write_paper(report, path)
    return 0


def _write_paper(report: dict, path: Path) -> None:
    """A ``--paper`` report as JSON and markdown at ``path`` (``.json``, ``.md``); the markdown printed."""
    from sinkflow.studies.paper_report import paper_setting_markdown

    path.write_text(json.dumps(report, indent=1) + "\n")
    md = paper_setting_markdown(report)
    path.with_suffix(".md").write_text(md)
    print(md)
    print(f"written: {path}, {path.with_suffix('.md')}")
