"""The PyTorch exercises of notebooks 01 and 02: their checks pass the instructor's solution
and fail the usual mistakes, with feedback that names the mistake.

Each check cell is run as the grader runs it: after the notebook's imports and knobs, with
the learner's function defined in the same namespace.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
import torch
from notebook_cells import code_cells, grade_apart, grade_cell, messages_matching

from course_utils.checks import nb01 as checks_01  # loaded before grade_apart (its evidence)
from course_utils.checks.nb01 import MESSAGES_01
from course_utils.fake_nvml import FakeGpu, FakeNvml, gpu_from_sample
from course_utils.feedback import CheckFailed
from course_utils.nvml import snapshot

ROOT = Path(__file__).resolve().parent.parent
NB01 = ROOT / "notebooks" / "01_runtime_and_devices.ipynb"
NB02 = ROOT / "notebooks" / "02_nvidia_smi_and_monitoring.ipynb"


def _cells(path) -> dict[str, str]:
    return code_cells(path)


def _grade_cell(path, grade_id: str) -> str:
    return grade_cell(path, grade_id)


def _namespace(path, setup_ids: list[str], monkeypatch) -> dict:
    monkeypatch.setenv("COURSE_WORKLOAD", "small")
    cells = _cells(path)
    namespace: dict = {}
    for cell_id in setup_ids:
        exec(cells[cell_id], namespace)
    return namespace


def _run_check(path, grade_id: str, namespace: dict, name: str, solution) -> None:
    namespace[name] = solution
    exec(_grade_cell(path, grade_id), namespace)


# ----------------------------------------------------------------------------- 01 (c)


def good_time_it(fn, device, warmup=2, repeats=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def no_sync_time_it(fn, device, warmup=2, repeats=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sync_after_only_time_it(fn, device, warmup=2, repeats=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def no_warmup_time_it(fn, device, warmup=2, repeats=5):
    return good_time_it(fn, device, warmup=0, repeats=warmup + repeats)


def _timed(fn, device, warmup, repeats):
    """The times of the repeats, each synchronized on a CUDA device."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def mean_time_it(fn, device, warmup=2, repeats=5):  # issue 35: a mean where the median is asked
    return statistics.mean(_timed(fn, device, warmup, repeats))


def min_time_it(fn, device, warmup=2, repeats=5):  # 01-N5: the spec asks for the median
    return min(_timed(fn, device, warmup, repeats))


def ns_clock_time_it(fn, device, warmup=2, repeats=5):  # perf_counter_ns and torch: right
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter_ns()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter_ns() - start) / 1e9)
    return torch.tensor(times, dtype=torch.float64).quantile(0.5).item()


def no_argument_sync_time_it(fn, device, warmup=2, repeats=5):  # the current device: right
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _returning(statistic):
    """A timer right in everything but the figure it returns: ``statistic(times)``."""

    def time_it(fn, device, warmup=2, repeats=5):
        return statistic(_timed(fn, device, warmup, repeats))

    return time_it


def _timing_everything(statistic):
    def time_it(fn, device, warmup=2, repeats=5):
        return statistic(_timed(fn, device, 0, warmup + repeats))

    return time_it


def _syncing(should_sync, *device_args):
    """A right timer but for when it synchronizes (``should_sync(device)``) and which
    device it names (``device_args``, or ``(device,)`` when empty)."""

    def time_it(fn, device, warmup=2, repeats=5):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if should_sync(device):
                torch.cuda.synchronize(*(device_args or (device,)))
            start = time.perf_counter()
            fn()
            if should_sync(device):
                torch.cuda.synchronize(*(device_args or (device,)))
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return time_it


