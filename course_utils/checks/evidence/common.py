"""Observing halves any check may use (:mod:`course_utils.checks.evidence`)."""

from __future__ import annotations

from typing import Any

from course_utils.checks.boundary import observed


@observed
def results_of(answer: Any, calls: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
    """For each ``(args, kwargs)`` of ``calls``, in order: what ``answer`` returned and
    what its arguments hold after the call (what it changed of a dict or list it was
    given), as ``{"returned": ..., "arguments": [...], "keywords": {...}}``. Each call gets
    its own copy of the arguments as they crossed, so one call's change does not reach the
    next. Everything must be plain data.

    >>> results_of(lambda d: d.setdefault("a", 1), [(({},), {})])
    [{'returned': 1, 'arguments': [{'a': 1}], 'keywords': {}}]
    """
    import copy  # lazy: the module is imported by the guard before any learner code

    seen = []
    for args, kwargs in calls:
        given, keywords = copy.deepcopy(list(args)), copy.deepcopy(dict(kwargs))
        returned = answer(*given, **keywords)
        seen.append({"returned": returned, "arguments": given, "keywords": keywords})
    return seen
