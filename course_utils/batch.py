"""Batch size (notebooks 03, 04, 05, 07): the largest batch that fits in memory, found by
search or predicted from two probes, recovery from out of memory, and the throughput knee:
**the smallest batch size whose throughput reaches 90% of the best measured throughput**.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import nn

from course_utils import progress
from course_utils.footprint import peak_memory, saved_tensor_bytes
from course_utils.models import build_model
from course_utils.oom import (
    MemoryBudget,
    allocated_cuda_bytes,
    error_summary,
    is_out_of_memory,
    release_after_out_of_memory,
)
from course_utils.timing import benchmark
from course_utils.training import TrainConfig, TrainStep
from course_utils.units import MIB


@dataclass(frozen=True)
class Trial:
    """One call of the trial function."""

    batch_size: int
    fits: bool
    seconds: float
    error: str | None = None  # the first line of the out-of-memory message


@dataclass
class MaxBatchSize:
    """A finder's answer (after the margin; 0 when not even ``low`` fits), the largest
    size that fitted (``limit``) and how many times the trial ran."""

    batch_size: int
    limit: int
    trials: int
    history: list[Trial] = field(default_factory=list)
    capped: bool = False  # the search stopped at ``high`` without running out of memory
    predicted: int | None = None  # :func:`predict_max_batch_size`'s prediction, if any


def _out_of_memory(fn: Callable[[], Any]) -> str | None:
    """Run ``fn()``: ``None``, or the summary of its out-of-memory error once memory is
    released (outside ``except``, where the traceback held the failed step's tensors:
    :func:`~course_utils.oom.release_after_out_of_memory`, no full ``gc.collect()`` unless
    device memory is still held); other errors are raised again."""
    message, allocated_before = None, allocated_cuda_bytes()
    try:
        fn()
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        message = error_summary(error)
    if message is not None:
        release_after_out_of_memory(allocated_before)
    return message


def _attempt(trial: Callable[[int], Any], batch_size: int, history: list[Trial]) -> bool:
    start = time.perf_counter()
    message = _out_of_memory(functools.partial(trial, batch_size))
    history.append(Trial(batch_size, message is None, time.perf_counter() - start, message))
    progress.tick()
    return message is None


def _after(history: list[Trial], found: MaxBatchSize) -> MaxBatchSize:
    """``found``, with the trials of ``history`` run before it."""
    found.history[:0] = history
    found.trials = len(found.history)
    return found


@progress.tracked("largest batch size", unit="trial")
def find_max_batch_size(
    trial: Callable[[int], Any],
    *,
    low: int = 1,
    high: int | None = None,
    margin: float = 0.0,
) -> MaxBatchSize:
    """The largest ``batch_size`` for which ``trial(batch_size)`` does not run out of memory
    (other errors are raised again): double from ``low`` until a trial fails, then bisect,
    at most ``2 * ceil(log2(M)) + 2`` trials for a limit ``M``. ``high`` caps the search;
    ``margin`` (0 to <1) takes that fraction off the limit (fragmentation, other processes).

    >>> def trial(n):
    ...     MemoryBudget(100).charge(n)  # a budget of 100 bytes, one byte per sample
    >>> found = find_max_batch_size(trial)
    >>> found.batch_size, found.trials
    (100, 14)
    >>> find_max_batch_size(trial, margin=0.1).batch_size
    90
    """
    if low < 1:
        raise ValueError(f"low must be at least 1, got {low}")
    if high is not None and high < low:
        raise ValueError(f"high ({high}) must be at least low ({low})")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    history: list[Trial] = []
    good, bad, size = 0, None, low  # largest size known to fit; smallest known not to fit
    while bad is None and (high is None or good < high):  # grow by doubling
        size = size if high is None else min(size, high)
        if _attempt(trial, size, history):
            good, size = size, size * 2
        else:
            bad = size
    return _bisect(trial, good, bad, history, margin)


def _bisect(
    trial: Callable[[int], Any],
    good: int,
    bad: int | None,
    history: list[Trial],
    margin: float,
    *,
    predicted: int | None = None,
) -> MaxBatchSize:
    """Bisect between the largest size that fitted and the smallest that did not
    (``None``: the search was capped)."""
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        if _attempt(trial, middle, history):
            good = middle
        else:
            bad = middle
    found = good if margin == 0 else max(1 if good else 0, math.floor(good * (1 - margin)))
    return MaxBatchSize(found, good, len(history), history, bad is None, predicted)


# ----------------------------------------------------------- predict, then confirm


@progress.tracked("largest batch size", unit="trial")
def predict_max_batch_size(
    trial: Callable[[int], Any],
    memory_of: Callable[[int], int],
    available_bytes: int,
    *,
    probes: tuple[int, int] = (2, 4),
    low: int = 1,
    high: int | None = None,
    margin: float = 0.0,
) -> MaxBatchSize:
    """Predict the largest batch from measured memory, then confirm it with a few trials.

    ``memory_of(n)`` (the peak bytes of a step, :meth:`TrainTrial.peak_bytes`) at the two
    ``probes`` gives a line; where it fills ``available_bytes`` is the prediction, which
    galloping trials (+1, +2, +4... or -1, -2, -4...) and bisection confirm: 4 or 5 calls
    when memory is linear (cuDNN's per-shape workspaces make a GPU's line bumpy).

    >>> limit = lambda n: 1000 + 300 * n           # bytes a step at batch n needs
    >>> def trial(n):
    ...     MemoryBudget(100_000).charge(limit(n))
    >>> found = predict_max_batch_size(trial, limit, 100_000)
    >>> found.batch_size, found.predicted, found.trials
    (330, 330, 4)
    """
    small, large = sorted(probes)
    if small < 1 or large <= small:
        raise ValueError(f"probes must be two different sizes >= 1, got {probes}")
    history: list[Trial] = []
    measured: list[int] = []
    for size in (small, large):
        start = time.perf_counter()
        message = _out_of_memory(lambda: measured.append(memory_of(size)))  # noqa: B023 (runs now)
        history.append(Trial(size, message is None, time.perf_counter() - start, message))
        progress.tick()
        if message is not None:  # even the probes do not fit
            below = max(1, size - 1)
            search = find_max_batch_size(trial, low=min(low, below), high=below, margin=margin)
            return _after(history, search)
    per_sample = (measured[1] - measured[0]) / (large - small)
    if per_sample <= 0:  # memory does not grow with the batch: nothing to extrapolate
        search = find_max_batch_size(trial, low=max(low, large), high=high, margin=margin)
        return _after(history, search)
    fixed = measured[0] - per_sample * small
    predicted = max(low, math.floor((available_bytes - fixed) / per_sample))
    predicted = predicted if high is None else min(predicted, high)
    good, bad = 0, None  # trust only trials: the probes may have run differently
    if _attempt(trial, predicted, history):
        good, step = predicted, 1
        while high is None or good < high:  # gallop upwards until a trial fails
            size = good + step if high is None else min(good + step, high)
            if _attempt(trial, size, history):
                good, step = size, step * 2
            else:
                bad = size
                break
    else:
        bad, step = predicted, 1
        while bad - step > good:  # gallop downwards until a trial fits
            size = bad - step
            if _attempt(trial, size, history):
                good = size
                break
            bad, step = size, step * 2
    return _bisect(trial, good, bad, history, margin, predicted=predicted)


def usable_cuda_bytes(device: torch.device | str) -> int:
    """Bytes a step on a CUDA ``device`` can still use: free device memory plus the
    blocks PyTorch's caching allocator holds but does not use."""
    device = torch.device(device)
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + cached)


