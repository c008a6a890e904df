"""What the answer returned or raised, as evidence: the observing halves' common helpers.

A value the answer returns may be of a subclass whose ``==`` says what it likes; it may
also be an object that is not data at all (a ``SimpleNamespace``, a NumPy scalar). The
checks compared such values beside the answer after
:func:`course_utils.feedback.plain_value`; the observing halves describe them instead
(:func:`value_of`), so that the deciding half (:func:`course_utils.checks.values.answered`)
gives the same feedback from plain data. These helpers run in the learner's runtime: the
guard verifies this module with the observing halves (instructor guide, "Threat model").
"""

from __future__ import annotations

import builtins
import sys
from dataclasses import dataclass
from typing import Any

import torch

from course_utils.checks.data_format import DTYPES

#: Python's own types a value of which crosses as it is.
_EXACT = frozenset({type(None), bool, int, float, complex, str, bytes})
#: The built-in types whose subclasses :func:`course_utils.feedback.plain_value` refuses.
_BUILT_IN = (int, float, complex, str, bytes, tuple, list, dict, set, frozenset)
_SHOWN_CHARS = 300
_DEPTH = 50


@dataclass(frozen=True)
class Shown:
    """A value that is not plain data (an object, a container too deep or holding
    itself), by its ``repr``: feedback can quote it, and it equals no value but itself."""

    text: str

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


def _numpy_scalar(kind: type) -> bool:
    numpy = sys.modules.get("numpy")  # not imported: the value cannot be one of its scalars
    return numpy is not None and kind in frozenset(numpy.sctypeDict.values())


def _shown(value: Any) -> Shown:
    try:
        text = repr(value)
    except Exception:
        text = ""
    text = str.__str__(text) if isinstance(text, str) else ""
    if not text:
        text = f"<{str.__str__(type(value).__name__)} object>"
    return Shown(text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "...")


def impostor(value: Any, what: str) -> list[str] | None:
    """Where ``value`` first holds what :func:`course_utils.feedback.plain_value` refuses:
    ``[where, the built-in type, its own type]``, or ``[where, "Tensor", its own type]`` for
    a subclass of ``torch.Tensor``; None when it holds none."""
    seen: set[int] = set()

    def visit(item: Any, where: str, depth: int) -> list[str] | None:
        kind = type(item)
        name = str.__str__(kind.__name__)
        if kind in _EXACT or kind in (torch.Tensor, torch.nn.Parameter) or depth > _DEPTH:
            return None
        if isinstance(item, torch.Tensor):
            return [where, "Tensor", name]
        if _numpy_scalar(kind):
            return None
        base = next((b for b in _BUILT_IN if isinstance(item, b)), None)
        if base is None:
            return None
        if kind is not base:
            return [where, base.__name__, name]
        if id(item) in seen:
            return None
        seen.add(id(item))
        if kind is dict:
            for key in item:
                if (found := visit(key, where, depth + 1)) is not None:
                    return found
            pairs = [(element, f"{where}[{key!r}]") for key, element in item.items()]
        else:
            inner = kind in (tuple, list)
            pairs = [(e, f"{where}[{i}]" if inner else where) for i, e in enumerate(item)]
        for element, place in pairs:
            if (found := visit(element, place, depth + 1)) is not None:
                return found
        return None

    return visit(value, what, 0)


def _crossing(value: Any, depth: int, held: frozenset[int]) -> Any:
    """``value`` as plain data: Python's own values and plain dense tensors as they are,
    NumPy scalars as Python's, containers rebuilt, anything else :class:`Shown`."""
    kind = type(value)
    if kind in _EXACT:
        return value
    if kind in (torch.Tensor, torch.nn.Parameter):
        dtype = str(value.dtype).removeprefix("torch.")
        plain = value.layout is torch.strided and value.device.type != "meta"
        return value if plain and dtype in DTYPES else _shown(value)
    if _numpy_scalar(kind):
        return _crossing(value.item(), depth, held)
    if depth > _DEPTH or id(value) in held or kind not in (tuple, list, dict, set, frozenset):
        return _shown(value)
    inside = held | {id(value)}
    if kind is dict:
        return {_crossing(k, depth + 1, inside): _crossing(v, depth + 1, inside)
                for k, v in value.items()}  # fmt: skip
    return kind(_crossing(item, depth + 1, inside) for item in value)


def value_of(value: Any, what: str) -> dict[str, Any]:
    """A value the answer gave, as evidence: ``{"value": ...}`` (plain data: Python's own
    values, containers and tensors kept, NumPy scalars as Python's, any other object as
    :class:`Shown`), or ``{"impostor": [where, type, its type]}`` when it holds a subclass
    of a built-in type or of ``torch.Tensor`` (``what`` names it in the feedback).

    >>> value_of((1, [2.5, None]), "f()")
    {'value': (1, [2.5, None])}
    >>> class Yes(int):
    ...     __eq__ = lambda *args: True
    >>> value_of((1, Yes(2)), "f()")
    {'impostor': ['f()[1]', 'int', 'Yes']}
    >>> from types import SimpleNamespace
    >>> value_of([SimpleNamespace(gpu=9)], "f()")
    {'value': [namespace(gpu=9)]}
    """
    found = impostor(value, what)
    if found is not None:
        return {"impostor": found}
    return {"value": _crossing(value, 0, frozenset())}


def exception_seen(error: BaseException) -> dict[str, Any]:
    """What the answer raised, as evidence: its class's name and module, the names of the
    built-in exceptions it is an instance of (``isinstance`` on the checker's side) and its
    message (the learner's text: :func:`course_utils.checks.said_by_your_code`).

    >>> exception_seen(ZeroDivisionError("division by zero"))["builtins"][:2]
    ['ZeroDivisionError', 'ArithmeticError']
    """
    kind = type(error)
    try:
        message = str(error)
    except Exception:
        message = ""
    message = str.__str__(message)[:2000] if isinstance(message, str) else ""
    mro: tuple[type, ...] = type.__dict__["__mro__"].__get__(kind)  # not a metaclass's
    names = [str.__str__(k.__name__) for k in mro if vars(builtins).get(k.__name__) is k]
    module = type.__dict__["__module__"].__get__(kind)
    return {
        "kind": str.__str__(kind.__name__),
        "module": str.__str__(module) if isinstance(module, str) else "",
        "builtins": names,
        "message": message,
    }
