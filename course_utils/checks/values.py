"""Deciding from what :mod:`course_utils.checks.evidence.values` observed: the answer's
value, or the feedback that :func:`course_utils.feedback.plain_value` and
:func:`course_utils.checks.core.answer_or_error` gave beside the answer."""

from __future__ import annotations

from typing import Any

from course_utils.checks import said_by_your_code
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed


def answered(record: dict[str, Any]) -> Any:
    """The value in ``record`` (:func:`~course_utils.checks.evidence.values.value_of`, or
    ``{"raised": ...}``: :func:`~course_utils.checks.evidence.values.exception_seen`); else
    :class:`CheckFailed` naming the subclass where a plain type was due, or saying what
    the answer raised.

    >>> answered({"value": (1, 2)})
    (1, 2)
    >>> answered({"impostor": ["f()[1]", "int", "Yes"]})
    Traceback (most recent call last):
    ...
    course_utils.feedback.CheckFailed: f()[1] should be of type int, but it is of type Yes
    """
    if "impostor" in record:
        where, want, kind = record["impostor"]
        if want == "Tensor":
            raise CheckFailed(MESSAGES_CHECKS["tensor subclass"].format(what=where, kind=kind))
        raise CheckFailed(
            MESSAGES_CHECKS["difference type"].format(where=where, want=want, got=kind)
        )
    if "raised" in record:
        raise CheckFailed(raised_sentence(record["raised"]))
    return record["value"]


def raised_sentence(raised: dict[str, Any]) -> str:
    """ "your function raised <class>: <message>" (as
    :func:`course_utils.checks.core.answer_or_error` says it) for what the answer raised
    (:func:`~course_utils.checks.evidence.values.exception_seen`); its message is the learner's
    (:func:`~course_utils.checks.said_by_your_code`)."""
    said_by_your_code(raised["message"])
    if raised["kind"] not in raised["builtins"] and not _course_or_torch(raised["module"]):
        said_by_your_code(raised["kind"])  # a class of the notebook's: its name too
    return MESSAGES_CHECKS["function raised"].format(kind=raised["kind"], error=raised["message"])


def _course_or_torch(module: str) -> bool:
    return module.split(".")[0] in ("course_utils", "torch")
