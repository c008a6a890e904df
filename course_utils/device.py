"""Choosing where to run (notebook 01): device, GPU, numeric precision, moving batches.

Nothing here initializes CUDA or touches it in a way that spoils a later ``fork`` until
you ask for a CUDA tensor: GPUs are found through NVML (or, without NVML, in a
subprocess), and what this torch was built for is read in a subprocess, so a notebook can
still ``fork`` afterwards (DataLoader workers, Lightning's ``ddp_notebook``).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from course_utils import nvml
from course_utils.nvml import (
    cuda_driver_version,
    gpu_for_cuda_index,
    nvml_session,
    nvml_status,
    visible_gpus,
)

DEVICE_ENV_VAR = "COURSE_DEVICE"


def _driver_present() -> bool:
    """A cheap hint that an NVIDIA driver is installed (used only when NVML is absent)."""
    if sys.platform.startswith("linux"):
        return os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidia0")
    return sys.platform == "win32"


def _count_gpus_in_subprocess() -> int:
    code = "import torch; print(torch.cuda.device_count())"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
        return int(done.stdout.split()[-1]) if done.returncode == 0 else 0
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in (text or "").split(".")[:2])
    except ValueError:
        return None


@functools.cache
def _arch_flags() -> list[str]:
    """The GPU architectures this torch was built for (``sm_75``, ``compute_90``...), read
    once, in a child process: ``torch._C._cuda_getArchFlags()`` marks this process so that
    every process forked from it later fails at its first CUDA call ("Cannot re-initialize
    CUDA in forked subprocess"), and ``torch.cuda.get_arch_list()`` also starts CUDA."""
    code = "import torch; print(getattr(torch._C, '_cuda_getArchFlags', lambda: '')() or '')"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return []
    return done.stdout.decode(errors="replace").split() if done.returncode == 0 else []


def _arch_number(flag: str) -> tuple[int, int] | None:
    """``"sm_86"`` -> ``(8, 6)``, ``"sm_120a"`` -> ``(12, 0)``, ``"compute_90"`` -> ``(9, 0)``."""
    digits = "".join(ch for ch in flag.split("_", 1)[-1] if ch.isdigit())
    if len(digits) < 2:
        return None
    return int(digits[:-1]), int(digits[-1])


def build_runs_on(capability: tuple[int, int], arch_flags: list[str]) -> bool:
    """Whether a torch built for ``arch_flags`` has kernels for a GPU of ``capability``:
    machine code (``sm_XY``) of its major version and an equal or lower minor, or PTX
    (``compute_XY``) of an equal or lower version. No list (unreadable): True.

    >>> build_runs_on((6, 0), ["sm_75", "sm_80", "sm_90", "compute_90"])  # P100, CUDA 13
    False
    >>> build_runs_on((8, 6), ["sm_75", "sm_80", "sm_90"])  # A10: runs sm_80 code
    True
    """
    for flag in arch_flags:
        built = _arch_number(flag)
        if built is not None and flag.startswith("sm_") and built[0] == capability[0]:
            if built[1] <= capability[1]:
                return True
        elif built is not None and flag.startswith("compute_") and built <= capability:
            return True
    return not arch_flags


def gpu_problems() -> list[str]:
    """Why GPUs that the driver shows cannot be used by this torch (``[]``: none), checked
    without initializing CUDA: the driver's CUDA version against the build's, and each
    GPU's compute capability against the build's architectures (no ``sm_60``: no P100).
    """
    if not torch.backends.cuda.is_built():
        return []
    problems = []
    built, driver = _version_tuple(torch.version.cuda), _version_tuple(cuda_driver_version())
    if built and driver and driver[0] < built[0]:
        problems.append(
            f"this torch is built for CUDA {torch.version.cuda}, but the NVIDIA driver "
            f"supports CUDA up to {cuda_driver_version()}: update the driver, or install a "
            f"torch built for CUDA {driver[0]}.x"
        )
    for position, gpu in enumerate(visible_gpus()):
        if not gpu.compute_capability:
            continue
        flags = _arch_flags()  # read once, only when there is a GPU to check
        if not build_runs_on(gpu.compute_capability, flags):
            major, minor = gpu.compute_capability
            problems.append(
                f"cuda:{position} ({gpu.name}, compute capability {major}.{minor}) is not "
                f"supported by this torch {torch.__version__} (built for "
                f"{' '.join(flags)}): use a GPU it supports, or a torch build that "
                f"includes sm_{major}{minor}" + _legacy_build_hint(gpu.compute_capability)
            )
    return problems


def _legacy_build_hint(capability: tuple[int, int]) -> str:
    """For a GPU older than Turing: which PyTorch build still runs on it."""
    if capability >= (7, 5):
        return ""
    if capability >= (7, 0):  # Volta: dropped by the CUDA 13 wheels only
        return (
            "; PyTorch's CUDA 13 wheels need compute capability >= 7.5 (Turing), its CUDA "
            "12.8/12.9 wheels keep 7.0: use the cu128 build (pip install torch torchvision "
            "--index-url https://download.pytorch.org/whl/cu128; whl/cu126 works too)"
        )
    return (
        "; PyTorch >= 2.8 with CUDA 12.8+/13 wheels needs compute capability >= 7.0 "
        "(CUDA 13: >= 7.5): this GPU needs the cu126 build (pip install torch torchvision "
        "--index-url https://download.pytorch.org/whl/cu126)"
    )


# The last count NVML gave, for (CUDA_VISIBLE_DEVICES, the NVML binding): GPUs do not come
# and go while a process runs, and every pick() in a notebook's knobs cell asks again.
_counted: tuple[tuple[Any, ...], int] | None = None


def cuda_gpu_count() -> int:
    """How many GPUs PyTorch can use, found without initializing CUDA (NVML, else a
    subprocess); 0 also when this torch cannot run on them (:func:`gpu_problems`).
    NVML's answer is kept for the process, per value of ``CUDA_VISIBLE_DEVICES``."""
    global _counted
    if not torch.backends.cuda.is_built():
        return 0
    if torch.cuda.is_initialized():
        return torch.cuda.device_count()
    key = (os.environ.get("CUDA_VISIBLE_DEVICES"), nvml._pynvml)
    if _counted is not None and _counted[0][0] == key[0] and _counted[0][1] is key[1]:
        return _counted[1]
    with nvml_session():  # one NVML session: the calls below nest in it
        if nvml_status() == "ok":  # with problems, the first CUDA operation would fail: 0
            count = 0 if gpu_problems() else len(visible_gpus())
            _counted = (key, count)
            return count
    return _count_gpus_in_subprocess() if _driver_present() else 0


def mps_available() -> bool:
    """True on an Apple-silicon Mac whose PyTorch build supports the MPS backend."""
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


@dataclass(frozen=True)
class DeviceChoice:
    """The device chosen by :func:`choose_device` and why."""

    device: torch.device
    reason: str


def _gpu_with_most_free_memory() -> tuple[int, str]:
    gpus = visible_gpus()
    known = [
        (g.memory_free_mib, -i, g) for i, g in enumerate(gpus) if g.memory_free_mib is not None
    ]
    if len(gpus) <= 1 or not known:
        return 0, "the first visible GPU"
    free, position, gpu = max(known, key=lambda item: item[:2])
    return -position, f"the GPU with the most free memory ({gpu.name}, {free} MiB free)"


def choose_device(prefer: str | None = None) -> DeviceChoice:
    """Choose a device: CUDA (the GPU with the most free memory), then Apple MPS, then the
    CPU, and say why. ``prefer`` (or ``COURSE_DEVICE``): ``"cpu"``, ``"cuda"``,
    ``"cuda:1"`` or ``"mps"``; one that does not exist raises ``ValueError``."""
    wanted = (prefer or os.environ.get(DEVICE_ENV_VAR, "")).strip().lower()
    if wanted:
        return _explicit_choice(wanted)
    if cuda_gpu_count() > 0:
        position, why = _gpu_with_most_free_memory()
        return DeviceChoice(torch.device("cuda", position), f"CUDA is available: {why}")
    if mps_available():
        return DeviceChoice(torch.device("mps"), "Apple MPS is available (no CUDA GPU)")
    return DeviceChoice(torch.device("cpu"), no_gpu_reason())


def _explicit_choice(wanted: str) -> DeviceChoice:
    try:
        device = torch.device(wanted)
    except RuntimeError as error:
        raise ValueError(f"unknown device {wanted!r}: use cpu, cuda, cuda:N or mps") from error
    if device.type == "cpu":
        return DeviceChoice(device, "asked for the CPU")
    if device.type == "mps":
        if not mps_available():
            raise ValueError("asked for mps, but this machine has no usable Apple MPS backend")
        return DeviceChoice(device, "asked for Apple MPS")
    if device.type == "cuda":
        count = cuda_gpu_count()
        index = 0 if device.index is None else device.index
        if index >= count:
            why = no_gpu_reason() if count == 0 else f"use cuda:0 to cuda:{count - 1}"
            raise ValueError(f"asked for {wanted}, but PyTorch sees {count} CUDA GPU(s): {why}")
        return DeviceChoice(torch.device("cuda", index), f"asked for {wanted}")
    raise ValueError(f"unsupported device {wanted!r}: use cpu, cuda, cuda:N or mps")


def no_gpu_reason() -> str:
    """Why PyTorch has no GPU to use here, in one line: a CPU-only build, every GPU hidden,
    none visible (no driver answers), the driver too old for this build's CUDA, or a GPU
    whose architecture this build has no kernels for."""
    if not torch.backends.cuda.is_built():
        return f"no GPU: this torch ({torch.__version__}) is a CPU-only build"
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return "no GPU: CUDA_VISIBLE_DEVICES hides every GPU"
    status = nvml_status()
    if status != "ok":
        return "no GPU visible: " + status
    problems = gpu_problems()
    if problems:
        return "no usable GPU: " + problems[0]
    return nvml.mig_without_instance_reason() or (
        "no GPU: the driver answers but CUDA_VISIBLE_DEVICES leaves no GPU visible"
    )


def pick_device(prefer: str | None = None) -> torch.device:
    """The device to use: ``choose_device(prefer).device``."""
    return choose_device(prefer).device


@dataclass(frozen=True)
class PrecisionSupport:
    """Which reduced precisions a GPU of a given compute capability runs fast."""

    fp16_tensor_cores: bool  # Volta (7.0) and newer
    bf16: str  # "native" from Ampere (8.0); "emulated" before (slow, but it runs)
    tf32: bool  # Ampere (8.0) and newer


def precision_support(capability: tuple[int, int]) -> PrecisionSupport:
    """Precision support for a compute capability, e.g. ``(7, 5)`` for a T4."""
    ampere = capability >= (8, 0)
    return PrecisionSupport(capability >= (7, 0), "native" if ampere else "emulated", ampere)


class PrecisionName(str, Enum):
    """The training precisions of the course (``str`` values: ``"fp32"`` == ``FP32``)."""

    FP32 = "fp32"
    FP16 = "fp16"  # autocast to float16, with a torch.amp.GradScaler
    BF16 = "bf16"  # autocast to bfloat16, no scaler needed

    def __str__(self) -> str:  # "fp16" in messages and f-strings, on every Python
        return str(self.value)


AUTO = "auto"  # ask pick_precision to choose for the device
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """A training precision and why it was chosen."""

    name: PrecisionName
    reason: str

    @property
    def dtype(self) -> torch.dtype:  # the autocast dtype (float32: no autocast)
        return _DTYPES[self.name]

    @property
    def autocast(self) -> bool:  # forward passes in torch.autocast(device_type, dtype)
        return self.name != PrecisionName.FP32

    @property
    def grad_scaler(self) -> bool:  # the step needs a torch.amp.GradScaler (fp16 only)
        return self.name == PrecisionName.FP16


# What a child process read about each CUDA device, per CUDA_VISIBLE_DEVICES and index
_device_facts: dict[tuple[str | None, int], tuple[str, tuple[int, int]] | None] = {}


def _device_facts_in_subprocess(position: int) -> tuple[str, tuple[int, int]] | None:
    code = f"import torch; p = torch.cuda.get_device_properties({position}); "
    code += "print(p.major, p.minor, p.name)"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        major, minor, name = done.stdout.strip().splitlines()[-1].split(" ", 2)
        return (name, (int(major), int(minor))) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def cuda_device_facts(position: int) -> tuple[str, tuple[int, int]] | None:
    """``(name, compute capability)`` of ``cuda:<position>`` from CUDA, without starting
    CUDA in this process: once CUDA runs here, from CUDA; before, from a child process
    (kept per ``CUDA_VISIBLE_DEVICES``). ``None`` when there is no such device. For when
    NVML does not know the GPU: a plain ``torch.cuda.is_available()`` here would ask the
    driver for its device count, and a process forked after that (``ddp_notebook``, a
    DataLoader worker using CUDA) cannot use CUDA, while ``torch.cuda.is_initialized()``
    still says ``False``."""
    if torch.cuda.is_initialized():
        if position >= torch.cuda.device_count():
            return None
        return torch.cuda.get_device_name(position), torch.cuda.get_device_capability(position)
    if position >= cuda_gpu_count():  # NVML, else a child process: fork-safe
        return None
    key = (os.environ.get("CUDA_VISIBLE_DEVICES"), position)
    if key not in _device_facts:
        _device_facts[key] = _device_facts_in_subprocess(position)
    return _device_facts[key]


def _cuda_capability(device: torch.device) -> tuple[int, int] | None:
    position = 0 if device.index is None else device.index
    gpu = gpu_for_cuda_index(position)
    if gpu is not None and gpu.compute_capability:
        return gpu.compute_capability
    facts = cuda_device_facts(position)  # NVML does not know it: ask CUDA, fork-safe
    return facts[1] if facts else None


def pick_precision(
    device: torch.device | str,
    requested: str = AUTO,
    *,
    capability: tuple[int, int] | None = None,
) -> Precision:
    """The precision to train in on ``device``: ``requested`` as is, or for ``"auto"``:
    bf16 from compute capability 8.0; fp16 with a GradScaler on 7.0-7.5 (V100, T4: bf16 is
    only emulated there, even if ``torch.cuda.is_bf16_supported()``); fp32 below, and on
    the CPU and MPS (CPU bf16 is fast only with AVX512-BF16 or AMX). ``capability``
    overrides the GPU's own."""
    if requested != AUTO:
        if requested not in {p.value for p in PrecisionName}:
            names = ", ".join([AUTO, *(p.value for p in PrecisionName)])
            raise ValueError(f"precision={requested!r}: use one of {names}")
        return Precision(PrecisionName(requested), f"{requested} requested")
    device = torch.device(device)
    fp32, fp16, bf16 = PrecisionName.FP32, PrecisionName.FP16, PrecisionName.BF16
    if device.type != "cuda":
        return Precision(fp32, f"{device.type}: float32 (mixed precision pays off on GPUs)")
    capability = capability or _cuda_capability(device)
    if capability is None:
        return Precision(fp32, "CUDA capability unknown: float32 to be safe")
    label = f"compute capability {capability[0]}.{capability[1]}"
    if capability >= (8, 0):
        return Precision(bf16, f"{label}: native bf16, no loss scaling needed")
    if capability >= (7, 0):
        return Precision(
            fp16, f"{label}: fp16 tensor cores; bf16 would be emulated (slow); needs a GradScaler"
        )
    return Precision(fp32, f"{label}: no tensor cores, float32")


def autocast(device: torch.device | str, precision: Precision) -> AbstractContextManager[Any]:
    """``torch.autocast(device.type, precision.dtype)``, or a context that does nothing for
    fp32 (``torch.autocast(enabled=False)`` still raises for ``"mps"`` before torch 2.5
    and for ``"meta"``).

    >>> with autocast("meta", pick_precision("cpu")):
    ...     pass
    """
    if not precision.autocast:
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=precision.dtype)


def to_device(batch: Any, device: torch.device | str, non_blocking: bool | None = None) -> Any:
    """Move every tensor in a nested batch (tuples, lists, dicts, namedtuples) to ``device``;
    other values stay. ``non_blocking=None``: asynchronous exactly when a pinned tensor
    goes to a CUDA device."""
    device = torch.device(device)
    if isinstance(batch, torch.Tensor):
        if non_blocking is None:  # asynchronous exactly for pinned memory to a GPU
            # is_pinned() asks the CUDA driver (and creates a context on GPU 0): only
            # when the batch goes to a GPU
            pinned = device.type == "cuda" and batch.device.type == "cpu" and batch.is_pinned()
            return batch.to(device, non_blocking=pinned)
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        moved = {key: to_device(value, device, non_blocking) for key, value in batch.items()}
        try:
            return type(batch)(moved)  # type: ignore[call-arg]  # OrderedDict, dict, ...
        except TypeError:  # a mapping type that cannot be built from a dict
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(value, device, non_blocking) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device, non_blocking) for value in batch)
    return batch


def tensors_in(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside a nested batch, in order (to check :func:`to_device`)."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping | list | tuple):
        for value in batch.values() if isinstance(batch, Mapping) else batch:
            yield from tensors_in(value)
