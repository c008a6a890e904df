"""The capstone: measure a training loop, fix its habits, measure again. A loop builds its
own DataLoader and optimizer and iterates ``for inputs, targets in timed(loader)``. A
:class:`Recipe` is the lesson's slow loop with each habit a knob (on a CPU the GPU-only
knobs change nothing)."""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import psutil
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from course_utils.data import EncodedImages, PreDecodedImages, augment_on_device
from course_utils.feedback import plain_value
from course_utils.models import build_model
from course_utils.monitor import Reading, nvml_index_of, sample
from course_utils.profiling import LoopProfile, StepProfiler
from course_utils.spies import TensorMove, record_tensor_to
from course_utils.timing import synchronizer, time_in_turns
from course_utils.training import TrainConfig, TrainStep

#: A training loop to measure: ``loop(data, model, device, timed) -> losses``.
Loop = Callable[[EncodedImages, torch.nn.Module, torch.device, Callable[[Any], Any]], Any]


@dataclass(frozen=True)
class Recipe:
    """The knobs of the capstone's loop. ``decode="once"``: decode before training, augment
    on the device; ``whole_batches=True`` (with ``decode="once"``): each batch is one
    indexing of the decoded tensor (a ``BatchSampler``, no per-sample ``__getitem__`` and
    collate); ``precision="auto"``: fp16 with a scaler on a T4, bf16 from Ampere on."""

    decode: str = "per-sample"
    num_workers: int = 0
    batch_size: int = 8
    pin_memory: bool = False
    precision: str = "fp32"
    item_every_step: bool = True
    empty_cache_every_step: bool = True
    whole_batches: bool = False

    def __post_init__(self) -> None:
        if self.decode not in ("per-sample", "once"):
            raise ValueError(f"decode={self.decode!r}: use 'per-sample' or 'once'")
        if self.batch_size < 1 or self.num_workers < 0:
            raise ValueError("batch_size must be at least 1 and num_workers at least 0")
        if self.whole_batches and self.decode != "once":
            raise ValueError("whole_batches=True indexes the decoded tensor: use decode='once'")

    def changed(self, **knobs: Any) -> Recipe:
        """A copy with some knobs changed: ``SLOW.changed(batch_size=64)``."""
        return replace(self, **knobs)

    def as_run_on(self, device: torch.device | str) -> Recipe:
        """The recipe as it runs on ``device``: off CUDA the GPU-only knobs do nothing
        (no pinning, no ``empty_cache``, ``precision="auto"`` is fp32 there, and a
        ``.item()`` waits for no device), so two recipes that differ only in them do the
        same work there and need not be measured twice.

        >>> SLOW.as_run_on("cpu") == SLOW.changed(pin_memory=True).as_run_on("cpu")
        True
        >>> SLOW.as_run_on("cuda") == SLOW.changed(pin_memory=True).as_run_on("cuda")
        False
        """
        kind = torch.device(device).type
        if kind == "cuda":
            return self
        return replace(
            self,
            pin_memory=False,
            precision="fp32" if self.precision == "auto" else self.precision,
            item_every_step=self.item_every_step and kind != "cpu",  # MPS: .item() waits
            empty_cache_every_step=False,
        )

    def loop(
        self,
        data: EncodedImages,
        model: torch.nn.Module,
        device: torch.device,
        timed: Callable[[Any], Any],
    ) -> list[torch.Tensor]:
        """The training loop this recipe describes (a :data:`Loop`)."""
        dataset: Dataset[Any] = (
            PreDecodedImages.from_encoded(data) if self.decode == "once" else data
        )
        shuffled = torch.Generator().manual_seed(0)
        batching: dict[str, Any] = {
            "batch_size": self.batch_size,
            "shuffle": True,
            "drop_last": True,
            "generator": shuffled,
        }
        if self.whole_batches:  # one index list per batch: dataset[indices] is the batch
            sampler = RandomSampler(dataset, generator=shuffled)  # type: ignore[arg-type]
            batching = {
                "batch_size": None,
                "sampler": BatchSampler(sampler, self.batch_size, drop_last=True),
            }
        loader = DataLoader(
            dataset,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory and device.type == "cuda",
            persistent_workers=self.num_workers > 0,
            **batching,
        )
        if len(loader) == 0:
            raise ValueError(f"{len(data)} images make no batch of {self.batch_size}")
        step = TrainStep(model, device, TrainConfig(precision=self.precision))
        losses = []
        for inputs, targets in timed(loader):
            if self.decode == "once":
                inputs = augment_on_device(
                    inputs.to(device, non_blocking=self.pin_memory and device.type == "cuda"),
                    data.image_size,
                )
            loss = step((inputs, targets))
            if self.item_every_step:
                loss.item()  # the habit under test: the CPU waits for the device here
            if self.empty_cache_every_step and device.type == "cuda":
                torch.cuda.empty_cache()
            losses.append(loss.detach())
        return losses


