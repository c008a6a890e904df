"""Exercise (c) of notebook 07 (retry with a smaller batch): its check passes right answers
written in different ways and fails the usual mistakes, with feedback that names them.

The check cell runs as the grader runs it: after the notebook's imports, knobs and the
helper cell of the exercise, with the learner's ``retry_halving`` in the same namespace.
"""

from __future__ import annotations

import gc
from pathlib import Path

import nbformat
import pytest
import torch
from notebook_cells import grade_apart, grade_cell, messages_matching

from course_utils.checks.nb07 import MESSAGES_07
from course_utils.feedback import CheckFailed
from course_utils.oom import is_out_of_memory

NB07 = Path(__file__).resolve().parent.parent / "notebooks" / "07_gpu_memory_and_cache.ipynb"


def _notebook():
    return nbformat.read(NB07, as_version=4)


def _grade_cell(grade_id: str) -> str:
    return grade_cell(NB07, grade_id)


@pytest.fixture(scope="module")
def nb07():
    """The namespace the check runs in: imports, knobs, and the exercise's helpers."""
    patch = pytest.MonkeyPatch()
    patch.setenv("COURSE_WORKLOAD", "small")
    cells = {cell.get("id"): cell.source for cell in _notebook().cells}
    namespace: dict = {}
    try:
        for cell_id in ("nb07-04", "nb07-05", "nb07-37a"):
            exec(cells[cell_id], namespace)
    finally:
        patch.undo()
    return namespace


def _check(nb07, retry_halving) -> None:
    namespace = dict(nb07, retry_halving=retry_halving)
    exec(_grade_cell("07-retry-halving-check"), namespace)


# --------------------------------------------------------------- right answers


def solution(step, batch_size):
    namespace: dict = {"torch": torch, "gc": gc}
    source = next(
        cell.source
        for cell in _notebook().cells
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "07-retry-halving"
    )
    exec(source, namespace)
    return namespace["retry_halving"](step, batch_size)


def checks_the_message(step, batch_size):
    """Catches RuntimeError and lets through what is not out of memory, as 07 teaches."""
    while batch_size > 0:
        failed = False
        try:
            step(batch_size)
            return batch_size
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            failed = True
        if failed:
            gc.collect()
            batch_size //= 2
    raise RuntimeError("no batch size fits")


def checks_the_text(step, batch_size):
    while True:
        try:
            step(batch_size)
            return batch_size
        except RuntimeError as error:
            if "out of memory" not in str(error):
                raise
        batch_size //= 2
        if batch_size == 0:
            raise RuntimeError("even a batch of 1 does not fit")


def recursive(step, batch_size):
    if batch_size == 0:
        raise RuntimeError("out of sizes")
    try:
        step(batch_size)
        return batch_size
    except torch.cuda.OutOfMemoryError:
        pass
    return recursive(step, batch_size // 2)


def says_out_of_memory_itself(step, batch_size):
    """Right (issue 35): its own error's message says "out of memory"; its type is not the OOM."""
    while batch_size >= 1:
        try:
            step(batch_size)
            return batch_size
        except torch.cuda.OutOfMemoryError:
            pass
        batch_size //= 2
    raise RuntimeError("out of memory even with a batch of 1")


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer", [solution, checks_the_message, checks_the_text, recursive, says_out_of_memory_itself]
)
def test_retry_check_passes_right_answers(nb07, answer, capsys):
    _check(nb07, answer)
    assert "all checks passed" in capsys.readouterr().out


# --------------------------------------------------------------- wrong answers


def catches_every_runtime_error(step, batch_size):
    """The review's wrong answer: a shape bug is halved down to nothing and hidden."""
    while batch_size > 0:
        try:
            step(batch_size)
            return batch_size
        except RuntimeError:
            pass
        batch_size //= 2
    raise RuntimeError("not even a batch of 1 fits")


def reraises_the_last_error(step, batch_size):
    """Catches every RuntimeError, then raises the last message again: the bug's message
    survives, but the buggy step ran four times."""
    last = ""
    while batch_size > 0:
        try:
            step(batch_size)
            return batch_size
        except RuntimeError as error:
            last = str(error)
        batch_size //= 2
    raise RuntimeError(last if "out of memory" not in last else "nothing fits")


