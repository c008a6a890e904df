"""What the background monitor costs a training loop, at a 0.5 s sampling interval.

Goal: under 1% of step time. Trains the course's reference loop (``TrainStep`` on
``SyntheticImages``; small_cnn on a CPU, resnet18 on a GPU) in alternating trials without
and with :class:`course_utils.monitor.Monitor` running, and compares the median time per
step. Also reports the cost of one reading in the sampling thread, whose share of the
interval is the overhead to expect (``cost / interval``): the direct comparison is noisy
on a shared machine. Writes monitor_overhead.json.
"""

from __future__ import annotations

import statistics
import time

import torch
from common import parse_out, write_figures
from torch.utils.data import DataLoader

from course_utils.data import SyntheticImages
from course_utils.device import cuda_gpu_count
from course_utils.env import measured_on
from course_utils.models import build_model
from course_utils.monitor import Monitor, nvml_index_of
from course_utils.training import TrainStep, train

INTERVAL_S = 0.5
TRIALS = 10  # pairs of (without, with), in alternating order so that drift hits both alike
TRIAL_S = 4.0  # seconds of training per trial: eight samples at 0.5 s


def steps_per_trial(step: TrainStep, loader: DataLoader) -> int:
    """How many steps take about TRIAL_S seconds (measured after a warm-up)."""
    train(step, loader, max_steps=3)
    result = train(step, loader, max_steps=10)
    return max(3, int(TRIAL_S / (result.seconds / result.steps)))


def main() -> None:
    out = parse_out(__doc__ or "")
    gpu = cuda_gpu_count() > 0
    device = torch.device("cuda" if gpu else "cpu")
    torch.manual_seed(0)
    model = build_model("resnet18" if gpu else "small_cnn")
    batch = 128 if gpu else 32
    loader = DataLoader(SyntheticImages(size=batch * 50), batch_size=batch, shuffle=True)
    # keep the batches in memory: the loader's own jitter would hide a 1% effect
    batches = [next(iter(loader)) for _ in range(8)]
    cycle = batches * 10_000
    step = TrainStep(model, device)
    steps = steps_per_trial(step, cycle)
    gpu_index = nvml_index_of(device)  # NVML's number for the GPU that trains
    without, with_monitor, readings = [], [], []
    for trial in range(TRIALS):
        if trial % 2:  # every other pair runs the monitored trial first: no order effect
            with Monitor(interval_s=INTERVAL_S, gpu_index=gpu_index) as monitor:
                monitored = train(step, cycle, max_steps=steps)
            plain = train(step, cycle, max_steps=steps)
        else:
            plain = train(step, cycle, max_steps=steps)
            with Monitor(interval_s=INTERVAL_S, gpu_index=gpu_index) as monitor:
                monitored = train(step, cycle, max_steps=steps)
        without.append(plain.seconds / plain.steps)
        with_monitor.append(monitored.seconds / monitored.steps)
        readings.append(monitor.busy_s / max(1, len(monitor.samples)))
        print(
            f"trial {trial}: {without[-1] * 1e3:.2f} ms/step without, "
            f"{with_monitor[-1] * 1e3:.2f} ms/step with the monitor ({monitor.source}, "
            f"{len(monitor.samples)} samples, {readings[-1] * 1e3:.2f} ms per reading)"
        )
        time.sleep(0.2)
    base, monitored_median = statistics.median(without), statistics.median(with_monitor)
    # the median of the per-pair ratios: each pair ran back to back, under the same load
    overhead_pct = 100 * statistics.median(
        m / w - 1 for m, w in zip(with_monitor, without, strict=True)
    )
    reading_s = statistics.median(readings)
    expected_pct = 100 * reading_s / INTERVAL_S
    print(
        f"median step: {base * 1e3:.2f} ms without, {monitored_median * 1e3:.2f} ms with: "
        f"overhead {overhead_pct:+.2f}% (goal < 1%); one reading costs {reading_s * 1e3:.2f} ms "
        f"= {expected_pct:.3f}% of the {INTERVAL_S} s interval"
    )
    write_figures(
        out,
        "monitor_overhead",
        {
            "label": measured_on(device),
            "source": monitor.source,
            "interval_s": INTERVAL_S,
            "steps_per_trial": steps,
            "step_s_without": without,
            "step_s_with": with_monitor,
            "median_step_s_without": base,
            "median_step_s_with": monitored_median,
            "overhead_pct": overhead_pct,
            "reading_s": reading_s,
            "reading_share_of_interval_pct": expected_pct,
            "goal_pct": 1.0,
        },
    )


if __name__ == "__main__":
    main()
