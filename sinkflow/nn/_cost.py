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
