"""Where a training step's memory goes, measured: bytes saved for backward, the peak
memory of a function, and a step's breakdown into parameters, gradients, optimizer state
and activations. Notebooks 03, 04 and 07 and the batch finders.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from torch import nn

from course_utils.oom import MemoryBudget
from course_utils.training import OPTIMIZERS, TrainStep
from course_utils.units import MIB


def saved_tensor_bytes(
    fn: Callable[[], Any],
    exclude: Iterable[torch.Tensor] = (),
    *,
    budget: MemoryBudget | None = None,
) -> tuple[Any, int]:
    """Run ``fn()``; return its result and the bytes autograd saved for backward, each
    storage once, those of ``exclude`` (the parameters) not at all. A ``budget`` raises its
    simulated out-of-memory error as soon as the saved bytes exceed it, mid-forward.

    >>> x = torch.ones(256, requires_grad=True)
    >>> _, saved = saved_tensor_bytes(lambda: (x * x).sum())  # saves x twice: one storage
    >>> saved
    1024
    """
    seen: set[tuple[int, int]] = {
        (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in exclude
    }
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen and storage.nbytes() > 0:
            seen.add(key)
            total += storage.nbytes()
            if budget is not None:
                budget.charge(total)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = fn()
    return result, total


@dataclass(frozen=True)
class PeakMemory:
    """The peak memory of a function, in bytes, and how it was measured."""

    peak_bytes: int
    method: str

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MIB


def _rss_peak(fn: Callable[[], Any]) -> int:
    """The process's resident memory, sampled every 5 ms while ``fn()`` runs, above what
    it was before."""
    process = psutil.Process()
    start = highest = process.memory_info().rss
    done = threading.Event()

    def watch() -> None:
        nonlocal highest
        while not done.wait(0.005):
            highest = max(highest, process.memory_info().rss)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        fn()
    finally:
        done.set()
        watcher.join()
    return max(highest, process.memory_info().rss) - start


def peak_memory(
    fn: Callable[[], Any], device: torch.device | str, *, warmup: int = 0, rss: bool = False
) -> PeakMemory:
    """Peak memory of ``fn()`` on ``device`` after ``warmup`` unmeasured calls (one-time
    allocations), and how it was measured. CUDA: the allocator's peak above the start. The
    CPU has no allocator statistics: the bytes saved for backward (what grows with the
    batch), or with ``rss=True`` (a whole run) the resident memory sampled every 5 ms
    above its start (approximate; lower for a run reusing memory an earlier one freed).

    >>> x = torch.ones(256, requires_grad=True)
    >>> peak_memory(lambda: (x * x).sum(), "cpu", warmup=1).peak_bytes  # CPU: saved bytes
    1024
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        return PeakMemory(peak, "CUDA caching allocator: max_memory_allocated above the start")
    if rss:
        return PeakMemory(_rss_peak(fn), "CPU: process RSS peak above the start")
    _, saved = saved_tensor_bytes(fn)
    return PeakMemory(saved, "CPU: bytes autograd saved for backward (no CPU allocator stats)")


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of ``tensors``, each counted as ``numel * element_size`` (a tensor met twice,
    such as a shared parameter, counts once).

    >>> tensor_bytes([torch.zeros(10), torch.zeros(3, dtype=torch.float16)])
    46
    """
    unique = {id(tensor): tensor for tensor in tensors}.values()
    return sum(tensor.numel() * tensor.element_size() for tensor in unique)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters.

    >>> parameter_bytes(nn.Linear(10, 5))  # 55 float32 numbers
    220
    """
    return tensor_bytes(model.parameters())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer keeps between steps (empty until the first
    ``step()``: optimizers create their state lazily)."""
    return tensor_bytes(
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )


# slots of parameter size per trainable parameter, and whether a step counter is kept
_OPTIMIZER_SLOTS = dict(
    zip(OPTIMIZERS, [(0, False), (1, False), (2, True), (2, True)], strict=True)
)


def expected_optimizer_state_bytes(model: nn.Module, optimizer: str) -> int:
    """The optimizer state predicted from the parameters: SGD none, momentum 1x, Adam(W)
    2x plus a float32 step counter (4 bytes) per parameter tensor (PyTorch 2)."""
    if optimizer not in _OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer={optimizer!r}: use one of {', '.join(_OPTIMIZER_SLOTS)}")
    slots, step_counter = _OPTIMIZER_SLOTS[optimizer]
    trainable = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad]
    counters = 4 * len(trainable) if step_counter else 0
    return slots * tensor_bytes(trainable) + counters


def activation_estimate(model: nn.Module, inputs: torch.Tensor) -> int:
    """Activation bytes predicted from shapes: "training keeps every layer's output".

    A copy of the model runs on the ``meta`` device (shapes, no data); hooks add the
    input and every leaf module's output, skipping views and in-place results.
    ``nn.MultiheadAttention``'s inside, which no hook sees, counts 5 x dim per token
    (queries, keys, values, attention output, result) plus heads x length (probabilities)."""
    total = inputs.numel() * inputs.element_size()

    def add_output(module: nn.Module, args: Any, output: Any) -> None:
        nonlocal total
        if not isinstance(output, torch.Tensor):
            return
        if output._base is not None or any(output is arg for arg in args):
            return  # a view (Flatten) or an in-place result (ReLU(inplace=True)): no new memory
        total += output.numel() * output.element_size()

    def add_attention(module: nn.Module, args: Any, output: Any) -> None:
        nonlocal total
        query = args[0]
        batch_first = getattr(module, "batch_first", False)
        n, length = (query.shape[0], query.shape[1]) if batch_first else query.shape[1::-1]
        dim, heads = query.shape[-1], getattr(module, "num_heads", 1)
        total += n * length * (5 * dim + heads * length) * query.element_size()

    meta_model = copy.deepcopy(model).to("meta")  # a copy: its hooks go with it
    meta_model.train()
    for module in meta_model.modules():
        vars(module).pop("forward", None)  # a forward replaced on the instance (gradient
        if not list(module.children()):  # checkpointing) still points at the original
            module.register_forward_hook(add_output)
        if isinstance(module, nn.MultiheadAttention):
            module.register_forward_hook(add_attention)
    meta_model(inputs.to("meta"))
    return total


@dataclass(frozen=True)
class MemoryBreakdown:
    """Where one training step's memory goes, in bytes (see :func:`memory_breakdown`)."""

    batch_size: int
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int  # measured: the peak during forward + backward above the static part
    activations_estimate: int  # predicted from shapes before running
    method: str  # how ``activations`` was measured

    @property
    def static(self) -> int:
        """Bytes that do not depend on the batch: parameters, gradients, optimizer state."""
        return self.parameters + self.gradients + self.optimizer_state

    @property
    def peak(self) -> int:
        return self.static + self.activations

    def __str__(self) -> str:
        rows = [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer_state),
            ("activations (measured)", self.activations),
            ("activations (estimated from shapes)", self.activations_estimate),
            ("peak = static + measured activations", self.peak),
        ]
        lines = [f"{part:37} {value / MIB:10.2f} MiB" for part, value in rows]
        return "\n".join(lines) + f"\n(activations: {self.method})"


