"""Batch size: the largest batch that fits in memory.

:func:`find_max_batch_size` calls ``trial(batch_size)`` (for example one training step at
that size) and finds the largest size that does not run out of memory: it doubles from
``low`` until a trial fails, then bisects between the last size that fitted and the first
that did not. With a true limit ``M`` it needs at most ``2 * ceil(log2(M)) + 2`` trials.
With ``isolate=True`` each trial runs in a fresh subprocess, so memory leaked or
fragmented by one trial cannot make the next one fail.

:func:`predict_max_batch_size` goes further when the memory of a step can be measured (a
GPU's allocator statistics): it measures two small batches, fits memory = fixed + per
sample x batch, predicts the limit for the memory available and confirms it with a few
trials around the prediction instead of doubling from 1.

:func:`batch_size_sweep` measures throughput, step time and peak memory for a range of
batch sizes and finds the knee: **the smallest batch size whose throughput reaches 90% of
the best measured throughput** (``knee_fraction``). Past the knee a larger batch costs
memory and buys almost no speed. Used by notebooks 03, 04 and 07.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import pickle
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from course_utils import progress
from course_utils.memory import error_summary, is_out_of_memory, release_memory


@dataclass(frozen=True)
class Trial:
    """One call of the trial function."""

    batch_size: int
    fits: bool
    seconds: float
    error: str | None = None  # the first line of the out-of-memory message


@dataclass
class MaxBatchSize:
    """The result of :func:`find_max_batch_size`.

    ``batch_size`` is the answer (after the margin; 0 when not even a batch of 1 fits),
    ``limit`` the largest size that fitted, ``trials`` how many times the trial ran.
    """

    batch_size: int
    limit: int
    trials: int
    history: list[Trial] = field(default_factory=list)
    capped: bool = False  # the search stopped at ``high`` without running out of memory
    predicted: int | None = None  # :func:`predict_max_batch_size`'s prediction, if any


def _child(trial: Callable[[int], Any], batch_size: int, results: Any) -> None:
    """Run one trial in a subprocess and send back ("ok" | "oom" | "error", message)."""
    try:
        trial(batch_size)
        results.send(("ok", ""))
    except BaseException as error:
        kind = "oom" if is_out_of_memory(error) else "error"
        results.send((kind, f"{type(error).__name__}: {error}"[:500]))


def _fresh_process_context() -> Any:
    """``forkserver`` where it exists (each trial is forked from a clean server process
    that has imported torch once: fresh, and fast to start), else ``spawn``."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["course_utils.batch"])
        return context
    return multiprocessing.get_context("spawn")


def run_isolated(trial: Callable[[int], Any], batch_size: int, timeout_s: float = 600.0) -> None:
    """Call ``trial(batch_size)`` in a fresh subprocess and raise what it raised:
    a ``RuntimeError`` saying "out of memory" when the trial ran out of memory or the
    process was killed by a signal (the Linux OOM killer sends SIGKILL), another
    ``RuntimeError`` for any other failure. The subprocess is forked from a clean
    ``forkserver`` process (which never ran a trial) or, where there is none, spawned.
    ``trial`` must be picklable (defined at the
    top level of a module, or a ``functools.partial`` of such a function).
    """
    try:
        pickle.dumps(trial)
    except Exception as error:
        raise TypeError(
            f"isolate=True needs a picklable trial (a module-level function): {error}"
        ) from None
    context = _fresh_process_context()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(trial, batch_size, send), daemon=True)
    process.start()
    send.close()
    outcome: tuple[str, str] | None = None
    if receive.poll(timeout_s):
        try:
            outcome = receive.recv()
        except EOFError:  # the child died before answering
            outcome = None
    process.join(5 if outcome else timeout_s)
    if process.is_alive():
        process.kill()
        process.join()
    if outcome is None:
        code = process.exitcode
        if code is not None and code < 0:
            raise RuntimeError(
                f"out of memory (assumed): the trial's process was killed by signal {-code}"
            )
        raise RuntimeError(f"the trial's process exited with code {code} without an answer")
    kind, message = outcome
    if kind == "oom":
        raise RuntimeError(f"out of memory in the trial's subprocess: {message}")
    if kind == "error":
        raise RuntimeError(f"the trial failed in its subprocess: {message}")


