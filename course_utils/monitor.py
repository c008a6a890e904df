"""Sampling GPU (or, without one, CPU) utilization and memory over time.

:func:`sample` takes one reading: NVML on a GPU, psutil's CPU utilization and this
process's resident memory otherwise (labelled ``"source": "cpu"``). Used by notebook 02,
the Lightning utilization callback (notebook 05) and the capstone.
"""

from __future__ import annotations

import time
from typing import Any

import psutil

from course_utils import nvml


def sample(gpu_index: int | None = 0) -> dict[str, Any]:
    """One reading as a flat dict with ``time_s`` and ``source`` (``"nvml"`` or ``"cpu"``).

    With NVML and a GPU at ``gpu_index``: the fields of :class:`nvml.GpuSnapshot`.
    Otherwise: ``cpu_util_pct`` (all cores, since the previous call) and
    ``process_rss_mib``.

    >>> sample(gpu_index=None)["source"]
    'cpu'
    """
    reading = nvml.snapshot(gpu_index) if gpu_index is not None else None
    if reading is not None:
        values = {k: v for k, v in vars(reading).items() if k != "index"}
        return {"time_s": time.time(), "source": "nvml", "gpu_index": gpu_index, **values}
    return {
        "time_s": time.time(),
        "source": "cpu",
        "cpu_util_pct": psutil.cpu_percent(interval=None),
        "process_rss_mib": psutil.Process().memory_info().rss / 2**20,
    }
