"""Where a training step's memory goes, measured.

* :func:`saved_tensor_bytes`: the bytes autograd keeps for the backward pass while a
  function runs (activations), counted with ``torch.autograd.graph.saved_tensors_hooks``.
  Works on every device; each storage is counted once.
* :func:`peak_memory`: the peak memory of a function. On CUDA, the caching allocator's
  peak (``torch.cuda.max_memory_allocated``) above what was allocated before. The CPU has
  no allocator statistics, so there it reports the bytes saved for backward, the part of
  a training step's memory that grows with the batch (or, with ``rss=True``, the
  process's resident memory), and says so in ``method``.
  ``warmup=1`` first calls the function once unmeasured: the first CUDA step of a process
  or a model allocates things once and keeps them (cuBLAS workspaces, lazily built
  parameters and optimizer state), which a single measured call would count.

Used by notebooks 03 and 04 and by the batch-size sweep.
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

from course_utils.device import to_device
from course_utils.oom import MemoryBudget
from course_utils.training import OPTIMIZERS, TrainStep
from course_utils.units import MIB


def saved_tensor_bytes(
    fn: Callable[[], Any],
    exclude: Iterable[torch.Tensor] = (),
    *,
    budget: MemoryBudget | None = None,
) -> tuple[Any, int]:
    """Run ``fn()``; return its result and the bytes autograd saved for backward.

    Tensors sharing a storage with one of ``exclude`` are not counted (pass the model's
    parameters to count activations only: a layer saves its weight for backward too).
    With a ``budget``, its simulated out-of-memory error is raised as soon as the saved
    bytes exceed it, mid-forward, as an allocator with that much memory would.

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
    start = process.memory_info().rss
    highest = start
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
    """Peak memory of ``fn()`` on ``device`` (see the module documentation).

    On CUDA: the most bytes allocated at once during the call, minus the bytes allocated
    when it started, so tensors that already existed (parameters, optimizer state) do not
    count, but everything the call allocates does, even if freed before it returns
    (activations, gradients, temporaries, per-call cuDNN workspaces). ``warmup`` calls of
    ``fn`` run first, unmeasured: they make the one-time allocations a first call would
    add (cuBLAS workspaces, kept for the process; a model or optimizer state built
    lazily on the first step). Use ``warmup=1`` to measure what every step needs.

    On the CPU: the bytes autograd saved for backward, or with ``rss=True`` (for a whole
    run rather than one step) the process's resident memory sampled every 5 ms above its
    start: approximate, and lower for a second run that reuses memory a first one freed.

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


# ------------------------------------------------------------- the memory breakdown


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of ``tensors``, each counted as ``numel * element_size`` (a tensor met twice,
    such as a shared parameter, counts once).

    >>> tensor_bytes([torch.zeros(10), torch.zeros(3, dtype=torch.float16)])
    46
    """
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters.

    >>> parameter_bytes(nn.Linear(10, 5))  # 55 float32 numbers
    220
    """
    return tensor_bytes(model.parameters())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer keeps between steps (read from its ``state``).

    Empty until the first ``step()``: optimizers create their state lazily.
    """
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
    """The optimizer state predicted from the parameters alone (one of ``OPTIMIZERS``):

    * ``"sgd"``: nothing;
    * ``"momentum"``: one momentum buffer per parameter (1x the parameters);
    * ``"adam"``, ``"adamw"``: two moving averages (2x the parameters) plus a step
      counter per parameter tensor, a float32 scalar (4 bytes) in PyTorch 2.

    >>> expected_optimizer_state_bytes(nn.Linear(10, 5), "adam")  # 2 * 220 + 2 tensors * 4
    448
    """
    if optimizer not in _OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer={optimizer!r}: use one of {', '.join(_OPTIMIZER_SLOTS)}")
    slots, step_counter = _OPTIMIZER_SLOTS[optimizer]
    trainable = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad]
    counters = 4 * len(trainable) if step_counter else 0
    return slots * tensor_bytes(trainable) + counters


