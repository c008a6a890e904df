"""batch_size_sweep (throughput, step time, peak memory, knee, stop at out of memory),
predict_max_batch_size (exact answers in few calls) and TrainTrial's imposed budget."""

from __future__ import annotations

import math
import time

import matplotlib
import pytest
import torch

from course_utils.batch import (
    BatchSweep,
    SweepRow,
    TrainTrial,
    batch_size_sweep,
    find_max_batch_size,
    predict_max_batch_size,
)

matplotlib.use("Agg")


def saving_trial(limit: int | None = None, fixed_s: float = 0.004, per_sample_s: float = 0.0):
    """A step whose autograd saves 1 KiB per sample and that takes fixed + per-sample time."""

    def trial(batch_size: int) -> None:
        if limit is not None and batch_size > limit:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB")
        x = torch.ones(batch_size, 256, requires_grad=True)
        (x * x).sum().backward()
        time.sleep(fixed_s + per_sample_s * batch_size)

    return trial


def test_sweep_measures_memory_growing_linearly_and_stops_at_out_of_memory():
    sweep = batch_size_sweep(saving_trial(limit=20), [1, 4, 16, 64, 256], repeats=2)
    assert [row.batch_size for row in sweep.rows] == [1, 4, 16, 64]
    assert sweep.rows[-1].out_of_memory and "out of memory" in (sweep.rows[-1].error or "")
    assert [row.peak_bytes for row in sweep.fitted] == [1024, 4096, 16384]
    assert "saved for backward" in sweep.memory_method
    for row in sweep.fitted:
        assert row.samples_per_s == pytest.approx(row.batch_size / row.step_s)


def test_throughput_plateau_gives_the_knee():
    """Step time 4 ms + 0.1 ms per sample: throughput n / (4 + 0.1 n) ms rises, then
    plateaus towards 10 samples/ms; the knee is the smallest size reaching 90% of the best."""
    sizes = [4, 16, 64, 256]
    sweep = batch_size_sweep(saving_trial(per_sample_s=1e-4), sizes, repeats=2)
    best = max(row.samples_per_s for row in sweep.rows)
    assert sweep.best is not None and sweep.best.samples_per_s == best
    knee = sweep.knee()
    assert knee is not None
    assert knee.samples_per_s >= 0.9 * best
    assert all(
        row.samples_per_s < 0.9 * best for row in sweep.rows if row.batch_size < knee.batch_size
    )
    assert sweep.rows[0].samples_per_s < 0.5 * best  # batch 4 is far from the plateau
    assert sweep.knee(fraction=0.0) is sweep.rows[0]


def test_knee_definition_on_a_hand_made_table():
    rows = [SweepRow(n, 1.0, rate, n) for n, rate in [(1, 10), (2, 50), (4, 92), (8, 100)]]
    sweep = BatchSweep(rows, "test", "cpu")
    knee = sweep.knee()
    assert knee is not None and knee.batch_size == 4
    assert "knee: batch 4" in str(sweep)
    assert BatchSweep([], "test", "cpu").knee() is None


def test_a_budget_stops_the_sweep():
    sweep = batch_size_sweep(saving_trial(), [1, 2, 4, 8], repeats=1, budget_bytes=3000)
    assert [r.batch_size for r in sweep.rows] == [1, 2, 4] and sweep.rows[-1].out_of_memory


def test_plot_marks_the_knee():
    sweep = batch_size_sweep(saving_trial(limit=8), [1, 2, 4, 8, 16], repeats=1)
    figure = sweep.plot()
    left, right = figure.axes
    assert left.get_xscale() == "log" and "throughput" in left.get_ylabel()
    assert any(line.get_linestyle() == "--" for line in left.lines)  # the knee
    assert any(line.get_linestyle() == ":" for line in right.lines)  # out of memory


# --------------------------------------------------------------- predict, then confirm


