"""NVML: what the NVIDIA driver knows about the GPUs, read without touching CUDA.

The only module that imports ``pynvml`` (from the official binding ``nvidia-ml-py``).
NVML talks to the driver, not the CUDA runtime, so nothing here creates a CUDA context
and a later ``fork`` (DataLoader workers, ``ddp_notebook``) still works. Every call goes
through :func:`nvml_call`, which gives a default instead of raising. Also the home of
:class:`Reading`, one reading of a device, which :mod:`course_utils.monitor` samples.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
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
    # Each MIG device as CUDA sees it: its own name, UUID and memory (index: the parent's)
    mig_devices: tuple[GpuInfo, ...] = ()
    mig_enabled: bool = False  # MIG mode on (with no MIG device CUDA sees no GPU here)


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
    """Call ``pynvml.<function_name>(*args)``; return ``default`` on any NVML problem."""
    function: Callable[..., Any] | None = getattr(_pynvml, function_name, None)
    if function is None:
        return default
    try:
        return function(*args)
    except Exception:  # NVMLError and its many subclasses, and ctypes errors
        return default


@contextmanager
def nvml_session() -> Iterator[str | None]:
    """NVML initialized for a ``with`` block; yields ``None``, or why NVML is not available."""
    problem = None if _pynvml else "the NVML binding (nvidia-ml-py) is not installed"
    try:
        if _pynvml:
            _pynvml.nvmlInit()
    except Exception as error:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        problem = f"NVML is not available ({str(error).strip() or type(error).__name__})"
    try:
        yield problem
    finally:
        if problem is None:
            nvml_call("nvmlShutdown")


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


# The readers below take an NVML device handle; a value NVML cannot give is None.
def _identity(handle: Any) -> tuple[str | None, str | None, str | None]:
    """``--query-gpu=name,uuid,pci.bus_id``."""
    bus_id = getattr(nvml_call("nvmlDeviceGetPciInfo", handle), "busId", None)
    name, uuid = (_text(nvml_call(f, handle)) for f in ("nvmlDeviceGetName", "nvmlDeviceGetUUID"))
    return name, uuid, _text(bus_id)


def _memory_mib(handle: Any) -> tuple[int | None, int | None, int | None]:
    """``--query-gpu=memory.total,memory.used,memory.free`` in MiB."""
    memory = nvml_call("nvmlDeviceGetMemoryInfo", handle)
    values = (getattr(memory, field, None) for field in ("total", "used", "free"))
    total, used, free = (None if value is None else int(value) // MIB for value in values)
    return total, used, free


def _mig_enabled(handle: Any) -> bool | None:
    """``--query-gpu=mig.mode.current``; ``None`` on GPUs without MIG (before the A100)."""
    modes = nvml_call("nvmlDeviceGetMigMode", handle)
    return bool(modes[0]) if modes else None


def _gpu_info(index: int) -> GpuInfo | None:
    handle = nvml_call("nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return None
    found = nvml_call("nvmlDeviceGetCudaComputeCapability", handle)
    capability = (int(found[0]), int(found[1])) if found else None
    mig_devices: list[GpuInfo] = []
    if _mig_enabled(handle):
        for slot in range(int(nvml_call("nvmlDeviceGetMaxMigDeviceCount", handle) or 0)):
            mig = nvml_call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            uuid = None if mig is None else _text(nvml_call("nvmlDeviceGetUUID", mig))
            if uuid:  # a slice: its own name ("... MIG 1g.10gb") and memory, not the GPU's
                name = _text(nvml_call("nvmlDeviceGetName", mig))
                memory = _memory_mib(mig)
                mig_devices.append(GpuInfo(index, name, uuid, None, *memory, capability, (uuid,)))
    return GpuInfo(
        index,
        *_identity(handle),
        *_memory_mib(handle),
        compute_capability=capability,
        mig_uuids=tuple(mig.uuid for mig in mig_devices if mig.uuid),
        mig_devices=tuple(mig_devices),
        mig_enabled=bool(_mig_enabled(handle)),
    )


def list_gpus() -> list[GpuInfo]:
    """Every GPU the driver sees, in NVML (= nvidia-smi) order; ``[]`` without NVML."""
    with nvml_session() as problem:
        if problem:
            return []
        gpus = [_gpu_info(i) for i in range(int(nvml_call("nvmlDeviceGetCount") or 0))]
        return [gpu for gpu in gpus if gpu is not None]


def _matches(entry: str, gpu: GpuInfo) -> bool:
    """Whether a ``CUDA_VISIBLE_DEVICES`` entry names ``gpu``."""
    if entry.lstrip("-").isdigit():
        return gpu.index == int(entry)
    if entry.startswith("MIG-"):
        # A MIG device (what Slurm and Kubernetes set): "MIG-<uuid>" names a slice of the
        # GPU; the old form "MIG-GPU-<uuid>/<gi>/<ci>" names its parent GPU.
        parent = entry[len("MIG-") :].split("/")[0]
        if parent.startswith("GPU-"):
            return bool(gpu.uuid and gpu.uuid.startswith(parent))
        return any(uuid.startswith(entry) for uuid in gpu.mig_uuids)
    return bool(gpu.uuid and gpu.uuid.startswith(entry))


def _as_cuda_sees_it(gpu: GpuInfo, entry: str | None = None) -> GpuInfo:
    """A GPU with MIG on is seen by CUDA as one of its MIG devices: the one ``entry``
    (``"MIG-<uuid>"``) names, else the first; the GPU itself without MIG devices."""
    named = entry if entry and entry.startswith("MIG-") and not entry.startswith("MIG-GPU-") else ""
    for mig in gpu.mig_devices:
        if (mig.uuid or "").startswith(named):
            return mig
    return gpu


def parse_visible_devices(value: str | None, gpus: list[GpuInfo]) -> list[GpuInfo]:
    """The GPUs CUDA will use given ``CUDA_VISIBLE_DEVICES`` (``value``; ``None`` when
    unset: every GPU); position ``k`` in the result is ``cuda:k``.

    Entries are indices (``"1,0"``), UUID prefixes (``"GPU-3f2a"``) or MIG devices
    (``"MIG-<uuid>"``: the slice, as CUDA sees it). Like CUDA, the list stops at the
    first entry that names no GPU (``"-1"`` or ``""`` hide every GPU). CUDA enumerates a
    single MIG device per process (NVIDIA's MIG user guide, "CUDA Device Enumeration",
    docs.nvidia.com/datacenter/tesla/mig-user-guide/mig-device-names.html): after the
    first, MIG devices are left out.
    """
    chosen: list[GpuInfo] = []
    entries = [None] * len(gpus) if value is None else [raw.strip() for raw in value.split(",")]
    for position, entry in enumerate(entries):
        if entry is None:
            match: GpuInfo | None = gpus[position]
        else:
            match = next((gpu for gpu in gpus if entry and _matches(entry, gpu)), None)
        if match is None or any(gpu.index == match.index for gpu in chosen):
            if value is None:
                continue
            break
        chosen.append(_as_cuda_sees_it(match, entry))
    migs = [gpu for gpu in chosen if gpu.mig_uuids]
    # A GPU in MIG mode with no MIG device is no GPU to CUDA (review finding G17)
    return [gpu for gpu in chosen if gpu not in migs[1:] and not _mig_without_device(gpu)]


def _mig_without_device(gpu: GpuInfo) -> bool:
    return gpu.mig_enabled and not gpu.mig_devices and not gpu.mig_uuids


def mig_without_instance_reason() -> str | None:
    """One line when a GPU is in MIG mode with no MIG device (CUDA sees none of it), else
    ``None``: what ``doctor --require-gpu`` and ``gpu-record`` say instead of a
    traceback from the first CUDA call."""
    empty = [gpu for gpu in list_gpus() if _mig_without_device(gpu)]
    if not empty:
        return None
    named = ", ".join(f"GPU {gpu.index} ({gpu.name or 'unknown'})" for gpu in empty)
    return (
        f"no GPU: MIG mode is on for {named} but it has no MIG device, so CUDA sees none; "
        "create one (nvidia-smi mig -cgi ... -C) or turn MIG mode off (nvidia-smi -mig 0)"
    )


def visible_gpus() -> list[GpuInfo]:
    """The GPUs CUDA can use (NVML's list filtered by ``CUDA_VISIBLE_DEVICES``)."""
    return parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), list_gpus())


