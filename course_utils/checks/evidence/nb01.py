"""Notebook 01's observing halves (:mod:`course_utils.checks`): each calls the learner's
answer with the course's instruments around it and returns what it saw, as plain data.

- exercise (a), ``my_to_device``: :func:`moved_batch`;
- exercise (b), ``mixed_forward``: :func:`mixed_forward_seen`, :func:`precisions_picked`;
- exercise (c), ``time_it``: :func:`timed_on_a_fake_clock`, :func:`synchronize_calls`,
  :func:`timed_on_a_simulated_gpu`.

What the answer returns (or leaves of what it was given) is described by :func:`value_seen`,
read without running any of its code. An exception the answer raises propagates (the
deciding half reads it as the answer's, in the grader as in the notebook); the refusal of
one of the course's own helpers that the answer called is evidence (its name).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
import timeit
from collections import namedtuple
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch import nn

from course_utils.checks.boundary import observed
from course_utils.checks.core import course_helpers_refused
from course_utils.device import pick_precision, precision_support, to_device
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed, _is_numpy_scalar
from course_utils.spies import record_autocast
from course_utils.timing import SimulatedGPU, benchmark, fake_cuda

#: The course's own helpers an answer must not call (each exercise refuses some of them).
_HELPERS: dict[str, Any] = {
    "to_device": to_device,
    "pick_precision": pick_precision,
    "precision_support": precision_support,
    "benchmark": benchmark,
}
_PRECISION_HELPERS = ("pick_precision", "precision_support")


def _refusal(failure: CheckFailed, *names: str) -> str:
    """The name of the course's helper whose refusal ``failure`` is
    (:func:`~course_utils.checks.core.course_helpers_refused`), else ``failure`` raised again."""
    text = BaseException.__str__(failure)
    for name in names:
        if type(text) is str and text == MESSAGES_CHECKS["refused"].format(name=name):
            return name
    raise failure


# ----------------------------------------------------------------- what a value is, as data

_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_CONTAINERS = (dict, list, tuple, set, frozenset)
_SCALAR_BASES = (int, float, complex, str, bytes)
_DEPTH, _NODES = 40, 20_000  # deeper or larger: described as an object of its class only
_DATA_BYTES = 1 << 20  # a CPU tensor's values cross up to this size (else its shape only)
_ALL_DATA_BYTES = 1 << 26  # and the values of all the tensors of one value, up to this size
#: The dtypes whose values can cross (:data:`course_utils.checks.data_format.DTYPES`).
_DATA_DTYPES = {
    torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.complex64,
    torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.bool,
}  # fmt: skip


def _type_name(kind: type) -> str:
    name = type.__dict__["__name__"].__get__(kind)
    return str.__str__(name)[:100] if type(name) is str else "?"


def _type_key(kind: type) -> str:
    """``module.qualname`` of ``kind`` when that is where ``kind`` itself is found (a class
    that only says it comes from a module is not found there), else ""."""
    module = type.__dict__["__module__"].__get__(kind)
    qualname = type.__dict__["__qualname__"].__get__(kind)
    if type(module) is not str or type(qualname) is not str:
        return ""
    try:
        found: Any = sys.modules.get(module)
        for part in qualname.split("."):
            found = getattr(found, part, None)
    except Exception:  # a module of the notebook's whose attributes raise
        return ""
    return f"{module}.{qualname}" if found is kind else ""


#: A subclass of a built-in scalar type's value, as the built-in type holds it.
_RAW: dict[type, Callable[[Any], Any]] = {
    int: int.__int__,
    float: float.__float__,
    complex: lambda value: complex(complex.real.__get__(value), complex.imag.__get__(value)),
    str: str.__str__,
    bytes: lambda value: bytes(memoryview(value)),
}


class _Seeing:
    """:func:`value_seen`'s walk (it counts what it has described)."""

    def __init__(self) -> None:
        self.nodes = 0
        self.path: set[int] = set()  # the containers being described (a cycle stops there)
        self.data_left = _ALL_DATA_BYTES

    def see(self, value: Any, depth: int) -> Any:
        self.nodes += 1
        kind = type(value)
        if kind in _SCALARS:
            return ("v", value)
        key, name = _type_key(kind), _type_name(kind)
        if issubclass(kind, torch.Tensor):
            return self.tensor(value, key, name)
        if kind is torch.device:
            return ("dv", str(value))
        if kind is torch.dtype:
            return ("dt", str(value).removeprefix("torch."))
        if _is_numpy_scalar(kind):
            item = value.item()
            return ("np", name, item) if type(item) in _SCALARS else ("O", key, name)
        base = next((b for b in _CONTAINERS if issubclass(kind, b)), None)
        if base is not None and depth < _DEPTH and self.nodes < _NODES:
            if id(value) in self.path:
                return ("O", key, name)
            self.path.add(id(value))
            try:
                if base is dict:
                    pairs = dict.items(value)
                    items = [(self.see(k, depth + 1), self.see(v, depth + 1)) for k, v in pairs]
                else:
                    items = [self.see(item, depth + 1) for item in base.__iter__(value)]
            finally:
                self.path.discard(id(value))
            return ("C", base.__name__, key, name, items)
        scalar = next((b for b in _SCALAR_BASES if issubclass(kind, b)), None)
        if scalar is not None:  # a subclass of a built-in scalar: its value as the base's
            return ("S", scalar.__name__, key, name, _RAW[scalar](value))
        return ("O", key, name)

    def tensor(self, value: torch.Tensor, key: str, name: str) -> Any:
        base: Any = torch._C.TensorBase  # its own attributes: no subclass's property answers
        device, dtype = base.device.__get__(value), base.dtype.__get__(value)
        shape = [int(n) for n in base.shape.__get__(value)]
        grad = bool(base.requires_grad.__get__(value))
        data = None
        size = dtype.itemsize
        for n in shape:
            size *= n
        strided = base.layout.__get__(value) is torch.strided
        small = size <= min(_DATA_BYTES, self.data_left)
        if device.type == "cpu" and strided and dtype in _DATA_DTYPES and small:
            self.data_left -= size
            with torch._C.DisableTorchFunctionSubclass():
                data = torch.Tensor.detach(value).as_subclass(torch.Tensor).clone()
        dtype_name = str(dtype).removeprefix("torch.")
        return ("T", key, name, device.type, shape, dtype_name, grad, data)


