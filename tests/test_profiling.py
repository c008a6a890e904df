"""StepProfiler: the data-wait fraction of a loop with known phase durations, warm-up,
early exit, and what synchronizing (or not) does to an asynchronous device."""

from __future__ import annotations

import time

import pytest
import torch

from course_utils.profiling import StepProfiler, profile_loop
from course_utils.timing import SimulatedGPU


def _sleep(seconds: float) -> float:
    """Sleep; return how long it really took (on a busy machine, longer than asked)."""
    start = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - start


class SleepyLoader:
    """Yields ``batches`` batches of 4 samples, sleeping ``seconds`` before each one."""

    def __init__(self, batches: int, seconds: float) -> None:
        self.batches, self.seconds = batches, seconds
        self.slept: list[float] = []  # how long each sleep really took (a busy machine)

    def __iter__(self):
        for index in range(self.batches):
            self.slept.append(_sleep(self.seconds))
            yield torch.full((4, 2), float(index)), torch.zeros(4, dtype=torch.long)


@pytest.mark.parametrize(("data_s", "compute_s"), [(0.03, 0.01), (0.01, 0.03), (0.02, 0.02)])
def test_data_wait_fraction_matches_known_durations(data_s, compute_s):
    loader, computed = SleepyLoader(9, data_s), []
    profile = profile_loop(
        loader, lambda batch: computed.append(_sleep(compute_s)), "cpu", warmup=1
    )
    # against the durations the sleeps really took (the first step is warm-up): a busy
    # machine stretches them, and the profiler must see what happened, not what was asked
    data, compute = sum(loader.slept[1:]), sum(computed[1:])
    expected = data / (data + compute)
    assert profile.num_steps == 8 and profile.samples == 32
    assert profile.data_wait_fraction == pytest.approx(expected, abs=0.1)
    assert profile.compute_fraction == pytest.approx(1 - expected, abs=0.1)
    assert profile.data_s == pytest.approx(data, rel=0.2)
    # the phases account for (almost) all of the wall time: little escapes the profiler
    assert profile.data_s + profile.copy_s + profile.compute_s <= profile.wall_s
    assert profile.data_s + profile.copy_s + profile.compute_s >= 0.9 * profile.wall_s
    assert profile.starved_fraction >= profile.data_wait_fraction


def test_warmup_steps_are_timed_apart_and_excluded():
    profiler = StepProfiler("cpu", warmup=2)
    for _ in profiler.iterate(SleepyLoader(5, 0.0)):
        pass
    profile = profiler.report()
    assert profile.num_steps == 3 and profile.samples == 12  # 5 steps, 2 of them warm-up


def test_leaving_the_loop_early_keeps_the_steps_measured_so_far():
    profiler = StepProfiler("cpu", warmup=0)
    for step, _ in enumerate(profiler.iterate(SleepyLoader(100, 0.0))):
        if step == 4:
            break
    assert profiler.report().num_steps == 5
    assert profile_loop(SleepyLoader(100, 0.0), lambda b: None, max_steps=6).num_steps == 5


def test_batches_come_out_moved_and_counted():
    seen = []
    profiler = StepProfiler("cpu", warmup=0)
    for inputs, targets in profiler.iterate(SleepyLoader(2, 0.0)):
        seen.append((inputs.device.type, len(targets)))
    assert seen == [("cpu", 4), ("cpu", 4)]
    # a batch without labels counts the first tensor's rows
    assert profile_loop([[torch.zeros(3, 1)]] * 2, lambda b: None, warmup=0).samples == 6


def test_synchronizing_charges_asynchronous_work_to_compute_and_costs_overlap():
    """On an asynchronous device (simulated), compute looks free without synchronization,
    and the data wait overlaps the device's work; synchronizing shows the truth but the
    loop gets slower because the overlap is lost."""
    gpu = SimulatedGPU()
    results = {}
    for synchronize in (True, False):
        profiler = StepProfiler("cpu", synchronize=synchronize, warmup=1, sync=gpu.synchronize)
        for _ in profiler.iterate(SleepyLoader(7, 0.02)):
            gpu.launch(0.03)  # queue 30 ms of "kernels" and return at once
        results[synchronize] = profiler.report()
    synced, unsynced = results[True], results[False]
    assert synced.compute_s / synced.num_steps == pytest.approx(0.03, abs=0.012)
    assert unsynced.compute_s / unsynced.num_steps < 0.005  # only the launches
    assert synced.data_wait_fraction == pytest.approx(0.4, abs=0.1)
    assert unsynced.step_s < synced.step_s  # the overlap that synchronizing removes
    assert gpu.completed == 14  # nothing was left queued


def test_report_text():
    profile = profile_loop(SleepyLoader(3, 0.0), lambda b: None, warmup=0)
    assert str(profile).startswith("3 steps") and "device starved" in str(profile)
    assert "no steps" in str(profile_loop([], lambda b: None))


def test_negative_warmup_is_refused():
    with pytest.raises(ValueError):
        StepProfiler("cpu", warmup=-1)


@pytest.mark.gpu
def test_on_a_gpu_synchronizing_charges_kernels_to_compute():
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)

    def compute(batch):
        for _ in range(8):
            batch[0].sum()  # the batch arrived on the device
            a @ a

    loader = [(torch.randn(64, 3, 32, 32).pin_memory(), torch.zeros(64)) for _ in range(6)]
    synced = profile_loop(loader, compute, device, synchronize=True)
    unsynced = profile_loop(loader, compute, device, synchronize=False)
    assert synced.compute_s > 2 * unsynced.compute_s  # unsynchronized: launches only
    assert synced.wall_s == pytest.approx(unsynced.wall_s, rel=0.5)  # same work either way
    assert synced.starved_fraction < 0.5


def test_cpu_time_counts_this_process_working_not_waiting():
    def busy(_batch):
        total = 0
        for i in range(200_000):
            total += i

    sleeping = profile_loop(SleepyLoader(4, 0.03), lambda b: None, warmup=1)
    working = profile_loop(SleepyLoader(4, 0.0), busy, warmup=1)
    # waiting (here: sleep, as for a worker's batch) costs wall time but almost no CPU time
    assert sleeping.wall_s >= 3 * 0.03 and sleeping.cpu_s < 0.5 * sleeping.wall_s
    assert working.cpu_s > 0 and working.cpu_per_step_s == working.cpu_s / 3