def align_cuda_device_order() -> bool:
    """Make CUDA number GPUs in PCI order, as NVML does (CUDA's default is fastest-first);
    return whether the order is PCI order. ``import course_utils`` calls it; too late once
    CUDA has started (it reads ``CUDA_DEVICE_ORDER`` once), and a set value is kept."""
    order = os.environ.get("CUDA_DEVICE_ORDER")
    if order is not None:
        return order == "PCI_BUS_ID"
    if _running_cuda() is not None:
        return False
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return True


def _running_cuda() -> Any:
    """``torch.cuda`` once CUDA runs in this process, else ``None`` (torch is not imported)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    return cuda if cuda is not None and getattr(cuda, "is_initialized", bool)() else None


def _bare_uuid(uuid: str) -> str:
    return uuid.removeprefix("MIG-").removeprefix("GPU-").lower()


def _cuda_uuid(cuda_index: int) -> str | None:
    """The UUID CUDA reports for ``cuda:k``, only when CUDA is already initialized."""
    try:
        uuid = getattr(_running_cuda().get_device_properties(cuda_index), "uuid", None)
    except Exception:  # CUDA not running, no such device, or an old torch
        return None
    return None if uuid is None else str(uuid)


def gpu_for_cuda_index(cuda_index: int, gpus: list[GpuInfo] | None = None) -> GpuInfo | None:
    """The NVML view of ``cuda:<cuda_index>`` (``None`` when NVML does not know it): the
    one place the course maps CUDA's numbering to NVML's. Once CUDA runs, the device's
    UUID decides (MIG included); before, ``cuda:k`` is the k-th GPU ``CUDA_VISIBLE_DEVICES``
    leaves. ``gpus`` defaults to :func:`list_gpus`.
    """
    every = list_gpus() if gpus is None else gpus
    uuid = _cuda_uuid(cuda_index)
    if uuid:
        bare = _bare_uuid(uuid)
        for gpu in every:
            for seen in (*gpu.mig_devices, gpu):  # a MIG device: the slice, not its GPU
                if any(_bare_uuid(u) == bare for u in (seen.uuid or "", *seen.mig_uuids) if u):
                    return seen
    visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), every)
    return visible[cuda_index] if 0 <= cuda_index < len(visible) else None


def nvml_index(cuda_index: int) -> int | None:
    """NVML's (and nvidia-smi's) index of ``cuda:<cuda_index>``; ``None`` when unknown."""
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
class Reading:
    """One reading of a device: a GPU's (NVML or nvidia-smi) or, without one, the CPU's.

    GPU fields name their ``nvidia-smi --query-gpu`` counterparts and are ``None`` where
    the GPU or driver cannot say (utilization under MIG, power on some boards); CPU
    readings fill the ``cpu_*``/``process_*`` fields instead. ``reading["field"]`` and
    ``reading.get("field")`` raise ``KeyError`` for a name that is not a field.
    """

    time_s: float
    source: str  # "nvml", "nvidia-smi" or "cpu"
    gpu_index: int | None = None  # index (NVML numbering)
    utilization_gpu_pct: float | None = None  # utilization.gpu: % of time a kernel ran
    utilization_memory_pct: float | None = None  # utilization.memory
    memory_used_mib: float | None = None  # memory.used
    memory_total_mib: float | None = None  # memory.total
    memory_free_mib: float | None = None  # memory.free
    power_draw_w: float | None = None  # power.draw
    power_limit_w: float | None = None  # enforced.power.limit (power.limit unless lowered)
    temperature_c: float | None = None  # temperature.gpu
    sm_clock_mhz: float | None = None  # clocks.sm
    pstate: str | None = None  # pstate, "P0" (fastest) to "P12"
    name: str | None = None  # name
    uuid: str | None = None  # uuid
    bus_id: str | None = None  # pci.bus_id
    mig_enabled: bool | None = None  # mig.mode.current (utilization is None when True)
    processes: tuple[GpuProcess, ...] = ()  # --query-compute-apps (NVML, when asked)
    cpu_util_pct: float | None = None  # every process on the machine, all cores
    process_cpu_pct: float | None = None  # this process, as a share of all cores
    process_rss_mib: float | None = None  # this process's resident memory

    def __getitem__(self, key: str) -> Any:
        names = [field.name for field in fields(self)]
        if key not in names:
            raise KeyError(f"{key!r}: a Reading has {', '.join(names)}")
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value, or ``default`` when it is ``None`` (not available)."""
        value = self[key]
        return default if value is None else value

    def items(self) -> list[tuple[str, Any]]:
        """``(field, value)`` for the fields that have a value, in order (for printing)."""
        pairs = ((field.name, getattr(self, field.name)) for field in fields(self))
        return [(name, value) for name, value in pairs if value not in (None, ())]

    @property
    def on_gpu(self) -> bool:
        return self.source != "cpu"

    def numeric(self) -> dict[str, float]:
        """The numeric fields that have a value (for loggers), without time and index.

        >>> Reading(1.0, "cpu", cpu_util_pct=50, process_rss_mib=80.5).numeric()
        {'cpu_util_pct': 50.0, 'process_rss_mib': 80.5}
        """
        skip = ("time_s", "gpu_index")
        pairs = ((k, v) for k, v in self.items() if k not in skip and not isinstance(v, bool))
        return {k: float(v) for k, v in pairs if isinstance(v, int | float)}


