"""How big the notebooks' experiments are: ``COURSE_WORKLOAD`` decides.

``small``: tiny sizes, each notebook well under a minute on a 2-core CPU (the tests);
``full``: the sizes the lessons are written for, on a GPU; ``cpu``: a few minutes on a
laptop. Unset or ``auto``: ``full`` with a CUDA GPU, else ``cpu``.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

ENV_VAR = "COURSE_WORKLOAD"
CHOICES = ("small", "cpu", "full", "auto")


def workload() -> str:
    """The workload in force: ``small``, ``cpu`` or ``full`` (``ValueError``: unknown)."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {', '.join(CHOICES)}")
    if value != "auto":
        return value
    from course_utils.device import cuda_gpu_count  # lazy: imports torch, only for auto

    return "full" if cuda_gpu_count() > 0 else "cpu"


def pick(*, small: T, cpu: T, gpu: T) -> T:
    """The size for the workload in force, e.g. ``pick(small=64, cpu=512, gpu=4096)``."""
    return {"small": small, "cpu": cpu, "full": gpu}[workload()]
