"""Exercise (a) of notebook 05: its check passes right answers written several ways and
fails the usual mistakes with feedback that names them.

The check cell runs as the grader runs it: after the notebook's imports and knobs, with the
learner's ``MyModule`` defined in the same namespace.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from notebook_cells import grade_apart, grade_cell, messages_matching, run_cells
from torch import nn

from course_utils.checks.nb01 import MESSAGES_PRECISION_RULE
from course_utils.checks.nb05 import MESSAGES_05
from course_utils.device import pick_precision
from course_utils.feedback import CheckFailed
from course_utils.lightning import lightning_precision

NB05 = Path(__file__).resolve().parent.parent / "notebooks" / "05_lightning.ipynb"


def _grade_cell(grade_id: str) -> str:
    return grade_cell(NB05, grade_id)


@pytest.fixture(scope="module")
def nb05() -> dict:
    return run_cells(NB05, ("nb05-04", "nb05-04b", "nb05-05", "nb05-05b"))


def _check(nb05: dict, module_class: type) -> None:
    namespace = dict(nb05, MyModule=module_class)
    exec(_grade_cell("05-training-step-check"), namespace)


class _Base(pl.LightningModule):
    def __init__(self, model, lr):
        super().__init__()
        self.model, self.lr = model, lr

    def loss(self, batch):
        inputs, targets = batch
        return nn.functional.cross_entropy(self.model(inputs), targets)


class Right(_Base):
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class RightDictWithScheduler(Right):
    def training_step(self, batch, batch_idx):
        loss = nn.CrossEntropyLoss()(self.model(batch[0]), batch[1])
        self.log("train_loss", loss, on_step=True, prog_bar=True)
        return {"loss": loss}

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class RightLists(Right):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.0)], []


class StepAndEpoch(Right):  # 05-N1: Lightning's documented idiom
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss


class WeightDecay(Right):  # 05-N2
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, weight_decay=1e-4)


class IgnoresLr(Right):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Momentum(Right):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Adam(Right):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class ReturnsNothing(Right):
    def training_step(self, batch, batch_idx):
        self.log("train_loss", self.loss(batch))


class ReturnsItem(Right):
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss.item()


class ReturnsDetached(Right):
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss.detach()


class NoLog(Right):
    def training_step(self, batch, batch_idx):
        return self.loss(batch)


class WrongLoss(Right):
    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = nn.functional.nll_loss(self.model(inputs), targets)  # no log_softmax
        self.log("train_loss", loss)
        return loss


@pytest.mark.parametrize("answer", [Right, RightDictWithScheduler, RightLists, StepAndEpoch])
def test_right_answers_pass(nb05, answer, capsys):
    _check(nb05, answer)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (IgnoresLr, "self.lr"),
        (Momentum, "momentum"),
        (Adam, "torch.optim.SGD, not Adam"),
        (ReturnsNothing, "returns nothing"),
        (ReturnsItem, "loss tensor itself"),
        (ReturnsDetached, "loss tensor itself"),
        (NoLog, 'self.log("train_loss"'),
        (WrongLoss, "nll_loss of the raw logits, without log_softmax"),
        (WeightDecay, "leave out weight_decay (yours is 0.0001"),
    ],
)
def test_wrong_answers_are_told_their_mistake(nb05, answer, feedback):
    with pytest.raises(CheckFailed, match=None) as failure:
        _check(nb05, answer)
    assert feedback in str(failure.value), str(failure.value)


# ----------------------------------------------------------------------- (c), issue 35


def _resume(every, lost_at):
    return (lost_at // every) * every if lost_at % every else lost_at - every


def _check_c(nb05, wasted) -> None:
    namespace = dict(
        nb05, resume_step=_resume, wasted=wasted, saved_at=_resume(5, 7), steps_per_epoch=5
    )
    exec(_grade_cell("05-resume-step-check"), namespace)


def test_wasted_steps_written_another_way_pass(nb05, capsys):
    _check_c(nb05, lambda every, lost_at: lost_at - _resume(every, lost_at))
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wasted", "feedback"),
    [
        (
            lambda every, lost_at: lost_at % every,
            r"wasted\(4, 8\) gave 0: the checkpoint of step 8",
        ),
        (
            lambda every, lost_at: every - lost_at % every,
            r"wasted\(4, 3\) gave 1: nothing was saved",
        ),
    ],
    ids=["remainder", "every-minus-remainder"],
)
def test_wasted_steps_are_checked_at_and_between_checkpoints(nb05, wasted, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _check_c(nb05, wasted)


# ------------------------------------------------------- issue 35 leftovers: (a), (b), (c)


class EpochOnly(Right):  # Lightning's on_epoch logging alone: the epoch's mean is logged
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss


class ManualBackward(Right):  # Lightning runs backward itself: a second one fails
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        loss.backward()
        self.log("train_loss", loss)
        return loss


class ManualStep(Right):  # the whole step by hand, as in a plain loop
    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = self.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        self.log("train_loss", loss)
        return loss


class LogsDoubled(Right):  # logs another number than the loss it returns
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", 2 * loss, on_step=False, on_epoch=True)
        return loss


def test_epoch_only_logging_passes(nb05, capsys):
    _check(nb05, EpochOnly)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (ManualBackward, "calls backward() itself: with automatic optimization"),
        (ManualStep, "calls self.optimizers(): with automatic optimization"),
        (LogsDoubled, "the mean of the 3 steps' losses"),
    ],
)
def test_lightning_mistakes_are_named(nb05, answer, feedback):
    with pytest.raises(CheckFailed) as failure:
        _check(nb05, answer)
    assert feedback in str(failure.value), str(failure.value)


def _check_b(nb05, precision_flag) -> None:
    exec(_grade_cell("05-precision-flag-check"), dict(nb05, precision_flag=precision_flag))


def flag_by_tuples(capability):  # the reference's way
    if capability >= (8, 0):
        return "bf16-mixed"
    return "16-mixed" if capability >= (7, 0) else "32-true"


def flag_by_major(capability):  # right, written another way
    major, _ = capability
    return {True: "bf16-mixed"}.get(major >= 8) or ("16-mixed" if major >= 7 else "32-true")


@pytest.mark.parametrize("answer", [flag_by_tuples, flag_by_major])
def test_precision_flags_written_other_ways_pass(nb05, answer, capsys):
    _check_b(nb05, answer)
    assert "all checks passed" in capsys.readouterr().out


def flag_by_course_helpers(capability):  # the blind trial's: the course's own rule
    return lightning_precision(pick_precision("cuda", capability=capability))


def flag_by_module_attribute(capability):  # the same, reached through the module
    import course_utils.device
    import course_utils.lightning

    chosen = course_utils.device.pick_precision("cuda", capability=capability)
    return course_utils.lightning.LIGHTNING_PRECISION[chosen.name]


def flag_by_support(capability):  # the course's precision_support table
    from course_utils.device import precision_support

    support = precision_support(capability)
    if support.bf16 == "native":
        return "bf16-mixed"
    return "16-mixed" if support.fp16_tensor_cores else "32-true"


@pytest.mark.parametrize(
    "answer", [flag_by_course_helpers, flag_by_module_attribute, flag_by_support]
)
def test_precision_flag_from_the_course_helpers_fails(nb05, answer):
    with pytest.raises(CheckFailed, match="called the course's own"):
        _check_b(nb05, answer)
    # the helpers work again after the check
    assert lightning_precision(pick_precision("cuda", capability=(8, 0))) == "bf16-mixed"


def _resume_loop(every, lost_at):  # right, written another way: walk the checkpoints
    saved = 0
    while saved + every < lost_at:
        saved += every
    return saved


def _resume_ceil(every, lost_at):  # right: the last multiple strictly below lost_at
    return math.ceil(lost_at / every) * every - every


def _check_resume(nb05, resume_step, wasted=None) -> None:
    wasted = wasted or (lambda every, lost_at: lost_at - resume_step(every, lost_at))
    namespace = dict(nb05, resume_step=resume_step, wasted=wasted, saved_at=4, steps_per_epoch=4)
    exec(_grade_cell("05-resume-step-check"), namespace)


@pytest.mark.parametrize("answer", [_resume, _resume_loop, _resume_ceil])
def test_resume_steps_written_other_ways_pass(nb05, answer, capsys):
    _check_resume(nb05, answer)
    assert "all checks passed" in capsys.readouterr().out


def _hard_coded(every, lost_at):  # the blind trial's: the visible cases, then a guess
    return {(4, 6): 4, (4, 3): 0, (4, 8): 4, (10, 25): 20, (10, 23): 20, (10, 20): 10}.get(
        (every, lost_at), 0 if lost_at <= every else every
    )


def _hard_coded_wasted(every, lost_at):
    return {(10, 25): 5, (10, 23): 3, (10, 20): 10}.get((every, lost_at), 1)


@pytest.mark.parametrize(
    ("resume_step", "wasted", "feedback"),
    [
        (_hard_coded, None, r"resume_step\(7, 30\) gave 7, a checkpoint older than the newest"),
        (_resume, _hard_coded_wasted, r"wasted\(4, 6\) gave 1: count the steps trained again"),
        (lambda every, lost_at: lost_at // every * every + 1, None, "not one"),
        (lambda every, lost_at: lost_at - every, None, "multiples of 4"),
        (
            lambda every, lost_at: max(0, lost_at // every * every - every),
            None,
            r"resume_step\(4, 6\) gave 0, a checkpoint older",
        ),
        (lambda every, lost_at: lost_at // every * every, None, "but the disconnect came first"),
    ],
    ids=[
        "hard-coded",
        "hard-coded-wasted",
        "after-checkpoint",
        "minus-every",
        "one-too-old",
        "lost-step-saved",
    ],
)
def test_resume_step_mistakes_are_named(nb05, resume_step, wasted, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _check_resume(nb05, resume_step, wasted)


def test_hard_coded_resume_steps_fail_without_the_hidden_cases(nb05):
    """The student version has no hidden cases: the intervals the check walks catch it."""
    source = re.sub(
        r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n",
        "",
        _grade_cell("05-resume-step-check"),
        flags=re.DOTALL,
    )
    assert "(7, 30)" not in source
    namespace = dict(
        nb05,
        resume_step=_hard_coded,
        saved_at=4,
        steps_per_epoch=4,
        wasted=lambda every, lost_at: lost_at - _hard_coded(every, lost_at),
    )
    with pytest.raises(CheckFailed, match=r"resume_step\(1, 3\) gave 1, a checkpoint older"):
        exec(source, namespace)


def _flag_rule(rule):
    """precision_flag written as ``rule(capability)`` -> "fp32", "fp16" or "bf16"."""
    flags = {"fp32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}

    def precision_flag(capability):
        return flags[rule(capability)]

    return precision_flag


def _as_text(capability):  # "10.0" < "8.0" as text
    text = f"{capability[0]}.{capability[1]}"
    return "bf16" if text >= "8.0" else "fp16" if text >= "7.0" else "fp32"


#: One wrong precision_flag per usual mistake of 05 (b), and the message that must name it.
PRECISION_FLAG_MISTAKES = {
    "precision as text": _flag_rule(_as_text),
    "precision after 8.0": _flag_rule(
        lambda c: "bf16" if c > (8, 0) else "fp16" if c >= (7, 0) else "fp32"
    ),
    "precision from 7.5": _flag_rule(
        lambda c: "bf16" if c >= (8, 0) else "fp16" if c >= (7, 5) else "fp32"
    ),
    "precision named GPUs only": _flag_rule(
        lambda c: {(8, 0): "bf16", (7, 5): "fp16"}.get(tuple(c), "fp32")
    ),
    "precision fp16 before Volta": _flag_rule(lambda c: "bf16" if c >= (8, 0) else "fp16"),
    "precision Ampere only": _flag_rule(
        lambda c: "bf16" if c[0] == 8 else "fp16" if c >= (7, 0) else "fp32"
    ),
    "precision wrong": _flag_rule(
        lambda c: "bf16" if c >= (8, 0) and c != (8, 6) else ("fp16" if c >= (7, 0) else "fp32")
    ),
}


@pytest.mark.parametrize("name", list(PRECISION_FLAG_MISTAKES))
def test_precision_flag_feedback_names_each_mistake_and_no_other(nb05, name):
    with pytest.raises(CheckFailed) as failed:
        _check_b(nb05, PRECISION_FLAG_MISTAKES[name])
    assert messages_matching(str(failed.value), MESSAGES_PRECISION_RULE) == [name], str(
        failed.value
    )
    assert "bf16-mixed" not in str(failed.value).split("got")[1]  # never the expected flag


class LabelSmoothing(Right):  # a habit from other courses: not the plain loop's loss
    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = nn.functional.cross_entropy(self.model(inputs), targets, label_smoothing=0.1)
        self.log("train_loss", loss)
        return loss


def test_label_smoothing_is_named_not_told_as_a_logging_problem(nb05):
    with pytest.raises(CheckFailed) as failure:
        _check(nb05, LabelSmoothing)
    assert messages_matching(str(failure.value), MESSAGES_05) == ["label smoothing"]
    assert "the logged" not in str(failure.value)


class SummedLoss(Right):  # not the batch's cross-entropy, and logged as returned
    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = nn.functional.cross_entropy(self.model(inputs), targets, reduction="sum")
        self.log("train_loss", loss)
        return loss


@pytest.mark.parametrize(
    ("answer", "name"),
    [(WrongLoss, "loss nll on logits"), (SummedLoss, "loss not cross-entropy")],
    ids=["nll-on-logits", "summed"],
)
def test_a_wrong_loss_logged_as_returned_is_named_not_told_as_a_logging_problem(nb05, answer, name):
    """Issue 45: a training_step that logs exactly the loss it returns, a loss that is not
    the batch's cross-entropy, is told about the loss, never about what it logs."""
    with pytest.raises(CheckFailed) as failure:
        _check(nb05, answer)
    assert messages_matching(str(failure.value), MESSAGES_05) == [name], str(failure.value)
    assert "the logged" not in str(failure.value)


