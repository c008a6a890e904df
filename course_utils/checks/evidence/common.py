"""Observing halves any check may use (:mod:`course_utils.checks.evidence`)."""

from __future__ import annotations

from typing import Any

from course_utils.checks.boundary import observed


@observed
def results_of(answer: Any, calls: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
    """For each ``(args, kwargs)`` of ``calls``, in order: what ``answer`` returned and
    what its arguments hold after the call (what it changed of a dict or list it was
    given), as ``{"returned": ..., "arguments": [...], "keywords": {...}}``; an argument
    that is not plain data (a model) is None there. Each call gets its own copy of the
    arguments as they crossed, so one call's change does not reach the next. What the
    answer returned must be plain data.

    >>> results_of(lambda d: d.setdefault("a", 1), [(({},), {})])
    [{'returned': 1, 'arguments': [{'a': 1}], 'keywords': {}}]
    >>> import torch
    >>> results_of(lambda m: m.in_features, [((torch.nn.Linear(3, 2),), {})])[0]["arguments"]
    [None]
    """
    import copy  # lazy: only an observation needs it

    from course_utils.checks.data_format import plain  # lazy: the checker's own module

    seen = []
    for args, kwargs in calls:
        given, keywords = copy.deepcopy(list(args)), copy.deepcopy(dict(kwargs))
        returned = answer(*given, **keywords)
        after = [value if plain(value) else None for value in given]
        named = {key: value if plain(value) else None for key, value in keywords.items()}
        seen.append({"returned": returned, "arguments": after, "keywords": named})
    return seen
