"""Exercise checks: specific, friendly feedback that runs on a CPU in seconds.

A check cell (nbgrader ``grade: true``) follows each solution cell and calls these. A
failed check raises :class:`CheckFailed`, an ``AssertionError`` whose message tells the
learner what is wrong; nbgrader and the course's grader score such a cell 0.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from course_utils.device import pick_precision  # the course's own: refused
from course_utils.language import Messages
from course_utils.smi import sample_output


class CheckFailed(AssertionError):
    """An exercise check failed; the message is the feedback for the learner."""


class PartialCredit(CheckFailed):
    """A check whose exercise has separable parts, some of them right: the course's grader
    scores ``earned`` (0 to 1) of the check's points; nbgrader scores it 0, like any failure."""

    def __init__(self, feedback: str, earned: float) -> None:
        super().__init__(feedback)
        self.earned = earned


#: The messages of the check helpers several notebooks share (:func:`check_close`,
#: :func:`check_parts`, :func:`exact_tensor`, :func:`first_difference`, the refusal of the
#: course's own helpers), by a stable name (see :data:`MESSAGES_01`).
MESSAGES_CHECKS = Messages(
    "checks",
    {
        "parts right": "{right} of {total} parts right; {wrong}",
        "part raised": "your code raised {kind}: {error}",
        "close shape": "{what} has shape {shape}, expected {expected}",
        "close values": "{what} differs from the expected values by up to {worst:.3g}",
        "close text": "{what} is the text {actual!r}, a str: write the number itself, without "
        "quotes",
        "close not a number": "{what} should be a number, got {kind}",
        "close number": "{what} is {actual:.6g}, expected {expected:.6g} (within rtol={rtol:g})",
        "not a tensor": "{what} should be a tensor, but it is {kind}",
        "tensor subclass": "{what} is of type {kind}, a subclass of torch.Tensor: return a plain "
        "torch.Tensor",
        "refused": "your function called the course's own {name}(), the reference the check "
        "compares with: the exercise is to write that part yourself, in PyTorch",
        "difference not a tensor": "{where} should be a tensor, but it is {kind} {got!r}",
        "difference device": "{where} is a tensor on {got}; it should be on {want}",
        "difference shape": "{where} should keep its shape and dtype {shape}, {dtype}",
        "difference type": "{where} should be of type {want}, but it is of type {got}",
        "difference namedtuple": "{where} should be of type {want}, but it is of type {got} (a "
        "namedtuple takes its fields as separate arguments: type(batch)(*values))",
        "difference keys": "{where} should have the keys {want}, not {got}",
        "difference length": "{where} should have {want} items, not {got}",
        "difference value": "{where} should stay {want!r}, but it is {got!r}",
        "function raised": "your function raised {kind}: {error}",
        "passed": "✓ {exercise}: all checks passed",
        "autocast left on": "a previous run left autocast on: restart the kernel (Kernel > "
        "Restart) and run the notebook again; this check turned it off to judge your function "
        "alone",
    },
)


def check_parts(parts: Mapping[str, Callable[[], None]]) -> None:
    """Run each part of an exercise (``name: check``; a check raises :class:`CheckFailed`
    when that part is wrong); each part is worth the same share of the points.

    All right: return. None right: :class:`CheckFailed`. Some right: :class:`PartialCredit`
    for the share that was right, its feedback naming each wrong part (the course's grader
    scores that share only when the check cell itself calls this function).

    >>> def right() -> None: pass
    >>> def wrong() -> None: check(False, "pin the batches")
    >>> check_parts({"to_gpu": right, "gpu_loader": right})
    >>> check_parts({"to_gpu": right, "gpu_loader": wrong})
    Traceback (most recent call last):
    ...
    course_utils.classroom.PartialCredit: 1 of 2 parts right; gpu_loader: pin the batches
    """
    if not parts:
        raise ValueError("check_parts needs at least one part")
    wrong = []
    for name, part in parts.items():
        try:
            part()
        except CheckFailed as failure:
            wrong.append(f"{name}: {failure}")
        except Exception as error:  # the learner's code raised: that part is wrong
            said = MESSAGES_CHECKS["part raised"].format(kind=type(error).__name__, error=error)
            wrong.append(f"{name}: {said}")
    if not wrong:
        return
    right = len(parts) - len(wrong)
    feedback = MESSAGES_CHECKS["parts right"].format(
        right=right, total=len(parts), wrong="; ".join(wrong)
    )
    if right == 0:
        raise CheckFailed(feedback)
    raise PartialCredit(feedback, right / len(parts))


def check(condition: Any, feedback: str) -> None:
    """Raise :class:`CheckFailed` with ``feedback`` unless ``condition`` is true.

    >>> check(1 + 1 == 2, "arithmetic is broken")
    >>> check([], "your list is empty")
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: your list is empty
    """
    if not condition:
        raise CheckFailed(feedback)


