"""Notebook 01's deciding halves (:mod:`course_utils.checks`): each calls an observing half
of :mod:`course_utils.checks.evidence.nb01` (which runs the learner's answer with the
course's instruments around it), computes what a right answer gives, and says what is wrong.
In the grader they run in the checker: the evidence comes as plain data, which
:func:`value_rebuilt` turns back into values the course's comparisons read (a class of the
notebook's comes back as a stand-in of the same name, with nothing of its own).

- exercise (a), ``my_to_device``: :func:`check_moves_batch`;
- exercise (b), ``mixed_forward``: :func:`check_mixed_forward`;
- exercise (c), ``time_it``: :func:`check_time_it_median`, :func:`check_time_it_device`,
  :func:`simulated_gpu_time`.
"""

from __future__ import annotations

import collections
import copy
import functools
import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from course_utils.checks.core import (
    _raised_text,
    _refused,
    check,
    exact_tensor,
    first_difference,
    is_raised,
    matching_mistake,
)
from course_utils.checks.evidence import nb01 as evidence
from course_utils.checks.evidence.nb01 import SIM_KERNEL_S, LooksLikeCuda, Pair
from course_utils.device import pick_precision, to_device
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed, plain_value
from course_utils.language import Messages

__all__ = [
    "SIM_KERNEL_S",
    "TIME_IT_CASES",
    "Pair",
    "check_mixed_forward",
    "check_moves_batch",
    "check_time_it_device",
    "check_time_it_median",
    "simulated_gpu_time",
    "value_rebuilt",
]


