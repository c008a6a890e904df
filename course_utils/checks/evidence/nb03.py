"""Notebook 03's observing halves, exercise (b): the DataLoader the learner's ``gpu_loader``
builds, read setting by setting, and the copies the learner's ``to_gpu`` makes of a nested
batch, watched with :func:`~course_utils.spies.record_tensor_to` (``pretend_cuda``: a
CPU runtime watches code written for a GPU). What they should be is decided in
:mod:`course_utils.checks.nb03`."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import RandomSampler, TensorDataset

from course_utils.checks.boundary import observed
from course_utils.checks.core import course_helpers_refused
from course_utils.checks.evidence.values import exception_seen, value_of
from course_utils.device import to_device  # the course's own: refused
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed
from course_utils.spies import is_cuda_target, record_tensor_to

#: The settings of the loader :func:`loader_settings` reads.
LOADER_SETTINGS = ("batch_size", "num_workers", "persistent_workers", "prefetch_factor")


@observed
def loader_settings(gpu_loader: Any) -> dict[str, Any]:
    """``gpu_loader(dataset, 4, workers=2)`` and ``gpu_loader(dataset, 4, workers=0)`` on a
    small dataset, and the first batch of the second: ``{"failed": ...}`` when the second
    raised ``ValueError``, ``{"raised": ...}`` when anything else raised
    (:func:`~course_utils.checks.evidence.values.exception_seen`); else both loaders'
    ``pin_memory`` and the first's :data:`LOADER_SETTINGS` (:func:`~course_utils.checks.
    evidence.values.value_of`; a setting it lacks reads None), whether both shuffle (a
    ``RandomSampler``), whether CUDA is there and the batch came pinned."""
    dataset = TensorDataset(torch.randn(12, 3), torch.arange(12))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # on a CPU PyTorch warns that pinning needs a GPU
            loader = gpu_loader(dataset, 4, workers=2)
            try:
                plain = gpu_loader(dataset, 4, workers=0)
                batch = next(iter(plain))
            except ValueError as error:
                return {"failed": exception_seen(error)}
        pins = [value_of(one.pin_memory, "loader.pin_memory") for one in (loader, plain)]
        return {
            "pins": pins,
            "settings": {
                name: value_of(getattr(loader, name, None), f"loader.{name}")
                for name in LOADER_SETTINGS
            },
            "shuffled": all(isinstance(one.sampler, RandomSampler) for one in (loader, plain)),
            "cuda": torch.cuda.is_available(),
            "batch pinned": all(tensor.is_pinned() for tensor in batch),
        }
    except Exception as error:  # the learner's code failed: the part says how
        return {"raised": exception_seen(error)}


def _pretend_pinned(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, answering ``is_pinned()`` with True (a CPU grader cannot pin memory)."""
    tensor.is_pinned = lambda *args, **kwargs: True  # type: ignore[method-assign]
    return tensor


@observed
def copy_to_gpu_moves(to_gpu: Any, names: list[str]) -> dict[str, Any]:
    """``to_gpu(batch, torch.device("cuda"))`` on a nested batch (pretend-pinned images,
    labels and boxes, a pageable mask, the file ``names``), its ``Tensor.to`` and
    ``.cuda`` calls recorded and the course's ``to_device`` refused: ``{"refused": True}``
    when it called ``to_device``; ``{"check failed": message}`` for another
    :class:`~course_utils.feedback.CheckFailed` raised inside it; ``{"raised": ...}``
    when it raised (:func:`~course_utils.checks.evidence.values.exception_seen`), ``{"crashed":
    ...}`` when reading what it returned raised; else whether it left the batch's dict as
    it was, whether the result has the batch's shape (then its keys and names, and for
    each tensor of :data:`~course_utils.checks.evidence.nb03.TO_GPU_TENSORS` whether it was copied,
    made anew, pinned, copied asynchronously, returned as its copy), and its containers'
    types."""
    images, labels = _pretend_pinned(torch.randn(4, 3, 2, 2)), _pretend_pinned(torch.arange(4))
    mask = torch.ones(4, dtype=torch.bool)
    boxes = [_pretend_pinned(torch.rand(n, 4)) for n in (2, 1, 3, 1)]  # a list: n per image
    inner = {"label": labels, "mask": mask}
    batch = (images, inner, list(names), boxes)
    where = dict(zip(TO_GPU_TENSORS, (images, labels, mask, boxes[0], boxes[3]), strict=True))
    with (
        record_tensor_to(pretend_cuda=True) as moves,
        course_helpers_refused({"to_device": to_device}, "to_device"),
    ):
        try:
            result = to_gpu(batch, torch.device("cuda"))
        except CheckFailed as failure:  # the refusal, or a spy's
            said = str.__str__(str(failure))
            if said == MESSAGES_CHECKS["refused"].format(name="to_device"):
                return {"refused": True}
            return {"check failed": said}
        except Exception as error:  # the learner's code failed: the check says how
            return {"raised": exception_seen(error)}
    try:
        return _copies(result, inner, where, moves)
    except Exception as error:  # reading what it returned failed: the part says how
        return {"crashed": exception_seen(error)}


def _copies(result: Any, inner: dict[str, Any], where: dict[str, Any], moves: list[Any]) -> Any:
    """What :func:`copy_to_gpu_moves` says of ``result``, the batch's ``inner`` dict and
    the copies of the batch's tensors (``where``, by name) among ``moves``."""
    labels, mask = where["labels"], where["mask"]
    seen: dict[str, Any] = {
        "batch keys": value_of(list(inner), "batch[1]"),  # your function may have changed them
        "dict kept": set(inner) == {"label", "mask"}
        and inner["label"] is labels
        and inner["mask"] is mask,
        "shaped": isinstance(result, Sequence)
        and len(result) == 4
        and isinstance(result[1], Mapping)
        and set(result[1]) == {"label", "mask"}
        and isinstance(result[3], Sequence)
        and len(result[3]) == 4,
    }
    if not seen["shaped"]:
        return seen
    seen["keys"] = value_of(list(result[1]), "to_gpu(batch, device)[1]")
    seen["names"] = value_of(list(result[2]), "to_gpu(batch, device)[2]")
    returned = (result[0], result[1]["label"], result[1]["mask"], result[3][0], result[3][3])
    seen["tensors"] = {}
    for (name, tensor), back in zip(where.items(), returned, strict=True):
        copies = [m for m in moves if m.source_id == id(tensor) and is_cuda_target(m.target)]
        seen["tensors"][name] = {
            "copied": bool(copies),
            "made": back is not tensor,
            "pinned": bool(tensor.is_pinned()),
            "asynchronous": all(m.non_blocking for m in copies),
            "its copy": id(back) in {m.result_id for m in copies},
        }
    seen["exact types"] = [type(result) is tuple, type(result[3]) is list]
    seen["type names"] = [str.__str__(type(c).__name__) for c in (result, result[3])]
    return seen


#: The tensors of exercise 03 (b)'s batch, each by the name its messages have in
#: :data:`MESSAGES_03`.
TO_GPU_TENSORS = ("images", "labels", "mask", "first boxes", "last boxes")
