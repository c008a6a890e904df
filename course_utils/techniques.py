"""Memory-saving techniques compared (notebook 04): for each row, the peak memory of a
step, the largest batch that fits (on a GPU against CUDA's real limit; on a CPU against a
simulated :class:`~course_utils.oom.MemoryBudget` of ``budget_bytes``, since the operating
system would swap and kill the process long before PyTorch raised), throughput and MFU.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import nn

from course_utils import progress
from course_utils.batch import find_max_batch_size
from course_utils.device import PrecisionName, autocast, pick_precision
from course_utils.flops import PeakFlops, device_peak_flops, mfu
from course_utils.footprint import (
    measure_activations,
    memory_breakdown,
    peak_memory,
    saved_tensor_bytes,
    step_until_taken,
    tensor_bytes,
)
from course_utils.models import build_model, model_costs
from course_utils.oom import MemoryBudget
from course_utils.timing import benchmark, typical_s
from course_utils.training import TrainConfig, TrainStep
from course_utils.units import MIB


@dataclass(frozen=True)
class Technique:
    """One row: a change to the baseline's config or model."""

    name: str
    config: TrainConfig
    model: str | None = None  # None: the baseline's model
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    evaluation: bool = False  # measure evaluation in torch.inference_mode(), not training
    gpu_only: bool = False  # not measured on a CPU


@dataclass(frozen=True)
class TechniqueResult:
    """The measurements of one row; ``None`` where the row was not measured here (``note``
    says why)."""

    name: str
    measured: bool
    note: str
    batch_size: int
    peak_bytes: int | None = None
    static_bytes: int | None = None
    activation_bytes: int | None = None
    max_batch: int | None = None
    max_batch_capped: bool = False
    samples_per_s: float | None = None
    flops_per_sample: float | None = None
    mfu: float | None = None
    peak_source: str = ""


def standard_techniques(
    device: torch.device | str,
    smaller_model: str,
    smaller_kwargs: dict[str, Any] | None = None,
) -> list[Technique]:
    """The rows of notebook 04, the first being the baseline (fp32, Adam, no toggles).
    Mixed precision: :func:`~course_utils.device.pick_precision`'s choice on a GPU, bf16
    on a CPU; channels_last runs with that AMP (compare it with the AMP row: cuDNN's
    channels_last kernels pay off on tensor cores), and it and inference_mode are GPU-only."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    amp = pick_precision(device).name if on_gpu else PrecisionName.BF16
    base = TrainConfig(precision=PrecisionName.FP32, optimizer="adam", lr=1e-3)
    with_ = functools.partial(dataclasses.replace, base)
    return [
        Technique("baseline (fp32, Adam)", base),
        Technique(f"AMP ({amp} autocast)" + ("" if on_gpu else ", CPU"), with_(precision=amp)),
        Technique("gradient checkpointing", with_(checkpointing=True)),
        Technique(  # against the AMP row: fp32 has no tensor cores on a T4
            f"channels_last + AMP ({amp})",
            with_(channels_last=True, precision=amp),
            gpu_only=not on_gpu,
        ),
        Technique("SGD with momentum instead of Adam", with_(optimizer="momentum", lr=0.05)),
        Technique("plain SGD instead of Adam", with_(optimizer="sgd", lr=0.05)),
        Technique("evaluation in inference_mode", base, evaluation=True, gpu_only=not on_gpu),
        Technique(
            f"smaller architecture ({smaller_model})",
            base,
            model=smaller_model,
            model_kwargs=dict(smaller_kwargs or {}),
        ),
    ]


def random_batch(
    batch_size: int, device: torch.device | str, image_size: int = 32, num_classes: int = 10
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random CIFAR-shaped images and labels, made directly on ``device``."""
    inputs = torch.randn(batch_size, 3, image_size, image_size, device=device)
    return inputs, torch.randint(0, num_classes, (batch_size,), device=device)


def _evaluation_peak(model: nn.Module, inputs: torch.Tensor, device: torch.device) -> int:
    model.eval()
    with torch.inference_mode():
        peak = peak_memory(lambda: model(inputs), device).peak_bytes
    model.train()
    return peak + tensor_bytes(model.parameters())