def _attempt(
    trial: Callable[[int], Any], batch_size: int, history: list[Trial], isolate: bool = False
) -> bool:
    start = time.perf_counter()
    message = None
    try:
        if isolate:
            run_isolated(trial, batch_size)
        else:
            trial(batch_size)
        fits = True
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        fits = False
        message = error_summary(error)
        # the exception's traceback refers to the frames that hold the big tensors:
        # drop it before freeing (Python deletes ``error`` at the end of this block).
    if not fits:  # a fitting trial's tensors die when it returns; a failed one's may sit
        release_memory()  # in reference cycles with the traceback, and in the GPU cache
    history.append(Trial(batch_size, fits, time.perf_counter() - start, message))
    progress.tick()
    return fits


@progress.tracked("largest batch size", unit="trial")
def find_max_batch_size(
    trial: Callable[[int], Any],
    *,
    low: int = 1,
    high: int | None = None,
    margin: float = 0.0,
    isolate: bool = False,
) -> MaxBatchSize:
    """The largest ``batch_size`` for which ``trial(batch_size)`` does not run out of memory.

    Out of memory means ``torch.cuda.OutOfMemoryError`` or a ``RuntimeError`` whose
    message says so (CUDA or the CPU allocator); any other exception is raised again.
    Memory is freed after each failed trial (``gc.collect()`` and ``empty_cache()``).
    ``high`` caps the search; ``margin`` (0 to <1) returns that fraction less than the
    limit found, leaving room for fragmentation and for other processes. ``isolate=True``
    runs each trial in a fresh subprocess (:func:`run_isolated`; seconds per trial).

    >>> def trial(n):
    ...     if n > 100:
    ...         raise RuntimeError("CUDA out of memory (simulated)")
    >>> found = find_max_batch_size(trial)
    >>> found.batch_size, found.trials
    (100, 14)
    >>> find_max_batch_size(trial, margin=0.1).batch_size
    90
    """
    if low < 1:
        raise ValueError(f"low must be at least 1, got {low}")
    if high is not None and high < low:
        raise ValueError(f"high ({high}) must be at least low ({low})")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    history: list[Trial] = []
    good, bad = 0, None  # largest size known to fit; smallest known not to fit
    size = low
    while True:  # grow by doubling
        if high is not None:
            size = min(size, high)
        if _attempt(trial, size, history, isolate):
            good = size
            if high is not None and size >= high:
                break
            size *= 2
        else:
            bad = size
            break
    return _bisect(trial, good, bad, history, margin, isolate=isolate)


def _bisect(
    trial: Callable[[int], Any],
    good: int,
    bad: int | None,
    history: list[Trial],
    margin: float,
    *,
    isolate: bool = False,
    predicted: int | None = None,
) -> MaxBatchSize:
    """Bisect between the largest size that fitted (``good``) and the smallest that did
    not (``bad``; ``None`` when the search was capped), then build the result."""
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        if _attempt(trial, middle, history, isolate):
            good = middle
        else:
            bad = middle
    return MaxBatchSize(
        batch_size=_with_margin(good, margin),
        limit=good,
        trials=len(history),
        history=history,
        capped=bad is None,
        predicted=predicted,
    )


def _with_margin(good: int, margin: float) -> int:
    return good if margin == 0 else max(1 if good else 0, math.floor(good * (1 - margin)))


# ----------------------------------------------------------- predict, then confirm


