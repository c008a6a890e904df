"""GPU memory: recognising out-of-memory errors and releasing memory between attempts.

Used by the batch-size finder (:mod:`course_utils.batch`), the OOM-recovery pattern and
notebook 07.
"""

from __future__ import annotations

import gc

import torch


def is_out_of_memory(error: BaseException) -> bool:
    """True when ``error`` means "out of memory" on a GPU or in the CPU allocator.

    ``torch.cuda.OutOfMemoryError`` always; otherwise a ``RuntimeError`` (or
    ``MemoryError``) whose message says "out of memory" (CUDA, MPS, cuDNN, cuBLAS) or
    the CPU allocator's "DefaultCPUAllocator: can't allocate memory".

    >>> is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    True
    >>> is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    False
    """
    if isinstance(error, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    if not isinstance(error, RuntimeError):
        return False
    message = str(error).lower()
    return "out of memory" in message or "can't allocate memory" in message


def release_memory() -> None:
    """Collect garbage and return cached GPU blocks to the driver.

    Call it after dropping your own references: it cannot free tensors that something
    still refers to.
    """
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
