"""Notebook 05's deciding halves: exercise (a) (the learner's ``MyModule``, fitted by a
Trainer in the learner's runtime, against the plain loop trained here) and exercise (b)
(``precision_flag`` against the course's rule), from the evidence of
:mod:`course_utils.checks.evidence.nb05`. The messages are ``MESSAGES_05`` of
:mod:`course_utils.lightning` and ``MESSAGES_PRECISION_RULE`` of
:mod:`course_utils.checks.core`."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from course_utils.checks.core import answer_or_error, check, check_close, is_raised
from course_utils.checks.evidence import nb05 as evidence
from course_utils.checks.nb01 import RULE_CAPABILITIES, precision_rule_feedback
from course_utils.checks.nb04 import answer_of
from course_utils.checks.values import answered, raised_sentence
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed, plain_value
from course_utils.language import Messages
from course_utils.lightning import LIGHTNING_PRECISION
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
    course_utils.feedback.CheckFailed: your model's weight at the start ...
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
    (:data:`~course_utils.checks.nb01.RULE_CAPABILITIES`), with the course's precision
    helpers refused while the learner's function runs (the exercise is to write the rule);
    the feedback names the rule's usual mistake that the flags match
    (:func:`~course_utils.checks.nb01.precision_rule_feedback`)."""
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


#: Notebook 05's check messages, by a stable name (see
#: ``course_utils.checks.nb01.MESSAGES_01``); (b)'s rule's are ``MESSAGES_PRECISION_RULE`` there.
MESSAGES_05 = Messages(
    "05",
    {
        "label smoothing": "your training_step's loss is cross-entropy with label_smoothing="
        "{smoothing:g}: train with the plain cross-entropy, nn.functional.cross_entropy(logits, "
        "targets)",
        "training_step optimizers": "your training_step calls self.optimizers(): with automatic "
        "optimization (the default) the Trainer runs backward, optimizer.step() and zero_grad() "
        "itself on the loss training_step returns: compute the loss, log it and return it",
        "training_step backward": "your training_step calls backward() itself: with automatic "
        "optimization (the default) the Trainer runs backward, optimizer.step() and zero_grad() "
        "itself on the loss training_step returns: compute the loss, log it and return it",
        "training_step returns nothing": "your training_step returns nothing: end it with "
        "`return loss` (the Trainer needs the loss to run backward)",
        "training_step not a tensor": "training_step should return the loss tensor itself (one "
        "number that backward can use); yours returned {kind} (loss.item() or .detach() cut it "
        "off from backward)",
        "training_step cut off": "training_step should return the loss tensor itself (one "
        "number that backward can use); yours returned a tensor (loss.item() or .detach() cut "
        "it off from backward)",
        "loss nll on logits": "your training_step's loss is nn.functional.nll_loss of the raw "
        "logits, without log_softmax (nll_loss expects log-probabilities): use "
        "nn.functional.cross_entropy(logits, targets), which applies log_softmax itself",
        "loss not cross-entropy": "your training_step returned a loss of {value:.6g}, which is "
        "not the batch's cross-entropy: compute the loss with "
        "nn.functional.cross_entropy(logits, targets) on the model's raw logits",
        "log the loss": 'log the loss: self.log("{name}", loss)',
        "logged loss": "the logged {name} is {value:.6g}, but the batch's cross-entropy is "
        "{last:.6g}: log the batch's cross-entropy, the loss training_step returns",
        "logged loss not the mean": "the logged {name} is {value:.6g}, but the batch's "
        "cross-entropy is {last:.6g} (the mean of the {steps} steps' losses: {mean:.6g}): log "
        "the batch's cross-entropy, the loss training_step returns",
        "optimizer count": "configure_optimizers should give one optimizer, not {count}",
        "optimizer not SGD": "configure_optimizers should use torch.optim.SGD, not {kind}",
        "optimizer lr": "the optimizer's learning rate is {used}, but self.lr is {lr}: pass "
        "lr=self.lr",
        "optimizer momentum": "plain SGD here: leave out momentum (the check compares with plain "
        "SGD)",
        "optimizer weight decay": "plain SGD here: leave out weight_decay (yours is {decay:g}; "
        "the check compares with SGD without it)",
        "precision_flag raised": "compute capability {capability}: {error}",
        "resume raised": "resume_step({every}, {lost_at}): {error}",
        "resume not a number": "resume_step({every}, {lost_at}) gave {got!r}: return a step "
        "number (an int)",
        "resume lost step": "resume_step({every}, {lost_at}) gave {got!r}: the checkpoint of "
        "step {lost_at} would have been saved at the end of step {lost_at}, but the disconnect "
        "came first, so it was never written",
        "resume after": "resume_step({every}, {lost_at}) gave {got!r}: a run resumes from a "
        "checkpoint saved before the disconnect, not after",
        "resume negative": "resume_step({every}, {lost_at}) gave {got!r}, a negative step: a "
        "run resumes from the step of a checkpoint it saved, or from step 0 when it saved none",
        "resume not a multiple": "resume_step({every}, {lost_at}) gave {got!r}: checkpoints are "
        "saved only at multiples of {every} ({every}, {twice}, {thrice}...): {got} is not one",
        "resume older": "resume_step({every}, {lost_at}) gave {got!r}, a checkpoint older than "
        "the newest one saved before the disconnect: resume from the newest multiple of {every} "
        "below {lost_at} (saving every {ex_every} steps and lost at step {ex_lost}, that is step "
        "{ex_answer})",
        "wasted raised": "wasted({every}, {lost_at}): {error}",
        "wasted at a checkpoint": "wasted({every}, {lost_at}) gave {got!r}: the checkpoint of "
        "step {lost_at} was never written, so the steps since the checkpoint before it are "
        "trained again, lost_at - resume_step(every, lost_at) (saving every {ex_every} steps "
        "and lost at step {ex_lost}, that is {ex_answer})",
        "wasted since a checkpoint": "wasted({every}, {lost_at}) gave {got!r}: count the steps "
        "trained again since the last checkpoint, lost_at - resume_step(every, lost_at) (saving "
        "every {ex_every} steps and lost at step {ex_lost}, that is {ex_answer})",
        "wasted nothing saved": "wasted({every}, {lost_at}) gave {got!r}: nothing was saved "
        "before the disconnect, so the run starts again from step 0, and the steps trained "
        "again are lost_at - resume_step(every, lost_at) (saving every {ex_every} steps and "
        "lost at step {ex_lost}, that is {ex_answer})",
    },
)


