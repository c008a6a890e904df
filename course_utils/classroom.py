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