#: The deliberately slow starting point of the capstone.
SLOW = Recipe()


def largest_phase(profile: LoopProfile) -> str:
    """``"data"``, ``"copy"`` or ``"compute"``: where most of the step time went.

    >>> largest_phase(LoopProfile(num_steps=1, data_s=0.3, copy_s=0.01, compute_s=0.1))
    'data'
    """
    phases = {"data": profile.data_s, "copy": profile.copy_s, "compute": profile.compute_s}
    return max(phases, key=lambda name: phases[name])


def children_cpu_s() -> float:
    """CPU time (user + system) of every child process of this one so far: those already
    waited for (``RUSAGE_CHILDREN``: DataLoader workers that exited) plus those still
    running (read through psutil). The difference of two readings is what the children
    spent in between, whether they exited in between or not."""
    total = 0.0
    with contextlib.suppress(ImportError):
        import resource  # lazy: POSIX only (no such module on Windows)

        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += reaped.ru_utime + reaped.ru_stime
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # it exited while we looked
            times = child.cpu_times()
            total += times.user + times.system
    return total


@dataclass
class LoopRun:
    """What :func:`run_loop` measured for one training loop. ``profile`` covers the steps
    after the warm-up step; ``samples_per_s`` adds the loop's set-up before its first
    batch (``setup_s``: decoding once, say), so that no fix is credited for work done
    before the clock starts. The warm-up step's one-time costs count for no loop.

    CPU time counts every process the loop causes: this one (``setup_cpu_s``,
    ``profile.cpu_s``) and its children, DataLoader workers included
    (``setup_children_cpu_s``, ``children_cpu_s``: from the end of the warm-up step)."""

    name: str
    profile: LoopProfile
    losses: list[float]
    loss_before: float  # mean loss on a fixed batch of the training images, before ...
    loss_after: float  # ... and after the loop
    item_calls: int  # the loss read on the host: ``.item()``, ``float()``, ``.tolist()``
    empty_cache_calls: int
    monitor: Reading  # read at the end: GPU-Util, or CPU utilization during the run
    unmoved_labels: int = 0  # batches whose inputs the loop moved with .to, not labels
    unmoved_inputs: int = 0  # batches whose labels the loop moved with .to, not inputs
    setup_s: float = 0.0  # from the call of the loop to its first batch (e.g. decoding)
    setup_cpu_s: float = 0.0  # this process's CPU time in the set-up
    epoch_samples: int = 0  # the samples in one epoch (the dataset's length)
    setup_children_cpu_s: float = 0.0  # child processes' CPU time in the set-up
    children_cpu_s: float = 0.0  # child processes' CPU time in the measured steps

    @property
    def total_s(self) -> float:
        """The set-up plus the measured steps."""
        return self.setup_s + self.profile.wall_s

    @property
    def samples_per_s(self) -> float:
        """End-to-end throughput of the measured steps, the set-up included."""
        return self.profile.samples / self.total_s if self.total_s > 0 else 0.0

    @property
    def steps_cpu_s(self) -> float:
        """CPU time of the measured steps, in this process and its children."""
        return self.profile.cpu_s + self.children_cpu_s

    @property
    def total_cpu_s(self) -> float:
        """CPU time of the set-up and the measured steps, children included."""
        return self.setup_cpu_s + self.setup_children_cpu_s + self.steps_cpu_s

    @property
    def samples_per_cpu_s(self) -> float:
        """The same per second of CPU time of every process the loop ran (its DataLoader
        workers too): on a CPU device, a rate that other processes on a busy machine hardly
        change, and that work moved to another process does not flatter."""
        cpu_s = self.total_cpu_s
        return self.profile.samples / cpu_s if cpu_s > 0 else 0.0

    @property
    def on_cpu(self) -> bool:
        return self.profile.device.startswith("cpu")

    def rate(self) -> float:
        """The rate to compare loops by, end to end (the set-up included):
        :attr:`samples_per_s` on a GPU, :attr:`samples_per_cpu_s` on a CPU (where other
        processes would slow the clock)."""
        return self.samples_per_cpu_s if self.on_cpu else self.samples_per_s

    def steps_rate(self) -> float:
        """The rate of the measured steps alone, for two loops whose set-up is the same
        work (both decode once): samples per second of wall time on a GPU, per CPU-second
        of every process the loop ran on a CPU."""
        seconds = self.steps_cpu_s if self.on_cpu else self.profile.wall_s
        return self.profile.samples / seconds if seconds > 0 else 0.0

    @property
    def epochs(self) -> float:
        """Epochs in the measured steps."""
        return self.profile.samples / self.epoch_samples if self.epoch_samples else 0.0

    @property
    def steps(self) -> int:
        """Steps the loop ran, the warm-up included."""
        return self.profile.num_steps + 1


