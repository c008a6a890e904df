"""Where a training step's memory goes, measured.

* :func:`saved_tensor_bytes`: the bytes autograd keeps for the backward pass while a
  function runs (activations), counted with ``torch.autograd.graph.saved_tensors_hooks``.
  Works on every device; each storage is counted once.
* :func:`peak_memory`: the peak memory of a function. On CUDA, the caching allocator's
  peak (``torch.cuda.max_memory_allocated``) above what was allocated before. The CPU has
  no allocator statistics, so there it reports the bytes saved for backward, the part of
  a training step's memory that grows with the batch, and says so in ``method``.

Used by notebooks 03 and 04 and by the batch-size sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def budget_exceeded_message(limit_bytes: int) -> str:
    """The error message of an imposed memory budget: labelled as simulated, and worded
    so that PyTorch Lightning's, accelerate's and this course's out-of-memory checks all
    recognize it."""
    return (
        "DefaultCPUAllocator: can't allocate memory: out of memory. (simulated: the "
        f"imposed budget of {limit_bytes / 2**20:.2f} MiB is exceeded)"
    )


def saved_tensor_bytes(fn: Callable[[], Any], *, limit_bytes: int | None = None) -> tuple[Any, int]:
    """Run ``fn()``; return its result and the bytes autograd saved for backward.

    With ``limit_bytes``, raise ``RuntimeError("out of memory ...")`` as soon as the
    saved bytes exceed it, as an allocator with that much memory would (a memory budget
    imposed on the CPU; the batch-size finder's benchmarks use it).

    >>> x = torch.ones(256, requires_grad=True)
    >>> _, saved = saved_tensor_bytes(lambda: (x * x).sum())  # saves x twice: one storage
    >>> saved
    1024
    """
    seen: set[tuple[int, int]] = set()
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen and storage.nbytes() > 0:
            seen.add(key)
            total += storage.nbytes()
            if limit_bytes is not None and total > limit_bytes:
                raise RuntimeError(budget_exceeded_message(limit_bytes))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = fn()
    return result, total


@dataclass(frozen=True)
class PeakMemory:
    """The peak memory of a function, in bytes, and how it was measured."""

    peak_bytes: int
    method: str

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / 2**20


def peak_memory(fn: Callable[[], Any], device: torch.device | str) -> PeakMemory:
    """Peak memory of ``fn()`` on ``device`` (see the module documentation)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        return PeakMemory(peak, "CUDA caching allocator: max_memory_allocated above the start")
    _, saved = saved_tensor_bytes(fn)
    return PeakMemory(saved, "CPU: bytes autograd saved for backward (no CPU allocator stats)")
