"""Per-step cost of a training step: peak memory (CUDA) or saved activations (CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def saved_bytes(forward) -> tuple[int, object]:
    """``(bytes autograd saves for backward while running forward(), its result)``.

    Storages shared by several saved tensors are counted once.
    """
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    return int(sum(seen.values())), out


def step_bytes(step, device: torch.device) -> tuple[int, str]:
    """Bytes of running ``step()`` on ``device`` and how they were measured.

    On CUDA: ``torch.cuda.max_memory_allocated`` during the step, above what was allocated
    before it. On CPU, where torch keeps no allocator statistics: the bytes of the tensors
    autograd saves for backward (the activation memory that grows with the sequence length;
    :func:`saved_bytes`).
    """
    if device.type != "cuda":
        return saved_bytes(step)[0], "saved activations (cpu)"
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base), "cuda peak allocated"


def step_memory(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, str]:
    """Bytes of one forward + backward on the batch ``(x, y)`` and how they were measured (:func:`step_bytes`)."""
    was_training = model.training
    model.train()
    try:
        return step_bytes(lambda: F.cross_entropy(model(x).float(), y).backward(), x.device)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)


#: The modules that decide what an attention's training step costs: the normalizations, the
#: attention layers and their fused passes, and the models of the cost rows.
ATTENTION_CODE = ("attention/*.py", "nn/functional.py", "nn/_float_mask.py", "nn/attention.py", "nn/_fused.py",
                  "nn/_factored_sinkhorn.py", "nn/_torch_compat.py", "studies/models.py", "studies/paper.py")


def _code_only(source: str) -> str:
    """``source`` without its docstrings, comments and blank lines (stable across Python versions)."""
    import ast
    import io
    import tokenize

    spans = []  # ((line, col), (end line, end col)) of the text to drop, 1-based lines
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            doc = body[0]
            spans.append(((doc.lineno, doc.col_offset), (doc.end_lineno, doc.end_col_offset)))
    spans += [(tok.start, tok.end) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
              if tok.type == tokenize.COMMENT]
    lines = source.splitlines()
    for (l0, c0), (l1, c1) in sorted(spans, reverse=True):  # from the end, so earlier positions hold
        lines[l0 - 1:l1] = [lines[l0 - 1][:c0] + lines[l1 - 1][c1:]]
    return "\n".join(line.rstrip() for line in lines if line.strip())


def attention_code_digest(root=None) -> str:
    """SHA-256 of the code in :data:`ATTENTION_CODE`, docstrings, comments and blank lines left out.

    A cost row records it; when the attention code changes, the digest changes and the
    committed cost rows are out of date (the test suite says which command re-runs them).

    Examples
    --------
    >>> from sinkflow.studies._cost import attention_code_digest
    >>> len(attention_code_digest())
    64
    """
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] if root is None else Path(root)
    digest = hashlib.sha256()
    for pattern in ATTENTION_CODE:
        for path in sorted(root.glob(pattern)):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(_code_only(path.read_text(encoding="utf-8")).encode() + b"\0")
    return digest.hexdigest()
