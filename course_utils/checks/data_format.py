"""The data that crosses between a learner's runtime and the grader's checker: an answer's
value, what it raised, a check's evidence. :func:`encode_reply` writes plain data (built-in
values, tensors, the course's data classes) as JSON and raw bytes, never a pickle;
:func:`decode_reply` and :func:`load_plain` read it back with size limits. The checker
(:mod:`course_utils.instructor.checker`) and the checks' observing halves
(:mod:`course_utils.checks.boundary`) share it, so a value crosses the same way in the
grader and in a learner's own notebook."""

from __future__ import annotations

import collections
import dataclasses
import json
import struct
import sys
from typing import Any

DATA_BYTES = 1 << 29  # the largest value that crosses (512 MiB)


class AnswerError(Exception):
    """What the learner's function raised, when it is not one of :data:`ERRORS`; or a
    result that cannot cross to the checker (its message says why)."""


def not_plain_message(what: str) -> str:
    """Why a value cannot cross to the checker."""
    return (
        f"{what} a value that is not plain data (a class defined in your notebook, or a "
        "subclass): use a plain int, float, str, list, tuple, dict or torch.Tensor"
    )


class Tampered(BaseException):
    """The learner's runtime found the course's instruments changed when it was to
    observe the answer: the check fails, and the changes are flagged (not an
    ``Exception``: a deciding half's ``except Exception``, ``check_parts`` included, does not
    turn it into one part's failure)."""

    def __init__(self, what: list[str]) -> None:
        super().__init__("; ".join(what))
        self.what = what


def _errors() -> dict[tuple[str, str], type[BaseException]]:
    found: list[type[BaseException]] = [
        ValueError, TypeError, RuntimeError, ZeroDivisionError, NotImplementedError,
        KeyError, IndexError, AssertionError, ArithmeticError, OverflowError,
        AttributeError, LookupError, MemoryError, StopIteration,
    ]  # fmt: skip
    torch = sys.modules.get("torch")
    if torch is not None:
        found += [torch.cuda.OutOfMemoryError]
    return {(error.__module__, error.__qualname__): error for error in found}


#: Exceptions raised again in the checker as themselves: (module, qualified name): class.
ERRORS = _errors()


#: What a tensor's dtype may be, by name: its size in bytes is the dtype's.
DTYPES = (
    "float16", "float32", "float64", "bfloat16", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "bool",
)  # fmt: skip


STRUCTURE_BYTES = 1 << 22  # the largest JSON description of a value (4 MiB)


_SIZE = struct.Struct(">Q")


def encode_reply(value: Any) -> bytes:
    """``value`` (plain data of exact types, :func:`plain`) as bytes: the length of a JSON
    description, the description, then the raw bytes of every tensor and ``bytes`` value,
    in order. ``ValueError`` for anything else (a subclass, a learner's class, a sparse
    tensor).

    >>> decode_reply(encode_reply([1, 2.5, ("a", None, True), {"k": b"v"}]), [])
    [1, 2.5, ('a', None, True), {'k': b'v'}]
    """
    tail: list[bytes] = []
    text = json.dumps(_describe(value, tail, 0), separators=(",", ":"))
    return _SIZE.pack(len(text)) + text.encode() + b"".join(tail)


