"""One training step of the Skyformer paper's LRA model: Skyformer against SoftMax, and where Skyformer's step goes.

The model and optimizer of :mod:`sinkflow.studies.paper` (2 pre-LN layers, embedding 64, 2 heads of
dimension 32, 128 landmarks, AdamW; masked as the official code: token 0), at the issue's two
settings: ListOps n = 2,000 (batch 2) and Pathfinder 32 x 32, n = 1,024 (batch 4), with the paper's
dropout 0.1 (SoftMax then forms its n x n matrix for the dropout) and with dropout 0 (SoftMax takes
torch's fused SDPA: the harder comparison). It prints

1. the step (forward, backward, AdamW): median CPU time of ``--repeats`` steps after a warm-up, the
   two models stepping in turns in one process (interleaved), the ratio Skyformer / SoftMax, and the
   peak memory of a step (peak RSS during one step above the RSS before it, in a fresh subprocess per
   cell; ``--no-memory`` skips it) beside the MiB autograd saves for backward;
2. the breakdown per step (both layers) at the model's shapes: the attention call (forward and
   backward) of each, the share of the step outside attention, and Skyformer's parts: splitting the
   padding mask, drawing and gathering the landmarks, the three Gaussian kernel blocks, the iterative
   inverse, the three low-rank products, and the glue (the call minus its parts);
3. ``--ablation``: Skyformer's step with each change to its operator undone alone (the padding-mask
   split, the kernel blocks' one-pass backward, the inverse through ``eigh``), what each earns;
4. ``--crossover N ...``: the step ratio on ListOps at those lengths (batch 2), to locate the n below
   which SoftMax is the cheaper choice.

One torch thread; CPU time (``time.process_time``) so that a shared machine's waits do not count;
the CPU model and the load average are printed with every table.
Usage: ``python benchmarks/bench_skyformer_step.py [--repeats 5] [--dropout 0.1 0.0] [--crossover 256 512]``
(run from the repository root); ``--baseline REV [--rounds N]`` compares the step rows with git revision REV,
whole runs alternated (benchmarks/_timing.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from _timing import compare_revisions, record  # noqa: E402  (benchmarks/_timing.py)

from sinkflow.attention import _inverses, _kernelized, _nystrom, _variants  # noqa: E402
from sinkflow.studies._cost import saved_bytes  # noqa: E402
from sinkflow.studies.paper import PaperSetting, _loss, machine, paper_batches, paper_model, paper_optimizer  # noqa: E402

SETTINGS = {"listops": 2, "pathfinder": 4}  # task -> batch (n = 2,000 and 1,024)
ATTENTIONS = ("softmax", "skyformer")


def _setting(task, dropout, length=None):
    return PaperSetting(task, batch_size=SETTINGS[task], dropout=dropout, max_length=length)


def _build(setting, attention, seed=0):
    x, y = paper_batches(setting, 1, seed)[0]
    torch.manual_seed(seed)
    model = paper_model(setting, attention, seq_len=x.shape[1])
    return model, paper_optimizer(model, setting)[0], x, y


def _step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    _loss(model, x, y).backward()
    opt.step()


def _cpu(fn):
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def step_times(setting, repeats):
    """Median CPU seconds of a training step per attention, the contenders stepping in turns."""
    runs = {a: _build(setting, a) for a in ATTENTIONS}
    times = {a: [] for a in ATTENTIONS}
    for r in range(repeats + 1):
        for a, run in runs.items():
            t = _cpu(lambda run=run: _step(*run))
            if r:
                times[a].append(t)
    saved = {}
    for a, (model, _, x, y) in runs.items():
        saved[a] = saved_bytes(lambda model=model, x=x, y=y: _loss(model, x, y).backward())[0] / 2**20
        model.zero_grad(set_to_none=True)
    return {a: statistics.median(t) for a, t in times.items()}, saved, runs["softmax"][2]


def _peak_rss_cell(task, dropout, attention, length):
    """Peak RSS (MiB) of one training step above the RSS before it (after a warm-up step), this process."""
    torch.set_num_threads(1)
    run = _build(_setting(task, dropout, length), attention)
    _step(*run)

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key)) / 1024

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current RSS
    before = status("VmRSS:")
    _step(*run)
    return status("VmHWM:") - before


def peak_rss(task, dropout, attention, length=None):
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import bench_skyformer_step as b; print(b._peak_rss_cell({task!r}, {dropout!r}, {attention!r}, "
            f"{length!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    return float(out.stdout.strip().splitlines()[-1])


def _median_cpu(fn, repeats):
    fn()
    return statistics.median(_cpu(fn) for _ in range(repeats))


def _fwd_bwd(make, leaves, repeats):
    """(forward, backward) median CPU seconds of ``make()`` (a tensor) from fresh leaves."""

    def forward():
        return make(*[t.detach().requires_grad_(t.is_floating_point()) for t in leaves])

    def both():
        out = forward()
        out.backward(torch.ones_like(out))

    fwd = _median_cpu(forward, repeats)
    return fwd, max(_median_cpu(both, repeats) - fwd, 0.0)


def _captured_call(model, x, y):
    """The first layer's attention call of a training step: its module and arguments (the step's own tensors)."""
    kernel = model.blocks[0].attn.kernel
    seen = []

    def record(*args, **kwargs):
        seen.append((args, kwargs))
        return type(kernel).forward(kernel, *args, **kwargs)

    kernel.forward = record
    try:
        _loss(model, x, y).backward()
    finally:
        del kernel.forward
        model.zero_grad(set_to_none=True)
    return kernel, seen[0]


def _call(kernel, mask, rest, kwargs, q, k, v):
    return kernel(q, k, v, mask, *rest, **kwargs)[0]


def breakdown(setting, repeats):
    """Per step (all layers): attention forward/backward of each contender and Skyformer's parts.

    Each attention call is timed on the tensors the first layer received in a training step (the same
    strides and mask), its forward alone and forward + backward, times the number of layers.
    """
    rows = {}
    for attention in ATTENTIONS:
        model, _, x, y = _build(setting, attention)
        model.train()
        depth = len(model.blocks)
        kernel, (args, kwargs) = _captured_call(model, x, y)
        (q, k, v, mask), rest = args[:4], args[4:]
        call = functools.partial(_call, kernel, mask, rest, kwargs)
        fwd, bwd = _fwd_bwd(call, (q, k, v), repeats)
        rows[attention] = {"attention forward": depth * fwd, "attention backward": depth * bwd}
    rows["parts"] = _skyformer_parts(q, k, v, mask, depth, repeats)
    return rows


def _skyformer_parts(q, k, v, mask, depth, repeats):
    kernel = getattr(_nystrom, "_kernel_block", _kernelized._kernel)
    n, p, m = q.shape[-2], q.shape[-1], min(128, 2 * q.shape[-2])
    parts = {}
    if mask is not None:
        parts["padding masks"] = (_median_cpu(lambda: _variants._padding_masks(mask, n, n), repeats), 0.0)
    idx = _variants._landmarks(q, k, m)

    def landmarks(q, k):
        return _nystrom._gather_rows(_kernelized._stack(q, k), idx)

    parts["landmarks (draw, stack, gather)"] = _fwd_bwd(landmarks, (q, k), repeats)
    xj = landmarks(q, k)
    blocks = [_fwd_bwd(lambda a, b: kernel(a, b, p), pair, repeats) for pair in ((q, xj), (xj, k))]
    blocks.append(_fwd_bwd(lambda a: kernel(a, a, p), (xj,), repeats))
    parts["kernel blocks (3)"] = tuple(map(sum, zip(*blocks, strict=True)))
    block = kernel(xj, xj, p)
    parts["inverse (6 iterations)"] = _fwd_bwd(lambda a: _inverses._iterative_inverse(a, 6, 0.1), (block,), repeats)
    left, right, core = kernel(q, xj, p), kernel(xj, k, p), _inverses._iterative_inverse(block, 6, 0.1)
    parts["products L (W (R V))"] = _fwd_bwd(lambda a, c, r, v: a @ (c @ (r @ v)), (left, core, right, v), repeats)
    return {name: (depth * f, depth * b) for name, (f, b) in parts.items()}


def _padding_masks_before(mask, n, m):
    """The padding-mask split before the byte-wise passes (boolean any, outer product, comparison)."""
    mask = torch.broadcast_to(mask, torch.broadcast_shapes(mask.shape, (n, m)))
    keys, queries = mask.any(-2, keepdim=True), mask.any(-1, keepdim=True)
    if not bool((mask == (queries & keys)).all()):
        raise NotImplementedError("Nyström attention supports key/query padding masks only")
    return queries, keys


#: Each change undone alone (``--ablation``): what it earns on the step is the ratio to "all changes".
UNDO = {
    "padding masks as before": (_variants, "_padding_masks", _padding_masks_before),
    "kernel blocks by autograd": (_nystrom, "_kernel_block", _kernelized._kernel),
    "inverse by its products": (_inverses, "_spectral", lambda S: False),
}


def ablation(setting, repeats):
    """Median CPU seconds of Skyformer's step with all changes and with each undone, the variants in turns."""
    run = _build(setting, "skyformer")
    times = {name: [] for name in ("all changes", *UNDO)}
    for r in range(repeats + 1):
        for name in times:
            module, attr, replacement = UNDO.get(name, (None, None, None))
            saved = module and getattr(module, attr)
            if module:
                setattr(module, attr, replacement)
            try:
                t = _cpu(lambda: _step(*run))
            finally:
                if module:
                    setattr(module, attr, saved)
            if r:
                times[name].append(t)
    return {name: statistics.median(t) for name, t in times.items()}


