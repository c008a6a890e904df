"""Overhead of course_utils.timing.benchmark compared with a bare perf_counter loop.

Times a function that does nothing, so everything measured is the timer's own cost.
It should be well below a microsecond per call on the CPU, negligible beside any
kernel a notebook times. Writes timing_overhead.json.
"""

from __future__ import annotations

import statistics
import time

from common import parse_out, write_figures

from course_utils.env import measured_on
from course_utils.timing import benchmark

CALLS = 10_000


def nothing() -> None:
    return None


def bare_loop_seconds() -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        nothing()
    return (time.perf_counter() - start) / CALLS


def main() -> None:
    out = parse_out(__doc__ or "")
    bare = statistics.median(bare_loop_seconds() for _ in range(15))
    helper = benchmark(nothing, warmup=1, repeats=15, number=CALLS)
    per_repeat = benchmark(nothing, warmup=1, repeats=2001, number=1)
    figures = {
        "label": measured_on("cpu"),
        "bare_loop_ns_per_call": bare * 1e9,
        "benchmark_ns_per_call_number_10000": helper.median_s * 1e9,
        "benchmark_ns_per_call_number_1": per_repeat.median_s * 1e9,
    }
    for key, value in figures.items():
        print(f"{key}: {value if isinstance(value, str) else f'{value:.1f}'}")
    write_figures(out, "timing_overhead", figures)


if __name__ == "__main__":
    main()
