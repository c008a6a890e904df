"""The capstone's training set-up: a slow recipe, its knobs, and a measured run of it.

A :class:`Recipe` gathers the choices that make a training loop slow or fast, each one a
habit from real code:

- ``decode``: ``"per-sample"`` decodes and augments every image on the CPU inside the
  DataLoader (:class:`~course_utils.data.EncodedImages`); ``"once"`` decodes the dataset
  once up front (:class:`~course_utils.data.PreDecodedImages`) and augments whole batches
  on the device (:func:`~course_utils.data.augment_on_device`);
- ``num_workers``: 0 decodes in the training process itself, between steps;
- ``batch_size``: 8 pays the per-step overhead (Python, kernel launches) for few samples;
- ``pin_memory``: page-locked batches copy to a GPU faster, and asynchronously;
- ``precision``: ``"fp32"`` leaves a T4's fp16 tensor cores idle; ``"auto"`` picks fp16
  with a gradient scaler on a T4, bf16 from Ampere on, fp32 on a CPU;
- ``item_every_step``: ``loss.item()`` after each step makes the CPU wait for the GPU;
- ``empty_cache_every_step``: ``torch.cuda.empty_cache()`` returns the allocator's cached
  blocks to the driver, so the next step allocates them again (slow ``cudaMalloc``).

:func:`run_recipe` trains with a recipe through :class:`~course_utils.training.TrainStep`
and times every step with :class:`~course_utils.profiling.StepProfiler` (data wait, copy,
compute), reading :func:`~course_utils.monitor.sample` around the run. On a CPU the
GPU-only knobs change nothing, and the run says so.

:func:`run_loop` and :func:`compare_loops` measure a training loop written in the notebook
(the slow loop of the lesson, the learner's fixed loop): a loop is a function
``loop(data, model, device, timed)`` that builds its own DataLoader and optimizer and
iterates ``for inputs, targets in timed(loader)``; ``timed`` stops after the run's sample
budget and times the wait for each batch. Spies count ``.item()`` on autograd results (the
loss) and ``torch.cuda.empty_cache()`` calls, and the loss on a fixed batch is taken before
and after, so a check can see what a CPU cannot time.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from course_utils import progress
from course_utils.data import EncodedImages, PreDecodedImages, augment_on_device
from course_utils.models import build_model
from course_utils.monitor import Reading, nvml_index_of, sample
from course_utils.profiling import LoopProfile, StepProfiler
from course_utils.timing import synchronizer
from course_utils.training import TrainConfig, TrainStep


@dataclass(frozen=True)
class Recipe:
    """The knobs of the capstone's training set-up (see the module doc)."""

    decode: str = "per-sample"
    num_workers: int = 0
    batch_size: int = 8
    pin_memory: bool = False
    precision: str = "fp32"
    item_every_step: bool = True
    empty_cache_every_step: bool = True

    def __post_init__(self) -> None:
        if self.decode not in ("per-sample", "once"):
            raise ValueError(f"decode={self.decode!r}: use 'per-sample' or 'once'")
        if self.batch_size < 1 or self.num_workers < 0:
            raise ValueError("batch_size must be at least 1 and num_workers at least 0")

    def changed(self, **knobs: Any) -> Recipe:
        """A copy with some knobs changed: ``SLOW.changed(batch_size=64)``."""
        return replace(self, **knobs)


#: The deliberately slow starting point of the capstone.
SLOW = Recipe()


@dataclass
class RecipeRun:
    """What :func:`run_recipe` measured: the step profile, and the monitor's reading at
    the end of the fastest run (GPU-Util on a GPU, CPU utilization since the run began
    on a CPU)."""

    recipe: Recipe
    profile: LoopProfile
    monitor: Reading
    device: str

    @property
    def samples_per_s(self) -> float:
        return self.profile.samples_per_s

    def summary(self) -> str:
        reading = self.monitor
        if not reading.on_gpu:
            util = f"CPU util {reading.cpu_util_pct or 0.0:.0f}% (all cores)"
        elif reading.utilization_gpu_pct is not None:
            util = f"GPU util {reading.utilization_gpu_pct:.0f}%"
        else:
            util = "GPU util N/A" + (" (MIG)" if reading.mig_enabled else "")
        return f"{self.samples_per_s:8.1f} samples/s  {util}\n{self.profile}"


def make_data(size: int, *, stored_size: int = 128, image_size: int = 32) -> EncodedImages:
    """The capstone's dataset: ``size`` PNG-encoded synthetic images, decoded per sample."""
    return EncodedImages(size=size, stored_size=stored_size, image_size=image_size)


def _loader(recipe: Recipe, data: EncodedImages, device: torch.device) -> DataLoader[Any]:
    dataset: Dataset[Any] = data
    if recipe.decode == "once":
        dataset = PreDecodedImages.from_encoded(data)
    return DataLoader(
        dataset,
        batch_size=recipe.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=recipe.num_workers,
        pin_memory=recipe.pin_memory and device.type == "cuda",
        persistent_workers=recipe.num_workers > 0,
        generator=torch.Generator().manual_seed(0),
    )


