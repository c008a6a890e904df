"""Sampling GPU (or, without one, CPU) utilization and memory over time.

:func:`sample` takes one :class:`~course_utils.nvml.Reading`; :class:`Monitor` samples in a
background thread from NVML, else ``nvidia-smi --query-gpu``, else psutil (no GPU), can
show them live, and plots them afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets
import matplotlib.pyplot as plt
import psutil
import torch
from IPython import get_ipython
from IPython.display import display

from course_utils import nvml, smi
from course_utils.flops import achieved, device_peak_flops, matmul_stream
from course_utils.nvml import Reading
from course_utils.units import MIB

SOURCES = ("nvml", "nvidia-smi", "cpu")
# --query-gpu fields the nvidia-smi fallback reads (index first)
SMI_QUERY = ("index", "utilization.gpu", "utilization.memory", "memory.used", "memory.total",
             "power.draw", "power.limit", "temperature.gpu", "clocks.sm", "pstate")  # fmt: skip


_THIS_PROCESS = psutil.Process()
_CORES = psutil.cpu_count() or 1


class _ProcessShare:
    """This process's share of all cores since the previous call, in % (0 to 100): its
    CPU clock (every thread, in nanoseconds) against the wall clock. psutil's per-process
    figure counts the kernel's 10 ms clock ticks: over a 20 ms sample one tick more reads
    as half a core too much, and a sampler delayed on a busy machine read over 200%."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = (time.perf_counter(), time.process_time())

    def __call__(self) -> float:
        with self._lock:
            wall, cpu = time.perf_counter(), time.process_time()
            (last_wall, last_cpu), self._last = self._last, (wall, cpu)
        if wall <= last_wall:
            return 0.0
        share = 100 * (cpu - last_cpu) / (wall - last_wall) / _CORES
        return min(100.0, max(0.0, share))  # the two clocks are read one after the other


_process_share = _ProcessShare()


def pick_source(gpu_index: int | None = 0) -> str:
    """The best source that answers here: ``"nvml"``, ``"nvidia-smi"`` or ``"cpu"``."""
    return next((s for s in SOURCES[:2] if sample(gpu_index, s).source == s), "cpu")


def sample(gpu_index: int | None = 0, source: str = "nvml") -> Reading:
    """One :class:`Reading` of GPU ``gpu_index`` (NVML numbering: :func:`nvml_index_of`
    maps a CUDA device) from ``source``, without the process list; the CPU's when the GPU
    does not answer (``cpu_util_pct`` over all cores since the previous call)."""
    if source not in SOURCES:
        raise ValueError(f"source={source!r}: use one of {', '.join(SOURCES)}")
    reading = None
    if source == "nvml" and gpu_index is not None:
        reading = nvml.snapshot(gpu_index, processes=False)
    elif source == "nvidia-smi" and gpu_index is not None:
        for gpu in smi.query_gpus(list(SMI_QUERY), timeout_s=5.0):
            if gpu.get("index") == gpu_index:
                values = {key: gpu[key] for key in map(smi.CSV_FIELDS.__getitem__, SMI_QUERY[1:])}
                reading = Reading(time.time(), "nvidia-smi", gpu_index, **values)
    return reading or Reading(
        time.time(),
        "cpu",
        cpu_util_pct=psutil.cpu_percent(interval=None),  # every process on the machine
        process_cpu_pct=_process_share(),  # this one
        process_rss_mib=_THIS_PROCESS.memory_info().rss / MIB,
    )


