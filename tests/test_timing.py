"""benchmark(): synchronizes around the clock, excludes warm-up, reports median and IQR."""

from __future__ import annotations

import time

import pytest
import torch

from course_utils import timing
from course_utils.timing import SimulatedGPU, benchmark


def test_device_is_synchronized_before_and_after_each_timed_run():
    events = []
    benchmark(lambda: events.append("run"), warmup=1, repeats=2, sync=lambda: events.append("sync"))
    # warm-up, sync; then per repeat: sync, run, sync; then a final sync.
    assert events == ["run", "sync", "sync", "run", "sync", "sync", "run", "sync", "sync"]


def test_unsynchronized_timing_does_not_wait_inside_the_loop():
    events = []
    benchmark(
        lambda: events.append("run"),
        warmup=0,
        repeats=2,
        synchronize=False,
        sync=lambda: events.append("sync"),
    )
    assert events == ["sync", "run", "run", "sync"]  # only outside the timed region


def test_asynchronous_work_is_measured_only_with_synchronization():
    gpu = SimulatedGPU()
    synced = benchmark(lambda: gpu.launch(0.02), sync=gpu.synchronize, warmup=1, repeats=3)
    naive = benchmark(
        lambda: gpu.launch(0.02), sync=gpu.synchronize, warmup=1, repeats=3, synchronize=False
    )
    assert synced.median_s >= 0.02
    assert naive.median_s < 0.5 * synced.median_s  # the launch alone is far shorter
    assert gpu.completed == 8  # all work done, none left queued


def test_warm_up_runs_are_not_counted():
    calls = []

    def slow_first_calls():
        calls.append(None)
        time.sleep(0.3 if len(calls) <= 2 else 0.0)

    result = benchmark(slow_first_calls, warmup=2, repeats=5)
    assert len(calls) == 7 and len(result.times_s) == 5
    assert max(result.times_s) < 0.15  # the two slow calls were the warm-up


def test_number_divides_the_time_per_call():
    result = benchmark(lambda: time.sleep(0.002), warmup=0, repeats=3, number=5)
    assert 0.0015 < result.median_s < 0.05


def test_median_iqr_and_summary():
    result = timing.Timing([1.0, 2.0, 3.0, 4.0, 100.0], warmup=2, synchronized=True, device="cpu")
    assert result.median_s == 3.0 and result.min_s == 1.0
    assert result.iqr_s == pytest.approx(2.0)  # quartiles 2.0 and 4.0: the outlier is ignored
    assert "3 s median" in str(result) and "2 warm-up runs excluded" in str(result)
    assert timing.Timing([5.0], 0, True, "cpu").iqr_s == 0.0


@pytest.mark.parametrize(("seconds", "text"), [(2.5, "2.5 s"), (0.0042, "4.2 ms"), (3e-6, "3 µs")])
def test_format_seconds(seconds, text):
    assert timing.format_seconds(seconds) == text


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"warmup": -1}, {"number": 0}])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        benchmark(lambda: None, **kwargs)


def test_compare_matmul_agrees_with_numpy():
    rows = timing.compare_matmul([16, 64], ["cpu"], warmup=0, repeats=2)
    assert [(row["library"], row["n"]) for row in rows] == [
        ("numpy", 16),
        ("torch", 16),
        ("numpy", 64),
        ("torch", 64),
    ]
    assert all(row["median_ms"] > 0 for row in rows)
    for row in rows:  # 2 n^3 FLOPs per matmul
        assert row["gflops"] == pytest.approx(2 * row["n"] ** 3 / row["typical_ms"] / 1e6)
    assert max(row["max_abs_diff"] for row in rows) < 1e-3


@pytest.mark.gpu
def test_gpu_matmul_needs_synchronization_to_be_timed():
    a = torch.randn(4096, 4096, device="cuda")
    synced = benchmark(lambda: a @ a, device="cuda", warmup=2, repeats=5)
    naive = benchmark(lambda: a @ a, device="cuda", warmup=2, repeats=5, synchronize=False)
    assert naive.median_s < synced.median_s


def test_time_in_turns_alternates_and_synchronizes_around_each_call():
    events = []
    result = timing.time_in_turns(
        {"a": lambda: events.append("a"), "b": lambda: events.append("b")},
        warmup=1,
        rounds=2,
        sync=lambda: events.append("sync"),
    )
    assert events == ["a", "b"] + ["sync", "a", "sync", "sync", "b", "sync"] * 2
    assert [len(t.times_s) for t in result.values()] == [2, 2]
    assert result["a"].warmup == 1 and result["a"].synchronized


def test_time_in_turns_charges_each_function_its_own_time():
    result = timing.time_in_turns(
        {"fast": lambda: None, "slow": lambda: time.sleep(0.02)}, warmup=0, rounds=3
    )
    assert result["slow"].median_s >= 0.02 > result["fast"].median_s


@pytest.mark.parametrize("kwargs", [{"rounds": 0}, {"warmup": -1}])
def test_time_in_turns_refuses_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        timing.time_in_turns({"a": lambda: None}, **kwargs)
