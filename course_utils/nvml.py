"""NVML: what the NVIDIA driver knows about the GPUs, read without touching CUDA.

The only module that imports ``pynvml``, from the official binding ``nvidia-ml-py`` (the
``pynvml`` package on PyPI is a deprecated wrapper around it). NVML talks to the driver,
not to the CUDA runtime, so nothing here creates a CUDA context: a later ``fork``
(DataLoader workers, ``ddp_notebook``) still works. Every call goes through
:func:`nvml_call`, which gives a default value instead of raising (no library, no driver,
a query the GPU or MIG does not support, a driver error). Used by notebooks 01 and 02.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from course_utils.units import MIB

T = TypeVar("T")

try:  # The official binding: package nvidia-ml-py, module pynvml.
    import pynvml as _pynvml
except ImportError:  # pragma: no cover - depends on the installation
    _pynvml = None


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML sees it. Memory in MiB, as nvidia-smi prints it."""

    index: int  # NVML index (PCI bus order), the same as nvidia-smi's
    name: str | None
    uuid: str | None
    bus_id: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    memory_free_mib: int | None
    compute_capability: tuple[int, int] | None
    mig_uuids: tuple[str, ...] = ()  # UUIDs of its MIG devices ("MIG-..."), when MIG is on


def binding_problem() -> str | None:
    """What is wrong with the NVML Python binding, or ``None`` when it is fine."""
    if _pynvml is None:
        return "The NVML binding is not installed: pip install nvidia-ml-py"
    try:
        importlib.metadata.version("pynvml")
    except importlib.metadata.PackageNotFoundError:
        return None
    return (
        "The deprecated 'pynvml' package is installed; the official binding is "
        "nvidia-ml-py: pip uninstall -y pynvml && pip install nvidia-ml-py"
    )


def nvml_call(function_name: str, *args: Any, default: T = None) -> Any | T:  # type: ignore[assignment]
    """Call ``pynvml.<function_name>(*args)``; return ``default`` on any NVML problem.

    >>> nvml_call("nvmlFunctionThatDoesNotExist", default="n/a")
    'n/a'
    """
    function: Callable[..., Any] | None = getattr(_pynvml, function_name, None)
    if function is None:
        return default
    try:
        return function(*args)
    except Exception:  # NVMLError and its many subclasses, and ctypes errors
        return default


def _start() -> str | None:
    """Initialize NVML; return why it is not available, or ``None``."""
    if _pynvml is None:
        return "the NVML binding (nvidia-ml-py) is not installed"
    try:
        _pynvml.nvmlInit()
    except Exception as error:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return f"NVML is not available ({str(error).strip() or type(error).__name__})"
    return None


@contextmanager
def nvml_session() -> Iterator[str | None]:
    """NVML initialized for the body of a ``with`` block; yields ``None``, or why NVML
    is not available (then nothing needs shutting down)."""
    problem = _start()
    try:
        yield problem
    finally:
        if problem is None:
            nvml_call("nvmlShutdown")


@contextmanager
def gpu_handle(index: int) -> Iterator[Any]:
    """An NVML session and the handle of GPU ``index`` for the body of a ``with`` block;
    yields ``None`` when NVML or that GPU is not available."""
    with nvml_session() as problem:
        yield None if problem else nvml_call("nvmlDeviceGetHandleByIndex", index)


def nvml_status() -> str:
    """``"ok"`` when NVML answers, otherwise the reason it does not (one line)."""
    with nvml_session() as problem:
        return problem or "ok"


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return None if value is None else str(value)


def driver_version() -> str | None:
    """The NVIDIA driver version, like ``nvidia-smi --query-gpu=driver_version``."""
    with nvml_session() as problem:
        return None if problem else _text(nvml_call("nvmlSystemGetDriverVersion"))


def cuda_driver_version() -> str | None:
    """The newest CUDA version the driver supports ("CUDA Version" in nvidia-smi)."""
    with nvml_session() as problem:
        if problem:
            return None
        version = nvml_call("nvmlSystemGetCudaDriverVersion_v2") or nvml_call(
            "nvmlSystemGetCudaDriverVersion"
        )
    if not isinstance(version, int) or version <= 0:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


# ----------------------------------------------------------------------------- readers
# Each takes an NVML device handle; a value NVML cannot give is None.


