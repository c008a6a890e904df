"""Notebook 01's exercises (a) and (b): their checks (hidden ones included, as the grader
runs them) pass right answers written in several ways and fail the usual wrong answers,
with feedback that names the mistake in plain words.

Each check cell runs after the notebook's imports and knobs, with the learner's function
defined in the same namespace (as in the learner's notebook), and across the grader's
boundary (:func:`notebook_cells.grade_apart`: the verdict decided apart, from the evidence
observed beside the answer). Exercise (c) is tested in tests/test_exercise_checks.py.
"""

from __future__ import annotations

import copy
import re
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from notebook_cells import code_cells, grade_apart, grade_cell, messages_matching
from torch import nn
from torch.utils import _pytree

from course_utils.checks import nb01  # loaded before grade_apart: its evidence's classes
from course_utils.checks.core import answer_or_error, first_difference
from course_utils.checks.nb01 import MESSAGES_01, MESSAGES_PRECISION_RULE
from course_utils.feedback import CheckFailed
from course_utils.spies import record_autocast

ROOT = Path(__file__).resolve().parent.parent
NB01 = ROOT / "notebooks" / "01_runtime_and_devices.ipynb"


def _cell(grade_id: str | None = None, cell_id: str | None = None) -> str:
    return code_cells(NB01)[cell_id] if cell_id else grade_cell(NB01, str(grade_id))


@pytest.fixture
def namespace(monkeypatch) -> Iterator[dict]:
    monkeypatch.setenv("COURSE_WORKLOAD", "small")
    threads = torch.get_num_threads()  # the knobs cell sets them (small workload: one)
    space: dict = {}
    for cell_id in ["nb01-04", "nb01-04b", "nb01-05"]:  # imports and knobs
        exec(_cell(cell_id=cell_id), space)
    yield space
    torch.set_num_threads(threads)


def _run(namespace: dict, grade_id: str, name: str, solution) -> None:
    namespace[name] = solution
    try:
        exec(_cell(grade_id=grade_id), namespace)
    finally:  # a wrong answer may leave autocast on: never let it leak into other tests
        torch.set_autocast_enabled("cpu", False)


# ----------------------------------------------------------------------------- (a)


def reference_to_device(batch, device):
    exec(_cell(grade_id="01-my-to-device"), space := {"torch": torch})
    return space["my_to_device"](batch, device)


def pytree_to_device(batch, device):
    return _pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), batch)


def make_to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return type(batch)((k, make_to_device(v, device)) for k, v in batch.items())
    if hasattr(batch, "_make"):
        return batch._make(make_to_device(v, device) for v in batch)
    if isinstance(batch, list):
        return [make_to_device(v, device) for v in batch]
    if isinstance(batch, tuple):
        return tuple(make_to_device(v, device) for v in batch)
    return batch


def deepcopy_then_move(batch, device):
    """Copies the whole batch, then moves the copy in place: the input stays as it was."""
    batch = copy.deepcopy(batch)

    def move(container):
        keys = container.keys() if isinstance(container, dict) else range(len(container))
        for key in keys:
            value = container[key]
            if isinstance(value, torch.Tensor):
                container[key] = value.to(device)
            elif isinstance(value, (dict, list)):
                move(value)
            elif isinstance(value, tuple):
                container[key] = make_to_device(value, device)
        return container

    if isinstance(batch, (dict, list)):
        return move(batch)
    return make_to_device(batch, device)


def in_place_to_device(batch, device):
    """Assigns into the lists and dicts it was given: the caller's batch changes."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, (dict, list)):
        keys = list(batch) if isinstance(batch, dict) else range(len(batch))
        for key in keys:
            batch[key] = in_place_to_device(batch[key], device)
        return batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(in_place_to_device(v, device) for v in batch))
    if isinstance(batch, tuple):
        return tuple(in_place_to_device(v, device) for v in batch)
    return batch


def in_place_lists_only(batch, device):
    """Builds new dicts but assigns into nested lists: only a nested list changes."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: in_place_lists_only(v, device) for k, v in batch.items()}
    if isinstance(batch, list):
        for i, value in enumerate(batch):
            batch[i] = in_place_lists_only(value, device)
        return batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(in_place_lists_only(v, device) for v in batch))
    if isinstance(batch, tuple):
        return tuple(in_place_lists_only(v, device) for v in batch)
    return batch