def describe(reading: Reading) -> str:
    """One line for a reading, as the live view shows it."""
    if not reading.on_gpu:
        return (
            f"CPU (no GPU): utilization {reading.cpu_util_pct or 0:.0f}% | "
            f"this process {reading.process_cpu_pct or 0:.0f}% of the cores, "
            f"{reading.process_rss_mib or 0:.0f} MiB"
        )

    def show(value: float | None, unit: str) -> str:
        return "N/A" if value is None else f"{value:.0f}{unit}"

    util = show(reading.utilization_gpu_pct, "%")
    if reading.utilization_gpu_pct is None and reading.mig_enabled:
        util = "N/A (MIG)"
    return (
        f"GPU {reading.gpu_index} ({reading.source}): util {util} | "
        f"memory {show(reading.memory_used_mib, '')}/{show(reading.memory_total_mib, ' MiB')} | "
        f"power {show(reading.power_draw_w, '')}/{show(reading.power_limit_w, ' W')} | "
        f"SM clock {show(reading.sm_clock_mhz, ' MHz')}"
    )


class LiveView:
    """Shows the latest reading: in a Jupyter kernel (or with ``widget=True``) in an
    ipywidgets ``HTML`` widget updated in place (ipywidgets 7 and 8 both have it),
    otherwise as a line through ``write`` at most every ``every_s`` seconds."""

    def __init__(
        self, every_s: float = 5.0, write: Callable[[str], None] = print, widget: bool | None = None
    ) -> None:
        self.every_s, self.write, self._last = every_s, write, -float("inf")
        if widget is None:
            widget = getattr(get_ipython(), "kernel", None) is not None
        self.widget = ipywidgets.HTML(value="<code>monitor starting…</code>") if widget else None
        if self.widget is not None:
            display(self.widget)

    def show(self, text: str, final: bool = False) -> None:
        """Show ``text`` (a ``final`` text is never skipped)."""
        if self.widget is not None:
            self.widget.value = f"<code>{text}</code>"
        elif final or time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            self.write(text)