def _identity(handle: Any) -> tuple[str | None, str | None, str | None]:
    """``(name, uuid, bus_id)``: ``--query-gpu=name,uuid,pci.bus_id``."""
    bus_id = getattr(nvml_call("nvmlDeviceGetPciInfo", handle), "busId", None)
    name, uuid = (_text(nvml_call(f, handle)) for f in ("nvmlDeviceGetName", "nvmlDeviceGetUUID"))
    return name, uuid, _text(bus_id)


def _memory_mib(handle: Any) -> tuple[int | None, int | None, int | None]:
    """``(total, used, free)`` in MiB: ``--query-gpu=memory.total,memory.used,memory.free``."""
    memory = nvml_call("nvmlDeviceGetMemoryInfo", handle)
    values = (getattr(memory, field, None) for field in ("total", "used", "free"))
    total, used, free = (None if value is None else int(value) // MIB for value in values)
    return total, used, free


def _mig_enabled(handle: Any) -> bool | None:
    """``--query-gpu=mig.mode.current``; ``None`` on GPUs without MIG (before the A100)."""
    modes = nvml_call("nvmlDeviceGetMigMode", handle)
    return bool(modes[0]) if modes else None


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def _gpu_info(index: int) -> GpuInfo | None:
    handle = nvml_call("nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return None
    capability = nvml_call("nvmlDeviceGetCudaComputeCapability", handle)
    mig_uuids: list[str] = []
    if _mig_enabled(handle):
        for slot in range(int(nvml_call("nvmlDeviceGetMaxMigDeviceCount", handle) or 0)):
            mig = nvml_call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            uuid = None if mig is None else _text(nvml_call("nvmlDeviceGetUUID", mig))
            mig_uuids += [uuid] if uuid else []
    return GpuInfo(
        index,
        *_identity(handle),
        *_memory_mib(handle),
        compute_capability=tuple(capability) if capability else None,
        mig_uuids=tuple(mig_uuids),
    )


def list_gpus() -> list[GpuInfo]:
    """Every GPU the driver sees, in NVML (= nvidia-smi) order; ``[]`` without NVML.

    Fields match ``nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,
    memory.used,memory.free,compute_cap``.
    """
    with nvml_session() as problem:
        if problem:
            return []
        gpus = [_gpu_info(i) for i in range(int(nvml_call("nvmlDeviceGetCount") or 0))]
        return [gpu for gpu in gpus if gpu is not None]


def _matches(entry: str, gpu: GpuInfo) -> bool:
    """Whether a ``CUDA_VISIBLE_DEVICES`` entry that is not an index names ``gpu``."""
    if entry.startswith("MIG-"):
        # A MIG device (what Slurm and Kubernetes set): "MIG-<uuid>" names a slice of the
        # GPU; the old form "MIG-GPU-<uuid>/<gi>/<ci>" names its parent GPU.
        parent = entry[len("MIG-") :].split("/")[0]
        if parent.startswith("GPU-"):
            return bool(gpu.uuid and gpu.uuid.startswith(parent))
        return any(uuid.startswith(entry) for uuid in gpu.mig_uuids)
    return bool(gpu.uuid and gpu.uuid.startswith(entry))


def parse_visible_devices(value: str | None, gpus: list[GpuInfo]) -> list[GpuInfo]:
    """The GPUs CUDA will use given ``CUDA_VISIBLE_DEVICES`` (``value``; ``None`` when
    unset: every GPU); position ``k`` in the result is ``cuda:k``.

    Entries are indices (``"1,0"``), UUID prefixes (``"GPU-3f2a"``) or MIG devices
    (``"MIG-<uuid>"``: the GPU that holds the slice). Like CUDA, the list stops at the
    first entry that names no GPU; ``"-1"`` or ``""`` hides every GPU. The order is PCI
    order, as NVML's, once :func:`align_cuda_device_order` has run.

    >>> parse_visible_devices("1", [GpuInfo(0, "a", "GPU-0", None, 1, 0, 1, None),
    ...                             GpuInfo(1, "b", "GPU-1", None, 1, 0, 1, None)])[0].name
    'b'
    """
    if value is None:
        return list(gpus)
    chosen: list[GpuInfo] = []
    for raw in value.split(","):
        entry = raw.strip()
        match: GpuInfo | None = None
        if entry.lstrip("-").isdigit():
            number = int(entry)
            match = next((gpu for gpu in gpus if gpu.index == number), None)
        elif entry:
            match = next((gpu for gpu in gpus if _matches(entry, gpu)), None)
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


def visible_gpus() -> list[GpuInfo]:
    """The GPUs CUDA can use (NVML's list filtered by ``CUDA_VISIBLE_DEVICES``)."""
    return parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), list_gpus())


