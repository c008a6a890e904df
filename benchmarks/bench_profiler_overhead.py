"""Overhead of course_utils.profiling.StepProfiler on a training loop.

Two measures, each the median of several alternating repeats:

* the fixed cost per step: a loop over pre-made batches with a step that does nothing,
  bare versus profiled (synchronized and not): microseconds per step;
* the relative cost on a real training step (small_cnn, batch 32, on the device this
  runs on): (profiled - bare) / bare. The goal is under 2% of the step time.

On a GPU the synchronized profiler also removes the CPU/GPU overlap between steps; the
unsynchronized row shows the profiler's bookkeeping alone. Writes profiler_overhead.json.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from common import parse_out, write_figures

from course_utils.device import pick_device, to_device
from course_utils.env import measured_on
from course_utils.models import build_model
from course_utils.profiling import profile_loop
from course_utils.timing import synchronizer
from course_utils.training import TrainConfig, TrainStep


def bare_loop(batches: list[Any], step: Callable[[Any], Any], device: torch.device) -> float:
    sync = synchronizer(device)
    sync()
    start = time.perf_counter()
    for batch in batches:
        step(to_device(batch, device))
    sync()
    return (time.perf_counter() - start) / len(batches)


def profiled_loop(
    batches: list[Any], step: Callable[[Any], Any], device: torch.device, synchronize: bool
) -> float:
    profile = profile_loop(batches, step, device, warmup=0, synchronize=synchronize)
    return profile.wall_s / profile.num_steps


def compare(
    batches: list[Any], step: Callable[[Any], Any], device: torch.device, repeats: int
) -> dict[str, float]:
    runs: dict[str, Callable[[], float]] = {
        "bare": lambda: bare_loop(batches, step, device),
        "synchronized": lambda: profiled_loop(batches, step, device, True),
        "unsynchronized": lambda: profiled_loop(batches, step, device, False),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    bare_loop(batches[:3], step, device)  # warm-up
    names = list(runs)
    for repeat in range(repeats):  # rotate the order: drift and order effects hit all alike
        for name in names[repeat % 3 :] + names[: repeat % 3]:
            times[name].append(runs[name]())
    medians = {key: statistics.median(values) for key, values in times.items()}
    for name in ("synchronized", "unsynchronized"):  # per repeat: profiled / bare - 1
        ratios = [p / b - 1 for p, b in zip(times[name], times["bare"], strict=True)]
        medians[f"{name}_paired_overhead"] = statistics.median(ratios)
    return medians


def main() -> None:
    out = parse_out(__doc__ or "")
    device = pick_device()
    cpu = torch.device("cpu")

    empty = [(torch.zeros(1), torch.zeros(1)) for _ in range(2000)]
    fixed = compare(empty, lambda batch: None, cpu, repeats=9)

    torch.manual_seed(0)
    step = TrainStep(build_model("small_cnn"), device, TrainConfig(precision="fp32"))
    batches = [(torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))) for _ in range(20)]
    real = compare(batches, step, device, repeats=15)

    figures: dict[str, Any] = {
        "label": measured_on(device),
        "fixed_bare_us_per_step": fixed["bare"] * 1e6,
        "fixed_profiled_sync_overhead_us_per_step": (fixed["synchronized"] - fixed["bare"])
        * 1e6,
        "fixed_profiled_nosync_overhead_us_per_step": (fixed["unsynchronized"] - fixed["bare"])
        * 1e6,
        "train_step_ms": real["bare"] * 1e3,
        "overhead_percent_synchronized": 100 * real["synchronized_paired_overhead"],
        "overhead_percent_unsynchronized": 100 * real["unsynchronized_paired_overhead"],
        "fixed_overhead_percent_of_train_step": 100
        * (fixed["synchronized"] - fixed["bare"])
        / real["bare"],
        "goal_percent": 2.0,
    }
    for key, value in figures.items():
        print(f"{key}: {value if isinstance(value, str) else f'{value:.3f}'}")
    write_figures(out, "profiler_overhead", figures)


if __name__ == "__main__":
    main()
