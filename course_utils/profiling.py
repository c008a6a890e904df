"""Where a training step's time goes: waiting for data, copying it, computing.

A training loop repeats three phases; the device only does useful work in the last one:

1. **data wait**: ``next(iterator)`` on the DataLoader. If the workers have a batch
   ready this is almost free; if the input pipeline is slower than the step, the loop
   (and the device) waits here.
2. **host-to-device copy**: moving the batch to the device (``to_device``).
3. **compute**: the training step itself (forward, backward, optimizer step).

:class:`StepProfiler` times each phase of each step. CUDA work is asynchronous, so with
``synchronize=True`` (the default) it waits for the device at the end of the copy and at
the end of the compute: each phase is then charged with the time it really took. That
synchronization has a cost (the CPU can no longer queue the next step while the GPU
works); ``synchronize=False`` turns it off, so you can see that cost, but then the copy
and compute times measure only the *launches* and the device's work shows up wherever
the CPU next waits for it. On the CPU everything is synchronous and both agree.

The **starved fraction** is the share of the loop's wall time in which the device had
nothing to compute: the data wait plus the copy (when synchronized, the copy does not
overlap compute). A starved fraction near 0 means the input pipeline keeps up; near 1
means the device mostly waits, and a faster model or GPU will not help.

Use it as an iterator around any loop::

    profiler = StepProfiler(device)
    for batch in profiler.iterate(loader):   # batch is already on the device
        step(batch)
    print(profiler.report())

or in one call, ``profile_loop(loader, step, device, max_steps=50)``. Notebook 03 uses it
to diagnose a slow input pipeline; ``benchmarks/bench_profiler_overhead.py`` measures
its overhead (under 2% of the step time).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from course_utils.device import to_device
from course_utils.timing import format_seconds, synchronizer


@dataclass(frozen=True)
class StepTimes:
    """The three phases of one step, in seconds, and how many samples it had."""

    data_s: float
    copy_s: float
    compute_s: float
    samples: int

    @property
    def total_s(self) -> float:
        return self.data_s + self.copy_s + self.compute_s


@dataclass
class LoopProfile:
    """What :class:`StepProfiler` measured over the steps after the warm-up.

    ``wall_s`` is the wall-clock time of those steps, from the start of the first one's
    data wait to the end of the last one's compute (followed by a device
    synchronization even when ``synchronized`` is False, so it is always honest).
    ``warmup_s`` is the time of the excluded warm-up steps (worker start-up shows there).
    ``cpu_s`` is this process's CPU time (all its threads, ``time.process_time``) over
    the same steps: with ``num_workers=0`` it includes decoding the data, with workers
    that work moves to other processes; on a GPU it also counts spinning while waiting.
    """

    steps: list[StepTimes] = field(default_factory=list)
    wall_s: float = 0.0
    warmup_steps: int = 0
    warmup_s: float = 0.0
    synchronized: bool = True
    device: str = "cpu"
    cpu_s: float = 0.0

    # -- totals ---------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def samples(self) -> int:
        return sum(step.samples for step in self.steps)

    @property
    def data_s(self) -> float:
        return sum(step.data_s for step in self.steps)

    @property
    def copy_s(self) -> float:
        return sum(step.copy_s for step in self.steps)

    @property
    def compute_s(self) -> float:
        return sum(step.compute_s for step in self.steps)

    # -- per step and fractions -------------------------------------------------------
    @property
    def step_s(self) -> float:
        """Mean wall-clock seconds per step."""
        return self.wall_s / self.num_steps if self.steps else 0.0

    def _fraction(self, seconds: float) -> float:
        return seconds / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_per_step_s(self) -> float:
        """Mean CPU seconds of this process per measured step (see ``cpu_s``)."""
        return self.cpu_s / self.num_steps if self.steps else 0.0

    @property
    def data_wait_fraction(self) -> float:
        """Share of the wall time spent waiting for the DataLoader."""
        return self._fraction(self.data_s)

    @property
    def copy_fraction(self) -> float:
        return self._fraction(self.copy_s)

    @property
    def compute_fraction(self) -> float:
        return self._fraction(self.compute_s)

    @property
    def starved_fraction(self) -> float:
        """Share of the wall time the device had nothing to compute (data wait + copy)."""
        return self._fraction(self.data_s + self.copy_s)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    def as_row(self) -> dict[str, float | int | str | bool]:
        """The key numbers as one table row (for comparing several pipelines)."""
        return {
            "steps": self.num_steps,
            "step_ms": self.step_s * 1e3,
            "data_ms": self.data_s / max(self.num_steps, 1) * 1e3,
            "copy_ms": self.copy_s / max(self.num_steps, 1) * 1e3,
            "compute_ms": self.compute_s / max(self.num_steps, 1) * 1e3,
            "data_wait_fraction": self.data_wait_fraction,
            "starved_fraction": self.starved_fraction,
            "samples_per_s": self.samples_per_s,
            "synchronized": self.synchronized,
            "device": self.device,
        }

    def __str__(self) -> str:
        if not self.steps:
            return "no steps measured (the loader ended during the warm-up?)"
        per = max(self.num_steps, 1)
        sync = "synchronized" if self.synchronized else "NOT synchronized: copy/compute = launches"
        return (
            f"{self.num_steps} steps, {format_seconds(self.step_s)} per step "
            f"({self.samples_per_s:.1f} samples/s, {sync}, {self.device}):\n"
            f"  data wait {format_seconds(self.data_s / per)} ({self.data_wait_fraction:.0%})"
            f"  copy {format_seconds(self.copy_s / per)} ({self.copy_fraction:.0%})"
            f"  compute {format_seconds(self.compute_s / per)} ({self.compute_fraction:.0%})\n"
            f"  device starved {self.starved_fraction:.0%} of the time"
        )


def batch_samples(batch: Any) -> int:
    """How many samples a batch holds: the length of its labels (``batch[1]``) or the
    first dimension of its first tensor.

    >>> batch_samples((torch.zeros(8, 3), torch.zeros(8)))
    8
    """
    if isinstance(batch, (list, tuple)) and len(batch) > 1 and hasattr(batch[1], "__len__"):
        return len(batch[1])
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (list, tuple)) and batch:
        return batch_samples(batch[0])
    return 0


class StepProfiler:
    """Times the data wait, copy and compute of each step of a loop (see the module doc).

    ``warmup`` first steps are timed separately and left out of the report.
    ``non_blocking`` is passed to :func:`~course_utils.device.to_device` (``None``:
    asynchronous exactly when the batch is in pinned memory and goes to a GPU).
    ``sync`` replaces the device's synchronize function (tests use it).

    >>> profiler = StepProfiler("cpu", warmup=0)
    >>> for batch in profiler.iterate([torch.ones(4, 2)] * 3):
    ...     _ = batch.sum()
    >>> profiler.report().num_steps, profiler.report().samples
    (3, 12)
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        synchronize: bool = True,
        warmup: int = 1,
        non_blocking: bool | None = None,
        sync: Callable[[], None] | None = None,
    ) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be at least 0, got {warmup}")
        self.device = torch.device(device)
        self.synchronize = synchronize
        self.warmup = warmup
        self.non_blocking = non_blocking
        self._sync = sync or synchronizer(self.device)
        self._profile = LoopProfile(synchronized=synchronize, device=str(self.device))

    def report(self) -> LoopProfile:
        """The profile of the steps measured so far."""
        return self._profile

    def iterate(self, loader: Iterable[Any], max_steps: int | None = None) -> Iterator[Any]:
        """Yield each batch of ``loader`` moved to the device, timing the three phases.

        The compute phase is the time between handing out a batch and being asked for
        the next one (the body of your ``for`` loop). Stops after ``max_steps`` steps
        (warm-up included) when given.
        """
        profile = self._profile = LoopProfile(
            synchronized=self.synchronize, device=str(self.device)
        )
        sync, clock, synchronize = self._sync, time.perf_counter, self.synchronize
        cpu_clock = time.process_time
        sync()  # work queued before the loop must not be charged to the first step
        iterator = iter(loader)
        done = 0
        measured_start = warm_start = clock()
        cpu_start = cpu_clock()
        try:
            while max_steps is None or done < max_steps:
                if done == self.warmup:  # the first measured step starts here
                    sync()
                    measured_start, cpu_start = clock(), cpu_clock()
                    profile.warmup_s = measured_start - warm_start
                start = clock()
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                fetched = clock()
                batch = to_device(batch, self.device, self.non_blocking)
                if synchronize:
                    sync()
                copied = clock()
                try:
                    yield batch
                finally:  # also runs when the caller leaves the loop early (break)
                    if synchronize:
                        sync()
                    end = clock()
                    done += 1
                    if done > self.warmup:
                        samples = batch_samples(batch)
                        profile.steps.append(
                            StepTimes(fetched - start, copied - fetched, end - copied, samples)
                        )
                        profile.wall_s = end - measured_start
                        profile.cpu_s = cpu_clock() - cpu_start
                    else:
                        profile.warmup_steps = done
        finally:
            if not synchronize and done > self.warmup:
                sync()  # the device's queued work belongs to the wall time
                profile.wall_s = clock() - measured_start


def profile_loop(
    loader: Iterable[Any],
    compute: Callable[[Any], Any],
    device: torch.device | str = "cpu",
    *,
    max_steps: int | None = None,
    warmup: int = 1,
    synchronize: bool = True,
    non_blocking: bool | None = None,
) -> LoopProfile:
    """Run ``compute(batch)`` on each batch of ``loader`` (moved to ``device``) and return
    the :class:`LoopProfile`. ``compute`` can be a :class:`~course_utils.training.TrainStep`.

    >>> profile = profile_loop([torch.ones(2, 3)] * 4, lambda batch: batch * 2, warmup=1)
    >>> profile.num_steps, 0.0 <= profile.starved_fraction <= 1.0
    (3, True)
    """
    profiler = StepProfiler(
        device, synchronize=synchronize, warmup=warmup, non_blocking=non_blocking
    )
    for batch in profiler.iterate(loader, max_steps=max_steps):
        compute(batch)
    return profiler.report()
