"""GPU memory (notebook 07): what is used and by whom, allocator settings, fragmentation,
and a real memory cap. Out-of-memory errors and freeing references: :mod:`course_utils.oom`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from course_utils import nvml
from course_utils.oom import release_cached_memory
from course_utils.units import MIB

# --- what the process uses: allocated, reserved, the driver's view, and the CUDA context


def process_rss_mib() -> float:
    """Resident memory of this process in MiB (what ``top`` shows as RES)."""
    return psutil.Process().memory_info().rss / MIB


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory in MiB: ``allocated`` (live tensors), ``reserved`` (the caching
    allocator: tensors plus cache), ``peak_allocated`` (since the last
    ``reset_peak_memory_stats``), ``free``/``total`` (``mem_get_info``, every process) and
    ``process_used`` (NVML's per-process figure; ``None`` when NVML cannot see us)."""

    device: str
    name: str
    allocated_mib: float
    reserved_mib: float
    peak_allocated_mib: float
    free_mib: float
    total_mib: float
    process_used_mib: float | None

    @property
    def cached_mib(self) -> float:
        """Reserved but unallocated: what ``empty_cache`` can give back (if whole blocks)."""
        return self.reserved_mib - self.allocated_mib

    @property
    def outside_allocator_mib(self) -> float | None:
        """NVML minus reserved: the CUDA context, kernels, and non-PyTorch allocations."""
        used = self.process_used_mib
        return None if used is None else used - self.reserved_mib


_ROWS = [
    ("allocated (live tensors)", "allocated_mib"),
    ("reserved (allocator: tensors + cache)", "reserved_mib"),
    ("  of which cached, unused", "cached_mib"),
    ("peak allocated", "peak_allocated_mib"),
    ("NVML: this process (nvidia-smi)", "process_used_mib"),
    ("  NVML - reserved (CUDA context, other)", "outside_allocator_mib"),
    ("mem_get_info: free on the GPU", "free_mib"),
    ("mem_get_info: total", "total_mib"),
]


@dataclass(frozen=True)
class MemoryReport:
    """The result of :func:`memory_report`; ``print`` it for the table."""

    gpus: list[GpuMemory]
    process_rss_mib: float
    note: str

    def __str__(self) -> str:
        """One table in MiB, a column per GPU, then the process's RSS and the note."""
        width, gpus = 41, self.gpus
        parts = []
        if gpus:
            parts.append("MiB".ljust(width) + "".join(f"{gpu.device:>12}" for gpu in gpus))
            parts.append("".ljust(width) + "".join(f"{gpu.name[:11]:>12}" for gpu in gpus))
        for label, attribute in _ROWS if gpus else []:
            values = [getattr(gpu, attribute) for gpu in gpus]
            cells = [f"{'n/a':>12}" if v is None else f"{v:>12.1f}" for v in values]
            parts.append(label.ljust(width) + "".join(cells))
        parts.append(f"process resident memory (RSS, CPU side): {self.process_rss_mib:.1f} MiB")
        parts.append(self.note)
        return "\n".join(parts)


def _gpus_in_use() -> list[int]:
    """CUDA indices where this process holds memory or has a context: reading
    ``mem_get_info`` on another GPU would create a context there (about 0.5 GiB)."""
    if not torch.cuda.is_initialized():
        return []
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", lambda index: False)
    indices = range(torch.cuda.device_count())
    return [i for i in indices if torch.cuda.memory_reserved(i) > 0 or has_context(i)]


def gpu_memory(index: int) -> GpuMemory:
    """Read :class:`GpuMemory` for ``cuda:index`` (initializes CUDA on that GPU)."""
    free, total = torch.cuda.mem_get_info(index)
    nvml_index = nvml.nvml_index(index)
    used = None if nvml_index is None else nvml.process_memory_used_mib(nvml_index)
    return GpuMemory(
        device=f"cuda:{index}",
        name=torch.cuda.get_device_name(index),
        allocated_mib=torch.cuda.memory_allocated(index) / MIB,
        reserved_mib=torch.cuda.memory_reserved(index) / MIB,
        peak_allocated_mib=torch.cuda.max_memory_allocated(index) / MIB,
        free_mib=free / MIB,
        total_mib=total / MIB,
        process_used_mib=None if used is None else float(used),
    )