def _is_number_text(text: str) -> bool:
    """Whether ``text`` is a number written as text (``'256'``, ``' 0.8 '``)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_close(
    actual: Any,
    expected: Any,
    what: str,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-8,
) -> None:
    """Check that a number or tensor is close to the expected one, naming ``what``.

    >>> check_close(0.1 + 0.2, 0.3, "the sum")
    >>> check_close(2.0, 3.0, "the speed-up")
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: the speed-up is 2, expected 3 (within rtol=1e-05)
    """
    plain_value(actual, what)
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        actual_t = torch.as_tensor(actual).detach().cpu().double()
        expected_t = torch.as_tensor(expected).detach().cpu().double()
        check(
            actual_t.shape == expected_t.shape,
            MESSAGES_CHECKS["close shape"].format(
                what=what, shape=tuple(actual_t.shape), expected=tuple(expected_t.shape)
            ),
        )
        worst = (actual_t - expected_t).abs().max().item() if actual_t.numel() else 0.0
        check(
            torch.allclose(actual_t, expected_t, rtol=rtol, atol=atol),
            MESSAGES_CHECKS["close values"].format(what=what, worst=worst),
        )
        return
    if isinstance(actual, str) and _is_number_text(actual):
        raise CheckFailed(MESSAGES_CHECKS["close text"].format(what=what, actual=actual))
    check(
        isinstance(actual, int | float) and not isinstance(actual, bool),
        MESSAGES_CHECKS["close not a number"].format(what=what, kind=type(actual).__name__),
    )
    if not math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol):
        raise CheckFailed(
            MESSAGES_CHECKS["close number"].format(
                what=what, actual=actual, expected=expected, rtol=rtol
            )
        )


def passed(exercise: str) -> None:
    """Print the success line of a check cell."""
    print(MESSAGES_CHECKS["passed"].format(exercise=exercise))


@dataclass(frozen=True)
class TensorMove:
    """One call of ``Tensor.to`` seen by :func:`record_tensor_to`."""

    source_device: str
    pinned: bool  # the source tensor was in pinned (page-locked) memory
    non_blocking: bool  # the call asked for an asynchronous copy
    target: str  # the device (or dtype) asked for, as text
    source_id: int = 0  # id() of the tensor the call was made on
    result_id: int = 0  # id() of the tensor it returned
    source_dtype: torch.dtype | None = None  # the dtype of the tensor the call was made on


@contextlib.contextmanager
def record_tensor_to(*, pretend_cuda: bool = False) -> Iterator[list[TensorMove]]:
    """Record every ``Tensor.to(...)`` call made inside the ``with`` block (a spy: the
    calls still run). Exercise checks use it to see *how* a learner moved a batch.
    ``pretend_cuda=True``: a move to a CUDA device (``.to`` or ``.cuda``) is recorded and
    returns a CPU copy instead, so that a CPU grader can watch code written for a GPU.

    >>> with record_tensor_to() as moves:
    ...     _ = torch.ones(2).to("cpu", non_blocking=True)
    >>> [(move.source_device, move.non_blocking) for move in moves]
    [('cpu', True)]
    >>> with record_tensor_to(pretend_cuda=True) as moves:
    ...     _ = torch.ones(2).to("cuda:0")
    >>> moves[0].target, _.device.type
    ('cuda:0', 'cpu')
    """
    original_to, original_cuda = torch.Tensor.to, torch.Tensor.cuda
    own = {name: name in vars(torch.Tensor) for name in ("to", "cuda")}  # else from TensorBase
    moves: list[TensorMove] = []

    def record(self: torch.Tensor, target: Any, asynchronous: Any, move: Any) -> Any:
        pinned = self.device.type == "cpu" and bool(self.is_pinned())
        plain_value(asynchronous, "non_blocking")  # a subclass of int could say it is true
        result = self.detach().clone() if pretend_cuda and is_cuda_target(target) else move()
        moves.append(
            TensorMove(
                str(self.device),
                pinned,
                bool(asynchronous),
                str(target),
                id(self),
                id(result),
                self.dtype,
            )
        )
        return result

    def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        target = kwargs.get("device", kwargs.get("dtype", args[0] if args else ""))
        # positional forms: to(device, dtype, non_blocking) or to(dtype, non_blocking)
        asynchronous = kwargs.get("non_blocking", any(arg is True for arg in args))
        return record(self, target, asynchronous, lambda: original_to(self, *args, **kwargs))

    def cuda_spy(self: torch.Tensor, device: Any = None, non_blocking: bool = False) -> Any:
        target = torch.device("cuda", device) if isinstance(device, int) else device or "cuda"
        return record(self, target, non_blocking, lambda: original_cuda(self, device, non_blocking))

    torch.Tensor.to = spy  # type: ignore[method-assign,assignment]
    if pretend_cuda:
        torch.Tensor.cuda = cuda_spy  # type: ignore[method-assign,assignment]
    try:
        yield moves
    finally:
        for name, method in (("to", original_to), ("cuda", original_cuda)):
            if own[name]:
                setattr(torch.Tensor, name, method)
            elif name in vars(torch.Tensor):
                delattr(torch.Tensor, name)


def is_cuda_target(target: Any) -> bool:
    """Whether a ``Tensor.to`` target (a device, its name or index; not a dtype) is CUDA.

    >>> is_cuda_target("cuda:1"), is_cuda_target(torch.device("cpu")), is_cuda_target(torch.float16)
    (True, False, False)
    """
    if isinstance(target, torch.dtype | torch.Tensor | bool):
        return False
    try:
        return torch.device(target).type == "cuda"
    except (RuntimeError, TypeError, ValueError):
        return False


#: Notebook 03's check messages, by a stable name (see :data:`MESSAGES_01`). Exercise (b)'s
#: feedback on one tensor of the batch has one message per tensor of the check's batch
#: (``"to_gpu <tensor> <mistake>"``, the tensors of :data:`TO_GPU_TENSORS`).
MESSAGES_03 = Messages(
    "03",
    {
        "to_gpu pinned itself": "to_gpu pinned the tensors itself (.pin_memory()): the "
        "DataLoader's pin_memory=True has already pinned them, and pinning a pageable tensor "
        "in the loop costs one more copy of the batch; call .to(device, non_blocking=True) on "
        "the batch's own tensors",
        "to_gpu not a tensor": "to_gpu called a tensor method on a value that is not a tensor "
        "({error}): go inside tuples, lists and dicts, copy only the tensors, return other "
        "values as they are",
        "to_gpu raised": "to_gpu(batch, device) raised {kind}: {error}",
        "to_gpu changed the dict": "to_gpu changed the dict inside the batch it was given: "
        "build a new dict instead",
        "to_gpu shape": "return the batch in its own shape: here a sequence of 4 items whose "
        "second item is a dict with the same keys ('label', 'mask') and whose last is a list "
        "of 4 tensors",
        "to_gpu names": "the file names (batch[2]) are not tensors: return them as they are",
        "to_gpu images rebuilt": "the images tensor (batch[0]) was not copied: you copied a "
        "new tensor made from it (clone, contiguous, torch.tensor...), which is in pageable "
        "memory, so that copy cannot be asynchronous: call .to(device, non_blocking=True) on "
        "the batch's own tensor",
        "to_gpu images not copied": "the images tensor (batch[0]) was not copied: copy every "
        "tensor of the batch, also those inside dicts, lists and tuples, with .to(device)",
        "to_gpu images blocking": "the images tensor (batch[0]) is in pinned memory but was "
        "copied with non_blocking=False (the default), so the host waits for each copy: pass "
        "non_blocking=True (or non_blocking=tensor.is_pinned())",
        "to_gpu images not its copy": "to_gpu returned the images tensor (batch[0]) itself, "
        "not its copy: .to returns a new tensor on the device, it does not move the tensor in "
        "place",
        "to_gpu labels rebuilt": "the labels tensor (batch[1]['label']) was not copied: you "
        "copied a new tensor made from it (clone, contiguous, torch.tensor...), which is in "
        "pageable memory, so that copy cannot be asynchronous: call .to(device, "
        "non_blocking=True) on the batch's own tensor",
        "to_gpu labels not copied": "the labels tensor (batch[1]['label']) was not copied: "
        "copy every tensor of the batch, also those inside dicts, lists and tuples, with "
        ".to(device)",
        "to_gpu labels blocking": "the labels tensor (batch[1]['label']) is in pinned memory "
        "but was copied with non_blocking=False (the default), so the host waits for each "
        "copy: pass non_blocking=True (or non_blocking=tensor.is_pinned())",
        "to_gpu labels not its copy": "to_gpu returned the labels tensor (batch[1]['label']) "
        "itself, not its copy: .to returns a new tensor on the device, it does not move the "
        "tensor in place",
        "to_gpu mask rebuilt": "the mask tensor (batch[1]['mask']) was not copied: you copied "
        "a new tensor made from it (clone, contiguous, torch.tensor...), which is in pageable "
        "memory, so that copy cannot be asynchronous: call .to(device, non_blocking=True) on "
        "the batch's own tensor",
        "to_gpu mask not copied": "the mask tensor (batch[1]['mask']) was not copied: copy "
        "every tensor of the batch, also those inside dicts, lists and tuples, with "
        ".to(device)",
        "to_gpu mask not its copy": "to_gpu returned the mask tensor (batch[1]['mask']) "
        "itself, not its copy: .to returns a new tensor on the device, it does not move the "
        "tensor in place",
        "to_gpu first boxes rebuilt": "the boxes of the first image (batch[3][0], in a list) "
        "was not copied: you copied a new tensor made from it (clone, contiguous, "
        "torch.tensor...), which is in pageable memory, so that copy cannot be asynchronous: "
        "call .to(device, non_blocking=True) on the batch's own tensor",
        "to_gpu first boxes not copied": "the boxes of the first image (batch[3][0], in a "
        "list) was not copied: copy every tensor of the batch, also those inside dicts, lists "
        "and tuples, with .to(device)",
        "to_gpu first boxes blocking": "the boxes of the first image (batch[3][0], in a list) "
        "is in pinned memory but was copied with non_blocking=False (the default), so the "
        "host waits for each copy: pass non_blocking=True (or "
        "non_blocking=tensor.is_pinned())",
        "to_gpu first boxes not its copy": "to_gpu returned the boxes of the first image "
        "(batch[3][0], in a list) itself, not its copy: .to returns a new tensor on the "
        "device, it does not move the tensor in place",
        "to_gpu last boxes rebuilt": "the boxes of the last image (batch[3][3], in a list) "
        "was not copied: you copied a new tensor made from it (clone, contiguous, "
        "torch.tensor...), which is in pageable memory, so that copy cannot be asynchronous: "
        "call .to(device, non_blocking=True) on the batch's own tensor",
        "to_gpu last boxes not copied": "the boxes of the last image (batch[3][3], in a list) "
        "was not copied: copy every tensor of the batch, also those inside dicts, lists and "
        "tuples, with .to(device)",
        "to_gpu last boxes blocking": "the boxes of the last image (batch[3][3], in a list) "
        "is in pinned memory but was copied with non_blocking=False (the default), so the "
        "host waits for each copy: pass non_blocking=True (or "
        "non_blocking=tensor.is_pinned())",
        "to_gpu last boxes not its copy": "to_gpu returned the boxes of the last image "
        "(batch[3][3], in a list) itself, not its copy: .to returns a new tensor on the "
        "device, it does not move the tensor in place",
        "to_gpu container types": "keep each container's type: the batch is a tuple and its "
        "boxes a list, but you returned a {outer} holding a {inner}: build each one with "
        "type(batch)(...)",
        "gpu_loader failed": "gpu_loader(..., workers=0) failed: {error}",
        "gpu_loader not pinned": "without pin_memory=True the batches stay in pageable memory, "
        "where .to(device, non_blocking=True) is an ordinary blocking copy",
        "gpu_loader setting": "gpu_loader(dataset, 4, workers=2) should set {setting}={wanted!r}",
        "gpu_loader no shuffle": "the loader should shuffle (shuffle=True)",
        "gpu_loader not pinned on the GPU": "on this GPU machine the batches should arrive pinned",
        # (a) the knee of a batch-size sweep
        "knee table": "knee(table) returned {got}: the knee is the smallest batch whose rate is "
        "at least fraction × the best rate (rows (3, 40.0), (12, 92.0), (48, 100.0) give 12)",
        "knee order": "the rows can come in any order: do not assume they are sorted",
        "knee fraction ignored": "with fraction=0.99 your knee gave 16, the knee at the default "
        "0.9: use the fraction argument",
        "knee fraction": "with fraction=0.99 your knee gave {got}: a batch qualifies when its "
        "rate is at least fraction × the best rate",
        "knee strict": "at fraction=0.5 your knee gave 32, as if a rate of exactly half the best "
        "did not qualify: 'at least' includes it, so use >=, not >",
        "knee half": "at fraction=0.5 your knee gave {got} for the rows {half}: a batch "
        "qualifies when its rate is at least fraction × the best rate",
        "knee largest": "your knee gave 4 for rows whose best rate is not the largest batch's, "
        "as if the best were the largest batch's rate: take the highest rate of all the rows",
        "knee peak": "your knee gave {got} for the rows {peak}: the best rate is the highest of "
        "all the rows, wherever it comes",
    },
)

#: The tensors of exercise 03 (b)'s batch, each by the name its messages have in
#: :data:`MESSAGES_03`.
TO_GPU_TENSORS = ("images", "labels", "mask", "first boxes", "last boxes")


def check_knee(knee: Callable[..., Any]) -> None:
    """Exercise 03 (a): ``knee(rows, fraction=0.9)`` on four tables (in order, reversed, a
    fraction of 0.99, a rate of exactly half the best, the best rate mid-table). A mistake
    is named only when the answer's knee is the one that mistake gives on that table;
    otherwise the rule is said, with another table's knee, never the failed table's.

    >>> def knee(rows, fraction=0.9):
    ...     best = max(rate for _, rate in rows)
    ...     return min(size for size, rate in rows if rate >= fraction * best)
    >>> check_knee(knee)
    >>> check_knee(lambda rows, fraction=0.9: 16)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: with fraction=0.99 your knee gave 16, the knee at ...
    """
    table = [(1, 100.0), (4, 350.0), (16, 920.0), (64, 1000.0), (256, 1010.0)]
    got = plain_value(knee(table), "knee(table)")
    check(got == 16, MESSAGES_03["knee table"].format(got=got))
    check(plain_value(knee(list(reversed(table))), "knee(rows)") == 16, MESSAGES_03["knee order"])
    got = plain_value(knee(table, fraction=0.99), "knee(table, fraction=0.99)")
    check(got != 16, MESSAGES_03["knee fraction ignored"])
    check(got == 64, MESSAGES_03["knee fraction"].format(got=got))
    half = [(32, 1000.0), (8, 500.0), (2, 100.0)]
    got = plain_value(knee(half, fraction=0.5), "knee(rows, fraction=0.5)")
    check(got != 32, MESSAGES_03["knee strict"])
    check(got == 8, MESSAGES_03["knee half"].format(got=got, half=half))
    peak = [(4, 650.0), (16, 1000.0), (64, 700.0)]
    got = plain_value(knee(peak), "knee(rows)")
    check(got != 4, MESSAGES_03["knee largest"])
    check(got == 16, MESSAGES_03["knee peak"].format(got=got, peak=peak))


class RaisedText(str):
    """The sentence :func:`answer_or_error` gives for a learner's function that raised (a
    ``str``, in the learner's language): :func:`raised` tells it from an answer that is
    text."""


def is_raised(value: Any) -> bool:
    """Whether ``value`` is :func:`answer_or_error`'s sentence for a function that raised.

    >>> is_raised(answer_or_error(int, "seven")), is_raised("your function raised")
    (True, False)
    """
    return isinstance(value, RaisedText)


def _raised_text(error: Exception) -> RaisedText:
    return RaisedText(
        MESSAGES_CHECKS["function raised"].format(kind=type(error).__name__, error=error)
    )


def answer_or_error(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, or, if it raises, a sentence saying what it raised
    (so that a check's feedback can quote it instead of stopping with a traceback). An
    unanswered exercise's ``NotImplementedError`` propagates: the grader reports "not answered";
    so does a :class:`CheckFailed` raised by a check's spy inside the learner's call.

    >>> answer_or_error(int, "7"), answer_or_error(int, "seven")
    (7, "your function raised ValueError: invalid literal for int() with base 10: 'seven'")
    """
    try:
        return function(*args, **kwargs)
    except (NotImplementedError, CheckFailed):  # not answered; a check's spy caught a mistake
        raise
    except Exception as error:  # any mistake of the learner's: report it in words
        return _raised_text(error)


