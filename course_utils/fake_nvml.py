"""A stand-in for the ``pynvml`` module with fixed readings, for the exercise checks of
notebook 02 on machines without a GPU.

:class:`FakeNvml` implements the calls a sampler makes with pynvml's semantics (memory in
bytes, an error before ``nvmlInit``, ``NVMLError_NotSupported`` for a MIG instance's
utilization) and counts ``nvmlInit``/``nvmlShutdown`` so a check can see NVML shut down.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import SimpleNamespace

from course_utils.smi import parse, sample_output
from course_utils.units import MIB


class NVMLError(Exception):
    """Base class, as ``pynvml.NVMLError``."""


# pynvml's own class and function names, so that code written for pynvml runs unchanged
class NVMLError_Uninitialized(NVMLError):
    """A call before ``nvmlInit`` (or after the matching ``nvmlShutdown``)."""


class NVMLError_InvalidArgument(NVMLError):
    """No GPU at that index, or something that is not a handle of this library."""


class NVMLError_NotSupported(NVMLError):
    """The GPU cannot answer this query (utilization under MIG)."""


@dataclass(frozen=True)
class FakeGpu:
    """What one fake GPU reports; ``utilization_gpu_pct=None``: not supported (MIG)."""

    utilization_gpu_pct: int | None
    memory_used_mib: int
    memory_total_mib: int
    utilization_memory_pct: int | None = None
    used_bytes_over_mib: int | None = None  # real byte counts are rarely whole MiB


@dataclass(frozen=True)
class _Handle:
    owner: int  # id() of the FakeNvml that made it
    index: int


class FakeNvml:
    """A fake ``pynvml`` module over a list of :class:`FakeGpu`."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = list(gpus)
        self.init_calls = 0
        self.shutdown_calls = 0

    @property
    def initialized(self) -> bool:
        """Whether more ``nvmlInit`` than ``nvmlShutdown`` calls have been made."""
        return self.init_calls > self.shutdown_calls

    def _require_init(self) -> None:
        if not self.initialized:
            raise NVMLError_Uninitialized("Uninitialized: call nvmlInit() first")

    def _gpu(self, handle: object) -> FakeGpu:
        self._require_init()
        if not isinstance(handle, _Handle) or handle.owner != id(self):
            raise NVMLError_InvalidArgument(
                "Invalid Argument: pass a handle from nvmlDeviceGetHandleByIndex"
            )
        return self.gpus[handle.index]

    def nvmlInit(self) -> None:
        self.init_calls += 1

    def nvmlShutdown(self) -> None:
        self._require_init()
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._require_init()
        if not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument(f"Invalid Argument: no GPU at index {index!r}")
        return _Handle(id(self), index)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> SimpleNamespace:
        gpu = self._gpu(handle)
        if gpu.utilization_gpu_pct is None:
            raise NVMLError_NotSupported("Not Supported")
        return SimpleNamespace(gpu=gpu.utilization_gpu_pct, memory=gpu.utilization_memory_pct)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimpleNamespace:
        gpu = self._gpu(handle)
        total = gpu.memory_total_mib * MIB + 2 * (gpu.used_bytes_over_mib or 0)
        used = gpu.memory_used_mib * MIB + (gpu.used_bytes_over_mib or 0)
        return SimpleNamespace(total=total, used=used, free=total - used)


def gpu_from_sample(name: str, gpu: int = 0) -> FakeGpu:
    """A :class:`FakeGpu` reporting what GPU ``gpu`` of the shipped nvidia-smi output
    ``name`` shows (:func:`course_utils.smi.list_samples`).
    """
    entry = parse(sample_output(name)[1])["gpus"][gpu]  # its keys are FakeGpu's fields
    return FakeGpu(**{field.name: entry.get(field.name) for field in fields(FakeGpu)})
