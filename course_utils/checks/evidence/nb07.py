"""Notebook 07's observing halves: the learner's ``drop_from_history`` is given a fake
notebook namespace, and what it left there (and which tensors are still alive) comes back
as data; the learner's ``retry_halving`` is given the notebook's simulated steps
(``limited(...)``: a step that fits some samples and records each attempt; ``shape_bug(...)``:
a step with a bug that is not out of memory), and what it returned or raised, and the
attempts' tensors still alive when the next began, come back as data. What they should be
is decided in :mod:`course_utils.checks.nb07`."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from course_utils.checks.boundary import observed
from course_utils.checks.evidence.values import exception_seen, impostor, value_of

#: The entries of the fake namespace whose values the check compares.
_ENTRIES = ("_4", "_5", "_7", "_9", "_", "__", "___")


def _entry(value: Any) -> Any:
    """A namespace entry as evidence: a str, int, float, bool or None as it is, anything
    else (a tensor) by its type's name in angle brackets, which no such entry equals."""
    if type(value) in (str, int, float, bool, type(None)):
        return value
    return f"<{str.__str__(type(value).__name__)}>"


@observed
def history_after_drop(drop_from_history: Any, tensor_at: list[str]) -> dict[str, Any]:
    """``drop_from_history(namespace)`` on a fake notebook namespace: ``Out`` (also ``_oh``)
    with two tensors, an ``nn.Parameter`` and a string, their ``_N`` twins, and ``_``,
    ``__``, ``___`` holding tensors (those named in ``tensor_at``) or strings. What it
    raised (``{"raised": ...}``), else: a subclass of a built-in type left in the namespace
    (``impostor``), whether ``Out`` and ``_oh`` are still the check's dict, the keys of
    ``Out`` among 4, 5, 7, 9, the names among :data:`_ENTRIES` still there, their values
    (:func:`_entry`; ``Out[5]`` too) and the places whose tensor is still alive."""
    first, second = torch.ones(1000), torch.zeros(1000)
    third = torch.nn.Parameter(torch.ones(9))
    watch = {"Out[4]": weakref.ref(first), "Out[7]": weakref.ref(second)}
    watch["Out[9]"] = weakref.ref(third)  # an nn.Parameter
    out: dict[int, Any] = {4: first, 5: "a string", 7: second, 9: third}
    fake: dict[str, Any] = {"Out": out, "_oh": out, "_5": "a string"}
    fake.update(_4=first, _7=second, _9=third)
    held = {"_": second, "__": third, "___": first}
    fake.update({n: held[n] if n in tensor_at else f"text {n}" for n in ("_", "__", "___")})
    del first, second, third, held
    try:
        drop_from_history(fake)
    except NotImplementedError:  # not answered
        raise
    except Exception as error:  # any mistake of the learner's: the check says it in words
        return {"raised": exception_seen(error)}
    found = impostor(fake, "namespace")  # its entries, Out's keys and values too
    if found is not None:
        return {"impostor": found}
    present = [name for name in _ENTRIES if name in fake]
    values = {name: _entry(fake[name]) for name in present}
    values["Out[5]"] = _entry(out.get(5))
    return {
        "out kept": fake.get("Out") is out and fake.get("_oh") is out,
        "out keys": [key for key in (4, 5, 7, 9) if key in out],
        "present": present,
        "values": values,
        "alive": [place for place, ref in watch.items() if ref() is not None],
    }


@observed
def retry_run(
    retry_halving: Any, limited: Any, limit: float, batch_size: int
) -> tuple[dict[str, Any], list[Any]]:
    """``retry_halving(limited(limit, attempts, leaks), batch_size)``: what it returned
    (:func:`~course_utils.checks.evidence.values.value_of`) and ``leaks``, the number of
    earlier attempts whose tensors were alive as each attempt began. What it raises goes
    through."""
    attempts: list[Any] = []
    leaks: list[Any] = []
    got = retry_halving(limited(limit, attempts, leaks), batch_size)
    return value_of(got, "retry_halving(...)"), [_entry(count) for count in leaks]


def _divides_by_zero(batch_size: int) -> float:
    """A step with a bug that is not out of memory."""
    return batch_size / 0


@observed
def retry_on_bug(retry_halving: Any, shape_bug: Any, bug: str) -> dict[str, Any] | None:
    """``retry_halving(step, 8)`` for a step with a bug (``bug``: ``"ZeroDivisionError"``, a
    step that divides by zero; else ``shape_bug(calls)``, a matrix product of the wrong
    shapes): None when it returned; else what it raised (a ``ZeroDivisionError`` or a
    ``RuntimeError``: the built-in classes it is an instance of, whether its message names
    ``mat1`` as the shape error's does) and the batch sizes the buggy step was called with.
    Any other exception goes through."""
    calls: list[Any] = []
    step = _divides_by_zero if bug == "ZeroDivisionError" else shape_bug(calls)
    try:
        retry_halving(step, 8)
    except (ZeroDivisionError, RuntimeError) as error:
        said = exception_seen(error)
        sizes = [_entry(size) for size in calls]
        return {"builtins": said["builtins"], "mat1": "mat1" in said["message"], "calls": sizes}
    return None


@observed
def retry_at_the_bottom(
    retry_halving: Any, limited: Any, limit: float, batch_size: int
) -> dict[str, Any]:
    """``retry_halving(limited(limit, [], []), batch_size)``: what it returned
    (:func:`~course_utils.checks.evidence.values.value_of`), or the ``RuntimeError`` it
    raised (``{"raised": ...}``, and whether it is ``torch.cuda.OutOfMemoryError``). Any
    other exception goes through."""
    try:
        got = retry_halving(limited(limit, [], []), batch_size)
    except RuntimeError as error:
        return {
            "raised": exception_seen(error),
            "oom": isinstance(error, torch.cuda.OutOfMemoryError),
        }
    return value_of(got, f"retry_halving(step, {batch_size})")
