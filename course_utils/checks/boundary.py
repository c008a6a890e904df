"""The line between a check's two halves (:mod:`course_utils.checks`).

:func:`observed` marks a function of :mod:`course_utils.checks.evidence`: what it returns
is the evidence, and it must be plain data (:func:`course_utils.checks.data_format.plain`).
Called in a learner's notebook (or in tests) it runs at once and its result makes the
same round trip through the grader's data format as in the grader
(:func:`course_utils.checks.data_format.encode_reply`, then ``decode_reply``), so a
result that could not cross fails the same way everywhere. Called in the grader's
checker, it runs nothing there: the checker asks the learner's runtime to run it (with
the same arguments: the answer and the notebook's other objects travel by name, plain data
by value) and gets the evidence back as data.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _channel() -> Any:
    """The grader's checker channel (:data:`course_utils.instructor.checker.CHANNEL`), in
    the checker process only; else None. Read, not imported: only the checker sets it."""
    checker = sys.modules.get("course_utils.instructor.checker")
    holder = getattr(checker, "CHANNEL", None)
    return holder[0] if type(holder) is list and holder else None


def observed(function: F) -> F:
    """Mark ``function`` as a check's observing half (see the module's text)."""

    @functools.wraps(function)
    def observe(*args: Any, **kwargs: Any) -> Any:
        channel = _channel()
        if channel is not None:
            return channel.observe(function.__module__, function.__qualname__, args, kwargs)
        return as_evidence(function(*args, **kwargs), function.__name__)

    observe.course_observed = True  # type: ignore[attr-defined]
    return observe  # type: ignore[return-value]


def as_evidence(value: Any, what: str) -> Any:
    """``value`` after the round trip evidence makes from the learner's runtime to the
    checker; :class:`~course_utils.checks.data_format.AnswerError` when it cannot make it
    (a learner's class or a subclass in it: the message says which types can)."""
    from course_utils.checks import data_format  # lazy: a notebook's import stays light

    try:
        blob = data_format.encode_reply(value)
    except (ValueError, TypeError, RecursionError):
        blob = None
    if blob is None:
        raise data_format.AnswerError(
            data_format.not_plain_message(f"the evidence of {what} holds")
        )
    return data_format.load_plain(blob, f"the evidence of {what} holds")
