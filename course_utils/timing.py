"""Timing GPU work correctly: synchronize (CUDA kernels run asynchronously: a stopwatch
around ``a @ b`` measures the launch), exclude warm-up, repeat, report median and spread."""

from __future__ import annotations

import ctypes
import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any
from unittest import mock

import numpy as np
import torch

from course_utils.language import Messages


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    """A function that waits for all queued work on ``device`` (on the CPU: nothing)."""
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None


#: What a timing cell says to a learner.
MESSAGES_TIMING = Messages(
    "timing",
    {
        "busy": "The machine was busy: this process ran on a core {share:.0%} of the time "
        "while it measured, so {what} measures the other processes' load, not the code. Not "
        "asserted: run the cell again when the machine is quieter.",
    },
)


@dataclass(frozen=True)
class Timing:
    """The result of :func:`benchmark`: seconds per call, one entry per repeat."""

    times_s: list[float]
    warmup: int
    synchronized: bool
    device: str

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def iqr_s(self) -> float:
        """Interquartile range: the spread of the middle half of the repeats."""
        if len(self.times_s) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times_s, n=4, method="inclusive")
        return q3 - q1

    def __str__(self) -> str:
        sync = "synchronized" if self.synchronized else "NOT synchronized"
        return (
            f"{format_seconds(self.median_s)} median, IQR {format_seconds(self.iqr_s)} "
            f"over {len(self.times_s)} runs ({self.warmup} warm-up runs excluded, "
            f"{sync}, {self.device})"
        )


def format_seconds(seconds: float) -> str:
    """Seconds in the unit a person reads best.

    >>> format_seconds(0.0123)
    '12.3 ms'
    """
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def benchmark(
    fn: Callable[[], Any],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    repeats: int = 10,
    number: int = 1,
    synchronize: bool = True,
    sync: Callable[[], None] | None = None,
) -> Timing:
    """Time ``fn()`` on ``device``: ``warmup`` untimed calls, then ``repeats`` timings of
    ``number`` calls each (seconds per call). ``synchronize=False`` shows what naive timing
    measures; ``sync`` replaces the device's synchronize function (tests, simulations)."""
    if warmup < 0 or repeats < 1 or number < 1:
        raise ValueError("need warmup >= 0, repeats >= 1 and number >= 1")
    wait = sync or synchronizer(device)
    for _ in range(warmup):
        fn()
    wait()  # warm-up work must not spill into the first timed repeat
    times = []
    for _ in range(repeats):
        if synchronize:
            wait()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if synchronize:
            wait()
        times.append((time.perf_counter() - start) / number)
    wait()  # leave no queued work behind, whatever was measured
    return Timing(times, warmup, synchronize, str(torch.device(device)))


def time_in_turns(
    functions: Mapping[str, Callable[[], Any]],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 1,
    rounds: int = 5,
    sync: Callable[[], None] | None = None,
) -> dict[str, Timing]:
    """Time functions taking turns (A, B, A, B, ...: a shared machine's changing load hits
    each alike), one :class:`Timing` each: ``warmup`` untimed calls, one call per round."""
    if warmup < 0 or rounds < 1:
        raise ValueError("need warmup >= 0 and rounds >= 1")
    wait = sync or synchronizer(device)
    for fn in functions.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(rounds):
        for name, fn in functions.items():
            wait()
            start = time.perf_counter()
            fn()
            wait()
            times[name].append(time.perf_counter() - start)
    return {
        name: Timing(values, warmup, True, str(torch.device(device)))
        for name, values in times.items()
    }


def typical_s(timing: Timing) -> float:
    """One figure per measurement: the median on a GPU; on a CPU the fastest call, since on
    a shared machine other processes only ever add time (a CPU figure is indicative)."""
    return timing.min_s if torch.device(timing.device).type == "cpu" else timing.median_s


BUSY_SHARE = 0.8  # below this share of a core, the process mostly waited for one


@dataclass
class CpuShare:
    """How much of a block's wall time this process ran on a CPU (:func:`cpu_share`):
    about 1 (or more, with several threads) on a quiet machine; well under 1 when other
    processes took the cores, so a wall-clock figure measured then is the machine's load."""

    wall_s: float = 0.0
    cpu_s: float = 0.0

    @property
    def fraction(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 1.0

    @property
    def busy(self) -> bool:
        return self.fraction < BUSY_SHARE

    def advice(self, what: str) -> str:
        """The sentence a cell prints instead of failing on a busy machine."""
        return MESSAGES_TIMING["busy"].format(share=self.fraction, what=what)


@contextmanager
def cpu_share() -> Iterator[CpuShare]:
    """Measure this process's CPU time against the wall clock inside the block.

    >>> with cpu_share() as share:
    ...     total = sum(range(200_000))
    >>> share.wall_s > 0 and share.cpu_s > 0
    True
    """
    share = CpuShare()
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield share
    finally:
        share.wall_s = time.perf_counter() - wall
        share.cpu_s = time.process_time() - cpu


_OPENBLAS_SETTERS = (  # NumPy's own OpenBLAS (scipy-openblas, 64-bit ints), then others
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)


def _numpy_openblas() -> tuple[Callable[[int], Any], Callable[[], int]] | None:
    """The set/get thread-count functions of the OpenBLAS NumPy loaded (Linux), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for setter, getter in _OPENBLAS_SETTERS:
            if hasattr(library, setter) and hasattr(library, getter):
                return getattr(library, setter), getattr(library, getter)
    return None


@contextmanager
def numpy_blas_threads(threads: int) -> Iterator[int | None]:
    """Limit NumPy's BLAS to ``threads`` inside the block, so that NumPy and torch (whose
    pool ``torch.set_num_threads`` sets) compare like for like; yields the count in force,
    or None where it cannot be set (then NumPy keeps its own pool). Uses ``threadpoolctl``
    when installed, else NumPy's bundled OpenBLAS directly."""
    try:
        from threadpoolctl import threadpool_limits  # lazy: optional, not in the lock
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        with threadpool_limits(limits=threads, user_api="blas"):
            yield threads
        return
    openblas = _numpy_openblas()
    if openblas is None:
        yield None
        return
    set_threads, get_threads = openblas
    before = int(get_threads())
    set_threads(threads)
    try:
        yield int(get_threads())
    finally:
        set_threads(before)


