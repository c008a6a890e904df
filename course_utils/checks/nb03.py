"""Notebook 03's deciding halves, exercise (b): from what
:mod:`course_utils.checks.evidence.nb03` saw of the learner's ``gpu_loader`` and
``to_gpu``, the verdict of each part and its feedback
(:data:`course_utils.classroom.MESSAGES_03`).

The check cell gathers both parts' evidence first (:func:`gpu_loader_evidence`,
:func:`to_gpu_evidence`), then decides each part inside
:func:`~course_utils.classroom.check_parts` (:func:`decide_gpu_loader`,
:func:`decide_to_gpu`): what the learner's code raised is evidence, a part's failure; what
the grader found tampered with while gathering it is not caught by ``check_parts``."""

from __future__ import annotations

from typing import Any

from course_utils.checks import said_by_your_code
from course_utils.checks.evidence.nb03 import copy_to_gpu_moves, loader_settings
from course_utils.checks.values import answered
from course_utils.classroom import (
    MESSAGES_03,
    MESSAGES_CHECKS,
    TO_GPU_TENSORS,
    CheckFailed,
    check,
)

#: What ``gpu_loader(dataset, 4, workers=2)`` should set.
WANTED_SETTINGS = {
    "batch_size": 4,
    "num_workers": 2,
    "persistent_workers": True,
    "prefetch_factor": 4,
}
#: The file names in the batch the check gives ``to_gpu`` (not tensors: kept as they are).
BATCH_NAMES = ["a.png", "b.png", "c.png", "d.png"]


def _part_raised(raised: dict[str, Any]) -> CheckFailed:
    """The failure of a part whose code raised (as :func:`~course_utils.classroom.
    check_parts` says it); the message is the learner's."""
    said_by_your_code(raised["message"])
    return CheckFailed(
        MESSAGES_CHECKS["part raised"].format(kind=raised["kind"], error=raised["message"])
    )


def gpu_loader_evidence(gpu_loader: Any) -> dict[str, Any]:
    """What :func:`~course_utils.checks.evidence.nb03.loader_settings` saw of
    ``gpu_loader``."""
    return loader_settings(gpu_loader)


def decide_gpu_loader(seen: dict[str, Any]) -> None:
    """The verdict on a learner's ``gpu_loader`` from :func:`gpu_loader_evidence`: pinned,
    shuffled batches, and with workers, persistent ones that prefetch 4 batches each."""
    if "raised" in seen:
        raise _part_raised(seen["raised"])
    if "failed" in seen:
        error = seen["failed"]["message"]
        said_by_your_code(error)
        raise CheckFailed(MESSAGES_03["gpu_loader failed"].format(error=error))
    pins = [answered(record) for record in seen["pins"]]
    check(all(pins), MESSAGES_03["gpu_loader not pinned"])
    for setting, wanted in WANTED_SETTINGS.items():
        check(
            answered(seen["settings"][setting]) == wanted,
            MESSAGES_03["gpu_loader setting"].format(setting=setting, wanted=wanted),
        )
    check(seen["shuffled"], MESSAGES_03["gpu_loader no shuffle"])
    check(not seen["cuda"] or seen["batch pinned"], MESSAGES_03["gpu_loader not pinned on the GPU"])


def check_gpu_loader(gpu_loader: Any) -> None:
    """Check a learner's ``gpu_loader(dataset, batch_size, workers=)``: pinned, shuffled
    batches, and with workers, persistent ones that prefetch 4 batches each (notebook 03).

    >>> from torch.utils.data import DataLoader
    >>> check_gpu_loader(lambda data, size, workers: DataLoader(data, size))
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: without pin_memory=True the batches stay in pageable \
memory, where .to(device, non_blocking=True) is an ordinary blocking copy
    """
    decide_gpu_loader(gpu_loader_evidence(gpu_loader))


def _copy_failure(raised: dict[str, Any]) -> str:
    """Feedback for a ``to_gpu`` that raised (:func:`~course_utils.checks.evidence.values.
    raised`)."""
    error = raised["message"]
    said_by_your_code(error)
    if "RuntimeError" in raised["builtins"] and any(
        words in error for words in ("pin", "NVIDIA driver", "accelerator")
    ):
        return MESSAGES_03["to_gpu pinned itself"]
    if "AttributeError" in raised["builtins"] and "attribute" in error:
        return MESSAGES_03["to_gpu not a tensor"].format(error=error)
    return MESSAGES_03["to_gpu raised"].format(kind=raised["kind"], error=error)


def to_gpu_evidence(to_gpu: Any) -> dict[str, Any]:
    """What :func:`~course_utils.checks.evidence.nb03.copy_to_gpu_moves` saw ``to_gpu`` do
    with a batch holding :data:`BATCH_NAMES`."""
    return copy_to_gpu_moves(to_gpu, BATCH_NAMES)


def decide_to_gpu(seen: dict[str, Any]) -> None:
    """The verdict on a learner's ``to_gpu`` from :func:`to_gpu_evidence`: the batch's
    structure returned, each tensor copied by ``.to`` (or ``.cuda``) on that very tensor,
    asynchronously where the tensor is pinned, the batch it was given left as it was."""
    if seen.get("refused"):
        raise CheckFailed(MESSAGES_CHECKS["refused"].format(name="to_device"))
    if "check failed" in seen:  # raised inside your function: said by the course, or by it
        said_by_your_code(seen["check failed"])
        raise CheckFailed(seen["check failed"])
    if "raised" in seen:
        raise CheckFailed(_copy_failure(seen["raised"]))
    if "crashed" in seen:
        raise _part_raised(seen["crashed"])
    answered(seen["batch keys"])  # its keys, which your function may have changed
    check(seen["dict kept"], MESSAGES_03["to_gpu changed the dict"])
    check(seen["shaped"], MESSAGES_03["to_gpu shape"])
    answered(seen["keys"])
    check(answered(seen["names"]) == BATCH_NAMES, MESSAGES_03["to_gpu names"])
    for name in TO_GPU_TENSORS:
        tensor = seen["tensors"][name]
        if not tensor["copied"]:
            made = "rebuilt" if tensor["made"] else "not copied"
            raise CheckFailed(MESSAGES_03[f"to_gpu {name} {made}"])
        if tensor["pinned"] and not tensor["asynchronous"]:
            raise CheckFailed(MESSAGES_03[f"to_gpu {name} blocking"])
        if not tensor["its copy"]:
            raise CheckFailed(MESSAGES_03[f"to_gpu {name} not its copy"])
    outer, inner = seen["type names"]
    check(
        all(seen["exact types"]),
        MESSAGES_03["to_gpu container types"].format(outer=outer, inner=inner),
    )


def check_copy_to_gpu(to_gpu: Any) -> None:
    """Exercise 03 (b): ``to_gpu(batch, device)`` must return the batch's structure with
    each tensor copied by ``.to`` (or ``.cuda``) on that very tensor, asynchronously where
    the tensor is pinned, leaving the batch it was given as it was. The copies are watched
    (:func:`~course_utils.checks.evidence.nb03.copy_to_gpu_moves`) on a nested batch of
    pretend-pinned images and labels and a pageable mask: it runs on a CPU.

    >>> check_copy_to_gpu(lambda batch, device: batch)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    course_utils.classroom.CheckFailed: the images tensor (batch[0]) was not copied: ...
    """
    decide_to_gpu(to_gpu_evidence(to_gpu))