def no_namedtuple_to_device(batch, device):
    """The previous reference solution: type(batch)(generator) breaks on a namedtuple."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: no_namedtuple_to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(no_namedtuple_to_device(v, device) for v in batch)
    return batch


def plain_tuple_to_device(batch, device):
    """Turns a namedtuple into a plain tuple."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: plain_tuple_to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list):
        return [plain_tuple_to_device(v, device) for v in batch]
    if isinstance(batch, tuple):
        return tuple(plain_tuple_to_device(v, device) for v in batch)
    return batch


def list_for_tuple_to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: list_for_tuple_to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [list_for_tuple_to_device(v, device) for v in batch]
    return batch


def top_level_only(batch, device):
    if isinstance(batch, dict):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch.to(device) if isinstance(batch, torch.Tensor) else batch


def drops_numbers(batch, device):
    """Keeps only the tensors of a list or tuple."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: drops_numbers(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(drops_numbers(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        kept = [drops_numbers(v, device) for v in batch if not isinstance(v, (int, float))]
        return type(batch)(kept)
    return batch


def exact_type_to_device(batch, device):  # issue 35: type(v) == torch.Tensor for isinstance
    if type(batch) == torch.Tensor:  # noqa: E721
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: exact_type_to_device(value, device) for key, value in batch.items()}
    if hasattr(batch, "_fields"):
        return type(batch)(*(exact_type_to_device(value, device) for value in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(exact_type_to_device(value, device) for value in batch)
    return batch


def plain_dict_to_device(batch, device):  # blind test: an OrderedDict comes back a dict
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: plain_dict_to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(plain_dict_to_device(value, device) for value in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(plain_dict_to_device(value, device) for value in batch)
    return batch


def course_to_device(batch, device):  # issue 35: the course's own helper does the exercise
    from course_utils.device import to_device

    return to_device(batch, device)


@pytest.mark.parametrize(
    "solution", [reference_to_device, pytree_to_device, make_to_device, deepcopy_then_move]
)
def test_my_to_device_check_passes_right_answers(namespace, solution, capsys):
    _run(namespace, "01-my-to-device-check", "my_to_device", solution)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (in_place_to_device, "changed the batch it was given"),
        (in_place_lists_only, "changed the batch it was given"),
        (no_namedtuple_to_device, "raised TypeError.*namedtuple Pair"),
        (plain_tuple_to_device, "should be of type Pair, but it is of type tuple"),
        (list_for_tuple_to_device, "should be of type tuple, but it is of type list"),
        (top_level_only, r"batch\['extra'\]\[0\] is a tensor on cpu; it should be on meta"),
        (drops_numbers, "should have 2 items, not 1"),
        (exact_type_to_device, r"on cpu; it should be on meta, given parameters .*isinstance"),
        (course_to_device, r"called the course's own to_device\(\)"),
        (
            plain_dict_to_device,
            "should be of type OrderedDict, but it is of type dict, given an OrderedDict",
        ),
    ],
)
def test_my_to_device_check_names_the_mistake(namespace, solution, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _run(namespace, "01-my-to-device-check", "my_to_device", solution)


def test_a_list_mutated_in_place_deep_inside_fails_the_hidden_check(namespace):
    """Right on the visible batch (whose lists hold no list), wrong deeper down."""

    def deep_in_place(batch, device):
        if isinstance(batch, list) and any(isinstance(v, list) for v in batch):
            for i, value in enumerate(batch):
                batch[i] = deep_in_place(value, device)
            return batch
        return (
            reference_to_device(batch, device)
            if not isinstance(batch, list)
            else [deep_in_place(v, device) for v in batch]
        )

    with pytest.raises(CheckFailed, match="changed the batch it was given"):
        _run(namespace, "01-my-to-device-check", "my_to_device", deep_in_place)


# ----------------------------------------------------------------------------- (b)


def reference_forward(model, x, capability):
    exec(_cell(grade_id="01-mixed-forward"), space := {"torch": torch})
    return space["mixed_forward"](model, x, capability)


def enabled_flag_forward(model, x, capability):
    major, _minor = capability
    dtype = torch.bfloat16 if major >= 8 else torch.float16
    with torch.amp.autocast(device_type=x.device.type, dtype=dtype, enabled=major >= 7):
        return model(x)


def course_helpers_forward(model, x, capability):  # issue 35: the course's own answer
    from course_utils.device import autocast, pick_precision

    with autocast(x.device, pick_precision("cuda", capability=capability)):
        return model(x)


def cpu_autocast_forward(model, x, capability):  # 01-N4: right on the CPU grader only
    if capability < (7, 0):
        return model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16 if capability >= (8, 0) else torch.float16):
        return model(x)


class Agreeable(torch.Tensor):
    """Answers every comparison with True and says it has whatever dtype is asked."""

    dtype = torch.float16  # type: ignore[assignment]

    def __eq__(self, other):
        return True


def agreeable_forward(model, x, capability):  # issue 35: a subclass that agrees with the check
    with torch.autocast(x.device.type, dtype=torch.float16, enabled=capability >= (7, 0)):
        return model(x).as_subclass(Agreeable)


def old_api_forward(model, x, capability):  # torch.cuda.amp.autocast: right on a GPU
    if capability < (7, 0) or x.device.type != "cuda":
        return model(x) if capability < (7, 0) else _cpu_fallback(model, x, capability)
    dtype = torch.bfloat16 if capability >= (8, 0) else torch.float16
    with torch.cuda.amp.autocast(dtype=dtype):
        return model(x)


def _cpu_fallback(model, x, capability):
    dtype = torch.bfloat16 if capability >= (8, 0) else torch.float16
    with torch.amp.autocast("cpu", dtype=dtype):
        return model(x)


def decimal_forward(model, x, capability):
    version = capability[0] + capability[1] / 10
    if version < 7:
        return model(x)
    with torch.autocast(str(x.device.type), dtype=torch.bfloat16 if version >= 8 else torch.half):
        out = model(x)
    return out


def half_model_forward(model, x, capability):
    if capability < (7, 0):
        return model(x)
    dtype = torch.bfloat16 if capability >= (8, 0) else torch.float16
    return model.to(dtype)(x.to(dtype))


def cuda_only_forward(model, x, capability):
    if capability < (7, 0):
        return model(x)
    dtype = torch.bfloat16 if capability >= (8, 0) else torch.float16
    with torch.autocast("cuda", dtype=dtype):
        return model(x)


def fp16_everywhere_forward(model, x, capability):
    if capability < (7, 0):
        return model(x)
    with torch.autocast(x.device.type, dtype=torch.float16):
        return model(x)


def strict_ampere_forward(model, x, capability):
    """`>` where `>=` was meant: an A100 (8.0) gets fp16."""
    if capability < (7, 0):
        return model(x)
    dtype = torch.bfloat16 if capability > (8, 0) else torch.float16
    with torch.autocast(x.device.type, dtype=dtype):
        return model(x)


def always_autocast_forward(model, x, capability):
    dtype = torch.bfloat16 if capability >= (8, 0) else torch.float16
    with torch.autocast(x.device.type, dtype=dtype):
        return model(x)


def cast_output_forward(model, x, capability):
    if capability < (7, 0):
        return model(x)
    dtype = torch.bfloat16 if capability >= (8, 0) else torch.float16
    return model(x).to(dtype)


def left_on_forward(model, x, capability):
    if capability < (7, 0):
        return model(x)
    dtype = torch.bfloat16 if capability >= (8, 0) else torch.float16
    torch.autocast(x.device.type, dtype=dtype).__enter__()  # never exited
    return model(x)


def float_output_forward(model, x, capability):
    if capability < (7, 0):
        return model(x)
    dtype = torch.bfloat16 if capability >= (8, 0) else torch.float16
    with torch.autocast(x.device.type, dtype=dtype):
        return model(x).float()


@pytest.mark.parametrize(
    "solution", [reference_forward, enabled_flag_forward, decimal_forward, old_api_forward]
)
def test_mixed_forward_check_passes_right_answers(namespace, solution, capsys):
    _run(namespace, "01-mixed-forward-check", "mixed_forward", solution)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (half_model_forward, r"converted the model's weights to float16"),
        (cuda_only_forward, r"x is on cpu, but you ran autocast for \['cuda'\].*x.device.type"),
        (cpu_autocast_forward, r"x is on cuda, but you ran autocast for \['cpu'\].*x.device.type"),
        (course_helpers_forward, r"called the course's own pick_precision\(\)"),
        (agreeable_forward, "a subclass of torch.Tensor: return a plain torch.Tensor"),
        (fp16_everywhere_forward, r"an A100 \(8.0\), run model\(x\) under .*bfloat16"),
        (strict_ampere_forward, r"bf16 starts at 8.0 itself \(an A100\), capability >= \(8, 0\)"),
        (always_autocast_forward, "GPUs below 7.0 have no tensor cores, so they run in float32"),
        (cast_output_forward, r"ran model\(x\) in float32 and cast its output to float16"),
        (float_output_forward, "do not convert the model, x or the output yourself"),
        (left_on_forward, "autocast is still on after your function returned"),
    ],
)
def test_mixed_forward_check_names_the_mistake(namespace, solution, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _run(namespace, "01-mixed-forward-check", "mixed_forward", solution)


def dot_half_model_forward(model, x, capability):  # model.half() on every GPU with tensor cores
    if capability < (7, 0):
        return model(x)
    return model.half()(x.half())


def dot_half_output_forward(model, x, capability):  # the output cast, .half() on every GPU
    if capability < (7, 0):
        return model(x)
    return model(x).half()


def wrong_values_half_forward(model, x, capability):  # float16, but not what model(x) gives
    if capability < (7, 0):
        return model(x)
    return (model(x) + 1).half()


#: One wrong mixed_forward per conversion by hand (01 (b)), and the message naming it.
HAND_CONVERSIONS = {
    "mixed_forward model converted": [half_model_forward, dot_half_model_forward],
    "mixed_forward output cast": [cast_output_forward, dot_half_output_forward],
}


@pytest.mark.parametrize(
    ("name", "solution"),
    [(name, s) for name, solutions in HAND_CONVERSIONS.items() for s in solutions],
)
def test_mixed_forward_tells_a_converted_model_from_a_cast_output(namespace, name, solution):
    """Issue 45: model.half() and a cast output both read "run model(x) under autocast";
    each now names its own conversion, and no other message."""
    with pytest.raises(CheckFailed) as failed:
        _run(namespace, "01-mixed-forward-check", "mixed_forward", solution)
    assert messages_matching(str(failed.value), MESSAGES_01.english) == [name], str(failed.value)


@pytest.mark.slow
def test_mixed_forward_names_no_conversion_the_values_do_not_match(namespace):
    """A float16 output that is not model(x) cast is described, not blamed on a cast."""
    with pytest.raises(CheckFailed) as failed:
        _run(namespace, "01-mixed-forward-check", "mixed_forward", wrong_values_half_forward)
    found = messages_matching(str(failed.value), MESSAGES_01.english)
    assert "mixed_forward output cast" not in found, str(failed.value)
    assert "mixed_forward model converted" not in found, str(failed.value)


def test_feedback_reads_as_words_not_reprs(namespace):
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, "01-mixed-forward-check", "mixed_forward", fp16_everywhere_forward)
    assert "<" not in str(failure.value) and "PrecisionName" not in str(failure.value)


def test_an_unanswered_exercise_reads_as_not_answered(namespace):
    def unanswered(*args):
        raise NotImplementedError()

    for grade_id, name in [
        ("01-mixed-forward-check", "mixed_forward"),
        ("01-my-to-device-check", "my_to_device"),
    ]:
        with pytest.raises(NotImplementedError):
            _run(namespace, grade_id, name, unanswered)


# ----------------------------------------------------------------------------- the helpers


def test_first_difference_names_the_place_and_the_kind_of_mistake():
    Pair = namedtuple("Pair", "a b")
    want = {"x": [torch.ones(1, device="meta"), Pair(1, "s")]}
    assert first_difference({"x": [torch.ones(1, device="meta"), Pair(1, "s")]}, want) is None
    assert first_difference({"x": [torch.ones(1), Pair(1, "s")]}, want) == (
        "batch['x'][0] is a tensor on cpu; it should be on meta"
    )
    assert "should be of type Pair, but it is of type tuple" in first_difference(
        {"x": [torch.ones(1, device="meta"), (1, "s")]}, want
    )
    assert first_difference({"y": []}, want) == "batch should have the keys ['x'], not ['y']"
    assert first_difference([1, 2], [1, 3]) == "batch[1] should stay 3, but it is 2"
    assert first_difference(torch.ones(2), torch.ones(3)).startswith("batch should keep its shape")


def test_answer_or_error_reports_what_was_raised_and_lets_not_implemented_through():
    assert answer_or_error(lambda: 1 / 0).startswith("your function raised ZeroDivisionError")
    with pytest.raises(NotImplementedError):
        answer_or_error(lambda: (_ for _ in ()).throw(NotImplementedError()))


def test_record_autocast_sees_each_call_and_removes_its_hook():
    layer = nn.Linear(2, 2)
    with record_autocast(layer) as seen:
        layer(torch.ones(1, 2))
        with torch.autocast("cpu", dtype=torch.float16):
            layer(torch.ones(1, 2))
    layer(torch.ones(1, 2))  # after the block: not recorded
    assert seen == [None, torch.float16]


def no_grad_forward(model, x, capability):
    with torch.no_grad():
        return reference_forward(model, x, capability)


def test_mixed_forward_check_wants_autograd_kept(namespace):
    with pytest.raises(CheckFailed, match="must keep autograd on"):
        _run(namespace, "01-mixed-forward-check", "mixed_forward", no_grad_forward)


def test_a_right_answer_passes_after_an_earlier_answer_left_autocast_on(namespace, capsys):
    """Blind test: an answer that entered autocast and never left it (run earlier in the
    same kernel) must not fail the next, right answer; the learner is told to restart."""
    with pytest.raises(CheckFailed, match="autocast is still on after your function returned"):
        namespace["mixed_forward"] = left_on_forward
        exec(_cell(grade_id="01-mixed-forward-check"), namespace)  # no clean-up between runs
    torch.autocast("cpu", dtype=torch.float16).__enter__()  # as the leak would leave it
    try:
        _run(namespace, "01-mixed-forward-check", "mixed_forward", reference_forward)
        out = capsys.readouterr().out
        assert "a previous run left autocast on: restart the kernel" in out
        assert "all checks passed" in out
        assert not torch.is_autocast_enabled("cpu")
    finally:
        torch.set_autocast_enabled("cpu", False)


def _forward_rule(rule):
    """mixed_forward right but for its rule: ``rule(capability)`` -> fp32, fp16 or bf16."""
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}

    def mixed_forward(model, x, capability):
        picked = rule(capability)
        if picked == "fp32":
            return model(x)
        with torch.autocast(x.device.type, dtype=dtypes[picked]):
            return model(x)

    return mixed_forward


def _as_text(capability):  # "10.0" < "8.0" as text: the hidden Blackwell GPUs
    text = f"{capability[0]}.{capability[1]}"
    return "bf16" if text >= "8.0" else "fp16" if text >= "7.0" else "fp32"


#: One wrong mixed_forward per usual mistake of its precision rule (01 (b)).
MIXED_FORWARD_RULES = {
    "precision as text": _as_text,
    "precision after 8.0": lambda c: "bf16" if c > (8, 0) else "fp16" if c >= (7, 0) else "fp32",
    "precision from 7.5": lambda c: "bf16" if c >= (8, 0) else "fp16" if c >= (7, 5) else "fp32",
    "precision named GPUs only": lambda c: {(8, 0): "bf16", (7, 5): "fp16"}.get(c, "fp32"),
    "precision fp16 before Volta": lambda c: "bf16" if c >= (8, 0) else "fp16",
    "precision Ampere only": lambda c: "bf16" if c[0] == 8 else "fp16" if c >= (7, 0) else "fp32",
}


@pytest.mark.parametrize("name", list(MIXED_FORWARD_RULES))
def test_mixed_forward_feedback_names_each_rule_mistake_and_no_other(namespace, name):
    with pytest.raises(CheckFailed) as failed:
        _run(
            namespace,
            "01-mixed-forward-check",
            "mixed_forward",
            _forward_rule(MIXED_FORWARD_RULES[name]),
        )
    assert messages_matching(str(failed.value), MESSAGES_PRECISION_RULE) == [name], str(
        failed.value
    )


@pytest.mark.parametrize(
    ("grade_id", "name", "solution"),
    [
        ("01-my-to-device-check", "my_to_device", plain_dict_to_device),
        ("01-mixed-forward-check", "mixed_forward", agreeable_forward),
    ],
    ids=["OrderedDict", "Agreeable"],
)
def test_a_type_name_is_not_given_an_article_of_its_own(namespace, grade_id, name, solution):
    """Issue 45: "a OrderedDict", "a Agreeable": the messages name a type without an article
    (the article cannot follow a type name the code fills in, in every language)."""
    with pytest.raises(CheckFailed) as failure:
        _run(namespace, grade_id, name, solution)
    message = str(failure.value)
    assert "of type" in message, message
    assert not re.search(r"\ba [AEIOUaeiou]", message), message


#: Every other listed mistake of 01 (b) and the message of MESSAGES_01 that names it.
MIXED_FORWARD_MISTAKES = {
    cuda_only_forward: "mixed_forward autocast device",
    cpu_autocast_forward: "mixed_forward autocast device",
    no_grad_forward: "mixed_forward no autograd",
    fp16_everywhere_forward: "mixed_forward autocast",
    float_output_forward: "mixed_forward converted",
    left_on_forward: "mixed_forward left on",
}


@pytest.mark.parametrize("solution", list(MIXED_FORWARD_MISTAKES), ids=lambda f: f.__name__)
def test_mixed_forward_names_each_listed_mistake_and_no_other(namespace, solution):
    with pytest.raises(CheckFailed) as failed:
        _run(namespace, "01-mixed-forward-check", "mixed_forward", solution)
    found = messages_matching(str(failed.value), MESSAGES_01.english)
    assert found == [MIXED_FORWARD_MISTAKES[solution]], str(failed.value)


# ----------------------------------------------------------------------------- apart


def _apart(grade_id: str, name: str, solution) -> dict:
    """The verdict of the check cell as the grader's checker reaches it."""
    assert nb01.check_moves_batch  # the evidence's classes are loaded in the checker
    try:
        return grade_apart(NB01, grade_id, {name: solution})
    finally:
        torch.set_autocast_enabled("cpu", False)