def value_seen(value: Any) -> Any:
    """``value`` described as plain data, read without running any code of its class:

    - ``("v", value)``: a value of a built-in scalar type exactly;
    - ``("S", base, key, name, raw)``: a subclass of a built-in scalar type, with its
      value as the base type holds it;
    - ``("C", base, key, name, items)``: a ``dict``, ``list``, ``tuple``, ``set`` or
      ``frozenset`` or a subclass (a namedtuple), its items described in turn (a dict's as
      ``(key, value)`` pairs);
    - ``("T", key, name, device, shape, dtype, requires_grad, data)``: a tensor, read as
      ``torch.Tensor`` reads it (no subclass's property answers); ``data``: its values on
      the CPU, when they are on the CPU and small, else None;
    - ``("dv", text)``, ``("dt", name)``, ``("np", name, value)``: a ``torch.device``, a
      ``torch.dtype``, a NumPy scalar;
    - ``("O", key, name)``: anything else (and what is nested too deep, or holds itself).

    ``name`` is the name of the value's class; ``key`` its ``module.qualname`` when the
    class is found there, else "" (a class of the notebook's that claims a module).

    >>> value_seen({"a": (1, torch.ones(2, device="meta"))})  # doctest: +NORMALIZE_WHITESPACE
    ('C', 'dict', 'builtins.dict', 'dict', [(('v', 'a'), ('C', 'tuple', 'builtins.tuple',
     'tuple', [('v', 1), ('T', 'torch.Tensor', 'Tensor', 'meta', [2], 'float32', False,
     None)]))])
    >>> class Yes(int):
    ...     __eq__ = lambda *args: True
    >>> value_seen(Yes(3))
    ('S', 'int', '', 'Yes', 3)
    """
    return _Seeing().see(value, 0)


