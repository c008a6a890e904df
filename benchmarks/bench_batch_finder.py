"""Maximum batch size: this course's finders against PyTorch Lightning's and accelerate's.

Finders compared, on the same trial functions:

* ``course doubling+bisect``: ``course_utils.batch.find_max_batch_size`` (high=8192);
* ``course predict+confirm``: ``course_utils.batch.predict_max_batch_size`` (needs the
  memory of a step: on the simulated limit, the simulation's own memory model; on the
  real model, the bytes saved for backward);
* ``lightning power`` / ``lightning binsearch``: Lightning's own
  ``Tuner(trainer).scale_batch_size`` (defaults init_val=2, max_val=8192, margin=0.05 in
  binsearch mode), called by ``course_utils.lightning.scale_batch_size`` with one step
  per trial. Lightning runs 3 training steps per trial by default
  (``steps_per_trial=3``): the ``steps`` column counts them;
* ``accelerate (start 128)`` and ``accelerate (start 8192)``: the real
  ``accelerate.utils.find_executable_batch_size`` (x0.9 after each out-of-memory error),
  wrapped by :func:`accelerate_find_batch_size` below.

1. A simulated limit: a trial that raises "CUDA out of memory" above M, memory
   ``fixed + per_sample * n``, for many M (no real work: counts the calls).
2. A real model on the CPU (small_cnn, width 16) under an imposed memory budget: a trial
   runs out of its simulated ``MemoryBudget`` as soon as the bytes autograd saves for
   backward exceed it (``TrainTrial(budget_bytes=...)``). The true limit is found
   by scanning batch sizes.

Writes batch_finder.json and batch_finder.md (the comparison table) under --out.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerate.utils import find_executable_batch_size
from common import parse_out, write_figures

from course_utils.batch import (
    MaxBatchSize,
    TrainTrial,
    Trial,
    find_max_batch_size,
    predict_max_batch_size,
)
from course_utils.env import measured_on
from course_utils.footprint import saved_tensor_bytes
from course_utils.lightning import scale_batch_size
from course_utils.oom import MemoryBudget

MAXIMA = [1, 3, 10, 33, 100, 127, 128, 129, 500, 1000, 3000, 4097, 8000]
FIXED, PER_SAMPLE = 50_000, 1_000  # bytes of the simulated step

Finder = Callable[[Callable[[int], Any]], MaxBatchSize]


def finders(memory_of: Callable[[int], int], budget: int) -> dict[str, Finder]:
    return {
        "course doubling+bisect": lambda trial: find_max_batch_size(trial, high=8192),
        "course predict+confirm": lambda trial: predict_max_batch_size(
            trial, memory_of, budget, high=8192
        ),
        "lightning power": lambda trial: scale_batch_size(trial, "power"),
        "lightning binsearch": lambda trial: scale_batch_size(trial, "binsearch"),
        "accelerate (start 128)": lambda trial: accelerate_find_batch_size(trial, 128),
        "accelerate (start 8192)": lambda trial: accelerate_find_batch_size(trial, 8192),
    }


STEPS_PER_TRIAL = {"lightning power": 3, "lightning binsearch": 3}


def accelerate_find_batch_size(
    trial: Callable[[int], Any], starting_batch_size: int = 128
) -> MaxBatchSize:
    """Hugging Face accelerate's ``find_executable_batch_size``: start at
    ``starting_batch_size`` and multiply by 0.9 after each out-of-memory error. It never
    grows: a start below the limit is returned as is."""
    history: list[Trial] = []

    def run(batch_size: int) -> int:
        start = time.perf_counter()
        try:
            trial(batch_size)
        except Exception as error:
            history.append(Trial(batch_size, False, time.perf_counter() - start, str(error)[:200]))
            raise
        history.append(Trial(batch_size, True, time.perf_counter() - start))
        return batch_size

    try:
        found = find_executable_batch_size(run, starting_batch_size=starting_batch_size)()
    except RuntimeError as error:
        if "reached zero" not in str(error):
            raise
        found = 0
    return MaxBatchSize(batch_size=found, limit=found, trials=len(history), history=history)


def simulated(maximum: int) -> list[dict[str, Any]]:
    budget = FIXED + PER_SAMPLE * maximum

    def memory_of(n: int) -> int:
        return FIXED + PER_SAMPLE * n

    def trial(n: int) -> None:
        MemoryBudget(budget).charge(memory_of(n))

    rows = []
    for name, finder in finders(memory_of, budget).items():
        found = finder(trial)
        rows.append(row(name, maximum, found))
    return rows


def row(name: str, maximum: int, found: MaxBatchSize, seconds: float | None = None) -> dict:
    entry = {
        "finder": name,
        "true_max": maximum,
        "found": found.batch_size,
        "largest_fitting_tried": found.limit,
        "trials": found.trials,
        "steps": found.trials * STEPS_PER_TRIAL.get(name, 1),
        "failed_trials": sum(not t.fits for t in found.history),
        "fraction_of_max": found.batch_size / maximum if maximum else 0.0,
    }
    if seconds is not None:
        entry["seconds"] = round(seconds, 2)
    return entry


def real_model() -> tuple[int, int, list[dict[str, Any]]]:
    measure = TrainTrial("small_cnn", model_kwargs={"width": 16})

    def memory_of(n: int) -> int:
        return saved_tensor_bytes(lambda: measure.step()(measure.batch(n)))[1]

    target = 48
    budget = (memory_of(target) + memory_of(target + 1)) // 2
    maximum = max(n for n in range(target - 4, target + 5) if memory_of(n) <= budget)
    rows = []
    for name, finder in finders(memory_of, budget).items():
        if name == "accelerate (start 8192)":
            continue  # a batch of 8192 real images is minutes of CPU work: start 128 only
        trial = TrainTrial("small_cnn", budget_bytes=budget, model_kwargs={"width": 16})
        start = time.perf_counter()
        found = finder(trial)
        rows.append(row(name, maximum, found, time.perf_counter() - start))
    return budget, maximum, rows


def markdown(rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for entry in rows:
        cells = [
            f"{entry[c]:.2f}" if isinstance(entry[c], float) else str(entry[c]) for c in columns
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = list(dict.fromkeys(entry["finder"] for entry in rows))
    table = []
    for name in names:
        mine = [entry for entry in rows if entry["finder"] == name]
        table.append(
            {
                "finder": name,
                "exact": sum(entry["found"] == entry["true_max"] for entry in mine),
                "exact_before_margin": sum(
                    entry["largest_fitting_tried"] == entry["true_max"] for entry in mine
                ),
                "too_large": sum(entry["found"] > entry["true_max"] for entry in mine),
                "cases": len(mine),
                "mean_fraction_of_max": statistics.mean(e["fraction_of_max"] for e in mine),
                "worst_fraction_of_max": min(e["fraction_of_max"] for e in mine),
                "mean_trials": statistics.mean(e["trials"] for e in mine),
                "max_trials": max(e["trials"] for e in mine),
                "mean_steps": statistics.mean(e["steps"] for e in mine),
            }
        )
    return table


def main() -> None:
    out = parse_out(__doc__ or "")
    start = time.perf_counter()
    detail = [entry for maximum in MAXIMA for entry in simulated(maximum)]
    print(f"simulated limits: {time.perf_counter() - start:.1f} s")
    table = summary(detail)
    budget, maximum, real_rows = real_model()
    figures = {
        "label": measured_on("cpu"),
        "simulated_maxima": MAXIMA,
        "simulated_summary": table,
        "simulated_detail": detail,
        "real_model": "small_cnn (width 16) on the CPU, one SGD step per trial",
        "real_budget_bytes": budget,
        "real_true_max": maximum,
        "real_rows": real_rows,
        "lightning_source": "lightning/pytorch/tuner/batch_size_scaling.py (reproduced)",
    }
    path = write_figures(out, "batch_finder", figures)
    text = "\n\n".join(
        [
            "# Maximum batch size: finders compared",
            f"Simulated limit, M in {MAXIMA} (trials = calls of the trial function; "
            "steps = training steps, Lightning runs 3 per trial by default):",
            markdown(
                table,
                [
                    "finder",
                    "exact",
                    "exact_before_margin",
                    "too_large",
                    "cases",
                    "mean_fraction_of_max",
                    "worst_fraction_of_max",
                    "mean_trials",
                    "max_trials",
                    "mean_steps",
                ],
            ),
            f"Real model (small_cnn width 16, CPU), imposed budget {budget / 2**20:.2f} MiB "
            f"of tensors saved for backward, true limit {maximum} "
            f"({measured_on('cpu')}):",
            markdown(
                real_rows,
                ["finder", "true_max", "found", "trials", "steps", "failed_trials", "seconds"],
            ),
        ]
    )
    markdown_path = Path(out) / "batch_finder.md"
    markdown_path.write_text(text + "\n")
    print(text)
    print(f"wrote {path} and {markdown_path}")


if __name__ == "__main__":
    main()