def answer_and_error(function: Any, *args: Any) -> tuple[Any, str | None]:
    """``(function(*args), None)``, or ``(None, a sentence saying what it raised)``: as
    :func:`answer_or_error`, for answers that may rightly or wrongly return text.

    >>> answer_and_error(str, 7), answer_and_error(int, "seven")[1][:32]
    (('7', None), 'your function raised ValueError:')
    """
    try:
        return function(*args), None
    except (NotImplementedError, CheckFailed):  # not answered; a check's spy caught a mistake
        raise
    except Exception as error:  # any mistake of the learner's: report it in words
        return None, _raised_text(error)


def _kind(value: Any) -> str:
    return type(value).__name__ if value is not None else "None"


def first_difference(got: Any, want: Any, where: str = "batch") -> str | None:
    """Where a nested batch ``got`` (tuples, lists, dicts, namedtuples, tensors) first
    differs from ``want``, in words; ``None`` when they match (tensors: same device, shape
    and dtype; other values: equal; containers: the same type).

    >>> first_difference({"x": [torch.ones(1)]}, {"x": (torch.ones(1),)})
    "batch['x'] should be of type tuple, but it is of type list"
    >>> first_difference([torch.ones(1)], [torch.ones(1, device="meta")])
    'batch[0] is a tensor on cpu; it should be on meta'
    >>> first_difference((1, "a"), (1, "a")) is None
    True
    """
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return MESSAGES_CHECKS["difference not a tensor"].format(
                where=where, kind=_kind(got), got=got
            )
        if got.device.type != want.device.type:
            return MESSAGES_CHECKS["difference device"].format(
                where=where, got=got.device.type, want=want.device.type
            )
        if got.shape != want.shape or got.dtype != want.dtype:
            return MESSAGES_CHECKS["difference shape"].format(
                where=where, shape=tuple(want.shape), dtype=want.dtype
            )
        return None
    if type(got) is not type(want):
        named = isinstance(want, tuple) and hasattr(want, "_fields")
        return MESSAGES_CHECKS["difference namedtuple" if named else "difference type"].format(
            where=where, want=_kind(want), got=_kind(got)
        )
    if isinstance(want, dict):
        kinds = [
            (type(g), type(w)) for g, w in zip(got, want, strict=False) if type(g) is not type(w)
        ]
        if kinds:  # a key of a subclass of str could equal any key
            return MESSAGES_CHECKS["difference type"].format(
                where=f"{where}.keys()", want=kinds[0][1].__name__, got=kinds[0][0].__name__
            )
        if list(got) != list(want):
            return MESSAGES_CHECKS["difference keys"].format(
                where=where, want=list(want), got=list(got)
            )
        pairs = [(got[key], want[key], f"{where}[{key!r}]") for key in want]
    elif isinstance(want, list | tuple):
        if len(got) != len(want):
            return MESSAGES_CHECKS["difference length"].format(
                where=where, want=len(want), got=len(got)
            )
        pairs = [(g, w, f"{where}[{i}]") for i, (g, w) in enumerate(zip(got, want, strict=True))]
    else:
        if got == want:
            return None
        return MESSAGES_CHECKS["difference value"].format(where=where, want=want, got=got)
    for got_item, want_item, place in pairs:
        if (difference := first_difference(got_item, want_item, place)) is not None:
            return difference
    return None


@contextlib.contextmanager
def record_autocast(
    module: torch.nn.Module, device_type: str = "cpu"
) -> Iterator[list[torch.dtype | None]]:
    """Spy on ``module``: for each call made inside the ``with`` block, the dtype
    ``torch.autocast`` was casting to for ``device_type`` (``None``: autocast was off).

    >>> layer = torch.nn.Linear(2, 2)
    >>> with record_autocast(layer) as seen:
    ...     _ = layer(torch.ones(1, 2))
    ...     with torch.autocast("cpu", dtype=torch.bfloat16):
    ...         _ = layer(torch.ones(1, 2))
    >>> seen
    [None, torch.bfloat16]
    """
    seen: list[torch.dtype | None] = []

    def hook(_module: Any, _args: Any) -> None:
        enabled = torch.is_autocast_enabled(device_type)
        seen.append(torch.get_autocast_dtype(device_type) if enabled else None)

    handle = module.register_forward_pre_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


# ------------------------------------------------------------------ behaviour, not shape


