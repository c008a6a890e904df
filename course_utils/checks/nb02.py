"""Notebook 02's deciding halves: from what :mod:`course_utils.checks.evidence.nb02` saw the
learner's ``read_gpu`` return on a fake NVML, the verdict and its feedback
(:data:`course_utils.checks.nb02.MESSAGES_02`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from course_utils.checks.core import (
    _kind,
    answer_and_error,
    answer_or_error,
    check,
    is_raised,
    matching_mistake,
)
from course_utils.checks.evidence.nb02 import read_gpu_readings
from course_utils.checks.values import answered
from course_utils.fake_nvml import FakeGpu
from course_utils.feedback import CheckFailed, plain_value
from course_utils.language import Messages
from course_utils.smi import sample_output


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
    course_utils.feedback.CheckFailed: NVML's byte counts are rarely whole MiB, and from \
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


#: Notebook 02's check messages, by a stable name (see :data:`MESSAGES_01`).
MESSAGES_02 = Messages(
    "02",
    {
        "run_mfu raised": "{error} (on run_mfu({case}))",
        "run_mfu not a number": "run_mfu({case}) gave {kind}: return MFU as a number, a fraction "
        "such as 0.3",
        "run_mfu tera": "run_mfu({case}) gave {got:.3g}, as if the peak were in FLOP/s: "
        "peak_tflops is in TFLOP/s, so multiply it by 1e12 before dividing",
        "run_mfu giga": "run_mfu({case}) gave {got:.3g}, as if a TFLOP were 1e9 FLOPs: "
        "one TFLOP/s is 1e12 FLOP/s",
        "run_mfu percentage": "run_mfu({case}) gave {got:.3g}, a percentage: return the "
        "fraction (0.3 for 30%)",
        "run_mfu inverted": "run_mfu({case}) gave {got:.3g}, the peak over the achieved rate: "
        "MFU is the achieved FLOP/s over the peak, a fraction below 1",
        "run_mfu gpus cancel": "run_mfu({case}) gave {got:.3g}, the same as on one GPU: "
        "flops_per_step already counts the work of all the GPUs, so divide it by their "
        "combined peak, gpus × peak, without multiplying the FLOPs by gpus",
        "run_mfu flops times gpus": "run_mfu({case}) gave {got:.3g}, as if the FLOPs were "
        "multiplied by gpus: flops_per_step already counts the work of all the GPUs; divide it "
        "by their combined peak, gpus × peak",
        "run_mfu gpus twice": "run_mfu({case}) gave {got:.3g}, as if divided by gpus twice: "
        "divide the achieved FLOP/s once by the combined peak, gpus × peak",
        "run_mfu step multiplied": "run_mfu({case}) gave {got:.3g}, as if the FLOPs were "
        "multiplied by the step time: the achieved rate is flops_per_step / step_s",
        "run_mfu wrong": "run_mfu({case}) gave {got:.3g}, which is not achieved FLOP/s "
        "(flops_per_step / step_s) over the combined peak (gpus × peak_tflops × 1e12): "
        "3 TFLOP per 1 s step on one 10 TFLOP/s GPU is 0.3",
        "parse other line": "for {line!r} your function gave {got}: keep the number before "
        "any unit (MHz, C, MiB, W, %), None only where there is no number ('7 W, [N/A], 3 MHz' "
        "reads [7.0, None, 3.0])",
        "parse other line raised": "{error}, given {line!r}: keep the number before any unit "
        "(MHz, C, MiB, W, %), None only where there is no number ('7 W, [N/A], 3 MHz' reads "
        "[7.0, None, 3.0])",
        "parse nounits": "values printed with nounits have no unit",
        "parse H200 line": "recorded H200 line: {got}",
        "parse H200 field": "recorded H200 line: {field} read {got!r}, but a value is a number "
        "only where the field starts with one, and None where it does not ('7 W' reads 7.0, "
        "'Tesla T4' reads None)",
        "read_gpu MIG": "under MIG the utilization call raises nvml.NVMLError_NotSupported: "
        "return None for it, and still read the memory ({got})",
        "read_gpu MIG raised": "under MIG the utilization call raises "
        "nvml.NVMLError_NotSupported: return None for it, and still read the memory ({error} "
        "raised)",
        "read_gpu divided": "from byte counts that are not whole MiB your function read "
        "{got!r} (used, total), the bytes divided with /: floor them to whole MiB as ints, "
        "bytes // 2**20 (3932160 bytes, 3.75 MiB, read 3)",
        "read_gpu rounded": "from byte counts that are not whole MiB your function read "
        "{got!r} (used, total), each rounded to the nearest MiB: floor them instead, "
        "bytes // 2**20 (3932160 bytes, 3.75 MiB, read 3, not 4)",
        "read_gpu whole MiB": "NVML's byte counts are rarely whole MiB, and from such counts "
        "your function read {got!r} (used, total): give whole MiB as ints, bytes // 2**20 "
        "(3932160 bytes, 3.75 MiB, read 3)",
    },
)


#: Exercise 02 (b)'s cases (flops_per_step, step_s, peak_tflops, gpus), not the check
#: cell's: one GPU and several, so that each usual mistake differs from MFU somewhere.
RUN_MFU_CASES = [(2e12, 0.5, 16.0, 1), (4.8e13, 1.5, 20.0, 4), (9e12, 0.25, 120.0, 3)]


def check_run_mfu(run_mfu: Callable[..., Any]) -> None:
    """Exercise 02 (b): ``run_mfu(flops_per_step, step_s, peak_tflops, gpus)`` on
    :data:`RUN_MFU_CASES`; a wrong answer is told the usual mistake its results match on
    every case (TFLOP/s taken for FLOP/s, a percentage, the ratio inverted, the GPU count
    cancelled, doubled or squared...), else what it gave for one case."""
    got: list[float] = []
    for flops, step_s, peak, gpus in RUN_MFU_CASES:
        case = f"{flops:g}, {step_s:g}, {peak:g}, gpus={gpus}"
        out, error = answer_and_error(run_mfu, flops, step_s, peak, gpus)
        check(error is None, MESSAGES_02["run_mfu raised"].format(case=case, error=error))
        plain_value(out, f"run_mfu({case})")
        out = out.item() if isinstance(out, torch.Tensor) and out.numel() == 1 else out
        check(
            isinstance(out, int | float) and not isinstance(out, bool),
            MESSAGES_02["run_mfu not a number"].format(case=case, kind=_kind(out)),
        )
        got.append(float(out))
    right = [f / s / (g * p * 1e12) for f, s, p, g in RUN_MFU_CASES]

    def same(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=1e-6)

    if all(map(same, got, right)):
        return
    cases = list(zip(RUN_MFU_CASES, right, strict=True))
    mistakes = {
        "run_mfu tera": [r * 1e12 for _, r in cases],
        "run_mfu giga": [r * 1e3 for _, r in cases],
        "run_mfu percentage": [r * 100 for _, r in cases],
        "run_mfu inverted": [1 / r for _, r in cases],
        "run_mfu gpus cancel": [r * c[3] for c, r in cases],
        "run_mfu flops times gpus": [r * c[3] ** 2 for c, r in cases],
        "run_mfu gpus twice": [r / c[3] for c, r in cases],
        "run_mfu step multiplied": [r * c[1] ** 2 for c, r in cases],
    }
    name = matching_mistake(got, mistakes, right, same) or "run_mfu wrong"
    first = next(i for i, (a, b) in enumerate(zip(got, right, strict=True)) if not same(a, b))
    flops, step_s, peak, gpus = RUN_MFU_CASES[first]
    case = f"{flops:g}, {step_s:g}, {peak:g}, gpus={gpus}"
    raise CheckFailed(MESSAGES_02[name].format(case=case, got=got[first]))


def check_parses_other_lines(parse_query_line: Callable[[str], Any]) -> None:
    """Check a learner's ``parse_query_line`` (notebook 02) on lines with other units,
    unavailable values, ``nounits`` output and a line recorded on an H200 with text fields.

    >>> check_parses_other_lines(lambda line: [float(v) for v in line.split(", ")])
    Traceback (most recent call last):
    ...
    course_utils.feedback.CheckFailed: your function raised ValueError: could not convert \
