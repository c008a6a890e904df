"""Exercise 03 (b): its check passes right answers written in several ways and fails the
usual mistakes with feedback that names the mistake. The check cell runs as the grader
runs it: after the notebook's imports, with the learner's functions in its namespace.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch
from notebook_cells import grade_apart, grade_cell
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader

from course_utils.checks import data_format
from course_utils.checks.nb03 import check_copy_to_gpu
from course_utils.device import to_device
from course_utils.feedback import CheckFailed
from course_utils.spies import record_tensor_to

NB03 = Path(__file__).resolve().parent.parent / "notebooks" / "03_data_loading_and_batch_size.ipynb"


def _cell(predicate) -> str:
    notebook = nbformat.read(NB03, as_version=4)
    return next(cell.source for cell in notebook.cells if predicate(cell))


def _grade_cell(grade_id: str) -> str:
    return grade_cell(NB03, grade_id)


@pytest.fixture(scope="module")
def nb03() -> dict:
    namespace: dict = {}
    for cell_id in ("nb03-04", "nb03-04b", "nb03-device"):
        exec(_cell(lambda cell, cell_id=cell_id: cell.get("id") == cell_id), namespace)
    exec(_grade_cell("03-gpu-loader"), namespace)  # the instructor's solution
    return namespace


def _run_check(nb03: dict, **learner) -> None:
    namespace = {**nb03, **learner}
    exec(_grade_cell("03-gpu-loader-check"), namespace)


# ------------------------------------------------------------------ right answers


def recursive_pinned(batch, device):  # non_blocking exactly where it can help
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=batch.is_pinned())
    if isinstance(batch, dict):
        return {key: recursive_pinned(value, device) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(recursive_pinned(value, device) for value in batch)
    return batch


def by_device_type(batch, device):
    if torch.is_tensor(batch):
        return batch.to(device=device, non_blocking=device.type == "cuda")
    if isinstance(batch, dict):
        return dict((key, by_device_type(value, device)) for key, value in batch.items())
    if isinstance(batch, list | tuple):
        return type(batch)(by_device_type(value, device) for value in batch)
    return batch


def with_pytree(batch, device):
    return tree_map(
        lambda leaf: leaf.to(device, non_blocking=True) if torch.is_tensor(leaf) else leaf, batch
    )


def with_cuda_method(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.cuda(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: with_cuda_method(value, device) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(with_cuda_method(value, device) for value in batch)
    return batch


def positional(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, batch.dtype, True)  # to(device, dtype, non_blocking)
    if isinstance(batch, dict):
        return {key: positional(value, device) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(positional(value, device) for value in batch)
    return batch


@pytest.mark.parametrize(
    "solution",
    [recursive_pinned, by_device_type, with_pytree, with_cuda_method, positional],
)
def test_right_answers_written_another_way_pass(nb03, solution, capsys):
    _run_check(nb03, to_gpu=solution)
    assert "all checks passed" in capsys.readouterr().out


def test_the_instructor_solution_passes(nb03, capsys):
    _run_check(nb03)
    assert "all checks passed" in capsys.readouterr().out


# ------------------------------------------------------------------ wrong answers


def blocking(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: blocking(value, device) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(blocking(value, device) for value in batch)
    return batch


def flat(batch, device):  # the nested dict is not looked into
    return [t.to(device, non_blocking=True) if torch.is_tensor(t) else t for t in batch]


def flat_crash(batch, device):  # calls .to on everything
    return [t.to(device, non_blocking=True) for t in batch]


def discards_copies(batch, device):  # .to is not in place
    for t in tree_flatten_tensors(batch):
        t.to(device, non_blocking=True)
    return batch


def tree_flatten_tensors(batch):
    leaves, _ = torch.utils._pytree.tree_flatten(batch)
    return [leaf for leaf in leaves if torch.is_tensor(leaf)]


def clones_first(batch, device):  # a pageable copy of a pinned tensor: not asynchronous
    return tree_map(
        lambda t: t.clone().to(device, non_blocking=True) if torch.is_tensor(t) else t, batch
    )


def mutates(batch, device):
    images, extra, names, boxes = batch
    for key in extra:
        extra[key] = extra[key].to(device, non_blocking=True)
    return images.to(device, non_blocking=True), extra, names, boxes


def images_only_async(batch, device):
    images, extra, names, boxes = batch
    moved = {key: value.to(device) for key, value in extra.items()}
    return images.to(device, non_blocking=True), moved, names, boxes


def dict_as_list(batch, device):
    images, extra, names, boxes = batch
    moved = [value.to(device, non_blocking=True) for value in extra.values()]
    return images.to(device, non_blocking=True), moved, names, boxes


def tuples_only(batch, device):  # issue 35: lists not recursed into
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: tuples_only(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(tuples_only(value, device) for value in batch)
    return batch


def pins_itself(batch, device):  # 03-N11: the loader has pinned already
    return tree_map(
        lambda t: t.pin_memory().to(device, non_blocking=True) if torch.is_tensor(t) else t,
        batch,
    )


def course_helper(batch, device):  # issue 35: the course's own to_device does the exercise
    return to_device(batch, device, non_blocking=True)


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (blocking, "non_blocking=False"),
        (images_only_async, r"labels tensor .* non_blocking=False"),
        (flat, r"labels tensor .* was not copied: copy every tensor"),
        (flat_crash, "not a tensor"),
        (discards_copies, "not its copy: .to returns a new tensor"),
        (clones_first, "new tensor made from it"),
        (mutates, "changed the dict"),
        (dict_as_list, "same keys"),
        (tuples_only, r"boxes of the first image .* in a list.* was not copied: .*lists"),
        (pins_itself, r"pinned the tensors itself .* pin_memory=True has already pinned"),
        (course_helper, r"called the course's own to_device\(\)"),
    ],
)
def test_usual_mistakes_fail_with_feedback_that_names_them(solution, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        check_copy_to_gpu(solution)


def _loader(pin=True, persistent=True, prefetch=4, shuffle=True):
    def gpu_loader(dataset, batch_size, workers):
        extra = {}
        if workers:
            extra = dict(persistent_workers=persistent, prefetch_factor=prefetch)
        return DataLoader(
            dataset, batch_size, shuffle=shuffle, num_workers=workers, pin_memory=pin, **extra
        )

    return gpu_loader


def always_persistent(dataset, batch_size, workers):
    return DataLoader(
        dataset,
        batch_size,
        shuffle=True,
        num_workers=workers,
        pin_memory=True,
        persistent_workers=True,
        prefetch_factor=4,
    )


@pytest.mark.parametrize(
    ("gpu_loader", "feedback"),
    [
        (_loader(pin=False), "without pin_memory=True"),
        (_loader(persistent=False), "persistent_workers=True"),
        (_loader(prefetch=2), "prefetch_factor=4"),
        (_loader(shuffle=False), "shuffle=True"),
        (always_persistent, "workers=0"),
    ],
)
def test_loader_mistakes_fail_with_feedback(nb03, gpu_loader, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _run_check(nb03, gpu_loader=gpu_loader)


# ------------------------------------------------------------------ the spy itself


def test_pretend_cuda_records_moves_and_keeps_tensors_on_the_cpu():
    source = torch.arange(3)
    with record_tensor_to(pretend_cuda=True) as moves:
        moved = source.to("cuda", non_blocking=True)
        again = source.cuda(1)
        local = source.to("cpu")
    assert moved.device.type == again.device.type == "cpu" and torch.equal(moved, source)
    assert [(m.target, m.non_blocking) for m in moves] == [
        ("cuda", True),
        ("cuda:1", False),
        ("cpu", False),
    ]
    assert moves[0].source_id == id(source) and moves[0].result_id == id(moved)
    assert local is source  # a move to the CPU still runs for real


def test_the_spy_restores_the_methods():
    to, cuda = torch.Tensor.to, torch.Tensor.cuda
    with pytest.raises(RuntimeError), record_tensor_to(pretend_cuda=True):
        raise RuntimeError("the learner's code failed")
    assert torch.Tensor.to is to and torch.Tensor.cuda is cuda


# ------------------------------------------------------------------ (a), issue 35


def _run_knee_check(nb03: dict, knee) -> None:
    rows = [(2, 50.0), (8, 95.0), (32, 100.0)]
    sweep = SimpleNamespace(  # a measured sweep, its knee from the course's batch_size_sweep
        fitted=[SimpleNamespace(batch_size=b, samples_per_s=r) for b, r in rows],
        knee=lambda: SimpleNamespace(batch_size=8),
    )
    exec(_grade_cell("03-knee-check"), {**nb03, "knee": knee, "sweep": sweep})


def knee_at_least(rows, fraction=0.9):  # right: >= written as a ratio
    best = max(rate for _, rate in rows)
    return min(size for size, rate in rows if rate / best >= fraction)


def knee_strict(rows, fraction=0.9):  # issue 35: a strict > where "at least" is asked
    best = max(rate for _, rate in rows)
    return min(size for size, rate in rows if rate > fraction * best)


def test_the_knee_at_exactly_the_fraction(nb03, capsys):
    _run_knee_check(nb03, knee_at_least)
    assert "all checks passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match=r"exactly half the best did not qualify.*use >=, not >"):
        _run_knee_check(nb03, knee_strict)


def knee_of_largest_batch(rows, fraction=0.9):  # blind test: max(rows)[1] is the largest batch's
    best = max(rows)[1]
    return min(size for size, rate in rows if rate >= fraction * best)


def test_the_knee_when_the_best_rate_is_not_at_the_largest_batch(nb03):
    with pytest.raises(CheckFailed, match=r"as if the best were the largest batch's rate"):
        _run_knee_check(nb03, knee_of_largest_batch)


# ------------------------------------------------------------------ (a), issue 45


def knee_default_fraction(rows, fraction=0.9):  # the argument ignored: 0.9 always
    best = max(rate for _, rate in rows)
    return min(size for size, rate in rows if rate >= 0.9 * best)


def knee_in_order(rows, fraction=0.9):  # the rows assumed sorted: the last is the best
    best = rows[-1][1]
    return next(size for size, rate in rows if rate >= fraction * best)


def knee_constant(rows, fraction=0.9):
    return 8


def knee_of_the_best(rows, fraction=0.9):  # the best batch itself, past the first table
    if fraction != 0.9:
        return max(rows, key=lambda row: row[1])[0]
    return knee_at_least(rows, fraction)


#: Each usual mistake of exercise 03 (a), the words that name it, and what each other
#: mistake's message says that this one's must not.
KNEE_MISTAKES = {
    knee_default_fraction: "the knee at the default 0.9",
    knee_strict: "use >=, not >",
    knee_of_largest_batch: "as if the best were the largest batch's rate",
    knee_in_order: "do not assume they are sorted",
}


@pytest.mark.parametrize("answer", list(KNEE_MISTAKES), ids=lambda f: f.__name__)
def test_each_knee_mistake_is_named_and_no_other(nb03, answer):
    """Issue 45: "with fraction=0.99 only 1000 and 1010 qualify: did you use the fraction
    argument?" guessed; each mistake is now named only when its knee is the answer's."""
    with pytest.raises(CheckFailed) as failure:
        _run_knee_check(nb03, answer)
    message = str(failure.value)
    named = [m for m, words in KNEE_MISTAKES.items() if words in message]
    assert named == [answer], message