# ----------------------------------------------------------------- exercise (a)

#: The namedtuple of exercise (a)'s batches (the check cell's ``Pair``): the course's, so
#: that a batch holding one crosses to the learner's runtime.
Pair = namedtuple("Pair", ["image", "label"])


@dataclass(frozen=True)
class MovedBatch:
    """What :func:`moved_batch` saw (each value as :func:`value_seen` describes it)."""

    refused: str = ""  # the course's helper the answer called, "" when none
    out: Any = None  # what the answer returned
    batch: Any = None  # the batch it was given, after the call


@observed
def moved_batch(my_to_device: Callable[[Any, Any], Any], batch: Any) -> MovedBatch:
    """Exercise 01 (a): ``my_to_device(batch, "meta")``, the course's ``to_device``
    refused; what it returned and what it left of ``batch``.

    >>> seen = moved_batch(lambda batch, device: batch, [torch.ones(1)])
    >>> seen.out[4][0][3], seen.refused
    ('cpu', '')
    """
    with course_helpers_refused(_HELPERS, "to_device"):
        try:
            out = my_to_device(batch, "meta")
        except CheckFailed as failure:
            return MovedBatch(refused=_refusal(failure, "to_device"))
    return MovedBatch(out=value_seen(out), batch=value_seen(batch))


# ----------------------------------------------------------------- exercise (b)