def _observed(observe: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``observe(*args, **kwargs)`` (an observing half, which calls the answer), or, when
    the answer raised, :func:`~course_utils.checks.core.answer_or_error`'s sentence saying so.
    Not answered (``NotImplementedError``), a failed check and the instruments found
    changed (the grader's ``Tampered``) propagate."""
    # lazy: the grader's module, loaded once a check runs (a notebook's import stays light)
    from course_utils.checks.data_format import Tampered

    try:
        return observe(*args, **kwargs)
    except (NotImplementedError, CheckFailed, Tampered):
        raise
    except Exception as error:  # the answer's mistake: said in words
        return _raised_text(error)


def _no_refusal(refused: str) -> None:
    """:class:`CheckFailed` when the answer called the course's own helper ``refused``."""
    if refused:
        raise _refused(refused)


# ----------------------------------------------------------------- values, from evidence

#: The classes a value seen in the learner's runtime comes back as, by ``module.qualname``
#: (:func:`course_utils.checks.evidence.nb01.value_seen`); any other is a stand-in.
_KNOWN: dict[str, type] = {
    f"{kind.__module__}.{kind.__qualname__}": kind
    for kind in (
        dict, list, tuple, set, frozenset, collections.OrderedDict, Pair, torch.Tensor,
        nn.Parameter, LooksLikeCuda,
    )
}  # fmt: skip
_BASES: dict[str, type] = {
    kind.__name__: kind
    for kind in (dict, list, tuple, set, frozenset, int, float, complex, str, bytes)
}


@functools.cache
def _stand_in(name: str, base: type) -> type:
    """A class named ``name`` (a class of the notebook's), a subclass of ``base`` with
    nothing of its own: it stands for the answer's class in the course's comparisons and
    feedback, and compares as ``base`` does."""
    space: dict[str, Any] = {"__module__": "notebook"}
    if base is object:
        space["__repr__"] = lambda self: f"<{name} object>"
    return type(name.replace("\x00", "?") or "?", (base,), space)


def _kind(key: str, name: str, base: type) -> type:
    known = _KNOWN.get(key)
    return known if known is not None and issubclass(known, base) else _stand_in(name, base)


def _tensor(seen: tuple[Any, ...]) -> torch.Tensor:
    _, key, name, device, shape, dtype_name, grad, data = seen
    dtype = getattr(torch, str(dtype_name), None)
    if isinstance(data, torch.Tensor):
        tensor = data
    else:  # its shape and dtype only (on a device that costs no memory)
        tensor = torch.empty(shape, dtype=dtype if isinstance(dtype, torch.dtype) else None,
                             device="meta")  # fmt: skip
    if grad and (tensor.is_floating_point() or tensor.is_complex()):
        tensor.requires_grad_(True)
    kind = _kind(key, name, torch.Tensor)
    if device not in ("cpu", "meta"):  # it says the device it was on
        kind = _stand_in_on(kind, str(device))
    if kind is nn.Parameter:
        return nn.Parameter(tensor, requires_grad=tensor.requires_grad)
    return tensor if kind is torch.Tensor else tensor.as_subclass(kind)


@functools.cache
def _stand_in_on(kind: type, device: str) -> type:
    """``kind`` (a tensor class) as a tensor on ``device`` (a meta tensor here) shows it."""
    return type(kind.__name__, (kind,), {"device": property(lambda self: torch.device(device))})


def value_rebuilt(seen: Any) -> Any:
    """The value :func:`course_utils.checks.evidence.nb01.value_seen` described, rebuilt:
    built-in types, the course's own classes and torch's tensor classes as themselves; a
    class of the notebook's as a stand-in of the same name (a subclass of the same built-in
    type, with nothing of its own: no ``__eq__`` that says yes); a tensor's values when
    they crossed, else a ``meta`` tensor of its shape and dtype.

    >>> from course_utils.checks.evidence.nb01 import value_seen
    >>> class Yes(tuple):
    ...     __eq__ = lambda *args: True
    >>> back = value_rebuilt(value_seen([Yes((1,)), torch.ones(2, device="meta"), "a"]))
    >>> type(back[0]).__name__, back[0] == (2,), back[1].device.type, back[2]
    ('Yes', False, 'meta', 'a')
    """
    tag = seen[0]
    if tag == "v":
        return seen[1]
    if tag == "T":
        return _tensor(seen)
    if tag == "dv":
        return torch.device(seen[1])
    if tag == "dt":
        return getattr(torch, seen[1])
    if tag == "np":
        scalar = np.sctypeDict.get(seen[1])
        return scalar(seen[2]) if scalar is not None else _stand_in(seen[1], object)()
    if tag == "S":
        _, base, key, name, raw = seen
        return _kind(key, name, _BASES[base])(raw)
    if tag == "C":
        return _container(seen)
    return _stand_in(seen[2], object)()


def _container(seen: tuple[Any, ...]) -> Any:
    _, base_name, key, name, items = seen
    base = _BASES[base_name]
    kind = _kind(key, name, base)
    try:
        if base is dict:
            return kind((value_rebuilt(k), value_rebuilt(v)) for k, v in items)
        values = [value_rebuilt(item) for item in items]
        return tuple.__new__(kind, values) if base is tuple else kind(values)
    except TypeError:  # an item that cannot be a key here (a stand-in of a list)
        return _stand_in(name, object)()


# ----------------------------------------------------------------- exercise (a)


def check_moves_batch(
    my_to_device: Callable[[Any, Any], Any], batch: Any, what: str = "a nested batch"
) -> None:
    """Check a learner's ``my_to_device(batch, device)`` against the course's
    :func:`~course_utils.device.to_device` on ``batch`` (moved to the ``meta`` device),
    with the course's function refused (:func:`~course_utils.checks.evidence.nb01.
    moved_batch`); ``what`` names the batch in feedback.

    >>> check_moves_batch(to_device, [torch.ones(1)])
    Traceback (most recent call last):
    ...
    course_utils.feedback.CheckFailed: your function called the course's own to_device(), ...
    >>> check_moves_batch(lambda batch, device: batch, [torch.ones(1)])
    Traceback (most recent call last):
    ...
    course_utils.feedback.CheckFailed: in what your function returned, batch[0] is a tensor \
on cpu; it should be on meta, given a nested batch
    """
    before, want = to_device(batch, "cpu"), to_device(batch, "meta")  # the course's answers
    seen = _observed(evidence.moved_batch, my_to_device, batch)
    check(not is_raised(seen), MESSAGES_01["to_device raised"].format(error=seen, what=what))
    _no_refusal(seen.refused)
    difference = first_difference(value_rebuilt(seen.out), want)
    check(
        difference is None,
        MESSAGES_01["to_device wrong"].format(difference=difference, what=what),
    )
    difference = first_difference(value_rebuilt(seen.batch), before)
    check(
        difference is None,
        MESSAGES_01["to_device changed the batch"].format(difference=difference),
    )


# ----------------------------------------------------------------- exercise (b)

GPU_NAMES = {(6, 0): "a P100 (6.0)", (7, 5): "a T4 (7.5)", (8, 0): "an A100 (8.0)"}


def _hand_conversion(
    out: torch.Tensor, weights: set[str], original: nn.Module, x: torch.Tensor
) -> str | None:
    """Which conversion by hand an answer that ran the model without autocast made, named
    only when its output is what that conversion returns: "model converted" (the weights
    converted to the output's dtype, and x with them) or "output cast" (the float32 output
    cast to a lower precision); ``weights`` are the model's dtypes after the call,
    ``original`` the model before it, ``x`` its input."""
    low = out.dtype
    if low not in (torch.float16, torch.bfloat16):
        return None
    with torch.no_grad():
        if weights == {str(low).removeprefix("torch.")}:
            expected = copy.deepcopy(original).to(low)(x.to(low))
            name = "model converted"
        elif weights == {"float32"}:
            expected = original(x).to(low)
            name = "output cast"
        else:
            return None
        plain = out.detach().as_subclass(torch.Tensor)
        same = plain.shape == expected.shape and torch.allclose(
            plain.float(), expected.float(), rtol=1e-2, atol=1e-3
        )
    return name if same else None


def check_mixed_forward(
    mixed_forward: Callable[[torch.nn.Module, torch.Tensor, tuple[int, int]], Any],
    capability: tuple[int, int],
    *,
    on_gpu: bool = False,
) -> None:
    """Run a learner's ``mixed_forward(model, x, capability)`` (notebook 01), watching
    autocast inside it (:func:`~course_utils.checks.evidence.nb01.mixed_forward_seen`):
    model(x) under the autocast that :func:`~course_utils.device.pick_precision` picks for a
    GPU of that compute capability, or in float32 without it; the course's precision
    helpers refused. ``on_gpu``: x is a CPU tensor whose ``.device`` says cuda.

    >>> def fp32_forward(model, x, capability):
    ...     return model(x)
    >>> check_mixed_forward(fp32_forward, (6, 0))
    >>> check_mixed_forward(fp32_forward, (8, 0))
    Traceback (most recent call last):
    ...
    course_utils.feedback.CheckFailed: for an A100 (8.0), run model(x) under \
torch.autocast(x.device.type, dtype=torch.bfloat16)
    """
    model = evidence.mixed_forward_model()
    x = torch.randn(8, 16)
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    want = pick_precision("cuda", capability=capability)  # the course's answer
    seen = _observed(evidence.mixed_forward_seen, mixed_forward, weights, x.clone(),
                     capability, on_gpu)  # fmt: skip
    if not is_raised(seen) and seen.on_before:
        print(MESSAGES_CHECKS["autocast left on"])
    if not is_raised(seen) and seen.odd_devices:  # a str subclass: as plain_value says it
        raise CheckFailed(
            MESSAGES_CHECKS["difference type"].format(
                where="torch.autocast(device_type)", want="str", got=seen.odd_devices[0]
            )
        )
    check(not is_raised(seen), f"{seen}")
    _no_refusal(seen.refused)
    gpu = GPU_NAMES.get(capability, f"compute capability {capability}")
    name = str(want.dtype)[6:]
    device = "cuda" if on_gpu else "cpu"
    out = value_rebuilt(seen.out)
    if not (on_gpu and type(out) is LooksLikeCuda):  # model(x) of such an x is one too
        out = exact_tensor(out, "the output of model(x)")
    check(out.shape == (8, 4), MESSAGES_01["mixed_forward shape"])
    check(
        all(made == device for made in seen.devices),
        MESSAGES_01["mixed_forward autocast device"].format(device=device, devices=seen.devices),
    )
    check(out.requires_grad, MESSAGES_01["mixed_forward no autograd"])
    wanted = [name if want.autocast else ""]
    if want.autocast and seen.autocast[-1:] == [""]:  # no autocast: did it convert by hand?
        mistake = _hand_conversion(out, set(seen.weights), model, x)
        if mistake is not None:
            raise CheckFailed(
                MESSAGES_01[f"mixed_forward {mistake}"].format(
                    gpu=gpu, dtype=name, got=str(out.dtype)[6:]
                )
            )
    if seen.autocast[-1:] != wanted:  # which rule did it follow?
        picked = _observed(evidence.precisions_picked, mixed_forward, RULE_CAPABILITIES)
        check(not is_raised(picked), f"{picked}")
        _no_refusal(picked.refused)
        picks = {c: p or None for c, p in zip(RULE_CAPABILITIES, picked.picks, strict=True)}
        shown = {c: "float32" if p == "fp32" else str(p) for c, p in picks.items()}
        rule = precision_rule_feedback(picks, shown, describe=False)
        check(rule is None, str(rule))
    check(
        seen.autocast[-1:] == wanted,
        MESSAGES_01["mixed_forward autocast" if want.autocast else "mixed_forward float32"].format(
            gpu=gpu, dtype=name
        ),
    )
    check(
        set(seen.weights) <= {"float32"} and out.dtype == want.dtype,
        MESSAGES_01["mixed_forward converted"].format(gpu=gpu, dtype=name),
    )
    check(not seen.on_after, MESSAGES_01["mixed_forward left on"])


# ----------------------------------------------------------------- exercise (c)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _time_it_mistakes(warm: list[float], timed: list[float]) -> dict[str, float]:
    """What each usual mistake of exercise 01 (c) returns for these call durations."""
    ordered, everything = sorted(timed), sorted(warm + timed)
    middle = len(timed) // 2
    return {
        "time_it mean": sum(timed) / len(timed),
        "time_it fastest": min(timed),
        "time_it slowest": max(timed),
        "time_it total": sum(timed),
        "time_it warm-up timed": statistics.median(everything),
        "time_it mean of all": sum(everything) / len(everything),
        "time_it milliseconds": statistics.median(timed) * 1e3,
        "time_it upper middle": ordered[middle],
        "time_it lower middle": ordered[(len(timed) - 1) // 2],
        "time_it unsorted middle": timed[middle],
        "time_it duplicates dropped": statistics.median(set(timed)),
    }


#: Exercise 01 (c)'s fake call durations (warm-up calls, timed repeats), in seconds: odd
#: and even counts, a tie, a single repeat, slow warm-up calls and one slow repeat, so that
#: each usual mistake returns something other than the median on at least one case.
TIME_IT_CASES = [
    ([0.5, 0.5], [0.010, 0.030, 0.020, 0.250, 0.020]),
    ([0.4], [0.003, 0.001, 0.007]),
    ([0.5], [0.012, 0.018, 0.300, 0.030, 0.010, 0.020]),
    ([0.2], [0.002, 0.009, 0.002, 0.005, 0.002]),
    ([0.3], [0.005]),
]


def check_time_it_median(time_it: Callable[..., Any]) -> None:
    """Exercise 01 (c) on a fake clock: each ``fn()`` call advances it by a known duration
    (:data:`TIME_IT_CASES`; :func:`~course_utils.checks.evidence.nb01.timed_on_a_fake_clock`),
    so that only a timer that reads a clock around each timed call and returns the median
    of the repeats gets the answer. A wrong answer is told the usual mistake its results
    match on every case, or else what it returned on the first case it got wrong (never
    that case's median). The course's own timers (``benchmark``) are refused inside the
    learner's call.

    >>> def mean(fn, device, warmup=2, repeats=5):
    ...     for _ in range(warmup):
    ...         fn()
    ...     times = []
    ...     for _ in range(repeats):
    ...         began = __import__("time").perf_counter(); fn()
    ...         times.append(__import__("time").perf_counter() - began)
    ...     return sum(times) / len(times)
    >>> check_time_it_median(mean)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    course_utils.feedback.CheckFailed: repeats that took 10 ms, ... gave 66 ms, the mean ...
    """
    answers: list[float] = []
    for warm, timed in TIME_IT_CASES:
        shown = ", ".join(_ms(s) for s in timed)
        seen = _observed(evidence.timed_on_a_fake_clock, time_it, warm, timed)
        check(not is_raised(seen), MESSAGES_01["time_it raised"].format(shown=shown, error=seen))
        _no_refusal(seen.refused)
        check(
            seen.calls == len(warm) + len(timed),
            MESSAGES_01["time_it calls"].format(
                warmup=len(warm), repeats=len(timed), calls=seen.calls
            ),
        )
        check(seen.reads > 0, MESSAGES_01["time_it no clock"])
        took = plain_value(value_rebuilt(seen.took), "time_it(fn, device, warmup, repeats)")
        check(
            isinstance(took, int | float) and not isinstance(took, bool),
            MESSAGES_01["time_it not a number"].format(
                kind=type(took).__name__ if took is not None else "None"
            ),
        )
        answers.append(float(took))
    right = [statistics.median(timed) for _, timed in TIME_IT_CASES]

    def same(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=1e-6)

    if all(map(same, answers, right)):
        return
    each = [_time_it_mistakes(warm, timed) for warm, timed in TIME_IT_CASES]
    values = {name: [case[name] for case in each] for name in each[0]}
    wrong = next(i for i, (a, b) in enumerate(zip(answers, right, strict=True)) if not same(a, b))
    shown = ", ".join(_ms(s) for s in TIME_IT_CASES[wrong][1])
    name = matching_mistake(answers, values, right, same) or "time_it not the median"
    raise CheckFailed(MESSAGES_01[name].format(shown=shown, got=_ms(answers[wrong])))


def _names_cuda_1(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    """Whether a ``torch.cuda.synchronize`` call's device is cuda:1 (``None``: it names
    none, or names ``"cuda"``: the current device, which the course sets to the one used)."""
    device = args[0] if args else kwargs.get("device")
    if device is None or str(device) == "cuda":
        return None
    try:
        named = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        return False
    return named == torch.device("cuda", 1)


def _synchronize_calls(time_it: Callable[..., Any], device: str) -> tuple[list[Any], int]:
    """The ``(args, kwargs)`` of each ``torch.cuda.synchronize`` call ``time_it`` made
    timing ``device`` (:func:`~course_utils.checks.evidence.nb01.synchronize_calls`), and
    whether it asked ``torch.cuda.is_available()``."""
    seen = _observed(evidence.synchronize_calls, time_it, device)
    check(not is_raised(seen), f"{seen}")
    _no_refusal(seen.refused)
    calls = [value_rebuilt(call) for call in seen.calls]
    plain_value(calls, "torch.cuda.synchronize(device)")  # str() of a subclass could lie
    return calls, seen.asked


def check_time_it_device(time_it: Callable[..., Any]) -> None:
    """Exercise 01 (c)'s synchronize, on a CPU grader: CUDA is made to look available and
    ``torch.cuda.synchronize`` is a spy that records which device each call names. Timing
    the CPU device must not synchronize (a timer that asks ``torch.cuda.is_available()``
    instead of the device being timed does); timing ``cuda:1`` must synchronize it, or the
    current device (no argument), never another GPU. The course's ``benchmark`` is refused.

    >>> def always(fn, device, warmup=2, repeats=5):
    ...     __import__("torch").cuda.synchronize(device); return 0.0
    >>> check_time_it_device(always)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    course_utils.feedback.CheckFailed: timing a CPU device while CUDA was available, ...
    """
    synced, asked = _synchronize_calls(time_it, "cpu")
    if synced:
        reason = "time_it synced because CUDA exists" if asked else "time_it synced a CPU device"
        raise CheckFailed(MESSAGES_01[reason])
    synced, _ = _synchronize_calls(time_it, "cuda:1")
    check(bool(synced), MESSAGES_01["time_it no sync on GPU"])
    others = [call for call in synced if _names_cuda_1(*call) is False]
    if others:
        args, kwargs = others[0]
        device = args[0] if args else kwargs.get("device")
        named = f"cuda:{device}" if isinstance(device, int) else str(device)
        raise CheckFailed(MESSAGES_01["time_it synced another GPU"].format(synced=named))


def simulated_gpu_time(
    time_it: Callable[..., Any], warmup: int, repeats: int, queued_s: float = 0.0
) -> tuple[Any, int]:
    """What ``time_it`` measured on a simulated GPU running :data:`SIM_KERNEL_S` kernels,
    and how many times it called ``torch.cuda.synchronize()``
    (:func:`~course_utils.checks.evidence.nb01.timed_on_a_simulated_gpu`); ``queued_s``:
    someone else's work, queued before the call. What it measured is a plain value."""
    seen = evidence.timed_on_a_simulated_gpu(time_it, warmup, repeats, queued_s)
    took = plain_value(value_rebuilt(seen.took), "time_it(...)")  # no subclass answers >=
    return took, seen.synchronized


#: Notebook 01's check messages, by a stable name: one sentence each, ``{placeholders}``
#: for the figures of the case the learner's answer failed.
MESSAGES_01 = Messages(
    "01",
    {
        "time_it raised": "{error} (on repeats that took {shown})",
        "time_it calls": "call fn warmup + repeats = {warmup} + {repeats} times; it ran "
        "{calls} times",
        "time_it no clock": "your time_it never read a clock: read time.perf_counter() before and "
        "after each timed fn() call",
        "time_it not a number": "return the median in seconds, as a float; got {kind}",
        "time_it mean": "repeats that took {shown} gave {got}, the mean of the repeats; return "
        "their median (one slow repeat, a page fault or another process, does not move it)",
        "time_it fastest": "repeats that took {shown} gave {got}, the fastest repeat; return the "
        "median of the repeats",
        "time_it slowest": "repeats that took {shown} gave {got}, the slowest repeat; return the "
        "median of the repeats",
        "time_it total": "repeats that took {shown} gave {got}, their total; return the median "
        "of the repeats",
        "time_it warm-up timed": "repeats that took {shown} gave {got}: the slow warm-up calls "
        "were timed too; run the warm-up calls first, untimed, then time the repeats",
        "time_it mean of all": "repeats that took {shown} gave {got}, the mean of all calls, the "
        "slow warm-up calls timed too: run the warm-up calls untimed, then return the median "
        "of the repeats",
        "time_it milliseconds": "repeats that took {shown} gave {got}, the median in "
        "milliseconds: return seconds",
        "time_it upper middle": "repeats that took {shown} gave {got}, the upper of the two "
        "middle values: with an even number of repeats the median is the mean of the two "
        "middle ones (statistics.median: 3 ms for 1, 2, 4 and 9 ms)",
        "time_it lower middle": "repeats that took {shown} gave {got}, the lower of the two "
        "middle values (what torch.median returns): with an even number of repeats the median "
        "is the mean of the two middle ones (statistics.median: 3 ms for 1, 2, 4 and 9 ms)",
        "time_it unsorted middle": "repeats that took {shown} gave {got}, the repeat in the middle "
        "of the list as it was timed: sort the times first, or use statistics.median",
        "time_it duplicates dropped": "repeats that took {shown} gave {got}, the median of the "
        "distinct times: equal times each count (the median of 1, 1, 1, 5 and 9 ms is 1 ms)",
        "time_it not the median": "repeats that took {shown} gave {got}, which is not their "
        "median: time each fn() call alone and return statistics.median of the repeats (3 ms "
        "for 1, 2, 4 and 9 ms)",
        "time_it synced a CPU device": "timing a CPU device while CUDA was available, your "
        "time_it called torch.cuda.synchronize(): synchronize only when the device being timed "
        "is a GPU, device.type == 'cuda'",
        "time_it synced because CUDA exists": "timing a CPU device, your time_it synchronized "
        "CUDA because torch.cuda.is_available() was True: decide by the device being timed, "
        "device.type == 'cuda', not by whether a GPU exists",
        "time_it synced another GPU": "timing cuda:1, your time_it synchronized {synced}: "
        "synchronize the device being timed, torch.cuda.synchronize(device)",
        "time_it no sync on GPU": "timing cuda:1, your time_it never called "
        "torch.cuda.synchronize(): on a CUDA device synchronize before starting the clock and "
        "after fn(), torch.cuda.synchronize(device)",
        "to_device raised": "{error}, given {what}",
        "to_device wrong": "in what your function returned, {difference}, given {what}",
        "to_device changed the batch": "your function changed the batch it was given "
        "(afterwards, {difference}): build new containers and leave the old ones as they were",
        "mixed_forward shape": "give back the output of model(x), of shape (8, 4)",
        "mixed_forward autocast device": "x is on {device}, but you ran autocast for {devices}: "
        "write torch.autocast(x.device.type, ...), which follows x",
        "mixed_forward no autograd": "a training step's forward pass must keep autograd on: no "
        "torch.no_grad() or .detach()",
        "mixed_forward autocast": "for {gpu}, run model(x) under torch.autocast(x.device.type, "
        "dtype=torch.{dtype})",
        "mixed_forward float32": "{gpu} has no tensor cores: run model(x) in float32, without "
        "autocast",
        "mixed_forward model converted": "your function converted the model's weights to "
        "{got} (model.half() or model.to(...)), so {gpu} trains in {got} weights: leave the model "
        "in float32 and run model(x) under torch.autocast(x.device.type, dtype=torch.{dtype})",
        "mixed_forward output cast": "your function ran model(x) in float32 and cast its output "
        "to {got}, which saves nothing inside the model: for {gpu}, run model(x) itself under "
        "torch.autocast(x.device.type, dtype=torch.{dtype})",
        "mixed_forward converted": "autocast casts inside each operation (the output for {gpu} "
        "is {dtype}): do not convert the model, x or the output yourself",
        "mixed_forward left on": "autocast is still on after your function returned: use it as "
        "a context manager, `with torch.autocast(...):`",
    },
)


def _as_text_rule(capability: tuple[int, int]) -> str:
    text = f"{capability[0]}.{capability[1]}"  # "10.0" < "8.0" as text
    return "bf16" if text >= "8.0" else "fp16" if text >= "7.0" else "fp32"


#: Each usual mistake of a precision rule (exercises 01 (b) and 05 (b)): the precision it
#: picks for a compute capability, "fp32", "fp16" or "bf16".
PRECISION_RULE_MISTAKES: dict[str, Callable[[tuple[int, int]], str]] = {
    "precision as text": _as_text_rule,
    "precision after 8.0": lambda c: "bf16" if c > (8, 0) else "fp16" if c >= (7, 0) else "fp32",
    "precision from 7.5": lambda c: "bf16" if c >= (8, 0) else "fp16" if c >= (7, 5) else "fp32",
    "precision named GPUs only": lambda c: {(8, 0): "bf16", (7, 5): "fp16"}.get(c, "fp32"),
    "precision fp16 before Volta": lambda c: "bf16" if c >= (8, 0) else "fp16",
    "precision Ampere only": lambda c: "bf16" if c[0] == 8 else "fp16" if c >= (7, 0) else "fp32",
}


#: The compute capabilities, Kepler to Blackwell, a precision rule is diagnosed on.
RULE_CAPABILITIES = [(3, 7), (6, 0), (6, 1), (7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 9)]
RULE_CAPABILITIES += [(9, 0), (10, 0), (12, 0)]


#: The precision-rule messages of exercises 01 (b) and 05 (b) (one rule, two notebooks).
MESSAGES_PRECISION_RULE = Messages(
    "precision rule",
    {
        "precision as text": "compute capability {capability} got {got}: the capabilities "
        'were compared as text, where "10.0" < "8.0"; compare tuples of numbers, capability >= '
        "(8, 0)",
        "precision after 8.0": "compute capability {capability} got {got}: bf16 starts at 8.0 "
        "itself (an A100), capability >= (8, 0), not >",
        "precision from 7.5": "compute capability {capability} got {got}: fp16 tensor cores start "
        "at 7.0 (Volta, a V100), not at 7.5",
        "precision named GPUs only": "compute capability {capability} got {got}: the rule is "
        "ranges of capabilities, not the GPUs named: bf16 from 8.0, fp16 from 7.0, float32 below",
        "precision fp16 before Volta": "compute capability {capability} got {got}: GPUs below 7.0 "
        "have no tensor cores, so they run in float32",
        "precision Ampere only": "compute capability {capability} got {got}: GPUs newer than "
        "Ampere (9.0 Hopper, 10.0 and 12.0 Blackwell) have bf16 too, capability >= (8, 0)",
        "precision wrong": "compute capability {capability} got {got}, which breaks the rule: "
        "bf16 from 8.0, fp16 from 7.0, float32 below",
    },
)


def precision_rule_feedback(
    picked: Mapping[tuple[int, int], str | None],
    shown: Mapping[tuple[int, int], str],
    *,
    describe: bool = True,
) -> str | None:
    """Feedback for a precision rule that picked ``picked[capability]`` ("fp32", "fp16",
    "bf16", or None: something else) on :data:`RULE_CAPABILITIES` (``None``: all right).
    It names the usual mistake whose picks match on every capability, else describes the
    first wrong one (``describe=False``: returns None then); ``shown`` says each pick as the
    exercise writes it."""
    right = {c: str(pick_precision("cuda", capability=c).name.value) for c in picked}
    wrong = [c for c in picked if picked[c] != right[c]]
    if not wrong:
        return None
    caps = list(picked)
    name = matching_mistake(
        [picked[c] for c in caps],
        {n: [rule(c) for c in caps] for n, rule in PRECISION_RULE_MISTAKES.items()},
        [right[c] for c in caps],
        lambda a, b: a == b,
    )
    if name is None and not describe:
        return None
    capability = next(
        (c for c in wrong if name and PRECISION_RULE_MISTAKES[name](c) != right[c]), wrong[0]
    )
    got = shown.get(capability, repr(picked[capability]))
    return MESSAGES_PRECISION_RULE[name or "precision wrong"].format(
        capability=f"{capability[0]}.{capability[1]}", got=got
    )
