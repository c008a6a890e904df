"""Where am I running, with what, and what should I do about it: the doctor report.

Read without initializing CUDA (GPUs come from NVML): safe at the top of any notebook,
before a DataLoader forks or DDP starts. Notebook 01 shows the report;
``python -m course_utils doctor`` prints it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from dataclasses import asdict
from typing import Any

import torch

from course_utils import nvml
from course_utils.device import (
    choose_device,
    cuda_device_facts,
    cuda_gpu_count,
    gpu_problems,
    mps_available,
    pick_precision,
)

# Import name -> distribution name of the packages the course cares about.
PACKAGES = {name: name for name in ("torch", "torchvision", "lightning", "numpy", "matplotlib")}
PACKAGES |= {"pynvml": "nvidia-ml-py", "course_utils": "course-utils"}


def where_am_i() -> str:
    """``"colab"``, ``"kaggle"``, ``"jupyter"``, ``"ipython"``, ``"ci"`` or ``"script"``."""
    if "google.colab" in sys.modules or os.environ.get("COLAB_RELEASE_TAG"):
        return "colab"
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE"):
        return "kaggle"
    shell = _ipython_shell()
    if shell == "ZMQInteractiveShell":
        return "jupyter"
    if shell:
        return "ipython"
    if os.environ.get("CI"):
        return "ci"
    return "script"


def _ipython_shell() -> str | None:
    ipython = sys.modules.get("IPython")
    shell = None if ipython is None else ipython.get_ipython()
    return None if shell is None else type(shell).__name__


def installed_version(distribution: str) -> str | None:
    """The version pip installed, or ``None``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def stale_imports() -> list[dict[str, str]]:
    """Packages whose installed version differs from the imported one (``pip install``
    over a package the kernel had imported: the old one stays until a restart). Each
    entry has ``package``, ``in_memory`` and ``installed``."""
    stale = []
    for module_name, distribution in PACKAGES.items():
        in_memory = str(getattr(sys.modules.get(module_name), "__version__", ""))
        installed = installed_version(distribution) or ""
        # torch.__version__ carries a local label ("2.14.1+cu130") that PyPI's metadata lacks
        compared = in_memory if "+" in installed else in_memory.split("+")[0]
        if in_memory and installed and compared != installed:
            stale.append({"package": distribution, "in_memory": in_memory, "installed": installed})
    return stale


def gpu_runtime_advice(environment: str | None = None) -> str:
    """What to do when no GPU is attached, for the environment you are in."""
    hosted = {
        "colab": "No GPU is attached to this Colab runtime. Choose Runtime > Change runtime "
        "type > Hardware accelerator: T4 GPU > Save. Colab then starts a new runtime: run the "
        "notebook again from the first cell.",
        "kaggle": "No GPU in this Kaggle session. Open the notebook's Settings > Accelerator "
        "and choose GPU T4 x2 (not P100: current PyTorch builds no longer support it), then "
        "run again from the first cell.",
    }
    if advice := hosted.get(environment or where_am_i()):
        return advice
    if not torch.backends.cuda.is_built():
        return (
            f"This torch ({torch.__version__}) is a CPU-only build. On a machine with an "
            "NVIDIA GPU, install a CUDA build (see pytorch.org/get-started). Everything in "
            "the course still runs on the CPU, with smaller workloads."
        )
    return (
        "No NVIDIA GPU is visible (no driver answered, or CUDA_VISIBLE_DEVICES hides them). "
        "Check `nvidia-smi`. The course runs on the CPU too, with smaller workloads and "
        "labels that say so."
    )


def _cudnn_version() -> int | None:
    """cuDNN's version, read from the library itself. Not ``torch.backends.cudnn.version()``:
    it calls ``torch.cuda.is_available()`` (a ``cudaGetDeviceCount`` that spoils a later
    ``fork``) and, on some GPUs, initializes CUDA to check compute capabilities."""
    get_version = getattr(getattr(torch._C, "_cudnn", None), "getVersionInt", None)
    try:
        return int(get_version()) if get_version and torch.backends.cuda.is_built() else None
    except Exception:  # the cuDNN library could not be loaded
        return None