def break_even_epoch(slow: LoopRun, fast: LoopRun) -> int | None:
    """The first epoch after which ``fast`` has spent less time in all than ``slow``: its
    extra set-up (``setup_s``, e.g. decoding once) against the time it saves per epoch
    (from each run's steps after the warm-up). ``None`` if it saves nothing per epoch. On a
    CPU both are CPU time of every process the loop ran, as in :meth:`LoopRun.rate`.

    >>> def run(setup_s, samples_per_s, children_s=0.0):
    ...     profile = LoopProfile(num_steps=1, samples=int(samples_per_s), wall_s=1.0, cpu_s=1.0)
    ...     return LoopRun("loop", profile, [], 0.0, 0.0, 0, 0, {}, setup_s=setup_s,
    ...                    setup_cpu_s=setup_s, epoch_samples=100, children_cpu_s=children_s)
    >>> break_even_epoch(run(0.0, 100), run(1.5, 200))  # 1 s per epoch against 0.5 s
    3
    >>> break_even_epoch(run(0.0, 100), run(0.5, 50)) is None
    True
    >>> break_even_epoch(run(0.0, 100), run(0.0, 200, children_s=1.5)) is None  # workers' CPU
    True
    """

    def epoch_s(run: LoopRun) -> float:
        steps_s = run.steps_cpu_s if run.on_cpu else run.profile.wall_s
        return (
            run.epoch_samples * steps_s / run.profile.samples if run.profile.samples else math.inf
        )

    def setup_s(run: LoopRun) -> float:
        return run.setup_cpu_s + run.setup_children_cpu_s if run.on_cpu else run.setup_s

    saved = epoch_s(slow) - epoch_s(fast)
    if not saved > 0:
        return None
    return max(1, math.ceil((setup_s(fast) - setup_s(slow)) / saved))


def _reads_a_loss(tensor: torch.Tensor) -> bool:
    """A scalar float read on the host by the loop's code (a loss, ``.detach()``-ed or
    not), not by PyTorch itself (GradScaler reads its flags with ``.item()``)."""
    if tensor.dim() != 0 or not tensor.is_floating_point():
        return False
    caller = sys._getframe(2).f_globals.get("__name__", "")
    return not (caller == "torch" or caller.startswith("torch."))


@contextmanager
def _spies() -> Iterator[dict[str, int]]:
    """Count host reads of a loss (``.item()``, ``float()``, ``.tolist()``) and
    ``torch.cuda.empty_cache`` calls."""
    counts = {"item": 0, "empty_cache": 0}
    originals = {name: getattr(torch.Tensor, name) for name in ("item", "__float__", "tolist")}
    empty_cache = torch.cuda.empty_cache

    def counting(name: str) -> Callable[..., Any]:
        original = originals[name]

        def read(tensor: torch.Tensor, *args: Any) -> Any:
            if _reads_a_loss(tensor):
                counts["item"] += 1
            return original(tensor, *args)

        return read

    def counting_empty_cache() -> None:
        counts["empty_cache"] += 1
        empty_cache()

    for name in originals:
        setattr(torch.Tensor, name, counting(name))
    torch.cuda.empty_cache = counting_empty_cache
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
        torch.cuda.empty_cache = empty_cache


def _fixed_batch_loss(
    model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], device: torch.device
) -> float:
    model.eval()
    with torch.no_grad():
        logits = model(batch[0].to(device)).float()
        loss = torch.nn.functional.cross_entropy(logits, batch[1].to(device))
    model.train()
    return float(loss.cpu())


class _MoveWatch:
    """Which tensors of each batch the loop gave to ``.to``/``.cuda`` before asking for the
    next batch (the moves come from :func:`~course_utils.spies.record_tensor_to`). On a
    CPU grader labels left on the CPU train anyway; on a GPU ``cross_entropy`` would fail:
    a batch whose inputs were moved and labels not (or the reverse) is counted."""

    def __init__(self) -> None:
        self.moves: list[TensorMove] = []
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None  # held: its ids stay valid
        self.unmoved = {"inputs": 0, "labels": 0}

    def next_batch(self, batch: Any) -> None:
        if self.batch is not None:
            moved = {move.source_id for move in self.moves}
            inputs, labels = (id(tensor) in moved for tensor in self.batch)
            self.unmoved["labels"] += inputs and not labels
            self.unmoved["inputs"] += labels and not inputs
        self.moves.clear()
        pair = isinstance(batch, list | tuple) and len(batch) == 2
        tensors = pair and all(isinstance(part, torch.Tensor) for part in batch)
        self.batch = (batch[0], batch[1]) if tensors else None


