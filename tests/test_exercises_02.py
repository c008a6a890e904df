"""Notebook 02's exercises (a) and (b): their checks pass right answers written in other
ways and fail the usual wrong answers with feedback that names the mistake. Exercise (c)
is tested in tests/test_exercise_checks.py, but for its messages' figures (issue 45, here).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from notebook_cells import code_cells, grade_apart, grade_cell, messages_matching, run_cells

from course_utils.checks.nb02 import MESSAGES_02
from course_utils.feedback import CheckFailed

ROOT = Path(__file__).resolve().parent.parent
NB02 = ROOT / "notebooks" / "02_nvidia_smi_and_monitoring.ipynb"


def _cell(grade_id: str | None = None, cell_id: str | None = None) -> str:
    return code_cells(NB02)[cell_id] if cell_id else grade_cell(NB02, str(grade_id))


@pytest.fixture
def namespace(monkeypatch) -> dict:
    monkeypatch.setenv("COURSE_WORKLOAD", "small")
    space: dict = {}
    exec(_cell(cell_id="nb02-03"), space)  # the imports
    exec(_cell(cell_id="nb02-03b"), space)
    return space


def _run(namespace: dict, grade_id: str, name: str, solution) -> None:
    namespace[name] = solution
    exec(_cell(grade_id=grade_id), namespace)


# ----------------------------------------------------------------------------- (a)


def regex_parse(line):
    found = [re.match(r"-?\d+(\.\d+)?", cell) for cell in line.split(", ")]
    return [float(match.group()) if match else None for match in found]


def split_parse(line):
    values = []
    for cell in line.split(", "):
        number = cell.split(" ")[0]
        values.append(float(number) if number.replace(".", "", 1).isdigit() else None)
    return values


def zero_for_missing(line):
    return [value if value is not None else 0.0 for value in regex_parse(line)]


def known_units_only(line):  # issue 35: units stripped one by one, so MHz clocks read None
    values = []
    for cell in line.split(", "):
        for unit in (" MiB", " W", " %"):
            cell = cell.removesuffix(unit)
        try:
            values.append(float(cell))
        except ValueError:
            values.append(None)
    return values


def ints_for_whole_numbers(line):  # blind test: 1296 comes back an int
    return [
        None if value is None else int(value) if value.is_integer() else value
        for value in regex_parse(line)
    ]


def search_anywhere(line):  # blind test: 'NVIDIA H200' reads 200, 'P0' reads 0
    found = [re.search(r"\d+\.?\d*", cell) for cell in line.split(", ")]
    return [float(match.group()) if match else None for match in found]


def printed_examples_only(line):  # blind test: a lookup of the printed lines, then float()
    known = {
        "97.43 W, 1296 MiB, [N/A], 38 %": [97.43, 1296.0, None, 38.0],
        "[Not Supported], 5 %": [None, 5.0],
        "ERR!, [Unknown Error]": [None, None],
        "N/A, 0 MiB": [None, 0.0],
        "1410 MHz, 1593 MHz, 54 C": [1410.0, 1593.0, 54.0],
    }
    return list(known[line]) if line in known else [float(f.split()[0]) for f in line.split(", ")]


def keeps_units(line):
    return [cell.strip() for cell in line.split(",")]


def only_na_is_missing(line):
    return [None if cell.strip() == "[N/A]" else float(cell.split()[0]) for cell in line.split(",")]


@pytest.mark.parametrize("solution", [regex_parse, split_parse])
def test_parse_query_line_check_passes_right_answers(namespace, solution, capsys):
    _run(namespace, "02-parse-query-line-check", "parse_query_line", solution)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (zero_for_missing, "return None for it, not 0"),
        (keeps_units, "should be a number"),
        (only_na_is_missing, "your function raised ValueError"),
        (known_units_only, r"'1410 MHz, 1593 MHz, 54 C'.*keep the number before any unit"),
        (ints_for_whole_numbers, "return each number as a float"),
        (search_anywhere, "recorded H200 line: name read 200.0"),
        (printed_examples_only, "recorded H200 line: your function raised ValueError"),
    ],
)
def test_parse_query_line_check_names_the_mistake(namespace, solution, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _run(namespace, "02-parse-query-line-check", "parse_query_line", solution)


# ----------------------------------------------------------------------------- (b)


def per_gpu_then_sum(flops_per_step, step_s, peak_tflops, gpus=1):
    achieved_per_gpu = flops_per_step / gpus / step_s
    return achieved_per_gpu / (peak_tflops * 1e12)


def forgot_tera(flops_per_step, step_s, peak_tflops, gpus=1):
    return flops_per_step / step_s / (gpus * peak_tflops)


def forgot_gpus(flops_per_step, step_s, peak_tflops, gpus=1):
    return flops_per_step / step_s / (peak_tflops * 1e12)


@pytest.mark.parametrize("solution", [per_gpu_then_sum])
def test_run_mfu_check_passes_right_answers(namespace, solution, capsys):
    _run(namespace, "02-run-mfu-check", "run_mfu", solution)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [(forgot_tera, "multiply it by 1e12"), (forgot_gpus, "combined peak, gpus × peak")],
)
def test_run_mfu_check_names_the_mistake(namespace, solution, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _run(namespace, "02-run-mfu-check", "run_mfu", solution)


def _mfu_as(formula):
    """run_mfu written as ``formula(flops, step_s, peak_tflops, gpus)``."""

    def run_mfu(flops_per_step, step_s, peak_tflops, gpus=1):
        return formula(flops_per_step, step_s, peak_tflops, gpus)

    return run_mfu


#: One wrong run_mfu per usual mistake of 02 (b), and the message that must name it.
RUN_MFU_MISTAKES = {
    "run_mfu tera": _mfu_as(lambda f, s, p, g: f / s / (g * p)),
    "run_mfu giga": _mfu_as(lambda f, s, p, g: f / s / (g * p * 1e9)),
    "run_mfu percentage": _mfu_as(lambda f, s, p, g: 100 * f / s / (g * p * 1e12)),
    "run_mfu inverted": _mfu_as(lambda f, s, p, g: g * p * 1e12 / (f / s)),
    "run_mfu gpus cancel": _mfu_as(lambda f, s, p, g: f * g / s / (g * p * 1e12)),
    "run_mfu flops times gpus": _mfu_as(lambda f, s, p, g: f * g / s / (p * 1e12)),
    "run_mfu gpus twice": _mfu_as(lambda f, s, p, g: f / g / s / (g * p * 1e12)),
    "run_mfu step multiplied": _mfu_as(lambda f, s, p, g: f * s / (g * p * 1e12)),
    "run_mfu wrong": _mfu_as(lambda f, s, p, g: f / s / (g * p * 1e12) + 0.01),
    "run_mfu not a number": _mfu_as(lambda f, s, p, g: f"{f / s / (g * p * 1e12):.0%}"),
    "run_mfu raised": _mfu_as(lambda f, s, p, g: f / s / (g * p * 1e12) / (g - 1)),
}


@pytest.mark.parametrize("name", list(RUN_MFU_MISTAKES))
def test_run_mfu_feedback_names_each_mistake_and_no_other(namespace, name):
    with pytest.raises(CheckFailed) as failed:
        _run(namespace, "02-run-mfu-check", "run_mfu", RUN_MFU_MISTAKES[name])
    assert messages_matching(str(failed.value), MESSAGES_02) == [name], str(failed.value)


def test_run_mfu_feedback_never_gives_the_failed_cases_mfu(namespace):
    with pytest.raises(CheckFailed) as failed:
        _run(namespace, "02-run-mfu-check", "run_mfu", RUN_MFU_MISTAKES["run_mfu wrong"])
    assert "0.25" not in str(failed.value).split("gave")[1].split("which")[0]


# ----------------------------------------------------------------------------- issue 45


#: Wrong parse_query_line answers, each failing a line of check_parses_other_lines, and
#: the right answer of that line, which the message must not give.
OTHER_LINE_MISTAKES = {
    "known units only": (known_units_only, [1410.0, 1593.0, 54.0]),
    "ERR! read as zero": (
        lambda line: [
            0.0 if c == "ERR!" else v
            for c, v in zip(line.split(", "), regex_parse(line), strict=True)
        ],
        [None, None],
    ),
}


@pytest.mark.parametrize("mistake", list(OTHER_LINE_MISTAKES))
def test_parse_other_line_never_gives_the_lines_right_values(namespace, mistake):
    """Issue 45: "for '1410 MHz, 1593 MHz, 54 C' expected [1410.0, 1593.0, 54.0]" gave the
    list to paste; the message now says what the function gave and works another line."""
    solution, right = OTHER_LINE_MISTAKES[mistake]
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, "02-parse-query-line-check", "parse_query_line", solution)
    message = str(failure.value)
    assert messages_matching(message, MESSAGES_02.english) == ["parse other line"], message
    assert str(right) not in message and "expected" not in message, message
    assert "reads [7.0, None, 3.0]" in message, message


def test_parse_other_line_quotes_what_was_raised_once(namespace):
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, "02-parse-query-line-check", "parse_query_line", only_na_is_missing)
    message = str(failure.value)
    assert messages_matching(message, MESSAGES_02.english) == ["parse other line raised"], message
    assert "gave your function raised" not in message, message


def test_the_h200_field_message_does_not_give_the_fields_value(namespace):
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, "02-parse-query-line-check", "parse_query_line", search_anywhere)
    message = str(failure.value)
    named = set(messages_matching(message, MESSAGES_02.english)) - {"parse H200 line"}  # any
    assert named == {"parse H200 field"}, message
    assert "should be" not in message, message


def _read_gpu_failure(namespace, solution) -> str:
    from test_exercise_checks import _run_check

    for cell_id in ("nb02-03", "nb02-03b"):
        exec(_cell(cell_id=cell_id), namespace)
    with pytest.raises(CheckFailed) as failure:
        _run_check(NB02, "02-read-gpu-check", namespace, "read_gpu", solution)
    return str(failure.value)


def test_read_gpu_busy_message_does_not_give_the_tuple_to_return(namespace):
    """Issue 45: "the busy H200 reads (99, 1011, 143771)" was the answer to paste."""
    from test_exercise_checks import bytes_read_gpu

    message = _read_gpu_failure(namespace, bytes_read_gpu)
    assert "for the busy H200 you returned" in message, message
    assert "(99, 1011, 143771)" not in message and "1011," not in message, message


@pytest.mark.parametrize(
    ("solution", "name"),
    [
        ("true_division_read_gpu", "read_gpu divided"),
        ("rounding_read_gpu", "read_gpu rounded"),
        ("floats_read_gpu", "read_gpu whole MiB"),
    ],
)
def test_read_gpu_whole_mib_names_the_mistake_not_the_mib(namespace, solution, name):
    """Each reading of byte counts that are not whole MiB is named by what it returned (a
    float MiB without a matching mistake is described), never told the 2047 to return."""
    import test_exercise_checks as checks

    def floats_read_gpu(nvml, index):  # floor, but as floats: no usual mistake's values
        util, used, total = checks._bytes(nvml, index)
        return util, float(used // 2**20), float(total // 2**20)

    answer = floats_read_gpu if solution == "floats_read_gpu" else getattr(checks, solution)
    message = _read_gpu_failure(namespace, answer)
    assert messages_matching(message, MESSAGES_02.english) == [name], message
    assert not re.search(r"(?<![\d.])2047(?![\d.])", message), message


class _Agrees(tuple):
    """An answer's tuple that says it equals anything."""

    def __eq__(self, other):
        return True

    __hash__ = tuple.__hash__