def usable_cores() -> int:
    """CPU cores this process may run on (``os.sched_getaffinity``: containers and
    ``taskset`` restrict it below ``os.cpu_count()``)."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux only
    return max(1, len(affinity(0))) if affinity else max(1, os.cpu_count() or 1)


def doctor() -> dict[str, Any]:
    """Everything the course needs to know about this machine, as a JSON-ready dict
    (``python``, ``torch``, ``cuda_available``, ``device``, ``gpus``, ``precision``...).
    CUDA is not initialized."""
    environment = where_am_i()
    gpus_visible = nvml.visible_gpus()
    gpu_count = cuda_gpu_count()
    choice = choose_device()
    precision = pick_precision(choice.device)
    problems = gpu_problems() if gpus_visible else []
    advice = list(problems) if problems else [] if gpu_count else [gpu_runtime_advice(environment)]
    stale = stale_imports()
    advice += [
        f"{item['package']} {item['installed']} is installed but {item['in_memory']} is "
        "loaded: restart the runtime (Colab: Runtime > Restart session)"
        for item in stale
    ]
    advice += [problem for problem in [nvml.binding_problem()] if problem]
    return {
        "environment": environment,
        "platform": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "cpu_cores": usable_cores(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": installed_version("torchvision"),
        "lightning": installed_version("lightning"),
        "nvidia_ml_py": installed_version("nvidia-ml-py"),
        "course_utils": installed_version("course-utils"),
        "torch_cuda_build": torch.version.cuda,
        "cudnn": _cudnn_version(),
        "nvml": nvml.nvml_status(),
        "driver": nvml.driver_version(),
        "driver_cuda": nvml.cuda_driver_version(),
        "cuda_available": gpu_count > 0,
        "gpu_count": gpu_count,
        "mps_available": mps_available(),
        "gpus": [_gpu_entry(gpu) for gpu in gpus_visible],
        "gpu_problems": problems,
        "device": str(choice.device),
        "device_reason": choice.reason,
        "precision": precision.name,
        "precision_reason": precision.reason,
        "stale_imports": stale,
        "advice": advice,
    }


def _gpu_entry(gpu: nvml.GpuInfo) -> dict[str, Any]:
    capability = gpu.compute_capability and ".".join(map(str, gpu.compute_capability))
    entry = {key: value for key, value in asdict(gpu).items() if key != "mig_devices"}
    return entry | {"mig_uuids": list(gpu.mig_uuids), "compute_capability": capability}


def format_doctor(report: dict[str, Any]) -> str:
    """The doctor report as text for people."""
    build = report["torch_cuda_build"]
    build = f"CUDA {build} build" if build else "CPU-only build"
    build += f", cuDNN {report['cudnn']}" if report["cudnn"] else ""
    lines = [
        "course_utils doctor",
        f"  running in     : {report['environment']} on {report['platform']}, "
        f"{report['cpu_cores']} CPU cores",
        f"  python         : {report['python']}",
        f"  torch          : {report['torch']} ({build})",
        f"  torchvision    : {report['torchvision'] or 'not installed'}",
        f"  lightning      : {report['lightning'] or 'not installed'}",
        f"  NVML           : {report['nvml']}",
        f"  driver         : {report['driver'] or 'not found'}"
        + (f" (supports CUDA up to {report['driver_cuda']})" if report["driver_cuda"] else ""),
        f"  CUDA available : {report['cuda_available']} ({report['gpu_count']} GPU(s))",
    ]
    for gpu in report["gpus"]:
        lines.append(
            f"    GPU {gpu['index']}: {gpu['name']}, {gpu['memory_total_mib']} MiB, "
            f"compute capability {gpu['compute_capability']}, "
            f"{gpu['memory_free_mib']} MiB free"
        )
    lines += [
        f"  device         : {report['device']} ({report['device_reason']})",
        f"  precision      : {report['precision']} ({report['precision_reason']})",
    ]
    if report["advice"]:
        lines.append("  advice:")
        lines += [f"    - {item}" for item in report["advice"]]
    return "\n".join(lines)


def measured_on(device: torch.device | str) -> str:
    """The hardware label for a number measured on ``device`` in this process."""
    device = torch.device(device)
    if device.type == "cuda":
        position = device.index or 0
        name = getattr(nvml.gpu_for_cuda_index(position), "name", None)
        if name is None:  # NVML does not know it: ask CUDA without poisoning a later fork
            facts = cuda_device_facts(position)
            name = facts[0] if facts else None
        return f"measured on this machine (GPU: {name or 'unknown NVIDIA GPU'})"
    if device.type == "mps":
        return "measured on this machine (Apple GPU, MPS)"
    return f"measured on this machine (CPU: {platform.machine()}, {usable_cores()} cores)"