def _loss_values(losses: Any) -> list[float]:
    """The losses a loop returned, as floats: a list of tensors or numbers, or one tensor
    of them (``torch.stack(losses)``), or ``None``."""
    if losses is None:
        return []
    if isinstance(losses, torch.Tensor):
        losses = plain_value(losses, "loop(data, model, device, timed)")
        return [float(loss) for loss in losses.detach().float().cpu().reshape(-1)]
    losses = plain_value(list(losses), "loop(data, model, device, timed)")  # each: == and float()
    return [float(torch.as_tensor(loss).detach().float().cpu()) for loss in losses]


def run_loop(
    loop: Loop,
    data: EncodedImages,
    device: torch.device | str = "cpu",
    *,
    samples: int = 512,
    width: int = 32,
    cpu_threads: int | None = 1,
) -> LoopRun:
    """Run ``loop`` on a fresh ``small_cnn`` (seed 0, ``width`` channels first) for about
    ``samples`` samples (at least 3 steps, after one untimed step) and measure it.

    ``timed(loader)`` yields batches epoch after epoch, timing the wait for each; on a GPU
    only the end is synchronized (a per-step ``.item()`` must show its cost). The loop's
    set-up before its first batch (decoding once) is timed and counts. Spies count host
    reads of the loss and ``empty_cache()``; the loss on a fixed batch before and after
    shows that the loop trains. On a CPU the loop gets ``cpu_threads`` threads (on a
    loaded 2-core machine two ran many times slower than one, and their ratio swung).
    """
    device = torch.device(device)
    torch.manual_seed(0)
    model = build_model("small_cnn", width=width).to(device)
    plain = copy.copy(data)  # the same images, centre crop, no flip
    plain.augment = False
    count = min(len(data), 64)
    fixed = (torch.stack([plain[i][0] for i in range(count)]), torch.tensor(data.labels[:count]))
    before = _fixed_batch_loss(model, fixed, device)
    sync = synchronizer(device)
    profiler = StepProfiler("cpu", synchronize=device.type == "cpu", sync=sync)
    clock = {"start": 0.0, "first_batch": 0.0, "cpu_start": 0.0, "cpu_first_batch": 0.0}
    children = {"start": 0.0, "first_batch": 0.0, "measured": 0.0}

    watch = _MoveWatch()

    def timed(loader: Any) -> Iterator[Any]:
        clock["first_batch"] = time.perf_counter()  # the loop's set-up ends here
        clock["cpu_first_batch"] = time.process_time()
        children["first_batch"] = children["measured"] = children_cpu_s()
        steps = max(3, samples // _batch_size(loader))
        epochs = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch
        for index, batch in enumerate(profiler.iterate(epochs, max_steps=steps + 1)):
            watch.next_batch(batch)
            yield batch  # index 0: the warm-up step; the profile starts after it
            if index == 0:
                children["measured"] = children_cpu_s()

    threads = torch.get_num_threads()
    if device.type == "cpu" and cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    gpu_index = nvml_index_of(device)  # NVML's number for the GPU that trains
    sample(gpu_index)  # starts the CPU-utilization interval
    try:
        with _spies() as counts, record_tensor_to() as moves:
            watch.moves = moves
            sync()
            clock["start"] = clock["first_batch"] = time.perf_counter()
            clock["cpu_start"] = clock["cpu_first_batch"] = time.process_time()
            children["start"] = children["first_batch"] = children["measured"] = children_cpu_s()
            losses = loop(data, model, device, timed)
            sync()
            children_end = children_cpu_s()  # workers still running, or already reaped
            watch.next_batch(None)
    finally:
        torch.set_num_threads(threads)
    profile = profiler.report()
    profile.device = str(device)
    return LoopRun(
        name=getattr(loop, "__name__", "loop"),
        profile=profile,
        losses=_loss_values(losses),
        loss_before=before,
        loss_after=_fixed_batch_loss(model, fixed, device),
        item_calls=counts["item"],
        empty_cache_calls=counts["empty_cache"],
        monitor=sample(gpu_index),
        unmoved_labels=watch.unmoved["labels"],
        unmoved_inputs=watch.unmoved["inputs"],
        setup_s=clock["first_batch"] - clock["start"],
        setup_cpu_s=clock["cpu_first_batch"] - clock["cpu_start"],
        epoch_samples=len(data),
        setup_children_cpu_s=children["first_batch"] - children["start"],
        children_cpu_s=children_end - children["measured"],
    )


def _batch_size(loader: Any) -> int:
    """A DataLoader's batch size, also when a ``BatchSampler`` makes its batches."""
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "sampler", None), "batch_size", None)
    return int(size or 1)