#: One wrong timer per usual mistake of 01 (c), and the message that must name it.
TIME_IT_MISTAKES = {
    "time_it mean": _returning(statistics.mean),
    "time_it fastest": _returning(min),
    "time_it slowest": _returning(max),
    "time_it total": _returning(sum),
    "time_it warm-up timed": _timing_everything(statistics.median),
    "time_it mean of all": _timing_everything(statistics.mean),
    "time_it milliseconds": _returning(lambda t: statistics.median(t) * 1e3),
    "time_it upper middle": _returning(lambda t: sorted(t)[len(t) // 2]),  # blind spot
    "time_it lower middle": _returning(lambda t: torch.tensor(t).median().item()),
    "time_it unsorted middle": _returning(lambda t: t[len(t) // 2]),
    "time_it duplicates dropped": _returning(lambda t: statistics.median(set(t))),
    "time_it not the median": _returning(lambda t: statistics.median(t[1:] or t)),
    "time_it synced because CUDA exists": _syncing(lambda d: torch.cuda.is_available()),
    "time_it synced a CPU device": _syncing(lambda d: True),
    "time_it synced another GPU": _syncing(lambda d: d.type == "cuda", 0),
    "time_it no sync on GPU": no_sync_time_it,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TIME_IT_MISTAKES))
def test_time_it_feedback_names_each_mistake_and_no_other(nb01, name):
    with pytest.raises(CheckFailed) as failed:
        _run_check(NB01, "01-time-it-check", nb01, "time_it", TIME_IT_MISTAKES[name])
    assert messages_matching(str(failed.value), MESSAGES_01) == [name], str(failed.value)


def test_time_it_feedback_never_gives_the_median_of_the_failed_case(nb01):
    """An even count is where the old check's own answer was wrong (the upper middle)."""
    with pytest.raises(CheckFailed) as failed:
        _run_check(
            NB01, "01-time-it-check", nb01, "time_it", TIME_IT_MISTAKES["time_it not the median"]
        )
    assert "repeats that took 10 ms, 30 ms, 20 ms, 250 ms, 20 ms" in str(failed.value)
    assert "20 ms" not in str(failed.value).split("gave")[1]  # that case's median


def clockless_time_it(fn, device, warmup=2, repeats=5):  # issue 35: never reads a clock
    for _ in range(warmup + repeats):
        fn()
    return 0.02


def course_benchmark_time_it(fn, device, warmup=2, repeats=5):  # issue 35: the course's timer
    from course_utils.timing import benchmark

    return benchmark(fn, device=device, warmup=warmup, repeats=repeats).median_s


@pytest.fixture
def nb01(monkeypatch):
    threads = torch.get_num_threads()  # the knobs cell may set them (small workload: one)
    yield _namespace(NB01, ["nb01-04", "nb01-04b", "nb01-05"], monkeypatch)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("solution", [good_time_it, ns_clock_time_it, no_argument_sync_time_it])
def test_time_it_check_passes_correct_timers(nb01, solution, capsys):
    _run_check(NB01, "01-time-it-check", nb01, "time_it", solution)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (no_sync_time_it, "torch.cuda.synchronize()"),
        (sync_after_only_time_it, "synchronize before the clock"),
        (no_warmup_time_it, "warm-up calls were timed"),
        (mean_time_it, "the mean of the repeats; return their median"),
        (min_time_it, "the fastest repeat; return the median"),
        (clockless_time_it, "never read a clock"),
        (course_benchmark_time_it, "called the course's own benchmark()"),
    ],
)
def test_time_it_check_names_the_mistake(nb01, solution, feedback):
    with pytest.raises(CheckFailed, match=feedback.replace("(", r"\(").replace(")", r"\)")):
        _run_check(NB01, "01-time-it-check", nb01, "time_it", solution)


def _time_it_apart(solution) -> dict:
    """The verdict of 01 (c)'s check cell as the grader's checker reaches it."""
    assert checks_01.check_time_it_median  # the evidence's classes are loaded in the checker
    return grade_apart(NB01, "01-time-it-check", {"time_it": solution})


@pytest.mark.slow
def test_time_it_check_passes_apart(capsys):
    assert _time_it_apart(good_time_it)["status"] == "completed"
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (TIME_IT_MISTAKES["time_it mean"], "the mean of the repeats; return their median"),
        (course_benchmark_time_it, "called the course's own benchmark()"),
        (TIME_IT_MISTAKES["time_it synced because CUDA exists"], "torch.cuda.is_available()"),
        (TIME_IT_MISTAKES["time_it synced another GPU"], "synchronized cuda:0"),
        (no_sync_time_it, "never called torch.cuda.synchronize()"),
        (sync_after_only_time_it, "synchronize before the clock"),
    ],
)
def test_time_it_check_names_the_mistake_apart(solution, feedback):
    verdict = _time_it_apart(solution)
    assert verdict["status"] == "failed" and feedback in verdict["evalue"], verdict


class Agreeing(float):
    """A float equal to everything, and at least and below anything."""

    __eq__ = __ge__ = __lt__ = lambda self, other: True
    __hash__ = float.__hash__


class Named(str):
    """A str whose ``str()`` says ``cuda``, whatever it holds."""

    __str__ = lambda self: "cuda"  # noqa: E731


def agreeing_time_it(fn, device, warmup=2, repeats=5):  # right, in a float that agrees
    return Agreeing(good_time_it(fn, device, warmup, repeats))


#: Right, but for the device it synchronizes: cuda:0, in a str that says "cuda".
named_sync_time_it = _syncing(lambda device: device.type == "cuda", Named("cuda:0"))


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (agreeing_time_it, "should be of type float, but it is of type Agreeing"),
        (named_sync_time_it, "should be of type str, but it is of type Named"),
    ],
)
def test_time_it_evidence_cannot_be_forged(solution, feedback):
    verdict = _time_it_apart(solution)
    assert verdict["status"] == "failed" and feedback in verdict["evalue"], verdict