def _describe(value: Any, tail: list[bytes], depth: int) -> Any:
    if depth > 200:
        raise ValueError("nested too deep")
    kind = type(value)
    if kind in (int, float, str, bool, type(None)):
        return value
    if kind is complex:
        return {"c": [value.real, value.imag]}
    if kind is bytes:
        tail.append(value)
        return {"b": len(value)}
    tags: dict[type, str] = {list: "l", tuple: "t", set: "s", frozenset: "f"}
    if kind in tags:
        return {tags[kind]: [_describe(item, tail, depth + 1) for item in value]}
    if kind in (dict, collections.OrderedDict):
        pairs = [[_describe(k, tail, depth + 1), _describe(v, tail, depth + 1)]
                 for k, v in value.items()]  # fmt: skip
        return {"d" if kind is dict else "o": pairs}
    import torch  # lazy: the doctests above need no tensor

    if kind is torch.Size:
        return {"S": [int(item) for item in value]}
    if kind is torch.dtype:
        return {"dt": str(value).removeprefix("torch.")}
    if kind is torch.device:
        return {"dv": str(value)}
    if kind in (torch.Tensor, torch.nn.Parameter):
        name = str(value.dtype).removeprefix("torch.")
        if value.layout is not torch.strided or name not in DTYPES:
            raise ValueError("a tensor that is not a dense tensor of a plain dtype")
        flat = value.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
        tail.append(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        grad = bool(value.requires_grad)
        return {"T": [name, list(value.shape), grad, kind is torch.nn.Parameter]}
    if dataclasses.is_dataclass(value) and str(kind.__module__).startswith("course_utils"):
        fields = {f.name: _describe(getattr(value, f.name), tail, depth + 1)
                  for f in dataclasses.fields(value)}  # fmt: skip
        return {"dc": [kind.__module__, kind.__qualname__, fields]}
    raise ValueError("not plain data")


def decode_reply(blob: bytes, safe: list[type]) -> Any:
    """The value :func:`encode_reply` wrote; ``ValueError`` when ``blob`` is not one. Nothing it
    reads can run code, and what it allocates is bounded by ``blob``'s own size: the
    description is at most :data:`STRUCTURE_BYTES`, checked before it is parsed, and every
    tensor's bytes (its shape times its dtype's size, checked before any allocation) must
    be there, each read once, with nothing left over."""
    if len(blob) < _SIZE.size:
        raise ValueError("too short")
    size = _SIZE.unpack_from(blob)[0]
    if size > STRUCTURE_BYTES or _SIZE.size + size > len(blob):
        raise ValueError("a description larger than allowed or than what was sent")
    start = _SIZE.size + size
    try:
        description = json.loads(blob[_SIZE.size : start])
    except RecursionError:
        raise ValueError("nested too deep") from None
    reader = _Reader(memoryview(blob)[start:], {(c.__module__, c.__qualname__): c for c in safe})
    value = reader.value(description, 0)
    if reader.at != len(reader.tail):
        raise ValueError("bytes left over")
    return value


class _Reader:
    def __init__(self, tail: memoryview, safe: dict[tuple[str, str], type]) -> None:
        self.tail, self.at, self.safe = tail, 0, safe

    def take(self, size: int) -> memoryview:
        if type(size) is not int or size < 0 or self.at + size > len(self.tail):
            raise ValueError("more bytes than were sent")
        self.at += size
        return self.tail[self.at - size : self.at]

    def value(self, item: Any, depth: int) -> Any:
        if depth > 200:
            raise ValueError("nested too deep")
        if type(item) in (int, float, str, bool, type(None)):
            return item
        if type(item) is not dict or len(item) != 1:
            raise ValueError("not a description")
        [(tag, body)] = item.items()
        items = body if type(body) is list else None
        if tag in ("l", "t", "s", "f") and items is not None:
            values = [self.value(x, depth + 1) for x in items]
            return {"l": list, "t": tuple, "s": set, "f": frozenset}[tag](values)
        if tag in ("d", "o") and items is not None:
            pairs = []
            for pair in items:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("not a pair")
                pairs.append((self.value(pair[0], depth + 1), self.value(pair[1], depth + 1)))
            return dict(pairs) if tag == "d" else collections.OrderedDict(pairs)
        if tag == "c" and items is not None and len(items) == 2:
            if not all(type(x) in (int, float) for x in items):
                raise ValueError("not a complex number")
            return complex(items[0], items[1])
        if tag == "b":
            return bytes(self.take(body))
        return self.torch_value(tag, body, depth)

    def torch_value(self, tag: str, body: Any, depth: int) -> Any:
        import torch  # lazy: as above

        if tag == "S" and type(body) is list and all(type(x) is int for x in body):
            return torch.Size(body)
        if tag == "dt" and body in DTYPES:
            return getattr(torch, body)
        if tag == "dv" and type(body) is str and len(body) < 40:
            try:
                return torch.device(body)
            except (RuntimeError, ValueError):
                raise ValueError("not a device") from None
        if tag == "T" and type(body) is list and len(body) == 4 and body[0] in DTYPES:
            name, shape, grad, parameter = body
            if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
                raise ValueError("not a shape")
            dtype = getattr(torch, name)
            count = dtype.itemsize
            for n in shape:  # the size, checked against what is left before allocating
                count *= n
                if count > len(self.tail) - self.at:
                    raise ValueError("a tensor larger than the bytes sent")
            data = self.take(count)
            if count:
                tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                tensor = tensor.view(dtype).reshape(shape)
            else:
                tensor = torch.zeros(shape, dtype=dtype)
            if grad is True and (dtype.is_floating_point or dtype.is_complex):
                tensor.requires_grad_(True)
            if parameter is True:
                return torch.nn.Parameter(tensor, requires_grad=tensor.requires_grad)
            return tensor
        if tag == "dc" and type(body) is list and len(body) == 3:
            module, qualname, fields = body
            cls = (
                self.safe.get((module, qualname)) if type(module) is type(qualname) is str else None
            )
            if cls is None or type(fields) is not dict:
                raise ValueError("not one of the course's dataclasses")
            names = {f.name for f in dataclasses.fields(cls)}
            if set(fields) != names:
                raise ValueError("not the dataclass's fields")
            instance: Any = object.__new__(cls)
            for name, field in fields.items():
                object.__setattr__(instance, name, self.value(field, depth + 1))
            return instance
        raise ValueError("not a description")


_PLAIN = (int, float, complex, str, bytes, bool, type(None))


def _course_dataclasses() -> list[type]:
    """The course's own dataclasses, loaded in the checker: they may cross (rebuilt as
    the checker's own classes, fields checked by :func:`plain`)."""
    found = []
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "course_utils" or module is None:
            continue
        for value in list(vars(module).values()):
            if (
                isinstance(value, type)
                and dataclasses.is_dataclass(value)
                and getattr(value, "__module__", "") == name
            ):
                found.append(value)
    return found


def plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is plain data of exact types (a subclass is not).

    >>> plain([1, 2.0, "a", None, (True,), {"k": b"v"}])
    True
    >>> class Liar(int):
    ...     def __eq__(self, other): return True
    >>> plain([Liar(0)])
    False
    """
    if depth > 200:
        return False
    kind = type(value)
    if kind in _PLAIN:
        return True
    if kind in (list, tuple, set, frozenset):
        return all(plain(item, depth + 1) for item in value)
    if kind in (dict, collections.OrderedDict):
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if kind in (torch.Tensor, torch.nn.Parameter):
        return True
    if kind is torch.Size:
        return all(type(item) is int for item in value)
    if kind in (torch.dtype, torch.device):
        return True
    if dataclasses.is_dataclass(value) and str(kind.__module__).startswith("course_utils"):
        return all(plain(v, depth + 1) for v in vars(value).values())
    return False


def load_plain(blob: bytes, what: str, safe: list[Any] | None = None) -> Any:
    """The value :func:`encode_reply` wrote, when it is plain data (:func:`plain`); the
    course's data classes are the safe ones by default. :class:`AnswerError` otherwise."""
    refused = AnswerError(not_plain_message(what))
    try:
        value = decode_reply(blob, _course_dataclasses() if safe is None else safe)
    except (ValueError, TypeError, RuntimeError, OverflowError, MemoryError, RecursionError):
        raise refused from None
    if not plain(value):
        raise refused
    return value