@dataclass
class TrainTrial:
    """One :class:`~course_utils.training.TrainStep` of a course model (built on first
    use) on a random CIFAR-shaped batch of the given size. ``budget_bytes``: a simulated
    :class:`~course_utils.oom.MemoryBudget` on what :meth:`peak_bytes` measures (on the CPU
    failing mid-forward, as an allocator would).

    >>> trial = TrainTrial("mlp", budget_bytes=2**24)
    >>> trial(1) is None, trial.last_peak_bytes > 0
    (True, True)
    >>> trial.peak_bytes(1) == trial.last_peak_bytes, trial.min_batch_size
    (True, 1)
    """

    model_name: str = "small_cnn"
    device: str = "cpu"
    _: KW_ONLY
    budget_bytes: int | None = None
    image_size: int = 32
    num_classes: int = 10
    precision: str = "fp32"
    model_kwargs: dict[str, Any] | None = None
    last_peak_bytes: int = field(default=0, init=False)  # of the last step that fitted
    _step: TrainStep | None = field(default=None, init=False, repr=False)

    def step(self) -> TrainStep:
        if self._step is None:
            torch.manual_seed(0)
            kwargs = self.model_kwargs or {}
            model = build_model(self.model_name, num_classes=self.num_classes, **kwargs)
            self._step = TrainStep(model, self.device, TrainConfig(precision=self.precision))
        return self._step

    @property
    def min_batch_size(self) -> int:
        """2 when the model has BatchNorm (training on one sample raises ``ValueError``
        where a layer sees a 1 x 1 image), else 1: where batch-size searches start."""
        norms = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
        return 2 if any(isinstance(m, norms) for m in self.step().model.modules()) else 1

    def peak_bytes(self, batch_size: int) -> int:
        """One step's memory at ``batch_size``, as the budget check measures it: on a GPU
        the allocator peak after a warm-up step; on the CPU the bytes saved for backward."""
        step = self.step()

        def run() -> None:
            step(self.batch(batch_size))

        if torch.device(self.device).type != "cuda":
            return saved_tensor_bytes(run)[1]
        return peak_memory(run, self.device, warmup=1).peak_bytes

    def batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (batch_size, 3, self.image_size, self.image_size)
        inputs = torch.randn(shape, device=self.device)
        return inputs, torch.randint(0, self.num_classes, (batch_size,), device=self.device)

    def __call__(self, batch_size: int) -> None:
        step = self.step()
        if self.budget_bytes is None:
            step(self.batch(batch_size))
            return
        budget = MemoryBudget(self.budget_bytes)
        if torch.device(self.device).type != "cuda":  # fail mid-forward, as an allocator does
            _, peak = saved_tensor_bytes(lambda: step(self.batch(batch_size)), budget=budget)
        else:
            peak = self.peak_bytes(batch_size)
            budget.charge(peak)
        self.last_peak_bytes = peak


