"""Notebook 04's deciding halves: exercise (a) (``adam_state_bytes``) and exercise (c)
(``amp_step``), from the evidence of :mod:`course_utils.checks.evidence.nb04`. The
expected values are computed here (a real Adam's state, a float32 step with clipping),
never in the learner's runtime; the messages are ``MESSAGES_04A`` and ``MESSAGES_04`` of
:mod:`course_utils.checks.core`."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo  # the checker builds optimizers: see below
from torch import nn

from course_utils.checks.core import _kind, answer_and_error, check, matching_mistake
from course_utils.checks.evidence import nb04 as evidence
from course_utils.checks.values import answered, raised_sentence
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed, plain_value
from course_utils.footprint import optimizer_state_bytes
from course_utils.language import Messages

# The grader's checker may run as a user of its own that cannot read the interpreter's own
# files (a Python under /root): it imports nothing that its grading process did not import
# before forking it. Building the first optimizer imports torch._dynamo (and cProfile with
# it), so this module imports it, and the grading process with this module.

# ------------------------------------------------------------------ exercise (a): Adam's state

#: The models :func:`check_adam_state` names a mistake on: float32, bfloat16, float64, and
#: one half frozen (names of :data:`~course_utils.checks.evidence.nb04.ADAM_MODELS`).
ADAM_CASES = (
    "a float32 nn.Linear(10, 5)",
    "a bfloat16 nn.Linear(10, 5)",
    "a float64 nn.Linear(6, 3)",
    "two Linear layers, the first frozen",
)


def answer_of(seen: Mapping[str, Any]) -> Any:
    """The answer's value in the evidence of
    :func:`~course_utils.checks.evidence.nb04.answer_refusing`, else
    :class:`~course_utils.feedback.CheckFailed`: naming the course's helper it called
    (``{"refused": name}``), the subclass where a plain type was due, or saying what it
    raised (:func:`~course_utils.checks.values.answered`).

    >>> answer_of({"value": 3})
    3
    >>> answer_of({"refused": "optimizer_state_bytes"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    course_utils.feedback.CheckFailed: your function called the course's own optimizer_...
    """
    if "refused" in seen:
        raise CheckFailed(MESSAGES_CHECKS["refused"].format(name=seen["refused"]))
    return answered(dict(seen))


def adam_state_of(adam_state_bytes: Callable[[nn.Module], Any], model: str) -> Any:
    """What ``adam_state_bytes`` gives for ``model`` (a name of
    :data:`~course_utils.checks.evidence.nb04.ADAM_MODELS`), the course's optimizer-state
    counters refused while it runs (:func:`answer_of`).

    >>> adam_state_of(lambda model: 2 * 55 * 4 + 8, "a float32 nn.Linear(10, 5)")
    448
    """
    return answer_of(evidence.adam_state_answers(adam_state_bytes, [model])[0])


def real_adam_state_bytes(model: str) -> int:
    """The bytes a real Adam keeps after one step on ``model`` (built here, in the deciding
    process), as the course's counter reads them.

    >>> real_adam_state_bytes("a float32 nn.Linear(10, 5)")
    448
    """
    trainable = [p for p in evidence.ADAM_MODELS[model]().parameters() if p.requires_grad]
    real = torch.optim.Adam(trainable)
    for p in trainable:
        p.grad = torch.zeros_like(p)
    real.step()
    return optimizer_state_bytes(real)


def _adam_mistakes(model: nn.Module) -> tuple[int, dict[str, int]]:
    """The right Adam state of ``model`` and what each usual mistake counts."""
    every = list(model.parameters())
    trainable = [p for p in every if p.requires_grad]
    size = sum(p.numel() * p.element_size() for p in trainable)
    right = 2 * size + 4 * len(trainable)
    return right, {
        "adam_state no step": 2 * size,
        "adam_state one step": 2 * size + 4,
        "adam_state four bytes": 2 * 4 * sum(p.numel() for p in trainable) + 4 * len(trainable),
        "adam_state one average": size + 4 * len(trainable),
        "adam_state frozen counted": 2 * sum(p.numel() * p.element_size() for p in every)
        + 4 * len(every),
        "adam_state gradients counted": 3 * size + 4 * len(trainable),
        "adam_state elements": 2 * sum(p.numel() for p in trainable) + len(trainable),
    }


def check_adam_state(adam_state_bytes: Callable[[nn.Module], Any]) -> None:
    """Exercise 04 (a): ``adam_state_bytes(model)`` on :data:`ADAM_CASES`; the feedback
    names the usual mistake every result matches (no step counter or one per model, 4 bytes
    per element, one average, frozen parameters or gradients counted, elements for bytes),
    else describes one model's result, never the bytes that model needs."""
    got: list[Any] = []
    answers = evidence.adam_state_answers(adam_state_bytes, list(ADAM_CASES))
    for label, seen in zip(ADAM_CASES, answers, strict=True):
        if "raised" in seen:
            error = raised_sentence(seen["raised"])
            raise CheckFailed(MESSAGES_04A["adam_state raised"].format(model=label, error=error))
        out = answer_of(seen)
        out = out.item() if isinstance(out, torch.Tensor) and out.numel() == 1 else out
        check(
            isinstance(out, int | float) and not isinstance(out, bool),
            MESSAGES_04A["adam_state not a number"].format(model=label, got=out),
        )
        got.append(out)
    counted = [_adam_mistakes(evidence.ADAM_MODELS[label]()) for label in ADAM_CASES]
    right = [want for want, _ in counted]
    if got == right:
        return
    values = {name: [each[name] for _, each in counted] for name in counted[0][1]}
    name = matching_mistake(got, values, right, lambda a, b: a == b)
    first = next(i for i, (a, b) in enumerate(zip(got, right, strict=True)) if a != b)
    label = ADAM_CASES[first]
    raise CheckFailed(MESSAGES_04A[name or "adam_state wrong"].format(model=label, got=got[first]))


def check_adam_state_follows_dtype(adam_state_bytes: Callable[[torch.nn.Module], int]) -> None:
    """Exercise 04 (a): Adam's averages take the parameters' dtype, so a bf16 and a float64
    ``nn.Linear(10, 5)`` (after a real Adam's step) must give what a real Adam keeps after
    one step (not 4 bytes per element).

    >>> def right(model):
    ...     state = sum(2 * p.numel() * p.element_size() for p in model.parameters())
    ...     return state + 4 * len(list(model.parameters()))
    >>> check_adam_state_follows_dtype(right)
    >>> check_adam_state_follows_dtype(lambda model: 2 * 4 * 55 + 8)
    Traceback (most recent call last):
    ...
    course_utils.feedback.CheckFailed: a bfloat16 nn.Linear(10, 5) gets 228 bytes ...
    """
    for dtype in (torch.bfloat16, torch.float64):
        model = f"a {str(dtype)[6:]} nn.Linear(10, 5) after a step"
        want = real_adam_state_bytes(model)
        [seen] = evidence.adam_state_answers(adam_state_bytes, [model])
        got = raised_sentence(seen["raised"]) if "raised" in seen else answer_of(seen)
        check(
            got == want,
            MESSAGES_04A["adam_state dtype"].format(dtype=str(dtype)[6:], want=want, got=got),
        )


# ------------------------------------------------------ exercise (c): a mixed-precision step


@dataclass(frozen=True)
class AmpStepRun:
    """Two calls of a learner's mixed-precision step (the evidence of
    :func:`~course_utils.checks.evidence.nb04.amp_step_run`) and a float32 reference step
    computed here (:func:`run_amp_step_against_fp32`)."""

    loss: float
    reference_loss: float
    update: torch.Tensor  # how the first call moved the weights, flattened
    reference_update: torch.Tensor
    forward_dtypes: list[torch.dtype]  # output dtype of the first layer at each call
    scale_before: float
    scale_after: float  # after the first call
    leftover_gradients: bool  # the second call's backward found the first call's gradients
    autocast_in_backward: bool  # backward ran inside torch.autocast
    loss_detached: bool  # the returned loss holds no autograd graph
    # the float32 update of each usual clipping mistake, by the name of its message in
    # course_utils.checks.nb04.MESSAGES_04
    mistaken_updates: dict[str, torch.Tensor] = field(default_factory=dict)
    dtype: torch.dtype = torch.float16  # the dtype the step was given

    def forward_feedback(self) -> str:
        """What the first layer's output dtype says about the forward pass: no autocast
        (float32), bfloat16 whatever ``dtype`` the step was given, or only what was seen."""
        want = str(self.dtype).removeprefix("torch.")
        if self.forward_dtypes == [torch.float32]:
            return MESSAGES_04["amp_step no autocast"]
        if self.forward_dtypes == [torch.bfloat16] and self.dtype != torch.bfloat16:
            return MESSAGES_04["amp_step bfloat16 always"].format(dtype=want)
        got = ", ".join(str(d).removeprefix("torch.") for d in self.forward_dtypes) or "none"
        return MESSAGES_04["amp_step forward dtype"].format(got=got, dtype=want)

    @property
    def update_error(self) -> float:
        """Distance between the two updates, relative to the reference update's size."""
        return _relative_distance(self.update, self.reference_update)

    def update_feedback(self) -> str:
        """What the first step's update says about the step: the usual mistake whose
        float32 update it matches (within 5 %), or how far it is from the right one."""
        for mistake, update in self.mistaken_updates.items():
            if _relative_distance(self.update, update) < 0.05:
                return MESSAGES_04[mistake]
        ratio = self.update.norm().item() / max(self.reference_update.norm().item(), 1e-12)
        if ratio > 0 and _relative_distance(self.update / ratio, self.reference_update) < 0.01:
            return MESSAGES_04["amp_step update scaled"].format(ratio=ratio)
        return MESSAGES_04["amp_step update off"].format(error=self.update_error)


def _relative_distance(update: torch.Tensor, reference: torch.Tensor) -> float:
    return (update - reference).norm().item() / max(reference.norm().item(), 1e-12)


#: The usual clipping mistakes of a mixed-precision step: how each clips a float32 step's
#: gradients (given the scale the learner's scaled gradients had), by the name of the
#: feedback that names it in ``course_utils.checks.nb04.MESSAGES_04``.
_CLIPPING_MISTAKES: dict[str, Callable[[nn.Module, float, float], None]] = {
    "amp_step no clipping": lambda net, max_norm, scale: None,
    "amp_step clipped scaled": lambda net, max_norm, scale: _clip_scaled(net, max_norm, scale),
    "amp_step clipped values": (
        lambda net, max_norm, scale: nn.utils.clip_grad_value_(net.parameters(), max_norm)
    ),
}


def _clip_scaled(net: nn.Module, max_norm: float, scale: float) -> None:
    """Clip ``scale`` times the gradients to ``max_norm``, then divide by ``scale``."""
    for p in net.parameters():
        if p.grad is not None:
            p.grad.mul_(scale)
    nn.utils.clip_grad_norm_(net.parameters(), max_norm)
    for p in net.parameters():
        if p.grad is not None:
            p.grad.div_(scale)


def _clipping(
    clip: Callable[[nn.Module, float, float], None], max_norm: float, scale: float
) -> Callable[[nn.Module], None]:
    return lambda net: clip(net, max_norm, scale)


def _fp32_update(
    start: nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor],
    lr: float,
    clip: Callable[[nn.Module], Any],
) -> torch.Tensor:
    """How one float32 SGD step from ``start`` on ``batch``, its gradients clipped by
    ``clip``, moves the weights (flattened)."""
    net = copy.deepcopy(start)
    nn.functional.cross_entropy(net(batch[0]), batch[1]).backward()
    clip(net)
    torch.optim.SGD(net.parameters(), lr=lr).step()
    return evidence.moved(net, start)


# PyTorch's own errors for a wrongly ordered step, and the name of the message (in
# course_utils.checks.nb04.MESSAGES_04) of the mistake each one means
_AMP_STEP_ERRORS = {
    "_scale is None": "amp_step scale is None",
    "No inf checks were recorded for this optimizer": "amp_step no inf checks",
    "No inf checks were recorded prior to update": "amp_step update before step",
    "already been called on this optimizer since the last update": "amp_step unscaled twice",
    "step() has already been called since the last update": "amp_step stepped twice",
    "unscale_() is being called after step()": "amp_step unscale after step",
}


def _step_evidence(amp_step: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """:func:`~course_utils.checks.evidence.nb04.amp_step_run`'s evidence; when the step
    raised, :class:`~course_utils.feedback.CheckFailed`: an error PyTorch raises for a
    known mistake becomes the feedback that names it (its words are the learner's runtime's:
    :func:`~course_utils.checks.said_by_your_code`)."""
    seen = evidence.amp_step_run(amp_step, *args)
    if "raised" not in seen:
        return seen
    raised_sentence(seen["raised"])  # marks its message (and a notebook's class) as said there
    kind, error = seen["raised"]["kind"], seen["raised"]["message"]
    for text, mistake in _AMP_STEP_ERRORS.items():
        if text in error:
            raise CheckFailed(MESSAGES_04[mistake].format(error=error))
    raise CheckFailed(MESSAGES_04["amp_step raised"].format(kind=kind, error=error))


def run_amp_step_against_fp32(
    amp_step: Callable[..., Any],
    device: torch.device | str = "cpu",
    *,
    init_scale: float = 2.0**12,
    max_norm: float = 0.1,
    lr: float = 0.1,
    dtype: torch.dtype = torch.float16,
) -> AmpStepRun:
    """Two calls of ``amp_step(model, optimizer, scaler, inputs, targets, dtype, max_norm)``
    on a small MLP with SGD and a fresh ``GradScaler(init_scale=...)``, observed in the
    learner's runtime (:func:`~course_utils.checks.evidence.nb04.amp_step_run`), and the
    same first step in float32 without a scaler (cross-entropy, gradients clipped to
    ``max_norm``, SGD) from the same weights, computed here. A huge ``init_scale`` (2**100)
    makes the scaled fp16 gradients overflow, so a correct step is skipped. An error
    PyTorch raises for a known mistake is reported as
    :class:`~course_utils.feedback.CheckFailed`. Used by notebook 04's exercise check."""
    where = torch.device(device)
    seen = _step_evidence(amp_step, str(where), init_scale, max_norm, lr, dtype)
    start, batches = evidence.amp_case(where)
    reference = copy.deepcopy(start)
    reference_loss = nn.functional.cross_entropy(reference(batches[0][0]), batches[0][1])
    reference_loss.backward()
    nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
    torch.optim.SGD(reference.parameters(), lr=lr).step()
    return AmpStepRun(
        loss=seen["loss"],
        reference_loss=reference_loss.item(),
        update=seen["update"],
        reference_update=evidence.moved(reference, start),
        forward_dtypes=list(seen["forward_dtypes"]),
        scale_before=init_scale,
        scale_after=seen["scale_after"],
        leftover_gradients=seen["leftover_gradients"],
        autocast_in_backward=seen["autocast_in_backward"],
        loss_detached=seen["loss_detached"],
        mistaken_updates={
            mistake: _fp32_update(start, batches[0], lr, _clipping(clip, max_norm, init_scale))
            for mistake, clip in _CLIPPING_MISTAKES.items()
        },
        dtype=dtype,
    )


#: Notebook 04's check messages, by a stable name (see :data:`MESSAGES_01`).
MESSAGES_04 = Messages(
    "04",
    {
        "largest_batch raised": "{error} (with {case})",
        "largest_batch not a whole number": "with {case}, largest_batch gave {got!r}, a "
        "{kind}: return a whole number of samples, an int",
        "largest_batch strict": "with {case}, largest_batch gave {got}, one fewer than fit "
        "exactly: a batch that fills the budget to the byte fits, static + n × per_sample <= "
        "budget",
        "largest_batch one too many": "with {case}, largest_batch gave {got}, one more than "
        "fits: count only batches with static + n × per_sample <= budget",
        "largest_batch precedence": "with {case}, largest_batch gave {got}, which is budget - "
        "static // per_sample: // binds tighter than -, so write (budget - static) // per_sample",
        "largest_batch no static": "with {case}, largest_batch gave {got}, as if there were no "
        "static part: take static from the budget first, (budget - static) // per_sample",
        "largest_batch static per sample": "with {case}, largest_batch gave {got}, as if each "
        "sample needed the static part again: the static bytes are paid once per step",
        "largest_batch rounded": "with {case}, largest_batch gave {got}, the division rounded to "
        "the nearest: half a sample does not fit, so floor it, (budget - static) // per_sample",
        "largest_batch ceiling": "with {case}, largest_batch gave {got}, the division rounded "
        "up: a part of a sample does not fit, so floor it, (budget - static) // per_sample",
        "largest_batch floored each": "with {case}, largest_batch gave {got}, budget and static "
        "each divided by per_sample first: floor (budget - static) / per_sample in one division",
        "largest_batch negative": "with {case}, largest_batch gave {got}: when the static part "
        "alone exceeds the budget no batch fits, so return 0, not a negative number",
        "largest_batch wrong": "with {case}, largest_batch gave {got}, which is not the largest "
        "n with static + n × per_sample <= budget (1000 bytes, 300 static, 100 per sample: 7; "
        "none fits: 0)",
        "amp_step scale is None": "call backward on scaler.scale(loss), not on the loss itself "
        "(PyTorch raised: {error})",
        "amp_step no inf checks": "the scaler's step found no gradients: clear them at the "
        "start of the step or after scaler.step, never between backward and step (PyTorch "
        "raised: {error})",
        "amp_step update before step": "step through the scaler, scaler.step(optimizer), "
        "before scaler.update(): never optimizer.step() itself (PyTorch raised: {error})",
        "amp_step unscaled twice": "call scaler.update() once per step, after "
        "scaler.step(optimizer), and unscale_ at most once per step (PyTorch raised: {error})",
        "amp_step stepped twice": "call scaler.update() once per step, after "
        "scaler.step(optimizer) (PyTorch raised: {error})",
        "amp_step unscale after step": "call scaler.update() once per step, after "
        "scaler.step(optimizer): the next step's unscale_ needs it (PyTorch raised: {error})",
        "amp_step raised": "your step raised {kind}: {error}",
        "amp_step no clipping": "the weights moved as a step without clipping: after "
        "scaler.unscale_(optimizer), call clip_grad_norm_(model.parameters(), max_norm) with "
        "the max_norm you were given",
        "amp_step clipped scaled": "the weights moved as if you had clipped the scaled gradients "
        "(scale times the true ones) to max_norm, which cuts them to max_norm / scale: call "
        "scaler.unscale_(optimizer) before clip_grad_norm_",
        "amp_step clipped values": "the weights moved as a step that clips each gradient's "
        "values (clip_grad_value_): clip their norm, clip_grad_norm_(model.parameters(), "
        "max_norm)",
        "amp_step no autocast": "run the forward pass and the loss inside torch.autocast, for "
        "the device type of x and with dtype",
        "amp_step bfloat16 always": "your forward pass ran in bfloat16 though the step was given "
        "dtype=torch.{dtype}: use the dtype argument, torch.autocast(x.device.type, "
        "dtype=dtype), since float16 is the precision whose gradients the scaler guards",
        "amp_step forward dtype": "the first layer's output was {got} though the step was given "
        "dtype=torch.{dtype}: run the forward pass and the loss inside "
        "torch.autocast(x.device.type, dtype=dtype)",
        "amp_step update scaled": "the weights moved in the direction of a float32 step with "
        "clipping but {ratio:.2f} times as far: the step's size is off by that factor, so look "
        "for an extra factor on the loss, the gradients or max_norm",
        "amp_step update off": "the weights moved {error:.0%} away from a float32 step with "
        "clipping: backward on the scaled loss, then unscale_ the gradients before "
        "clip_grad_norm_ (or clip the scaled ones to max_norm * scale), then step through the "
        "scaler",
    },
)


#: Exercise 04 (b)'s cases (budget, static, per_sample): exact fits, a static part above
#: the budget, remainders below and above half a sample, room for none and for exactly one.
LARGEST_BATCH_CASES = [
    (1000, 200, 100),
    (150, 200, 10),
    (1000, 250, 100),
    (1000, 260, 100),
    (950, 240, 100),
    (300, 200, 100),
    (250, 200, 100),
    (5_000_000, 1_234_567, 45_678),
]


def _largest_batch_mistakes(budget: int, static: int, per_sample: int) -> dict[str, float]:
    """What each usual mistake of exercise 04 (b) returns for this case."""
    left = budget - static
    return {
        "largest_batch strict": max(0, math.ceil(left / per_sample) - 1),
        "largest_batch one too many": max(0, left // per_sample + 1),
        "largest_batch precedence": budget - static // per_sample,
        "largest_batch no static": budget // per_sample,
        "largest_batch static per sample": budget // (static + per_sample),
        "largest_batch rounded": max(0, round(left / per_sample)),
        "largest_batch ceiling": max(0, math.ceil(left / per_sample)),
        "largest_batch floored each": max(0, budget // per_sample - static // per_sample),
        "largest_batch negative": left // per_sample,
    }


def check_largest_batch(largest_batch: Callable[[int, int, int], Any]) -> None:
    """Exercise 04 (b): ``largest_batch(budget, static, per_sample)`` on
    :data:`LARGEST_BATCH_CASES`; a wrong answer is told the usual mistake its results match
    on every case (a strict comparison, operator precedence, the static part forgotten,
    rounding, ...), else what it gave for one case, never that case's answer."""
    got: list[Any] = []
    for budget, static, per_sample in LARGEST_BATCH_CASES:
        case = f"{budget} bytes, {static} static and {per_sample} per sample"
        out, error = answer_and_error(largest_batch, budget, static, per_sample)
        check(error is None, MESSAGES_04["largest_batch raised"].format(case=case, error=error))
        got.append(plain_value(out, f"largest_batch({budget}, {static}, {per_sample})"))
    right = [max(0, (b - s) // p) for b, s, p in LARGEST_BATCH_CASES]

    def same(a: Any, b: Any) -> bool:
        return isinstance(a, int | float) and not isinstance(a, bool) and a == b

    if all(map(same, got, right)):
        for (budget, static, per_sample), out in zip(LARGEST_BATCH_CASES, got, strict=True):
            case = f"{budget} bytes, {static} static and {per_sample} per sample"
            check(
                isinstance(out, int),
                MESSAGES_04["largest_batch not a whole number"].format(
                    case=case, got=out, kind=_kind(out)
                ),
            )
        return
    each = [_largest_batch_mistakes(*case) for case in LARGEST_BATCH_CASES]
    values = {name: [case[name] for case in each] for name in each[0]}
    name = matching_mistake(got, values, right, same) or "largest_batch wrong"
    first = next(i for i, (a, b) in enumerate(zip(got, right, strict=True)) if not same(a, b))
    budget, static, per_sample = LARGEST_BATCH_CASES[first]
    case = f"{budget} bytes, {static} static and {per_sample} per sample"
    raise CheckFailed(MESSAGES_04[name].format(case=case, got=got[first]))


#: Notebook 04's check messages for exercise (a), by a stable name (see :data:`MESSAGES_01`).
MESSAGES_04A = Messages(
    "04a",
    {
        "adam_state raised": "{error} (on {model})",
        "adam_state not a number": "for {model} adam_state_bytes gave {got!r}: return a number "
        "of bytes",
        "adam_state no step": "for {model} adam_state_bytes gave {got}, without Adam's step "
        "counter: add a 4-byte float32 scalar for each parameter tensor",
        "adam_state one step": "for {model} adam_state_bytes gave {got}, with one step counter "
        "for the model: Adam keeps one 4-byte step for each parameter tensor",
        "adam_state four bytes": "for {model} adam_state_bytes gave {got}, as if every element "
        "took 4 bytes: the averages take the parameter's dtype, p.element_size() bytes each",
        "adam_state one average": "for {model} adam_state_bytes gave {got}, one average per "
        "element: Adam keeps two, exp_avg and exp_avg_sq",
        "adam_state frozen counted": "for {model} adam_state_bytes gave {got}, counting frozen "
        "parameters: those with requires_grad=False get no Adam state",
        "adam_state gradients counted": "for {model} adam_state_bytes gave {got}, with the "
        "gradients counted too: they belong to the parameters, not to Adam's state",
        "adam_state elements": "for {model} adam_state_bytes gave {got}, a count of numbers, not "
        "bytes: multiply each by p.element_size()",
        "adam_state wrong": "for {model} adam_state_bytes gave {got}, which is not two averages "
        "of each trainable parameter's size plus a 4-byte step per tensor (a float32 "
        "nn.Linear(3, 2): 2 * 8 * 4 + 2 * 4 = 72)",
        "adam_state dtype": "a {dtype} nn.Linear(10, 5) gets {want} bytes of Adam state, not "
        "{got}: its averages take p.element_size() bytes per element, not always 4",
    },
)
