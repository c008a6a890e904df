"""GPU-only behaviour, checked on any machine by faking the hardware (NVML, torch.cuda).

Each test pins a bug that only shows on a GPU: readings that travel under the wrong
name, the wrong GPU monitored, memory released while a traceback still holds it, a
memory cap not restored, a matmul stream that queues far past its time budget, an MFU
peak that ignores TF32 convolutions, autocast refused on an old torch.
"""

from __future__ import annotations

import contextlib
import time
import types
import weakref

import pytest
import torch
from test_nvml import GPUS, full_fake

from course_utils import batch, capstone, flops, memory, monitor, nvml, training
from course_utils.data import EncodedImages
from course_utils.device import autocast, pick_precision
from course_utils.monitor import Monitor, Reading

# ------------------------------------------------------------------ readings, typed


@pytest.fixture
def fake_t4(monkeypatch):
    """One T4 behind a fake NVML (97% busy, 5000 of 15360 MiB used); ``mig=True`` makes
    utilization unavailable, as on a MIG slice."""

    def setup(mig: bool = False):
        monkeypatch.setattr(nvml, "_pynvml", full_fake(mig=mig))
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    setup()
    return setup


def test_a_reading_refuses_names_it_does_not_have(fake_t4):
    reading = monitor.sample(0)
    assert isinstance(reading, Reading) and reading.source == "nvml"
    assert reading["utilization_gpu_pct"] == reading.get("utilization_gpu_pct") == 97
    with pytest.raises(KeyError, match="gpu_util_pct"):
        reading.get("gpu_util_pct")  # the name the capstone used to read: "GPU util ?%"
    shown = dict(reading.items())
    assert shown["memory_used_mib"] == 5000 and "cpu_util_pct" not in shown  # None left out


def test_fake_nvml_readings_reach_every_consumer(fake_t4):
    # the monitor: samples, summary, the live line and the plot
    lines: list[str] = []
    view = monitor.LiveView(every_s=0, write=lines.append)
    with Monitor(interval_s=0.02, gpu_index=0, live=view) as running:
        time.sleep(0.06)
    summary = running.summary()
    assert (summary["source"], summary["mean_util_pct"], summary["peak_memory_mib"]) == (
        "nvml",
        97,
        5000,
    )
    assert "util 97% | memory 5000/15360 MiB" in lines[0] and "monitor stopped" in lines[-1]
    assert "GPU-Util mean 97%" in running.summary_line()

    # the Lightning callback: metrics for the loggers, and the readings themselves
    from course_utils.lightning import UtilizationLogger

    logged: list[dict] = []
    logger = types.SimpleNamespace(log_metrics=lambda metrics, step: logged.append(metrics))
    trainer = types.SimpleNamespace(
        global_step=0,
        loggers=[logger],
        strategy=types.SimpleNamespace(root_device=torch.device("cuda", 0)),
    )
    callback = UtilizationLogger(every_n_steps=1)
    callback.on_train_batch_end(trainer, None, None, None, 0)
    assert callback.readings[0].utilization_gpu_pct == 97
    assert logged[0]["gpu/utilization_gpu_pct"] == 97.0
    assert logged[0]["gpu/memory_used_mib"] == 5000.0 and "gpu/gpu_index" not in logged[0]


def test_under_mig_utilization_is_not_available_and_said_so(fake_t4):
    fake_t4(mig=True)
    with Monitor(interval_s=0.02, gpu_index=0) as running:
        time.sleep(0.05)
    summary = running.summary()
    assert summary["source"] == "nvml" and summary["mean_util_pct"] is None
    assert summary["peak_memory_mib"] == 5000
    assert "not available under MIG" in running.summary_line()
    assert "util N/A (MIG)" in monitor.describe(running.samples[-1])