def test_time_it_raising_is_named_without_its_message_apart():
    def raising(fn, device, warmup=2, repeats=5):
        raise ValueError("a secret of the learner's")

    verdict = _time_it_apart(raising)
    assert verdict["evalue"].startswith(
        "your function raised ValueError: (your code's message) (on repeats that took 10 ms"
    ), verdict


# ----------------------------------------------------------------------------- 02 (c)


def good_read_gpu(nvml, index):
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
        except nvml.NVMLError_NotSupported:
            util = None
        return util, memory.used // 2**20, memory.total // 2**20
    finally:
        nvml.nvmlShutdown()


def true_division_read_gpu(nvml, index):  # issue 35: fractional MiB
    util, used, total = _bytes(nvml, index)
    return util, used / 2**20, total / 2**20


def rounding_read_gpu(nvml, index):  # issue 35: rounding where the floor is asked
    util, used, total = _bytes(nvml, index)
    return util, round(used / 2**20), round(total / 2**20)


def _bytes(nvml, index):
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
        except nvml.NVMLError_NotSupported:
            util = None
        return util, memory.used, memory.total
    finally:
        nvml.nvmlShutdown()


def gpu0_read_gpu(nvml, index):
    return good_read_gpu(nvml, 0)


def bytes_read_gpu(nvml, index):
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
    nvml.nvmlShutdown()
    return util, memory.used, memory.total


def no_mig_read_gpu(nvml, index):
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
        return util, memory.used // 2**20, memory.total // 2**20
    finally:
        nvml.nvmlShutdown()


def no_finally_read_gpu(nvml, index):
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
    except nvml.NVMLError_NotSupported:
        util = None
    nvml.nvmlShutdown()
    return util, memory.used // 2**20, memory.total // 2**20


def no_shutdown_read_gpu(nvml, index):
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
    except nvml.NVMLError_NotSupported:
        util = None
    return util, memory.used // 2**20, memory.total // 2**20


@pytest.fixture
def nb02(monkeypatch):
    return _namespace(NB02, ["nb02-03", "nb02-03b"], monkeypatch)


def test_read_gpu_check_passes_the_solution(nb02, capsys):
    _run_check(NB02, "02-read-gpu-check", nb02, "read_gpu", good_read_gpu)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("solution", "feedback"),
    [
        (gpu0_read_gpu, "the busy H200"),
        (bytes_read_gpu, "the busy H200"),
        (no_mig_read_gpu, "under MIG"),
        (no_finally_read_gpu, "try/finally"),
        (no_shutdown_read_gpu, "nvmlShutdown"),
        (true_division_read_gpu, r"read \(2047.5, 15363.0\) \(used, total\), the bytes divided"),
        (rounding_read_gpu, r"read \(2048, 15363\) \(used, total\), each rounded"),
    ],
)
def test_read_gpu_check_names_the_mistake(nb02, solution, feedback):
    with pytest.raises(CheckFailed, match=feedback):
        _run_check(NB02, "02-read-gpu-check", nb02, "read_gpu", solution)


# ----------------------------------------------------------------------------- the fake


def test_the_fake_answers_the_package_reader_like_the_recording(monkeypatch):
    """The course's own NVML reader, given the fake, reads what nvidia-smi recorded."""
    from course_utils import nvml

    busy = gpu_from_sample("h200_query_gpu_csv_load")
    monkeypatch.setattr(nvml, "_pynvml", FakeNvml([gpu_from_sample("h200_table_idle"), busy]))
    reading = snapshot(1, processes=False)
    assert reading is not None
    assert (reading.utilization_gpu_pct, reading.memory_used_mib, reading.memory_total_mib) == (
        99,
        1011,
        143771,
    )
    assert reading.memory_free_mib == 143771 - 1011
    assert nvml._pynvml.init_calls == nvml._pynvml.shutdown_calls == 1


def test_the_fake_refuses_what_pynvml_refuses():
    fake = FakeNvml([FakeGpu(None, 1, 2)])
    with pytest.raises(FakeNvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlInit()
    with pytest.raises(FakeNvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetMemoryInfo(0)  # an index is not a handle
    with pytest.raises(FakeNvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(FakeNvml.NVMLError_NotSupported):  # MIG: no utilization
        fake.nvmlDeviceGetUtilizationRates(fake.nvmlDeviceGetHandleByIndex(0))
    other = FakeNvml([FakeGpu(1, 1, 2)])
    other.nvmlInit()
    with pytest.raises(FakeNvml.NVMLError_InvalidArgument):  # another library's handle
        fake.nvmlDeviceGetMemoryInfo(other.nvmlDeviceGetHandleByIndex(0))
    fake.nvmlShutdown()
    assert not fake.initialized
    with pytest.raises(FakeNvml.NVMLError_Uninitialized):
        fake.nvmlShutdown()
