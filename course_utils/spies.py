"""Spies that record what code does while it runs: each tensor it moves to a device
(:func:`record_tensor_to`), each autocast region it opens (:func:`record_autocast`,
:func:`record_autocast_devices`), and memory it reads before writing
(:func:`uninitialised_memory_filled`). Notebooks use them to show a loop's copies, and the
exercise checks' observing halves (:mod:`course_utils.checks.evidence`) to watch an answer.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from course_utils.feedback import plain_value


@dataclass(frozen=True)
class TensorMove:
    """One call of ``Tensor.to`` seen by :func:`record_tensor_to`."""

    source_device: str
    pinned: bool  # the source tensor was in pinned (page-locked) memory
    non_blocking: bool  # the call asked for an asynchronous copy
    target: str  # the device (or dtype) asked for, as text
    source_id: int = 0  # id() of the tensor the call was made on
    result_id: int = 0  # id() of the tensor it returned
    source_dtype: torch.dtype | None = None  # the dtype of the tensor the call was made on


@contextlib.contextmanager
def record_tensor_to(*, pretend_cuda: bool = False) -> Iterator[list[TensorMove]]:
    """Record every ``Tensor.to(...)`` call made inside the ``with`` block (a spy: the
    calls still run). Exercise checks use it to see *how* a learner moved a batch.
    ``pretend_cuda=True``: a move to a CUDA device (``.to`` or ``.cuda``) is recorded and
    returns a CPU copy instead, so that a CPU grader can watch code written for a GPU.

    >>> with record_tensor_to() as moves:
    ...     _ = torch.ones(2).to("cpu", non_blocking=True)
    >>> [(move.source_device, move.non_blocking) for move in moves]
    [('cpu', True)]
    >>> with record_tensor_to(pretend_cuda=True) as moves:
    ...     _ = torch.ones(2).to("cuda:0")
    >>> moves[0].target, _.device.type
    ('cuda:0', 'cpu')
    """
    original_to, original_cuda = torch.Tensor.to, torch.Tensor.cuda
    own = {name: name in vars(torch.Tensor) for name in ("to", "cuda")}  # else from TensorBase
    moves: list[TensorMove] = []

    def record(self: torch.Tensor, target: Any, asynchronous: Any, move: Any) -> Any:
        pinned = self.device.type == "cpu" and bool(self.is_pinned())
        plain_value(asynchronous, "non_blocking")  # a subclass of int could say it is true
        result = self.detach().clone() if pretend_cuda and is_cuda_target(target) else move()
        moves.append(
            TensorMove(
                str(self.device),
                pinned,
                bool(asynchronous),
                str(target),
                id(self),
                id(result),
                self.dtype,
            )
        )
        return result

    def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        target = kwargs.get("device", kwargs.get("dtype", args[0] if args else ""))
        # positional forms: to(device, dtype, non_blocking) or to(dtype, non_blocking)
        asynchronous = kwargs.get("non_blocking", any(arg is True for arg in args))
        return record(self, target, asynchronous, lambda: original_to(self, *args, **kwargs))

    def cuda_spy(self: torch.Tensor, device: Any = None, non_blocking: bool = False) -> Any:
        target = torch.device("cuda", device) if isinstance(device, int) else device or "cuda"
        return record(self, target, non_blocking, lambda: original_cuda(self, device, non_blocking))

    torch.Tensor.to = spy  # type: ignore[method-assign,assignment]
    if pretend_cuda:
        torch.Tensor.cuda = cuda_spy  # type: ignore[method-assign,assignment]
    try:
        yield moves
    finally:
        for name, method in (("to", original_to), ("cuda", original_cuda)):
            if own[name]:
                setattr(torch.Tensor, name, method)
            elif name in vars(torch.Tensor):
                delattr(torch.Tensor, name)


def is_cuda_target(target: Any) -> bool:
    """Whether a ``Tensor.to`` target (a device, its name or index; not a dtype) is CUDA.

    >>> is_cuda_target("cuda:1"), is_cuda_target(torch.device("cpu")), is_cuda_target(torch.float16)
    (True, False, False)
    """
    if isinstance(target, torch.dtype | torch.Tensor | bool):
        return False
    try:
        return torch.device(target).type == "cuda"
    except (RuntimeError, TypeError, ValueError):
        return False


@contextlib.contextmanager
def record_autocast(
    module: torch.nn.Module, device_type: str = "cpu"
) -> Iterator[list[torch.dtype | None]]:
    """Spy on ``module``: for each call made inside the ``with`` block, the dtype
    ``torch.autocast`` was casting to for ``device_type`` (``None``: autocast was off).

    >>> layer = torch.nn.Linear(2, 2)
    >>> with record_autocast(layer) as seen:
    ...     _ = layer(torch.ones(1, 2))
    ...     with torch.autocast("cpu", dtype=torch.bfloat16):
    ...         _ = layer(torch.ones(1, 2))
    >>> seen
    [None, torch.bfloat16]
    """
    seen: list[torch.dtype | None] = []

    def hook(_module: Any, _args: Any) -> None:
        enabled = torch.is_autocast_enabled(device_type)
        seen.append(torch.get_autocast_dtype(device_type) if enabled else None)

    handle = module.register_forward_pre_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


@contextlib.contextmanager
def uninitialised_memory_filled() -> Iterator[None]:
    """Inside the block, memory PyTorch hands out uninitialised (``torch.empty``,
    ``new_empty``, ``empty_like``) is filled with NaN (integers: their largest value), so a
    check sees values the learner's code never set, whatever was in memory before. It turns
    on ``torch.use_deterministic_algorithms`` (warnings only) for the block.

    >>> with uninitialised_memory_filled():
    ...     rows = torch.empty(2)
    >>> rows.isnan().all().item(), torch.are_deterministic_algorithms_enabled()
    (True, False)
    """
    import torch.utils.deterministic as deterministic  # lazy: a flag read at import

    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)
    deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "has no deterministic implementation": only warns
            yield
    finally:
        deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


@contextlib.contextmanager
def record_autocast_devices() -> Iterator[list[str]]:
    """The ``device_type`` of every ``torch.autocast`` (``torch.amp.autocast``,
    ``torch.cuda.amp.autocast``) made inside the block. A CUDA one runs as a CPU autocast
    of the same dtype, so a CPU grader can watch code written for a GPU with
    :func:`record_autocast`.

    >>> with record_autocast_devices() as devices:
    ...     with torch.autocast("cuda", dtype=torch.bfloat16):
    ...         cpu_state = torch.is_autocast_enabled("cpu")
    >>> devices, cpu_state
    (['cuda'], True)
    """
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__init__
    devices: list[str] = []

    def spy(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        devices.append(str(plain_value(device_type, "torch.autocast(device_type)")))
        original(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    autocast.__init__ = spy  # type: ignore[method-assign]
    try:
        yield devices
    finally:
        autocast.__init__ = original  # type: ignore[method-assign]
