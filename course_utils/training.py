"""The course's reference training step, where every technique is a toggle: one code path
trains every model of notebooks 03 to 08, and a lesson changes a field of
:class:`TrainConfig` instead of writing another loop.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from course_utils.device import AUTO, autocast, pick_device, pick_precision, to_device
from course_utils.models import build_model, checkpoint_blocks
from course_utils.oom import error_summary, is_out_of_memory
from course_utils.timing import synchronizer

_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "momentum": functools.partial(torch.optim.SGD, momentum=0.9),
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
}
OPTIMIZERS = tuple(_OPTIMIZERS)


@dataclass
class TrainConfig:
    """The toggles of :class:`TrainStep`."""

    precision: str = AUTO  # or a PrecisionName, resolved by pick_precision; fp16: GradScaler
    accumulation_steps: int = 1  # micro-batches whose gradients add up before one step
    checkpointing: bool | Sequence[str] = False  # torch.utils.checkpoint of (chosen) blocks
    channels_last: bool = False
    compile: bool = False  # guarded: a failed compile runs eagerly
    optimizer: str = "sgd"
    lr: float = 0.05
    set_to_none: bool = True

    def __post_init__(self) -> None:
        pick_precision("cpu", self.precision)  # raises ValueError for an unknown name
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
        if self.accumulation_steps < 1:
            raise ValueError("accumulation_steps must be at least 1")


def make_optimizer(
    name: str, parameters: Iterable[nn.Parameter], lr: float
) -> torch.optim.Optimizer:
    """SGD, SGD with momentum 0.9, Adam or AdamW by name."""
    if name not in _OPTIMIZERS:
        raise ValueError(f"optimizer={name!r}: use one of {', '.join(OPTIMIZERS)}")
    return _OPTIMIZERS[name](list(parameters), lr=lr)


class TrainStep:
    """One optimizer step on a batch ``(inputs, targets)``, with the toggles of ``config``,
    on ``device`` (default: :func:`~course_utils.device.pick_device`'s). ``step(batch)``
    returns the mean loss as a detached tensor on the device (``.item()`` would make the
    CPU wait for the GPU every step; :func:`train` reads all losses once at the end).
    """

    def __init__(
        self,
        model: nn.Module,
        device: torch.device | str | None = None,
        config: TrainConfig | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.config = config or TrainConfig()
        self.device = torch.device(device) if device is not None else pick_device()
        self.precision = pick_precision(self.device, self.config.precision)
        self.loss_fn = loss_fn or nn.CrossEntropyLoss()
        self.model = model.to(self.device)
        if self.config.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.checkpointed: list[str] = []
        if self.config.checkpointing:
            names = None if self.config.checkpointing is True else list(self.config.checkpointing)
            self.checkpointed = checkpoint_blocks(self.model, names)
        self.optimizer = optimizer or make_optimizer(
            self.config.optimizer, self.model.parameters(), self.config.lr
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision.grad_scaler)
        self.compile_error: str | None = None
        self._compiled: Callable[..., Any] | None = None
        self._compile_confirmed = False
        if self.config.compile:
            try:
                self._compiled = torch.compile(self.model)
            except Exception as error:  # compile is lazy; this catches setup errors only
                self._fall_back(error)
        self.steps = 0

    def _fall_back(self, error: BaseException) -> None:
        self.compile_error = f"{type(error).__name__}: {error_summary(error)}"
        self._compiled = None
        print(f"torch.compile failed ({self.compile_error}); running eagerly instead.")

    def _forward_backward(self, inputs: Any, targets: Any, weight: float) -> torch.Tensor:
        with autocast(self.device, self.precision):
            loss = self.loss_fn((self._compiled or self.model)(inputs), targets)
        self.scaler.scale(loss * weight).backward()
        return loss.detach()

    def forward_backward(self, inputs: Any, targets: Any, weight: float = 1.0) -> torch.Tensor:
        """Forward and backward on one micro-batch, adding ``weight`` times its gradient.

        The first call with ``compile=True`` is guarded: a compile error (not an
        out-of-memory error) switches to eager mode and runs the micro-batch again.
        """
        if self._compiled is None or self._compile_confirmed:
            return self._forward_backward(inputs, targets, weight)
        try:
            loss = self._forward_backward(inputs, targets, weight)
        except Exception as error:
            if is_out_of_memory(error):
                raise
            self._fall_back(error)
            self.optimizer.zero_grad(set_to_none=True)
            return self._forward_backward(inputs, targets, weight)
        self._compile_confirmed = True
        return loss

    def optimizer_step(self) -> None:
        """Step the optimizer (through the scaler for fp16) and clear the gradients."""
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=self.config.set_to_none)
        self.steps += 1

    def prepare(self, batch: Sequence[Any]) -> tuple[Any, Any]:
        """``(inputs, targets)`` of ``batch`` on the step's device, in its memory layout."""
        inputs, targets = to_device(tuple(batch[:2]), self.device)
        if self.config.channels_last and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs, targets

    def __call__(self, batch: Sequence[Any]) -> torch.Tensor:
        inputs, targets = self.prepare(batch)
        self.model.train()
        total = len(targets)
        chunks = min(self.config.accumulation_steps, total)
        losses = []
        for micro_inputs, micro_targets in zip(
            torch.tensor_split(inputs, chunks), torch.tensor_split(targets, chunks), strict=True
        ):
            weight = len(micro_targets) / total  # exact for mean losses, even when uneven
            losses.append(self.forward_backward(micro_inputs, micro_targets, weight) * weight)
        self.optimizer_step()
        return torch.stack(losses).sum()


@dataclass
class TrainResult:
    """What :func:`train` measured. ``seconds`` includes a final device synchronization."""

    losses: list[float] = field(default_factory=list)
    steps: int = 0
    samples: int = 0
    seconds: float = 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def train(
    step: TrainStep,
    loader: Iterable[Sequence[Any]],
    *,
    max_steps: int | None = None,
    epochs: int = 1,
) -> TrainResult:
    """Run ``step`` over ``loader`` for ``epochs`` (stopping after ``max_steps``), with one
    synchronization at the end, not one per step. Calls ``loader.sampler.set_epoch(epoch)``
    when the sampler has it (DDP)."""
    sync = synchronizer(step.device)
    losses: list[torch.Tensor] = []
    samples = 0
    sync()
    start = time.perf_counter()
    for epoch in range(epochs):
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # type: ignore[union-attr]
        for batch in loader:
            losses.append(step(batch))
            samples += len(batch[1])
            if max_steps is not None and len(losses) >= max_steps:
                break
        if max_steps is not None and len(losses) >= max_steps:
            break
    sync()
    seconds = time.perf_counter() - start
    values = torch.stack(losses).float().cpu().tolist() if losses else []
    return TrainResult(values, len(losses), samples, seconds)


def scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """The linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD"):
    multiply the learning rate by the factor the batch grows by.

    >>> scaled_lr(0.1, 32, 128)
    0.4
    """
    return base_lr * batch / base_batch


def train_accumulated(
    dataset: Dataset[Any],
    *,
    micro_batch: int,
    accumulation_steps: int = 1,
    lr: float = 0.05,
    optimizer_steps: int = 20,
    model_name: str = "small_cnn",
    model_kwargs: dict[str, Any] | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> TrainResult:
    """Train a fresh model (seeded) with an effective batch of ``micro_batch x
    accumulation_steps`` for ``optimizer_steps`` steps, a loss per step; the data order is
    fixed by ``seed``, so runs differ only in the batch and the learning rate."""
    torch.manual_seed(seed)
    config = TrainConfig(precision="fp32", accumulation_steps=accumulation_steps, lr=lr)
    step = TrainStep(build_model(model_name, **(model_kwargs or {})), device, config)
    batch = micro_batch * accumulation_steps
    loader = DataLoader(
        dataset, batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    epochs = math.ceil(optimizer_steps * batch / len(dataset))  # type: ignore[arg-type]
    return train(step, loader, max_steps=optimizer_steps, epochs=max(1, epochs))