@dataclass(frozen=True)
class SweepRow:
    """One batch size of :func:`batch_size_sweep`."""

    batch_size: int
    step_s: float  # median seconds per step (0 when out of memory)
    samples_per_s: float
    peak_bytes: int
    out_of_memory: bool = False
    error: str | None = None
    cpu_step_s: float = 0.0  # this process's CPU seconds per step (median of the timed calls)

    @property
    def cpu_samples_per_s(self) -> float:
        """Samples per CPU-second of this process (on a shared CPU, wall time also counts
        other processes' turns)."""
        return self.batch_size / self.cpu_step_s if self.cpu_step_s > 0 else 0.0


@dataclass
class BatchSweep:
    """The result of :func:`batch_size_sweep`: one row per batch size tried."""

    rows: list[SweepRow]
    memory_method: str
    device: str
    knee_fraction: float = 0.9

    @property
    def fitted(self) -> list[SweepRow]:
        return [row for row in self.rows if not row.out_of_memory]

    @property
    def best(self) -> SweepRow | None:
        """The row with the highest throughput."""
        return max(self.fitted, key=lambda row: row.samples_per_s, default=None)

    def knee(self, fraction: float | None = None) -> SweepRow | None:
        """The smallest batch size whose throughput reaches ``fraction`` (default
        ``knee_fraction``, 0.9) of the best measured throughput."""
        best = self.best
        if best is None:
            return None
        target = (self.knee_fraction if fraction is None else fraction) * best.samples_per_s
        return min(
            (row for row in self.fitted if row.samples_per_s >= target),
            key=lambda row: row.batch_size,
        )

    def __str__(self) -> str:
        lines = [f"{'batch':>6} {'step ms':>9} {'samples/s':>10} {'peak MiB':>9}"]
        for row in self.rows:
            if row.out_of_memory:
                lines.append(f"{row.batch_size:>6} {'out of memory':>30}")
            else:
                lines.append(
                    f"{row.batch_size:>6} {row.step_s * 1e3:>9.2f} {row.samples_per_s:>10.1f} "
                    f"{row.peak_bytes / MIB:>9.2f}"
                )
        knee = self.knee()
        if knee is not None:
            lines.append(
                f"knee: batch {knee.batch_size} (smallest reaching "
                f"{self.knee_fraction:.0%} of the best throughput); memory: {self.memory_method}"
            )
        return "\n".join(lines)

    def plot(self, title: str = "") -> Figure:
        """Throughput and peak memory against batch size (log2 axis), knee marked."""
        rows = self.fitted
        sizes = [row.batch_size for row in rows]
        figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
        left.plot(sizes, [row.samples_per_s for row in rows], "o-")
        left.set_ylabel("throughput (samples/s)")
        right.plot(sizes, [row.peak_bytes / MIB for row in rows], "s-", color="tab:orange")
        right.set_ylabel("peak memory (MiB)")
        right.set_title(self.memory_method, fontsize=8)
        knee = self.knee()
        for axis in (left, right):
            axis.set_xscale("log", base=2)
            axis.set_xlabel("batch size")
            axis.grid(alpha=0.3)
            if knee is not None:
                axis.axvline(knee.batch_size, color="gray", linestyle="--", label="knee")
        if knee is not None:
            left.legend([f"measured ({self.device})", f"knee: {knee.batch_size}"])
        for row in self.rows:
            if row.out_of_memory:
                right.axvline(row.batch_size, color="red", linestyle=":", label="out of memory")
        figure.suptitle(title or f"batch-size sweep on {self.device}")
        figure.tight_layout()
        return figure


