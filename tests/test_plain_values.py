"""Checks graded *beside* the answer share a process with the learner's code, so a value
the answer returns may be of a subclass whose ``==``, ``!=``, ``<``, ``bool()``,
``float()`` or ``__contains__`` says whatever it likes. Each check of the course's
modules that compares such a value first requires the exact built-in type
(:func:`course_utils.feedback.plain_value`, tensors
:func:`~course_utils.checks.core.exact_tensor`): a lying subclass fails with a sentence naming
its type, and right answers written in other idioms (an int for a float, a list for a tuple,
NumPy scalars, 0-d tensors) still pass.
"""

from __future__ import annotations

import re
import statistics
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from course_utils import capstone, flops
from course_utils.checks import core, nb01, nb02, nb03, nb04, nb05, nb07
from course_utils.checks import nb02 as checks_nb02
from course_utils.checks import nb04 as checks_nb04
from course_utils.checks import nb05 as checks_nb05
from course_utils.checks import nb07 as checks_nb07
from course_utils.checks import nb08 as checks_nb08
from course_utils.checks import nb09 as checks_09
from course_utils.checks import nb09 as checks_nb09
from course_utils.checks.evidence import nb05 as evidence05
from course_utils.fake_nvml import FakeNvml
from course_utils.feedback import CheckFailed, plain_value
from course_utils.profiling import LoopProfile


class Yes(int):
    """An int equal to everything, true and never less than anything."""

    __eq__ = lambda self, other: True  # noqa: E731
    __ne__ = lambda self, other: False  # noqa: E731
    __lt__ = __gt__ = lambda self, other: False
    __bool__ = lambda self: True  # noqa: E731
    __hash__ = int.__hash__


class Close(float):
    """A float equal to everything; ``float()`` of it says 0.5."""

    __eq__ = lambda self, other: True  # noqa: E731
    __ne__ = lambda self, other: False  # noqa: E731
    __float__ = lambda self: 0.5  # noqa: E731
    __hash__ = float.__hash__


class Lying(str):
    """A str equal to everything and containing everything."""

    __eq__ = lambda self, other: True  # noqa: E731
    __ne__ = lambda self, other: False  # noqa: E731
    __contains__ = lambda self, other: True  # noqa: E731
    __hash__ = str.__hash__


class Pair(tuple):
    """A tuple equal to everything."""

    __eq__ = lambda self, other: True  # noqa: E731
    __ne__ = lambda self, other: False  # noqa: E731
    __hash__ = tuple.__hash__


class Agreeable(torch.Tensor):
    """A tensor subclass (whatever it would answer)."""


def _fails_as_plain(kind: str, call) -> None:
    with pytest.raises(CheckFailed, match=rf"of type {kind}\b") as failure:
        call()
    assert "Traceback" not in str(failure.value) and str(failure.value).count("\n") == 0


# ----------------------------------------------------------------- the helper itself


def test_plain_values_pass_through_and_subclasses_fail_naming_where():
    value = {"a": [1, 2.5, None, True, (b"x", 1j)], "t": torch.ones(2), "n": np.float64(1)}
    assert plain_value(value, "f()") is value
    assert plain_value(core.answer_or_error(int, "x"), "f()")  # the course's sentence
    with pytest.raises(
        CheckFailed,
        match=r"^f\(\)\['a'\]\[1\] should be of type float, but it "
        r"is of type Close$",
    ):
        plain_value({"a": [1, Close(2.0)]}, "f()")
    with pytest.raises(CheckFailed, match="should be of type str, but it is of type Lying"):
        plain_value({Lying("a"): 1}, "f()")  # a key
    with pytest.raises(CheckFailed, match=r"of type Agreeable, a subclass of torch\.Tensor"):
        plain_value([torch.ones(1).as_subclass(Agreeable)], "f()")


