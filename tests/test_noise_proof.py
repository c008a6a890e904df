"""CPU figures that hold on a busy machine (issue 31, reviews 01-N1, 02-N1, 04-N9): NumPy
and torch timed with the same BLAS threads, one measured CPU peak per run, the fastest
step on a CPU, and a measure of how much of a core the process had."""

from __future__ import annotations

import time

import numpy as np
import torch

from course_utils import flops
from course_utils.timing import (
    BUSY_SHARE,
    Timing,
    compare_matmul,
    cpu_share,
    numpy_blas_threads,
    typical_s,
)


def test_numpy_runs_with_the_thread_count_it_is_given_and_gets_its_own_back():
    from course_utils.timing import _numpy_openblas

    openblas = _numpy_openblas()
    if openblas is None:  # not an OpenBLAS NumPy: compare_matmul says so (threads None)
        with numpy_blas_threads(1) as used:
            assert used is None
        return
    _, get_threads = openblas
    before = get_threads()
    with numpy_blas_threads(1) as used:
        assert used == 1 and get_threads() == 1
        a = np.ones((64, 64), dtype=np.float32)
        assert (a @ a)[0, 0] == 64
    assert get_threads() == before


def test_compare_matmul_gives_numpy_torchs_threads_and_the_fastest_call(monkeypatch):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        rows = compare_matmul([32], ["cpu"], warmup=1, repeats=3, settle_s=0)
    finally:
        torch.set_num_threads(threads)
    numpy_row, torch_row = rows
    assert torch_row["threads"] == 1 and numpy_row["threads"] in (1, None)
    for row in rows:
        assert 0 < row["min_ms"] <= row["median_ms"]


def test_a_cpu_peak_is_measured_once_per_run(monkeypatch):
    monkeypatch.setattr(flops, "_MEASURED_PEAKS", {})
    first = flops.device_peak_flops("cpu", torch.float32)
    again = flops.device_peak_flops("cpu", torch.float32)
    assert again is first, "two cells must divide by the same peak"
    assert first.source.startswith("measured once in this process")
    assert "CPU thread" in first.source


def test_a_cpu_figure_is_the_fastest_call_a_gpu_figure_the_median():
    times = [0.010, 0.030, 0.012]  # a busy moment made one call slow
    assert typical_s(Timing(times, 1, True, "cpu")) == 0.010
    assert typical_s(Timing(times, 1, True, "cuda:0")) == 0.012


def test_cpu_share_tells_waiting_from_working():
    with cpu_share() as waiting:  # a process that is not given a core looks like this
        time.sleep(0.05)
    assert waiting.busy and waiting.fraction < BUSY_SHARE
    assert "run the cell again" in waiting.advice("the ratio")
    with cpu_share() as working:
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
    assert working.cpu_s >= 0.05 and working.wall_s >= working.cpu_s * 0.5


def test_a_cpu_matmul_table_ranks_the_fastest_calls_not_the_load(monkeypatch):
    # review 01-W1: on a busy CPU most repeats of NumPy's matmul waited for a core (a team
    # of BLAS threads stalls when one of them does); the median then ranked NumPy 1000x
    # slower than torch, against the text beside the table. The fastest call did not wait.
    from course_utils import timing

    def loaded(fn, *, device="cpu", warmup=0, repeats=5, **kwargs):
        fn()
        quiet = 1e-4
        return Timing([quiet, 0.06, 0.06, quiet * 1.1, 0.06], warmup, True, str(device))

    monkeypatch.setattr(timing, "benchmark", loaded)
    rows = compare_matmul([64], ["cpu"], warmup=0, repeats=5, settle_s=0)
    for row in rows:
        assert row["gflops"] == 2 * 64**3 / 1e-4 / 1e9
        assert row["typical_ms"] == row["min_ms"]
