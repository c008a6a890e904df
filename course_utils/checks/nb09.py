"""Notebook 09's checks: (a) causal self-attention, compared with the reference written here
(:func:`attention`) and its usual mistakes (a missing mask, the wrong scale, the softmax over
the wrong dimension, a head split that mixes tokens...); (b) a padded vocabulary and (c) a
training step's FLOPs, tokens per second and MFU, each judged from its evidence
(:mod:`course_utils.checks.evidence.nb09`) against the values expected here; when they
differ, against the usual mistakes, so that the feedback names the one the answer made."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from course_utils.checks.core import answer_or_error, check, exact_tensor
from course_utils.checks.data_format import Tampered
from course_utils.checks.evidence.nb09 import (
    StepCase,
    pad_vocabulary_evidence,
    step_throughput_evidence,
)
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed
from course_utils.language import Messages

__all__ = ["StepCase", "check_pad_vocabulary", "check_step_throughput"]

#: The faults of a value that is not plain data, by their message in MESSAGES_CHECKS.
_NOT_PLAIN = ("difference type", "tensor subclass")


def _what_it_raised(observe: Callable[..., Any], kind: str) -> str:
    """The sentence for what the answer raised on a case (``your function raised
    RuntimeError: ...``): the case observed again with the answer's exception let through.
    In the grader the checker raises it again here, and what it said stays out of the
    verdict (*(your code's message)*). ``kind``: the class the evidence named, said alone
    if the answer does not raise again."""
    try:
        observe(raise_errors=True)
    except (NotImplementedError, CheckFailed, Tampered):  # not answered; found tampered
        raise
    except Exception as error:
        return MESSAGES_CHECKS["function raised"].format(kind=type(error).__name__, error=error)
    return kind or "an exception"  # it did not raise again


def _exact(seen: dict[str, Any], what: str) -> torch.Tensor:
    """The plain tensor ``seen`` holds (:func:`~course_utils.checks.core.exact_tensor`'s
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


#: Notebook 09's check messages, by a stable name (see
#: :data:`course_utils.checks.nb01.MESSAGES_01`): one sentence each, ``{placeholders}`` for
#: the case the learner's answer failed.
MESSAGES_09 = Messages(
    "09",
    {
        # (a) causal self-attention
        "causal_attention raised": "with x of shape {shape} and {heads} heads, {error}",
        "causal_attention not a tensor": "return one tensor (batch, seq, dim); yours returned "
        "{kind}",
        "causal_attention shape": "with x of shape {shape} and {heads} heads your output has "
        "shape {got}: return (batch, seq, dim), the merged heads projected by w_out",
        "causal_attention NaN": "your output holds NaN: some token may attend to nothing, not "
        "even itself (a row of scores all -inf has no softmax). Hide only the keys after each "
        "query; in F.scaled_dot_product_attention a boolean attn_mask is True where a token MAY "
        "attend, the opposite of masked_fill's",
        "causal_attention no mask": "with x of shape {shape} and {heads} heads: there is no "
        "causal mask: each token also attended to the tokens after it; pass is_causal=True to "
        "F.scaled_dot_product_attention",
        "causal_attention mask sees next": "with x of shape {shape} and {heads} heads: the causal "
        "mask is off by one: each token also saw the next token; hide only the keys after the "
        "query (torch.ones(T, T).triu(1), or is_causal=True)",
        "causal_attention mask hides self": "with x of shape {shape} and {heads} heads: the "
        "causal mask hides the diagonal too: a token must be allowed to attend to itself; hide "
        "only the keys after it (triu(1), or is_causal=True)",
        "causal_attention mask hides past": "with x of shape {shape} and {heads} heads: the mask "
        "hides the earlier tokens instead of the later ones: a token may attend to itself and "
        "the tokens before it; hide the keys after it (triu(1), or is_causal=True)",
        "causal_attention mask inverted": "with x of shape {shape} and {heads} heads: each token "
        "attended only to the tokens after it: in F.scaled_dot_product_attention a boolean "
        "attn_mask is True where a token MAY attend, the opposite of masked_fill's (or pass "
        "is_causal=True)",
        "causal_attention mask zero": "with x of shape {shape} and {heads} heads: the hidden "
        "scores were set to 0, and the softmax still gives them weight (e^0 = 1): fill them "
        "with float('-inf'), or pass is_causal=True",
        "causal_attention mask after softmax": "with x of shape {shape} and {heads} heads: the "
        "mask was applied after the softmax, so each row of weights no longer sums to 1: mask "
        "the scores with -inf before the softmax (or pass is_causal=True)",
        "causal_attention scaled twice": "with x of shape {shape} and {heads} heads: the scores "
        "were scaled by 1/head_dim, not 1/√head_dim (as when q @ kᵀ is divided by head_dim, or "
        "when q is divided by √head_dim before F.scaled_dot_product_attention, which scales by "
        "1/√head_dim itself): the scale is 1/√head_dim, applied once",
        "causal_attention not scaled": "with x of shape {shape} and {heads} heads: the scores "
        "were not scaled: multiply q @ kᵀ by 1/√head_dim (F.scaled_dot_product_attention does "
        "it for you)",
        "causal_attention scaled by dim": "with x of shape {shape} and {heads} heads: the scores "
        "were scaled by 1/√dim, the model's width: the scale is 1/√head_dim, head_dim = dim // "
        "heads",
        "causal_attention softmax dim": "with x of shape {shape} and {heads} heads: the softmax "
        "ran over the wrong dimension (the queries): each query's weights over the keys must "
        "sum to 1, softmax(dim=-1)",
        "causal_attention split heads first": "with x of shape {shape} and {heads} heads: the "
        "heads were split with .view(batch, heads, seq, head_dim), which mixes tokens into "
        "heads: split with .view(batch, seq, heads, head_dim).transpose(1, 2)",
        "causal_attention split no transpose": "with x of shape {shape} and {heads} heads: the "
        "heads were split without .transpose(1, 2): attention ran across the heads instead of "
        "across the tokens; split with .view(batch, seq, heads, head_dim).transpose(1, 2)",
        "causal_attention merge no transpose": "with x of shape {shape} and {heads} heads: the "
        "heads were merged with .reshape(batch, seq, dim) straight from (batch, heads, seq, "
        "head_dim), which mixes tokens: .transpose(1, 2) first, then .reshape(batch, seq, dim)",
        "causal_attention one head": "with x of shape {shape} and {heads} heads: you attended "
        "with one head over the whole width: split into `heads` heads of dim // heads numbers "
        "each",
        "causal_attention order kqv": "with x of shape {shape} and {heads} heads: queries and "
        "keys are swapped: x @ w_qkv.T holds the queries, then the keys, then the values (q, k, "
        "v = (x @ w_qkv.T).split(dim, dim=-1)); you read them as keys, queries, values",
        "causal_attention order qvk": "with x of shape {shape} and {heads} heads: keys and "
        "values are swapped: x @ w_qkv.T holds the queries, then the keys, then the values (q, "
        "k, v = (x @ w_qkv.T).split(dim, dim=-1)); you read them as queries, values, keys",
        "causal_attention order vkq": "with x of shape {shape} and {heads} heads: queries and "
        "values are swapped: x @ w_qkv.T holds the queries, then the keys, then the values (q, "
        "k, v = (x @ w_qkv.T).split(dim, dim=-1)); you read them as values, keys, queries",
        "causal_attention order kvq": "with x of shape {shape} and {heads} heads: q, k, v are "
        "mixed up: x @ w_qkv.T holds the queries, then the keys, then the values (q, k, v = (x "
        "@ w_qkv.T).split(dim, dim=-1)); you read them as keys, values, queries",
        "causal_attention order vqk": "with x of shape {shape} and {heads} heads: q, k, v are "
        "mixed up: x @ w_qkv.T holds the queries, then the keys, then the values (q, k, v = (x "
        "@ w_qkv.T).split(dim, dim=-1)); you read them as values, queries, keys",
        "causal_attention keys not transposed": "with x of shape {shape} and {heads} heads: the "
        "scores are q @ k without transposing k: they are q @ k.transpose(-2, -1) (one score "
        "per query and key)",
        "causal_attention no projection": "with x of shape {shape} and {heads} heads: the output "
        "projection is missing: return the merged heads @ w_out.T",
        "causal_attention projection not transposed": "with x of shape {shape} and {heads} "
        "heads: the output was projected with @ w_out, not @ w_out.T: a weight is stored (out, "
        "in) like nn.Linear's, so project with @ w_out.T (or F.linear(merged, w_out))",
        "causal_attention sees later": "with x of shape {shape} and {heads} heads, changing the "
        "last token changed earlier outputs: your mask lets tokens see later ones "
        "(is_causal=True hides them)",
        "causal_attention wrong": "with x of shape {shape} and {heads} heads your output differs "
        "from causal self-attention, and not in one of the usual ways alone (mask, scale, "
        "softmax dimension, head split or merge, projection): check each step against section "
        "2's CausalSelfAttention",
        # (b) pad a vocabulary
        "pad_vocabulary raised": "vocabulary {vocab}, multiple {multiple}: {error}",
        "pad_vocabulary raised, fewer rows": "vocabulary {vocab}, multiple {multiple}: {error} "
        "(did the new embedding get fewer rows than the {vocab} old ones? Round up: "
        "math.ceil(vocab / multiple) * multiple)",
        "pad_vocabulary copied to another slice": "your new embedding for vocabulary {vocab} "
        "and multiple {multiple} has the {rows} rows it should, but copying the old rows into "
        "it raised, as the slice you copied into is not {vocab} rows: copy them into the first "
        "rows, new.weight.data[:vocab] = old.weight",
        "pad_vocabulary returned nothing": "return the model (the same one, padded)",
        "pad_vocabulary not the model": "return the model, a {kind}, not {got}",
        "pad_vocabulary width": "the embedding is {got} wide, it was {width}: pad the rows (one "
        "per token), not the embedding width",
        "pad_vocabulary rows kept": "a vocabulary of {vocab}, padded to a multiple of "
        "{multiple}, has {expected} rows, not {rows}: you kept the old size: make a new "
        "nn.Embedding with the padded number of rows",
        "pad_vocabulary rows next multiple": "a vocabulary of {vocab}, padded to a multiple of "
        "{multiple}, has {expected} rows, not {rows}: a vocabulary that is already a multiple "
        "keeps its size (round up, not 'the next one')",
        "pad_vocabulary rows added": "a vocabulary of {vocab}, padded to a multiple of "
        "{multiple}, has {expected} rows, not {rows}: you added a multiple to it: round it up to "
        "the next multiple instead",
        "pad_vocabulary rows rounded down": "a vocabulary of {vocab}, padded to a multiple of "
        "{multiple}, has {expected} rows, not {rows}: you rounded down (or to the nearest): "
        "round up, so that every token keeps a row: math.ceil(vocab / multiple) * multiple",
        "pad_vocabulary rows the multiple": "a vocabulary of {vocab}, padded to a multiple of "
        "{multiple}, has {expected} rows, not {rows}: you used the multiple itself: round the "
        "vocabulary up to a multiple of it",
        "pad_vocabulary rows wrong": "a vocabulary of {vocab}, padded to a multiple of "
        "{multiple}, has {expected} rows, not {rows}: round up to the next multiple: "
        "math.ceil(vocab / multiple) * multiple",
        "pad_vocabulary untied": "the head is no longer tied to the embedding: after making the "
        "new embedding, model.head.weight = model.tok.weight",
        "pad_vocabulary dtype": "a {dtype} model came back with {got} rows: make the new "
        "embedding in the old one's dtype (and device): nn.Embedding(rows, dim, "
        "dtype=old.dtype, device=old.device)",
        "pad_vocabulary rows not finite": "the extra rows hold NaN or inf, or were never given "
        "values: torch.empty (new_empty, empty_like) leaves whatever was in memory; initialize "
        "them (zeros, or nn.Embedding's own random rows) before copying the old rows in",
        "pad_vocabulary logits": "the logits have {columns} columns, expected {expected}: the "
        "head must score every row of the padded embedding",
        "pad_vocabulary old rows at the end": "the old rows went to the end of the new "
        "embedding: token i must keep row i, so copy the old rows into the first rows, "
        "new.weight[:vocab] = old.weight",
        "pad_vocabulary old rows changed": "the old rows changed slightly: copy them exactly "
        "(new.weight.data[:vocab] = old.weight), with no arithmetic on them and in the old dtype",
        "pad_vocabulary logits changed": "the real tokens' logits changed: copy the old rows "
        "into the first rows of the new embedding (new.weight.data[:vocab] = old.weight), so "
        "that each token keeps its row",
        # (c) FLOPs, tokens/s, MFU of a step
        "step_throughput no peak, raised": "a {gpu} in {field}: a {gpu} has no {field} peak "
        "(gpu.{field} is None): raise ValueError ({error})",
        "step_throughput no peak, returned": "a {gpu} in {field}: a {gpu} has no {field} peak "
        "(gpu.{field} is None): raise ValueError (yours returned a result)",
        "step_throughput raised": "a {gpu} in {field}: {error}",
        "step_throughput not three numbers": "return three numbers: (flops, tokens_per_second, "
        "mfu)",
        "step_throughput no counter": "count the step's FLOPs with FlopCounterMode around one "
        "forward and backward (the exercise is the counter, not a formula)",
        "step_throughput flops not a number": "the FLOPs should be a number, got {kind}",
        "step_throughput flops forward only": "you counted the forward pass only: backward costs "
        "about twice the forward, so call loss.backward() inside the FlopCounterMode block too",
        "step_throughput flops no attention": "attention's matmuls are missing: PyTorch's CPU "
        "flash kernel has no FLOP formula, so count under sdpa_kernel(SDPBackend.MATH)",
        "step_throughput flops forward only, no attention": "you counted the forward pass only, "
        "without attention's matmuls: count forward and backward, under "
        "sdpa_kernel(SDPBackend.MATH)",
        "step_throughput flops per token": "that is the FLOPs per token: return the FLOPs of the "
        "whole step (every token of the batch)",
        "step_throughput flops per sequence": "that is the FLOPs per sequence: return the FLOPs "
        "of the whole step (every sequence of the batch)",
        "step_throughput flops two steps": "you counted two steps: count one forward and one "
        "backward",
        "step_throughput flops 6N": "that is 6·N·tokens, the rule of thumb, which leaves out "
        "attention and counts parameters that do no matmul: count the step with FlopCounterMode",
        "step_throughput flops wrong": "your step counted {flops:.4g} FLOPs, not what "
        "FlopCounterMode counts for this model and batch: count one forward and one backward "
        "inside the FlopCounterMode block, under sdpa_kernel(SDPBackend.MATH), and return "
        "counter.get_total_flops()",
        "step_throughput flops constant": "your FLOPs did not change with the model and the "
        "batch: count them for the model and batch you are given",
        "step_throughput speed not a number": "tokens per second should be a number, got {kind}",
        "step_throughput mfu not a number": "MFU should be a number, got {kind}",
        "step_throughput sequences per second": "that is sequences per second: count tokens, "
        "batch × sequence length (x.numel()), per second",
        "step_throughput seconds per token": "that is seconds per token: return tokens per "
        "second, tokens / seconds",
        "step_throughput speed wrong": "for {tokens} tokens in {seconds:g} s your tokens per "
        "second is {speed:.6g}: divide the batch's tokens, x.numel(), by the step's seconds",
        "step_throughput mfu percentage": "MFU is a fraction (0.2), not a percentage (20)",
        "step_throughput mfu in TFLOP/s": "the peaks are in TFLOP/s: multiply them by 1e12 to "
        "get FLOP/s",
        "step_throughput mfu per token": "you divided the FLOPs per token by the step time: use "
        "the FLOPs of the whole step",
        "step_throughput mfu rounded": "you rounded the MFU: return it unrounded (round only "
        "when you print it)",
        "step_throughput mfu other peak": "a {field} run divides by the {field} peak ({peak:g} "
        "TFLOP/s on a {gpu}), not {other}'s ({other_peak:g})",
        "step_throughput mfu wrong": "for {flops:.4g} FLOPs in {seconds:g} s on a {gpu} in "
        "{field} ({peak:g} TFLOP/s) your MFU is {mfu:.6g}: divide the FLOP/s by the peak in "
        "FLOP/s, FLOPs / seconds / (peak in TFLOP/s × 1e12)",
    },
)


@dataclass(frozen=True)
class Attention:
    """How to compute multi-head causal self-attention: the right way by default; each
    other value is one usual mistake (see :data:`ATTENTION_MISTAKES`)."""

    # the scale: "head_dim" (1/√head_dim), "head_dim twice" (1/head_dim), "dim", "none"
    scale: str = "head_dim"
    mask: str = "causal"  # "causal", "none", "sees next", "hides self", "hides past", "zero",
    # "after softmax", "inverted" (only the later keys: a boolean attn_mask read backwards)
    softmax_dim: int = -1
    split: str = "right"  # "right", "heads first" (a view that mixes tokens), "no transpose"
    merge: str = "right"  # "right", "no transpose"
    order: str = "qkv"  # the order x @ w_qkv.T is read in: "qkv", or another, e.g. "kqv"
    keys: str = "transposed"  # "transposed", "not transposed" (q @ k)
    heads: str = "heads"  # "heads", "one" (the heads argument ignored)
    projection: str = "w_out.T"  # "w_out.T", "none", "w_out"


def attention(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    w_out: torch.Tensor,
    heads: int,
    how: Attention = Attention(),
) -> torch.Tensor:
    """Multi-head causal self-attention of ``x`` (batch, seq, dim) written out by hand,
    as ``how`` says (by default right).

    >>> x, w_qkv, w_out = torch.randn(2, 5, 8), torch.randn(24, 8), torch.randn(8, 8)
    >>> sdpa = torch.nn.functional.scaled_dot_product_attention
    >>> def heads(t):
    ...     return t.view(2, 5, 2, 4).transpose(1, 2)
    >>> q, k, v = (heads(t) for t in (x @ w_qkv.T).split(8, -1))
    >>> out = sdpa(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 5, 8) @ w_out.T
    >>> torch.allclose(attention(x, w_qkv, w_out, 2), out, atol=1e-5)
    True
    """
    batch, seq, dim = x.shape
    n = 1 if how.heads == "one" else heads
    size = dim // n
    chunks = dict(zip(how.order, (x @ w_qkv.T).split(dim, dim=-1), strict=True))
    parts = [chunks[name] for name in "qkv"]  # read as how.order says

    def split(t: torch.Tensor) -> torch.Tensor:
        if how.split == "heads first":
            return t.reshape(batch, n, seq, size)
        t = t.reshape(batch, seq, n, size)
        return t if how.split == "no transpose" else t.transpose(1, 2)

    q, k, v = (split(t) for t in parts)
    keys = k if how.keys == "not transposed" else k.transpose(-2, -1)
    scale = {"head_dim": size**-0.5, "head_dim twice": 1 / size, "dim": dim**-0.5, "none": 1.0}
    scores = q @ keys * scale[how.scale]
    rows = scores.shape[-2]
    ones = torch.ones(rows, rows, dtype=torch.bool)
    above = ones.triu({"sees next": 2, "hides self": 0}.get(how.mask, 1))
    if how.mask == "hides past":
        above = ones.tril(-1)
    if how.mask in ("causal", "sees next", "hides past"):
        scores = scores.masked_fill(above, -math.inf)
    elif how.mask == "hides self":  # -inf would give the first row NaN: a large finite fill
        scores = scores.masked_fill(above, -1e9)
    elif how.mask == "zero":
        scores = scores.masked_fill(above, 0.0)
    elif how.mask == "inverted":
        scores = scores.masked_fill(~above, -math.inf)
    weights = scores.softmax(dim=how.softmax_dim)
    if how.mask == "inverted":  # SDPA gives a row with no key zeros, not NaN
        weights = weights.nan_to_num(0.0)
    if how.mask == "after softmax":
        weights = weights.masked_fill(above, 0.0)
    out = weights @ v
    if how.split == "no transpose":
        out = out.transpose(1, 2)  # back to (batch, heads, seq, head_dim), as a merge expects
    if how.merge == "no transpose":
        merged = out.reshape(batch, seq, dim)
    else:
        merged = out.transpose(1, 2).reshape(batch, seq, dim)
    if how.projection == "none":
        return merged
    return merged @ (w_out if how.projection == "w_out" else w_out.T)


#: Each usual mistake of exercise 09 (a), and the name of the feedback that names it in
#: :data:`MESSAGES_09`.
ATTENTION_MISTAKES: dict[Attention, str] = {
    Attention(mask="none"): "causal_attention no mask",
    Attention(mask="sees next"): "causal_attention mask sees next",
    Attention(mask="hides self"): "causal_attention mask hides self",
    Attention(mask="hides past"): "causal_attention mask hides past",
    Attention(mask="inverted"): "causal_attention mask inverted",
    Attention(mask="zero"): "causal_attention mask zero",
    Attention(mask="after softmax"): "causal_attention mask after softmax",
    Attention(scale="head_dim twice"): "causal_attention scaled twice",
    Attention(scale="none"): "causal_attention not scaled",
    Attention(scale="dim"): "causal_attention scaled by dim",
    Attention(softmax_dim=-2): "causal_attention softmax dim",
    Attention(split="heads first"): "causal_attention split heads first",
    Attention(split="no transpose"): "causal_attention split no transpose",
    Attention(merge="no transpose"): "causal_attention merge no transpose",
    Attention(heads="one"): "causal_attention one head",
    Attention(order="kqv"): "causal_attention order kqv",
    Attention(order="qvk"): "causal_attention order qvk",
    Attention(order="vkq"): "causal_attention order vkq",
    Attention(order="kvq"): "causal_attention order kvq",
    Attention(order="vqk"): "causal_attention order vqk",
    Attention(keys="not transposed"): "causal_attention keys not transposed",
    Attention(projection="none"): "causal_attention no projection",
    Attention(projection="w_out"): "causal_attention projection not transposed",
}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-5, rtol=1e-4))


def attention_mistake(
    out: torch.Tensor, x: torch.Tensor, w_qkv: torch.Tensor, w_out: torch.Tensor, heads: int
) -> str | None:
    """The name in :data:`MESSAGES_09` of the feedback for the usual mistake whose output
    ``out`` is (``None``: none is)."""
    right = attention(x, w_qkv, w_out, heads)
    for how, feedback in ATTENTION_MISTAKES.items():
        try:
            wrong = attention(x, w_qkv, w_out, heads, how)
        except RuntimeError:  # a mistake whose shapes do not fit this case
            continue
        if not _same(wrong, right) and _same(out.detach().float(), wrong):
            return feedback
    return None


def check_causal_attention(
    causal_self_attention: Callable[..., Any], cases: Iterable[tuple[int, int, int, int]]
) -> None:
    """Exercise 09 (a): ``causal_self_attention(x, w_qkv, w_out, heads)`` against
    :func:`attention` on random inputs of each case's (batch, seq, dim, heads); an output
    that differs is compared with each usual mistake of :data:`ATTENTION_MISTAKES`, and the
    feedback names the one it matches."""
    torch.manual_seed(0)
    for batch, seq, dim, heads in cases:
        x = torch.randn(batch, seq, dim)
        w_qkv, w_out = torch.randn(3 * dim, dim) / dim**0.5, torch.randn(dim, dim) / dim**0.5
        shape = (batch, seq, dim)
        out = answer_or_error(causal_self_attention, x.clone(), w_qkv, w_out, heads)
        check(
            not isinstance(out, str),
            MESSAGES_09["causal_attention raised"].format(shape=shape, heads=heads, error=out),
        )
        check(
            type(out) is torch.Tensor,
            MESSAGES_09["causal_attention not a tensor"].format(kind=type(out).__name__),
        )
        check(
            out.shape == x.shape,
            MESSAGES_09["causal_attention shape"].format(
                shape=shape, heads=heads, got=tuple(out.shape)
            ),
        )
        check(not out.isnan().any(), MESSAGES_09["causal_attention NaN"])
        if _same(out.detach(), attention(x, w_qkv, w_out, heads)):
            continue
        mistake = attention_mistake(out, x, w_qkv, w_out, heads)
        if mistake is not None:
            raise CheckFailed(MESSAGES_09[mistake].format(shape=shape, heads=heads))
        x[:, -1] += 1  # change the last token only: no earlier output may move
        later = answer_or_error(causal_self_attention, x, w_qkv, w_out, heads)
        check(
            isinstance(later, str)
            or _same(exact_tensor(later, "causal_self_attention(x, ...)")[:, :-1], out[:, :-1]),
            MESSAGES_09["causal_attention sees later"].format(shape=shape, heads=heads),
        )
        raise CheckFailed(MESSAGES_09["causal_attention wrong"].format(shape=shape, heads=heads))