def test_my_to_device_passes_apart(capsys):
    verdict = _apart("01-my-to-device-check", "my_to_device", reference_to_device)
    assert verdict["status"] == "completed", verdict
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (in_place_to_device, "changed the batch it was given"),
        (plain_tuple_to_device, "should be of type Pair, but it is of type tuple"),
        (top_level_only, r"batch\['extra'\]\[0\] is a tensor on cpu; it should be on meta"),
        (exact_type_to_device, r"on cpu; it should be on meta, given parameters .*isinstance"),
        (course_to_device, r"called the course's own to_device\(\)"),
        (
            no_namedtuple_to_device,  # the learner's own message is never shown
            r"^your function raised TypeError: \(your code's message\), given a namedtuple Pair",
        ),
    ],
)
def test_my_to_device_names_the_mistake_apart(solution, feedback):
    verdict = _apart("01-my-to-device-check", "my_to_device", solution)
    assert verdict["status"] == "failed" and verdict["ename"] == "CheckFailed", verdict
    assert re.search(feedback, verdict["evalue"]), verdict


class Agreeing(dict):
    """A dict equal to everything."""

    def __eq__(self, other):
        return True

    __hash__ = None


ClaimedPair = namedtuple("Pair", ["image", "label"], module="course_utils.checks.evidence.nb01")