@progress.tracked("largest batch size", unit="trial")
def predict_max_batch_size(
    trial: Callable[[int], Any],
    memory_of: Callable[[int], int],
    budget_bytes: int,
    *,
    probes: tuple[int, int] = (2, 4),
    low: int = 1,
    high: int | None = None,
    margin: float = 0.0,
) -> MaxBatchSize:
    """Predict the largest batch from measured memory, then confirm it with a few trials.

    ``memory_of(n)`` runs a step at batch size ``n`` and returns its peak memory in bytes,
    measured after a warm-up step at that size so that one-time allocations do not count
    (:meth:`TrainTrial.peak_bytes`, or on a GPU
    ``footprint.peak_memory(lambda: trial(n), device, warmup=1).peak_bytes``). It is
    called at the two ``probes``; a straight line through them (fixed bytes + bytes per
    sample x n) gives the batch size that fills ``budget_bytes``. The prediction is then
    confirmed by exponential search around it (+1, +2, +4, ... while trials fit, or -1,
    -2, -4, ... while they do not) and bisection: when memory really grows linearly the
    answer takes 4 or 5 calls instead of about ``2 log2(M)``. The two probes count as trials.
    ``low`` is where a search starts when it has to fall back to
    :func:`find_max_batch_size` (2 for a model with BatchNorm: see
    :attr:`TrainTrial.min_batch_size`), and the smallest prediction.

    On a GPU a convolution's memory is not quite a straight line: cuDNN picks an algorithm
    for each input shape, and the workspace it allocates during the call can differ by
    tens of MiB between neighbouring batch sizes. The prediction is then off, and the
    confirming trials correct it (a network of ``Linear`` layers is close to linear).

    >>> limit = lambda n: 1000 + 300 * n           # bytes a step at batch n needs
    >>> def trial(n):
    ...     if limit(n) > 100_000:
    ...         raise RuntimeError("out of memory (simulated)")
    >>> found = predict_max_batch_size(trial, limit, 100_000)
    >>> found.batch_size, found.predicted, found.trials
    (330, 330, 4)
    """
    small, large = sorted(probes)
    if small < 1 or large <= small:
        raise ValueError(f"probes must be two different sizes >= 1, got {probes}")
    history: list[Trial] = []
    measured = []
    for size in (small, large):
        start = time.perf_counter()
        try:
            measured.append(memory_of(size))
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            release_memory()  # even the probes do not fit: search below them
            progress.tick()
            fallback = find_max_batch_size(
                trial, low=min(low, max(1, size - 1)), high=max(1, size - 1), margin=margin
            )
            fallback.history[:0] = [*history, Trial(size, False, time.perf_counter() - start)]
            fallback.trials = len(fallback.history)
            return fallback
        history.append(Trial(size, True, time.perf_counter() - start))
        progress.tick()
    per_sample = (measured[1] - measured[0]) / (large - small)
    if per_sample <= 0:  # memory does not grow with the batch: nothing to extrapolate
        found = find_max_batch_size(trial, low=max(low, large), high=high, margin=margin)
        found.history[:0] = history
        found.trials = len(found.history)
        return found
    fixed = measured[0] - per_sample * small
    predicted = max(low, math.floor((budget_bytes - fixed) / per_sample))
    if high is not None:
        predicted = min(predicted, high)
    good, bad = 0, None  # trust only trials: the probes may have run differently
    if _attempt(trial, predicted, history):
        good, step = predicted, 1
        while high is None or good < high:  # gallop upwards until a trial fails
            size = good + step if high is None else min(good + step, high)
            if _attempt(trial, size, history):
                good, step = size, step * 2
            else:
                bad = size
                break
    else:
        bad, step = predicted, 1
        while bad - step > good:  # gallop downwards until a trial fits
            size = bad - step
            if _attempt(trial, size, history):
                good = size
                break
            bad, step = size, step * 2
    return _bisect(trial, good, bad, history, margin, predicted=predicted)


def cuda_memory_budget(device: torch.device | str) -> int:
    """Bytes a step on a CUDA ``device`` can still use: free device memory plus the
    blocks PyTorch's caching allocator holds but does not use."""
    device = torch.device(device)
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + cached)


# ------------------------------------------------------------------- a real trial


