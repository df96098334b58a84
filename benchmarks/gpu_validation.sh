#!/usr/bin/env bash
# Full-model validations on a CUDA machine, in about 8 minutes, results under $OUT.
#
#   OUT=/some/dir bash benchmarks/gpu_validation.sh        (from anywhere; OUT defaults to ./gpu_out)
#
# What it does (each step under its own time limit; a failed step does not stop the next):
#   0. environment: nvidia-smi, python, torch/CUDA; installs sinkflow without touching torch
#      (pip install --no-deps -e .; falls back to PYTHONPATH when pip cannot build offline);
#   1. GPU consistency checks (CPU vs CUDA outputs, bf16 autocast keeps float32 weights, masks) -> gpu_checks.json,
#      and the CUDA tests of tests/test_nn.py (pytest -m gpu) -> gpu_tests.txt;
#   2. per-step timing of SoftMax / Sinkhorn / Gaussian attention on CUDA (n = 256 and 1024) -> bench_*.md;
#   3. sinkflow validate, full sizes, --device cuda: digits (the Sinkformers RQ1 plot and the n_iter
#      table), digits-mean (the architecture where the drift fails), retrieval (length 1024, Skyformer-style),
#      pointclouds -> <task>_full.json (+ figures when matplotlib is present), rewritten after every run,
#      so a time limit still leaves the finished runs;
#   4. summary.md with every summary table.
# Budgets (seconds) can be overridden: TOTAL_BUDGET (480), BUDGET_DIGITS=... etc.; SKIP_INSTALL=1 skips pip.
# Nothing needs the network.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu_out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_validation.log"
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "[$(elapsed)s] $*" | tee -a "$LOG"; }
PY="${PYTHON:-python}"

say "environment"
{ nvidia-smi || true; "$PY" --version; } >>"$LOG" 2>&1
if ! "$PY" -c 'import torch' >>"$LOG" 2>&1; then
    say "torch missing: trying pip install -e . (needs the network or a local wheel cache)"
    "$PY" -m pip install -q -e . >>"$LOG" 2>&1 || say "pip install failed; see $LOG"
fi
if ! "$PY" -c 'import torch' >>"$LOG" 2>&1; then
    say "FATAL: torch cannot be imported"; exit 1
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tee -a "$LOG"
# Install without dependencies so the preinstalled (CUDA) torch is kept; PYTHONPATH makes it work either way.
if [[ -z "${SKIP_INSTALL:-}" ]]; then
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 || say "pip install -e . failed (offline?); using PYTHONPATH"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
for mod in numpy scipy sklearn matplotlib tqdm; do
    "$PY" -c "import $mod" >/dev/null 2>&1 || say "note: python module '$mod' missing"
done
DEVICE=cuda
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    say "WARNING: no CUDA device visible; running the same commands on CPU with reduced epochs"
    DEVICE=cpu
fi

say "1. GPU consistency checks"
timeout 90 "$PY" - "$OUT/gpu_checks.json" "$DEVICE" >>"$LOG" 2>&1 <<'EOF' || say "checks failed or timed out (see log)"
import json, sys, time
import torch
from sinkflow.nn import MultiheadAttention
out_path, device = sys.argv[1], sys.argv[2]
res = {"device": device}
torch.manual_seed(0)
x = torch.randn(4, 300, 64)
kpm = torch.zeros(4, 300, dtype=torch.bool); kpm[1, 250:] = True
for norm in ["softmax", "sinkhorn", "gaussian"]:
    m = MultiheadAttention(64, 4, normalization=norm, n_iter=3)
    o_cpu, w_cpu = m(x, x, x, key_padding_mask=kpm)
    m = m.to(device)
    xd = x.to(device)
    o, w = m(xd, xd, xd, key_padding_mask=kpm.to(device))
    o.square().sum().backward()
    with torch.autocast(device if device == "cuda" else "cpu", dtype=torch.bfloat16):
        o16, w16 = m(xd, xd, xd, key_padding_mask=kpm.to(device), average_attn_weights=False)
    res[norm] = {
        "max_abs_diff_cpu_vs_device": float((o.detach().cpu() - o_cpu.detach()).abs().max()),
        "masked_weight_max": float(w.detach()[1, :, 250:].abs().max()),
        "grads_finite": all(bool(torch.isfinite(p.grad).all()) for p in m.parameters()),
        "autocast_weight_dtype": str(w16.dtype), "autocast_output_dtype": str(o16.dtype),
        "autocast_row_sum_err": float((w16.sum(-1)[..., :250] - 1).abs().max()) if norm != "gaussian" else None,
        "autocast_max_abs_diff": float((o16.float() - o.detach()).abs().max()),
    }