def agreeing_to_device(batch, device):  # right values, in a dict that agrees with anything
    moved = reference_to_device(batch, device)
    return Agreeing(moved) if isinstance(moved, dict) else moved


def claimed_pair_to_device(batch, device):  # a namedtuple of its own that claims the course's
    moved = reference_to_device(batch, device)
    return ClaimedPair(*moved) if type(moved).__name__ == "Pair" else moved


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (agreeing_to_device, "batch should be of type dict, but it is of type Agreeing"),
        (claimed_pair_to_device, "batch should be of type Pair, but it is of type Pair (a "),
    ],
)
def test_my_to_device_evidence_cannot_be_forged(solution, feedback):
    verdict = _apart("01-my-to-device-check", "my_to_device", solution)
    assert verdict["status"] == "failed" and feedback in verdict["evalue"], verdict


@pytest.mark.slow
def test_mixed_forward_passes_apart(capsys):
    verdict = _apart("01-mixed-forward-check", "mixed_forward", reference_forward)
    assert verdict["status"] == "completed", verdict
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("solution", "name"),
    [
        (half_model_forward, "mixed_forward model converted"),
        (cuda_only_forward, "mixed_forward autocast device"),
        (fp16_everywhere_forward, "mixed_forward autocast"),
        (left_on_forward, "mixed_forward left on"),
    ],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_mixed_forward_names_the_mistake_apart(solution, name):
    verdict = _apart("01-mixed-forward-check", "mixed_forward", solution)
    assert verdict["status"] == "failed", verdict
    assert messages_matching(verdict["evalue"], MESSAGES_01.english) == [name], verdict


