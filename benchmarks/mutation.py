"""Mutation testing of the maths modules: plant one small bug at a time, check a test fails.

A mutant flips one arithmetic operator (``+ -``, ``* /``, ``**``), one comparison
(``< <=``, ``> >=``, ``== !=``), one ``and``/``or``, drops a unary minus, or changes one
numeric constant (``c -> c + 1`` for integers, ``c -> 2 c`` for floats, ``0 <-> 1``). Input
validation (the test of an ``if`` whose body only raises, and everything inside ``raise``),
docstrings, strings and annotations are never mutated: the point is wrong maths, not
wrong messages.

Each mutant is written into a private copy of the package (the working tree is never
touched) and the module's test files run against it with ``-x`` and a timeout. A mutant
is *killed* when the tests fail or time out, *survived* when they pass. Sampling is
reproducible (``--seed``) and capped (``--max-mutants``) so that a run fits a busy
machine; the score is killed / tested.

Usage (from the repository root)::

    python benchmarks/mutation.py normalizations --max-mutants 40 --seed 0
    python benchmarks/mutation.py nn/attention --tests tests/nn/test_oracles_nn.py tests/nn/test_nn.py -k "not training"
    python benchmarks/mutation.py --list            # the configured modules and their tests
    python benchmarks/mutation.py heat --show 10    # print 10 sampled mutants, run nothing

Not part of CI: one module takes minutes to an hour depending on the cap.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Module (path under sinkflow/, without .py) -> test files that guard it.
MODULE_TESTS = {
    "attention/_normalizations": ["tests/attention/test_oracles_normalizations.py",
                                  "tests/attention/test_normalizations.py"],
    "bounds/_stochasticity": ["tests/attention/test_oracles_normalizations.py", "tests/bounds/test_stochasticity.py"],
    "fields/_dense_fields": ["tests/particles/test_oracles_particles.py", "tests/particles/test_particles.py",
                             "tests/particles/test_energies.py"],
    "fields/_blockwise_fields": ["tests/particles/test_oracles_particles.py", "tests/particles/test_particles.py",
                                 "tests/fields/test_blockwise_passes.py"],
    "particles/_energies": ["tests/particles/test_oracles_particles.py", "tests/particles/test_energies.py"],
    "heat/_references": ["tests/heat/test_oracles_heat.py", "tests/heat/test_heat.py"],
    "heat/_rescaled_flow": ["tests/heat/test_oracles_heat.py", "tests/heat/test_heat.py"],
    "heat/_mean_field": ["tests/heat/test_mean_field.py"],
    "heat/_grid_fields": ["tests/heat/test_mean_field.py"],
    "clustering/_linear_theory": ["tests/clustering/test_linear_theory.py", "tests/test_theory_pages.py"],
    "heat/_circle_field": ["tests/heat/test_mean_field.py"],
    "attention/_nystrom": ["tests/attention/test_nystrom.py"],
    "bounds/_nystrom_bounds": ["tests/attention/test_nystrom.py"],
    "nn/attention": ["tests/nn/test_oracles_nn.py", "tests/nn/test_nn.py"],
    "nn/_factored_sinkhorn": ["tests/nn/test_nn.py"],
    "attention/_kernelized": ["tests/attention/test_nystrom.py"],
    "attention/_inverses": ["tests/attention/test_nystrom.py"],
    "bounds/_spectral": ["tests/attention/test_nystrom.py"],
    "nn/_fused": ["tests/nn/test_nn_fused.py"],
    "nn/_fused_sinkhorn": ["tests/nn/test_nn_fused.py"],
    "nn/_flash": ["tests/nn/test_nn_fused.py"],
    "plots/_reference": ["tests/plots/test_figures.py"],
}

_BINOP_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult,
               ast.FloorDiv: ast.Div}
_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**", ast.FloorDiv: "//", ast.Lt: "<",
           ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.And: "and", ast.Or: "or"}


@dataclass(frozen=True)
class Mutant:
    """One planted change: the ``index``-th mutation site of a module (in AST walk order)."""

    index: int
    line: int
    description: str


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # "killed", "survived", "timeout"
    seconds: float


def _is_guard(node: ast.If) -> bool:
    """An input check: ``if ...: raise ...`` with nothing else in the body."""
    return len(node.body) == 1 and isinstance(node.body[0], ast.Raise) and not node.orelse


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: validation, raise statements, docstrings, annotations, f-strings."""
    skip: set[int] = set()

    def mark(sub):
        skip.update(id(n) for n in ast.walk(sub))

    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_guard(node):
            mark(node.test)
            mark(node.body[0])
        elif isinstance(node, (ast.Raise, ast.JoinedStr, ast.Assert)):
            mark(node)
        elif isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation is not None:
            mark(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.returns is not None:
                mark(node.returns)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                mark(first)
    return skip


def _site_kinds(node: ast.AST) -> list[str]:
    """Mutations possible at ``node`` (usually zero or one)."""
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
        return [f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[_BINOP_SWAP[type(node.op)]]}"]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_SWAP:
        return [f"{_SYMBOL[type(node.ops[0])]} -> {_SYMBOL[_CMP_SWAP[type(node.ops[0])]]}"]
    if isinstance(node, ast.BoolOp):
        return ["and -> or" if isinstance(node.op, ast.And) else "or -> and"]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return ["drop unary -"]
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        v = node.value
        new = 1 if v == 0 else (0 if v == 1 else (v + 1 if isinstance(v, int) else 2 * v))
        return [f"{v!r} -> {new!r}"]
    return []


def _apply(node: ast.AST) -> None:
    if isinstance(node, ast.BinOp):
        node.op = _BINOP_SWAP[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops = [_CMP_SWAP[type(node.ops[0])]()]
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.Constant):
        v = node.value
        node.value = 1 if v == 0 else (0 if v == 1 else (v + 1 if isinstance(v, int) else 2 * v))


class _DropUnaryMinus(ast.NodeTransformer):
    def __init__(self, target_id: int):
        self.target_id = target_id

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        return node.operand if id(node) == self.target_id else node


def mutation_sites(source: str) -> list[Mutant]:
    """Every mutation site of a module, in a deterministic order."""
    tree = ast.parse(source)
    skip = _skipped_nodes(tree)
    sites = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        for kind in _site_kinds(node):
            sites.append(Mutant(len(sites), getattr(node, "lineno", 0), kind))
    return sites


def mutate(source: str, mutant: Mutant) -> str:
    """The module's source with ``mutant`` applied (re-generated by ``ast.unparse``)."""
    tree = ast.parse(source)
    skip = _skipped_nodes(tree)
    k = 0
    for node in ast.walk(tree):
        if id(node) in skip or not _site_kinds(node):
            continue
        if k == mutant.index:
            if isinstance(node, ast.UnaryOp):
                tree = _DropUnaryMinus(id(node)).visit(tree)
            else:
                _apply(node)
            return ast.unparse(ast.fix_missing_locations(tree))
        k += 1
    raise IndexError(f"no mutation site {mutant.index}")


def _run_tests(workdir: Path, tests: list[str], timeout: float, keyword: str | None = None) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": str(workdir), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header",
           "-o", "addopts=", "-m", "not slow and not gpu", *tests, *(["-k", keyword] if keyword else [])]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - start
    status = {0: "survived", 1: "killed"}.get(proc.returncode)
    if status is None:  # collection error, crash at import...: the mutant broke the module
        status = "killed"
    return status, time.perf_counter() - start