def test_a_value_that_claims_a_built_in_class_fails():
    class Impostor:
        __class__ = property(lambda self: int)  # isinstance(Impostor(), int) is True
        __eq__ = lambda self, other: True  # noqa: E731

    assert isinstance(Impostor(), int)
    with pytest.raises(CheckFailed, match="should be of type int, but it is of type Impostor"):
        plain_value([Impostor()], "f()")


def test_a_container_that_holds_itself_is_checked_once():
    loop: list = [1]
    loop.append(loop)
    assert plain_value(loop, "f()") is loop


# ----------------------------------------------------------------- classroom checks


def test_check_close():
    _fails_as_plain("Close", lambda: core.check_close(Close(9.0), 0.3, "the sum"))
    _fails_as_plain(
        "Agreeable",
        lambda: core.check_close(torch.ones(2).as_subclass(Agreeable), torch.ones(2), "the output"),
    )
    for right in (0.3, np.float64(0.3), torch.tensor(0.3)):
        core.check_close(right, 0.3, "the sum")
    core.check_close(3, 3.0, "the count")  # an int where a float is expected


def _median_time_it(median):
    def time_it(fn, device, warmup=2, repeats=5):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return median(times)

    return time_it


def test_check_time_it_median():
    _fails_as_plain(
        "Close",
        lambda: nb01.check_time_it_median(_median_time_it(lambda times: Close(0.0))),
    )
    for median in (statistics.median, np.median, lambda times: float(np.median(times))):
        nb01.check_time_it_median(_median_time_it(median))


def _mfu(flops, step_s, peak_tflops, gpus=1):
    return flops / step_s / (gpus * peak_tflops * 1e12)


def test_check_run_mfu():
    _fails_as_plain("Close", lambda: checks_nb02.check_run_mfu(lambda *case: Close(_mfu(*case))))
    for idiom in (float, np.float64, torch.tensor):
        checks_nb02.check_run_mfu(lambda *case, idiom=idiom: idiom(_mfu(*case)))