def simulated(fixed: int, per_sample: int, budget: int, wobble: float = 0.0):
    """Memory fixed + per_sample * n (+ a superlinear wobble), and a trial that runs out
    above the budget."""

    def memory(n: int) -> int:
        return int(fixed + per_sample * n + wobble * n * math.log2(n + 1))

    def trial(n: int) -> None:
        if memory(n) > budget:
            raise RuntimeError("CUDA out of memory (simulated)")

    maximum = max(n for n in range(1, budget // per_sample + 2) if memory(n) <= budget)
    return trial, memory, maximum


@pytest.mark.parametrize("budget", [5_000, 12_345_678])
def test_prediction_is_exact_and_cheap_when_memory_is_linear(budget):
    trial, memory, maximum = simulated(3_000, 250, budget)
    found = predict_max_batch_size(trial, memory, budget)
    assert found.batch_size == maximum and found.predicted == maximum
    assert found.trials <= 4
    assert found.trials < find_max_batch_size(trial).trials or maximum < 8


@pytest.mark.parametrize("wobble", [5.0])
def test_prediction_is_confirmed_when_memory_is_not_linear(wobble):
    trial, memory, maximum = simulated(3_000, 250, 2_000_000, wobble=wobble)
    found = predict_max_batch_size(trial, memory, 2_000_000)
    assert found.batch_size == maximum and found.predicted != maximum
    assert found.trials <= 2 * math.ceil(math.log2(maximum)) + 2


def test_prediction_falls_back_when_even_the_probes_do_not_fit():
    trial, memory, maximum = simulated(0, 100, 350)

    def memory_raising(n):
        trial(n)
        return memory(n)

    found = predict_max_batch_size(trial, memory_raising, 350, probes=(2, 8))
    assert maximum == 3 and found.batch_size == 3
    with pytest.raises(ValueError):
        predict_max_batch_size(trial, memory, 350, probes=(4, 4))


# ------------------------------------------------------------------ a real model


def test_train_trial_budget_is_found_by_the_finder():
    """On a real model the finder returns the largest batch whose saved-for-backward
    bytes stay within the imposed budget."""
    measure = TrainTrial("mlp", model_kwargs={"hidden": 64})
    budget = (measure.peak_bytes(5) + measure.peak_bytes(6)) // 2
    trial = TrainTrial("mlp", budget_bytes=budget, model_kwargs={"hidden": 64})
    found = find_max_batch_size(trial, high=64)
    assert found.batch_size == 5
    with pytest.raises(RuntimeError, match="out of memory"):
        trial(6)
    trial(5)
    assert 0 < trial.last_peak_bytes <= budget
    assert trial.last_peak_bytes == measure.peak_bytes(5)  # the budget check measures alike


def test_warm_up_calls_keep_one_time_allocations_out_of_the_peak():
    """A function that saves an extra 1 KiB on its first call only (as a first CUDA step
    allocates workspaces once): the warm-up call takes it, the measured call does not."""
    from course_utils.footprint import peak_memory

    x = torch.ones(256, requires_grad=True)
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 1:
            (x.exp() * 2).sum()  # exp saves its output: 1 KiB, once
        return (x * x).sum()  # saves x: 1 KiB, every call

    assert peak_memory(step, "cpu").peak_bytes == 2048
    calls.clear()
    assert peak_memory(step, "cpu", warmup=1).peak_bytes == 1024 and len(calls) == 2
    with pytest.raises(ValueError):
        peak_memory(step, "cpu", warmup=-1)


def test_sweep_measures_the_peak_after_a_warm_up_call():
    calls = []

    def trial(n):
        calls.append(n)
        saving_trial(fixed_s=0.0)(n * (4 if len(calls) == 1 else 1))  # a bigger first call

    sweep = batch_size_sweep(trial, [2, 4], repeats=1, warmup=0)
    assert [row.peak_bytes for row in sweep.rows] == [2048, 4096]
    assert calls == [2, 2, 2, 4, 4, 4]  # warm-up, measured, timed


def test_saved_tensor_limit_raises_out_of_memory_mid_function():
    from course_utils.footprint import saved_tensor_bytes
    from course_utils.oom import MemoryBudget, is_out_of_memory

    x = torch.ones(256, requires_grad=True)
    reached = []

    def work():
        y = (x * x).exp()  # saves x (1 KiB), then exp's output (1 KiB)
        reached.append("exp")
        return (y * y).sum()  # saves y again: the same storage, not counted twice

    assert saved_tensor_bytes(work, budget=MemoryBudget(4096))[1] == 2048
    with pytest.raises(RuntimeError) as caught:
        saved_tensor_bytes(work, budget=MemoryBudget(1500))
    assert is_out_of_memory(caught.value) and reached == ["exp"]  # the first call only


@pytest.mark.gpu
def test_on_a_gpu_the_sweep_reports_the_allocator_peak():
    """Each size's peak is measured after a warm-up step at that size: the first step of
    a process also allocates the cuBLAS workspaces and builds the model, once (on an H200
    that made batch 8's peak three times batch 32's when it was measured first)."""
    trial = TrainTrial("small_cnn", "cuda")
    sweep = batch_size_sweep(trial, [8, 32, 128], "cuda", repeats=2)
    assert "CUDA" in sweep.memory_method
    peaks = [row.peak_bytes for row in sweep.fitted]
    assert peaks == sorted(peaks) and peaks[-1] > 2 * peaks[0]


@pytest.mark.gpu
def test_on_a_gpu_prediction_from_measured_memory_agrees_with_the_search():
    """The budget, the trial's check and ``memory_of`` all measure the same thing
    (``TrainTrial.peak_bytes``: the allocator peak of a step after a warm-up step).
    An MLP, because its memory is a straight line in the batch size: a conv net's is not
    on a GPU (cuDNN's per-shape workspaces; on an H200 small_cnn's step at 128 needed
    more than at 200), and then no search or prediction has a single boundary to find."""
    measure = TrainTrial("mlp", "cuda")
    budget = measure.peak_bytes(200)
    trial = TrainTrial("mlp", "cuda", budget_bytes=budget)
    searched = find_max_batch_size(trial, high=1024)
    assert abs(searched.batch_size - 200) <= 2 and not searched.capped
    assert any("CUDA out of memory" in (t.error or "") for t in searched.history)
    predicted = predict_max_batch_size(
        trial, measure.peak_bytes, budget, probes=(16, 32), high=1024
    )
    assert abs(predicted.batch_size - searched.batch_size) <= 2  # allocator rounding
    assert predicted.trials < searched.trials


@pytest.mark.gpu
def test_on_a_gpu_a_batchnorm_model_is_searched_from_its_smallest_batch():
    """ResNet-18 on 32 x 32 images ends with 1 x 1 feature maps: BatchNorm cannot train
    on a batch of 1 (ValueError, rightly not taken for out of memory)."""
    trial = TrainTrial("resnet18", "cuda")
    assert trial.min_batch_size == 2
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        find_max_batch_size(trial, high=4)
    found = find_max_batch_size(trial, low=trial.min_batch_size, high=8)
    assert found.batch_size == 8 and found.capped


def test_sweep_records_cpu_time_per_step_apart_from_waiting():
    """The saving trial sleeps (wall time, no CPU time) for 20 ms: CPU time stays far
    below the step time, and a busy trial's CPU time is counted."""
    sweep = batch_size_sweep(saving_trial(fixed_s=0.02), [1, 8], repeats=2)
    for row in sweep.fitted:
        assert 0 < row.cpu_step_s < 0.5 * row.step_s
        assert row.cpu_samples_per_s == pytest.approx(row.batch_size / row.cpu_step_s)

    def busy(batch_size):
        total = 0
        for i in range(20_000 * batch_size):
            total += i

    busy_sweep = batch_size_sweep(busy, [1, 8], repeats=2)
    one, eight = busy_sweep.fitted
    assert eight.cpu_step_s > 2 * one.cpu_step_s  # 8x the work, with room for noise


def test_sweep_cpu_time_ignores_one_disturbed_step():
    """One timed step of five spends 50x the CPU (a garbage collection, another thread of
    the process at work): the CPU figure is the median step's, not the mean's (the mean
    would rise about 10x and notebook 03's curve would bend wrongly)."""
    calls = {"count": 0, "disturbed": -1}

    def trial(batch_size: int) -> None:
        calls["count"] += 1
        total = 0
        for i in range(2_000 * (50 if calls["count"] == calls["disturbed"] else 1)):
            total += i

    (steady,) = batch_size_sweep(trial, [4], repeats=5).fitted
    calls["disturbed"], calls["count"] = calls["count"] - 2, 0  # the middle timed step
    (row,) = batch_size_sweep(trial, [4], repeats=5).fitted
    assert calls["count"] > calls["disturbed"]  # the disturbed step ran
    assert row.cpu_step_s < 3 * steady.cpu_step_s