def measure_technique(
    technique: Technique,
    device: torch.device | str,
    *,
    model: str,
    model_kwargs: dict[str, Any] | None = None,
    batch_size: int = 4,
    image_size: int = 32,
    budget_bytes: int | None = None,
    high: int = 64,
    repeats: int = 3,
    peaks: dict[torch.dtype, PeakFlops] | None = None,
) -> TechniqueResult:
    """Measure one row (see the module documentation). ``budget_bytes`` is required on a
    CPU (the imposed memory budget); ``peaks`` caches :func:`device_peak_flops` per dtype."""
    device = torch.device(device)
    if technique.gpu_only and device.type != "cuda":
        return TechniqueResult(technique.name, False, "GPU only: not measured here", batch_size)
    if device.type != "cuda" and budget_bytes is None:
        raise ValueError("on a CPU, pass budget_bytes: the memory budget the trials obey")
    name = technique.model or model
    kwargs = technique.model_kwargs if technique.model else dict(model_kwargs or {})
    if name == "tiny_transformer":  # its position embedding is sized for the image
        kwargs = {"image_size": image_size, **kwargs}
    cost = model_costs(name, batch_size=1, image_size=image_size, **kwargs)
    dtype = pick_precision(device, technique.config.precision).dtype
    peaks = peaks if peaks is not None else {}
    if dtype not in peaks:
        peaks[dtype] = device_peak_flops(device, dtype, convolutions=True)  # CNNs: cuDNN's TF32
    fresh_step = lambda: TrainStep(build_model(name, **kwargs), device, technique.config)  # noqa: E731
    batch = random_batch(batch_size, device, image_size)

    if technique.evaluation:
        net = build_model(name, **kwargs).to(device)
        peak = _evaluation_peak(net, batch[0], device)
        static = tensor_bytes(net.parameters())
        activations = peak - static

        def trial(n: int) -> None:
            _evaluation_peak(net, random_batch(n, device, image_size)[0], device)

        def run() -> None:
            with torch.inference_mode():
                net(batch[0])

        net.eval()
        flops = float(cost.forward_flops)
    else:
        step = fresh_step()
        breakdown = memory_breakdown(step, batch)
        peak, static, activations = breakdown.peak, breakdown.static, breakdown.activations
        trial_step = fresh_step()
        if device.type == "cuda":  # the trials' memory includes the optimizer state, which
            # exists after the first step that was taken (fp16 may skip the first ones)
            step_until_taken(trial_step, random_batch(min(2, high), device, image_size))

        def trial(n: int) -> None:
            batch = random_batch(n, device, image_size)
            if device.type == "cuda":  # the real thing: CUDA raises OutOfMemoryError
                trial_step(batch)
                return
            # CPU: the activations the forward pass saves (as memory_breakdown counts
            # them, without running backward), on top of the static part, must fit
            assert budget_bytes is not None
            inputs, targets = trial_step.prepare(batch)

            def forward() -> torch.Tensor:
                with autocast(device, trial_step.precision):
                    return trial_step.loss_fn(trial_step.model(inputs), targets)

            saved_tensor_bytes(
                forward,
                exclude=trial_step.model.parameters(),
                budget=MemoryBudget(budget_bytes - static),
            )

        def run() -> None:
            step(batch)

        flops = float(cost.training_flops)

    found = find_max_batch_size(trial, low=min(2, high), high=high)
    seconds = typical_s(benchmark(run, device=device, warmup=1, repeats=repeats))
    return TechniqueResult(
        name=technique.name,
        measured=True,
        note="",
        batch_size=batch_size,
        peak_bytes=peak,
        static_bytes=static,
        activation_bytes=activations,
        max_batch=found.batch_size,
        max_batch_capped=found.capped,
        samples_per_s=batch_size / seconds,
        flops_per_sample=flops,
        mfu=mfu(flops * batch_size, seconds, peaks[dtype].flops_per_s),
        peak_source=peaks[dtype].source,
    )


@dataclass(frozen=True)
class StepMeasurement:
    """Time and memory of a training step written out in a notebook (:func:`measure_step`)."""

    name: str
    batch_size: int
    seconds: float  # one step: the median on a GPU, the fastest on a CPU (timing.typical_s)
    memory_bytes: int | None  # None: not measured (see ``method``)
    method: str

    @property
    def samples_per_s(self) -> float:
        return self.batch_size / self.seconds

    def __str__(self) -> str:
        memory = (
            "not measured" if self.memory_bytes is None else f"{self.memory_bytes / MIB:.2f} MiB"
        )
        return (
            f"{self.name}: {self.seconds * 1e3:.1f} ms/step ({self.samples_per_s:.0f} samples/s), "
            f"memory {memory} ({self.method})"
        )