class Monitor:
    """Sample GPU (or CPU) state every ``interval_s`` seconds in a background thread.

    >>> with Monitor(interval_s=0.05, gpu_index=None) as monitor:
    ...     time.sleep(0.2)
    >>> monitor.source, len(monitor.samples) >= 2
    ('cpu', True)

    ``source="auto"`` picks NVML, then nvidia-smi, then the CPU (:func:`pick_source`).
    ``live`` is ``False``, ``True`` (a :class:`LiveView`), or a :class:`LiveView`.
    Readings take time in the sampling thread, not in your loop; :attr:`busy_s` sums it.
    """

    def __init__(
        self,
        interval_s: float = 0.5,
        gpu_index: int | None = 0,
        source: str = "auto",
        live: bool | LiveView = False,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        if source != "auto" and source not in SOURCES:
            raise ValueError(f"source={source!r}: use 'auto' or one of {', '.join(SOURCES)}")
        self.interval_s = interval_s
        self.gpu_index = gpu_index
        self.source = "cpu" if gpu_index is None else source
        self.samples: list[Reading] = []
        self.busy_s = self.started_s = self.stopped_s = 0.0
        self._view = LiveView() if live is True else live or None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._session: Any = None

    def start(self) -> Monitor:
        """Start sampling (``with Monitor(...)`` calls this)."""
        if self._thread is not None:
            raise RuntimeError("this monitor is already running; create a new one")
        self._session = nvml.nvml_session()  # keep NVML initialized while sampling
        self._session.__enter__()
        if self.source == "auto":
            self.source = pick_source(self.gpu_index)
        if self.source == "cpu":
            sample(None, "cpu")  # the first call only sets the reference for the percentages
        self.started_s = time.time()
        self._thread = threading.Thread(target=self._run, name="course-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling, take one last reading, and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.stopped_s = time.time()
        if self._session is not None:
            self._session.__exit__(None, None, None)
            self._session = None
        if self._view is not None:  # the end, not the summary: a cell prints that once
            seconds = self.stopped_s - self.started_s
            self._view.show(
                f"{self._what()}: monitor stopped after {len(self.samples)} readings in "
                f"{seconds:.1f} s (summary_line() and timeline() show them)",
                final=True,
            )

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _take_reading(self) -> float:
        began = time.perf_counter()
        reading = sample(self.gpu_index, self.source)
        self.samples.append(reading)
        if self._view is not None:
            try:
                self._view.show(describe(reading))
            except Exception:  # a closed notebook view must not kill sampling
                self._view = None
        spent = time.perf_counter() - began
        self.busy_s += spent
        return spent

    def _run(self) -> None:
        while not self._stop.wait(max(0.0, self.interval_s - self._take_reading())):
            pass
        self._take_reading()  # the last reading, at stop: even a short run has two

    # -- results -----------------------------------------------------------------

    def series(self, key: str) -> list[Any]:
        """The values of field ``key`` over time (``None`` where not available)."""
        return [reading[key] for reading in self.samples]

    @property
    def utilization_key(self) -> str:
        """``process_cpu_pct`` on a CPU (other programs do not count), else GPU-Util."""
        return "process_cpu_pct" if self._is_cpu() else "utilization_gpu_pct"

    def _is_cpu(self) -> bool:
        return bool(self.samples) and not self.samples[-1].on_gpu

    def summary(self) -> dict[str, Any]:
        """``source``, ``samples``, ``seconds``, ``mean_util_pct`` and ``max_util_pct``
        (``None`` where not available, as under MIG), ``peak_memory_mib``, ``sampling_busy_s``."""
        util = [v for v in self.series(self.utilization_key) if v is not None]
        memory_key = "process_rss_mib" if self._is_cpu() else "memory_used_mib"
        memory = [v for v in self.series(memory_key) if v is not None]
        return {
            "source": self.samples[-1].source if self.samples else self.source,
            "samples": len(self.samples),
            "seconds": (self.stopped_s or time.time()) - self.started_s,
            "mean_util_pct": sum(util) / len(util) if util else None,
            "max_util_pct": max(util) if util else None,
            "peak_memory_mib": max(memory) if memory else None,
            "sampling_busy_s": self.busy_s,
        }

    def _what(self) -> str:
        source = self.samples[-1].source if self.samples else self.source
        return "CPU (no GPU)" if source == "cpu" else f"GPU {self.gpu_index} ({source})"

    def summary_line(self) -> str:
        """The summary in one line."""
        s = self.summary()
        what = self._what()
        util = "this process's share of the cores" if s["source"] == "cpu" else "GPU-Util"
        line = f"{what}: {s['samples']} samples in {s['seconds']:.1f} s"
        if s["mean_util_pct"] is None:
            mig = any(r.mig_enabled for r in self.samples)
            return line + (", GPU-Util not available under MIG" if mig else "")
        return (
            f"{line}, {util} mean {s['mean_util_pct']:.0f}% max {s['max_util_pct']:.0f}%, "
            f"peak memory {s['peak_memory_mib'] or 0:.0f} MiB"
        )

    def timeline(self, title: str | None = None) -> Any:
        """A matplotlib figure: utilization (top) and memory (bottom) against time; its
        default title says what was read, not the summary (a cell prints that once)."""
        start = self.samples[0].time_s if self.samples else 0.0
        times = [reading.time_s - start for reading in self.samples]
        cpu = self._is_cpu()
        figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 4))
        memory_key = "process_rss_mib" if cpu else "memory_used_mib"
        for axes, key in ((top, self.utilization_key), (bottom, memory_key)):
            values = [float("nan") if v is None else float(v) for v in self.series(key)]
            axes.plot(times, values, marker=".")
        top.set_ylabel("this process's CPU (%)" if cpu else "GPU-Util (%)")
        top.set_ylim(0, 105)
        bottom.set_ylabel("process RSS (MiB)" if cpu else "memory used (MiB)")
        bottom.set_xlabel("seconds")
        what = "this process's CPU and memory" if cpu else "GPU-Util and memory"
        figure.suptitle(title or f"{self._what()}: {what} against time", fontsize=9)
        figure.tight_layout()
        return figure