def test_mixed_forward_names_the_rule_and_the_course_helper_apart():
    verdict = _apart("01-mixed-forward-check", "mixed_forward", strict_ampere_forward)
    assert messages_matching(verdict["evalue"], MESSAGES_PRECISION_RULE) == [
        "precision after 8.0"
    ], verdict
    verdict = _apart("01-mixed-forward-check", "mixed_forward", course_helpers_forward)
    assert "called the course's own pick_precision()" in verdict["evalue"], verdict


class ClaimedLooksLikeCuda(torch.Tensor):
    """A tensor class of the notebook's that says it is the course's LooksLikeCuda."""


ClaimedLooksLikeCuda.__module__ = "course_utils.checks.evidence.nb01"
ClaimedLooksLikeCuda.__name__ = ClaimedLooksLikeCuda.__qualname__ = "LooksLikeCuda"


def claimed_cuda_forward(model, x, capability):  # right, but for its output's class
    out = reference_forward(model, x, capability)
    return out.as_subclass(ClaimedLooksLikeCuda) if x.device.type == "cuda" else out


@pytest.mark.parametrize(
    ("solution", "kind"),
    [(agreeable_forward, "Agreeable"), (claimed_cuda_forward, "LooksLikeCuda")],
)
def test_mixed_forward_evidence_cannot_be_forged(solution, kind):
    verdict = _apart("01-mixed-forward-check", "mixed_forward", solution)
    assert verdict["status"] == "failed", verdict
    assert f"is of type {kind}, a subclass of torch.Tensor" in verdict["evalue"], verdict


def test_an_unanswered_exercise_reads_as_not_answered_apart():
    def unanswered(*args):
        raise NotImplementedError()

    for grade_id, name in [
        ("01-mixed-forward-check", "mixed_forward"),
        ("01-my-to-device-check", "my_to_device"),
    ]:
        verdict = _apart(grade_id, name, unanswered)
        assert verdict["ename"] == "NotImplementedError", verdict