def measure_step(
    name: str,
    step_fn: Callable[[], Any],
    batch_size: int,
    device: torch.device | str,
    *,
    exclude: Iterable[torch.Tensor] = (),
    optimizer: torch.optim.Optimizer | None = None,
    memory: bool = True,
    repeats: int = 3,
) -> StepMeasurement:
    """Measure ``step_fn()``, one training step as a notebook writes it out: after a
    warm-up (with a stateful ``optimizer``: until it has state, at most 10 calls, since a
    skipped fp16 step creates none), its memory
    (:func:`~course_utils.footprint.measure_activations`, ``exclude``: the parameters)
    and the time of ``repeats`` calls (:func:`~course_utils.timing.typical_s`: the median on
    a GPU, the fastest on a shared CPU)."""
    device = torch.device(device)
    for _ in range(10):
        step_fn()
        if optimizer is None or optimizer.state:
            break
    used, method = None, "memory not measured"
    if memory:
        used, _ = measure_activations(step_fn, device, exclude=list(exclude))
        method = "CUDA allocator peak" if device.type == "cuda" else "CPU: bytes saved for backward"
    timing = benchmark(step_fn, device=device, warmup=0, repeats=repeats)
    return StepMeasurement(name, batch_size, typical_s(timing), used, method)


def format_steps(rows: Sequence[StepMeasurement]) -> str:
    """The measured steps as a table, each compared with the first row."""
    base = rows[0]
    lines = [f"{'step':44} {'ms/step':>8} {'x time':>7} {'memory MiB':>11} {'x memory':>9}"]
    for r in rows:
        memory, ratio = "-", ""
        if r.memory_bytes is not None:
            memory = f"{r.memory_bytes / MIB:.2f}"
            if base.memory_bytes:
                ratio = f"{r.memory_bytes / base.memory_bytes:.2f}"
        lines.append(
            f"{r.name:44} {r.seconds * 1e3:8.1f} {r.seconds / base.seconds:7.2f} "
            f"{memory:>11} {ratio:>9}"
        )
    return "\n".join(lines)


def compare_techniques(
    techniques: Sequence[Technique], device: torch.device | str, **options: Any
) -> list[TechniqueResult]:
    """:func:`measure_technique` for every row, sharing the measured device peaks. The
    finder's ``gc.collect()`` (on a GPU, after a failed trial whose tensors a reference
    cycle still holds) scans every object torch made (about 0.2 s on a small CPU):
    ``gc.freeze()`` hides those for the duration."""
    peaks: dict[torch.dtype, PeakFlops] = {}
    gc.freeze()
    try:
        rows = progress.track(techniques, "techniques", unit="technique")
        return [measure_technique(t, device, peaks=peaks, **options) for t in rows]
    finally:
        gc.unfreeze()


def format_table(results: Sequence[TechniqueResult]) -> str:
    """The technique table as text; rows not measured here say so."""
    header = (
        f"{'technique':38} {'peak MiB':>9} {'static':>8} {'activ.':>8} {'max batch':>10} "
        f"{'samples/s':>10} {'GFLOP/sample':>12} {'MFU':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        if not r.measured:
            lines.append(f"{r.name:38} {r.note}")
            continue
        assert r.peak_bytes is not None and r.static_bytes is not None
        assert r.activation_bytes is not None and r.samples_per_s is not None
        assert r.flops_per_sample is not None and r.mfu is not None
        capped = ">=" if r.max_batch_capped else ""
        lines.append(
            f"{r.name:38} {r.peak_bytes / MIB:9.2f} {r.static_bytes / MIB:8.2f} "
            f"{r.activation_bytes / MIB:8.2f} {capped + str(r.max_batch):>10} "
            f"{r.samples_per_s:10.1f} {r.flops_per_sample / 1e9:12.4f} {r.mfu:7.2%}"
        )
    return "\n".join(lines)


def plot_techniques(results: Sequence[TechniqueResult], title: str = "") -> Figure:
    """One chart of the table: peak memory (static and activations), largest batch and
    throughput per technique; rows not measured here are marked on every panel."""
    names = [r.name for r in results]
    rows = list(range(len(results)))
    fig, axes = plt.subplots(1, 3, figsize=(13, 0.45 * len(results) + 1.6), sharey=True)
    memory, batch, speed = axes
    for y, r in zip(rows, results, strict=True):
        if not r.measured:
            for ax in axes:
                ax.text(0, y, "  GPU only: not measured here", va="center", color="gray")
            continue
        assert r.static_bytes is not None and r.activation_bytes is not None
        memory.barh(y, r.static_bytes / MIB, color="tab:blue")
        memory.barh(y, r.activation_bytes / MIB, left=r.static_bytes / MIB, color="tab:orange")
        batch.barh(y, r.max_batch or 0, color="tab:green", hatch="//" if r.max_batch_capped else "")
        speed.barh(y, r.samples_per_s or 0, color="tab:purple")
    memory.legend(["static (parameters, gradients, optimizer)", "activations"], fontsize=8)
    memory.set(xlabel="peak memory of a step (MiB)", yticks=rows, yticklabels=names)
    batch.set(xlabel="largest batch that fits (hatched: search capped)")
    speed.set(xlabel="throughput (samples/s)")
    memory.invert_yaxis()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
