"""What the course says to a learner whose code is wrong, and the values it trusts.

:class:`CheckFailed` is an ``AssertionError`` whose message tells the learner what is wrong
(every exercise check raises it: :mod:`course_utils.checks`); :data:`MESSAGES_CHECKS` are the
messages several checks share. :func:`plain_value` takes what a learner's code returned only
when it is of a built-in type exactly (a lookalike subclass can answer ``==`` with anything),
and :func:`builtin_error` names an exception only when it is Python's own. The lessons'
helpers that run a learner's code (:mod:`course_utils.spies`, :mod:`course_utils.capstone`)
use them too.
"""

from __future__ import annotations

import builtins
import functools
import sys
from typing import Any

import torch

from course_utils.language import Messages


class CheckFailed(AssertionError):
    """An exercise check failed; the message is the feedback for the learner."""


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


class RaisedText(str):
    """The sentence :func:`answer_or_error` gives for a learner's function that raised (a
    ``str``, in the learner's language): :func:`raised` tells it from an answer that is
    text."""


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
    course_utils.feedback.CheckFailed: f()[1] should be of type int, but it is of type Yes
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


def builtin_error(kind: type) -> str:
    """The name of ``kind`` when it is exactly one of Python's built-in exceptions, else "".

    >>> builtin_error(NameError), builtin_error(type("NameError", (Exception,), {}))
    ('NameError', '')
    """
    if not isinstance(kind, type):
        return ""
    name = type.__getattribute__(kind, "__name__")
    found = vars(builtins).get(name) if type(name) is str else None
    return name if found is kind and issubclass(kind, BaseException) else ""