#: Example cases (every, lost_at) a message of exercise 05 (c) works through, by where the
#: disconnect falls: none is a case the check runs, and the second stands in for the first
#: should the first be the case that failed or share its answer (a number pasted from the
#: message never answers the failed case).
_EXAMPLES = {
    "between": [(8, 20), (9, 29)],
    "at a checkpoint": [(8, 24), (9, 27)],
    "nothing saved": [(8, 5), (9, 7)],
}


def _resume_answer(every: int, lost_at: int, wasted: bool) -> int:
    """The step to resume from, or (``wasted``) the number of steps trained again."""
    start = (lost_at - 1) // every * every
    return lost_at - start if wasted else start


def _example(kind: str, every: int, lost_at: int, wasted: bool) -> dict[str, int]:
    """An example of ``kind`` whose answer (the step to resume from, or with ``wasted``
    the steps trained again) is not that of the case ``(every, lost_at)`` that failed."""
    want = _resume_answer(every, lost_at, wasted)
    ex_every, ex_lost = next(
        (e, lost)
        for e, lost in _EXAMPLES[kind]
        if (e, lost) != (every, lost_at) and _resume_answer(e, lost, wasted) != want
    )
    answer = _resume_answer(ex_every, ex_lost, wasted)
    return {"ex_every": ex_every, "ex_lost": ex_lost, "ex_answer": answer}


def _resume_feedback(every: int, lost_at: int, got: Any) -> str | None:
    """Why ``got`` is not the step a run saving every ``every`` steps, lost right after step
    ``lost_at`` (before saving it), resumes from (``None``: it is). No message gives the
    step of the case that failed: "resume older" works through another case."""
    want = (lost_at - 1) // every * every
    if got == want and isinstance(got, int | float) and not isinstance(got, bool):
        return None
    case = {"every": every, "lost_at": lost_at, "got": got}
    if is_raised(got):
        return MESSAGES_05["resume raised"].format(every=every, lost_at=lost_at, error=got)
    if not isinstance(got, int | float) or isinstance(got, bool):
        return MESSAGES_05["resume not a number"].format(**case)
    if got == lost_at and lost_at % every == 0:  # else no checkpoint was due at lost_at
        return MESSAGES_05["resume lost step"].format(**case)
    if got > lost_at:
        return MESSAGES_05["resume after"].format(**case)
    if got < 0:
        return MESSAGES_05["resume negative"].format(**case)
    if got % every:  # lost_at itself too, when it is not a multiple
        return MESSAGES_05["resume not a multiple"].format(
            twice=2 * every, thrice=3 * every, **case
        )
    # a multiple of every below want (got == lost_at and above want were told above)
    example = _example("between", every, lost_at, wasted=False)
    return MESSAGES_05["resume older"].format(**case, **example)


def _wasted_feedback(every: int, lost_at: int, got: Any) -> str | None:
    """Why ``got`` is not the number of steps trained again (``None``: it is). The message
    gives the property and works through another case, never the number of this one."""
    start = (lost_at - 1) // every * every
    want = lost_at - start
    if got == want and not isinstance(got, bool):
        return None
    if is_raised(got):
        return MESSAGES_05["wasted raised"].format(every=every, lost_at=lost_at, error=got)
    case = {"every": every, "lost_at": lost_at, "got": got}
    if lost_at % every == 0:
        kind, name = "at a checkpoint", "wasted at a checkpoint"
    elif start:
        kind, name = "between", "wasted since a checkpoint"
    else:
        kind, name = "nothing saved", "wasted nothing saved"
    return MESSAGES_05[name].format(**case, **_example(kind, every, lost_at, wasted=True))


def check_resume_step(
    resume_step: Callable[[int, int], Any],
    wasted: Callable[[int, int], Any],
    cases: Iterable[tuple[int, int]],
) -> None:
    """Exercise 05 (c): ``resume_step(every, lost_at)`` is the newest multiple of ``every``
    below ``lost_at`` (the checkpoint of step ``lost_at`` was never written), and
    ``wasted`` the steps since it, on each ``(every, lost_at)`` of ``cases`` and then on
    every ``lost_at`` from 1 to 4 checkpoints on, for intervals of 1 to 7 and 50 steps:
    an answer that hard-codes the cases it was shown fails. The feedback names the
    mistake (the lost step counted as saved, not a multiple, an older checkpoint...)."""
    grid = [(every, lost) for every in (*range(1, 8), 50) for lost in range(1, 4 * every + 2)]
    for every, lost_at in [*cases, *grid]:
        got = plain_value(
            answer_or_error(resume_step, every, lost_at), f"resume_step({every}, {lost_at})"
        )
        feedback = _resume_feedback(every, lost_at, got)
        if feedback:
            raise CheckFailed(feedback)
    for every, lost_at in [*cases, *grid]:
        got = plain_value(answer_or_error(wasted, every, lost_at), f"wasted({every}, {lost_at})")
        feedback = _wasted_feedback(every, lost_at, got)
        if feedback:
            raise CheckFailed(feedback)
