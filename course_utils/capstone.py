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
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from course_utils import progress
from course_utils.data import EncodedImages, PreDecodedImages, augment_on_device
from course_utils.models import build_model
from course_utils.monitor import sample
from course_utils.profiling import LoopProfile, StepProfiler
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
    """What :func:`run_recipe` measured: the step profile, and monitor readings."""

    recipe: Recipe
    profile: LoopProfile
    monitor: dict[str, Any]
    device: str

    @property
    def samples_per_s(self) -> float:
        return self.profile.samples_per_s

    def summary(self) -> str:
        util = (
            f"GPU util {self.monitor.get('gpu_util_pct', '?')}%"
            if self.monitor.get("source") == "nvml"
            else f"CPU util {self.monitor.get('cpu_util_pct', 0.0):.0f}% (all cores)"
        )
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
) -> RecipeRun:
    """Train a ``small_cnn`` with ``recipe`` on ``data`` for about ``samples`` samples (plus
    ``warmup`` untimed steps) and return the profile. ``width`` is the model's width
    (channels of its first convolution; a smaller one makes each step cheaper). With
    ``repeats`` > 1 the timed part runs that many times and the fastest is kept: on a
    shared machine, other programs only ever slow a run down.

    The decoding of ``decode="once"`` happens before the loop and is not timed: it is paid
    once per training run, not once per epoch (the notebook measures it separately).
    """
    device = torch.device(device)
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
    reading: dict[str, Any] = {}
    for _ in range(repeats):
        profiler = StepProfiler(device, warmup=warmup)
        sample(_gpu_index(device))  # starts the CPU-utilization interval
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
            best, reading = profile, sample(_gpu_index(device))
    assert best is not None
    return RecipeRun(recipe, best, reading, str(device))


def _epochs(loader: DataLoader[Any]) -> Iterator[Any]:
    """The loader's batches, epoch after epoch, for as long as they are asked for."""
    while True:
        yield from loader


def _gpu_index(device: torch.device) -> int | None:
    return (device.index or 0) if device.type == "cuda" else None


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