def align_cuda_device_order() -> bool:
    """Make CUDA number GPUs in PCI order, as NVML and nvidia-smi do; return whether
    the order is now PCI order. ``import course_utils`` calls it.

    CUDA's default order is fastest-first: with different GPUs, ``cuda:0`` may be NVML's
    GPU 1. Sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless it is set already or CUDA has
    started in this process (too late: CUDA reads it once).
    """
    order = os.environ.get("CUDA_DEVICE_ORDER")
    if order is not None:
        return order == "PCI_BUS_ID"
    if _running_cuda() is not None:
        return False
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return True


def _running_cuda() -> Any:
    """``torch.cuda`` once CUDA has started in this process, else ``None`` (read from
    ``sys.modules``: this module never imports torch)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    return cuda if cuda is not None and getattr(cuda, "is_initialized", bool)() else None


def _bare_uuid(uuid: str) -> str:
    for prefix in ("MIG-", "GPU-"):
        if uuid.startswith(prefix):
            uuid = uuid[len(prefix) :]
    return uuid.lower()


def _cuda_uuid(cuda_index: int) -> str | None:
    """The UUID CUDA reports for ``cuda:k``, only when CUDA is already initialized."""
    cuda = _running_cuda()
    if cuda is None:
        return None
    try:
        uuid = getattr(cuda.get_device_properties(cuda_index), "uuid", None)
    except Exception:  # no such device, or an old torch
        return None
    return None if uuid is None else str(uuid)


def gpu_for_cuda_index(cuda_index: int, gpus: list[GpuInfo] | None = None) -> GpuInfo | None:
    """The NVML view of ``cuda:<cuda_index>`` (``None`` when NVML does not know it): the
    one place the course maps CUDA's numbering to NVML's. Once CUDA runs, the device's
    UUID decides (in any order, MIG included); before, ``cuda:k`` is the k-th GPU that
    ``CUDA_VISIBLE_DEVICES`` leaves, in PCI order. ``gpus`` defaults to :func:`list_gpus`.

    >>> gpus = [GpuInfo(0, "a", "GPU-0", None, 1, 0, 1, None),
    ...         GpuInfo(1, "b", "GPU-1", None, 1, 0, 1, None)]
    >>> import os; os.environ["CUDA_VISIBLE_DEVICES"] = "1,0"
    >>> gpu_for_cuda_index(0, gpus).index
    1
    >>> del os.environ["CUDA_VISIBLE_DEVICES"]
    """
    every = list_gpus() if gpus is None else gpus
    uuid = _cuda_uuid(cuda_index)
    if uuid:
        bare = _bare_uuid(uuid)
        for gpu in every:
            if any(_bare_uuid(u) == bare for u in (gpu.uuid or "", *gpu.mig_uuids) if u):
                return gpu
    visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), every)
    return visible[cuda_index] if 0 <= cuda_index < len(visible) else None


def nvml_index(cuda_index: int) -> int | None:
    """NVML's (and nvidia-smi's) index of ``cuda:<cuda_index>``; ``None`` when unknown.

    >>> nvml_index(10_000) is None
    True
    """
    gpu = gpu_for_cuda_index(cuda_index)
    return None if gpu is None else gpu.index


@dataclass(frozen=True)
class GpuProcess:
    """A process with a context on a GPU (``nvidia-smi --query-compute-apps``)."""

    pid: int
    name: str | None  # process_name; None when NVML cannot see it (another PID namespace)
    used_memory_mib: int | None  # used_gpu_memory; None on Windows/WDDM and with MIG
    kind: str  # "C" compute, "G" graphics, "C+G" both


def _processes(handle: Any) -> tuple[GpuProcess, ...]:
    """Processes using the GPU and the memory each holds:
    ``--query-compute-apps=pid,process_name,used_gpu_memory`` (plus graphics). A process
    in another container or PID namespace is missing, though ``memory.used`` counts it."""
    found: dict[int, GpuProcess] = {}
    for function, kind in (
        ("nvmlDeviceGetComputeRunningProcesses", "C"),
        ("nvmlDeviceGetGraphicsRunningProcesses", "G"),
    ):
        for info in nvml_call(function, handle) or []:
            pid = int(getattr(info, "pid", -1))
            if pid in found:  # both compute and graphics: C+G, as nvidia-smi prints it
                found[pid] = GpuProcess(pid, found[pid].name, found[pid].used_memory_mib, "C+G")
            elif pid >= 0:
                used = getattr(info, "usedGpuMemory", None)
                mib = None if used is None or used >= 2**63 else int(used) // MIB  # 2**64-1: N/A
                name = _text(nvml_call("nvmlSystemGetProcessName", pid))
                found[pid] = GpuProcess(pid, name, mib, kind)
    return tuple(found.values())


@dataclass(frozen=True)
class GpuSnapshot:
    """One reading of a GPU's state; ``None`` where the GPU or driver cannot say.

    Each field names its ``nvidia-smi --query-gpu`` counterpart.
    """

    index: int  # index
    utilization_gpu_pct: int | None  # utilization.gpu: % of time a kernel was running
    utilization_memory_pct: int | None  # utilization.memory: % of time memory was read/written
    memory_used_mib: int | None  # memory.used
    memory_total_mib: int | None  # memory.total
    power_draw_w: float | None  # power.draw
    power_limit_w: float | None  # enforced.power.limit (power.limit unless lowered)
    temperature_c: int | None  # temperature.gpu
    sm_clock_mhz: int | None  # clocks.sm
    pstate: str | None  # pstate, "P0" (fastest) to "P12"
    name: str | None = None  # name
    uuid: str | None = None  # uuid
    bus_id: str | None = None  # pci.bus_id
    memory_free_mib: int | None = None  # memory.free
    mig_enabled: bool | None = None  # mig.mode.current (utilization is None when True)
    processes: tuple[GpuProcess, ...] = ()  # --query-compute-apps (and graphics apps)


def snapshot(index: int, processes: bool = True) -> GpuSnapshot | None:
    """Read the state of GPU ``index`` (NVML numbering) and, with ``processes=True``, its
    processes; ``None`` when NVML or that GPU is not available."""
    with gpu_handle(index) as handle:
        if handle is None:
            return None
        total, used, free = _memory_mib(handle)
        name, uuid, bus_id = _identity(handle)
        rates = nvml_call("nvmlDeviceGetUtilizationRates", handle)  # not supported under MIG
        state = nvml_call("nvmlDeviceGetPerformanceState", handle)
        return GpuSnapshot(
            index=index,
            utilization_gpu_pct=getattr(rates, "gpu", None),
            utilization_memory_pct=getattr(rates, "memory", None),
            memory_used_mib=used,
            memory_total_mib=total,
            power_draw_w=_watts(nvml_call("nvmlDeviceGetPowerUsage", handle)),
            power_limit_w=_watts(nvml_call("nvmlDeviceGetEnforcedPowerLimit", handle)),
            temperature_c=nvml_call("nvmlDeviceGetTemperature", handle, 0),  # 0: GPU die
            sm_clock_mhz=nvml_call("nvmlDeviceGetClockInfo", handle, 1),  # 1: NVML_CLOCK_SM
            pstate=None if state is None or int(state) == 32 else f"P{int(state)}",  # 32: unknown
            name=name,
            uuid=uuid,
            bus_id=bus_id,
            memory_free_mib=free,
            mig_enabled=_mig_enabled(handle),
            processes=_processes(handle) if processes else (),
        )


def process_memory_used_mib(index: int, pid: int | None = None) -> int | None:
    """GPU memory in MiB that process ``pid`` (default: this one) uses on GPU ``index``
    (NVML numbering); ``None`` when NVML, the GPU or the process cannot be seen.

    nvidia-smi's "GPU Memory Usage" column (``--query-compute-apps=pid,used_memory``):
    the CUDA context plus all the process's allocators reserved. In a container with its
    own PID namespace NVML may report host PIDs, and the process is not found.

    >>> process_memory_used_mib(10_000) is None  # no such GPU
    True
    """
    wanted = os.getpid() if pid is None else pid
    with gpu_handle(index) as handle:
        found = (
            [p.used_memory_mib for p in _processes(handle) if p.pid == wanted]
            if handle is not None
            else []
        )
        return found[0] if found else None