def activation_estimate(model: nn.Module, inputs: torch.Tensor) -> int:
    """Activation bytes predicted from shapes alone, before running anything for real.

    A copy of the model runs on the ``meta`` device (tensors with shapes and dtypes but
    no data, so no memory and almost no time); forward hooks add up the bytes of every
    leaf module's output, plus the input; outputs that are views or in-place results
    take no new memory and are skipped. That is the rule of thumb "training keeps every
    layer's output for the backward pass". Self-attention (``nn.MultiheadAttention``)
    computes its inside with functions no hook sees; it counts as queries, keys,
    values, the attention output and the result (5 x dim per token) plus the attention
    probabilities (heads x length per token).

    >>> activation_estimate(nn.Sequential(nn.Linear(8, 4), nn.ReLU()), torch.ones(2, 8))
    128
    """
    meta_model = copy.deepcopy(model).to("meta")
    meta_model.train()
    for module in meta_model.modules():  # a forward replaced on the instance (gradient
        vars(module).pop("forward", None)  # checkpointing) still points at the original
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

    handles = [
        module.register_forward_hook(add_output)
        for module in meta_model.modules()
        if not list(module.children())
    ]
    handles += [
        module.register_forward_hook(add_attention)
        for module in meta_model.modules()
        if isinstance(module, nn.MultiheadAttention)
    ]
    try:
        meta_model(inputs.to("meta"))
    finally:
        for handle in handles:
            handle.remove()
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

    def rows(self) -> list[tuple[str, int]]:
        """``(part, bytes)`` for a table or a bar chart."""
        return [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer_state),
            ("activations (measured)", self.activations),
            ("activations (estimated from shapes)", self.activations_estimate),
        ]

    def __str__(self) -> str:
        lines = [f"{part:37} {value / MIB:10.2f} MiB" for part, value in self.rows()]
        lines.append(f"{'peak = static + measured activations':37} {self.peak / MIB:10.2f} MiB")
        return "\n".join(lines) + f"\n(activations: {self.method})"


CUDA_METHOD = (
    "CUDA caching allocator: max_memory_allocated during forward+backward above the static part"
)
CPU_METHOD = (
    "CPU: bytes autograd saved for backward, parameters excluded (no CPU allocator "
    "statistics; leaves out temporaries and the block recomputed at a time by checkpointing)"
)


def measure_activations(
    forward_backward: Callable[[], Any], device: torch.device | str, exclude: Iterable[torch.Tensor]
) -> tuple[int, str]:
    """Activation bytes of ``forward_backward()`` and how they were measured.

    On CUDA: the allocator's peak during the call above what was allocated before it (so
    parameters, gradients and optimizer state allocated before do not count). On the CPU:
    the bytes saved for backward, ``exclude`` (the parameters) left out.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return peak_memory(forward_backward, device).peak_bytes, CUDA_METHOD
    _, saved = saved_tensor_bytes(forward_backward, exclude=exclude)
    return saved, CPU_METHOD


def step_until_taken(step: TrainStep, batch: Sequence[Any], *, max_steps: int = 30) -> int:
    """Run ``step(batch)`` until its optimizer really stepped; return how many steps ran.

    With fp16 and a ``GradScaler``, a step whose scaled gradients overflow (inf or nan) is
    skipped: ``scaler.step`` does not call ``optimizer.step()``, so a fresh optimizer
    still has no state, and ``scaler.update()`` halves the scale. At the default initial
    scale of 2**16 the first step of a fresh model often overflows (fp16's largest number
    is 65504). A skipped step is seen as the scale going down; without a scaler (fp32,
    bf16) the first step is always taken.
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
    """Measure where a :class:`~course_utils.training.TrainStep`'s memory goes on ``batch``.

    1. Estimate the activations from shapes (:func:`activation_estimate`), before running.
    2. Run one real step, so that the optimizer creates its state (lazily, at the first
       step; with fp16 a step the scaler skipped for overflow does not count), and
       give every parameter a zeroed gradient: now the static part (parameters,
       gradients, optimizer state) is allocated, and is read from the tensors themselves.
       With fp16 the gradient scaler may skip the first steps (an overflow): steps run
       until one is taken (:func:`step_until_taken`).
    3. Run forward and backward once more and measure the activations above the static
       part (:func:`measure_activations`); the step's toggles (precision, checkpointing,
       channels_last) apply. The gradients are then cleared.

    The step's parameters change (one optimizer step, more if fp16 skipped some): use a
    fresh model for training.
    ``estimate=False`` skips step 1 (``activations_estimate`` is then 0).
    """
    inputs, targets = to_device(tuple(batch[:2]), step.device)
    if step.config.channels_last and inputs.dim() == 4:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
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