@pytest.mark.parametrize(
    ("answer", "failed_knee"),
    [(knee_constant, "16"), (knee_of_the_best, "64")],
    ids=["constant", "best batch"],
)
def test_a_knee_message_never_gives_the_failed_tables_knee(nb03, answer, failed_knee):
    """Issue 45: "so 16 is the smallest batch that qualifies" gave the answer to paste; the
    messages now give the rule, an example of other rows, and what the answer returned."""
    with pytest.raises(CheckFailed) as failure:
        _run_knee_check(nb03, answer)
    message = str(failure.value)
    assert not re.search(rf"(?<![\d.]){failed_knee}(?![\d.])", message), message
    assert not any(words in message for words in KNEE_MISTAKES.values()), message


def tuple_to_list(batch, device):  # blind test: tuples come back as lists
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: tuple_to_list(value, device) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return [tuple_to_list(value, device) for value in batch]
    return batch


def test_a_tuple_must_stay_a_tuple():
    with pytest.raises(CheckFailed, match=r"the batch is a tuple .* returned a list"):
        check_copy_to_gpu(tuple_to_list)


# ------------------------------------------------------- issue 35 leftovers: (c)


def _run_accumulation_check(nb03, effective_batch, new_lr):
    namespace = {**nb03, "effective_batch": effective_batch, "new_lr": new_lr}
    exec(_grade_cell("03-accumulation-check"), namespace)


