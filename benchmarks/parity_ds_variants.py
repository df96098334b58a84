"""Parity of sinkflow's ESP and LOT attentions with the authors' code, on seeded CPU inputs.

The authors' files are not part of sinkflow and are not copied here: point this script at them.

* ESP: ``attentions/esp.py`` of github.com/Anon4142/ESPFormer (checked at commit b89950a; the
  official github.com/dariansal/ESPFormer could not be fetched here). Its module imports
  ``ot`` (POT) and ``einops``; the class compared (``Esp``) uses neither, so a missing one is
  replaced by an empty module.
* LOT: ``bert-glue/lot_attention.py`` and ``bert-glue/sinkhorn_utils.py`` of
  github.com/anonymous13761234/LOTFormer (commit 465cde5), in one folder.

Usage::

    PYTHONPATH=. python benchmarks/parity_ds_variants.py --esp PATH/esp.py --lot PATH/lot_attention.py

Prints the largest absolute difference per case; exits 1 if one is above its tolerance.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import types
from pathlib import Path

import torch

import sinkflow


def _load(path: Path, name: str):
    for missing in ("ot", "einops", "einops.layers", "einops.layers.torch"):
        try:
            importlib.import_module(missing)
        except ImportError:
            stub = types.ModuleType(missing)
            stub.rearrange = stub.repeat = stub.Rearrange = None
            sys.modules[missing] = stub
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def esp_parity(path: Path) -> list[tuple[str, float, float]]:
    authors = _load(path, "authors_esp")
    rows = []
    g = torch.Generator().manual_seed(0)
    for (b, h, n, p), temperature in (((2, 3, 16, 8), 10.0), ((1, 2, 33, 4), 0.1), ((1, 1, 64, 16), 1.0)):
        q, k = (torch.randn(b, h, n, p, generator=g, dtype=torch.float64) / math.sqrt(p) for _ in range(2))
        theirs = authors.Esp(p, heads=h, tau=1e-3, temperature=temperature)(q, k)
        ours = sinkflow.esp_plan(q, k, tau=1e-3, temperature=temperature)
        rows.append((f"esp soft   {(b, h, n, p)} t={temperature}", float((theirs - ours).abs().max()), 1e-10))
        module = authors.Esp(p, heads=h, tau=1e-3, temperature=temperature)
        module.softsort.hard = True
        theirs = module(q, k)
        ours = sinkflow.esp_plan(q, k, tau=1e-3, temperature=temperature, hard=True)
        rows.append((f"esp hard   {(b, h, n, p)} t={temperature}", float((theirs - ours).abs().max()), 1e-10))
    return rows


def lot_parity(path: Path) -> list[tuple[str, float, float]]:
    authors = _load(path, "authors_lot")
    rows = []
    g = torch.Generator().manual_seed(1)
    for b, h, n, p, r in ((2, 2, 16, 8, 4), (1, 3, 40, 16, 8)):
        x = torch.randn(b, h, n, p, generator=g)
        v = torch.randn(b, h, n, p, generator=g)
        module = authors.LinearSinkAttention({"head_dim": p, "num_head": h, "num_refs": r, "max_iter": 5,
                                              "sink_eps": 1})
        J = torch.unique(torch.linspace(0, n - 1, r).round().long())
        # pivot = the tokens J (one per head; the authors' pivot is a learned point set, shared by the batch)
        ok = all(bool(torch.equal(x[0, :, J], x[i, :, J])) for i in range(b))
        xs = x if ok else x[:1].expand_as(x).contiguous()
        with torch.no_grad():
            module.ref.copy_(xs[0, :, J])
            theirs = module(xs, xs, v)
        C = xs @ xs.mT / math.sqrt(p)
        ours = sinkflow.lot_attention(C, r, n_iter=5) @ v
        rows.append((f"lot n_iter=5 {(b, h, n, p)} r={r}", float((theirs - ours).abs().max()), 1e-5))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--esp", type=Path, help="the authors' attentions/esp.py")
    parser.add_argument("--lot", type=Path,
                        help="the authors' bert-glue/lot_attention.py (sinkhorn_utils.py beside it)")
    args = parser.parse_args(argv)
    rows = (esp_parity(args.esp) if args.esp else []) + (lot_parity(args.lot) if args.lot else [])
    if not rows:
        parser.error("give --esp and/or --lot")
    bad = 0
    for case, diff, tol in rows:
        bad += diff > tol
        print(f"{case:45s} max |difference| {diff:.2e}  (tol {tol:.0e}){'  FAIL' if diff > tol else ''}")
    return int(bad > 0)


if __name__ == "__main__":
    raise SystemExit(main())