def memory_report() -> MemoryReport:
    """Allocated, reserved, peak, ``mem_get_info`` and NVML, for every GPU in use; without
    one (or before CUDA starts) the process's resident memory, and why."""
    indices = _gpus_in_use()
    if indices:
        note = (
            "reserved - allocated is cached: empty_cache() returns it to the driver only "
            "where whole cached segments are unused. NVML - reserved is the CUDA context "
            "and kernels (never freed while the process lives) plus memory other libraries "
            "allocated without PyTorch. n/a: NVML cannot see this process (for example "
            "inside a container)."
        )
    elif torch.cuda.is_initialized():
        note = "CUDA is initialized but this process holds no GPU memory."
    else:
        note = (
            "CPU tensors have no caching allocator: PyTorch hands freed CPU memory back to "
            "malloc, which returns large blocks to the operating system at once. The number "
            "to watch is the process's resident memory (RSS). (CUDA is not initialized in "
            "this process.)"
        )
    return MemoryReport([gpu_memory(i) for i in indices], process_rss_mib(), note)


@dataclass(frozen=True)
class MemoryReading:
    """Memory at one stage of an experiment, in MiB; ``None`` where it does not apply
    (no caching allocator on a CPU; NVML cannot see the process)."""

    stage: str
    allocated_mib: float | None
    reserved_mib: float | None
    process_used_mib: float | None
    rss_mib: float


def read_memory(device: torch.device | str, stage: str) -> MemoryReading:
    """Read allocated, reserved, NVML's per-process figure and the RSS for ``device``."""
    device = torch.device(device)
    if device.type != "cuda":
        return MemoryReading(stage, None, None, None, process_rss_mib())
    gpu = gpu_memory(torch.cuda.current_device() if device.index is None else device.index)
    used = (gpu.allocated_mib, gpu.reserved_mib, gpu.process_used_mib)
    return MemoryReading(stage, *used, process_rss_mib())


def format_readings(readings: list[MemoryReading]) -> str:
    """A table of :class:`MemoryReading` rows, in MiB.

    >>> print(format_readings([MemoryReading("start", 0.0, 2.0, None, 500.0)]))
    stage                                    allocated   reserved  nvidia-smi    RSS (CPU)
    start                                          0.0        2.0         n/a        500.0
    """

    def cell(value: float | None, width: int) -> str:
        return f"{'n/a':>{width}}" if value is None else f"{value:>{width}.1f}"

    lines = [f"{'stage':<40}{'allocated':>10}{'reserved':>11}{'nvidia-smi':>12}{'RSS (CPU)':>13}"]
    for r in readings:
        lines.append(
            f"{r.stage:<40}{cell(r.allocated_mib, 10)}{cell(r.reserved_mib, 11)}"
            f"{cell(r.process_used_mib, 12)}{cell(r.rss_mib, 13)}"
        )
    return "\n".join(lines)


def empty_cache_experiment(device: torch.device | str, mib: int) -> list[MemoryReading]:
    """What ``del`` and ``torch.cuda.empty_cache()`` do, in six stages (see the labels).
    On a CPU only the RSS column has numbers; glibc may keep freed pages resident, so
    stage 3 runs ``del`` and then ``malloc_trim``."""
    device = torch.device(device)
    elements = mib * MIB // 4

    def cache_release() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()

    release_cached_memory()
    readings = [read_memory(device, "1 baseline")]
    tensor = torch.ones(elements, device=device)
    readings.append(read_memory(device, f"2 tensor of {mib} MiB allocated"))
    del tensor
    stage = "3 del tensor"
    if device.type == "cpu":  # PyTorch keeps nothing; glibc may, until asked to trim
        release_cached_memory()
        stage = "3 del tensor + malloc_trim (CPU)"
    readings.append(read_memory(device, stage))
    again = torch.ones(elements, device=device)
    readings.append(read_memory(device, "4 same size again (no empty_cache)"))
    cache_release()
    readings.append(read_memory(device, "5 empty_cache, tensor still alive"))
    del again
    cache_release()
    readings.append(read_memory(device, "6 del + empty_cache"))
    return readings


# --------------------------------- allocator settings: read once, when CUDA initializes

ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


class AllocatorAlreadyInitializedError(RuntimeError):
    """CUDA has started in this process, so a new allocator setting would be ignored."""


