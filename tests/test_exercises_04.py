"""Notebook 04's exercise (c), a mixed-precision step with clipping: its check passes right
answers written in other orders (``zero_grad`` at the start or at the end of the step,
``set_to_none`` either way) and fails the usual mistakes with feedback that names them.

The check cell is run as the grader runs it, with the learner's ``amp_step`` defined in the
same namespace.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path

import nbformat
import pytest
import torch
from notebook_cells import grade_apart, grade_cell, messages_matching, run_cells
from torch import nn

from course_utils.checks.core import check, check_close, passed
from course_utils.checks.nb04 import MESSAGES_04, MESSAGES_04A, run_amp_step_against_fp32
from course_utils.feedback import CheckFailed
from course_utils.footprint import optimizer_state_bytes

NB04 = Path(__file__).resolve().parents[1] / "notebooks" / "04_memory_efficient_models.ipynb"
ce = nn.functional.cross_entropy


def _grade_cell(grade_id: str) -> str:
    return grade_cell(NB04, grade_id)


def _run_check(amp_step) -> None:
    namespace = {
        "torch": torch,
        "nn": nn,
        "check": check,
        "check_close": check_close,
        "passed": passed,
        "run_amp_step_against_fp32": run_amp_step_against_fp32,
        "amp_step": amp_step,
    }
    exec(compile(_grade_cell("04-amp-step-check"), "exercise (c) check", "exec"), namespace)


def _forward_loss(model, x, y, dtype):
    with torch.autocast(x.device.type, dtype=dtype):
        return ce(model(x), y)


def _clip_and_step(model, opt, scaler, loss, max_norm):
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()


# ----------------------------------------------------------------- right answers


def zero_grad_at_the_end(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    _clip_and_step(model, opt, scaler, loss, max_norm)
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def zero_grad_at_the_start(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    opt.zero_grad()  # the common idiom: clear first, then forward and backward
    loss = _forward_loss(model, x, y, dtype)
    _clip_and_step(model, opt, scaler, loss, max_norm)
    return loss.detach()


def zeros_kept_at_the_end(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    _clip_and_step(model, opt, scaler, loss, max_norm)
    opt.zero_grad(set_to_none=False)
    return loss.detach()


def model_zero_grad_and_keywords(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    model.zero_grad(set_to_none=False)
    with torch.autocast(device_type=x.device.type, dtype=dtype, enabled=True):
        outputs = model(x)
    loss = ce(outputs.float(), y)  # the loss outside autocast, in float32: also allowed
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    params = [p for group in opt.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
    scaler.step(opt)
    scaler.update()
    return loss.item()  # a float is detached too


def grads_set_to_none_by_hand(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    for p in model.parameters():
        p.grad = None
    loss = _forward_loss(model, x, y, dtype)
    _clip_and_step(model, opt, scaler, loss, max_norm)
    return loss.detach()


def clip_scaled_to_scaled_norm(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    """04-N8: clip the scaled gradients to max_norm * scale, no unscale_: the same step."""
    loss = _forward_loss(model, x, y, dtype)
    scaler.scale(loss).backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm * scaler.get_scale())
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return loss.detach()


RIGHT = [
    clip_scaled_to_scaled_norm,
    zero_grad_at_the_end,
    zero_grad_at_the_start,
    zeros_kept_at_the_end,
    model_zero_grad_and_keywords,
    grads_set_to_none_by_hand,
]


@pytest.mark.slow
@pytest.mark.parametrize("answer", RIGHT, ids=lambda f: f.__name__)
def test_right_answers_in_any_order_pass(answer, capsys):
    _run_check(answer)
    assert "Exercise (c): all checks passed" in capsys.readouterr().out


def test_the_notebook_solution_passes(capsys):
    cells = {
        c.metadata.get("nbgrader", {}).get("grade_id"): c.source
        for c in nbformat.read(NB04, as_version=4).cells
    }
    namespace = {"torch": torch, "nn": nn}
    exec(cells["04-amp-step"], namespace)
    _run_check(namespace["amp_step"])
    assert "all checks passed" in capsys.readouterr().out


# ----------------------------------------------------------------- wrong answers


def no_zero_grad(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    _clip_and_step(model, opt, scaler, loss, max_norm)
    return loss.detach()


def no_update(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    opt.zero_grad()
    return loss.detach()


def autocast_around_backward(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    with torch.autocast(x.device.type, dtype=dtype):
        loss = ce(model(x), y)
        scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return loss.detach()


def no_autocast(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = ce(model(x), y)
    _clip_and_step(model, opt, scaler, loss, max_norm)
    opt.zero_grad()
    return loss.detach()


def bf16_always(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, torch.bfloat16)  # ignores dtype
    _clip_and_step(model, opt, scaler, loss, max_norm)
    opt.zero_grad()
    return loss.detach()


def clip_before_unscale(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    scaler.scale(loss).backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return loss.detach()


def no_clipping(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return loss.detach()


def clip_by_value(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_value_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return loss.detach()


def clip_to_a_hard_coded_norm(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the argument ignored
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return loss.detach()


def clip_then_half_the_step(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype) / 2  # a stray factor: no usual mistake matches
    _clip_and_step(model, opt, scaler, loss, max_norm / 2)
    opt.zero_grad()
    return loss.detach() * 2


def unscaled_backward(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    loss.backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return loss.detach()


def optimizer_step_itself(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    scaler.update()
    opt.zero_grad()
    return loss.detach()


def optimizer_step_without_unscale(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    scaler.scale(loss).backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    scaler.update()
    opt.zero_grad()
    return loss.detach()


def zero_grad_before_step(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    scaler.scale(loss).backward()
    opt.zero_grad()  # the gradients are gone before the step uses them
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    return loss.detach()


def loss_with_its_graph(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    loss = _forward_loss(model, x, y, dtype)
    _clip_and_step(model, opt, scaler, loss, max_norm)
    opt.zero_grad()
    return loss


WRONG = [
    (no_zero_grad, "added to the first step's gradients: call opt.zero_grad"),
    (no_update, "call scaler.update"),
    (autocast_around_backward, "leave the autocast block before backward"),
    (no_autocast, "inside torch.autocast"),
    (bf16_always, "ran in bfloat16 though the step was given dtype=torch.float16"),
    (
        clip_before_unscale,
        "if you had clipped the scaled gradients .* call "
        "scaler.unscale_\\(optimizer\\) before clip_grad_norm_",
    ),
    (no_clipping, "the weights moved as a step without clipping"),
    (clip_to_a_hard_coded_norm, "with the max_norm you were given"),
    (clip_by_value, "clips each gradient's values \\(clip_grad_value_\\)"),
    (
        clip_then_half_the_step,
        "in the direction of a float32 step with clipping but 0.50 times as far",
    ),
    (unscaled_backward, "backward on scaler.scale\\(loss\\)"),
    (optimizer_step_itself, "must be skipped"),
    (optimizer_step_without_unscale, "never optimizer.step\\(\\) itself"),
    (zero_grad_before_step, "never between backward and step"),
    (loss_with_its_graph, "return the loss detached"),
]


@pytest.mark.parametrize(("answer", "feedback"), WRONG, ids=lambda v: getattr(v, "__name__", ""))
def test_usual_mistakes_fail_with_feedback_that_names_them(answer, feedback):
    with pytest.raises(CheckFailed, match=feedback) as failure:
        _run_check(answer)
    assert "<" not in str(failure.value)  # plain words, no repr


def bf16_without_a_scaler(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    """bfloat16 needs no scaler, so none is used: but the step was given float16."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        loss = ce(model(x), y)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    opt.zero_grad()
    return loss.detach()