def exact_tensor(value: Any, what: str) -> torch.Tensor:
    """``value`` itself if it is a plain ``torch.Tensor`` (an ``nn.Parameter`` too), else
    :class:`CheckFailed`. A subclass of ``torch.Tensor`` can answer every comparison
    (``==``, ``torch.allclose``, ``torch.equal``) with True, so checks compare plain ones.

    >>> exact_tensor(torch.ones(1), "the output").tolist()
    [1.0]
    >>> class Agreeable(torch.Tensor): ...
    >>> exact_tensor(torch.ones(1).as_subclass(Agreeable), "the output")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: the output is of type Agreeable, a subclass of ...: ...
    """
    check(
        isinstance(value, torch.Tensor),
        MESSAGES_CHECKS["not a tensor"].format(what=what, kind=_kind(value)),
    )
    check(
        type(value) in (torch.Tensor, torch.nn.Parameter),
        MESSAGES_CHECKS["tensor subclass"].format(what=what, kind=type(value).__name__),
    )
    return value


#: The types :func:`plain_value` takes as they are (``RaisedText``: the course's own
#: sentence for an answer that raised); the containers whose elements it checks in turn.
_PLAIN_EXACT = frozenset({type(None), bool, int, float, complex, str, bytes, RaisedText})
_PLAIN_CONTAINERS = (tuple, list, dict, set, frozenset)
_BUILT_IN = (int, float, complex, str, bytes, *_PLAIN_CONTAINERS)


@functools.cache
def _numpy_scalar_types(numpy: Any) -> frozenset[type]:
    return frozenset(numpy.sctypeDict.values())


def _is_numpy_scalar(kind: type) -> bool:
    numpy = sys.modules.get("numpy")  # not imported: the value cannot be one of its scalars
    return numpy is not None and kind in _numpy_scalar_types(numpy)


def plain_value(value: Any, what: str) -> Any:
    """``value`` itself if it, and every element, key and value it holds (tuples, lists,
    dicts, sets), is of a built-in type exactly, a NumPy scalar or a plain tensor
    (:func:`exact_tensor`), else :class:`CheckFailed` naming the type. A subclass of
    ``int``, ``float``, ``str``, ``tuple``... can answer ``==``, ``<``, ``in``, ``bool()``
    or ``float()`` with anything, so checks compare plain ones; a value of another type
    (``None`` where a number was due, a set for a tuple) is left to the check's own tests.

    >>> plain_value([1, 2.5, ("a", None)], "f()")
    [1, 2.5, ('a', None)]
    >>> class Yes(int):
    ...     __eq__ = lambda *args: True
    >>> plain_value((1, Yes(2)), "f()")
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: f()[1] should be of type int, but it is of type Yes
    """
    fault = plain_value_fault(value, what)
    if fault is not None:
        name, fields = fault
        raise CheckFailed(MESSAGES_CHECKS[name].format(**fields))
    return value


def plain_value_fault(value: Any, what: str) -> tuple[str, dict[str, str]] | None:
    """Where :func:`plain_value` finds ``value`` not plain, as data: the name of its
    message in :data:`MESSAGES_CHECKS` (``difference type``, ``tensor subclass``) and the
    message's fields; ``None`` when it is plain. A check's observing half
    (:mod:`course_utils.checks`) reports it, and the deciding half says it.

    >>> class Yes(int):
    ...     __eq__ = lambda *args: True
    >>> plain_value_fault((1, Yes(2)), "f()")
    ('difference type', {'where': 'f()[1]', 'want': 'int', 'got': 'Yes'})
    >>> plain_value_fault([1, 2.5], "f()") is None
    True
    """
    seen: set[int] = set()

    def visit(item: Any, where: str) -> tuple[str, dict[str, str]] | None:
        kind = type(item)
        if kind in _PLAIN_EXACT or kind in (torch.Tensor, torch.nn.Parameter):
            return None
        if isinstance(item, torch.Tensor):
            return "tensor subclass", {"what": where, "kind": kind.__name__}
        if _is_numpy_scalar(kind):
            return None
        base = next((b for b in _BUILT_IN if isinstance(item, b)), None)
        if base is None:
            return None
        if kind is not base:
            return "difference type", {"where": where, "want": base.__name__, "got": kind.__name__}
        if id(item) in seen:
            return None
        seen.add(id(item))
        if kind is dict:
            inside = [(key, where) for key in item]
            inside += [(element, f"{where}[{key!r}]") for key, element in item.items()]
        else:
            inside = [
                (element, f"{where}[{i}]" if kind in (tuple, list) else where)
                for i, element in enumerate(item)
            ]
        for element, at in inside:
            found = visit(element, at)
            if found is not None:
                return found
        return None

    return visit(value, what)


def _refused(name: str) -> CheckFailed:
    return CheckFailed(MESSAGES_CHECKS["refused"].format(name=name))


def _refusing(*args: Any, **kwargs: Any) -> Any:
    # lazy: this code runs as the refused helper, with that helper's module globals
    import sys as _sys

    from course_utils.classroom import _refused as refused  # lazy: as above

    raise refused(_sys._getframe().f_code.co_name)


#: True in the grader's checker process (:mod:`course_utils.instructor.checker`), where a
#: learner's function is a stand-in that runs in another process.
_IN_CHECKER = [False]


def mark_checker_process() -> None:
    """Called by the grader's checker: refusing helpers there would refuse nothing."""
    _IN_CHECKER[0] = True


class NeedsBeside(RuntimeError):
    """What must run beside the answer (in the learner's process: an observing half of
    :mod:`course_utils.checks.evidence`) ran in the grader's checker."""


@contextlib.contextmanager
def course_helpers_refused(namespace: dict[str, Any], *names: str) -> Iterator[None]:
    """Inside the block, calling one of the course's helpers ``names`` (as the notebook's
    ``namespace`` holds them) raises :class:`CheckFailed` saying that the exercise is to
    write it: however the learner's code reaches the helper (its name, its module, another
    name), the helper's code is swapped for a refusal while the block runs.

    >>> from course_utils.device import to_device
    >>> space = {"to_device": to_device}
    >>> with course_helpers_refused(space, "to_device"):
    ...     answer_or_error(lambda: to_device(torch.ones(1), "cpu"))
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: your function called the course's own to_device(), ...
    >>> to_device(torch.ones(1), "cpu").tolist()
    [1.0]
    """
    if _IN_CHECKER[0]:  # the learner's function runs elsewhere: nothing would be refused
        raise NeedsBeside(
            f"refusing {', '.join(names)} needs the learner's function in this process: "
            "call it from an observing half (course_utils.checks.evidence, instructor guide)"
        )
    swapped: list[tuple[Any, Any]] = []
    replaced: list[tuple[str, Any]] = []
    for name in names:
        helper = namespace.get(name)
        if helper is None:
            continue
        code = getattr(helper, "__code__", None)
        if code is not None and not code.co_freevars:  # a plain function: swap its code
            swapped.append((helper, code))
            helper.__code__ = _refusing.__code__.replace(co_name=name)
        else:  # a wrapped or built-in callable: replace the notebook's name for it
            replaced.append((name, helper))
            namespace[name] = _refusing_as(name)
    try:
        yield
    finally:
        for helper, code in swapped:
            helper.__code__ = code
        for name, helper in replaced:
            namespace[name] = helper


def without_course_helpers(
    function: Callable[..., Any], *helpers: Callable[..., Any]
) -> Callable[..., Any]:
    """``function`` (a learner's), calling which refuses the course's ``helpers`` while it
    runs (:func:`course_helpers_refused`): a check cell calls the learner's function through
    it and still uses the helpers itself, for the expected values.

    >>> from course_utils.footprint import optimizer_state_bytes
    >>> def counted(optimizer):
    ...     return optimizer_state_bytes(optimizer)
    >>> yours = without_course_helpers(counted, optimizer_state_bytes)
    >>> yours(torch.optim.SGD([torch.ones(1, requires_grad=True)]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: your function called the course's own ...
    """
    table = {helper.__name__: helper for helper in helpers}

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        with course_helpers_refused(table, *table):
            return function(*args, **kwargs)

    return guarded


def _refusing_as(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise _refused(name)

    return refuse


@contextlib.contextmanager
def uninitialised_memory_filled() -> Iterator[None]:
    """Inside the block, memory PyTorch hands out uninitialised (``torch.empty``,
    ``new_empty``, ``empty_like``) is filled with NaN (integers: their largest value), so a
    check sees values the learner's code never set, whatever was in memory before. It turns
    on ``torch.use_deterministic_algorithms`` (warnings only) for the block.

    >>> with uninitialised_memory_filled():
    ...     rows = torch.empty(2)
    >>> rows.isnan().all().item(), torch.are_deterministic_algorithms_enabled()
    (True, False)
    """
    import torch.utils.deterministic as deterministic  # lazy: a flag read at import

    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)
    deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "has no deterministic implementation": only warns
            yield
    finally:
        deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def matching_mistake(
    got: Sequence[Any],
    mistakes: Mapping[str, Sequence[Any]],
    right: Sequence[Any],
    same: Callable[[Any, Any], bool],
) -> str | None:
    """The one usual mistake whose results match the learner's ``got`` on every case, or
    ``None`` when none does or several do (then the feedback describes what it saw instead
    of guessing a cause). ``mistakes`` maps each mistake's name to what it returns on each
    case; a mistake that is right on every case is never named.

    >>> same = lambda a, b: a == b
    >>> matching_mistake([2, 4], {"doubled": [2, 4], "squared": [1, 4]}, [1, 2], same)
    'doubled'
    >>> matching_mistake([2, 5], {"doubled": [2, 4], "squared": [1, 4]}, [1, 2], same) is None
    True
    """

    def matches(values: Sequence[Any]) -> bool:
        return all(same(a, b) for a, b in zip(got, values, strict=True))

    found = [name for name, values in mistakes.items() if matches(values) and not matches(right)]
    return found[0] if len(found) == 1 else None