def snapshot(index: int, processes: bool = True) -> Reading | None:
    """Read the state of GPU ``index`` (NVML numbering) and, with ``processes=True``, its
    processes; ``None`` when NVML or that GPU is not available."""
    with nvml_session() as problem:
        handle = None if problem else nvml_call("nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            return None
        total, used, free = _memory_mib(handle)
        name, uuid, bus_id = _identity(handle)
        rates = nvml_call("nvmlDeviceGetUtilizationRates", handle)  # not supported under MIG
        state = nvml_call("nvmlDeviceGetPerformanceState", handle)
        power = ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit")
        milliwatts = [nvml_call(function, handle) for function in power]
        return Reading(
            time.time(),
            "nvml",
            index,
            utilization_gpu_pct=getattr(rates, "gpu", None),
            utilization_memory_pct=getattr(rates, "memory", None),
            memory_used_mib=used,
            memory_total_mib=total,
            memory_free_mib=free,
            power_draw_w=milliwatts[0] / 1000 if milliwatts[0] is not None else None,
            power_limit_w=milliwatts[1] / 1000 if milliwatts[1] is not None else None,
            temperature_c=nvml_call("nvmlDeviceGetTemperature", handle, 0),  # 0: GPU die
            sm_clock_mhz=nvml_call("nvmlDeviceGetClockInfo", handle, 1),  # 1: NVML_CLOCK_SM
            pstate=None if state is None or int(state) == 32 else f"P{int(state)}",  # 32: unknown
            name=name,
            uuid=uuid,
            bus_id=bus_id,
            mig_enabled=_mig_enabled(handle),
            processes=_processes(handle) if processes else (),
        )


def process_memory_used_mib(index: int, pid: int | None = None) -> int | None:
    """GPU memory in MiB that process ``pid`` (default: this one) holds on GPU ``index``
    (NVML numbering): the context plus what its allocators reserved, nvidia-smi's "GPU
    Memory Usage"; ``None`` when NVML, the GPU or the process cannot be seen (in a
    container with its own PID namespace NVML may report host PIDs).

    >>> process_memory_used_mib(10_000) is None  # no such GPU
    True
    """
    wanted = os.getpid() if pid is None else pid
    shot = snapshot(index)
    found = [p.used_memory_mib for p in shot.processes if p.pid == wanted] if shot else []
    return found[0] if found else None
