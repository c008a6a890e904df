"""Where a training step's time goes: the data wait (``next`` on the DataLoader), the copy
to the device, and the compute. Overhead: under 2% of a step (bench_profiler_overhead)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from course_utils.device import to_device
from course_utils.timing import format_seconds, synchronizer

#: What torch.profiler's tracer (kineto) prints at or above: 6 silences it.
KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"


def quiet_kineto_without_gpu() -> bool:
    """Silence ``torch.profiler``'s tracer (kineto) on a machine without a usable NVIDIA
    driver, unless ``KINETO_LOG_LEVEL`` is set: when a profile starts, a CUDA build's
    kineto probes CUDA and prints a red ``ERROR ... gpuGetDeviceCount failed with code 35``
    and two ``USDT ... profiler_start/stop`` lines, harmless and nothing to do with the
    learner's code. With a GPU it is left as it is (its messages may matter there). Kineto
    reads the variable when a profile starts, so this works after ``import torch``; it
    asks NVML, never CUDA (fork-safe). Returns whether it silenced kineto."""
    from course_utils.nvml import nvml_status  # lazy: loads NVML

    if KINETO_LOG_LEVEL in os.environ:
        return False
    if torch.backends.cuda.is_built() and nvml_status() == "ok":
        return False
    os.environ[KINETO_LOG_LEVEL] = "6"
    return True


quiet_kineto_without_gpu()


@dataclass
class LoopProfile:
    """What :class:`StepProfiler` measured over the steps after the warm-up (seconds).
    ``cpu_s``: this process's CPU time (all threads; with ``num_workers=0`` it includes
    decoding, on a GPU it counts spinning)."""

    num_steps: int = 0
    samples: int = 0
    data_s: float = 0.0
    copy_s: float = 0.0
    compute_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    synchronized: bool = True
    device: str = "cpu"

    @property
    def step_s(self) -> float:
        return self.wall_s / max(self.num_steps, 1)

    @property
    def cpu_per_step_s(self) -> float:
        return self.cpu_s / max(self.num_steps, 1)

    def _fraction(self, seconds: float) -> float:
        return seconds / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def data_wait_fraction(self) -> float:
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

    def __str__(self) -> str:
        if not self.num_steps:
            return "no steps measured (the loader ended during the warm-up?)"
        sync = "synchronized" if self.synchronized else "NOT synchronized: copy/compute = launches"
        phases = "  ".join(
            f"{name} {format_seconds(seconds / self.num_steps)} ({self._fraction(seconds):.0%})"
            for name, seconds in (
                ("data wait", self.data_s),
                ("copy", self.copy_s),
                ("compute", self.compute_s),
            )
        )
        return (
            f"{self.num_steps} steps, {format_seconds(self.step_s)} per step "
            f"({self.samples_per_s:.1f} samples/s, {sync}, {self.device}):\n"
            f"  {phases}\n  device starved {self.starved_fraction:.0%} of the time"
        )


def batch_samples(batch: Any) -> int:
    """The samples in a batch: the length of its labels (``batch[1]``), else of its first."""
    if isinstance(batch, (list, tuple)):
        if len(batch) > 1 and hasattr(batch[1], "__len__"):
            return len(batch[1])
        return batch_samples(batch[0]) if batch else 0
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    return 0


class StepProfiler:
    """Times the data wait, copy and compute of each step after the first ``warmup``. It
    synchronizes the device after the copy and the compute (at the cost of the CPU/GPU
    overlap); with ``synchronize=False`` they measure only the launches. ``sync`` replaces
    the device's synchronize function (tests use it)."""

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        synchronize: bool = True,
        warmup: int = 1,
        sync: Callable[[], None] | None = None,
    ) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be at least 0, got {warmup}")
        self.device = torch.device(device)
        self.synchronize = synchronize
        self.warmup = warmup
        self._sync = sync or synchronizer(self.device)
        self._profile = LoopProfile(synchronized=synchronize, device=str(self.device))

    def report(self) -> LoopProfile:
        return self._profile

    def iterate(self, loader: Iterable[Any], max_steps: int | None = None) -> Iterator[Any]:
        """Yield each batch of ``loader`` moved to the device (for at most ``max_steps``
        steps, warm-up included); compute is the time until the next batch is asked for."""
        profile = self._profile = LoopProfile(
            synchronized=self.synchronize, device=str(self.device)
        )
        sync, clock, cpu_clock = self._sync, time.perf_counter, time.process_time
        sync()  # work queued before the loop must not be charged to the first step
        iterator = iter(loader)
        done = 0
        measured_start, cpu_start = clock(), cpu_clock()
        try:
            while max_steps is None or done < max_steps:
                if done == self.warmup:  # the first measured step starts here
                    sync()
                    measured_start, cpu_start = clock(), cpu_clock()
                start = clock()
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                fetched = clock()
                batch = to_device(batch, self.device)
                if self.synchronize:
                    sync()
                copied = clock()
                try:
                    yield batch
                finally:  # also runs when the caller leaves the loop early (break)
                    if self.synchronize:
                        sync()
                    end = clock()
                    done += 1
                    if done > self.warmup:
                        profile.num_steps += 1
                        profile.samples += batch_samples(batch)
                        profile.data_s += fetched - start
                        profile.copy_s += copied - fetched
                        profile.compute_s += end - copied
                        profile.wall_s = end - measured_start
                        profile.cpu_s = cpu_clock() - cpu_start
        finally:
            if not self.synchronize and done > self.warmup:
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
) -> LoopProfile:
    """Run ``compute(batch)`` on each batch of ``loader`` moved to ``device``; profile it.

    >>> profile = profile_loop([torch.ones(2, 3)] * 4, lambda batch: batch * 2, warmup=1)
    >>> profile.num_steps, profile.samples
    (3, 6)
    """
    profiler = StepProfiler(device, synchronize=synchronize, warmup=warmup)
    for batch in profiler.iterate(loader, max_steps=max_steps):
        compute(batch)
    return profiler.report()