#: Notebook 01's check messages, by a stable name: one sentence each, ``{placeholders}``
#: for the figures of the case the learner's answer failed.
MESSAGES_01 = Messages(
    "01",
    {
        "time_it raised": "{error} (on repeats that took {shown})",
        "time_it calls": "call fn warmup + repeats = {warmup} + {repeats} times; it ran "
        "{calls} times",
        "time_it no clock": "your time_it never read a clock: read time.perf_counter() before and "
        "after each timed fn() call",
        "time_it not a number": "return the median in seconds, as a float; got {kind}",
        "time_it mean": "repeats that took {shown} gave {got}, the mean of the repeats; return "
        "their median (one slow repeat, a page fault or another process, does not move it)",
        "time_it fastest": "repeats that took {shown} gave {got}, the fastest repeat; return the "
        "median of the repeats",
        "time_it slowest": "repeats that took {shown} gave {got}, the slowest repeat; return the "
        "median of the repeats",
        "time_it total": "repeats that took {shown} gave {got}, their total; return the median "
        "of the repeats",
        "time_it warm-up timed": "repeats that took {shown} gave {got}: the slow warm-up calls "
        "were timed too; run the warm-up calls first, untimed, then time the repeats",
        "time_it mean of all": "repeats that took {shown} gave {got}, the mean of all calls, the "
        "slow warm-up calls timed too: run the warm-up calls untimed, then return the median "
        "of the repeats",
        "time_it milliseconds": "repeats that took {shown} gave {got}, the median in "
        "milliseconds: return seconds",
        "time_it upper middle": "repeats that took {shown} gave {got}, the upper of the two "
        "middle values: with an even number of repeats the median is the mean of the two "
        "middle ones (statistics.median: 3 ms for 1, 2, 4 and 9 ms)",
        "time_it lower middle": "repeats that took {shown} gave {got}, the lower of the two "
        "middle values (what torch.median returns): with an even number of repeats the median "
        "is the mean of the two middle ones (statistics.median: 3 ms for 1, 2, 4 and 9 ms)",
        "time_it unsorted middle": "repeats that took {shown} gave {got}, the repeat in the middle "
        "of the list as it was timed: sort the times first, or use statistics.median",
        "time_it duplicates dropped": "repeats that took {shown} gave {got}, the median of the "
        "distinct times: equal times each count (the median of 1, 1, 1, 5 and 9 ms is 1 ms)",
        "time_it not the median": "repeats that took {shown} gave {got}, which is not their "
        "median: time each fn() call alone and return statistics.median of the repeats (3 ms "
        "for 1, 2, 4 and 9 ms)",
        "time_it synced a CPU device": "timing a CPU device while CUDA was available, your "
        "time_it called torch.cuda.synchronize(): synchronize only when the device being timed "
        "is a GPU, device.type == 'cuda'",
        "time_it synced because CUDA exists": "timing a CPU device, your time_it synchronized "
        "CUDA because torch.cuda.is_available() was True: decide by the device being timed, "
        "device.type == 'cuda', not by whether a GPU exists",
        "time_it synced another GPU": "timing cuda:1, your time_it synchronized {synced}: "
        "synchronize the device being timed, torch.cuda.synchronize(device)",
        "time_it no sync on GPU": "timing cuda:1, your time_it never called "
        "torch.cuda.synchronize(): on a CUDA device synchronize before starting the clock and "
        "after fn(), torch.cuda.synchronize(device)",
        "to_device raised": "{error}, given {what}",
        "to_device wrong": "in what your function returned, {difference}, given {what}",
        "to_device changed the batch": "your function changed the batch it was given "
        "(afterwards, {difference}): build new containers and leave the old ones as they were",
        "mixed_forward shape": "give back the output of model(x), of shape (8, 4)",
        "mixed_forward autocast device": "x is on {device}, but you ran autocast for {devices}: "
        "write torch.autocast(x.device.type, ...), which follows x",
        "mixed_forward no autograd": "a training step's forward pass must keep autograd on: no "
        "torch.no_grad() or .detach()",
        "mixed_forward autocast": "for {gpu}, run model(x) under torch.autocast(x.device.type, "
        "dtype=torch.{dtype})",
        "mixed_forward float32": "{gpu} has no tensor cores: run model(x) in float32, without "
        "autocast",
        "mixed_forward model converted": "your function converted the model's weights to "
        "{got} (model.half() or model.to(...)), so {gpu} trains in {got} weights: leave the model "
        "in float32 and run model(x) under torch.autocast(x.device.type, dtype=torch.{dtype})",
        "mixed_forward output cast": "your function ran model(x) in float32 and cast its output "
        "to {got}, which saves nothing inside the model: for {gpu}, run model(x) itself under "
        "torch.autocast(x.device.type, dtype=torch.{dtype})",
        "mixed_forward converted": "autocast casts inside each operation (the output for {gpu} "
        "is {dtype}): do not convert the model, x or the output yourself",
        "mixed_forward left on": "autocast is still on after your function returned: use it as "
        "a context manager, `with torch.autocast(...):`",
    },
)


def _as_text_rule(capability: tuple[int, int]) -> str:
    text = f"{capability[0]}.{capability[1]}"  # "10.0" < "8.0" as text
    return "bf16" if text >= "8.0" else "fp16" if text >= "7.0" else "fp32"


#: Each usual mistake of a precision rule (exercises 01 (b) and 05 (b)): the precision it
#: picks for a compute capability, "fp32", "fp16" or "bf16".
PRECISION_RULE_MISTAKES: dict[str, Callable[[tuple[int, int]], str]] = {
    "precision as text": _as_text_rule,
    "precision after 8.0": lambda c: "bf16" if c > (8, 0) else "fp16" if c >= (7, 0) else "fp32",
    "precision from 7.5": lambda c: "bf16" if c >= (8, 0) else "fp16" if c >= (7, 5) else "fp32",
    "precision named GPUs only": lambda c: {(8, 0): "bf16", (7, 5): "fp16"}.get(c, "fp32"),
    "precision fp16 before Volta": lambda c: "bf16" if c >= (8, 0) else "fp16",
    "precision Ampere only": lambda c: "bf16" if c[0] == 8 else "fp16" if c >= (7, 0) else "fp32",
}

#: The compute capabilities, Kepler to Blackwell, a precision rule is diagnosed on.
RULE_CAPABILITIES = [(3, 7), (6, 0), (6, 1), (7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 9)]
RULE_CAPABILITIES += [(9, 0), (10, 0), (12, 0)]

#: The precision-rule messages of exercises 01 (b) and 05 (b) (one rule, two notebooks).
MESSAGES_PRECISION_RULE = Messages(
    "precision rule",
    {
        "precision as text": "compute capability {capability} got {got}: the capabilities "
        'were compared as text, where "10.0" < "8.0"; compare tuples of numbers, capability >= '
        "(8, 0)",
        "precision after 8.0": "compute capability {capability} got {got}: bf16 starts at 8.0 "
        "itself (an A100), capability >= (8, 0), not >",
        "precision from 7.5": "compute capability {capability} got {got}: fp16 tensor cores start "
        "at 7.0 (Volta, a V100), not at 7.5",
        "precision named GPUs only": "compute capability {capability} got {got}: the rule is "
        "ranges of capabilities, not the GPUs named: bf16 from 8.0, fp16 from 7.0, float32 below",
        "precision fp16 before Volta": "compute capability {capability} got {got}: GPUs below 7.0 "
        "have no tensor cores, so they run in float32",
        "precision Ampere only": "compute capability {capability} got {got}: GPUs newer than "
        "Ampere (9.0 Hopper, 10.0 and 12.0 Blackwell) have bf16 too, capability >= (8, 0)",
        "precision wrong": "compute capability {capability} got {got}, which breaks the rule: "
        "bf16 from 8.0, fp16 from 7.0, float32 below",
    },
)


