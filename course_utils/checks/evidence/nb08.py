"""Notebook 08's observing halves: the learner's training loop run with the course's
instruments around it, as on a GPU (spies and stand-ins for CUDA) and measured
(:func:`course_utils.capstone.run_loop`: the step profile, the CPU time, the spied habits,
the loss before and after). What comes back is data: what the spies saw, and
:class:`~course_utils.capstone.LoopRun` records of plain numbers. The thresholds are
decided in :mod:`course_utils.checks.nb08`."""

from __future__ import annotations

import itertools
import sys
import warnings
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch import nn

from course_utils.capstone import compare_loops
from course_utils.checks.boundary import observed
from course_utils.feedback import CheckFailed, builtin_error, plain_value
from course_utils.models import build_model
from course_utils.spies import (
    is_cuda_target,
    record_autocast,
    record_autocast_devices,
    record_tensor_to,
)


def _batch_tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, list | tuple):
        return [t for item in batch for t in _batch_tensors(item)]
    if isinstance(batch, dict):
        return [t for item in batch.values() for t in _batch_tensors(item)]
    return []


def _raised(error: BaseException) -> list[str]:
    """What an exception of the learner's code says, as data: its class's name and its
    message (both the learner's words, unless the class is one of Python's own)."""
    kind = builtin_error(type(error)) or type.__getattribute__(type(error), "__name__")
    try:
        message = str(error)
    except Exception:  # a learner's __str__ that fails says nothing
        message = ""
    return [str.__str__(text) if isinstance(text, str) else "" for text in (kind, message)]


@observed
def fast_loop_as_on_a_gpu(
    fast_loop: Any, data: Any, width: int = 8, steps: int = 3, model: nn.Module | None = None
) -> dict[str, Any]:
    """Exercise 08 (b)'s GPU habits, seen on any machine: ``fast_loop`` runs ``steps``
    steps of a fresh ``small_cnn`` (``width`` channels first; or ``model``) given
    ``device = torch.device("cuda")``, where a move to CUDA returns a CPU copy
    (:func:`record_tensor_to`), a CUDA autocast runs as a CPU one
    (:func:`record_autocast_devices`) and spies record each DataLoader's ``pin_memory``,
    each GradScaler, ``torch.cuda.is_available()`` asked and the forward passes' autocast
    dtype. Returns what they saw: ``raised`` (``[class, message]`` or None), ``refused``
    (a spy's refusal of a value that is not plain), ``batches`` taken, ``pinned`` per
    DataLoader, ``asked`` (the learner's ``is_available()`` calls), ``copies`` of batch
    tensors to CUDA and how many were ``blocking``, ``autocasts`` (device types),
    ``forwards`` (autocast dtypes, None: off) and ``scalers`` (enabled, for CUDA)."""
    from torch.utils.data import DataLoader  # lazy: as the learner's own import

    model = build_model("small_cnn", width=width) if model is None else model
    device = torch.device("cuda")
    pinned: list[bool] = []
    scalers: list[bool] = []  # each GradScaler made: enabled, for CUDA
    asked: list[int] = []
    batches: list[torch.Tensor] = []  # kept alive: their ids name the batch tensors
    loader_init, scaler_init = DataLoader.__init__, torch.amp.GradScaler.__init__

    def loader_spy(self: Any, *args: Any, **kwargs: Any) -> None:
        pin = plain_value(kwargs.pop("pin_memory", False), "DataLoader(pin_memory)")
        pinned.append(bool(pin))  # a CPU grader cannot pin
        loader_init(self, *args, **kwargs)

    def scaler_spy(self: Any, *args: Any, **kwargs: Any) -> None:
        # GradScaler(device, init_scale, growth_factor, backoff_factor, growth_interval,
        # enabled): made enabled for CUDA (a CPU grader then disables it, as CUDA is absent)
        enabled = kwargs.get("enabled", args[5] if len(args) > 5 else True)
        where = kwargs.get("device", args[0] if args else "cuda")
        plain_value([enabled, where], "GradScaler(device, enabled)")  # bool(), str() could lie
        scalers.append(bool(enabled) and str(where) == "cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "CUDA is not available. Disabling."
            scaler_init(self, *args, **kwargs)

    def is_available() -> bool:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not caller.startswith("torch"):  # the learner's question, not GradScaler's
            asked.append(1)
        return False

    def timed(loader: Any) -> Iterator[Any]:
        for batch in itertools.islice(loader, steps):
            batches.extend(_batch_tensors(batch))
            yield batch

    error: list[str] | None = None
    refused = ""
    with (
        mock.patch.object(DataLoader, "__init__", loader_spy),
        mock.patch.object(torch.amp.GradScaler, "__init__", scaler_spy),
        mock.patch.object(torch.cuda, "is_available", is_available),
        mock.patch.object(torch.cuda, "synchronize", lambda *args, **kwargs: None),
        record_tensor_to(pretend_cuda=True) as moves,
        record_autocast_devices() as autocasts,
        record_autocast(model) as forwards,
    ):
        try:
            fast_loop(data, model, device, timed)
        except NotImplementedError:  # not answered: the grader says so
            raise
        except CheckFailed as refusal:  # a spy refused a value that is not plain
            refused = str(refusal)
        except Exception as failure:  # the learner's mistake: what it was, as data
            error = _raised(failure)
    torch.set_autocast_enabled("cpu", False)  # an answer that raised may leave it on
    ids = {id(t) for t in batches}
    copies = [m for m in moves if m.source_id in ids and is_cuda_target(m.target)]
    return {
        "raised": error,
        "refused": refused,
        "batches": len(batches),
        "pinned": pinned,
        "asked": len(asked),
        "copies": len(copies),
        "blocking": sum(not m.non_blocking for m in copies),
        "autocasts": list(autocasts),
        "forwards": list(forwards),
        "scalers": scalers,
    }


@observed
def loop_runs(
    loops: list[Any], data: Any, device: Any, *, samples: int, width: int, rounds: int = 1
) -> dict[str, Any]:
    """The fastest of ``rounds`` measured runs of each loop, taken in turns
    (:func:`~course_utils.capstone.compare_loops`): ``runs``, one
    :class:`~course_utils.capstone.LoopRun` each, or ``refused`` (a spy's refusal of a
    value that is not plain, such as a loss of a subclass of float)."""
    try:
        runs = compare_loops(list(loops), data, device, samples=samples, width=width, rounds=rounds)
    except CheckFailed as refusal:
        return {"runs": [], "refused": str(refusal)}
    return {"runs": runs, "refused": ""}
