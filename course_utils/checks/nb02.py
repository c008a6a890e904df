"""Notebook 02's deciding halves: from what :mod:`course_utils.checks.evidence.nb02` saw the
learner's ``read_gpu`` return on a fake NVML, the verdict and its feedback
(:data:`course_utils.classroom.MESSAGES_02`)."""

from __future__ import annotations

from typing import Any

from course_utils.checks.evidence.nb02 import read_gpu_readings
from course_utils.checks.values import answered
from course_utils.classroom import MESSAGES_02, CheckFailed
from course_utils.fake_nvml import FakeGpu


def read_gpu_on(read_gpu: Any, gpus: list[FakeGpu], indices: list[int]) -> dict[str, Any]:
    """``read_gpu(nvml, index)`` for each of ``indices`` on one fake NVML over ``gpus``
    (:func:`~course_utils.checks.evidence.nb02.read_gpu_readings`): ``returned``, what each
    call returned, plain data (:class:`CheckFailed` for a subclass of a built-in type, or
    for a call that raised, saying what it raised); ``init_calls`` and ``initialized``,
    how it left NVML."""
    seen = read_gpu_readings(read_gpu, gpus, indices)
    return {**seen, "returned": [answered(record) for record in seen["returned"]]}


def nvml_left_open(read_gpu: Any, gpus: list[FakeGpu], index: int) -> bool:
    """Whether ``read_gpu(nvml, index)`` left the fake NVML initialized, for an ``index``
    where NVML raises (no such GPU): one of NVML's errors is expected, any other is said
    (:class:`CheckFailed`)."""
    seen = read_gpu_readings(read_gpu, gpus, [index])
    record = seen["returned"][0]
    if "raised" not in record or not record["nvml"]:
        answered(record)
    return bool(seen["initialized"])


def check_read_gpu_edge_cases(read_gpu: Any) -> None:
    """Check a learner's ``read_gpu(nvml, index)`` (notebook 02) on a MIG instance, whose
    utilization call raises ``NVMLError_NotSupported``, and on byte counts that are not whole
    MiB (``bytes // 2**20``, an int).

    >>> check_read_gpu_edge_cases(lambda nvml, index: (None, 512, 19968))
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: NVML's byte counts are rarely whole MiB, and from \
such counts your function read (512, 19968) (used, total): give whole MiB as ints, bytes // 2**20 \
(3932160 bytes, 3.75 MiB, read 3)
    """
    mig = FakeGpu(utilization_gpu_pct=None, memory_used_mib=512, memory_total_mib=19968)
    record = read_gpu_readings(read_gpu, [mig], [0])["returned"][0]  # utilization: unsupported
    if "raised" in record and record["nvml"]:
        raise CheckFailed(MESSAGES_02["read_gpu MIG raised"].format(error=record["raised"]["kind"]))
    got = answered(record)
    if got != (None, 512, 19968):
        raise CheckFailed(MESSAGES_02["read_gpu MIG"].format(got=got))
    odd = FakeGpu(37, 2046, 15360, used_bytes_over_mib=3 * 2**19)  # 1.5 MiB more
    got = read_gpu_on(read_gpu, [odd], [0])["returned"][0]  # used 2047.5, total 15363 MiB
    if got[1:] == (2047, 15363) and all(type(v) is int for v in got[1:]):
        return
    used, total = 2047.5 * 2**20, 15363 * 2**20  # the fake's byte counts
    mistakes = {
        "read_gpu divided": (used / 2**20, total / 2**20),
        "read_gpu rounded": (round(used / 2**20), round(total / 2**20)),
    }
    found = [
        name
        for name, values in mistakes.items()
        if got[1:] == values and [type(v) for v in got[1:]] == [type(v) for v in values]
    ]
    raise CheckFailed(MESSAGES_02[found[0] if found else "read_gpu whole MiB"].format(got=got[1:]))