def test_check_largest_batch():
    _fails_as_plain("Yes", lambda: checks_nb04.check_largest_batch(lambda b, s, p: Yes(0)))
    checks_nb04.check_largest_batch(lambda budget, static, per: max(0, (budget - static) // per))


def _adam_bytes(model):
    trainable = [p for p in model.parameters() if p.requires_grad]
    return sum(2 * p.numel() * p.element_size() + 4 for p in trainable)


def test_check_adam_state():
    _fails_as_plain("Yes", lambda: nb04.check_adam_state(lambda model: Yes(0)))
    for idiom in (int, float, torch.tensor):
        nb04.check_adam_state(lambda model, idiom=idiom: idiom(_adam_bytes(model)))


def test_check_adam_state_follows_dtype():
    _fails_as_plain("Yes", lambda: nb04.check_adam_state_follows_dtype(lambda m: Yes(0)))
    nb04.check_adam_state_follows_dtype(_adam_bytes)


def test_check_after_empty_cache():
    _fails_as_plain(
        "Pair", lambda: checks_nb07.check_after_empty_cache(lambda a, r, c: Pair((0, 0)))
    )
    _fails_as_plain(
        "Yes", lambda: checks_nb07.check_after_empty_cache(lambda a, r, c: (Yes(0), a + c))
    )
    for idiom in (tuple, list):
        checks_nb07.check_after_empty_cache(lambda a, r, c, idiom=idiom: idiom((a, float(a + c))))


def _read_profile(speedup_idiom, pair=tuple):
    def read_profile(profile):
        phases = {"data": profile.data_s, "copy": profile.copy_s, "compute": profile.compute_s}
        name = max(phases, key=phases.get)
        return pair((name, speedup_idiom(profile.wall_s / (profile.wall_s - phases[name]))))

    return read_profile


OWN_PROFILE = LoopProfile(
    num_steps=10, samples=80, data_s=0.7, copy_s=0.01, compute_s=0.29, wall_s=1.0
)


def test_check_read_profile():
    _fails_as_plain(
        "Lying",
        lambda: checks_nb08.check_read_profile(
            lambda profile: (Lying("the data"), 2.0), OWN_PROFILE
        ),
    )
    _fails_as_plain(
        "Close", lambda: checks_nb08.check_read_profile(_read_profile(Close), OWN_PROFILE)
    )
    for idiom, pair in ((float, tuple), (np.float64, list), (torch.tensor, tuple)):
        checks_nb08.check_read_profile(_read_profile(idiom, pair), OWN_PROFILE)


def _parse(line):
    numbers = (re.match(r"\s*(-?\d+(?:\.\d+)?)", value) for value in line.split(", "))
    return [float(number.group(1)) if number else None for number in numbers]


def test_check_parses_other_lines():
    class Agreeing(list):
        __eq__ = lambda self, other: True  # noqa: E731

    _fails_as_plain(
        "Agreeing",
        lambda: checks_nb02.check_parses_other_lines(lambda line: Agreeing(_parse(line))),
    )
    _fails_as_plain(
        "Close",
        lambda: checks_nb02.check_parses_other_lines(
            lambda line: [Close(0.0) for _ in line.split(", ")]
        ),
    )
    checks_nb02.check_parses_other_lines(_parse)
    checks_nb02.check_parses_other_lines(
        lambda line: [
            int(v) if isinstance(v, float) and v.is_integer() else v for v in _parse(line)
        ]
    )  # ints where the numbers are whole


def _read_gpu(nvml: FakeNvml, index: int):
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
    except nvml.NVMLError_NotSupported:
        util = None
    return util, memory.used // 2**20, memory.total // 2**20


def test_check_read_gpu_edge_cases():
    _fails_as_plain(
        "Pair",
        lambda: nb02.check_read_gpu_edge_cases(lambda nvml, index: Pair(_read_gpu(nvml, index))),
    )
    _fails_as_plain(
        "Yes",
        lambda: nb02.check_read_gpu_edge_cases(lambda nvml, index: (None, Yes(0), Yes(0))),
    )
    nb02.check_read_gpu_edge_cases(_read_gpu)


def _limited(limit, attempts, leaks):
    def step(size):
        if size > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    return step


def _retry_halving(step, batch_size):
    while True:
        try:
            step(batch_size)
            return batch_size
        except torch.cuda.OutOfMemoryError:
            if batch_size == 1:
                raise RuntimeError("not even a batch of 1 fits") from None
            batch_size //= 2


def test_check_retry_halving_down_to_one():
    _fails_as_plain(
        "Yes",
        lambda: nb07.check_retry_halving_down_to_one(lambda step, size: Yes(3), _limited),
    )
    nb07.check_retry_halving_down_to_one(_retry_halving, _limited)


def _drop(namespace, blank=""):
    history = namespace["Out"]
    for key in [k for k, v in history.items() if isinstance(v, torch.Tensor)]:
        del history[key]
        namespace.pop(f"_{key}", None)
    for name in ("_", "__", "___"):
        if isinstance(namespace.get(name), torch.Tensor):
            namespace[name] = blank


def test_check_drop_from_history():
    _fails_as_plain(
        "Lying",
        lambda: nb07.check_drop_from_history(lambda namespace: _drop(namespace, Lying("kept"))),
    )
    nb07.check_drop_from_history(_drop)


def _gpu_loader(pin):
    def gpu_loader(dataset, batch_size, workers):
        extra = dict(persistent_workers=True, prefetch_factor=4) if workers else {}
        return DataLoader(
            dataset, batch_size, shuffle=True, num_workers=workers, pin_memory=pin, **extra
        )

    return gpu_loader


def test_check_gpu_loader():
    _fails_as_plain("Yes", lambda: nb03.check_gpu_loader(_gpu_loader(Yes(0))))
    nb03.check_gpu_loader(_gpu_loader(True))


def _to_gpu(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=batch.is_pinned())
    if isinstance(batch, dict):
        return {key: _to_gpu(value, device) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_to_gpu(value, device) for value in batch)
    return batch


def test_check_copy_to_gpu():
    def lying_names(batch, device):
        images, inner, names, boxes = _to_gpu(batch, device)
        return images, inner, [Lying("?")] * len(names), boxes

    def lying_keys(batch, device):
        images, inner, names, boxes = _to_gpu(batch, device)
        return images, {Lying(key): value for key, value in inner.items()}, names, boxes

    _fails_as_plain("Lying", lambda: nb03.check_copy_to_gpu(lying_names))
    _fails_as_plain("Lying", lambda: nb03.check_copy_to_gpu(lying_keys))
    nb03.check_copy_to_gpu(_to_gpu)


def test_check_moves_batch_compares_a_dicts_keys_by_type():
    def moved(batch, device):
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}

    def lying_keys(batch, device):
        return {Lying(key): value for key, value in moved(batch, device).items()}

    batch = {"x": torch.ones(2), "y": [1, "a"]}
    _fails_as_plain("Lying", lambda: nb01.check_moves_batch(lying_keys, batch))
    nb01.check_moves_batch(moved, batch)


def _mixed_forward(model, x, capability):
    if capability < (7, 0):
        return model(x)
    dtype = torch.bfloat16 if capability >= (8, 0) else torch.float16
    with torch.autocast(x.device.type, dtype=dtype):
        return model(x)


def test_check_mixed_forward_on_a_pretend_gpu():
    def subclassed(model, x, capability):
        return _mixed_forward(model, x, capability).as_subclass(Agreeable)

    def lying_device(model, x, capability):
        with torch.autocast(Lying("cuda"), dtype=torch.bfloat16):
            return model(x)

    for on_gpu in (False, True):
        _fails_as_plain(
            "Agreeable",
            lambda on_gpu=on_gpu: nb01.check_mixed_forward(subclassed, (8, 0), on_gpu=on_gpu),
        )
        nb01.check_mixed_forward(_mixed_forward, (8, 0), on_gpu=on_gpu)
    _fails_as_plain(
        "Lying",
        lambda: nb01.check_mixed_forward(lying_device, (8, 0), on_gpu=True),
    )


# ----------------------------------------------------------------- notebook 09's checks


def test_check_causal_attention_compares_the_second_output_as_a_plain_tensor():
    calls: list[int] = []

    def drifting(x, w_qkv, w_out, heads):
        calls.append(1)
        out = torch.randn_like(x)
        return out if len(calls) == 1 else out.as_subclass(Agreeable)

    _fails_as_plain(
        "Agreeable", lambda: checks_nb09.check_causal_attention(drifting, [(1, 4, 8, 2)])
    )
    checks_nb09.check_causal_attention(
        lambda x, w_qkv, w_out, heads: checks_nb09.attention(x, w_qkv, w_out, heads),
        [(1, 4, 8, 2)],
    )


class TinyGPT(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, 8)
        self.head = nn.Linear(8, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.tok(tokens))


def _pad_up(model: TinyGPT, multiple: int) -> TinyGPT:
    old = model.tok.weight.detach()
    rows = -(-old.shape[0] // multiple) * multiple
    model.tok = nn.Embedding(rows, old.shape[1], dtype=old.dtype)
    with torch.no_grad():
        model.tok.weight[: old.shape[0]] = old
    model.head.weight = model.tok.weight
    return model


def test_check_pad_vocabulary():
    def subclassed_logits(model, multiple):
        padded = _pad_up(model, multiple)
        padded.forward = lambda tokens: TinyGPT.forward(padded, tokens).as_subclass(Agreeable)
        return padded

    def subclassed_weight(model, multiple):
        class Kept(nn.Parameter):
            pass

        padded = _pad_up(model, multiple)
        padded.tok.weight = Kept(padded.tok.weight.detach())
        padded.head.weight = padded.tok.weight
        return padded

    for wrong in (subclassed_logits, subclassed_weight):
        with pytest.raises(CheckFailed, match=r"a subclass of torch\.Tensor"):
            checks_09.check_pad_vocabulary(wrong, TinyGPT, (), [(13, 8)])
    checks_09.check_pad_vocabulary(_pad_up, TinyGPT, (), [(13, 8), (16, 8)])


GPU = SimpleNamespace(name="a test GPU", fp32=10.0, fp16=40.0, bf16=None, tf32=None)


def _make_model(vocab, context, width, blocks, heads):
    return nn.Sequential(nn.Embedding(vocab, width), nn.Linear(width, vocab))


def _cases():
    return [
        checks_09.StepCase((11, 6, 8, 1, 2), batch=batch, seconds=0.5, gpu=GPU, dtype=dtype)
        for batch, dtype in ((2, torch.float32), (3, torch.float16), (2, torch.bfloat16))
    ]


def _check_step(step_throughput) -> None:
    checks_09.check_step_throughput(step_throughput, _make_model, _cases())


def _throughput(idiom=float, triple=tuple):
    def step_throughput(model, x, y, seconds, gpu, dtype):
        field = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
        peak = getattr(gpu, field)
        if peak is None:
            raise ValueError(f"{gpu.name} has no {field} peak")
        count = flops.step_flops(model, x, y)
        return triple((count, idiom(x.numel() / seconds), idiom(count / seconds / peak / 1e12)))

    return step_throughput


def test_check_step_throughput():
    def lying_no_peak(model, x, y, seconds, gpu, dtype):
        if dtype == torch.bfloat16:
            return Lying("no ValueError here")
        return _throughput()(model, x, y, seconds, gpu, dtype)

    _fails_as_plain("Pair", lambda: _check_step(_throughput(triple=Pair)))
    _fails_as_plain("Close", lambda: _check_step(_throughput(Close)))
    _fails_as_plain("Lying", lambda: _check_step(lying_no_peak))
    for idiom in (float, np.float64):
        _check_step(_throughput(idiom))


# ----------------------------------------------------------------- the capstone's losses


def test_the_losses_a_loop_returns_are_plain():
    _fails_as_plain("Close", lambda: capstone._loss_values([0.5, Close(0.1)]))
    _fails_as_plain(
        "Agreeable", lambda: capstone._loss_values(torch.ones(3).as_subclass(Agreeable))
    )
    assert capstone._loss_values([torch.tensor(2.0), 1, np.float32(0.5)]) == [2.0, 1.0, 0.5]
    assert capstone._loss_values(torch.stack([torch.tensor(1.0), torch.tensor(0.5)])) == [1, 0.5]
    assert capstone._loss_values(x / 2 for x in (2, 1)) == [1.0, 0.5]
    assert capstone._loss_values(None) == []


# ----------------------------------------------------------------- what the spies record


class Named(str):
    """A str whose ``str()`` says ``cuda``, whatever it holds."""

    __str__ = lambda self: "cuda"  # noqa: E731


def _synced_time_it(device_of):
    def time_it(fn, device, warmup=2, repeats=5):
        times = []
        for _ in range(warmup + repeats):
            if device.type == "cuda":
                torch.cuda.synchronize(device_of(device))
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times[warmup:])

    return time_it


def test_check_time_it_device_reads_synchronize_arguments_as_plain_values():
    _fails_as_plain(
        "Named",
        lambda: nb01.check_time_it_device(_synced_time_it(lambda d: Named("cuda:0"))),
    )
    for device_of in (lambda d: d, str, lambda d: d.index):
        nb01.check_time_it_device(_synced_time_it(device_of))


def _fast_loop(pin=True, non_blocking=True, scaler_device="cuda"):
    def fast_loop(data, model, device, timed):
        loader = DataLoader(data, batch_size=4, shuffle=True, pin_memory=pin)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(scaler_device)
        for inputs, labels in timed(loader):
            inputs = inputs.to(device, non_blocking=non_blocking)
            labels = labels.to(device, non_blocking=non_blocking)
            with torch.autocast(device.type, dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    return fast_loop


def test_check_fast_loop_on_a_gpu_reads_the_loops_arguments_as_plain_values():
    data = torch.utils.data.TensorDataset(torch.randn(16, 3), torch.randint(0, 2, (16,)))

    def check(loop):
        checks_nb08.check_fast_loop_on_a_gpu(loop, data, model=nn.Linear(3, 2))

    _fails_as_plain("Yes", lambda: check(_fast_loop(pin=Yes(0))))
    _fails_as_plain("Yes", lambda: check(_fast_loop(non_blocking=Yes(0))))
    _fails_as_plain("Named", lambda: check(_fast_loop(scaler_device=Named("cpu"))))
    check(_fast_loop())
    check(_fast_loop(pin=1, non_blocking=np.True_))  # truthy plain values, as before


# ----------------------------------------------------------------- notebook 05's checks


def _flag(capability):
    return (
        "bf16-mixed" if capability >= (8, 0) else "16-mixed" if capability >= (7, 0) else "32-true"
    )


def test_check_precision_flag():
    _fails_as_plain("Lying", lambda: nb05.check_precision_flag(lambda c: Lying(_flag(c))))
    nb05.check_precision_flag(_flag)


def _resume(every, lost_at):
    return (lost_at - 1) // every * every


def test_check_resume_step():
    def wasted(every, lost_at):
        return lost_at - _resume(every, lost_at)

    _fails_as_plain("Yes", lambda: checks_nb05.check_resume_step(lambda e, n: Yes(0), wasted, []))
    _fails_as_plain("Yes", lambda: checks_nb05.check_resume_step(_resume, lambda e, n: Yes(0), []))
    checks_nb05.check_resume_step(_resume, wasted, [(5, 12)])
    checks_nb05.check_resume_step(lambda e, n: float(_resume(e, n)), wasted, [(5, 12)])


def test_optimizer_mistake_reads_the_learning_rate_as_a_plain_value():
    params = [nn.Parameter(torch.ones(2))]

    def mistake(optimizers, lr):  # the evidence of the Trainer's optimizers, then the verdict
        return nb05.optimizer_mistake(evidence05.optimizers_seen(optimizers), lr)

    _fails_as_plain("Close", lambda: mistake([torch.optim.SGD(params, lr=Close(9.0))], 0.1))
    assert mistake([torch.optim.SGD(params, lr=0.1)], 0.1) is None
    assert "momentum" in str(mistake([torch.optim.SGD(params, lr=0.1, momentum=0.9)], 0.1))


def test_logged_loss_mistake_reads_the_metrics_as_plain_values():
    agreeable = torch.tensor(0.1).as_subclass(Agreeable)
    _fails_as_plain("Agreeable", lambda: nb05.logged_loss_mistake({"train_loss": agreeable}, [0.5]))
    _fails_as_plain(
        "Lying",
        lambda: nb05.logged_loss_mistake({Lying("train_loss"): torch.tensor(0.5)}, [0.5]),
    )
    assert nb05.logged_loss_mistake({"train_loss": torch.tensor(0.5)}, [0.7, 0.5]) is None


class _Stepper(nn.Module):
    def __init__(self, wrap) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model, self.wrap = nn.Linear(3, 2), wrap

    def training_step(self, batch, index):
        inputs, labels = batch
        return self.wrap(nn.functional.cross_entropy(self.model(inputs), labels))


def test_training_step_mistake_reads_the_loss_as_a_plain_tensor():
    batch = (torch.randn(4, 3), torch.tensor([0, 1, 1, 0]))

    def mistake(module, batch):  # the evidence of a training_step, then the verdict
        return nb05.training_step_mistake(evidence05.training_step_seen(module, batch))

    agreeable = _Stepper(lambda loss: loss.as_subclass(Agreeable))
    _fails_as_plain("Agreeable", lambda: mistake(agreeable, batch))
    for wrap in (lambda loss: loss, lambda loss: {"loss": loss}):
        assert mistake(_Stepper(wrap), batch) is None