def measure_activations(
    forward_backward: Callable[[], Any], device: torch.device | str, exclude: Iterable[torch.Tensor]
) -> tuple[int, str]:
    """Activation bytes of ``forward_backward()`` and how they were measured: on CUDA the
    allocator's peak above its start; on the CPU the bytes saved for backward, without
    ``exclude`` (the parameters)."""
    if torch.device(device).type == "cuda":
        peak = peak_memory(forward_backward, device).peak_bytes
        return peak, "CUDA caching allocator: max_memory_allocated above the static part"
    _, saved = saved_tensor_bytes(forward_backward, exclude=exclude)
    return saved, (
        "CPU: bytes autograd saved for backward, parameters excluded (no CPU allocator "
        "statistics; leaves out temporaries and the block recomputed at a time by checkpointing)"
    )


def step_until_taken(step: TrainStep, batch: Sequence[Any], *, max_steps: int = 30) -> int:
    """Run ``step(batch)`` until its optimizer really stepped; return how many steps ran.

    With fp16 a ``GradScaler`` skips a step whose scaled gradients overflow (a fresh
    model's first step often does at the initial scale of 2**16; fp16 ends at 65504): the
    optimizer gets no state and the scale goes down, which is how a skip is seen.
    """
    scaler = step.scaler
    for attempt in range(1, max_steps + 1):
        scale = scaler.get_scale() if scaler.is_enabled() else None
        step(batch)
        if scale is None or scaler.get_scale() >= scale:
            return attempt
    raise RuntimeError(
        f"the gradient scaler skipped all {max_steps} steps (scale now "
        f"{scaler.get_scale():g}): the loss or the gradients are not finite"
    )


def memory_breakdown(
    step: TrainStep, batch: Sequence[Any], *, estimate: bool = True
) -> MemoryBreakdown:
    """Measure where a :class:`~course_utils.training.TrainStep`'s memory goes on ``batch``:
    estimate the activations from shapes (unless ``estimate=False``); run steps until one
    is taken, so the optimizer state exists, and give every parameter a zeroed gradient,
    so the static part is read from the tensors themselves; measure forward and backward
    once more. The step's parameters change: use a fresh model for training."""
    inputs, targets = step.prepare(batch)
    predicted = activation_estimate(step.model, inputs) if estimate else 0
    step_until_taken(step, (inputs, targets))
    parameters = list(step.model.parameters())
    for p in parameters:
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    activations, method = measure_activations(
        lambda: step.forward_backward(inputs, targets), step.device, exclude=parameters
    )
    grads = tensor_bytes(p.grad for p in parameters if p.grad is not None)
    result = MemoryBreakdown(
        batch_size=len(targets),
        parameters=parameter_bytes(step.model),
        gradients=grads,
        optimizer_state=optimizer_state_bytes(step.optimizer),
        activations=activations,
        activations_estimate=predicted,
        method=method,
    )
    step.optimizer.zero_grad(set_to_none=True)
    return result