def utilization_experiment(
    device: Any,
    *,
    tiny_n: int = 32,
    large_n: int = 4096,
    seconds: float = 3.0,
    interval_s: float = 0.2,
    dtype: Any = None,
    spin: bool = True,
) -> list[dict[str, Any]]:
    """GPU-Util against useful work: a stream of tiny matmuls, one large matmul stream,
    and (on CUDA with ``spin=True``) one thread spinning in a single kernel.

    Each workload runs for about ``seconds`` under a :class:`Monitor`; a row holds its
    mean utilization (GPU-Util; on a CPU this process's share of all cores), achieved
    FLOP/s and MFU against ``peak_flops`` (:func:`~course_utils.flops.device_peak_flops`).
    """
    device = torch.device(device)
    dtype = dtype or (torch.float16 if device.type == "cuda" else torch.float32)
    peak = device_peak_flops(device, dtype)
    gpu_index = nvml_index_of(device)

    def matmuls(n: int) -> tuple[float, float]:
        count, elapsed = matmul_stream(device, n, seconds, dtype)
        return 2.0 * n**3 * count, elapsed

    workloads: list[tuple[str, Callable[[], tuple[float, float]]]] = [
        (f"tiny {tiny_n}x{tiny_n} matmuls", lambda: matmuls(tiny_n)),
        (f"large {large_n}x{large_n} matmuls", lambda: matmuls(large_n)),
    ]
    if spin and device.type == "cuda" and hasattr(torch.cuda, "_sleep"):
        workloads.append(
            ("one thread spinning (torch.cuda._sleep)", lambda: _spin(device, seconds))
        )
    rows = []
    for name, run in workloads:
        with Monitor(interval_s=interval_s, gpu_index=gpu_index) as monitor:
            flops, elapsed = run()
        util = [v for v in monitor.series(monitor.utilization_key)[1:] if v is not None]
        result = achieved(flops, elapsed, peak) if flops > 0 else None
        rows.append(
            {
                "workload": name,
                "source": monitor.summary()["source"],
                "mean_util_pct": sum(util) / len(util) if util else None,
                "achieved_flops_per_s": result.flops_per_s if result else 0.0,
                "mfu": result.mfu if result else 0.0,
                "seconds": elapsed,
                "peak_flops": peak,
            }
        )
    return rows


def _spin(device: Any, seconds: float) -> tuple[float, float]:
    """One thread spinning in a kernel on ``device`` (not the current device) for ``seconds``."""
    start = time.perf_counter()
    cycles = 50_000_000  # about 30 ms at 1.6 GHz: a kernel of one thread doing nothing useful
    with torch.cuda.device(device):
        while time.perf_counter() - start < seconds:
            torch.cuda._sleep(cycles)
            torch.cuda.synchronize(device)
    return 0.0, time.perf_counter() - start


def nvml_index_of(device: Any) -> int | None:
    """The NVML index of a CUDA ``device`` (``None`` for other devices): the GPU a
    :class:`Monitor` must read to watch ``device``.

    >>> nvml_index_of("cpu") is None
    True
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    index = device.index
    if index is None:  # the current device; without CUDA running, that is cuda:0
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    found = nvml.nvml_index(index)
    return index if found is None else found


def format_experiment(rows: list[dict[str, Any]]) -> str:
    """The experiment's rows as a small table.

    >>> print(format_experiment([{"workload": "w", "source": "cpu", "mean_util_pct": 50.0,
    ...     "achieved_flops_per_s": 2e9, "mfu": 0.1}]).splitlines()[1])
    w                                        cpu          50%        2.0 GFLOP/s   10.0%
    """
    lines = [f"{'workload':40} {'source':10} {'util':>5} {'achieved':>16} {'MFU':>7}"]
    for row in rows:
        util = "N/A" if row["mean_util_pct"] is None else f"{row['mean_util_pct']:.0f}%"
        lines.append(
            f"{row['workload']:40} {row['source']:10} {util:>5} "
            f"{row['achieved_flops_per_s'] / 1e9:>10.1f} GFLOP/s {row['mfu']:>7.1%}"
        )
    return "\n".join(lines)