def precision_rule_feedback(
    picked: Mapping[tuple[int, int], str | None],
    shown: Mapping[tuple[int, int], str],
    *,
    describe: bool = True,
) -> str | None:
    """Feedback for a precision rule that picked ``picked[capability]`` ("fp32", "fp16",
    "bf16", or None: something else) on :data:`RULE_CAPABILITIES` (``None``: all right).
    It names the usual mistake whose picks match on every capability, else describes the
    first wrong one (``describe=False``: returns None then); ``shown`` says each pick as the
    exercise writes it."""
    right = {c: str(pick_precision("cuda", capability=c).name.value) for c in picked}
    wrong = [c for c in picked if picked[c] != right[c]]
    if not wrong:
        return None
    caps = list(picked)
    name = matching_mistake(
        [picked[c] for c in caps],
        {n: [rule(c) for c in caps] for n, rule in PRECISION_RULE_MISTAKES.items()},
        [right[c] for c in caps],
        lambda a, b: a == b,
    )
    if name is None and not describe:
        return None
    capability = next(
        (c for c in wrong if name and PRECISION_RULE_MISTAKES[name](c) != right[c]), wrong[0]
    )
    got = shown.get(capability, repr(picked[capability]))
    return MESSAGES_PRECISION_RULE[name or "precision wrong"].format(
        capability=f"{capability[0]}.{capability[1]}", got=got
    )


#: Notebook 02's check messages, by a stable name (see :data:`MESSAGES_01`).
MESSAGES_02 = Messages(
    "02",
    {
        "run_mfu raised": "{error} (on run_mfu({case}))",
        "run_mfu not a number": "run_mfu({case}) gave {kind}: return MFU as a number, a fraction "
        "such as 0.3",
        "run_mfu tera": "run_mfu({case}) gave {got:.3g}, as if the peak were in FLOP/s: "
        "peak_tflops is in TFLOP/s, so multiply it by 1e12 before dividing",
        "run_mfu giga": "run_mfu({case}) gave {got:.3g}, as if a TFLOP were 1e9 FLOPs: "
        "one TFLOP/s is 1e12 FLOP/s",
        "run_mfu percentage": "run_mfu({case}) gave {got:.3g}, a percentage: return the "
        "fraction (0.3 for 30%)",
        "run_mfu inverted": "run_mfu({case}) gave {got:.3g}, the peak over the achieved rate: "
        "MFU is the achieved FLOP/s over the peak, a fraction below 1",
        "run_mfu gpus cancel": "run_mfu({case}) gave {got:.3g}, the same as on one GPU: "
        "flops_per_step already counts the work of all the GPUs, so divide it by their "
        "combined peak, gpus × peak, without multiplying the FLOPs by gpus",
        "run_mfu flops times gpus": "run_mfu({case}) gave {got:.3g}, as if the FLOPs were "
        "multiplied by gpus: flops_per_step already counts the work of all the GPUs; divide it "
        "by their combined peak, gpus × peak",
        "run_mfu gpus twice": "run_mfu({case}) gave {got:.3g}, as if divided by gpus twice: "
        "divide the achieved FLOP/s once by the combined peak, gpus × peak",
        "run_mfu step multiplied": "run_mfu({case}) gave {got:.3g}, as if the FLOPs were "
        "multiplied by the step time: the achieved rate is flops_per_step / step_s",
        "run_mfu wrong": "run_mfu({case}) gave {got:.3g}, which is not achieved FLOP/s "
        "(flops_per_step / step_s) over the combined peak (gpus × peak_tflops × 1e12): "
        "3 TFLOP per 1 s step on one 10 TFLOP/s GPU is 0.3",
        "parse other line": "for {line!r} your function gave {got}: keep the number before "
        "any unit (MHz, C, MiB, W, %), None only where there is no number ('7 W, [N/A], 3 MHz' "
        "reads [7.0, None, 3.0])",
        "parse other line raised": "{error}, given {line!r}: keep the number before any unit "
        "(MHz, C, MiB, W, %), None only where there is no number ('7 W, [N/A], 3 MHz' reads "
        "[7.0, None, 3.0])",
        "parse nounits": "values printed with nounits have no unit",
        "parse H200 line": "recorded H200 line: {got}",
        "parse H200 field": "recorded H200 line: {field} read {got!r}, but a value is a number "
        "only where the field starts with one, and None where it does not ('7 W' reads 7.0, "
        "'Tesla T4' reads None)",
        "read_gpu MIG": "under MIG the utilization call raises nvml.NVMLError_NotSupported: "
        "return None for it, and still read the memory ({got})",
        "read_gpu MIG raised": "under MIG the utilization call raises "
        "nvml.NVMLError_NotSupported: return None for it, and still read the memory ({error} "
        "raised)",
        "read_gpu divided": "from byte counts that are not whole MiB your function read "
        "{got!r} (used, total), the bytes divided with /: floor them to whole MiB as ints, "
        "bytes // 2**20 (3932160 bytes, 3.75 MiB, read 3)",
        "read_gpu rounded": "from byte counts that are not whole MiB your function read "
        "{got!r} (used, total), each rounded to the nearest MiB: floor them instead, "
        "bytes // 2**20 (3932160 bytes, 3.75 MiB, read 3, not 4)",
        "read_gpu whole MiB": "NVML's byte counts are rarely whole MiB, and from such counts "
        "your function read {got!r} (used, total): give whole MiB as ints, bytes // 2**20 "
        "(3932160 bytes, 3.75 MiB, read 3)",
    },
)

#: Exercise 02 (b)'s cases (flops_per_step, step_s, peak_tflops, gpus), not the check
#: cell's: one GPU and several, so that each usual mistake differs from MFU somewhere.
RUN_MFU_CASES = [(2e12, 0.5, 16.0, 1), (4.8e13, 1.5, 20.0, 4), (9e12, 0.25, 120.0, 3)]


def check_run_mfu(run_mfu: Callable[..., Any]) -> None:
    """Exercise 02 (b): ``run_mfu(flops_per_step, step_s, peak_tflops, gpus)`` on
    :data:`RUN_MFU_CASES`; a wrong answer is told the usual mistake its results match on
    every case (TFLOP/s taken for FLOP/s, a percentage, the ratio inverted, the GPU count
    cancelled, doubled or squared...), else what it gave for one case."""
    got: list[float] = []
    for flops, step_s, peak, gpus in RUN_MFU_CASES:
        case = f"{flops:g}, {step_s:g}, {peak:g}, gpus={gpus}"
        out, error = answer_and_error(run_mfu, flops, step_s, peak, gpus)
        check(error is None, MESSAGES_02["run_mfu raised"].format(case=case, error=error))
        plain_value(out, f"run_mfu({case})")
        out = out.item() if isinstance(out, torch.Tensor) and out.numel() == 1 else out
        check(
            isinstance(out, int | float) and not isinstance(out, bool),
            MESSAGES_02["run_mfu not a number"].format(case=case, kind=_kind(out)),
        )
        got.append(float(out))
    right = [f / s / (g * p * 1e12) for f, s, p, g in RUN_MFU_CASES]

    def same(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=1e-6)

    if all(map(same, got, right)):
        return
    cases = list(zip(RUN_MFU_CASES, right, strict=True))
    mistakes = {
        "run_mfu tera": [r * 1e12 for _, r in cases],
        "run_mfu giga": [r * 1e3 for _, r in cases],
        "run_mfu percentage": [r * 100 for _, r in cases],
        "run_mfu inverted": [1 / r for _, r in cases],
        "run_mfu gpus cancel": [r * c[3] for c, r in cases],
        "run_mfu flops times gpus": [r * c[3] ** 2 for c, r in cases],
        "run_mfu gpus twice": [r / c[3] for c, r in cases],
        "run_mfu step multiplied": [r * c[1] ** 2 for c, r in cases],
    }
    name = matching_mistake(got, mistakes, right, same) or "run_mfu wrong"
    first = next(i for i, (a, b) in enumerate(zip(got, right, strict=True)) if not same(a, b))
    flops, step_s, peak, gpus = RUN_MFU_CASES[first]
    case = f"{flops:g}, {step_s:g}, {peak:g}, gpus={gpus}"
    raise CheckFailed(MESSAGES_02[name].format(case=case, got=got[first]))


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