def catches_everything(step, batch_size):
    while batch_size > 0:
        try:
            step(batch_size)
            return batch_size
        except Exception:
            pass
        batch_size //= 2
    raise RuntimeError("nothing fits")


def retries_inside_except(step, batch_size):
    try:
        step(batch_size)
        return batch_size
    except torch.cuda.OutOfMemoryError:
        if batch_size == 1:
            raise RuntimeError("nothing fits") from None
        return retries_inside_except(step, batch_size // 2)  # the failed frame is alive


def raises_the_oom(step, batch_size):
    while True:
        try:
            step(batch_size)
            return batch_size
        except torch.cuda.OutOfMemoryError:
            if batch_size == 1:
                raise
        batch_size //= 2


def stops_before_one(step, batch_size):  # issue 35: a halving retry that never tries batch 1
    while batch_size > 1:
        try:
            step(batch_size)
            return batch_size
        except torch.cuda.OutOfMemoryError:
            pass
        batch_size //= 2
    raise RuntimeError("no batch size fits")


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (stops_before_one, "only a batch of 1 fits here"),
        (
            catches_every_runtime_error,
            "a shape error is not out of memory, but your code caught it",
        ),
        (reraises_the_last_error, "a shape error is not out of memory, but your code caught it"),
        (catches_everything, "a ZeroDivisionError is not out of memory, but your code caught it"),
        (retries_inside_except, "retry after the except block has ended"),
        (raises_the_oom, "raise your own RuntimeError"),
    ],
)
def test_retry_check_names_the_mistake(nb07, answer, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _check(nb07, answer)


# --------------------------------------------------------------- (b), issue 35


def _check_b(nb07, drop_from_history) -> None:
    namespace = dict(nb07, drop_from_history=drop_from_history)
    exec(_grade_cell("07-drop-from-history-check"), namespace)


def _underscores(namespace):
    for name in ("_", "__", "___"):
        if isinstance(namespace.get(name), torch.Tensor):
            namespace[name] = ""


def in_place(namespace):  # right, written another way
    history = namespace["Out"]
    for key in [k for k, v in history.items() if isinstance(v, torch.Tensor)]:
        history.pop(key)
        namespace.pop(f"_{key}", None)
    _underscores(namespace)


def rebinds_out(namespace):  # issue 35: IPython's _oh still holds the tensors
    kept = {k: v for k, v in namespace["Out"].items() if not isinstance(v, torch.Tensor)}
    for key in set(namespace["Out"]) - set(kept):
        namespace.pop(f"_{key}", None)
    namespace["Out"] = kept
    _underscores(namespace)


def exact_type(namespace):  # issue 35: type(v) == torch.Tensor where isinstance is meant
    history = namespace["Out"]
    for key in [k for k, v in history.items() if type(v) == torch.Tensor]:  # noqa: E721
        del history[key]
        namespace.pop(f"_{key}", None)
    _underscores(namespace)


def test_drop_from_history_right_answer_passes(nb07, capsys):
    _check_b(nb07, in_place)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [(rebinds_out, "one dict named both Out and _oh"), (exact_type, "an nn.Parameter is a tensor")],
)
def test_drop_from_history_names_the_mistake(nb07, answer, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _check_b(nb07, answer)


# ------------------------------------------------------- issue 35 leftovers: (b)


def _tensor_keys(history):
    return [key for key, value in history.items() if isinstance(value, torch.Tensor)]


def deletes_underscores(namespace):  # the blind trial's: del _ instead of _ = ""
    history = namespace["Out"]
    for key in _tensor_keys(history):
        del history[key]
        namespace.pop(f"_{key}", None)
    for name in ("_", "__", "___"):
        if isinstance(namespace.get(name), torch.Tensor):
            del namespace[name]


def deletes_every_underscore(namespace):  # deletes _, __, ___ whatever they hold
    history = namespace["Out"]
    for key in _tensor_keys(history):
        del history[key]
        namespace.pop(f"_{key}", None)
    for name in ("_", "__", "___"):
        namespace.pop(name, None)


def leaves_twins(namespace):  # the blind trial's: Out cleaned, the _N twins left
    history = namespace["Out"]
    for key in _tensor_keys(history):
        del history[key]
    _underscores(namespace)


def deletes_while_looping(namespace):
    history = namespace["Out"]
    for key, value in history.items():
        if isinstance(value, torch.Tensor):
            del history[key]
            namespace.pop(f"_{key}", None)
    _underscores(namespace)


def scans_every_name(namespace):  # right, written another way: every _N name that is a tensor
    history = namespace["Out"]
    for key in _tensor_keys(history):
        history.pop(key)
    for name in [n for n, v in namespace.items() if n.startswith("_") and n[1:].isdigit()]:
        if isinstance(namespace[name], torch.Tensor):
            del namespace[name]
    _underscores(namespace)


def test_drop_from_history_written_another_way_passes(nb07, capsys):
    _check_b(nb07, scans_every_name)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (deletes_underscores, '_ held a tensor: set it to "", do not delete it'),
        (deletes_every_underscore, '_ held a tensor: set it to "", do not delete it'),
        (leaves_twins, "_4, _7, _9 still hold the tensors of Out: each Out.N. has a twin"),
        (deletes_while_looping, "deleted from the dict while looping over it"),
    ],
)
def test_drop_from_history_leftovers_are_named(nb07, answer, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _check_b(nb07, answer)


def test_a_string_in_underscores_is_kept(nb07):
    """The second arrangement: __ holds the tensor, _ and ___ text that must stay."""

    def blanks_all(namespace):
        in_place(namespace)
        for name in ("_", "__", "___"):
            namespace[name] = ""

    with pytest.raises(CheckFailed, match="_ held a string: leave it as it is"):
        _check_b(nb07, blanks_all)


def _after_empty_cache_check(answer) -> None:
    from course_utils.checks.core import check, passed

    exec(
        _grade_cell("07-after-empty-cache-check"),
        {"check": check, "passed": passed, "after_empty_cache": answer},
    )


def test_after_empty_cache_asks_for_a_tuple(capsys):
    """Blind test: a list of the right numbers failed with the context message."""
    _after_empty_cache_check(lambda allocated, reserved, context: (allocated, allocated + context))
    assert "all checks passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match=r"return a tuple \(reserved, smi\), got \[512, 912\]"):
        _after_empty_cache_check(lambda allocated, _reserved, ctx: [allocated, allocated + ctx])


#: One wrong after_empty_cache per usual mistake of 07 (a), and the message that must name it.
AFTER_EMPTY_CACHE_MISTAKES = {
    "after_empty_cache swapped": lambda allocated, reserved, context: (
        allocated + context,
        allocated,
    ),
    "after_empty_cache nothing freed": lambda allocated, reserved, context: (
        reserved,
        reserved + context,
    ),
    "after_empty_cache live freed": lambda allocated, reserved, context: (0, context),
    "after_empty_cache no context": lambda allocated, reserved, context: (allocated, allocated),
    "after_empty_cache old smi": lambda allocated, reserved, context: (
        allocated,
        reserved + context,
    ),
    "after_empty_cache wrong": lambda allocated, reserved, context: (
        allocated,
        allocated + context + 1,
    ),
    "after_empty_cache not a pair": lambda allocated, reserved, context: allocated,
    "after_empty_cache raised": lambda allocated, reserved, context: (
        allocated,
        allocated + context / (allocated - 512),
    ),
}


@pytest.mark.parametrize("name", list(AFTER_EMPTY_CACHE_MISTAKES))
def test_after_empty_cache_feedback_names_each_mistake_and_no_other(name):
    with pytest.raises(CheckFailed) as failed:
        _after_empty_cache_check(AFTER_EMPTY_CACHE_MISTAKES[name])
    assert messages_matching(str(failed.value), MESSAGES_07) == [name], str(failed.value)
    if name != "after_empty_cache swapped":  # its own value holds both numbers
        assert "912" not in str(failed.value).split("gave")[-1]  # the first case's smi


class _Agrees(int):
    """An answer's int that says it equals anything."""

    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def test_retry_check_refuses_an_int_that_equals_anything(nb07):
    """The check cell compares the answer with ``==`` beside the answer: it first requires
    a plain int (core.plain_value)."""
    with pytest.raises(CheckFailed, match="should be of type int, but it is of type _Agrees"):
        _check(nb07, lambda step, batch_size: _Agrees(7))


# ------------------------------------------------ across the grader's boundary

#: Exercises (b) and (c)'s check cells: their evidence is gathered beside the answer, their
#: verdict decided apart (course_utils.checks.nb07), as the grader runs them
#: (notebook_cells.grade_apart).
DROP_CHECK, RETRY_CHECK = "07-drop-from-history-check", "07-retry-halving-check"


@pytest.fixture(scope="module")
def runtime(nb07):
    """The learner's runtime at the checks: the notebook's cells and the reference answers.
    The objects made so far are frozen out of the garbage collector's reach (gc.freeze):
    each gc.collect() of the answer, in the processes forked for the evidence, then scans
    only what the check made (0.5 s a call otherwise; the reference answer makes eleven)."""
    namespace = dict(nb07)
    for grade_id in ("07-drop-from-history", "07-retry-halving"):
        exec(_grade_cell(grade_id), namespace)
    gc.freeze()
    yield namespace
    gc.unfreeze()


def _apart(runtime, grade_id, **answer) -> dict:
    return grade_apart(NB07, grade_id, {**runtime, **answer})


@pytest.mark.parametrize("grade_id", [DROP_CHECK, RETRY_CHECK])
def test_the_reference_answers_pass_apart(runtime, grade_id):
    assert _apart(runtime, grade_id)["status"] == "completed"


@pytest.mark.parametrize(
    ("answer", "name"),
    [(rebinds_out, "drop replaced Out"), (leaves_twins, "drop twins left"),
     (deletes_underscores, "drop underscore deleted"), (exact_type, "drop parameter kept")],
)  # fmt: skip
def test_drop_from_history_apart_names_the_mistake(runtime, answer, name):
    verdict = _apart(runtime, DROP_CHECK, drop_from_history=answer)
    assert verdict["status"] == "failed" and verdict["ename"] == "CheckFailed", verdict
    assert messages_matching(verdict["evalue"], MESSAGES_07) == [name], verdict


def test_drop_from_history_apart_says_what_it_raised_without_its_text(runtime):
    verdict = _apart(runtime, DROP_CHECK, drop_from_history=deletes_while_looping)
    assert verdict["evalue"] == (
        "your function raised RuntimeError: (your code's message): you deleted from the dict "
        "while looping over it; loop over a copy, list(history.items())"
    ), verdict


def test_drop_from_history_apart_refuses_a_string_that_equals_anything(runtime):
    class Lying(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    def blanks_with_a_liar(namespace):
        in_place(namespace)
        for name in ("_", "__", "___"):
            namespace[name] = Lying("")

    verdict = _apart(runtime, DROP_CHECK, drop_from_history=blanks_with_a_liar)
    assert verdict["status"] == "failed", verdict
    assert verdict["evalue"] == "namespace['_'] should be of type str, but it is of type Lying"


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (stops_before_one, "only a batch of 1 fits here"),
        (catches_every_runtime_error, "a shape error is not out of memory, but your code caught"),
        (catches_everything, "a ZeroDivisionError is not out of memory, but your code caught"),
        (retries_inside_except, "retry after the except block has ended"),
        (raises_the_oom, "raise your own RuntimeError, not the OOM error"),
    ],
)
def test_retry_halving_apart_names_the_mistake(runtime, answer, feedback):
    verdict = _apart(runtime, RETRY_CHECK, retry_halving=answer)
    assert verdict["status"] == "failed" and verdict["ename"] == "CheckFailed", verdict
    assert verdict["evalue"].startswith(feedback), verdict


def test_retry_halving_apart_refuses_an_int_that_equals_anything(runtime):
    verdict = _apart(runtime, RETRY_CHECK, retry_halving=lambda step, batch_size: _Agrees(64))
    assert verdict["status"] == "failed", verdict
    assert verdict["evalue"] == (
        "retry_halving(...) should be of type int, but it is of type _Agrees"
    ), verdict