def _private_copy() -> Path:
    work = Path(tempfile.mkdtemp(prefix="sinkflow-mutation-"))
    shutil.copytree(ROOT / "sinkflow", work / "sinkflow", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    return work


def run_module(module: str, tests: list[str], max_mutants: int, seed: int, keyword: str | None = None,
               timeout_factor: float = 3.0, log=print) -> list[Outcome]:
    """Sample up to ``max_mutants`` mutants of ``sinkflow/<module>.py`` and run ``tests`` on each."""
    rel = Path("sinkflow") / f"{module}.py"
    source = (ROOT / rel).read_text()
    sites = mutation_sites(source)
    chosen = sorted(random.Random(seed).sample(sites, min(max_mutants, len(sites))), key=lambda m: m.index)
    work = _private_copy()
    target = work / rel
    try:
        status, base = _run_tests(work, tests, 1800, keyword)
        if status != "survived":
            raise RuntimeError(f"the tests {tests} fail on the unmutated code: fix them first")
        timeout = timeout_factor * base + 30
        log(f"{module}: {len(sites)} sites, {len(chosen)} sampled (seed {seed}); clean run {base:.0f}s")
        outcomes = []
        for mutant in chosen:
            target.write_text(mutate(source, mutant))
            status, secs = _run_tests(work, tests, timeout, keyword)
            outcomes.append(Outcome(mutant, status, secs))
            log(f"  {status:8s} line {mutant.line:4d}  {mutant.description:14s} ({secs:.0f}s)")
        return outcomes
    finally:
        shutil.rmtree(work, ignore_errors=True)


def score_table(results: dict[str, list[Outcome]]) -> str:
    lines = ["| module | sites sampled | killed | timeout | survived | score |", "|---|---|---|---|---|---|"]
    for module, outs in results.items():
        k = sum(o.status == "killed" for o in outs)
        t = sum(o.status == "timeout" for o in outs)
        s = sum(o.status == "survived" for o in outs)
        score = (k + t) / len(outs) if outs else float("nan")
        lines.append(f"| {module} | {len(outs)} | {k} | {t} | {s} | {score:.0%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"modules under sinkflow/ (default: all of {list(MODULE_TESTS)})")
    parser.add_argument("--tests", nargs="+", help="test files to run instead of the configured ones")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression selecting tests within the files")
    parser.add_argument("--max-mutants", type=int, default=40, help="mutants sampled per module (default 40)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--list", action="store_true", help="print the configured modules and tests, then exit")
    parser.add_argument("--show", type=int, metavar="N",
                        help="print N sampled mutants as diffs of one line, run nothing")
    parser.add_argument("--json", type=Path, help="also write every outcome to this JSON file")
    args = parser.parse_args(argv)
    if args.list:
        for module, tests in MODULE_TESTS.items():
            print(f"{module:16s} {' '.join(tests)}")
        return 0
    modules = args.modules or list(MODULE_TESTS)
    unknown = [m for m in modules if not (ROOT / "sinkflow" / f"{m}.py").exists()]
    if unknown:
        parser.error(f"no such module(s) under sinkflow/: {unknown}")
    if args.show:
        for module in modules:
            source = (ROOT / "sinkflow" / f"{module}.py").read_text()
            sites = mutation_sites(source)
            for m in random.Random(args.seed).sample(sites, min(args.show, len(sites))):
                print(f"{module}.py:{m.line}: {m.description}")
        return 0
    results = {}
    for module in modules:
        tests = args.tests or MODULE_TESTS.get(module)
        if not tests:
            parser.error(f"no tests configured for {module}: pass --tests")
        results[module] = run_module(module, tests, args.max_mutants, args.seed, args.keyword)
        survivors = [o.mutant for o in results[module] if o.status == "survived"]
        for m in survivors:
            print(f"SURVIVED {module}.py:{m.line}: {m.description}")
    print(score_table(results))
    if args.json:
        args.json.write_text(json.dumps({k: [asdict(o) for o in v] for k, v in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
