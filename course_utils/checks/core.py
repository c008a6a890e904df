"""What every exercise check uses: specific, friendly feedback that runs on a CPU in seconds.

A check cell (nbgrader ``grade: true``) follows each solution cell and calls a notebook's
checks (:mod:`course_utils.checks.nb01` ... ``nb09``), which build on these. A failed check
raises :class:`CheckFailed`, an ``AssertionError`` whose message tells the learner what is
wrong; nbgrader and the course's grader score such a cell 0.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from course_utils.feedback import MESSAGES_CHECKS, CheckFailed, RaisedText, plain_value


class PartialCredit(CheckFailed):
    """A check whose exercise has separable parts, some of them right: the course's grader
    scores ``earned`` (0 to 1) of the check's points; nbgrader scores it 0, like any failure."""

    def __init__(self, feedback: str, earned: float) -> None:
        super().__init__(feedback)
        self.earned = earned


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
    course_utils.checks.core.PartialCredit: 1 of 2 parts right; gpu_loader: pin the batches
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
    course_utils.feedback.CheckFailed: your list is empty
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
    course_utils.feedback.CheckFailed: the speed-up is 2, expected 3 (within rtol=1e-05)
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
    course_utils.feedback.CheckFailed: the output is of type Agreeable, a subclass of ...: ...
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


def _refused(name: str) -> CheckFailed:
    return CheckFailed(MESSAGES_CHECKS["refused"].format(name=name))


def _refusing(*args: Any, **kwargs: Any) -> Any:
    # lazy: this code runs as the refused helper, with that helper's module globals
    import sys as _sys

    from course_utils.checks.core import _refused as refused  # lazy: as above

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
    course_utils.feedback.CheckFailed: your function called the course's own to_device(), ...
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
    course_utils.feedback.CheckFailed: your function called the course's own ...
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