def test_every_consumer_maps_cuda_numbers_to_nvml_numbers(monkeypatch):
    # CUDA_VISIBLE_DEVICES=2,0: cuda:0 is NVML's GPU 2 and cuda:1 is GPU 0.
    monkeypatch.setattr(nvml, "list_gpus", lambda: list(GPUS))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert monitor.nvml_index_of("cuda:0") == 2 and monitor.nvml_index_of("cuda:1") == 0
    assert monitor.nvml_index_of("cpu") is None

    from course_utils.lightning import UtilizationLogger

    trainer = types.SimpleNamespace(
        strategy=types.SimpleNamespace(root_device=torch.device("cuda", 1))
    )
    assert UtilizationLogger()._index(trainer) == 0

    asked: list[int | None] = []
    monkeypatch.setattr(capstone, "sample", lambda index: asked.append(index) or Reading(0, "cpu"))
    monkeypatch.setattr(capstone, "build_model", lambda *a, **k: torch.nn.Module())
    monkeypatch.setattr(capstone, "_fixed_batch_loss", lambda *args: 0.0)
    monkeypatch.setattr(capstone, "synchronizer", lambda device: lambda: None)

    def loop(data, model, device, timed):  # no CUDA work: the batches stay on the CPU
        return [0.0 for _ in timed(torch.utils.data.DataLoader(data, batch_size=8))]

    capstone.run_loop(loop, EncodedImages(16, stored_size=36), "cuda:0", samples=16)
    assert asked == [2, 2]  # the capstone samples the GPU that trains, not NVML's 0

    from course_utils.env import measured_on

    assert "GPU: c" in measured_on("cuda:0")


def test_the_spinning_kernel_runs_on_the_device_asked(monkeypatch):
    where: list[object] = []

    @contextlib.contextmanager
    def device(which):
        where.append(torch.device(which))
        yield

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: where.append(device))
    monitor._spin(torch.device("cuda", 1), 0.01)
    assert where[0] == torch.device("cuda", 1)
    assert all(entry == torch.device("cuda", 1) for entry in where)


# ------------------------------------------------------------------ memory


@pytest.fixture
def fake_cuda_memory(monkeypatch):
    """Two fake GPUs; this process trains on cuda:1 only (no context on cuda:0)."""
    asked: list[int] = []
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 2)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "memory_reserved", lambda i=None: [0, 64 * 2**20][i])
    monkeypatch.setattr(cuda, "memory_allocated", lambda i=None: [0, 32 * 2**20][i])
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda i=None: [0, 48 * 2**20][i])
    monkeypatch.setattr(cuda, "get_device_name", lambda i=None: "Tesla T4")
    monkeypatch.setattr(cuda, "mem_get_info", lambda i=None: asked.append(i) or (2**30, 2**34))
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda i: i == 1, raising=False)
    monkeypatch.setattr(nvml, "nvml_index", lambda i: None)
    return asked


def test_memory_report_reads_only_the_gpus_this_process_uses(fake_cuda_memory):
    report = memory.memory_report()
    assert [gpu.device for gpu in report.gpus] == ["cuda:1"]
    assert fake_cuda_memory == [1]  # mem_get_info(0) would create a context on cuda:0
    assert report.gpus[0].reserved_mib == 64


def test_memory_cap_restores_the_fraction_in_force_before(monkeypatch):
    fractions = {0: 1.0}
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: types.SimpleNamespace(total_memory=16 * 2**30),
    )
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, i: fractions.__setitem__(i, f)
    )
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", None, raising=False)
    monkeypatch.setattr(memory, "release_cached_memory", lambda: None)
    with memory.memory_cap("cuda:0", 8 * 1024):
        assert fractions[0] == 0.5
        with memory.memory_cap("cuda:0", 4 * 1024):
            assert fractions[0] == 0.25
        assert fractions[0] == 0.5  # the enclosing cap, not 1.0
    assert fractions[0] == 1.0
    # a torch that can read the fraction back: the value it reports is restored
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda i: 0.8)
    with memory.memory_cap("cuda:0", 1024):
        pass
    assert fractions[0] == 0.8


