"""How big the notebooks' experiments are: ``COURSE_WORKLOAD`` decides.

``small``: tiny sizes, each notebook well under a minute on a 2-core CPU (the tests);
``full``: the sizes the lessons are written for, on a GPU; ``cpu``: a few minutes on a
laptop. Unset or ``auto``: ``full`` with a CUDA GPU of at least :data:`FULL_MIN_GPU_MIB`
(a T4's 15 GiB qualifies), else ``cpu`` (also on a 4-8 GB laptop GPU or a small MIG slice,
where the full sizes would run out of memory outside any guard).

One experiment's size may also follow from the GPU's memory rather than from the
workload's name: :func:`pick_by_memory` gives the ``gpu`` size under ``auto`` on any GPU
whose usable memory (:func:`usable_gpu_mib`) holds what that experiment needs, so a 6 GiB
laptop GPU or a MIG slice runs the sizes a lesson's claim is written for where they fit;
:func:`gpu_sizes_run` says whether they do (a cell checks a size-bound claim only then,
and prints :func:`not_at_this_size` instead); :func:`cap_by_memory` shrinks a size to a
share of the usable memory.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, TypeVar

T = TypeVar("T")

ENV_VAR = "COURSE_WORKLOAD"
CHOICES = ("small", "cpu", "full", "auto")
#: The least GPU memory the ``full`` sizes are chosen for: their largest experiments
#: (09's naive attention at 4,096 tokens, 04's ResNet-18 at batch 512) peak near 5-6 GiB,
#: and the CUDA context, cuDNN's workspaces and the allocator's cache come on top.
FULL_MIN_GPU_MIB = 12 * 1024
#: What an experiment cannot plan on (MiB): the CUDA context (a few hundred MiB with lazy
#: module loading, notebook 07 measures it), cuDNN's workspaces and the allocator's cache.
GPU_RESERVE_MIB = 1024


# The last ``auto`` answer, per (CUDA_VISIBLE_DEVICES, NVML binding): GPUs do not come and
# go while a process runs, and every pick() in a knobs cell asks (one NVML session).
_auto: tuple[tuple[Any, ...], str] | None = None
# The same for usable_gpu_mib(): a knobs cell asks once per size.
_usable: tuple[tuple[Any, ...], int | None] | None = None


def smallest_gpu_mib() -> int | None:
    """The memory of the smallest GPU this process may use (a MIG slice's own), read
    through NVML without starting CUDA; ``None`` when NVML does not say."""
    from course_utils.nvml import visible_gpus  # lazy: only for auto

    sizes = [gpu.memory_total_mib for gpu in visible_gpus() if gpu.memory_total_mib]
    return min(sizes) if sizes else None


def _chosen() -> str:
    """``COURSE_WORKLOAD`` as set (``auto`` when unset); ``ValueError``: unknown."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {', '.join(CHOICES)}")
    return value


def workload() -> str:
    """The workload in force: ``small``, ``cpu`` or ``full`` (``ValueError``: unknown).
    ``auto`` is ``full`` only on a GPU with :data:`FULL_MIN_GPU_MIB` or more (unknown
    memory counts as enough: NVML answers on every NVIDIA driver)."""
    value = _chosen()
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


def usable_gpu_mib() -> int | None:
    """The memory an experiment may plan on (MiB): the smallest visible GPU's (a MIG
    slice's own) less :data:`GPU_RESERVE_MIB`, read through NVML without starting CUDA;
    ``None`` without a CUDA GPU or when NVML does not say."""
    global _usable
    from course_utils import nvml  # lazy: imports torch
    from course_utils.device import cuda_gpu_count

    key = (os.environ.get("CUDA_VISIBLE_DEVICES"), nvml._pynvml)
    if _usable is not None and _kept(_usable):
        return _usable[1]
    with nvml.nvml_session():  # one session for the count and the memory
        total = smallest_gpu_mib() if cuda_gpu_count() > 0 else None
    _usable = (key, None if total is None else max(0, total - GPU_RESERVE_MIB))
    return _usable[1]


def gpu_sizes_run(needs_mib: float) -> bool:
    """Whether an experiment's ``gpu`` size runs here, given the GPU memory it needs
    (MiB): under ``full`` unless a GPU is known to be too small for it; under ``auto`` on
    a CUDA GPU whose usable memory holds it (below :data:`FULL_MIN_GPU_MIB` too); never
    under ``small`` or ``cpu``."""
    from course_utils import nvml  # lazy: imports torch

    if _chosen() in ("small", "cpu"):
        return False
    asked = _kept(_usable) and (_chosen() != "auto" or _kept(_auto))
    with contextlib.nullcontext() if asked else nvml.nvml_session():  # one NVML session
        if workload() == "small":
            return False
        usable = usable_gpu_mib()
    if usable is None:  # no CUDA GPU (``auto`` then picked ``cpu``), or NVML does not say
        return workload() == "full"
    return usable >= needs_mib


def _kept(cache: tuple[tuple[Any, ...], Any] | None) -> bool:
    """Whether a kept NVML answer still holds (same ``CUDA_VISIBLE_DEVICES`` and binding)."""
    from course_utils import nvml  # lazy: imports torch

    return (
        cache is not None
        and cache[0][0] == os.environ.get("CUDA_VISIBLE_DEVICES")
        and cache[0][1] is nvml._pynvml
    )


def pick_by_memory(*, small: T, cpu: T, gpu: T, gpu_needs_mib: float) -> T:
    """:func:`pick`, except that the ``gpu`` size is chosen wherever :func:`gpu_sizes_run`
    says it runs (a GPU under 12 GiB whose usable memory holds ``gpu_needs_mib``), and the
    ``cpu`` size under ``full`` on a GPU known to be too small for it."""
    if gpu_sizes_run(gpu_needs_mib):
        return gpu
    return small if workload() == "small" else cpu


def cap_by_memory(size: int, mib_per_unit: float, *, share: float = 0.5) -> int:
    """``size``, or the largest whole number of units of ``mib_per_unit`` MiB each that
    fit in ``share`` of :func:`usable_gpu_mib` if fewer (at least 1); unchanged without a
    GPU or when NVML does not say."""
    if not (mib_per_unit > 0 and 0 < share <= 1):
        raise ValueError(f"need mib_per_unit > 0 and 0 < share <= 1, not {mib_per_unit}, {share}")
    usable = usable_gpu_mib()
    if usable is None:
        return size
    return max(1, min(size, int(usable * share // mib_per_unit)))


def not_at_this_size(claim: str, reason: str) -> str:
    """The sentence a cell prints instead of checking a claim the sizes in force cannot
    show (e.g. a speed-up that needs the ``gpu`` sizes on a GPU that runs smaller ones)."""
    usable = usable_gpu_mib()
    room = "" if usable is None else f", {usable / 1024:.1f} GiB usable on this GPU"
    return (
        f"Not checked at these sizes (workload {workload()}{room}): {claim}. {reason} "
        "This says nothing about the GPU."
    )
