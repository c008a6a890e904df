"""How big the notebooks' experiments are: one environment variable decides.

``COURSE_WORKLOAD`` selects the size of every experiment in every notebook:

* ``small``: tiny sizes so that each notebook runs in well under a minute on a 2-core
  CPU. The tests (``make test``) set it.
* ``full``: realistic sizes. On a GPU these are the sizes the lessons are written for.
* unset or ``auto`` (the default): ``full`` when PyTorch can use a CUDA GPU, otherwise
  ``cpu``, moderate sizes that finish in a few minutes on a laptop.

Notebooks ask for a size with :func:`pick`, e.g. ``n = pick(small=256, cpu=1024,
gpu=4096)``. Used by every notebook.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

ENV_VAR = "COURSE_WORKLOAD"
CHOICES = ("small", "cpu", "full", "auto")


def workload() -> str:
    """The workload in force: ``"small"``, ``"cpu"`` or ``"full"``.

    Raises ``ValueError`` for an unknown value of ``COURSE_WORKLOAD``.
    Example: with ``COURSE_WORKLOAD=small`` set, ``workload()`` returns ``"small"``.
    """
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {', '.join(CHOICES)}")
    if value != "auto":
        return value
    from course_utils.device import cuda_gpu_count  # imports torch: only when needed

    return "full" if cuda_gpu_count() > 0 else "cpu"


def pick(*, small: T, cpu: T, gpu: T) -> T:
    """Choose a size for the workload in force (``gpu`` is used for ``full``).

    Example: under ``COURSE_WORKLOAD=small``, ``pick(small=64, cpu=512, gpu=4096)`` is 64.
    """
    return {"small": small, "cpu": cpu, "full": gpu}[workload()]