def configure_allocator(**wanted: str | int | float | bool) -> str:
    """Set the CUDA caching allocator's options by name (``expandable_segments=True``,
    ``max_split_size_mb=128``...); returns the setting written to ``PYTORCH_CUDA_ALLOC_CONF``
    and ``PYTORCH_ALLOC_CONF`` (old and new names), keeping options already set. PyTorch
    reads it when CUDA initializes: afterwards this raises
    :class:`AllocatorAlreadyInitializedError`."""
    if not wanted:
        raise ValueError("say which option to set, for example expandable_segments=True")
    current = next((os.environ[n] for n in ALLOC_CONF_VARIABLES[::-1] if os.environ.get(n)), "")
    items = [item.partition(":") for item in current.split(",")]
    setting = {key.strip(): value.strip() for key, _, value in items if key.strip()}
    setting.update({key: str(value) for key, value in wanted.items()})
    text = ",".join(f"{key}:{value}" for key, value in setting.items())
    if torch.cuda.is_initialized():
        raise AllocatorAlreadyInitializedError(
            f"CUDA is already initialized in this process, so the allocator has read its "
            f"settings and would ignore {ALLOC_CONF_VARIABLES[1]}={text}. Restart the "
            "kernel (Colab: Runtime > Restart session), then call configure_allocator(...) "
            "before anything uses the GPU, or set the variable before starting Python."
        )
    for name in ALLOC_CONF_VARIABLES:
        os.environ[name] = text
    return text


# --- fragmentation: cached memory that cannot be returned or reused for a bigger tensor


@dataclass(frozen=True)
class Fragmentation:
    """The allocator's segments, in MiB. ``largest_free_block``: the biggest tensor the
    cache holds without reserving more; ``stuck``: cache in segments that also hold a live
    tensor, which ``empty_cache`` cannot return."""

    segments: int
    reserved_mib: float
    allocated_mib: float
    largest_free_block_mib: float
    stuck_mib: float

    @property
    def cached_mib(self) -> float:
        return self.reserved_mib - self.allocated_mib


def summarize_segments(segments: list[dict[str, Any]]) -> Fragmentation:
    """Summarise the ``segments`` of ``torch.cuda.memory_snapshot()``."""
    reserved = allocated = largest = stuck = 0
    for segment in segments:
        reserved += segment["total_size"]
        used = sum(b["size"] for b in segment["blocks"] if b["state"] == "active_allocated")
        free = [b["size"] for b in segment["blocks"] if b["state"] == "inactive"]
        allocated += used
        largest = max([largest, *free])
        stuck += sum(free) if used else 0
    return Fragmentation(len(segments), reserved / MIB, allocated / MIB, largest / MIB, stuck / MIB)


def fragment(device: torch.device | str, *, blocks: int = 30, block_mib: int = 6) -> Fragmentation:
    """Fragment the CUDA allocator on purpose: allocate ``blocks`` tensors of
    ``block_mib`` MiB, free two of every three, ``empty_cache`` and summarise the segments.
    Without expandable segments tensors of 1 to 10 MiB share 20 MiB segments, so one
    survivor pins its segment."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("fragmentation is a property of the CUDA caching allocator")
    tensors = [torch.empty(block_mib * MIB // 4, device=device) for _ in range(blocks)]
    survivors = [t for i, t in enumerate(tensors) if i % 3 == 2]
    del tensors
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    segments = [
        s for s in torch.cuda.memory_snapshot() if s.get("device", 0) == (device.index or 0)
    ]
    summary = summarize_segments(segments)
    del survivors
    torch.cuda.empty_cache()
    return summary


def regrow(
    device: torch.device | str, *, tensors: int = 8, tensor_mib: int = 48, growth: float = 1.05
) -> float:
    """What expandable segments are for: a batch that grows a little. Allocate ``tensors``
    tensors of ``tensor_mib`` MiB, free them (their blocks stay cached), allocate as many
    ``growth`` times larger, and return the MiB reserved then. The default allocator cannot
    fit a larger tensor in a freed block of its own segment, so it reserves a new set
    (about ``1 + growth`` times one set); with expandable segments the freed blocks are one
    range of one segment, which the larger tensors reuse (about ``growth`` times a set)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("segment reuse is a property of the CUDA caching allocator")
    torch.cuda.empty_cache()
    numel = tensor_mib * MIB // 4
    first = [torch.empty(numel, device=device) for _ in range(tensors)]
    del first  # cached, not returned
    grown = [torch.empty(int(numel * growth), device=device) for _ in range(tensors)]
    torch.cuda.synchronize(device)
    reserved = torch.cuda.memory_reserved(device) / MIB
    del grown
    torch.cuda.empty_cache()
    return reserved


