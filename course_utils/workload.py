"""How big the notebooks' experiments are: ``COURSE_WORKLOAD`` decides.

``small``: tiny sizes, each notebook well under a minute on a 2-core CPU (the tests);
``full``: the sizes the lessons are written for, on a GPU; ``cpu``: a few minutes on a
laptop. Unset or ``auto``: ``full`` with a CUDA GPU of at least :data:`FULL_MIN_GPU_MIB`
(a T4's 15 GiB qualifies), else ``cpu`` (also on a 4-8 GB laptop GPU or a small MIG slice,
where the full sizes would run out of memory outside any guard).
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

T = TypeVar("T")

ENV_VAR = "COURSE_WORKLOAD"
CHOICES = ("small", "cpu", "full", "auto")
#: The least GPU memory the ``full`` sizes are chosen for: their largest experiments
#: (09's naive attention at 4,096 tokens, 04's ResNet-18 at batch 512) peak near 5-6 GiB,
#: and the CUDA context, cuDNN's workspaces and the allocator's cache come on top.
FULL_MIN_GPU_MIB = 12 * 1024


# The last ``auto`` answer, per (CUDA_VISIBLE_DEVICES, NVML binding): GPUs do not come and
# go while a process runs, and every pick() in a knobs cell asks (one NVML session).
_auto: tuple[tuple[Any, ...], str] | None = None


def smallest_gpu_mib() -> int | None:
    """The memory of the smallest GPU this process may use (a MIG slice's own), read
    through NVML without starting CUDA; ``None`` when NVML does not say."""
    from course_utils.nvml import visible_gpus  # lazy: only for auto

    sizes = [gpu.memory_total_mib for gpu in visible_gpus() if gpu.memory_total_mib]
    return min(sizes) if sizes else None


def workload() -> str:
    """The workload in force: ``small``, ``cpu`` or ``full`` (``ValueError``: unknown).
    ``auto`` is ``full`` only on a GPU with :data:`FULL_MIN_GPU_MIB` or more (unknown
    memory counts as enough: NVML answers on every NVIDIA driver)."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {', '.join(CHOICES)}")
    if value != "auto":
        return value
    global _auto
    from course_utils import nvml  # lazy: imports torch, only for auto
    from course_utils.device import cuda_gpu_count

    key = (os.environ.get("CUDA_VISIBLE_DEVICES"), nvml._pynvml)
    if _auto is not None and _auto[0][0] == key[0] and _auto[0][1] is key[1]:
        return _auto[1]
    with nvml.nvml_session():  # one NVML session for the count and the memory
        memory_mib = smallest_gpu_mib() if cuda_gpu_count() > 0 else 0
    fits = memory_mib is None or memory_mib >= FULL_MIN_GPU_MIB
    _auto = (key, "full" if fits else "cpu")
    return _auto[1]


def pick(*, small: T, cpu: T, gpu: T) -> T:
    """The size for the workload in force, e.g. ``pick(small=64, cpu=512, gpu=4096)``."""
    return {"small": small, "cpu": cpu, "full": gpu}[workload()]
