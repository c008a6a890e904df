"""The background monitor: CPU fallback, NVML (fake), nvidia-smi fallback, live views."""

from __future__ import annotations

import os
import stat
import time

import matplotlib
import pytest
from test_nvml import full_fake

from course_utils import monitor, nvml
from course_utils.monitor import LiveView, Monitor

matplotlib.use("Agg")


def test_sample_keeps_its_flat_shape_on_cpu():
    reading = monitor.sample(gpu_index=None)
    assert isinstance(reading, monitor.Reading) and reading.source == "cpu"
    assert reading.cpu_util_pct is not None and reading.process_cpu_pct is not None
    assert reading.process_rss_mib > 10  # a Python process with numpy loaded
    assert reading.utilization_gpu_pct is None and reading.memory_used_mib is None


def test_this_process_share_stays_within_the_cores_over_short_samples():
    """Samples a millisecond apart while this process computes: each share is a figure
    between 0 and 100% of the cores (psutil's clock ticks of 10 ms gave over 1000% here)."""
    shares = []
    for _ in range(200):
        end = time.perf_counter() + 0.001
        while time.perf_counter() < end:
            sum(range(1_000))
        shares.append(monitor.sample(gpu_index=None).process_cpu_pct)
    assert all(0 <= share <= 100 for share in shares), max(shares)
    assert sum(shares) > 0  # the busy thread counts (how much depends on the machine's load)


def test_cpu_monitor_collects_labelled_samples_and_plots_them():
    with Monitor(interval_s=0.02, gpu_index=None) as running:
        end = time.perf_counter() + 0.25
        while time.perf_counter() < end:  # keep this process busy
            sum(range(10_000))
    assert running.source == "cpu"
    assert 3 <= len(running.samples) <= 20  # about 13 at 0.02 s; fewer on a loaded machine
    assert all(s.source == "cpu" for s in running.samples)
    times = running.series("time_s")
    assert times == sorted(times)
    summary = running.summary()
    assert summary["samples"] == len(running.samples) and summary["peak_memory_mib"] > 10
    assert 0 <= summary["mean_util_pct"] <= 100
    assert summary["sampling_busy_s"] < summary["seconds"]
    figure = running.timeline()
    assert len(figure.axes) == 2 and "CPU" in figure.axes[0].get_ylabel()


def test_monitor_reads_nvml_and_shows_text_lines(monkeypatch):
    monkeypatch.setattr(nvml, "_pynvml", full_fake())
    lines: list[str] = []
    with Monitor(interval_s=0.02, gpu_index=0, live=LiveView(every_s=0, write=lines.append)) as m:
        time.sleep(0.1)
    assert m.source == "nvml"
    assert all(s.source == "nvml" and s.utilization_gpu_pct == 97 for s in m.samples)
    assert m.samples[0].name == "Tesla T4" and m.samples[0].memory_used_mib == 5000
    assert lines[0].startswith("GPU 0 (nvml): util 97% | memory 5000/15360 MiB")
    # the summary once (a cell prints summary_line()): not again as the live view's last
    # line or as the plot's title
    assert m.summary_line().startswith("GPU 0 (nvml):") and "GPU-Util mean 97%" in m.summary_line()
    assert lines[-1].startswith("GPU 0 (nvml): monitor stopped after")
    assert "mean" not in lines[-1]
    figure = m.timeline()
    assert "GPU-Util" in figure.axes[0].get_ylabel()
    assert figure._suptitle.get_text() == "GPU 0 (nvml): GPU-Util and memory against time"


def test_monitor_falls_back_to_nvidia_smi_without_nvml(monkeypatch, tmp_path):
    monkeypatch.setattr(nvml, "_pynvml", None)
    binary = tmp_path / "nvidia-smi"
    binary.write_text("#!/bin/sh\necho '0, 45, 30, 1200, 15360, 50.5, 70.00, 60, 1590, P0'\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert monitor.pick_source(0) == "nvidia-smi"
    with Monitor(interval_s=0.05, gpu_index=0) as m:
        time.sleep(0.15)
    assert m.source == "nvidia-smi"
    reading = m.samples[0]
    assert (reading.utilization_gpu_pct, reading.memory_used_mib) == (45, 1200)
    assert (reading.power_draw_w, reading.pstate, reading.gpu_index) == (50.5, "P0", 0)
    assert monitor.pick_source(3) == "cpu"  # no GPU 3 in that output


def test_without_any_gpu_source_auto_means_cpu(monkeypatch, tmp_path):
    monkeypatch.setattr(nvml, "_pynvml", None)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("course_utils.smi.COLAB_PATH", str(tmp_path / "none"))
    with Monitor(interval_s=0.05) as m:
        time.sleep(0.06)
    assert m.source == "cpu" and m.samples[0].source == "cpu"


def test_widget_view_updates_in_place(capsys):
    view = LiveView(widget=True)  # ipywidgets 8 here; the HTML widget exists in 7 as well
    view.show(monitor.describe(monitor.Reading(0.0, "cpu", cpu_util_pct=12.0)))
    assert "CPU (no GPU): utilization 12%" in view.widget.value
    view.show("done", final=True)
    assert view.widget.value == "<code>done</code>"
    assert LiveView().widget is None  # not inside a kernel: text lines


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="interval_s"):
        Monitor(interval_s=0)
    with pytest.raises(ValueError, match="source"):
        Monitor(source="tpu")
    running = Monitor(interval_s=0.05, gpu_index=None).start()
    with pytest.raises(RuntimeError, match="already running"):
        running.start()
    running.stop()


def test_utilization_experiment_rows_on_cpu():
    rows = monitor.utilization_experiment("cpu", tiny_n=4, large_n=64, seconds=0.1, interval_s=0.05)
    assert [row["workload"] for row in rows] == ["tiny 4x4 matmuls", "large 64x64 matmuls"]
    for row in rows:
        assert row["source"] == "cpu" and row["achieved_flops_per_s"] > 0
        peak = row["peak_flops"].flops_per_s
        assert row["mfu"] == pytest.approx(row["achieved_flops_per_s"] / peak)
    assert "GFLOP/s" in monitor.format_experiment(rows)


@pytest.mark.gpu
def test_monitor_on_a_real_gpu_sees_a_matmul():
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    with Monitor(interval_s=0.1, gpu_index=monitor.nvml_index_of("cuda:0")) as m:
        end = time.perf_counter() + 2.0
        while time.perf_counter() < end:
            a @ a
        torch.cuda.synchronize()
    assert m.source == "nvml"
    assert max(v for v in m.series("utilization_gpu_pct") if v is not None) > 50
    assert max(v for v in m.series("memory_used_mib") if v is not None) > 32


def test_a_run_shorter_than_the_interval_still_has_a_first_and_a_last_reading():
    with Monitor(interval_s=30.0, source="cpu") as monitor:
        pass
    assert len(monitor.samples) == 2
    assert monitor.samples[0].time_s <= monitor.samples[1].time_s