#: Notebook 07's check messages, by a stable name (see :data:`MESSAGES_01`).
MESSAGES_07 = Messages(
    "07",
    {
        "after_empty_cache raised": "{error} (on after_empty_cache({case}))",
        "after_empty_cache not a pair": "after_empty_cache({case}) gave {got!r}: return a tuple "
        "of two numbers, (reserved, smi)",
        "after_empty_cache swapped": "after_empty_cache({case}) gave {got}, the two in the other "
        "order: return (reserved, smi), reserved first",
        "after_empty_cache nothing freed": "after_empty_cache({case}) gave {got}, as if "
        "empty_cache() freed nothing: it gives the cached blocks (reserved but not allocated) "
        "back to the driver",
        "after_empty_cache live freed": "after_empty_cache({case}) gave {got}, as if the live "
        "tensors were freed too: empty_cache() frees only cached blocks that no tensor uses",
        "after_empty_cache no context": "after_empty_cache({case}) gave {got}, nvidia-smi "
        "without the CUDA context: nvidia-smi shows what PyTorch reserved plus the context, "
        "which is never freed",
        "after_empty_cache old smi": "after_empty_cache({case}) gave {got}: nvidia-smi still "
        "counts the reserved memory from before empty_cache(); it shows what is reserved after "
        "it, plus the context",
        "after_empty_cache wrong": "after_empty_cache({case}) gave {got}: after empty_cache() "
        "PyTorch keeps reserved what live tensors use, and nvidia-smi shows that plus the CUDA "
        "context (100 MiB allocated of 600 reserved, a 300 MiB context: (100, 400))",
        "retry not down to 1": "only a batch of 1 fits here: halve 24, 12, 6, 3 down to 1 and "
        "try that too (your function gave {got})",
        "retry raised before 1": "only a batch of 1 fits here: halve 24, 12, 6, 3 down to 1 and "
        "try that too (your function gave a RuntimeError)",
        "retry raised OOM": "raise your own RuntimeError, not the OOM error",
        "retry did not raise": "when not even a batch of 1 fits, raise RuntimeError",
        "drop changed size": "{error}: you deleted from the dict while looping over it; loop "
        "over a copy, list(history.items())",
        "drop replaced Out": "IPython keeps the output history in one dict named both Out and "
        "_oh: delete the tensor entries from it, do not replace it",
        "drop parameter kept": "an nn.Parameter is a tensor too (a subclass): test "
        "isinstance(value, torch.Tensor), not type(value) == torch.Tensor",
        "drop Out left": "{left} still hold tensors: delete them from Out",
        "drop twins left": "{twins} still hold the tensors of Out: each Out[N] has a twin "
        "variable _N; delete it too (namespace.pop(f'_{{N}}', None))",
        "drop string removed": "Out[5] and _5 held a string: keep history entries that hold no "
        "tensor",
        "drop underscore deleted": '{name} held a tensor: set it to "", do not delete it '
        "(IPython sets _, __ and ___ after each output; a deleted one is a NameError until "
        "then)",
        "drop underscore kept": '{name} held a tensor: set it to ""',
        "drop underscore string": '{name} held a string: leave it as it is (set it to "" only '
        "when it holds a tensor)",
        "drop still referenced": "the tensor of {place} is still referenced somewhere: keep no "
        "reference to the tensors you remove",
        "drop parameter still referenced": "the tensor of {place}, an nn.Parameter is still "
        "referenced somewhere: keep no reference to the tensors you remove",
    },
)

#: Exercise 07 (a)'s cases (allocated, reserved, context) in MiB.
AFTER_EMPTY_CACHE_CASES = [(512, 1536, 400), (0, 2048, 300), (700, 1000, 250), (96, 900, 500)]


def check_after_empty_cache(after_empty_cache: Callable[[int, int, int], Any]) -> None:
    """Exercise 07 (a): ``after_empty_cache(allocated, reserved, context)`` gives
    ``(reserved, smi)`` after ``empty_cache()`` on :data:`AFTER_EMPTY_CACHE_CASES`; the
    feedback names the usual mistake every result matches (the pair swapped, nothing or
    everything freed, the context left out, nvidia-smi read before), else describes one."""
    got: list[Any] = []
    for case in AFTER_EMPTY_CACHE_CASES:
        shown = ", ".join(map(str, case))
        out, error = answer_and_error(after_empty_cache, *case)
        check(
            error is None, MESSAGES_07["after_empty_cache raised"].format(case=shown, error=error)
        )
        pair = isinstance(plain_value(out, f"after_empty_cache({shown})"), tuple | list)
        pair = pair and len(out) == 2
        check(
            pair and all(isinstance(v, int | float) and not isinstance(v, bool) for v in out),
            MESSAGES_07["after_empty_cache not a pair"].format(case=shown, got=out),
        )
        got.append(tuple(out))
    right = [(a, a + c) for a, _, c in AFTER_EMPTY_CACHE_CASES]
    if got == right:
        return
    mistakes = {
        "after_empty_cache swapped": [(a + c, a) for a, _, c in AFTER_EMPTY_CACHE_CASES],
        "after_empty_cache nothing freed": [(r, r + c) for _, r, c in AFTER_EMPTY_CACHE_CASES],
        "after_empty_cache live freed": [(0, c) for _, _, c in AFTER_EMPTY_CACHE_CASES],
        "after_empty_cache no context": [(a, a) for a, _, _ in AFTER_EMPTY_CACHE_CASES],
        "after_empty_cache old smi": [(a, r + c) for a, r, c in AFTER_EMPTY_CACHE_CASES],
    }
    name = matching_mistake(got, mistakes, right, lambda x, y: x == y)
    first = next(i for i, (x, y) in enumerate(zip(got, right, strict=True)) if x != y)
    shown = ", ".join(map(str, AFTER_EMPTY_CACHE_CASES[first]))
    raise CheckFailed(
        MESSAGES_07[name or "after_empty_cache wrong"].format(case=shown, got=got[first])
    )


#: Notebook 08's check messages, by a stable name (see :data:`MESSAGES_01`).
MESSAGES_08 = Messages(
    "08",
    {
        "read_profile raised": "{error} (on a profile where {phase} took most of the step time)",
        "read_profile not a pair": "return two things, the bottleneck and the speed-up: "
        "return bottleneck, max_speedup (got {kind})",
        "bottleneck not a phase": 'the bottleneck should be "data", "copy" or "compute", not '
        "{bottleneck}",
        "bottleneck constant": "read_profile gave {bottleneck!r} for a profile where {phase} took "
        "most of the step time: compute the answer from the profile argument, not from this run",
        "bottleneck smallest": "read_profile gave {bottleneck!r}, the phase that took the least "
        "time, for a profile where {phase} took the most: the bottleneck is the largest phase",
        "bottleneck wrong": "read_profile gave {bottleneck!r} for a profile where {phase} took "
        "most of the step time (data {data:.0%}, copy {copy:.0%}, compute {compute:.0%})",
        "speedup not a number": "the speed-up should be a number, got {kind}",
        "speedup constant": "read_profile gave the same speed-up, {got:.2f}, for profiles whose "
        "bottleneck took different shares of the step: compute it from the profile argument",
        "speedup share": "the speed-up {got:.2f} is the bottleneck's share of the step time; "
        "removing the phase leaves the rest of the step: total / (total - phase), above 1",
        "speedup rest share": "the speed-up {got:.2f} is the share of the step left without the "
        "phase; a speed-up is the old time over the new one: total / (total - phase)",
        "speedup total over phase": "the speed-up {got:.2f} is the step time over the phase; "
        "removing the phase leaves the rest of the step: total / (total - phase)",
        "speedup minus one": "the speed-up {got:.2f} is the time saved over the time left, one "
        "less than the speed-up: total / (total - phase) (1 s steps with 0.75 s of data: 4x)",
        "speedup of the data phase": "the speed-up {got:.2f} is what removing the data phase "
        "gains, for a profile where {phase} took most of the step time: use the bottleneck's time",
        "fast_loop raised": "{error} (your fast_loop run as on a GPU, device cuda)",
        "fast_loop no batches": "your fast_loop took no batch from timed(loader) on a GPU "
        "device: iterate for inputs, targets in timed(loader)",
        "fast_loop not pinned": "on a GPU your DataLoader does not pin its batches: pass "
        "pin_memory=True when device.type == 'cuda', so that the copy to the GPU can overlap "
        "the compute",
        "fast_loop pinned by CUDA": "on a GPU your DataLoader's pin_memory followed "
        "torch.cuda.is_available(), not the device you were given: decide with device.type == "
        "'cuda'",
        "fast_loop blocking copy": "on a GPU your loop copied {blocking} of {moved} batch "
        "tensors with .to(device) without non_blocking=True: from pinned memory "
        "non_blocking=True lets the CPU go on while the copy runs",
        "fast_loop no autocast": "on a GPU your loop ran the model without torch.autocast: "
        "wrap the forward pass and the loss in torch.autocast(device.type, "
        "dtype=torch.float16) (mixed precision)",
        "fast_loop autocast elsewhere": "on a GPU your loop's autocast was for {devices}, not "
        "the device the model runs on: write torch.autocast(device.type, dtype=torch.float16)",
        "fast_loop no scaler": "on a GPU your loop trains in float16 without a gradient "
        "scaler: small gradients underflow to 0 in float16; scale the loss with "
        "torch.amp.GradScaler() (scaler.scale(loss).backward(), scaler.step, scaler.update)",
        "speedup wrong": "read_profile gave a speed-up of {got:.2f} for a profile where {phase} "
        "took {share:.0%} of the step time: without the phase the step takes the rest, so the "
        "most it can gain is total / (total - phase) (1 s steps with 0.75 s of data: 4x)",
        "loop reads the loss": "your loop read the loss on the CPU {reads} times in {steps} "
        "steps (.item() or float()): each read makes the CPU wait for the GPU; keep the losses "
        "as tensors, or log every 10th step",
        "loop empties the cache": "you call torch.cuda.empty_cache() in the loop: it gives the "
        "cache back and the next step allocates it again; drop it",
        "loop labels left": "your loop moved the images to the device but left the labels on "
        "the CPU in {left} of {steps} steps: move them too, labels.to(device, "
        "non_blocking=True); on a GPU, cross_entropy of GPU logits and CPU labels fails",
        "loop images left": "your loop moved the labels to the device but not the images in "
        "{left} of {steps} steps: move them with images.to(device, non_blocking=True) before "
        "the model",
    },
)