class SimulatedGPU:
    """A GPU stream simulated on the CPU: ``launch(seconds)`` queues "work" and returns at
    once, a thread does it in order, ``synchronize()`` waits for the queue to empty.

    >>> gpu = SimulatedGPU()
    >>> gpu.launch(0.01); gpu.synchronize(); gpu.completed
    1
    """

    def __init__(self) -> None:
        self._work: queue.Queue[float] = queue.Queue()
        self.completed = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            seconds = self._work.get()
            time.sleep(seconds)
            self.completed += 1
            self._work.task_done()

    def launch(self, seconds: float) -> None:
        self._work.put(seconds)

    def synchronize(self) -> None:
        self._work.join()


@contextmanager
def fake_cuda(gpu: SimulatedGPU) -> Iterator[list[tuple[Any, ...]]]:
    """Within the block ``torch.cuda.synchronize()`` waits for ``gpu`` and CUDA is
    "available"; yields the synchronize calls' arguments (a CPU grader checks a timer).

    >>> gpu = SimulatedGPU()
    >>> with fake_cuda(gpu) as calls:
    ...     gpu.launch(0.01); torch.cuda.synchronize(); gpu.completed, len(calls)
    (1, 1)
    """
    calls: list[tuple[Any, ...]] = []

    def synchronize(*args: Any, **kwargs: Any) -> None:
        calls.append(args)
        gpu.synchronize()

    with (
        mock.patch.object(torch.cuda, "synchronize", synchronize),
        mock.patch.object(torch.cuda, "is_available", lambda: True),
    ):
        yield calls


def compare_matmul(
    sizes: list[int],
    devices: list[torch.device | str],
    *,
    warmup: int = 2,
    repeats: int = 5,
    settle_s: float = 0.2,
) -> list[dict[str, Any]]:
    """Time the same float32 square matmul in NumPy and in torch on each device: one row
    per (library, device, size) with median, fastest (``min_ms``), IQR, ``typical_ms``
    (:func:`typical_s`: the fastest call on a CPU, where other processes only add time; the
    median on a GPU), GFLOP/s (``2 n^3`` FLOPs, from ``typical_ms``) and ``max_abs_diff``
    from NumPy's result. NumPy's BLAS runs
    with torch's CPU thread count (:func:`numpy_blas_threads`), like for like; each row's
    ``threads`` says how many it had (None: NumPy's own pool, not settable here).
    ``settle_s``: a pause after each measurement, as the CPU thread pools spin after their
    last call (on 2 cores that turned 0.2 ms torch matmuls into 16 ms ones,
    ``benchmarks/bench_matmul.py``)."""
    rows = []
    threads = torch.get_num_threads()
    generator = np.random.default_rng(0)
    for n in sizes:
        a = generator.standard_normal((n, n), dtype=np.float32)
        b = generator.standard_normal((n, n), dtype=np.float32)
        reference = a @ b
        runs = [("numpy", "cpu", partial(np.matmul, a, b))]
        for device in map(torch.device, devices):
            ta, tb = torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)
            runs.append(("torch", str(device), partial(torch.matmul, ta, tb)))
        for library, device_name, matmul in runs:
            if library == "numpy":
                with numpy_blas_threads(threads) as used:
                    timing = benchmark(matmul, warmup=warmup, repeats=repeats)
            else:
                used = threads if device_name == "cpu" else None
                timing = benchmark(matmul, device=device_name, warmup=warmup, repeats=repeats)
            result = torch.as_tensor(matmul()).cpu().numpy()
            rows.append(
                {
                    "library": library,
                    "device": device_name,
                    "n": n,
                    "threads": used,
                    "median_ms": timing.median_s * 1e3,
                    "min_ms": timing.min_s * 1e3,
                    "iqr_ms": timing.iqr_s * 1e3,
                    "typical_ms": typical_s(timing) * 1e3,
                    "gflops": 2 * n**3 / typical_s(timing) / 1e9,
                    "max_abs_diff": float(np.max(np.abs(result - reference))),
                }
            )
            time.sleep(settle_s)
    return rows
