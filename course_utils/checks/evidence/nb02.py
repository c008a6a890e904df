"""Notebook 02's observing halves: the learner's ``read_gpu(nvml, index)`` is given a
:class:`~course_utils.fake_nvml.FakeNvml` over GPUs the check describes, and what it
returned or raised, and how it left NVML (``nvmlInit`` against ``nvmlShutdown`` calls),
comes back as data. What those should be is decided in :mod:`course_utils.checks.nb02`."""

from __future__ import annotations

from typing import Any

from course_utils.checks.boundary import observed
from course_utils.checks.evidence.values import exception_seen, value_of
from course_utils.fake_nvml import FakeGpu, FakeNvml


def _read(read_gpu: Any, nvml: FakeNvml, index: int) -> dict[str, Any]:
    """One call of ``read_gpu(nvml, index)``: what it returned (``value_of``), or what it
    raised (``{"raised": ..., "nvml": whether it is one of NVML's errors}``); an unanswered
    exercise's ``NotImplementedError`` goes through."""
    try:
        got = read_gpu(nvml, index)
    except NotImplementedError:
        raise
    except Exception as error:  # the learner's mistake: the check says it in words
        return {"raised": exception_seen(error), "nvml": isinstance(error, FakeNvml.NVMLError)}
    return value_of(got, f"read_gpu(nvml, {index})")


@observed
def read_gpu_readings(read_gpu: Any, gpus: list[FakeGpu], indices: list[int]) -> dict[str, Any]:
    """``read_gpu(nvml, index)`` for each of ``indices`` in turn, on one fake NVML over
    ``gpus``: each call's record (:func:`_read`), and the fake's ``nvmlInit`` calls and
    whether it was left initialized (more ``nvmlInit`` than ``nvmlShutdown`` calls)."""
    nvml = FakeNvml(gpus)
    returned = [_read(read_gpu, nvml, index) for index in indices]
    return {"returned": returned, "init_calls": nvml.init_calls, "initialized": nvml.initialized}