def _in_both_allocators(call: str) -> dict[str, Any]:
    """``call`` (an expression of ``course_utils.memory`` names, JSON-able) evaluated in
    two fresh processes, without and with expandable segments (the allocator reads its
    setting when CUDA starts): ``{"default": ..., "expandable_segments": ...}``."""
    code = (
        "import json, dataclasses; from course_utils.memory import *; "
        f"value = {call}; "
        "print(json.dumps(dataclasses.asdict(value) if dataclasses.is_dataclass(value) "
        "else value))"
    )
    package_root = str(Path(__file__).resolve().parent.parent)  # so the child finds us
    results: dict[str, Any] = {}
    for label, setting in [("default", ""), ("expandable_segments", "expandable_segments:True")]:
        env = {k: v for k, v in os.environ.items() if k not in ALLOC_CONF_VARIABLES}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        if setting:
            env.update(dict.fromkeys(ALLOC_CONF_VARIABLES, setting))
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
            raise RuntimeError(f"{label}: {lines[-1]}")
        results[label] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def compare_expandable_segments(*, blocks: int = 30, block_mib: int = 6) -> dict[str, Any]:
    """:func:`fragment` in two fresh processes (the allocator reads its setting when CUDA
    starts): ``{"default": Fragmentation, "expandable_segments": Fragmentation}``."""
    found = _in_both_allocators(f"fragment('cuda', blocks={blocks}, block_mib={block_mib})")
    return {label: Fragmentation(**fields) for label, fields in found.items()}


def compare_regrowth(
    *, tensors: int = 8, tensor_mib: int = 48, growth: float = 1.05
) -> dict[str, float]:
    """:func:`regrow` in two fresh processes: MiB reserved after the grown set,
    ``{"default": ..., "expandable_segments": ...}``."""
    return _in_both_allocators(
        f"regrow('cuda', tensors={tensors}, tensor_mib={tensor_mib}, growth={growth})"
    )


# --------- a real memory cap on a GPU (the simulated one for a CPU is oom.MemoryBudget)


@contextmanager
def memory_cap(device: torch.device | str, mib: float) -> Iterator[None]:
    """Limit this process's CUDA caching allocator to ``mib`` MiB inside the block
    (``set_per_process_memory_fraction``: past the cap CUDA raises ``OutOfMemoryError``);
    afterwards the fraction in force before (1.0, or an enclosing cap's) is restored.

    **The reuse rule.** The cap is checked only when the allocator asks CUDA for a new
    segment; blocks it already caches are reused without the check (``alloc_block`` in
    ``c10/cuda/CUDACachingAllocator.cpp``). Memory cached by earlier work (a sweep up to a
    large batch) would let a search under the cap find sizes the cap was meant to hide,
    until the first out-of-memory error emptied the cache. So the cap starts with
    :func:`~course_utils.oom.release_cached_memory` (``gc.collect()`` and
    ``torch.cuda.empty_cache()``): inside the block everything the allocator holds was
    reserved under the cap. Tensors still alive when the block starts count towards it.
    A cap at or above the GPU's memory (15 GiB on a T4, whose usable memory is about
    14.7 GiB) limits nothing: :func:`memory_cap_label` says which applies."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("memory_cap limits the CUDA caching allocator; got " + str(device))
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    previous = _memory_fraction(index)
    fraction = min(1.0, mib * MIB / total)
    release_cached_memory()  # cached blocks are reused without the cap's check: return them
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    _FRACTIONS[index] = fraction
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(previous, index)
        _FRACTIONS[index] = previous
        release_cached_memory()


def memory_cap_label(mib: float, total_bytes: int) -> str:
    """What limits a search under :func:`memory_cap` of ``mib`` MiB on a GPU of
    ``total_bytes`` (``get_device_properties(...).total_memory``): the cap, or, where the
    cap is at least the GPU's memory (a 15 GiB cap on a T4), the GPU's own memory.

    >>> memory_cap_label(15 * 1024, int(14.58 * 2**30))  # a T4, as torch reports it
    "this GPU's own memory (14.6 GiB; the 15.0 GiB cap is above it)"
    >>> memory_cap_label(15 * 1024, 80 * 2**30)
    'a 15.0 GiB cap on this GPU (80.0 GiB)'
    """
    total_gib, cap_gib = total_bytes / 2**30, mib / 1024
    if mib * MIB >= total_bytes:
        return f"this GPU's own memory ({total_gib:.1f} GiB; the {cap_gib:.1f} GiB cap is above it)"
    return f"a {cap_gib:.1f} GiB cap on this GPU ({total_gib:.1f} GiB)"


_FRACTIONS: dict[int, float] = {}  # what memory_cap set, for a torch that cannot read it back


def _memory_fraction(index: int) -> float:
    """The per-process memory fraction in force on ``cuda:index`` (1.0: no cap)."""
    try:
        return float(torch.cuda.get_per_process_memory_fraction(index))
    except Exception:  # older torch (or not readable on this build): what memory_cap set
        return _FRACTIONS.get(index, 1.0)