class LooksLikeCuda(torch.Tensor):
    """A CPU tensor whose ``.device`` says ``cuda:0`` (and ``is_cuda`` True): a CPU grader
    feeds it to code written for a GPU, to see whether the code follows its input's device.
    Results computed from it look like CUDA tensors too."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


@dataclass
class AutocastState:
    """What :func:`autocast_cleared` saw: autocast on before the call (left by an
    earlier run in this kernel) and on after it (left on by the function itself)."""

    on_before: bool = False
    on_after: bool = False


@contextlib.contextmanager
def autocast_cleared(device_type: str = "cpu") -> Iterator[AutocastState]:
    """Judge only what the code in the block does to autocast: turn off autocast an
    earlier run left on (``on_before`` says so), note in ``on_after`` whether the block
    left it on, and turn it off again on the way out, so a later answer starts clean.

    >>> _ = torch.autocast("cpu").__enter__()  # an earlier answer that never exited
    >>> with autocast_cleared() as state:
    ...     inside = torch.is_autocast_enabled("cpu")
    >>> inside, state.on_before, state.on_after, torch.is_autocast_enabled("cpu")
    (False, True, False, False)
    """
    state = AutocastState(on_before=torch.is_autocast_enabled(device_type))
    if state.on_before:
        torch.set_autocast_enabled(device_type, False)
    try:
        yield state
    finally:
        state.on_after = torch.is_autocast_enabled(device_type)
        torch.set_autocast_enabled(device_type, False)


@contextlib.contextmanager
def autocasts_seen() -> Iterator[list[tuple[str, str]]]:
    """Each ``torch.autocast`` (``torch.amp.autocast``, ``torch.cuda.amp.autocast``) made
    inside the block: ``(device_type, "")``, or ``(the str it holds, its class's name)``
    for a ``device_type`` of a subclass of ``str``. A CUDA one runs as a CPU autocast of
    the same dtype, so a CPU grader can watch code written for a GPU with
    :func:`~course_utils.spies.record_autocast`.

    >>> with autocasts_seen() as made:
    ...     with torch.autocast("cuda", dtype=torch.bfloat16):
    ...         cpu_state = torch.is_autocast_enabled("cpu")
    >>> made, cpu_state
    ([('cuda', '')], True)
    """
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__init__
    made: list[tuple[str, str]] = []

    def spy(self: Any, device_type: Any, *args: Any, **kwargs: Any) -> None:
        kind, odd = type(device_type), ""
        if isinstance(device_type, str):
            text = device_type = str.__str__(device_type)  # the str it holds, exactly
            odd = _type_name(kind) if kind is not str else ""
        else:  # not a str at all: autocast says what is wrong with it
            shown = str(device_type)
            text = str.__str__(shown) if isinstance(shown, str) else "?"
        made.append((text, odd))
        original(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    autocast.__init__ = spy  # type: ignore[method-assign]
    try:
        yield made
    finally:
        autocast.__init__ = original  # type: ignore[method-assign]


def mixed_forward_model() -> nn.Module:
    """The model exercise 01 (b)'s check runs through the learner's ``mixed_forward``."""
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


@dataclass(frozen=True)
class MixedForwardSeen:
    """What :func:`mixed_forward_seen` saw."""

    refused: str = ""  # the course's helper the answer called, "" when none
    out: Any = None  # what it returned (value_seen)
    autocast: list[str] = field(default_factory=list)  # per call of the model: its dtype, or ""
    devices: list[str] = field(default_factory=list)  # each autocast's device_type
    odd_devices: list[str] = field(default_factory=list)  # classes of a device_type not a str
    weights: list[str] = field(default_factory=list)  # the model's dtypes after the call
    on_before: bool = False  # autocast was on before the call (an earlier run left it on)
    on_after: bool = False  # autocast was still on after it


def _dtype_name(dtype: torch.dtype | None) -> str:
    return "" if dtype is None else str(dtype).removeprefix("torch.")


@observed
def mixed_forward_seen(
    mixed_forward: Callable[..., Any],
    weights: dict[str, torch.Tensor],
    x: torch.Tensor,
    capability: tuple[int, int],
    on_gpu: bool = False,
) -> MixedForwardSeen:
    """Exercise 01 (b): ``mixed_forward(model, x, capability)`` on
    :func:`mixed_forward_model` with these ``weights``, autocast watched inside it, the
    course's precision helpers refused. ``on_gpu``: x is a CPU tensor whose ``.device``
    says cuda (:class:`LooksLikeCuda`).

    >>> def fp32_forward(model, x, capability):
    ...     return model(x)
    >>> weights = mixed_forward_model().state_dict()
    >>> seen = mixed_forward_seen(fp32_forward, weights, torch.randn(8, 16), (8, 0))
    >>> seen.autocast, seen.devices, seen.weights[:1], seen.out[5]
    ([''], [], ['float32'], 'float32')
    """
    model = mixed_forward_model()
    model.load_state_dict(weights)
    given = x.as_subclass(LooksLikeCuda) if on_gpu else x
    with (
        autocast_cleared() as state,
        record_autocast(model) as seen,
        autocasts_seen() as made,
        course_helpers_refused(_HELPERS, *_PRECISION_HELPERS),
    ):
        try:
            out = mixed_forward(model, given, capability)
        except CheckFailed as failure:
            return MixedForwardSeen(refused=_refusal(failure, *_PRECISION_HELPERS))
    dtype: Any = torch._C.TensorBase.dtype
    return MixedForwardSeen(
        out=value_seen(out),
        autocast=[_dtype_name(d) for d in seen],
        devices=[device for device, _ in made],
        odd_devices=[odd for _, odd in made if odd],
        weights=[_dtype_name(dtype.__get__(p)) for p in nn.Module.parameters(model)],
        on_before=state.on_before,
        on_after=state.on_after,
    )


@dataclass(frozen=True)
class PrecisionPicks:
    """What :func:`precisions_picked` saw."""

    refused: str = ""  # the course's helper the answer called, "" when none
    picks: list[str] = field(default_factory=list)  # "fp32", "fp16", "bf16", "" (it raised)


def _picked_precision(mixed_forward: Callable[..., Any], capability: tuple[int, int]) -> str:
    """The precision a learner's ``mixed_forward`` ran the model in for a GPU of this
    compute capability: "fp32" (no autocast), "fp16", "bf16", or "" (it raised)."""
    model = nn.Sequential(nn.Linear(4, 4))
    refused = course_helpers_refused(_HELPERS, *_PRECISION_HELPERS)
    with autocast_cleared(), record_autocast(model) as seen, autocasts_seen(), refused:
        try:
            mixed_forward(model, torch.randn(2, 4), capability)
        except (NotImplementedError, CheckFailed):  # not answered; a refusal
            raise
        except Exception:  # any mistake of the learner's: no precision picked
            return ""
    if not seen:
        return ""
    return {None: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(seen[-1], "")


@observed
def precisions_picked(
    mixed_forward: Callable[..., Any], capabilities: list[tuple[int, int]]
) -> PrecisionPicks:
    """Exercise 01 (b): the precision ``mixed_forward`` picks for each compute capability
    (its rule), the course's precision helpers refused.

    >>> def fp16_forward(model, x, capability):
    ...     with torch.autocast(x.device.type, dtype=torch.float16):
    ...         return model(x)
    >>> precisions_picked(fp16_forward, [(6, 0), (8, 0)]).picks
    ['fp16', 'fp16']
    """
    picks = []
    for capability in capabilities:
        try:
            picks.append(_picked_precision(mixed_forward, tuple(capability)))  # type: ignore[arg-type]
        except CheckFailed as failure:
            return PrecisionPicks(refused=_refusal(failure, *_PRECISION_HELPERS))
    return PrecisionPicks(picks=picks)


# ----------------------------------------------------------------- exercise (c)


class FakeClock:
    """A clock that moves only when told (:meth:`advance`). Inside :meth:`installed` the
    clocks Python code reads (``time.perf_counter``, ``time.monotonic``, ``time.time``, their
    ``_ns`` forms, ``timeit.default_timer``) read it, and :attr:`reads` counts the reads:
    a check can give a timer known durations and see whether it read a clock at all.

    >>> import time
    >>> clock = FakeClock()
    >>> with clock.installed():
    ...     began = time.perf_counter(); clock.advance(0.25); took = time.perf_counter() - began
    >>> took, clock.reads
    (0.25, 2)
    """

    def __init__(self, start: float = 1024.0) -> None:
        self.now = start
        self.reads = 0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def read(self) -> float:
        self.reads += 1
        return self.now

    def read_ns(self) -> int:
        self.reads += 1
        return round(self.now * 1e9)

    @contextlib.contextmanager
    def installed(self) -> Iterator[FakeClock]:
        clocks: dict[str, Any] = {"perf_counter": self.read, "monotonic": self.read}
        clocks.update(time=self.read, perf_counter_ns=self.read_ns, monotonic_ns=self.read_ns)
        clocks.update(time_ns=self.read_ns)
        with (
            mock.patch.multiple(time, **clocks),
            mock.patch.object(timeit, "default_timer", self.read),
        ):
            yield self


@dataclass(frozen=True)
class FakeClockTiming:
    """What :func:`timed_on_a_fake_clock` saw."""

    refused: str = ""  # the course's helper the answer called, "" when none
    took: Any = None  # what time_it returned (value_seen)
    calls: int = 0  # calls of fn
    reads: int = 0  # reads of the clock


def _not_synchronized(*args: Any, **kwargs: Any) -> None:
    """``torch.cuda.synchronize`` while a CPU device is timed: it does nothing."""


@observed
def timed_on_a_fake_clock(
    time_it: Callable[..., Any], warm: list[float], timed: list[float]
) -> FakeClockTiming:
    """Exercise 01 (c): ``time_it(fn, cpu, len(warm), len(timed))`` on a :class:`FakeClock`
    that each ``fn()`` call advances by the next of ``warm + timed`` seconds, the course's
    ``benchmark`` refused.

    >>> def first_call(fn, device, warmup=2, repeats=5):
    ...     began = time.perf_counter(); fn(); return time.perf_counter() - began
    >>> timed_on_a_fake_clock(first_call, [0.5], [0.25])
    FakeClockTiming(refused='', took=('v', 0.5), calls=1, reads=2)
    """
    clock, durations, calls = FakeClock(), iter([*warm, *timed]), [0]

    def fn() -> None:
        calls[0] += 1
        clock.advance(next(durations, 0.0))

    with (
        clock.installed(),
        course_helpers_refused(_HELPERS, "benchmark"),
        mock.patch.object(torch.cuda, "synchronize", _not_synchronized),
    ):  # a CPU device: synchronize_calls sees the synchronize calls
        try:
            took = time_it(fn, torch.device("cpu"), len(warm), len(timed))
        except CheckFailed as failure:
            return FakeClockTiming(refused=_refusal(failure, "benchmark"))
    return FakeClockTiming(took=value_seen(took), calls=calls[0], reads=clock.reads)


@dataclass(frozen=True)
class SynchronizeCalls:
    """What :func:`synchronize_calls` saw."""

    refused: str = ""  # the course's helper the answer called, "" when none
    calls: list[Any] = field(default_factory=list)  # value_seen((args, kwargs)) of each call
    asked: int = 0  # calls of torch.cuda.is_available()


def _nothing() -> None:
    """The work exercise 01 (c)'s synchronize check times."""


@observed
def synchronize_calls(time_it: Callable[..., Any], device: str) -> SynchronizeCalls:
    """Exercise 01 (c): ``time_it(fn, torch.device(device), 1, 3)`` while CUDA looks
    available and ``torch.cuda.synchronize`` records its arguments (a spy: no GPU is
    needed), the course's ``benchmark`` refused.

    >>> def synced(fn, device, warmup=2, repeats=5):
    ...     torch.cuda.synchronize(device); return 0.0
    >>> synchronize_calls(synced, "cuda:1").calls[0][4][0][4][0]
    ('dv', 'cuda:1')
    """
    calls: list[Any] = []
    asked: list[int] = []

    def synchronize(*args: Any, **kwargs: Any) -> None:
        calls.append(value_seen((args, kwargs)))

    def is_available() -> bool:
        asked.append(1)
        return True

    with (
        mock.patch.object(torch.cuda, "synchronize", synchronize),
        mock.patch.object(torch.cuda, "is_available", is_available),
        course_helpers_refused(_HELPERS, "benchmark"),
    ):
        try:
            time_it(_nothing, torch.device(device), 1, 3)
        except CheckFailed as failure:
            return SynchronizeCalls(refused=_refusal(failure, "benchmark"))
    return SynchronizeCalls(calls=calls, asked=len(asked))


#: Seconds of work per simulated kernel in exercise 01 (c)'s check (the notebook's knob).
SIM_KERNEL_S = 0.02


@dataclass(frozen=True)
class SimulatedGpuTiming:
    """What :func:`timed_on_a_simulated_gpu` saw."""

    took: Any = None  # what time_it returned (value_seen)
    synchronized: int = 0  # calls of torch.cuda.synchronize


@observed
def timed_on_a_simulated_gpu(
    time_it: Callable[..., Any], warmup: int, repeats: int, queued_s: float = 0.0
) -> SimulatedGpuTiming:
    """Exercise 01 (c) on a "GPU": ``time_it(fn, torch.device("cuda"), warmup=...,
    repeats=...)`` where ``fn`` queues :data:`SIM_KERNEL_S` seconds of work on a
    :class:`~course_utils.timing.SimulatedGPU` and ``torch.cuda.synchronize()`` waits for
    it (:func:`~course_utils.timing.fake_cuda`); ``queued_s``: someone else's work,
    queued before the call."""
    gpu = SimulatedGPU()
    with fake_cuda(gpu) as synced:
        if queued_s:
            gpu.launch(queued_s)
        launch = functools.partial(gpu.launch, SIM_KERNEL_S)
        took = time_it(launch, torch.device("cuda"), warmup=warmup, repeats=repeats)
    return SimulatedGpuTiming(took=value_seen(took), synchronized=len(synced))