def compare_loops(
    loops: list[Loop],
    data: EncodedImages,
    device: torch.device | str = "cpu",
    *,
    rounds: int = 3,
    **options: Any,
) -> list[LoopRun]:
    """The fastest of ``rounds`` :func:`run_loop` runs of each loop, taken in turns."""
    runs: list[list[LoopRun]] = [[] for _ in loops]

    def turn(index: int) -> Callable[[], None]:
        return lambda: runs[index].append(run_loop(loops[index], data, device, **options))

    time_in_turns(
        {str(i): turn(i) for i in range(len(loops))}, device=device, warmup=0, rounds=rounds
    )
    return [max(kept, key=lambda run: run.rate()) for kept in runs]


def run_recipe(
    recipe: Recipe,
    data: EncodedImages,
    device: torch.device | str = "cpu",
    *,
    repeats: int = 1,
    **options: Any,
) -> LoopRun:
    """The fastest of ``repeats`` runs of the recipe's loop; ``decode="once"`` decodes
    before the first step, inside the run: its end-to-end ``samples_per_s`` counts it."""
    return compare_loops([recipe.loop], data, device, rounds=repeats, **options)[0]


@dataclass(frozen=True)
class RecipeRow:
    """One row of a table of recipes, each adding a change to the row before: its fastest
    run, its gain over the row before (row 1 end to end, later rows by their steps), and
    the noise that gain is read against: the larger spread (slowest to fastest run) of the
    two rows' runs. ``same_work``: on this device the recipe does the row before's work, so
    its run is the row before's and its gain 1."""

    name: str
    run: LoopRun
    gain: float
    noise: float
    same_work: bool = False

    @property
    def resolved(self) -> bool:
        """Whether the gain is larger than the noise of the runs behind it (the first row,
        compared with nothing, has no noise)."""
        return self.same_work or self.noise == 0 or abs(self.gain - 1) > self.noise


def _end_to_end(run: LoopRun) -> float:
    return run.rate()


def _steps(run: LoopRun) -> float:
    return run.steps_rate()


def _spread(values: list[float]) -> float:
    return max(values) / min(values) - 1 if min(values) > 0 else math.inf


def measure_recipes(
    recipes: list[tuple[str, Recipe]],
    data: EncodedImages,
    device: torch.device | str = "cpu",
    *,
    repeats: int = 3,
    **options: Any,
) -> list[RecipeRow]:
    """Measure each recipe's loop ``repeats`` times **in turns** (every round runs every
    row once, so a machine that slows down or a GPU that heats up favours no row) and keep
    each row's fastest run; a recipe that does the same work on ``device`` as the row
    before (:meth:`Recipe.as_run_on`) is not run again. ``options`` go to :func:`run_loop`."""
    if repeats < 1 or not recipes:
        raise ValueError("need repeats >= 1 and at least one recipe")
    distinct = [
        i
        for i, (_, recipe) in enumerate(recipes)
        if i == 0 or recipe.as_run_on(device) != recipes[i - 1][1].as_run_on(device)
    ]
    runs: dict[int, list[LoopRun]] = {i: [] for i in distinct}
    for _ in range(repeats):
        for i in distinct:
            runs[i].append(run_loop(recipes[i][1].loop, data, device, **options))
    rows: list[RecipeRow] = []
    measured = distinct[0]
    for i, (name, _) in enumerate(recipes):
        if i not in runs:
            rows.append(RecipeRow(name + " (same work here)", rows[-1].run, 1.0, 0.0, True))
            continue
        rate = _end_to_end if i == 1 else _steps  # row 1 changes the set-up
        best = max(runs[i], key=rate)
        if i == 0:  # the baseline: compared with nothing
            rows.append(RecipeRow(name, best, 1.0, 0.0))
        else:
            before = max(runs[measured], key=rate)
            noise = max(
                _spread([rate(r) for r in runs[i]]), _spread([rate(r) for r in runs[measured]])
            )
            rows.append(RecipeRow(name, best, rate(best) / rate(before), noise))
        measured = i
    return rows
