"""Exercise checks: specific, friendly feedback that runs on a CPU in seconds.

A check cell (nbgrader ``grade: true``) follows each solution cell and calls these. A
failed check raises :class:`CheckFailed`, an ``AssertionError`` whose message tells the
learner what is wrong; nbgrader and the course's grader score such a cell 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


class CheckFailed(AssertionError):
    """An exercise check failed; the message is the feedback for the learner."""


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
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        actual_t = torch.as_tensor(actual).detach().cpu().double()
        expected_t = torch.as_tensor(expected).detach().cpu().double()
        check(
            actual_t.shape == expected_t.shape,
            f"{what} has shape {tuple(actual_t.shape)}, expected {tuple(expected_t.shape)}",
        )
        worst = (actual_t - expected_t).abs().max().item() if actual_t.numel() else 0.0
        check(
            torch.allclose(actual_t, expected_t, rtol=rtol, atol=atol),
            f"{what} differs from the expected values by up to {worst:.3g}",
        )
        return
    check(
        isinstance(actual, int | float) and not isinstance(actual, bool),
        f"{what} should be a number, got {type(actual).__name__}",
    )
    check(
        math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol),
        f"{what} is {actual:.6g}, expected {expected:.6g} (within rtol={rtol:g})",
    )


def passed(exercise: str) -> None:
    """Print the success line of a check cell."""
    print(f"✓ {exercise}: all checks passed")


@dataclass(frozen=True)
class TensorMove:
    """One call of ``Tensor.to`` seen by :func:`record_tensor_to`."""

    source_device: str
    pinned: bool  # the source tensor was in pinned (page-locked) memory
    non_blocking: bool  # the call asked for an asynchronous copy
    target: str  # the device (or dtype) asked for, as text


@contextlib.contextmanager
def record_tensor_to() -> Iterator[list[TensorMove]]:
    """Record every ``Tensor.to(...)`` call made inside the ``with`` block (a spy: the
    calls still run). Exercise checks use it to see *how* a learner moved a batch.

    >>> with record_tensor_to() as moves:
    ...     _ = torch.ones(2).to("cpu", non_blocking=True)
    >>> [(move.source_device, move.non_blocking) for move in moves]
    [('cpu', True)]
    """
    original = torch.Tensor.to
    own = "to" in vars(torch.Tensor)  # defined on Tensor itself, or inherited from TensorBase
    moves: list[TensorMove] = []

    def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        target = kwargs.get("device", kwargs.get("dtype", args[0] if args else ""))
        pinned = self.device.type == "cpu" and self.is_pinned()
        # positional forms: to(device, dtype, non_blocking) or to(dtype, non_blocking)
        asynchronous = kwargs.get("non_blocking", any(arg is True for arg in args))
        moves.append(TensorMove(str(self.device), pinned, bool(asynchronous), str(target)))
        return original(self, *args, **kwargs)

    torch.Tensor.to = spy  # type: ignore[method-assign,assignment]
    try:
        yield moves
    finally:
        if own:
            torch.Tensor.to = original  # type: ignore[method-assign]
        else:
            del torch.Tensor.to


def answer_or_error(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, or, if it raises, a sentence saying what it raised
    (so that a check's feedback can quote it instead of stopping with a traceback). An
    unanswered exercise's ``NotImplementedError`` propagates: the grader reports "not answered".

    >>> answer_or_error(int, "7"), answer_or_error(int, "seven")
    (7, "your function raised ValueError: invalid literal for int() with base 10: 'seven'")
    """
    try:
        return function(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as error:  # any mistake of the learner's: report it in words
        return f"your function raised {type(error).__name__}: {error}"


def _kind(value: Any) -> str:
    return type(value).__name__ if value is not None else "None"


def first_difference(got: Any, want: Any, where: str = "batch") -> str | None:
    """Where a nested batch ``got`` (tuples, lists, dicts, namedtuples, tensors) first
    differs from ``want``, in words; ``None`` when they match (tensors: same device, shape
    and dtype; other values: equal; containers: the same type).

    >>> first_difference({"x": [torch.ones(1)]}, {"x": (torch.ones(1),)})
    "batch['x'] should be a tuple, but it is a list"
    >>> first_difference([torch.ones(1)], [torch.ones(1, device="meta")])
    'batch[0] is a tensor on cpu; it should be on meta'
    >>> first_difference((1, "a"), (1, "a")) is None
    True
    """
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{where} should be a tensor, but it is {_kind(got)} {got!r}"
        if got.device.type != want.device.type:
            return f"{where} is a tensor on {got.device.type}; it should be on {want.device.type}"
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"{where} should keep its shape and dtype {tuple(want.shape)}, {want.dtype}"
        return None
    if type(got) is not type(want):
        hint = ""
        if isinstance(want, tuple) and hasattr(want, "_fields"):
            hint = " (a namedtuple takes its fields as separate arguments: type(batch)(*values))"
        return f"{where} should be a {_kind(want)}, but it is a {_kind(got)}{hint}"
    if isinstance(want, dict):
        if list(got) != list(want):
            return f"{where} should have the keys {list(want)}, not {list(got)}"
        pairs = [(got[key], want[key], f"{where}[{key!r}]") for key in want]
    elif isinstance(want, list | tuple):
        if len(got) != len(want):
            return f"{where} should have {len(want)} items, not {len(got)}"
        pairs = [(g, w, f"{where}[{i}]") for i, (g, w) in enumerate(zip(got, want, strict=True))]
    else:
        return None if got == want else f"{where} should stay {want!r}, but it is {got!r}"
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
