"""Notebook 09's observing halves: (b) ``pad_vocabulary`` on the notebook's ``GPT``, and
(c) ``step_throughput`` on the notebook's ``GPT`` beside ``FlopCounterMode``'s own count of
the same step. Each builds the case's model from the notebook's class, calls the answer
with the course's instruments around it, and returns what it saw as plain data; what it
means is decided in :mod:`course_utils.checks.nb09`."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# FlopCounterMode and deterministic algorithms import torch._dynamo lazily: imported here,
# with the runtime's guard, every observing child forked from the runtime has it (else
# each child pays 3-6 s to import it again)
import torch
import torch._dynamo
from torch.utils.flop_counter import FlopCounterMode

from course_utils.checks.boundary import observed
from course_utils.checks.core import course_helpers_refused
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed, builtin_error, plain_value_fault
from course_utils.flops import (
    count_flops,  # the course's own counter: refused in (c)
    step_flops,
)
from course_utils.spies import uninitialised_memory_filled


def _kind(value: Any) -> str:
    """The name of ``value``'s type, as a check's message says it."""
    return type(value).__name__ if value is not None else "None"


def _tensor_seen(value: Any) -> dict[str, Any]:
    """What a check can compare of ``value``, which should be a plain tensor: a detached
    copy of it when it is one (``tensor``: None otherwise), whether it is a tensor at all,
    and its type's name."""
    exact = type(value) in (torch.Tensor, torch.nn.Parameter)
    return {
        "tensor": value.detach().clone() if exact else None,
        "is_tensor": isinstance(value, torch.Tensor),
        "kind": _kind(value),
    }


# ------------------------------------------------------------------ (b) pad a vocabulary

#: PyTorch's words for a copy into a slice of another shape: the slice's rows.
_SLICE_SHAPE = re.compile(
    r"indexing result of shape \[(\d+), (\d+)\]|expanded size of the tensor \((\d+)\) must match"
)


@observed
def pad_vocabulary_evidence(
    pad_vocabulary: Callable[..., Any],
    make_model: Callable[..., Any],
    sizes: tuple[int, ...],
    vocab: int,
    multiple: int,
    dtype: torch.dtype,
    raise_errors: bool = False,
) -> dict[str, Any]:
    """``pad_vocabulary(model, multiple)`` on ``make_model(vocab, *sizes)`` (seeded, in
    ``dtype``), with memory handed out uninitialised filled with NaN: the old embedding and
    logits, then what came back (its type, its ``tok.weight``, whether ``head.weight`` is
    that same tensor, its logits for the same tokens). When the answer raised: its class's
    name, the rows the model's ``tok`` has after it, and what PyTorch's copy error says
    of the slice copied into (its message itself stays here). ``raise_errors``: what the
    answer (or the padded model's forward) raises is let through instead."""
    torch.manual_seed(0)
    model = make_model(vocab, *sizes).to(dtype)
    kind = type(model)
    tokens = torch.randint(0, vocab, (2, 8))
    seen: dict[str, Any] = {
        "model": kind.__name__,
        "width": int(model.tok.weight.shape[1]),
        "before": model(tokens).detach(),
        "old": model.tok.weight.detach().clone(),
    }
    with uninitialised_memory_filled():  # torch.empty's rows: NaN, not what was there
        try:
            got = pad_vocabulary(model, multiple)
        except NotImplementedError:  # not answered
            raise
        except Exception as error:
            if raise_errors:
                raise
            return {**seen, "raised": True, **_failed_copy(error, model, vocab)}
    seen.update(raised=False, returned=None if got is None else _kind(got))
    seen["is_model"] = isinstance(got, kind)
    if got is None or not seen["is_model"]:
        return seen
    weight = getattr(getattr(got, "tok", None), "weight", None)  # read once: it is compared
    seen["weight"] = _tensor_seen(weight)
    head = getattr(getattr(got, "head", None), "weight", None)
    seen["tied"] = weight is not None and head is weight
    try:
        seen["after"] = _tensor_seen(got(tokens))
    except NotImplementedError:
        raise
    except Exception:
        if raise_errors:
            raise
        seen["after"] = None  # the padded model's forward raised
    return seen