def _profiles_for_read_profile(own: Any) -> list[Any]:
    """This run's profile and three made up, one per bottleneck, whose phases add up to
    the step time, so that each usual mistake of 08 (a) differs from the right answer."""
    from course_utils.profiling import LoopProfile  # lazy: profiling imports the package

    made_up = [(0.7, 0.01, 0.29), (0.15, 0.05, 0.8), (0.2, 0.55, 0.25)]
    shares = [LoopProfile(10, 80, d, c, m, wall_s=1.0) for d, c, m in made_up]
    return [own, *shares]


def _phases(profile: Any) -> dict[str, float]:
    return {"data": profile.data_s, "copy": profile.copy_s, "compute": profile.compute_s}


def check_read_profile(read_profile: Callable[[Any], Any], own: Any) -> None:
    """Exercise 08 (a): ``read_profile(profile)`` gives ``(bottleneck, max_speedup)`` for
    this run's profile ``own`` and for made-up profiles where each phase dominates in turn,
    so that an answer written down from one run (a constant) fails. A wrong answer is told
    the usual mistake its results match on every profile, else what it gave for one
    profile and the property it breaks, never that profile's speed-up."""
    profiles = _profiles_for_read_profile(own)
    names, speedups = [], []
    for profile in profiles:
        phases = _phases(profile)
        phase = max(phases, key=lambda name: phases[name])
        out, error = answer_and_error(read_profile, profile)
        check(error is None, MESSAGES_08["read_profile raised"].format(error=error, phase=phase))
        plain_value(out, "read_profile(profile)")
        check(
            isinstance(out, tuple | list) and len(out) == 2,
            MESSAGES_08["read_profile not a pair"].format(kind=_kind(out)),
        )
        bottleneck, speedup = out
        check(
            bottleneck in ("data", "copy", "compute"),
            MESSAGES_08["bottleneck not a phase"].format(bottleneck=repr(bottleneck)),
        )
        speedup = speedup.item() if isinstance(speedup, torch.Tensor) else speedup
        check(
            isinstance(speedup, int | float) and not isinstance(speedup, bool),
            MESSAGES_08["speedup not a number"].format(kind=_kind(speedup)),
        )
        names.append(bottleneck)
        speedups.append(float(speedup))
    largest = [max(phases, key=phases.__getitem__) for phases in map(_phases, profiles)]
    smallest = [min(phases, key=phases.__getitem__) for phases in map(_phases, profiles)]
    wrong = next((i for i, (a, b) in enumerate(zip(names, largest, strict=True)) if a != b), None)
    if wrong is not None:
        p, phase = profiles[wrong], largest[wrong]
        name = matching_mistake(
            names,
            {"bottleneck constant": [names[0]] * len(names), "bottleneck smallest": smallest},
            largest,
            lambda a, b: a == b,
        )
        shares = {k: v / p.wall_s for k, v in _phases(p).items()}
        raise CheckFailed(
            MESSAGES_08[name or "bottleneck wrong"].format(
                bottleneck=names[wrong], phase=phase, **shares
            )
        )
    wall = [p.wall_s for p in profiles]
    phase_s = [_phases(p)[n] for p, n in zip(profiles, largest, strict=True)]
    right = [w / (w - s) for w, s in zip(wall, phase_s, strict=True)]

    def same(a: float, b: float) -> bool:
        return abs(a - b) < 0.05 * abs(b)

    if all(map(same, speedups, right)):
        return
    mistakes = {
        "speedup constant": [speedups[0]] * len(speedups),
        "speedup share": [s / w for w, s in zip(wall, phase_s, strict=True)],
        "speedup rest share": [(w - s) / w for w, s in zip(wall, phase_s, strict=True)],
        "speedup total over phase": [w / s for w, s in zip(wall, phase_s, strict=True)],
        "speedup minus one": [s / (w - s) for w, s in zip(wall, phase_s, strict=True)],
        "speedup of the data phase": [p.wall_s / (p.wall_s - p.data_s) for p in profiles],
    }
    name = matching_mistake(speedups, mistakes, right, same) or "speedup wrong"
    first = next(i for i, (a, b) in enumerate(zip(speedups, right, strict=True)) if not same(a, b))
    raise CheckFailed(
        MESSAGES_08[name].format(
            got=speedups[first], phase=largest[first], share=phase_s[first] / wall[first]
        )
    )


@contextlib.contextmanager
def record_autocast_devices() -> Iterator[list[str]]:
    """The ``device_type`` of every ``torch.autocast`` (``torch.amp.autocast``,
    ``torch.cuda.amp.autocast``) made inside the block. A CUDA one runs as a CPU autocast
    of the same dtype, so a CPU grader can watch code written for a GPU with
    :func:`record_autocast`.

    >>> with record_autocast_devices() as devices:
    ...     with torch.autocast("cuda", dtype=torch.bfloat16):
    ...         cpu_state = torch.is_autocast_enabled("cpu")
    >>> devices, cpu_state
    (['cuda'], True)
    """
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__init__
    devices: list[str] = []

    def spy(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        devices.append(str(plain_value(device_type, "torch.autocast(device_type)")))
        original(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    autocast.__init__ = spy  # type: ignore[method-assign]
    try:
        yield devices
    finally:
        autocast.__init__ = original  # type: ignore[method-assign]


def check_parses_other_lines(parse_query_line: Callable[[str], Any]) -> None:
    """Check a learner's ``parse_query_line`` (notebook 02) on lines with other units,
    unavailable values, ``nounits`` output and a line recorded on an H200 with text fields.

    >>> check_parses_other_lines(lambda line: [float(v) for v in line.split(", ")])
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: your function raised ValueError: could not convert \
string to float: '[Not Supported]', given '[Not Supported], 5 %': keep the number before any \
unit (MHz, C, MiB, W, %), None only where there is no number ('7 W, [N/A], 3 MHz' reads [7.0, \
None, 3.0])
    """

    cases = {
        "[Not Supported], 5 %": [None, 5.0],
        "ERR!, [Unknown Error]": [None, None],
        "N/A, 0 MiB": [None, 0.0],
        "1410 MHz, 1593 MHz, 54 C": [1410.0, 1593.0, 54.0],
    }
    for line, expected in cases.items():
        got = plain_value(answer_or_error(parse_query_line, line), f"parse_query_line({line!r})")
        check(
            type(got) is list and got == expected,
            MESSAGES_02["parse other line raised"].format(line=line, error=got)
            if is_raised(got)
            else MESSAGES_02["parse other line"].format(line=line, got=got),
        )
    check(
        plain_value(answer_or_error(parse_query_line, "1024, 35"), "parse_query_line('1024, 35')")
        == [1024.0, 35.0],
        MESSAGES_02["parse nounits"],
    )
    header, line = sample_output("h200_query_gpu_csv_load")[1].strip().splitlines()
    got = answer_or_error(parse_query_line, line)  # a line recorded on an H200
    plain_value(got, "parse_query_line(line)")
    check(isinstance(got, list), MESSAGES_02["parse H200 line"].format(got=got))
    recorded = dict(zip(header.split(", "), got, strict=False))
    expected_fields: list[tuple[str, float | None]] = [
        ("memory.used [MiB]", 1011),
        ("power.draw [W]", 692.82),
        ("utilization.gpu [%]", 99),
        ("temperature.gpu", 54),
        ("name", None),
        ("pstate", None),
    ]
    for field, value in expected_fields:
        check(
            recorded.get(field) == value,
            MESSAGES_02["parse H200 field"].format(field=field, got=recorded.get(field)),
        )