json.dump(res, open(out_path, "w"), indent=1)
print(json.dumps(res, indent=1))
EOF

if [[ $DEVICE == cuda ]] && "$PY" -c 'import pytest, hypothesis' >/dev/null 2>&1; then
    say "1b. CUDA tests (pytest -m gpu)"
    timeout 120 "$PY" -m pytest tests/test_nn.py -m gpu -q -p no:cacheprovider >"$OUT/gpu_tests.txt" 2>&1 \
        || say "CUDA tests failed or timed out: $OUT/gpu_tests.txt"
    tail -3 "$OUT/gpu_tests.txt" | tee -a "$LOG"
fi

say "2. attention step timing on $DEVICE"
for n in 256 1024; do
    timeout 60 "$PY" benchmarks/bench_attention.py --device "$DEVICE" --seq-len "$n" --repeats 15 \
        --threads "$(nproc)" >"$OUT/bench_${DEVICE}_n${n}.md" 2>>"$LOG" || say "bench n=$n failed or timed out"
done

run_task() {  # task budget_seconds extra-args...
    local task=$1 budget=$2; shift 2
    local left=$(( ${TOTAL_BUDGET:-480} - $(elapsed) ))
    if (( left < 30 )); then say "skip $task: total budget spent"; return; fi
    (( budget > left )) && budget=$left
    say "3. validate $task (budget ${budget}s): $*"
    timeout --kill-after=10 "$budget" "$PY" -m sinkflow.cli validate "$task" --full --device "$DEVICE" --out "$OUT" "$@" \
        >"$OUT/${task}_summary.md" 2>>"$LOG"
    local rc=$?
    (( rc == 124 || rc == 137 )) && say "$task hit its time limit: $OUT/${task}_full.json holds the runs finished by then (if any)"
    (( rc != 0 && rc != 124 && rc != 137 )) && say "$task failed (rc=$rc), see $LOG"
}

if [[ $DEVICE == cpu ]]; then EP_D=(--epochs 10); EP_R=(--epochs 2); else EP_D=(); EP_R=(); fi
# The paper's plot and the n_iter table: SoftMax, Sinkhorn L = 3, 5, 9 (L = 1 is SoftMax), Gaussian; 3 seeds.
# 30 epochs as in the paper's plot (the --full default is 60).
run_task digits "${BUDGET_DIGITS:-150}" --attention softmax sinkhorn gaussian --n-iter 3 5 9 --seeds 0 1 2 --epochs 30 ${EP_D[@]+"${EP_D[@]}"}
# The architecture where SoftMax attention moves away from doubly stochastic (no LN, mean pooling).
run_task digits-mean "${BUDGET_DIGITS_MEAN:-45}" --attention softmax sinkhorn --n-iter 3 --seeds 0 1 2 --epochs 30 ${EP_D[@]+"${EP_D[@]}"}
# Long sequences (n = 1025): Skyformer (Gaussian kernel, exact and Nyström) vs SoftMax, Nyströmformer, Sinkhorn;
# instability scores (Skyformer reports 0.64-0.81x SoftMax on LRA).
run_task retrieval "${BUDGET_RETRIEVAL:-130}" --attention softmax gaussian skyformer nystromformer sinkhorn --n-iter 3 \
    --seeds 0 --no-kl --epochs 6 ${EP_R[@]+"${EP_R[@]}"}
# Point clouds (n = 512): Sinkformer's ModelNet experiment in spirit.
run_task pointclouds "${BUDGET_POINTCLOUDS:-70}" --attention softmax sinkhorn gaussian --n-iter 3 --seeds 0 --no-kl --epochs 10 ${EP_R[@]+"${EP_R[@]}"}

say "4. summary"
{
    echo "# sinkflow GPU validation ($(date -u +%Y-%m-%dT%H:%MZ), $(elapsed) s)"
    for f in "$OUT"/bench_*.md "$OUT"/*_summary.md; do [[ -s $f ]] && { echo; echo "## $(basename "$f")"; cat "$f"; }; done
    "$PY" - "$OUT" <<'EOF'
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("*_full.json")):
    r = json.load(open(p))
    if r.get("complete"):
        continue
    from sinkflow.cli.validate import summary_table
    print(f"\n## {p.name} (cut short: {len(r['runs'])} finished runs)\n")
    print(summary_table(r))
EOF
} >"$OUT/summary.md" 2>>"$LOG"
cat "$OUT/summary.md"
say "done; results in $OUT"
