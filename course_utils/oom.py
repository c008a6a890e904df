"""Out of memory: recognising the error, releasing memory (:func:`drop_references` drops
what a notebook keeps alive first), and :class:`MemoryBudget`, the one simulated limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from course_utils.units import MIB

# What a RuntimeError says when memory ran out, lower case: CUDA, MPS, the CPU allocator,
# and the disguises of cuDNN and cuBLAS near the limit: cuDNN's v8 API tries every engine
# configuration, each fails to allocate its workspace, and it reports "unable to find an
# engine" (aten/src/ATen/native/cudnn/Conv_v8.cpp); handle creation reports
# CUDNN_STATUS_ALLOC_FAILED or CUBLAS_STATUS_ALLOC_FAILED.
_OUT_OF_MEMORY_WORDS = (
    "out of memory",
    "can't allocate memory",
    "unable to find an engine",
    "_status_alloc_failed",
)


def is_out_of_memory(error: BaseException) -> bool:
    """True for ``torch.cuda.OutOfMemoryError``, ``MemoryError``, or a ``RuntimeError``
    saying "out of memory" (CUDA, MPS, cuDNN, cuBLAS), "can't allocate memory" (CPU), or
    what cuDNN and cuBLAS say instead near the limit ("GET was unable to find an engine to
    execute this computation", ``CUDNN_STATUS_ALLOC_FAILED``, ``CUBLAS_STATUS_ALLOC_FAILED``).

    >>> is_out_of_memory(RuntimeError("GET was unable to find an engine to execute this"))
    True
    >>> is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    False
    """
    if isinstance(error, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    if not isinstance(error, RuntimeError):
        return False
    message = str(error).lower()
    return any(words in message for words in _OUT_OF_MEMORY_WORDS)


def error_summary(error: BaseException) -> str:
    """The first line of an error's message (at most 200 characters), or its type's name.

    >>> error_summary(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\\nmore"))
    'CUDA out of memory. Tried to allocate 2.00 GiB'
    """
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


@contextlib.contextmanager
def disguised_out_of_memory_as_cuda() -> Iterator[None]:
    """Re-raise an out-of-memory error that does not look like one as
    ``torch.cuda.OutOfMemoryError("CUDA out of memory. (...)")``, the original as its cause.

    cuDNN and cuBLAS near the limit raise a plain ``RuntimeError`` ("GET was unable to find
    an engine...", ``CUDNN_STATUS_ALLOC_FAILED``) that :func:`is_out_of_memory` knows but
    Lightning's tuner does not (``lightning.pytorch.utilities.memory.is_oom_error`` knows
    "CUDA ... out of memory", ``CUDNN_STATUS_NOT_SUPPORTED.`` and the CPU allocator's
    message): it would re-raise it and stop ``scale_batch_size``. Other errors pass as
    they are.

    >>> with disguised_out_of_memory_as_cuda():  # doctest: +ELLIPSIS
    ...     raise RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")
    Traceback (most recent call last):
    ...
    torch.OutOfMemoryError: CUDA out of memory. (cuDNN error: CUDNN_STATUS_ALLOC_FAILED)
    """
    try:
        yield
    except RuntimeError as error:
        if isinstance(error, torch.cuda.OutOfMemoryError) or not is_out_of_memory(error):
            raise
        message = f"CUDA out of memory. ({error_summary(error)})"
        raise torch.cuda.OutOfMemoryError(message) from error


@dataclass(frozen=True)
class MemoryBudget:
    """A simulated memory limit, where a real one cannot be hit safely (a CPU swaps, then
    the kernel kills the process). :meth:`charge` raises ``torch.cuda.OutOfMemoryError``,
    labelled simulated, worded so that Lightning and accelerate recognise it too.

    >>> MemoryBudget(100 * MIB).charge(50 * MIB)
    >>> MemoryBudget(100 * MIB).charge(150 * MIB)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    torch.OutOfMemoryError: CUDA out of memory. (simulated: 150.00 MiB needed, budget 100.00 MiB)
    """

    limit_bytes: int

    def charge(self, nbytes: int) -> None:
        if nbytes > self.limit_bytes:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. (simulated: {nbytes / MIB:.2f} MiB needed, "
                f"budget {self.limit_bytes / MIB:.2f} MiB)"
            )


def release_cached_memory() -> None:
    """Collect garbage, return cached GPU blocks to the driver and freed C-heap pages to
    the OS (glibc's ``malloc_trim``). It cannot free tensors that something still refers
    to: drop those first."""
    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # musl and others: no malloc_trim
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def allocated_cuda_bytes() -> int:
    """Bytes of live CUDA tensors on every GPU (0 before CUDA starts)."""
    if not torch.cuda.is_initialized():
        return 0
    return sum(map(torch.cuda.memory_allocated, range(torch.cuda.device_count())))


def release_after_out_of_memory(allocated_before: int | None = None) -> bool:
    """Free what a failed trial left, once its traceback is gone, without collecting the
    whole heap where no device memory is at stake; returns whether ``gc.collect()`` ran.

    The failed step's tensors go with its traceback, by reference counting. A CPU or a
    simulated :class:`MemoryBudget` has no cache to return, so nothing more is done (a
    full ``gc.collect()`` per trial cost 2.8 s on a busy 2-core machine). With CUDA the
    caching allocator's blocks go back to the driver (``empty_cache``), and the heap is
    collected only if more is still allocated than ``allocated_before`` (the bytes before
    the trial): a reference cycle then holds the failed step's tensors."""
    if not torch.cuda.is_initialized():
        return False
    collected = allocated_before is not None and allocated_cuda_bytes() > allocated_before
    if collected:
        gc.collect()
    torch.cuda.empty_cache()
    return collected


# ------------------------------------------- what a notebook keeps alive, and dropping it


@dataclass
class DroppedReferences:
    """What :func:`drop_references` did; ``print`` it for a summary."""

    deleted: list[str] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    history_entries: list[str] = field(default_factory=list)
    cleared_traceback: bool = False
    collected: int = 0
    released_mib: float = 0.0  # reserved GPU memory returned to the driver

    def __str__(self) -> str:
        lines = [
            "deleted: " + (", ".join(self.deleted) or "nothing"),
            "output history entries dropped: " + (", ".join(self.history_entries) or "none"),
            "saved traceback cleared: " + ("yes" if self.cleared_traceback else "there was none"),
            f"gc.collect() found {self.collected} unreachable objects",
            f"GPU memory returned to the driver: {self.released_mib:.1f} MiB",
        ]
        if self.not_found:
            lines.insert(1, "not found (already gone?): " + ", ".join(self.not_found))
        return "\n".join(lines)


def _holds_memory(value: Any, ids: set[int], depth: int = 0) -> bool:
    """True if ``value`` is one of ``ids``, a tensor, a module or an optimizer, or a
    list/tuple/dict holding one."""
    if id(value) in ids or isinstance(value, torch.Tensor | nn.Module | torch.optim.Optimizer):
        return True
    if depth < 3 and isinstance(value, list | tuple | set | frozenset | dict):
        items = value.values() if isinstance(value, dict) else value
        return any(_holds_memory(item, ids, depth + 1) for item in items)
    return False


_TRACEBACK_ATTRIBUTES = ("last_traceback", "last_value", "last_exc", "last_type")


def _clear_saved_traceback(shell: Any) -> bool:
    """Forget the exception Python and IPython keep for post-mortem debugging."""
    found = False
    for name in ("last_value", "last_exc"):
        error = getattr(sys, name, None)
        seen: set[int] = set()
        while isinstance(error, BaseException) and id(error) not in seen:
            seen.add(id(error))
            if error.__traceback__ is not None:
                traceback.clear_frames(error.__traceback__)  # drop the frames' locals
            error = error.__cause__ or error.__context__
    if getattr(sys, "last_traceback", None) is not None:
        traceback.clear_frames(sys.last_traceback)
    for name in _TRACEBACK_ATTRIBUTES:
        found = found or getattr(sys, name, None) is not None
        if hasattr(sys, name):
            delattr(sys, name)
    formatter: Any = getattr(shell, "InteractiveTB", None)  # shell None: no IPython
    if getattr(formatter, "tb", None) is not None:
        formatter.tb = None  # kept for %debug
    result: Any = getattr(shell, "last_execution_result", None)
    if getattr(result, "error_in_exec", None) is not None:
        result.error_in_exec = None
        found = True
    return found


def _drop_history(namespace: dict[str, Any], shell: Any, ids: set[int]) -> list[str]:
    """Drop output-history entries that hold memory: ``Out[N]``/``_N``, ``_``, ``__``, ``___``."""
    dropped: list[str] = []
    history = namespace.get("Out")
    if isinstance(history, dict):
        for key, value in list(history.items()):
            if _holds_memory(value, ids):
                del history[key]
                dropped.append(f"Out[{key}]")
                namespace.pop(f"_{key}", None)
    for name, value in list(namespace.items()):  # _N without an Out entry
        if name[:1] == "_" and name[1:].isdigit() and _holds_memory(value, ids):
            del namespace[name]
            dropped.append(name)
    hook = getattr(shell, "displayhook", None)
    for name in ("_", "__", "___"):
        if name in namespace and _holds_memory(namespace[name], ids):
            namespace[name] = ""
            dropped.append(name)
        if hook is not None and _holds_memory(getattr(hook, name, None), ids):
            setattr(hook, name, "")
    hidden = getattr(shell, "user_ns_hidden", None)  # IPython's copy of _, _N and friends
    if isinstance(hidden, dict):
        for name, value in list(hidden.items()):
            if not _holds_memory(value, ids):
                continue
            if name in ("_", "__", "___"):
                hidden[name] = ""
            elif name[:1] == "_" and name[1:].isdigit():
                del hidden[name]
    result: Any = getattr(shell, "last_execution_result", None)
    if result is not None and _holds_memory(getattr(result, "result", None), ids):
        result.result = None
    return dropped


def _reserved_bytes() -> int:
    if not torch.cuda.is_initialized():
        return 0
    return sum(map(torch.cuda.memory_reserved, range(torch.cuda.device_count())))


def drop_references(*names: str, namespace: dict[str, Any] | None = None) -> DroppedReferences:
    """Drop what a notebook keeps alive, then :func:`release_cached_memory`: ``names`` in
    ``namespace`` (default: IPython's, else the caller's globals), output-history entries
    (``Out[N]``, ``_N``, ``_``...) holding one of them, a tensor, a module or an
    optimizer, and the saved exception with its frames' locals. Other references you
    keep (a list, a second variable) still keep a tensor alive."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if namespace is None:
        namespace = shell.user_ns if shell is not None else sys._getframe(1).f_globals
    dropped = DroppedReferences()
    ids = {id(namespace[name]) for name in names if name in namespace}
    dropped.cleared_traceback = _clear_saved_traceback(shell)
    dropped.history_entries = _drop_history(namespace, shell, ids)
    for name in names:
        (dropped.deleted if name in namespace else dropped.not_found).append(name)
        namespace.pop(name, None)
    before = _reserved_bytes()
    dropped.collected = gc.collect()
    release_cached_memory()
    dropped.released_mib = (before - _reserved_bytes()) / MIB
    return dropped