def test_lost_at_itself_is_told_a_checkpoint_comes_only_every_n_steps(nb05):
    """Issue 45: resume_step(4, 6) giving 6 is told that 6 is no multiple of 4 (no checkpoint
    was due at step 6), not that step 6's checkpoint was lost, and never the step to resume."""
    with pytest.raises(CheckFailed) as failure:
        _check_resume(nb05, lambda every, lost_at: lost_at)
    message = str(failure.value)
    named = set(messages_matching(message, MESSAGES_05)) - {"resume raised"}  # matches any
    assert named == {"resume not a multiple"}, message
    assert "resume_step(4, 6) gave 6" in message and "multiples of 4" in message, message
    assert "step 4" not in message, message


def test_the_lost_step_message_never_gives_the_step_to_resume(nb05):
    with pytest.raises(CheckFailed) as failure:
        _check_resume(nb05, lambda every, lost_at: lost_at // every * every)
    message = str(failure.value)
    assert set(messages_matching(message, MESSAGES_05)) - {"resume raised"} == {
        "resume lost step"
    }, message
    assert "resume_step(4, 8) gave 8" in message and "from step 4" not in message, message


# ----------------------------------------------------------------------- (c), issue 45


#: Wrong wasted() answers, each failing a case whose number the message must not give.
WRONG_WASTED = {
    "remainder": lambda every, lost_at: lost_at % every,  # 0 at a checkpoint
    "every minus remainder": lambda every, lost_at: every - lost_at % every,  # nothing saved
    "hard-coded": _hard_coded_wasted,  # between two checkpoints
    "constant": lambda every, lost_at: 4,
}


def _failed_case(message: str, name: str) -> tuple[int, int, int]:
    """(every, lost_at, got) of the case a message of exercise 05 (c) quotes."""
    found = re.match(rf"{name}\((\d+), (\d+)\) gave (-?\d+)", message)
    assert found, message
    return int(found[1]), int(found[2]), int(found[3])


@pytest.mark.parametrize("answer", list(WRONG_WASTED))
def test_wasted_feedback_never_gives_the_failed_cases_number(nb05, answer):
    """Issue 45: "saved at 4, lost at 6: 2 steps are trained again, not 1" gave the answer
    to paste; the message now gives the property and works through another case, whose
    number does not answer the failed one."""
    with pytest.raises(CheckFailed) as failure:
        _check_c(nb05, WRONG_WASTED[answer])
    message = str(failure.value)
    every, lost_at, _got = _failed_case(message, "wasted")
    want = lost_at - _resume(every, lost_at)
    assert not re.search(rf"\b{want}\)$", message), message
    assert "lost_at - resume_step(every, lost_at)" in message, message
    pasted = int(re.search(r"that is (\d+)\)$", message)[1])
    assert pasted != want, message


@pytest.mark.parametrize(
    "resume_step",
    [_hard_coded, lambda every, lost_at: max(0, lost_at // every * every - every)],
    ids=["hard-coded", "one-too-old"],
)
def test_an_older_checkpoint_is_not_told_the_step_to_resume(nb05, resume_step):
    with pytest.raises(CheckFailed) as failure:
        _check_resume(nb05, resume_step)
    message = str(failure.value)
    assert messages_matching(message, MESSAGES_05) == ["resume older"], message
    every, lost_at, _got = _failed_case(message, "resume_step")
    want = _resume(every, lost_at)
    pasted = int(re.search(r"that is step (\d+)\)$", message)[1])
    assert pasted != want and f"step {want}" not in message, message


def test_a_negative_step_is_not_told_nothing_was_saved(nb05):
    """resume_step(4, 6) giving -2: step 4 was saved, so "nothing was saved before step 6:
    start again from 0" was false; the message now says a step is never negative."""
    with pytest.raises(CheckFailed) as failure:
        _check_resume(nb05, lambda every, lost_at: lost_at - 2 * every)
    message = str(failure.value)
    assert messages_matching(message, MESSAGES_05) == ["resume negative"], message
    assert "nothing was saved" not in message, message


#: Each listed mistake of resume_step (05 (c)) and the message of MESSAGES_05 naming it.
RESUME_MISTAKES = {
    "resume lost step": lambda every, lost_at: lost_at // every * every,
    "resume after": lambda every, lost_at: lost_at // every * every + every,
    "resume negative": lambda every, lost_at: lost_at - 2 * every,
    "resume not a multiple": lambda every, lost_at: lost_at - 1,
    "resume older": lambda every, lost_at: max(0, lost_at // every * every - every),
    "resume not a number": lambda every, lost_at: str(_resume(every, lost_at)),
}


@pytest.mark.parametrize("name", list(RESUME_MISTAKES))
def test_each_resume_mistake_is_named_and_no_other(nb05, name):
    with pytest.raises(CheckFailed) as failure:
        _check_resume(nb05, RESUME_MISTAKES[name])
    message = str(failure.value)
    named = set(messages_matching(message, MESSAGES_05)) - {"resume raised"}  # matches any
    assert named == {name}, message


# ------------------------- graded apart: the evidence beside the answer, the verdict apart


@pytest.fixture
def apart():
    """``grade_apart`` on notebook 05 (its Colab cell's ``google.colab``, absent here, is
    skipped as the grader's checker skips it)."""
    return lambda grade_id, namespace: grade_apart(NB05, grade_id, namespace)


def _notebook_answer(grade_id: str, name: str):
    """The notebook's own answer ``name`` (its solution cell ``grade_id``)."""
    namespace = {"pl": pl, "nn": nn, "torch": torch}
    exec(_grade_cell(grade_id), namespace)
    return namespace[name]


class LyingLoss(Right):  # a loss tensor of a subclass: it could answer any comparison
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss.as_subclass(_Agreeable)


class _Agreeable(torch.Tensor):
    """A tensor subclass (whatever it would answer)."""


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (None, None),  # the notebook's MyModule
        (RightDictWithScheduler, None),
        (StepAndEpoch, None),
        (IgnoresLr, "optimizer lr"),
        (ReturnsNothing, "training_step returns nothing"),
        (ManualStep, "training_step optimizers"),
        (ManualBackward, "training_step backward"),
        (LogsDoubled, "logged loss not the mean"),
        (WrongLoss, "loss nll on logits"),
        (LyingLoss, "of type _Agreeable, a subclass of torch.Tensor"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_my_module_graded_apart(nb05, apart, answer, feedback):
    """05 (a) across the grader's boundary: the learner's class is built, stepped by hand and
    fitted by a Trainer in the learner's runtime; the plain loop's reference training and
    every comparison are the checker's."""
    answer = answer or _notebook_answer("05-training-step", "MyModule")
    verdict = apart("05-training-step-check", dict(nb05, MyModule=answer))
    if feedback is None:
        assert verdict["status"] == "completed", verdict
        return
    assert verdict["status"] == "failed" and verdict["ename"] == "CheckFailed", verdict
    if answer is LyingLoss:  # the evidence says its type: it never reaches a comparison
        assert feedback in verdict["evalue"], verdict
    else:
        assert feedback in messages_matching(verdict["evalue"], MESSAGES_05), verdict


def _flag_raises(capability):
    raise ValueError("no flag for this GPU")


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (None, None),  # the notebook's precision_flag
        (flag_by_major, None),
        (PRECISION_FLAG_MISTAKES["precision as text"], "compared as text"),
        (PRECISION_FLAG_MISTAKES["precision from 7.5"], "not at 7.5"),
        (flag_by_course_helpers, "called the course's own pick_precision()"),
        (flag_by_support, "called the course's own precision_support()"),
        (_flag_raises, r"compute capability 3.7: your function raised ValueError: \(your code's"),
        (
            lambda capability: _LyingText(flag_by_tuples(capability)),
            r"precision_flag\(\(3, 7\)\) should be of type str, but it is of type _LyingText",
        ),
    ],
    ids=[
        "reference",
        "by-major",
        "as-text",
        "from-7.5",
        "course-rule",
        "course-support",
        "raises",
        "lying-str",
    ],
)
def test_precision_flag_graded_apart(nb05, apart, answer, feedback):
    """05 (b) across the grader's boundary: the learner's function runs in the learner's
    runtime with the course's precision helpers refused there; the rule's verdict is the
    checker's. A flag that equals anything fails: it never reaches the comparison."""
    answer = answer or _notebook_answer("05-precision-flag", "precision_flag")
    verdict = apart("05-precision-flag-check", dict(nb05, precision_flag=answer))
    if feedback is None:
        assert verdict["status"] == "completed", verdict
        return
    assert verdict["status"] == "failed", verdict
    assert re.search(feedback, verdict["ename"] + ": " + verdict["evalue"]), verdict


class _LyingText(str):
    """A str equal to everything."""

    __eq__ = lambda self, other: True  # noqa: E731
    __ne__ = lambda self, other: False  # noqa: E731
    __hash__ = str.__hash__