def run_recipe(
    recipe: Recipe,
    data: EncodedImages,
    device: torch.device | str = "cpu",
    *,
    samples: int = 512,
    warmup: int = 1,
    width: int = 32,
    repeats: int = 1,
    cpu_threads: int | None = None,
) -> RecipeRun:
    """Train a ``small_cnn`` with ``recipe`` on ``data`` for about ``samples`` samples (plus
    ``warmup`` untimed steps) and return the profile. ``width`` is the model's width
    (channels of its first convolution; a smaller one makes each step cheaper). With
    ``repeats`` > 1 the timed part runs that many times and the fastest is kept: on a
    shared machine, other programs only ever slow a run down.

    The decoding of ``decode="once"`` happens before the loop and is not timed: it is paid
    once per training run, not once per epoch (the notebook measures it separately).
    ``cpu_threads`` sets PyTorch's CPU threads for the run on a CPU (``None``: unchanged;
    see :func:`run_loop` for why a loaded machine is better measured with one).
    """
    device = torch.device(device)
    threads = torch.get_num_threads()
    if device.type == "cpu" and cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    try:
        return _run_recipe(recipe, data, device, samples, warmup, width, repeats)
    finally:
        torch.set_num_threads(threads)


def _run_recipe(
    recipe: Recipe,
    data: EncodedImages,
    device: torch.device,
    samples: int,
    warmup: int,
    width: int,
    repeats: int,
) -> RecipeRun:
    torch.manual_seed(0)
    step = TrainStep(
        build_model("small_cnn", width=width), device, TrainConfig(precision=recipe.precision)
    )
    loader = _loader(recipe, data, device)
    if len(loader) == 0:
        raise ValueError(f"{len(data)} images make no batch of {recipe.batch_size}")
    steps = max(3, samples // recipe.batch_size)
    batches = _epochs(loader)
    best: LoopProfile | None = None
    gpu_index = nvml_index_of(device)  # NVML's number for the GPU that trains
    reading = sample(None)
    for _ in range(repeats):
        profiler = StepProfiler(device, warmup=warmup)
        sample(gpu_index)  # starts the CPU-utilization interval
        for inputs, targets in profiler.iterate(batches, max_steps=steps + warmup):
            if recipe.decode == "once":
                inputs = augment_on_device(inputs, data.image_size)
            loss = step((inputs, targets))
            if recipe.item_every_step:
                loss.item()  # the habit under test: the CPU waits for the device here
            if recipe.empty_cache_every_step and device.type == "cuda":
                torch.cuda.empty_cache()
        profile = profiler.report()
        if best is None or profile.samples_per_s > best.samples_per_s:
            best, reading = profile, sample(gpu_index)
    assert best is not None
    return RecipeRun(recipe, best, reading, str(device))


def _epochs(loader: DataLoader[Any]) -> Iterator[Any]:
    """The loader's batches, epoch after epoch, for as long as they are asked for."""
    while True:
        yield from loader


def largest_phase(profile: LoopProfile) -> str:
    """``"data"``, ``"copy"`` or ``"compute"``: where most of the step time went.

    >>> from course_utils.profiling import StepTimes
    >>> largest_phase(LoopProfile(steps=[StepTimes(0.3, 0.01, 0.1, 8)], wall_s=0.41))
    'data'
    """
    phases = {"data": profile.data_s, "copy": profile.copy_s, "compute": profile.compute_s}
    return max(phases, key=lambda name: phases[name])


def compare_recipes(
    recipes: list[Recipe],
    data: EncodedImages,
    device: torch.device | str = "cpu",
    *,
    samples: int = 512,
    width: int = 32,
    rounds: int = 3,
) -> list[RecipeRun]:
    """The fastest of ``rounds`` runs of each recipe, taken in turns (A, B, A, B, ...).

    Taking turns exposes every recipe to the same moments of a shared machine's load, so
    their ratio is fairer than timing all of one and then all of the other.
    """
    best: list[RecipeRun | None] = [None] * len(recipes)
    for _ in progress.track(range(rounds), "capstone recipes", unit="round"):
        for index, recipe in enumerate(recipes):
            run = run_recipe(recipe, data, device, samples=samples, width=width)
            kept = best[index]
            if kept is None or run.samples_per_s > kept.samples_per_s:
                best[index] = run
    return [run for run in best if run is not None]


# --------------------------------------------------------------------------- loops


#: A training loop to measure: ``loop(data, model, device, timed) -> losses``.
Loop = Callable[[EncodedImages, torch.nn.Module, torch.device, Callable[[Any], Any]], Any]


@dataclass
class LoopRun:
    """What :func:`run_loop` measured for one training loop."""

    name: str
    profile: LoopProfile
    losses: list[float]
    loss_before: float  # mean loss on a fixed batch of the training images, before ...
    loss_after: float  # ... and after the loop
    item_calls: int  # ``.item()`` on tensors with a grad_fn (the loss), during the loop
    empty_cache_calls: int
    total_s: float  # the whole call, one-time work (pre-decoding, workers) included
    monitor: Reading | None = field(default=None)  # a monitor reading taken at the end
    device: str = "cpu"

    @property
    def samples_per_s(self) -> float:
        """Throughput of the timed steps (after the warm-up step)."""
        return self.profile.samples_per_s


@contextmanager
def _spies() -> Iterator[dict[str, int]]:
    """Count ``Tensor.item`` on autograd results and ``torch.cuda.empty_cache`` calls."""
    counts = {"item": 0, "empty_cache": 0}
    item, empty_cache = torch.Tensor.item, torch.cuda.empty_cache

    def counting_item(tensor: torch.Tensor) -> Any:
        if tensor.grad_fn is not None:  # a loss, not a GradScaler's internal flag
            counts["item"] += 1
        return item(tensor)

    def counting_empty_cache() -> None:
        counts["empty_cache"] += 1
        empty_cache()

    torch.Tensor.item = counting_item  # type: ignore[method-assign,assignment]
    torch.cuda.empty_cache = counting_empty_cache
    try:
        yield counts
    finally:
        torch.Tensor.item = item  # type: ignore[method-assign]
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


def run_loop(
    loop: Loop,
    data: EncodedImages,
    device: torch.device | str = "cpu",
    *,
    samples: int = 512,
    width: int = 32,
    warmup: int = 1,
    cpu_threads: int | None = 1,
) -> LoopRun:
    """Run ``loop`` on a fresh ``small_cnn`` (seed 0) for about ``samples`` samples (at
    least 3 steps, after ``warmup`` untimed steps) and measure it.

    ``timed(loader)`` hands the loop the loader's batches, epoch after epoch, as they come
    (on the CPU: the loop copies them itself), timing the wait for each. On a GPU the
    loop's steps are not synchronized one by one (a per-step ``.item()`` must show its
    cost), and the device is synchronized at the end, so the wall time is honest.

    On a CPU the loop runs with ``cpu_threads`` PyTorch threads (``None``: leave the
    setting alone). One is the default because on a machine whose cores are busy with
    other programs, multi-threaded kernels wait for each other: on a loaded 2-core machine
    the same loops ran many times slower with two threads than with one, and their ratio
    swung with the load.
    """
    device = torch.device(device)
    torch.manual_seed(0)
    model = build_model("small_cnn", width=width).to(device)
    plain = copy.copy(data)  # the same images, centre crop, no flip
    plain.augment = False
    count = min(len(data), 64)
    fixed = (
        torch.stack([plain[i][0] for i in range(count)]),
        torch.tensor(data.labels[:count]),
    )
    before = _fixed_batch_loss(model, fixed, device)
    sync = synchronizer(device)
    # batches stay where the loader puts them ("cpu": the loop copies them itself); on a GPU
    # the steps are not synchronized one by one (that would hide the cost of .item())
    profiler = StepProfiler("cpu", warmup=warmup, synchronize=device.type == "cpu", sync=sync)

    def timed(loader: Any) -> Iterator[Any]:
        batch_size = getattr(loader, "batch_size", None) or 1
        steps = max(3, samples // batch_size)
        return profiler.iterate(_epochs(loader), max_steps=steps + warmup)

    threads = torch.get_num_threads()
    if device.type == "cpu" and cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    gpu_index = nvml_index_of(device)  # NVML's number for the GPU that trains
    sample(gpu_index)  # starts the CPU-utilization interval
    start = time.perf_counter()
    try:
        with _spies() as counts:
            losses = loop(data, model, device, timed)
        sync()
    finally:
        torch.set_num_threads(threads)
    total = time.perf_counter() - start
    reading = sample(gpu_index)
    values = [float(torch.as_tensor(loss).detach().float().cpu()) for loss in losses or []]
    profile = profiler.report()
    profile.device = str(device)
    return LoopRun(
        name=getattr(loop, "__name__", "loop"),
        profile=profile,
        losses=values,
        loss_before=before,
        loss_after=_fixed_batch_loss(model, fixed, device),
        item_calls=counts["item"],
        empty_cache_calls=counts["empty_cache"],
        total_s=total,
        monitor=reading,
        device=str(device),
    )


def compare_loops(
    loops: list[Loop],
    data: EncodedImages,
    device: torch.device | str = "cpu",
    *,
    samples: int = 512,
    width: int = 32,
    rounds: int = 3,
    cpu_threads: int | None = 1,
) -> list[LoopRun]:
    """The fastest of ``rounds`` runs of each loop, taken in turns (A, B, A, B, ...), as
    :func:`compare_recipes` does for recipes."""
    best: list[LoopRun | None] = [None] * len(loops)
    for _ in range(rounds):
        for index, loop in enumerate(loops):
            run = run_loop(
                loop, data, device, samples=samples, width=width, cpu_threads=cpu_threads
            )
            kept = best[index]
            if kept is None or run.samples_per_s > kept.samples_per_s:
                best[index] = run
    return [run for run in best if run is not None]
