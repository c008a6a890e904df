"""Notebook 09's deciding halves: (b) a padded vocabulary and (c) a training step's FLOPs,
tokens per second and MFU, each judged from its evidence
(:mod:`course_utils.checks.evidence.nb09`) against the values expected here; when they
differ, against the usual mistakes, so that the feedback names the one the answer made."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from course_utils.checks.evidence.nb09 import (
    StepCase,
    pad_vocabulary_evidence,
    step_throughput_evidence,
)
from course_utils.classroom import MESSAGES_CHECKS, CheckFailed, check
from course_utils.transformer_checks import MESSAGES_09

__all__ = ["StepCase", "check_pad_vocabulary", "check_step_throughput"]

#: The faults of a value that is not plain data, by their message in MESSAGES_CHECKS.
_NOT_PLAIN = ("difference type", "tensor subclass")


def _what_it_raised(observe: Callable[..., Any], kind: str) -> str:
    """The sentence for what the answer raised on a case (``your function raised
    RuntimeError: ...``): the case observed again with the answer's exception let through.
    In the grader the checker raises it again here, and what it said stays out of the
    verdict (*(your code's message)*). ``kind``: the class the evidence named, said alone
    if the answer does not raise again."""
    from course_utils.instructor.checker import Tampered  # lazy: the grader's own module

    try:
        observe(raise_errors=True)
    except (NotImplementedError, CheckFailed, Tampered):  # not answered; found tampered
        raise
    except Exception as error:
        return MESSAGES_CHECKS["function raised"].format(kind=type(error).__name__, error=error)
    return kind or "an exception"  # it did not raise again


def _exact(seen: dict[str, Any], what: str) -> torch.Tensor:
    """The plain tensor ``seen`` holds (:func:`~course_utils.classroom.exact_tensor`'s
    rule, from the evidence): else :class:`CheckFailed`, as that function says it."""
    check(seen["is_tensor"], MESSAGES_CHECKS["not a tensor"].format(what=what, kind=seen["kind"]))
    tensor = seen["tensor"]
    check(
        type(tensor) is torch.Tensor,
        MESSAGES_CHECKS["tensor subclass"].format(what=what, kind=seen["kind"]),
    )
    return tensor


# ------------------------------------------------------------------ (b) pad a vocabulary


#: The usual ways of counting the padded rows wrong: what each gives for (vocab, multiple),
#: by the name of the message in :data:`MESSAGES_09` that names it.
_ROWS_MISTAKES: list[tuple[str, Callable[[int, int], int]]] = [
    ("pad_vocabulary rows kept", lambda v, m: v),
    ("pad_vocabulary rows next multiple", lambda v, m: (v // m + 1) * m),
    ("pad_vocabulary rows added", lambda v, m: v + m),
    ("pad_vocabulary rows rounded down", lambda v, m: v // m * m),
    ("pad_vocabulary rows rounded down", lambda v, m: round(v / m) * m),  # to the nearest
    ("pad_vocabulary rows the multiple", lambda v, m: m),
]


def _rows_mistake(
    vocab: int, multiple: int, rows: int, passed: Sequence[tuple[int, int]] = ()
) -> str:
    """The name in :data:`MESSAGES_09` of why ``rows`` is not ``vocab`` rounded up to a
    multiple of ``multiple``: the one usual mistake that gives ``rows`` here and the right
    count on each case of ``passed`` (those the answer got right), else the rule alone."""

    def up(v: int, m: int) -> int:
        return -(-v // m) * m

    found = {
        name
        for name, count in _ROWS_MISTAKES
        if count(vocab, multiple) == rows != up(vocab, multiple)
        and all(count(v, m) == up(v, m) for v, m in passed)
    }
    return found.pop() if len(found) == 1 else "pad_vocabulary rows wrong"


def _diagnose_failed_copy(
    seen: dict[str, Any], vocab: int, multiple: int, passed: Sequence[tuple[int, int]]
) -> None:
    """When ``pad_vocabulary`` raised copying the old rows, name the mistake that made the
    copy fail, from the rows the new embedding got (the model's new ``tok``, else the slice
    PyTorch's error names): too few rows is one of the usual row counts' mistakes; the right
    number of rows means the old rows went to a slice of another size. Returns when
    neither can be told (the error is then quoted as it is)."""
    expected = -(-vocab // multiple) * multiple
    rows: int | None = seen["tok_rows"]  # the new embedding was in place before the copy
    sliced: int | None = seen["slice_rows"]
    if rows is None and sliced is not None and sliced < vocab:
        rows = sliced  # new[:vocab] on fewer rows is all of them
    if rows is not None and rows != expected and rows < vocab:
        raise CheckFailed(
            MESSAGES_09[_rows_mistake(vocab, multiple, rows, passed)].format(
                vocab=vocab, multiple=multiple, expected=expected, rows=rows
            )
        )
    if rows == expected and sliced is not None:
        raise CheckFailed(
            MESSAGES_09["pad_vocabulary copied to another slice"].format(
                vocab=vocab, multiple=multiple, rows=rows
            )
        )


def check_pad_vocabulary(
    pad_vocabulary: Callable[..., Any],
    make_model: Callable[..., Any],
    sizes: tuple[int, ...],
    cases: Iterable[tuple[int, int]],
) -> None:
    """Exercise 09 (b): for each (vocab, multiple), ``pad_vocabulary(model, multiple)``
    on ``make_model(vocab, *sizes)`` (a GPT with ``tok`` and a tied ``head``) must give an
    embedding of the vocabulary rounded up to a multiple, the old rows first and unchanged,
    the new rows given values (memory left uninitialised, ``torch.empty``, reads NaN here),
    the head tied to it, the model's dtype kept, and the same logits for the real tokens."""
    cases = list(cases)
    passed: list[tuple[int, int]] = []  # the cases the answer got right so far
    for dtype in (torch.float32, torch.float64):  # every case in float32 first
        for vocab, multiple in cases:
            observe = functools.partial(
                pad_vocabulary_evidence, pad_vocabulary, make_model, sizes, vocab, multiple, dtype
            )
            seen = observe()
            if seen["raised"]:
                _diagnose_failed_copy(seen, vocab, multiple, passed)
                fewer = seen["names_vocab"]  # an error naming the old size: fewer rows, likely
                raised = "pad_vocabulary raised, fewer rows" if fewer else "pad_vocabulary raised"
                error = _what_it_raised(observe, seen["error"])
                raise CheckFailed(
                    MESSAGES_09[raised].format(vocab=vocab, multiple=multiple, error=error)
                )
            check(seen["returned"] is not None, MESSAGES_09["pad_vocabulary returned nothing"])
            check(
                seen["is_model"],
                MESSAGES_09["pad_vocabulary not the model"].format(
                    kind=seen["model"], got=seen["returned"]
                ),
            )
            _check_padded(seen, vocab, multiple, dtype, passed, observe)
            passed.append((vocab, multiple))


def _check_padded(
    seen: dict[str, Any],
    vocab: int,
    multiple: int,
    dtype: torch.dtype,
    passed: Sequence[tuple[int, int]],
    observe: Callable[..., Any],
) -> None:
    padded = _exact(seen["weight"], "model.tok.weight")
    rows, got_width = padded.shape
    expected = -(-vocab // multiple) * multiple
    width = seen["width"]
    check(
        got_width == width,
        MESSAGES_09["pad_vocabulary width"].format(got=got_width, width=width),
    )
    check(
        rows == expected,
        MESSAGES_09[_rows_mistake(vocab, multiple, rows, passed)].format(
            vocab=vocab, multiple=multiple, expected=expected, rows=rows
        ),
    )
    check(seen["tied"], MESSAGES_09["pad_vocabulary untied"])
    check(
        padded.dtype == dtype,
        MESSAGES_09["pad_vocabulary dtype"].format(dtype=str(dtype)[6:], got=str(padded.dtype)[6:]),
    )
    check(bool(torch.isfinite(padded[vocab:]).all()), MESSAGES_09["pad_vocabulary rows not finite"])
    after_seen = seen["after"]
    if after_seen is None:  # the padded model's forward raised: let it raise here, as it did
        nothing = {"tensor": None, "is_tensor": False, "kind": "None"}
        after_seen = observe(raise_errors=True).get("after") or nothing
    after = _exact(after_seen, "model(tokens)")
    check(
        after.shape[-1] == expected,
        MESSAGES_09["pad_vocabulary logits"].format(columns=after.shape[-1], expected=expected),
    )
    old, before = seen["old"], seen["before"]
    if torch.equal(padded[:vocab], old) and torch.allclose(after[..., :vocab], before, atol=1e-5):
        return
    check(
        not torch.equal(padded[expected - vocab :], old) or expected == vocab,
        MESSAGES_09["pad_vocabulary old rows at the end"],
    )
    check(
        not torch.allclose(padded[:vocab], old, atol=1e-3, rtol=1e-3),
        MESSAGES_09["pad_vocabulary old rows changed"],
    )
    raise CheckFailed(MESSAGES_09["pad_vocabulary logits changed"])


# ---------------------------------------------------- (c) FLOPs, tokens/s, MFU of a step


_PEAK_FIELDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _is_number(value: Any) -> bool:
    """Whether ``value``, a number of the evidence (``{"kind": ...}`` for anything else),
    is an int or a float (a bool is not)."""
    return type(value) in (int, float)


def _kind_of(value: Any) -> str:
    """The name of the type of a number of the evidence."""
    return str(value["kind"]) if type(value) is dict else type(value).__name__


def _flops_mistake(case: StepCase, seen: dict[str, Any], flops: float) -> str | None:
    """The name in :data:`MESSAGES_09` of why ``flops`` is not the step's count ``right``
    (``None``: it is)."""
    right = seen["flops"]
    if math.isclose(flops, right, rel_tol=1e-9):
        return None
    tokens = case.batch * case.sizes[1]
    known = [
        (seen["forward"], "step_throughput flops forward only"),
        (seen["no_attention"], "step_throughput flops no attention"),
        (seen["forward_no_attention"], "step_throughput flops forward only, no attention"),
        (right / tokens, "step_throughput flops per token"),
        (right / case.batch, "step_throughput flops per sequence"),
        (2 * right, "step_throughput flops two steps"),
        (6 * seen["parameters"] * tokens, "step_throughput flops 6N"),
    ]
    for value, mistake in known:
        if not math.isclose(value, right, rel_tol=1e-9) and math.isclose(
            flops, value, rel_tol=1e-6
        ):
            return mistake
    return "step_throughput flops wrong"


def check_step_throughput(
    step_throughput: Callable[..., Any],
    make_model: Callable[..., Any],
    cases: Sequence[StepCase],
) -> None:
    """Exercise 09 (c): ``step_throughput(model, x, y, seconds, gpu, dtype)`` on each case's
    ``make_model(*sizes)`` must return ``(flops, tokens_per_second, mfu)``: the step's FLOPs
    counted with ``FlopCounterMode`` (forward and backward, attention under the math
    kernel), the batch's tokens over ``seconds``, and the FLOP/s over the dense peak of
    ``dtype`` on ``gpu`` (a fraction, unrounded); ``ValueError`` when the GPU has no such
    peak. Cases of different models and batches, so that a constant fails."""
    observed: dict[int, dict[str, Any]] = {}

    def evidence(index: int) -> dict[str, Any]:  # each case observed once
        if index not in observed:
            observed[index] = step_throughput_evidence(step_throughput, make_model, cases[index])
        return observed[index]

    answers: list[tuple[float, ...]] = []
    for index, case in enumerate(cases):
        field = _PEAK_FIELDS[case.dtype]
        peak_tflops = getattr(case.gpu, field)
        gpu = case.gpu.name
        seen = evidence(index)
        if seen["refused"]:
            raise CheckFailed(MESSAGES_CHECKS["refused"].format(name="count_flops"))
        fault = None if seen["raised"] else seen["fault"]
        if fault is not None:  # a subclass: its ==, < and float() may say anything
            name, fields = fault
            assert name in _NOT_PLAIN, name
            raise CheckFailed(MESSAGES_CHECKS[name].format(**fields))
        observe = functools.partial(step_throughput_evidence, step_throughput, make_model, case)
        if peak_tflops is None:
            raised = seen["raised"]
            no_peak = (
                "step_throughput no peak, raised" if raised else "step_throughput no peak, returned"
            )
            if not (raised and seen["error"] == "ValueError"):
                error = _what_it_raised(observe, seen["error"]) if raised else ""
                raise CheckFailed(MESSAGES_09[no_peak].format(gpu=gpu, field=field, error=error))
            continue
        if seen["raised"]:
            error = _what_it_raised(observe, seen["error"])
            raise CheckFailed(
                MESSAGES_09["step_throughput raised"].format(gpu=gpu, field=field, error=error)
            )
        numbers = seen["numbers"]
        check(
            numbers is not None and len(numbers) == 3,
            MESSAGES_09["step_throughput not three numbers"],
        )
        flops, speed, utilization = numbers
        check(seen["counters"] > 0, MESSAGES_09["step_throughput no counter"])
        check(
            _is_number(flops),
            MESSAGES_09["step_throughput flops not a number"].format(kind=_kind_of(flops)),
        )
        mistake = _flops_mistake(case, seen, flops)
        if mistake == "step_throughput flops wrong" and _same_flops_elsewhere(
            evidence, len(cases), index, flops
        ):
            mistake = "step_throughput flops constant"  # what a constant returns: the same
        if mistake is not None:
            raise CheckFailed(MESSAGES_09[mistake].format(flops=flops))
        answers.append((flops, speed, utilization))
        _check_speed_and_mfu(case, seen["flops"], speed, utilization, peak_tflops)
    check(
        len({a[0] for a in answers}) == len(answers), MESSAGES_09["step_throughput flops constant"]
    )


def _same_flops_elsewhere(
    evidence: Callable[[int], dict[str, Any]], count: int, failed: int, flops: float
) -> bool:
    """Whether the learner's FLOPs for another case, one whose step counts other FLOPs than
    case ``failed``'s, are ``flops`` too: what an answer that does not depend on the model
    and the batch (a constant) gives."""
    right = evidence(failed)["flops"]
    for index in range(count):
        if index == failed:
            continue
        seen = evidence(index)
        if math.isclose(seen["flops"], right, rel_tol=1e-9):
            continue
        numbers = None if seen["raised"] else seen["numbers"]
        if numbers and _is_number(numbers[0]) and numbers[0] == flops:
            return True
    return False


def _check_speed_and_mfu(
    case: StepCase, flops: int, speed: Any, utilization: Any, peak_tflops: float
) -> None:
    tokens, sequences, seconds = case.batch * case.sizes[1], case.batch, case.seconds
    field = _PEAK_FIELDS[case.dtype]
    for key, value in (
        ("step_throughput speed not a number", speed),
        ("step_throughput mfu not a number", utilization),
    ):
        check(_is_number(value), MESSAGES_09[key].format(kind=_kind_of(value)))
    check(
        not math.isclose(speed, sequences / seconds, rel_tol=1e-6),
        MESSAGES_09["step_throughput sequences per second"],
    )
    check(
        not math.isclose(speed, seconds / tokens, rel_tol=1e-6),
        MESSAGES_09["step_throughput seconds per token"],
    )
    check(
        math.isclose(speed, tokens / seconds, rel_tol=1e-6),
        MESSAGES_09["step_throughput speed wrong"].format(
            tokens=tokens, seconds=seconds, speed=speed
        ),
    )
    right = flops / seconds / (peak_tflops * 1e12)
    if math.isclose(utilization, right, rel_tol=1e-9):
        return
    peaks = {f: getattr(case.gpu, f) for f in ("fp32", "fp16", "bf16", "tf32")}
    known = {
        100 * right: MESSAGES_09["step_throughput mfu percentage"],
        flops / seconds / peak_tflops: MESSAGES_09["step_throughput mfu in TFLOP/s"],
        flops / tokens / seconds / (peak_tflops * 1e12): MESSAGES_09[
            "step_throughput mfu per token"
        ],
        round(right, 2): MESSAGES_09["step_throughput mfu rounded"],
        round(right, 3): MESSAGES_09["step_throughput mfu rounded"],
    }
    for other, tflops in peaks.items():
        if other != field and tflops:
            known.setdefault(
                flops / seconds / (tflops * 1e12),
                MESSAGES_09["step_throughput mfu other peak"].format(
                    field=field, peak=peak_tflops, gpu=case.gpu.name, other=other, other_peak=tflops
                ),
            )
    for value, feedback in known.items():
        check(not math.isclose(utilization, value, rel_tol=1e-9), feedback)
    raise CheckFailed(
        MESSAGES_09["step_throughput mfu wrong"].format(
            flops=flops,
            seconds=seconds,
            gpu=case.gpu.name,
            field=field,
            peak=peak_tflops,
            mfu=utilization,
        )
    )
