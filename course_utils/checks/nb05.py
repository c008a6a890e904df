"""Notebook 05's deciding halves: exercise (a) (the learner's ``MyModule``, fitted by a
Trainer in the learner's runtime, against the plain loop trained here) and exercise (b)
(``precision_flag`` against the course's rule), from the evidence of
:mod:`course_utils.checks.evidence.nb05`. The messages are ``MESSAGES_05`` of
:mod:`course_utils.lightning` and ``MESSAGES_PRECISION_RULE`` of
:mod:`course_utils.classroom`."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from course_utils.checks.evidence import nb05 as evidence
from course_utils.checks.nb04 import answer_of
from course_utils.checks.values import answered, raised_sentence
from course_utils.classroom import (
    MESSAGES_CHECKS,
    RULE_CAPABILITIES,
    CheckFailed,
    check,
    check_close,
    plain_value,
    precision_rule_feedback,
)
from course_utils.lightning import LIGHTNING_PRECISION, MESSAGES_05
from course_utils.training import TrainConfig, TrainStep, train

# ------------------------------------------------------- exercise (a): a LightningModule


def _loss_mistake(seen: Mapping[str, Any]) -> str | None:
    """What is wrong with the loss training_step returned (``seen``: its value, the
    network's logits on the batch, twice, and the targets) when it is not the batch's plain
    cross-entropy: label smoothing (0.01 to 0.2), nll_loss of the raw logits, or another
    value (``None``: the plain cross-entropy, or the logits could not be computed, alike,
    to tell)."""
    value, logits, targets = seen["loss"], seen["logits"], seen["targets"]
    if logits is None or targets is None:
        return None
    try:
        with torch.no_grad():

            def close(wanted: torch.Tensor) -> bool:
                return math.isclose(value, float(wanted), rel_tol=1e-5)

            def cross_entropy(smoothing: float = 0.0) -> torch.Tensor:
                return nn.functional.cross_entropy(logits, targets, label_smoothing=smoothing)

            if close(cross_entropy()):
                return None
            smoothing = next(
                (s for s in (0.1, 0.05, 0.2, 0.15, 0.01) if close(cross_entropy(s))), None
            )
            if smoothing is not None:
                return MESSAGES_05["label smoothing"].format(smoothing=smoothing)
            if close(nn.functional.nll_loss(logits, targets)):
                return MESSAGES_05["loss nll on logits"]
            again = seen["again"]  # a model that is not deterministic cannot tell
            if again is None or not torch.equal(logits, again):
                return None
            return MESSAGES_05["loss not cross-entropy"].format(value=value)
    except (RuntimeError, TypeError, ValueError, IndexError):  # not a classifier's batch
        return None


def training_step_mistake(seen: Mapping[str, Any]) -> str | None:
    """What is wrong with what ``training_step(batch, 0)`` returned, in plain words, from
    :func:`~course_utils.checks.evidence.nb05.training_step_seen`'s evidence (``None``: a
    loss tensor that backward can use, alone or as ``{"loss": ...}``). A training_step that
    runs backward itself, or asks for the Trainer's optimizers, is told that the Trainer
    does that part; a loss that is not the batch's cross-entropy is told here, before
    :func:`logged_loss_mistake` looks at what was logged.

    >>> from course_utils.checks.evidence.nb05 import training_step_seen
    >>> class Detached(nn.Linear):
    ...     def training_step(self, batch, index):
    ...         return nn.functional.cross_entropy(self(batch[0]), batch[1]).detach()
    >>> seen = training_step_seen(Detached(3, 2), (torch.ones(4, 3), torch.zeros(4).long()))
    >>> training_step_mistake(seen)[:50]
    'training_step should return the loss tensor itself'
    """
    if "raised" in seen:
        raise CheckFailed(raised_sentence(seen["raised"]))
    if seen["asked optimizers"]:
        return MESSAGES_05["training_step optimizers"]
    if seen["backwards"]:
        return MESSAGES_05["training_step backward"]
    if seen["nothing"]:
        return MESSAGES_05["training_step returns nothing"]
    if not seen["tensor"]:
        return MESSAGES_05["training_step not a tensor"].format(kind=seen["kind"])
    if seen["impostor"] is not None:
        answered({"impostor": seen["impostor"]})  # a subclass: its float() is compared
    if not seen["requires_grad"] or seen["numel"] != 1:
        return MESSAGES_05["training_step cut off"]
    # the loss itself before what is logged: a logged loss that is the returned one is right
    return _loss_mistake(seen)


def optimizer_mistake(seen: Sequence[Mapping[str, Any]], lr: float) -> str | None:
    """What is wrong with a Trainer's optimizers (``seen``:
    :func:`~course_utils.checks.evidence.nb05.optimizers_seen`) for plain SGD at ``lr``, in
    plain words (``None``: one ``torch.optim.SGD``, no momentum or weight decay, learning
    rate ``lr`` before any scheduler changed it)."""
    if len(seen) != 1:
        return MESSAGES_05["optimizer count"].format(count=len(seen))
    if not seen[0]["sgd"]:
        return MESSAGES_05["optimizer not SGD"].format(kind=seen[0]["class"])
    group = answered(seen[0]["group"])
    used = group.get("initial_lr", group["lr"])  # a scheduler keeps the starting rate here
    if not math.isclose(used, lr, rel_tol=1e-9):
        return MESSAGES_05["optimizer lr"].format(used=used, lr=lr)
    if group.get("momentum", 0.0) or group.get("nesterov"):
        return MESSAGES_05["optimizer momentum"]
    if group.get("weight_decay", 0.0):
        return MESSAGES_05["optimizer weight decay"].format(decay=group["weight_decay"])
    return None


def logged_loss_mistake(
    metrics: Mapping[str, torch.Tensor], losses: Sequence[float], name: str = "train_loss"
) -> str | None:
    """What is wrong with the loss a module logged as ``name`` over steps whose batch losses
    were ``losses`` (the plain loop's), in plain words (``None``: right). Each step's value
    (``on_step=True``, the default in training_step, then ``name`` or ``name_step``) must be
    the last batch's loss; the epoch's mean alone (``on_step=False, on_epoch=True``) is fine
    too when it is the mean of the batches' losses."""
    plain_value(dict(metrics), "trainer.callback_metrics")  # its keys and values are compared
    step = metrics.get(f"{name}_step", metrics.get(name))
    epoch = metrics.get(f"{name}_epoch")
    if step is None:
        return MESSAGES_05["log the loss"].format(name=name)
    value, last, mean = float(step), losses[-1], sum(losses) / len(losses)
    if f"{name}_step" in metrics or epoch is not None:  # on_step=True (on_epoch too, or not)
        if math.isclose(value, last, rel_tol=1e-4):
            return None
        return MESSAGES_05["logged loss"].format(name=name, value=value, last=last)
    if math.isclose(value, last, rel_tol=1e-4) or math.isclose(value, mean, rel_tol=1e-4):
        return None  # each step's value, or (on_step=False, on_epoch=True) their mean
    return MESSAGES_05["logged loss not the mean"].format(
        name=name, value=value, last=last, steps=len(losses), mean=mean
    )


def check_same_parameters(
    mine: Sequence[tuple[str, torch.Tensor]],
    theirs: torch.nn.Module,
    when: str,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-8,
) -> None:
    """Check that each parameter of ``mine`` (a model's ``named_parameters()``, as the
    evidence holds them) is close to the same parameter of ``theirs`` (the reference
    model), naming the first one that is not and ``when`` it was compared.

    >>> mine = list(torch.nn.Linear(2, 1).named_parameters())
    >>> check_same_parameters(mine, torch.nn.Linear(2, 1), "at the start")
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: your model's weight at the start ...
    """
    for (name, mine_p), theirs_p in zip(mine, theirs.parameters(), strict=False):
        check_close(mine_p, theirs_p, f"your model's {name} {when}", rtol=rtol, atol=atol)


def check_training_step(my_module: type, loader: Any, image_size: int, lr: float) -> None:
    """Exercise 05 (a), before any Trainer: ``my_module(model, lr).training_step`` on
    ``loader``'s first batch returns the batch's cross-entropy, a loss backward can use,
    without running backward or asking for the optimizers itself (:func:`training_step_mistake`
    of :func:`~course_utils.checks.evidence.nb05.my_module_step`'s evidence)."""
    mistake = training_step_mistake(evidence.my_module_step(my_module, loader, image_size, lr))
    check(mistake is None, mistake or "")


def check_fit(my_module: type, loader: Any, image_size: int, lr: float) -> None:
    """Exercise 05 (a): ``Trainer(fast_dev_run=3)`` fits ``my_module`` in the learner's
    runtime (:func:`~course_utils.checks.evidence.nb05.my_module_fit`); here the plain loop
    (:class:`~course_utils.training.TrainStep`, SGD at ``lr``) trains the same model on the
    same three batches. Its optimizer must be plain SGD at ``lr`` (:func:`optimizer_mistake`),
    the loss it logged the plain loop's (:func:`logged_loss_mistake`), and its weights
    after the 3 steps the plain loop's (:func:`check_same_parameters`)."""
    seen = evidence.my_module_fit(my_module, loader, image_size, lr)
    if "raised" in seen:
        raise CheckFailed(raised_sentence(seen["raised"]))
    mistake = optimizer_mistake(seen["optimizers"], lr)
    check(mistake is None, mistake or "")
    config = TrainConfig(precision="fp32", lr=lr)
    reference = TrainStep(copy.deepcopy(evidence.tiny_model(image_size)), "cpu", config)
    expected = train(reference, seen["batches"], max_steps=3)
    metrics = answered(seen["metrics"])
    mistake = logged_loss_mistake(metrics, expected.losses)  # per step or epoch
    check(mistake is None, mistake or "")
    check_same_parameters(seen["parameters"], reference.model, "after 3 steps", rtol=1e-5,
                          atol=1e-6)  # fmt: skip


# ----------------------------------------------------- exercise (b): the precision string


def check_precision_flag(precision_flag: Callable[[tuple[int, int]], Any]) -> None:
    """Exercise 05 (b): ``precision_flag(capability)`` against the course's rule
    (:func:`~course_utils.lightning.lightning_precision` of
    :func:`~course_utils.device.pick_precision`) on GPUs from Kepler to Blackwell
    (:data:`~course_utils.classroom.RULE_CAPABILITIES`), with the course's precision
    helpers refused while the learner's function runs (the exercise is to write the rule);
    the feedback names the rule's usual mistake that the flags match
    (:func:`~course_utils.classroom.precision_rule_feedback`)."""
    answers = evidence.precision_flag_answers(precision_flag, list(RULE_CAPABILITIES))
    refused = [seen["refused"] for seen in answers if "refused" in seen]
    if refused:  # the course's rule, called by yours
        raise CheckFailed(MESSAGES_CHECKS["refused"].format(name=refused[0]))
    got = {}
    for capability, seen in zip(RULE_CAPABILITIES, answers, strict=True):
        if "raised" in seen:
            raise CheckFailed(
                MESSAGES_05["precision_flag raised"].format(
                    capability=f"{capability[0]}.{capability[1]}",
                    error=raised_sentence(seen["raised"]),
                )
            )
        got[capability] = answer_of(seen)  # plain: a dict key below
    names = {flag: name for name, flag in LIGHTNING_PRECISION.items()}
    feedback = precision_rule_feedback(
        {c: names.get(flag) if isinstance(flag, str) else None for c, flag in got.items()},
        {c: repr(flag) for c, flag in got.items()},
    )
    if feedback:  # names the rule's mistake, never the flag of the capability it names
        raise CheckFailed(feedback)