def _cpu_timed(run: Callable[[], Any], cpu_steps: list[float]) -> None:
    """Call ``run()`` and append the CPU seconds this process spent in it to ``cpu_steps``."""
    start = time.process_time()
    run()
    cpu_steps.append(time.process_time() - start)


def batch_size_sweep(
    trial: Callable[[int], Any],
    sizes: Sequence[int] | Iterable[int] | None = None,
    device: torch.device | str = "cpu",
    *,
    repeats: int = 3,
    warmup: int = 1,
    budget_bytes: int | None = None,
    knee_fraction: float = 0.9,
) -> BatchSweep:
    """Time ``trial(batch_size)`` (``repeats`` calls after ``warmup``) and measure its peak
    memory after a warm-up call, for each size in ``sizes`` (default: the powers of two up
    to 4096), stopping at the first out-of-memory error. ``budget_bytes``: a simulated
    :class:`~course_utils.oom.MemoryBudget` on the peak.

    >>> sweep = batch_size_sweep(lambda n: torch.ones(n, 8).sum(), [1, 2, 4], repeats=2)
    >>> [row.batch_size for row in sweep.rows], sweep.knee() is not None
    ([1, 2, 4], True)
    """
    device = torch.device(device)
    rows: list[SweepRow] = []
    method = ""
    sizes = [2**k for k in range(13)] if sizes is None else sizes
    for size in progress.track(sizes, "batch-size sweep", unit="size"):
        failed: SweepRow | None = None
        allocated_before = allocated_cuda_bytes()
        try:
            run = functools.partial(trial, size)
            peak = peak_memory(run, device, warmup=1)
            method = peak.method
            if budget_bytes is not None:
                MemoryBudget(budget_bytes).charge(peak.peak_bytes)
            cpu_steps: list[float] = []  # this process's CPU seconds, call by call
            timing = benchmark(
                functools.partial(_cpu_timed, run, cpu_steps),
                device=device,
                warmup=warmup,
                repeats=repeats,
            )
            cpu_step_s = statistics.median(cpu_steps[warmup:])  # a one-off spike ignored
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            message = error_summary(error)
            failed = SweepRow(size, 0.0, 0.0, 0, out_of_memory=True, error=message)
        if failed is not None:  # outside ``except``, where the traceback held its tensors
            rows.append(failed)
            release_after_out_of_memory(allocated_before)
            break
        step_s = timing.median_s
        rows.append(SweepRow(size, step_s, size / step_s, peak.peak_bytes, cpu_step_s=cpu_step_s))
    return BatchSweep(rows, method, str(device), knee_fraction)


# ------------------------------------------------- recovering from out of memory


@dataclass(frozen=True)
class OomRecovery:
    """The size that ran, the out-of-memory message (``None``: the requested size fitted)
    and the :func:`find_max_batch_size` search that followed it."""

    requested: int
    batch_size: int
    error: str | None
    search: MaxBatchSize | None = None

    @property
    def recovered(self) -> bool:
        return self.error is not None


def run_with_oom_recovery(
    step: Callable[[int], Any], batch_size: int, *, margin: float = 0.0, low: int = 1
) -> OomRecovery:
    """Run ``step(batch_size)``; on out-of-memory, free memory (outside ``except``) and
    :func:`find_max_batch_size` below that size. Other errors are raised again;
    :class:`MemoryError` if not even ``low`` fits (``low=2`` for BatchNorm)."""
    message = _out_of_memory(functools.partial(step, batch_size))
    if message is None:
        return OomRecovery(batch_size, batch_size, None)
    if batch_size <= low:
        raise MemoryError(f"not even a batch of {low} fits: {message}")
    search = find_max_batch_size(step, low=low, high=batch_size - 1, margin=margin)
    if search.batch_size == 0:
        raise MemoryError(f"not even a batch of {low} fits: {message}")
    return OomRecovery(batch_size, search.batch_size, message, search)