def _ms(s):
    return f"{1e3 * s:.1f}"


def _load():
    return ", ".join(f"{v:.1f}" for v in machine()["loadavg"])


def main(argv=None):
    argv = compare_revisions(__file__, argv)
    if argv is None:
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dropout", type=float, nargs="+", default=[0.1, 0.0])
    ap.add_argument("--tasks", nargs="*", default=list(SETTINGS), choices=list(SETTINGS), help="none: only --crossover")
    ap.add_argument("--crossover", type=int, nargs="*", default=[], help="ListOps lengths for the step ratio")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--ablation", action="store_true", help="Skyformer's step with each change of the operator undone")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    env = machine()
    print(f"# {env['cpu']}, {env['cores']} cores, torch {torch.__version__}, {torch.get_num_threads()} thread, "
          f"sinkflow from {os.path.dirname(_nystrom.__file__)}")
    report = {"machine": env, "steps": [], "breakdown": [], "crossover": []}
    print("\n| setting | dropout | SoftMax ms | Skyformer ms | Skyformer / SoftMax | peak MiB SoftMax / Skyformer "
          "| saved MiB SoftMax / Skyformer | load |")
    print("|---|---|---|---|---|---|---|---|")
    for task in args.tasks:
        for dropout in args.dropout:
            setting = _setting(task, dropout)
            med, saved, x = step_times(setting, args.repeats)
            load = _load()
            peak = {a: float("nan") for a in ATTENTIONS} if args.no_memory else {
                a: peak_rss(task, dropout, a) for a in ATTENTIONS}
            row = {"task": task, "n": int(x.shape[1]), "batch": int(x.shape[0]), "dropout": dropout, "time": med,
                   "peak_mib": peak, "saved_mib": saved, "load": load}
            report["steps"].append(row)
            for a in ("softmax", "skyformer"):
                record(f"{task}, dropout {dropout}, {a}: CPU ms / step", 1e3 * med[a])
            print(f"| {task} n = {x.shape[1]}, batch {x.shape[0]} | {dropout} | {_ms(med['softmax'])} "
                  f"| {_ms(med['skyformer'])} | {med['skyformer'] / med['softmax']:.2f}x "
                  f"| {peak['softmax']:.0f} / {peak['skyformer']:.0f} "
                  f"| {saved['softmax']:.0f} / {saved['skyformer']:.0f} | {load} |", flush=True)
            if args.no_breakdown:
                continue
            parts = breakdown(setting, args.repeats)
            report["breakdown"].append({"task": task, "dropout": dropout, **{
                key: val for key, val in parts.items()}, "step": med})
            print(f"\nbreakdown, {task}, dropout {dropout}: ms per step (both layers), forward / backward; "
                  f"load {_load()}")
            print("| part | forward | backward | share of the step |\n|---|---|---|---|")
            for a in ATTENTIONS:
                f, b = parts[a]["attention forward"], parts[a]["attention backward"]
                print(f"| {a}: attention | {_ms(f)} | {_ms(b)} | {(f + b) / med[a]:.0%} |")
                print(f"| {a}: outside attention | | | {1 - (f + b) / med[a]:.0%} ({_ms(med[a] - f - b)} ms) |")
            total_f = total_b = 0.0
            for name, (f, b) in parts["parts"].items():
                total_f, total_b = total_f + f, total_b + b
                print(f"| skyformer: {name} | {_ms(f)} | {_ms(b)} | {(f + b) / med['skyformer']:.0%} |")
            f = parts["skyformer"]["attention forward"] - total_f
            b = parts["skyformer"]["attention backward"] - total_b
            print(f"| skyformer: glue (call minus parts) | {_ms(f)} | {_ms(b)} | {(f + b) / med['skyformer']:.0%} |\n",
                  flush=True)
    if args.ablation:
        print(f"\nablation: Skyformer's step (ms) with each change undone alone; load {_load()}")
        print("| setting | dropout | all changes | " + " | ".join(UNDO) + " |\n|---|---|---|" + "---|" * len(UNDO))
        for task in args.tasks:
            for dropout in args.dropout:
                med = ablation(_setting(task, dropout), args.repeats)
                report.setdefault("ablation", []).append({"task": task, "dropout": dropout, "time": med})
                print(f"| {task} | {dropout} | {_ms(med['all changes'])} | " + " | ".join(
                    f"{_ms(med[name])} ({med[name] / med['all changes']:.2f}x)" for name in UNDO) + " |", flush=True)
    if args.crossover:
        print(f"\ncrossover: ListOps, batch 2, step time Skyformer / SoftMax; load {_load()}")
        print("| n | dropout | SoftMax ms | Skyformer ms | ratio |\n|---|---|---|---|---|")
        for n in args.crossover:
            for dropout in args.dropout:
                med, _, x = step_times(_setting("listops", dropout, n), args.repeats)
                report["crossover"].append({"n": int(x.shape[1]), "dropout": dropout, "time": med})
                print(f"| {x.shape[1]} | {dropout} | {_ms(med['softmax'])} | {_ms(med['skyformer'])} "
                      f"| {med['skyformer'] / med['softmax']:.2f}x |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