def test_a_failed_batch_size_is_released_after_the_traceback_is_gone(monkeypatch):
    alive_at_release: list[bool] = []
    held: list[weakref.ref] = []

    def trial(n):
        activations = torch.ones(n, 1024)  # what a failed step holds when OOM strikes
        held.append(weakref.ref(activations))
        if n >= 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def release(allocated_before=None):
        alive_at_release.append(any(ref() is not None for ref in held))
        return False

    monkeypatch.setattr(batch, "release_after_out_of_memory", release)
    sweep = batch.batch_size_sweep(trial, [2, 4, 8], repeats=1, warmup=0)
    assert [row.out_of_memory for row in sweep.rows] == [False, True]
    assert alive_at_release == [False]


# ------------------------------------------------------------------ time and peaks


def test_the_matmul_stream_stops_on_finished_work_not_queued_work():
    # A fake GPU: a launch returns at once and queues 5 ms of work; sync waits for it.
    queue = {"pending": 0}

    def launch():
        queue["pending"] += 1

    def sync():
        time.sleep(0.005 * queue["pending"])
        queue["pending"] = 0

    count, elapsed = flops.launch_for(launch, sync, seconds=0.2)
    # Checking the clock only at launch would queue ~100,000 launches (~10 minutes).
    assert elapsed < 0.6 and queue["pending"] == 0
    assert 10 <= count <= 0.6 / 0.005


@pytest.fixture
def tf32_flags():
    """Set the two TF32 switches (``matmul``, ``cudnn``); restored afterwards."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)

    def set_flags(for_matmul: bool, for_cudnn: bool) -> None:
        matmul.allow_tf32, cudnn.allow_tf32 = for_matmul, for_cudnn

    yield set_flags
    set_flags(*saved)


def test_the_fp32_peak_follows_tf32_for_convolutions(monkeypatch, tf32_flags):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    tf32_flags(False, True)  # PyTorch's defaults
    assert flops.device_peak_flops("cuda", torch.float32).flops_per_s == 19.5e12
    conv = flops.device_peak_flops("cuda", torch.float32, convolutions=True)
    assert conv.flops_per_s == 156e12 and "TF32" in conv.source
    tf32_flags(False, False)
    assert flops.device_peak_flops("cuda", torch.float32, convolutions=True).flops_per_s == 19.5e12
    tf32_flags(True, False)
    assert flops.device_peak_flops("cuda", torch.float32).flops_per_s == 156e12


def test_fp32_never_calls_autocast(monkeypatch):
    # torch 2.4 raises for torch.autocast("mps", enabled=False): MPS autocast came in 2.5.
    def refuse(device_type, *args, **kwargs):
        raise RuntimeError(f"User specified an unsupported autocast device_type '{device_type}'")

    monkeypatch.setattr(torch, "autocast", refuse)
    with autocast("mps", pick_precision("mps")):
        pass
    step = training.TrainStep(torch.nn.Linear(4, 2), "cpu", training.TrainConfig(precision="fp32"))
    loss = step((torch.ones(3, 4), torch.zeros(3, dtype=torch.long)))
    assert torch.isfinite(loss)
    with pytest.raises(RuntimeError, match="unsupported autocast"):
        autocast("cpu", pick_precision("cpu", "bf16")).__enter__()


def test_the_amp_breakdown_counts_optimizer_state_even_when_the_first_step_overflows():
    # A T4's fp16 first step overflows (scaled gradients ~8e4 > 65504) and GradScaler skips
    # optimizer.step(): emulated on the CPU (fp16 autocast) with an initial scale of 2**24.
    from course_utils.footprint import memory_breakdown
    from course_utils.models import build_model

    torch.manual_seed(0)
    config = training.TrainConfig(precision="fp16", optimizer="adam")
    step = training.TrainStep(build_model("mlp"), "cpu", config)
    step.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    batch = (torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    breakdown = memory_breakdown(step, batch)
    parameters = sum(p.numel() * p.element_size() for p in step.model.parameters())
    assert breakdown.optimizer_state >= 2 * parameters  # Adam: exp_avg and exp_avg_sq
    assert step.scaler.get_scale() < 2.0**24  # the overflow did happen