string to float: '[Not Supported]', given '[Not Supported], 5 %': keep the number before any \
unit (MHz, C, MiB, W, %), None only where there is no number ('7 W, [N/A], 3 MHz' reads [7.0, \
None, 3.0])
    """

    cases = {
        "[Not Supported], 5 %": [None, 5.0],
        "ERR!, [Unknown Error]": [None, None],
        "N/A, 0 MiB": [None, 0.0],
        "1410 MHz, 1593 MHz, 54 C": [1410.0, 1593.0, 54.0],
    }
    for line, expected in cases.items():
        got = plain_value(answer_or_error(parse_query_line, line), f"parse_query_line({line!r})")
        check(
            type(got) is list and got == expected,
            MESSAGES_02["parse other line raised"].format(line=line, error=got)
            if is_raised(got)
            else MESSAGES_02["parse other line"].format(line=line, got=got),
        )
    check(
        plain_value(answer_or_error(parse_query_line, "1024, 35"), "parse_query_line('1024, 35')")
        == [1024.0, 35.0],
        MESSAGES_02["parse nounits"],
    )
    header, line = sample_output("h200_query_gpu_csv_load")[1].strip().splitlines()
    got = answer_or_error(parse_query_line, line)  # a line recorded on an H200
    plain_value(got, "parse_query_line(line)")
    check(isinstance(got, list), MESSAGES_02["parse H200 line"].format(got=got))
    recorded = dict(zip(header.split(", "), got, strict=False))
    expected_fields: list[tuple[str, float | None]] = [
        ("memory.used [MiB]", 1011),
        ("power.draw [W]", 692.82),
        ("utilization.gpu [%]", 99),
        ("temperature.gpu", 54),
        ("name", None),
        ("pstate", None),
    ]
    for field, value in expected_fields:
        check(
            recorded.get(field) == value,
            MESSAGES_02["parse H200 field"].format(field=field, got=recorded.get(field)),
        )