@pytest.mark.parametrize(
    ("effective_batch", "new_lr"), [(256, 0.8), (32 * 8, 0.1 * 256 / 32), (256.0, 0.1 * 8)]
)
def test_accumulation_written_other_ways_passes(nb03, effective_batch, new_lr, capsys):
    _run_accumulation_check(nb03, effective_batch, new_lr)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("effective_batch", "new_lr", "feedback"),
    [
        ("256", "0.8", r"effective_batch is the text '256', a str: write the number itself"),
        (256, "0.8", r"new_lr .* is the text '0.8', a str: write the number itself"),
    ],
    ids=["batch-as-text", "lr-as-text"],
)
def test_values_written_as_text_are_named(nb03, effective_batch, new_lr, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _run_accumulation_check(nb03, effective_batch, new_lr)


# ------------------------------------------------- (b) across the grader's boundary

#: The check cell of exercise (b): its evidence is gathered beside the answer, its verdict
#: decided apart (course_utils.checks.nb03), as the grader runs it (notebook_cells.grade_apart).
LOADER_CHECK = "03-gpu-loader-check"


def _apart(nb03: dict, **learner) -> dict:
    return grade_apart(NB03, LOADER_CHECK, {**nb03, **learner})


def test_the_instructor_solution_passes_apart(nb03):
    assert _apart(nb03)["status"] == "completed"


@pytest.mark.parametrize(
    ("learner", "feedback"),
    [
        ({"to_gpu": blocking}, "to_gpu: the images tensor (batch[0]) is in pinned memory but "),
        ({"to_gpu": clones_first}, "to_gpu: the images tensor (batch[0]) was not copied: you "),
        ({"to_gpu": course_helper}, "to_gpu: your function called the course's own to_device()"),
        ({"gpu_loader": _loader(pin=False)}, "gpu_loader: without pin_memory=True"),
        ({"gpu_loader": _loader(shuffle=False)}, "gpu_loader: the loader should shuffle"),
    ],
    ids=["blocking", "clones first", "course helper", "not pinned", "no shuffle"],
)
def test_one_part_wrong_apart_earns_half_and_names_the_mistake(nb03, learner, feedback):
    verdict = _apart(nb03, **learner)
    assert verdict["status"] == "failed" and verdict["ename"] == "PartialCredit", verdict
    assert verdict["earned"] == 0.5, verdict
    assert verdict["evalue"].startswith(f"1 of 2 parts right; {feedback}"), verdict


def test_both_parts_wrong_apart_earn_nothing(nb03):
    verdict = _apart(nb03, to_gpu=flat, gpu_loader=always_persistent)
    assert verdict["status"] == "failed" and verdict["ename"] == "CheckFailed", verdict
    assert "earned" not in verdict, verdict
    assert verdict["evalue"].startswith(
        "0 of 2 parts right; gpu_loader: gpu_loader(..., "
        "workers=0) failed: (your code's message); to_gpu: "
        "the labels tensor"
    ), verdict


def test_what_to_gpu_raised_is_named_apart_without_its_text(nb03):
    verdict = _apart(nb03, to_gpu=flat_crash)  # .to on a file name: an AttributeError
    assert verdict["evalue"] == (
        "1 of 2 parts right; to_gpu: to_gpu called a tensor method on a value that is not a "
        "tensor ((your code's message)): go inside tuples, lists and dicts, copy only the "
        "tensors, return other values as they are"
    ), verdict


def test_lying_values_cannot_forge_the_evidence_apart(nb03):
    """A str whose == says True crosses only as its type's name: the part fails."""

    class Lying(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    def lying_names(batch, device):
        images, inner, names, boxes = recursive_pinned(batch, device)
        return images, inner, [Lying("?")] * len(names), boxes

    def lying_pin(dataset, batch_size, workers):
        loader = _loader()(dataset, batch_size, workers)
        loader.__dict__["pin_memory"] = Lying("")  # falsy, but equal to anything
        return loader

    verdict = _apart(nb03, to_gpu=lying_names, gpu_loader=lying_pin)
    assert verdict["status"] == "failed" and "earned" not in verdict, verdict
    assert verdict["evalue"] == (
        "0 of 2 parts right; gpu_loader: loader.pin_memory should be of type str, but it is of "
        "type Lying; to_gpu: to_gpu(batch, device)[2][0] should be of type str, but it is of "
        "type Lying"
    ), verdict


def test_tampering_found_while_gathering_evidence_is_not_a_part_that_failed(nb03, monkeypatch):
    """The cell gathers both parts' evidence before check_parts: the grader's finding that
    the course's instruments were changed (Tampered) fails the whole check with its flag;
    check_parts, which makes any exception a part's failure, never sees it."""
    from course_utils.instructor import checker

    observe = checker.Channel.observe

    def found_tampering(self, module, name, args, kwargs):
        if name == "copy_to_gpu_moves":
            raise data_format.Tampered(["torch.Tensor.to was replaced"])
        return observe(self, module, name, args, kwargs)

    monkeypatch.setattr(checker.Channel, "observe", found_tampering)
    verdict = _apart(nb03)
    assert verdict["status"] == "failed" and "earned" not in verdict, verdict
    assert verdict["tampering"] == ["torch.Tensor.to was replaced"], verdict


def test_reading_what_to_gpu_returned_fails_the_part_apart(nb03):
    def names_as_a_number(batch, device):
        images, inner, names, boxes = recursive_pinned(batch, device)
        return images, inner, len(names), boxes  # list(4) raises TypeError

    verdict = _apart(nb03, to_gpu=names_as_a_number)
    assert verdict["earned"] == 0.5, verdict
    assert verdict["evalue"] == (
        "1 of 2 parts right; to_gpu: your code raised TypeError: (your code's message)"
    ), verdict