def _failed_copy(error: Exception, model: Any, vocab: int) -> dict[str, Any]:
    """What a ``pad_vocabulary`` that raised leaves to tell its mistake: the class of what
    it raised, the rows of the model's ``tok`` when that changed (the new embedding was in
    place before the copy failed), the rows of the slice a shape error names, and whether
    the error names the old vocabulary's size."""
    weight = getattr(getattr(model, "tok", None), "weight", None)
    rows = None
    if isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[0] != vocab:
        rows = int(weight.shape[0])
    try:
        said = str.__str__(str(error))  # exactly a str: what is searched cannot lie
    except Exception:
        said = ""
    found = _SLICE_SHAPE.search(said)
    return {
        "error": builtin_error(type(error)),
        "tok_rows": rows,
        "slice_rows": int(found[1] or found[3]) if found else None,
        "names_vocab": str(vocab) in said,
    }


# ---------------------------------------------------- (c) FLOPs, tokens/s, MFU of a step


@dataclass(frozen=True)
class StepCase:
    """One case of exercise 09 (c): a GPT's sizes (vocabulary, context, width, blocks,
    heads), a batch of full-length sequences, a step time and a GPU's datasheet row."""

    sizes: tuple[int, int, int, int, int]
    batch: int
    seconds: float
    gpu: Any  # a GpuPeakFlops row
    dtype: torch.dtype


def step_inputs(
    make_model: Callable[..., Any], case: StepCase
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """The case's model, ``make_model(*case.sizes)`` seeded, a random batch of
    ``case.batch`` full-length sequences and their targets."""
    vocab, context = case.sizes[0], case.sizes[1]
    torch.manual_seed(0)
    model = make_model(*case.sizes)
    x, y = torch.randint(0, vocab, (2, case.batch, context))
    return model, x, y


@contextmanager
def _counting() -> Iterator[list[int]]:
    """Inside the block, each ``FlopCounterMode`` block entered adds 1 to the list's item."""
    entered = [0]
    original = FlopCounterMode.__enter__

    def counting(self: FlopCounterMode) -> Any:
        entered[0] += 1
        return original(self)

    FlopCounterMode.__enter__ = counting  # type: ignore[method-assign]
    try:
        yield entered
    finally:
        FlopCounterMode.__enter__ = original  # type: ignore[method-assign]


def _number_seen(value: Any) -> Any:
    """One item of a plain answer (:func:`~course_utils.feedback.plain_value_fault`), as a
    check compares it: an int, float or bool itself (NumPy's float64, a float, as one),
    anything else as ``{"kind": the name of its type}``."""
    if type(value) in (int, float, bool):
        return value
    if isinstance(value, float):  # plain, so NumPy's float64
        return float(value)
    return {"kind": _kind(value)}


@observed
def step_throughput_evidence(
    step_throughput: Callable[..., Any],
    make_model: Callable[..., Any],
    case: StepCase,
    raise_errors: bool = False,
) -> dict[str, Any]:
    """``FlopCounterMode``'s count of one training step of the case's model (forward and
    backward under the math kernel; the forward alone, the default kernel, and both, as
    the usual mistakes count; its parameters), then ``step_throughput(model, x, y,
    seconds, gpu, dtype)`` on that model, counting the ``FlopCounterMode`` blocks it
    entered and refusing the course's own ``count_flops``: the numbers it returned, where
    they are not plain, or what it raised (the class's name). ``raise_errors``: what the
    answer raises is let through instead."""
    model, x, y = step_inputs(make_model, case)
    seen: dict[str, Any] = {
        "flops": step_flops(model, x, y),
        "forward": step_flops(model, x, y, backward=False),
        "no_attention": step_flops(model, x, y, math_kernel=False),
        "forward_no_attention": step_flops(model, x, y, backward=False, math_kernel=False),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    with _counting() as entered:
        try:
            with course_helpers_refused({"count_flops": count_flops}, "count_flops"):
                answer = step_throughput(model, x, y, case.seconds, case.gpu, case.dtype)
        except NotImplementedError:  # not answered
            raise
        except Exception as error:
            refusal = MESSAGES_CHECKS["refused"].format(name="count_flops")
            refused = type(error) is CheckFailed and str(error) == refusal
            if raise_errors and not refused:
                raise
            error_name = builtin_error(type(error))
            return {**seen, "raised": True, "refused": refused, "error": error_name}
    fault = plain_value_fault(answer, "step_throughput(model, x, y, seconds, gpu, dtype)")
    seen.update(raised=False, refused=False, counters=entered[0], fault=fault)
    seen["numbers"] = (
        [_number_seen(v) for v in answer] if fault is None and type(answer) is tuple else None
    )
    return seen