#: Each message of exercise 04 (c) that names a mistake, and the answers that make it.
AMP_STEP_MISTAKES = {
    "amp_step bfloat16 always": [bf16_always, bf16_without_a_scaler],
    "amp_step no autocast": [no_autocast],
    "amp_step update scaled": [clip_then_half_the_step],
    "amp_step clipped scaled": [clip_before_unscale],
    "amp_step no clipping": [no_clipping],
    "amp_step clipped values": [clip_by_value],
    "amp_step scale is None": [unscaled_backward],
    "amp_step no inf checks": [zero_grad_before_step],
    "amp_step update before step": [optimizer_step_without_unscale],
}


@pytest.mark.parametrize(
    ("name", "answer"),
    [(name, a) for name, answers in AMP_STEP_MISTAKES.items() for a in answers],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_amp_step_feedback_names_each_mistake_and_no_other(name, answer):
    """Issue 45: bfloat16 everywhere read as "no autocast", a half-sized step as a generic
    distance; each message now names its own mistake, and only that one."""
    with pytest.raises(CheckFailed) as failed:
        _run_check(answer)
    assert messages_matching(str(failed.value), MESSAGES_04) == [name], str(failed.value)


def test_amp_step_describes_a_forward_dtype_no_mistake_gives():
    """bfloat16 is named a mistake only when the step was given another dtype; a dtype no
    usual mistake gives (float64) is described, not blamed on a cause."""
    run = run_amp_step_against_fp32(zero_grad_at_the_end)
    asked_bf16 = dataclasses.replace(run, forward_dtypes=[torch.bfloat16], dtype=torch.bfloat16)
    assert messages_matching(asked_bf16.forward_feedback(), MESSAGES_04) == [
        "amp_step forward dtype"
    ]
    double = dataclasses.replace(run, forward_dtypes=[torch.float64])
    message = double.forward_feedback()
    assert messages_matching(message, MESSAGES_04) == ["amp_step forward dtype"], message
    assert "float64" in message


# ------------------------------------------------------------------ (a) and (b), issue 35


@pytest.fixture(scope="module")
def nb04() -> dict:
    return run_cells(NB04, ("nb04-03", "nb04-03b"))


def adam_four_bytes(model):  # issue 35: 4 bytes per element assumed (every checked model fp32)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return 2 * 4 * sum(p.numel() for p in trainable) + 4 * len(trainable)


def adam_element_size(model):  # right, written another way
    trainable = [p for p in model.parameters() if p.requires_grad]
    return sum(2 * p.nelement() * p.element_size() + 4 for p in trainable)


def rounded_batch(budget, static, per_sample):  # issue 35: rounding where the floor is asked
    return max(0, round((budget - static) / per_sample))


def split_floor_batch(budget, static, per_sample):  # issue 35: the floor split in two
    return max(0, budget // per_sample - static // per_sample)


def one_floor_batch(budget, static, per_sample):  # right, written another way
    return max(0, math.floor((budget - static) / per_sample))


def _check_a_b(nb04, grade_id, name, answer):
    namespace = dict(nb04, **{name: answer})
    exec(_grade_cell(grade_id), namespace)


@pytest.mark.parametrize(
    ("grade_id", "name", "answer"),
    [
        ("04-adam-state-check", "adam_state_bytes", adam_element_size),
        ("04-batch-budget-check", "largest_batch", one_floor_batch),
    ],
)
def test_right_arithmetic_answers_pass(nb04, grade_id, name, answer, capsys):
    _check_a_b(nb04, grade_id, name, answer)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("grade_id", "name", "answer", "feedback"),
    [
        (
            "04-adam-state-check",
            "adam_state_bytes",
            adam_four_bytes,
            r"a bfloat16 nn.Linear\(10, 5\) .* as if every element took 4 bytes",
        ),
        ("04-batch-budget-check", "largest_batch", rounded_batch, r"rounded to the nearest"),
        (
            "04-batch-budget-check",
            "largest_batch",
            split_floor_batch,
            r"each divided by per_sample first",
        ),
    ],
)
def test_arithmetic_mistakes_are_named(nb04, grade_id, name, answer, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _check_a_b(nb04, grade_id, name, answer)


def _batch_as(formula):
    """largest_batch written as ``formula(budget, static, per_sample)``."""

    def largest_batch(budget, static, per_sample):
        return formula(budget, static, per_sample)

    return largest_batch


def _strict_loop(budget, static, per_sample):  # a strict comparison: the exact fit missed
    n = 0
    while static + (n + 1) * per_sample < budget:
        n += 1
    return n


def _one_past_loop(budget, static, per_sample):  # counts the first batch that does not fit
    n = 0
    while static + n * per_sample <= budget:
        n += 1
    return n


#: One wrong largest_batch per usual mistake of 04 (b), and the message that must name it.
LARGEST_BATCH_MISTAKES = {
    "largest_batch strict": _strict_loop,
    "largest_batch one too many": _one_past_loop,
    "largest_batch precedence": _batch_as(lambda b, s, p: max(0, b - s // p)),
    "largest_batch no static": _batch_as(lambda b, s, p: b // p),
    "largest_batch static per sample": _batch_as(lambda b, s, p: b // (s + p)),
    "largest_batch rounded": rounded_batch,
    "largest_batch ceiling": _batch_as(lambda b, s, p: max(0, math.ceil((b - s) / p))),
    "largest_batch floored each": split_floor_batch,
    "largest_batch negative": _batch_as(lambda b, s, p: (b - s) // p),
    "largest_batch not a whole number": _batch_as(lambda b, s, p: max(0, (b - s) // p) * 1.0),
    "largest_batch wrong": _batch_as(lambda b, s, p: max(0, (b - s) // p - 2)),
    "largest_batch raised": _batch_as(lambda b, s, p: (b - s) // p if b > s else [][0]),
}


@pytest.mark.parametrize("name", list(LARGEST_BATCH_MISTAKES))
def test_largest_batch_feedback_names_each_mistake_and_no_other(nb04, name):
    with pytest.raises(CheckFailed) as failed:
        _check_a_b(nb04, "04-batch-budget-check", "largest_batch", LARGEST_BATCH_MISTAKES[name])
    assert messages_matching(str(failed.value), MESSAGES_04) == [name], str(failed.value)
    assert "strict?" not in str(failed.value)  # the old first guard, asked of every mistake


def _adam_as(formula):
    """adam_state_bytes as ``formula(trainable, every)`` over the model's parameters."""

    def adam_state_bytes(model):
        every = list(model.parameters())
        return formula([p for p in every if p.requires_grad], every)

    return adam_state_bytes


def _bytes(params):
    return sum(p.numel() * p.element_size() for p in params)


#: One wrong adam_state_bytes per usual mistake of 04 (a), and the message that must name it.
ADAM_STATE_MISTAKES = {
    "adam_state no step": _adam_as(lambda t, e: 2 * _bytes(t)),
    "adam_state one step": _adam_as(lambda t, e: 2 * _bytes(t) + 4),
    "adam_state four bytes": adam_four_bytes,
    "adam_state one average": _adam_as(lambda t, e: _bytes(t) + 4 * len(t)),
    "adam_state frozen counted": _adam_as(lambda t, e: 2 * _bytes(e) + 4 * len(e)),
    "adam_state gradients counted": _adam_as(lambda t, e: 3 * _bytes(t) + 4 * len(t)),
    "adam_state elements": _adam_as(lambda t, e: 2 * sum(p.numel() for p in t) + len(t)),
    "adam_state wrong": _adam_as(lambda t, e: 2 * _bytes(t) + 8 * len(t)),
    "adam_state not a number": _adam_as(lambda t, e: f"{2 * _bytes(t) + 4 * len(t)} bytes"),
    "adam_state raised": _adam_as(lambda t, e: 2 * _bytes(t) + 4 * len(t) / (len(e) - 4)),
}


@pytest.mark.parametrize("name", list(ADAM_STATE_MISTAKES))
def test_adam_state_feedback_names_each_mistake_and_no_other(nb04, name):
    with pytest.raises(CheckFailed) as failed:
        _check_a_b(nb04, "04-adam-state-check", "adam_state_bytes", ADAM_STATE_MISTAKES[name])
    assert messages_matching(str(failed.value), MESSAGES_04A) == [name], str(failed.value)
    assert "expected" not in str(failed.value)  # the old message gave the layer's bytes


# ------------------------------------------------------- issue 35 leftovers: (a)


def _stepped_adam(model):
    """A real Adam over a copy of ``model``'s trainable parameters, after one step."""
    trainable = [p for p in copy.deepcopy(model).parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable)
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return optimizer


def adam_by_course_counter(model):  # the blind trial's: a real Adam, the course's counter
    return optimizer_state_bytes(_stepped_adam(model))


def adam_by_course_formula(model):  # the course's own expected value, through its module
    import course_utils.footprint

    return course_utils.footprint.expected_optimizer_state_bytes(model, "adam")


def adam_one_counter(model):  # one step counter for the whole model
    trainable = [p for p in model.parameters() if p.requires_grad]
    return 2 * sum(p.numel() * p.element_size() for p in trainable) + 4


def adam_real_optimizer_counted_by_hand(model):  # right: a real Adam, counted by hand
    optimizer = _stepped_adam(model)
    return sum(
        t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
    )


@pytest.mark.parametrize("answer", [adam_by_course_counter, adam_by_course_formula])
def test_adam_state_from_the_course_helpers_fails(nb04, answer):
    with pytest.raises(CheckFailed, match="called the course's own"):
        _check_a_b(nb04, "04-adam-state-check", "adam_state_bytes", answer)
    assert adam_by_course_counter(nn.Linear(10, 5)) == 448  # the helpers work again after


def test_one_step_counter_for_the_model_is_named(nb04):
    message = (
        r"one step counter for the model: "
        r"Adam keeps one 4-byte step for each parameter tensor"
    )
    with pytest.raises(CheckFailed, match=message):
        _check_a_b(nb04, "04-adam-state-check", "adam_state_bytes", adam_one_counter)


def test_adam_state_counted_on_a_real_optimizer_by_hand_passes(nb04, capsys):
    _check_a_b(nb04, "04-adam-state-check", "adam_state_bytes", adam_real_optimizer_counted_by_hand)
    assert "all checks passed" in capsys.readouterr().out


# ------------------------- graded apart: the evidence beside the answer, the verdict apart


def _reference_answer(name: str):
    """The notebook's own answer ``name`` (its solution cell), defined in a namespace of its
    own."""
    cells = {
        c.metadata.get("nbgrader", {}).get("grade_id"): c.source
        for c in nbformat.read(NB04, as_version=4).cells
    }
    namespace = {"torch": torch, "nn": nn}
    exec(cells[{"adam_state_bytes": "04-adam-state", "amp_step": "04-amp-step"}[name]], namespace)
    return namespace[name]


def _apart(nb04, grade_id, name, answer) -> dict:
    return grade_apart(NB04, grade_id, dict(nb04, **{name: answer}))


class Always(int):
    """An int equal to everything (a number that would pass any comparison)."""

    __eq__ = lambda self, other: True  # noqa: E731
    __ne__ = lambda self, other: False  # noqa: E731
    __hash__ = int.__hash__


def adam_raises(model):
    raise ValueError("no Adam here")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (None, None),  # the notebook's answer
        (adam_real_optimizer_counted_by_hand, None),
        (adam_four_bytes, r"a bfloat16 nn.Linear\(10, 5\) .* as if every element took 4 bytes"),
        (adam_one_counter, "one step counter for the model"),
        (adam_by_course_counter, "called the course's own optimizer_state_bytes()"),
        (adam_by_course_formula, "called the course's own expected_optimizer_state_bytes()"),
        (adam_raises, r"^your function raised ValueError: \(your code's message\) \(on a float32"),
        (lambda model: Always(0), r"should be of type int, but it is of type Always$"),
    ],
    ids=[
        "reference",
        "by-hand",
        "four-bytes",
        "one-counter",
        "course-counter",
        "course-formula",
        "raises",
        "lying-int",
    ],
)
def test_adam_state_graded_apart(nb04, answer, feedback):
    """04 (a) across the grader's boundary: the answer runs in the learner's runtime with
    the course's counters refused there; the verdict, and every expected value, is the
    checker's. A value that equals anything fails: the evidence says its type, and it never
    reaches the comparison."""
    verdict = _apart(
        nb04,
        "04-adam-state-check",
        "adam_state_bytes",
        answer or _reference_answer("adam_state_bytes"),
    )
    if feedback is None:
        assert verdict["status"] == "completed", verdict
        return
    assert verdict["status"] == "failed" and verdict["ename"] == "CheckFailed", verdict
    assert re.search(feedback, verdict["evalue"]), verdict


def _step_and_lie(model, opt, scaler, x, y, dtype=torch.float16, max_norm=1.0):
    """No step at all, and a loss equal to everything."""
    return Always(0)


@pytest.mark.parametrize(
    ("answer", "name"),
    [
        (None, None),  # the notebook's answer
        (zero_grad_at_the_start, None),
        (no_clipping, "amp_step no clipping"),
        (clip_before_unscale, "amp_step clipped scaled"),
        (unscaled_backward, "amp_step scale is None"),
        (no_autocast, "amp_step no autocast"),
        (optimizer_step_itself, ""),  # the overflowing step was not skipped
        (loss_with_its_graph, ""),
        (_step_and_lie, ""),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_amp_step_graded_apart(nb04, answer, name):
    """04 (c) across the grader's boundary: the two steps, the hooks and the scaler run in
    the learner's runtime; the float32 reference and each clipping mistake's update are
    computed in the checker from the same seeded model and batches."""
    verdict = _apart(nb04, "04-amp-step-check", "amp_step", answer or _reference_answer("amp_step"))
    if name is None:
        assert verdict["status"] == "completed", verdict
        return
    assert verdict["status"] == "failed" and verdict["ename"] == "CheckFailed", verdict
    if name:
        assert messages_matching(verdict["evalue"], MESSAGES_04) == [name], verdict
    if answer is unscaled_backward:  # PyTorch's words are the runtime's: never shown
        assert verdict["evalue"].endswith("(PyTorch raised: (your code's message))"), verdict
    if answer is optimizer_step_itself:
        assert "must be skipped" in verdict["evalue"], verdict
    if answer is loss_with_its_graph:
        assert "return the loss detached" in verdict["evalue"], verdict
    if answer is _step_and_lie:
        assert "did not move" in verdict["evalue"] or "autocast" in verdict["evalue"], verdict