class TrainTrial:
    """One training step of a course model at a given batch size: a picklable trial.

    ``TrainTrial("small_cnn")(64)`` builds the model on first use (kept for later
    calls, not pickled), makes a random CIFAR-shaped batch of 64 on the device and runs
    one :class:`~course_utils.training.TrainStep`. With ``budget_bytes`` it imposes a
    memory budget and raises ``RuntimeError("out of memory ...")`` beyond it, as a real
    allocator would: on the CPU as soon as the bytes saved for backward exceed it
    (mid-forward, :func:`~course_utils.footprint.saved_tensor_bytes`); on a GPU when the
    allocator peak of the step does, measured after an unmeasured warm-up step at the
    same size (so one-time allocations such as cuBLAS workspaces never count). That is
    exactly :meth:`peak_bytes`: measure a budget with it and the trial compares like with
    like. ``last_peak_bytes`` keeps the last measured peak of a step that fitted.

    >>> trial = TrainTrial("mlp", budget_bytes=2**24)
    >>> trial(1) is None, trial.last_peak_bytes > 0
    (True, True)
    >>> trial.peak_bytes(1) == trial.last_peak_bytes, trial.min_batch_size
    (True, 1)
    """

    def __init__(
        self,
        model_name: str = "small_cnn",
        device: str = "cpu",
        *,
        budget_bytes: int | None = None,
        image_size: int = 32,
        num_classes: int = 10,
        precision: str = "fp32",
        model_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.device = device
        self.budget_bytes = budget_bytes
        self.image_size = image_size
        self.num_classes = num_classes
        self.precision = precision
        self.model_kwargs = dict(model_kwargs or {})
        self.last_peak_bytes = 0
        self._step: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_step"] = None  # a subprocess builds its own model
        return state

    def step(self) -> Any:
        """The :class:`~course_utils.training.TrainStep` (built on first use)."""
        if self._step is None:
            from course_utils.models import build_model
            from course_utils.training import TrainConfig, TrainStep

            torch.manual_seed(0)
            model = build_model(self.model_name, num_classes=self.num_classes, **self.model_kwargs)
            self._step = TrainStep(model, self.device, TrainConfig(precision=self.precision))
        return self._step

    @property
    def min_batch_size(self) -> int:
        """2 when the model has a BatchNorm layer, else 1. In training mode BatchNorm needs
        more than one value per channel: a batch of 1 raises ``ValueError`` where a layer
        sees a 1 x 1 image (the end of ResNet-18 on 32 x 32 inputs). Start batch-size
        searches here: ``find_max_batch_size(trial, low=trial.min_batch_size)``
        (Lightning's finder starts at 2 for the same reason)."""
        nn = torch.nn
        norms = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
        return 2 if any(isinstance(m, norms) for m in self.step().model.modules()) else 1

    def peak_bytes(self, batch_size: int) -> int:
        """The memory of one step at ``batch_size``, measured as the budget check does:
        on a GPU the allocator peak (:func:`~course_utils.footprint.peak_memory`) of a
        step after an unmeasured warm-up step at that size; on the CPU the bytes saved
        for backward. Use it as ``memory_of`` for :func:`predict_max_batch_size`."""
        from course_utils.footprint import peak_memory, saved_tensor_bytes

        step = self.step()

        def run() -> None:
            step(self.batch(batch_size))

        if torch.device(self.device).type != "cuda":
            return saved_tensor_bytes(run)[1]
        return peak_memory(run, self.device, warmup=1).peak_bytes

    def batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (batch_size, 3, self.image_size, self.image_size)
        inputs = torch.randn(shape, device=self.device)
        return inputs, torch.randint(0, self.num_classes, (batch_size,), device=self.device)

    def __call__(self, batch_size: int) -> None:
        from course_utils.footprint import budget_exceeded_message, saved_tensor_bytes

        step = self.step()
        if self.budget_bytes is None:
            step(self.batch(batch_size))
            return
        device_type = torch.device(self.device).type
        if device_type != "cuda":  # fail mid-forward, as an allocator does
            _, peak = saved_tensor_bytes(
                lambda: step(self.batch(batch_size)), limit_bytes=self.budget_bytes
            )
        else:
            peak = self.peak_bytes(batch_size)
        if peak > self.budget_bytes:
            raise RuntimeError(budget_exceeded_message(self.budget_bytes, device_type))
        self.last_peak_bytes = peak


# ------------------------------------------------------------------------- sweep


@dataclass(frozen=True)
class SweepRow:
    """One batch size of :func:`batch_size_sweep`."""

    batch_size: int
    step_s: float  # median seconds per step (0 when out of memory)
    samples_per_s: float
    peak_bytes: int
    out_of_memory: bool = False
    error: str | None = None
    cpu_step_s: float = 0.0  # this process's CPU seconds per step (mean of the timed calls)

    @property
    def cpu_samples_per_s(self) -> float:
        """Samples per CPU-second of this process: on a CPU device, the throughput of the
        time the cores really spent on the step (wall time on a shared machine also
        counts other processes' turns). Not the device's time on a GPU."""
        return self.batch_size / self.cpu_step_s if self.cpu_step_s > 0 else 0.0


@dataclass
class BatchSweep:
    """The result of :func:`batch_size_sweep`: one row per batch size tried."""

    rows: list[SweepRow]
    memory_method: str
    device: str
    knee_fraction: float = 0.9

    @property
    def fitted(self) -> list[SweepRow]:
        return [row for row in self.rows if not row.out_of_memory]

    @property
    def best(self) -> SweepRow | None:
        """The row with the highest throughput."""
        return max(self.fitted, key=lambda row: row.samples_per_s, default=None)

    def knee(self, fraction: float | None = None) -> SweepRow | None:
        """The smallest batch size whose throughput reaches ``fraction`` (default
        ``knee_fraction``, 0.9) of the best measured throughput."""
        best = self.best
        if best is None:
            return None
        target = (self.knee_fraction if fraction is None else fraction) * best.samples_per_s
        return min(
            (row for row in self.fitted if row.samples_per_s >= target),
            key=lambda row: row.batch_size,
        )

    def table(self) -> list[dict[str, Any]]:
        """The rows as dictionaries (memory in MiB), for printing or JSON."""
        return [
            {
                "batch_size": row.batch_size,
                "step_ms": round(row.step_s * 1e3, 3),
                "samples_per_s": round(row.samples_per_s, 1),
                "peak_mib": round(row.peak_bytes / 2**20, 2),
                "out_of_memory": row.out_of_memory,
            }
            for row in self.rows
        ]

    def __str__(self) -> str:
        lines = [f"{'batch':>6} {'step ms':>9} {'samples/s':>10} {'peak MiB':>9}"]
        for row in self.rows:
            if row.out_of_memory:
                lines.append(f"{row.batch_size:>6} {'out of memory':>30}")
            else:
                lines.append(
                    f"{row.batch_size:>6} {row.step_s * 1e3:>9.2f} {row.samples_per_s:>10.1f} "
                    f"{row.peak_bytes / 2**20:>9.2f}"
                )
        knee = self.knee()
        if knee is not None:
            lines.append(
                f"knee: batch {knee.batch_size} (smallest reaching "
                f"{self.knee_fraction:.0%} of the best throughput); memory: {self.memory_method}"
            )
        return "\n".join(lines)

    def plot(self, title: str = "") -> Any:
        """Throughput and peak memory against batch size (log2 axis), knee marked.
        Returns the matplotlib figure."""
        import matplotlib.pyplot as plt

        rows = self.fitted
        sizes = [row.batch_size for row in rows]
        figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
        left.plot(sizes, [row.samples_per_s for row in rows], "o-")
        left.set_ylabel("throughput (samples/s)")
        right.plot(sizes, [row.peak_bytes / 2**20 for row in rows], "s-", color="tab:orange")
        right.set_ylabel("peak memory (MiB)")
        right.set_title(self.memory_method, fontsize=8)
        knee = self.knee()
        for axis in (left, right):
            axis.set_xscale("log", base=2)
            axis.set_xlabel("batch size")
            axis.grid(alpha=0.3)
            if knee is not None:
                axis.axvline(knee.batch_size, color="gray", linestyle="--", label="knee")
        if knee is not None:
            left.legend([f"measured ({self.device})", f"knee: {knee.batch_size}"])
        for row in self.rows:
            if row.out_of_memory:
                right.axvline(row.batch_size, color="red", linestyle=":", label="out of memory")
        figure.suptitle(title or f"batch-size sweep on {self.device}")
        figure.tight_layout()
        return figure


def powers_of_two(low: int = 1, high: int = 4096) -> list[int]:
    """``low``, ``2 low``, ``4 low``, ... up to ``high``.

    >>> powers_of_two(4, 40)
    [4, 8, 16, 32]
    """
    sizes = []
    size = low
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes


def batch_size_sweep(
    trial: Callable[[int], Any],
    sizes: Sequence[int] | Iterable[int] | None = None,
    device: torch.device | str = "cpu",
    *,
    repeats: int = 3,
    warmup: int = 1,
    budget_bytes: int | None = None,
    time_limit_s: float | None = None,
    knee_fraction: float = 0.9,
) -> BatchSweep:
    """Time ``trial(batch_size)`` and measure its peak memory for each size in ``sizes``
    (default: powers of two up to 4096), stopping at the first out-of-memory error.

    For each size: an unmeasured warm-up call, then one call measured with
    :func:`~course_utils.footprint.peak_memory` (``warmup=1``), then
    :func:`~course_utils.timing.benchmark` times ``repeats`` synchronized calls after
    ``warmup`` more. The peak is what one step at that size needs once everything made
    once has been made: on CUDA the allocator's peak during the step above the memory
    allocated before it (the batch, activations, gradients, temporaries and per-call
    cuDNN workspaces; not the parameters, the optimizer state or the cuBLAS workspaces
    that the first step of a process allocates and keeps); on the CPU the bytes saved for
    backward, which is what grows with the batch. ``budget_bytes`` treats a peak above it
    as out of memory (a memory limit imposed on the CPU); ``time_limit_s`` stops before a
    size (not the first) once the sweep has run that long. Throughput is
    ``batch_size / median step time``; ``cpu_step_s`` is this process's CPU time per
    call (``time.process_time``, all threads) over the warm-up and timed calls.

    >>> sweep = batch_size_sweep(lambda n: torch.ones(n, 8).sum(), [1, 2, 4], repeats=2)
    >>> [row.batch_size for row in sweep.rows], sweep.knee() is not None
    ([1, 2, 4], True)
    """
    from course_utils.footprint import budget_exceeded_message, peak_memory
    from course_utils.timing import benchmark

    device = torch.device(device)
    rows: list[SweepRow] = []
    method = ""
    started = time.perf_counter()
    sizes = powers_of_two() if sizes is None else sizes
    for size in progress.track(sizes, "batch-size sweep", unit="size"):
        if rows and time_limit_s is not None and time.perf_counter() - started > time_limit_s:
            break
        try:
            run = functools.partial(trial, size)
            peak = peak_memory(run, device, warmup=1)
            method = peak.method
            if budget_bytes is not None and peak.peak_bytes > budget_bytes:
                raise RuntimeError(budget_exceeded_message(budget_bytes, device.type))
            cpu_start = time.process_time()
            timing = benchmark(run, device=device, warmup=warmup, repeats=repeats)
            cpu_step_s = (time.process_time() - cpu_start) / (warmup + repeats)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            message = error_summary(error)
            rows.append(SweepRow(size, 0.0, 0.0, 0, out_of_memory=True, error=message))
            release_memory()
            break
        step_s = timing.median_s
        rows.append(SweepRow(size, step_s, size / step_s, peak.peak_bytes, cpu_step_s=cpu_step_s))
    return BatchSweep(rows, method, str(device), knee_fraction)


# ------------------------------------------------------- the peers, for comparison


def lightning_scale_batch_size(
    trial: Callable[[int], Any],
    mode: str = "power",
    *,
    init_val: int = 2,
    max_trials: int = 25,
    max_val: int = 8192,
    margin: float = 0.05,
) -> MaxBatchSize:
    """PyTorch Lightning's batch-size finder, on a plain ``trial`` function.

    A faithful reproduction of ``_run_power_scaling`` and ``_run_binsearch_scaling`` in
    ``lightning/pytorch/tuner/batch_size_scaling.py`` (lightning 2.6), with its defaults
    (``init_val=2``, ``max_trials=25``, ``max_val=8192``, ``margin=0.05`` applied in
    ``"binsearch"`` mode only). Where Lightning runs ``steps_per_trial`` (default 3)
    training steps of its Trainer, this calls ``trial(batch_size)`` once; the check that
    the batch size stays below the dataset's length is left out. ``trials`` counts calls.

    >>> def trial(n):
    ...     if n > 100:
    ...         raise RuntimeError("CUDA out of memory (simulated)")
    >>> lightning_scale_batch_size(trial, "power").batch_size
    64
    >>> lightning_scale_batch_size(trial, "binsearch").batch_size  # 100, less the margin
    95
    """
    if mode not in ("power", "binsearch"):
        raise ValueError(f"mode={mode!r}: use 'power' or 'binsearch'")
    history: list[Trial] = []
    new_size = init_val
    last_successful_size = new_size
    if mode == "power":
        any_success = False
        for i in range(max_trials):
            if new_size >= max_val:
                break
            if _attempt(trial, new_size, history):
                last_successful_size = new_size
                if i + 1 >= max_trials:
                    new_size = last_successful_size
                    break
                new_size = min(int(new_size * 2.0), max_val)
                any_success = True
            else:
                new_size = int(new_size * 0.5)
                if any_success:
                    break
        found = new_size
    else:
        low, high, count = 1, None, 0
        while True:
            if new_size >= max_val:
                break
            if _attempt(trial, new_size, history):
                last_successful_size = new_size
                count += 1
                if count >= max_trials:
                    new_size = last_successful_size
                    break
                low = new_size
                if high:
                    if high - low <= 1:
                        break
                    changed_to = (high + low) // 2
                else:
                    changed_to = int(new_size * 2.0)
                changed_to = min(changed_to, max_val)
                if changed_to == new_size:
                    break
                new_size = changed_to
            else:
                high = new_size
                new_size = (high + low) // 2
                if high - low <= 1:
                    break
        found = new_size
        if margin > 0:
            found = max(1, int(found * (1 - margin)))
    limit = max((t.batch_size for t in history if t.fits), default=0)
    return MaxBatchSize(
        batch_size=found, limit=limit, trials=len(history), history=history, capped=False
    )


def accelerate_find_batch_size(
    trial: Callable[[int], Any], starting_batch_size: int = 128
) -> MaxBatchSize:
    """Hugging Face accelerate's ``find_executable_batch_size`` (the real function, from
    ``accelerate.utils``): start at ``starting_batch_size`` and multiply by 0.9 after each
    out-of-memory error. It never grows: a start below the limit is returned as is.
    Needs ``accelerate`` (a development dependency of the course).
    """
    from accelerate.utils import find_executable_batch_size

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


# --------------------------------------------------- effective batch and learning rate


def scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """The linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD"):
    multiply the learning rate by the factor the batch grows by.

    >>> scaled_lr(0.1, 32, 128)
    0.4
    """
    return base_lr * batch / base_batch


def train_accumulated(
    dataset: Any,
    *,
    micro_batch: int,
    accumulation_steps: int = 1,
    lr: float = 0.05,
    optimizer_steps: int = 20,
    model_name: str = "small_cnn",
    model_kwargs: dict[str, Any] | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Any:
    """Train a fresh model (seeded) with an effective batch of ``micro_batch x
    accumulation_steps`` for ``optimizer_steps`` steps, through
    :class:`~course_utils.training.TrainStep` (``TrainConfig.accumulation_steps``) and
    :func:`~course_utils.training.train`; returns the :class:`TrainResult` (a loss per
    optimizer step). The data order is fixed by ``seed``, so runs differ only in the
    batch and the learning rate. Only ``micro_batch`` samples are in memory at once.
    """
    from torch.utils.data import DataLoader

    from course_utils.models import build_model
    from course_utils.training import TrainConfig, TrainStep, train

    torch.manual_seed(seed)
    model = build_model(model_name, **(model_kwargs or {}))
    config = TrainConfig(precision="fp32", accumulation_steps=accumulation_steps, lr=lr)
    step = TrainStep(model, device, config)
    batch = micro_batch * accumulation_steps
    loader = DataLoader(
        dataset, batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    epochs = math.ceil(optimizer_steps * batch / len(dataset))
    return train(step, loader, max_steps=optimizer_steps, epochs=max(1, epochs))