def test_read_gpu_check_refuses_a_tuple_that_equals_anything(namespace):
    """The check cell compares the answer with ``==`` beside the answer: it first requires
    a plain tuple (core.plain_value)."""

    def agrees(nvml, index):
        nvml.nvmlInit()
        nvml.nvmlShutdown()
        return _Agrees((0, 0, 0))

    with pytest.raises(CheckFailed, match="should be of type tuple, but it is of type _Agrees"):
        _run(namespace, "02-read-gpu-check", "read_gpu", agrees)


# --------------------------------------------- (c) across the grader's boundary

#: The check cell of exercise (c): its evidence is gathered beside the answer, its verdict
#: decided apart (course_utils.checks.nb02), as the grader runs it (notebook_cells.grade_apart).
READ_GPU_CHECK = "02-read-gpu-check"


@pytest.fixture(scope="module")
def runtime() -> dict:
    """The learner's runtime at the check: the notebook's imports, without an answer."""
    return run_cells(NB02, ("nb02-03", "nb02-03b"))


def _apart(runtime: dict, read_gpu) -> dict:
    return grade_apart(NB02, READ_GPU_CHECK, {**runtime, "read_gpu": read_gpu})


def test_read_gpu_check_apart_passes_the_reference_answer(runtime):
    namespace = dict(runtime)
    exec(_cell(grade_id="02-read-gpu"), namespace)  # the instructor's solution
    assert grade_apart(NB02, READ_GPU_CHECK, namespace)["status"] == "completed"


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        ("gpu0_read_gpu", "for the busy H200 you returned (0, 0, 143771)"),
        ("no_shutdown_read_gpu", "call nvml.nvmlInit() first and nvml.nvmlShutdown() once"),
        ("no_mig_read_gpu", "read_gpu MIG raised"),
        ("rounding_read_gpu", "read_gpu rounded"),
        ("no_finally_read_gpu", "shut NVML down even when a call raised: use try/finally"),
    ],
)
def test_read_gpu_check_apart_names_the_mistake(runtime, answer, feedback):
    import test_exercise_checks as answers

    verdict = _apart(runtime, getattr(answers, answer))
    assert verdict["status"] == "failed" and verdict["ename"] == "CheckFailed", verdict
    if feedback in MESSAGES_02.english:
        assert feedback in messages_matching(verdict["evalue"], MESSAGES_02.english), verdict
    else:
        assert verdict["evalue"].startswith(feedback), verdict


def test_read_gpu_check_apart_refuses_a_tuple_that_equals_anything(runtime):
    """Evidence cannot be forged by a lying value: the tuple crosses only as a type's name."""

    def agrees(nvml, index):
        nvml.nvmlInit()
        nvml.nvmlShutdown()
        return _Agrees((99, 1011, 143771))

    verdict = _apart(runtime, agrees)
    assert verdict["status"] == "failed", verdict
    assert verdict["evalue"] == (
        "read_gpu(nvml, 1) should be of type tuple, but it is of type _Agrees"
    ), verdict


def test_read_gpu_check_apart_does_not_show_what_the_answer_raised(runtime):
    """What the learner's code raised is said by its class; its own text is not shown."""

    def raises(nvml, index):
        raise ValueError("a secret of the learner's")

    verdict = _apart(runtime, raises)
    assert verdict["status"] == "failed", verdict
    assert verdict["evalue"] == "your function raised ValueError: (your code's message)", verdict
