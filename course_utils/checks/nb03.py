"""Notebook 03's deciding halves, exercise (b): from what
:mod:`course_utils.checks.evidence.nb03` saw of the learner's ``gpu_loader`` and
``to_gpu``, the verdict of each part and its feedback
(:data:`course_utils.checks.nb03.MESSAGES_03`).

The check cell gathers both parts' evidence first (:func:`gpu_loader_evidence`,
:func:`to_gpu_evidence`), then decides each part inside
:func:`~course_utils.checks.core.check_parts` (:func:`decide_gpu_loader`,
:func:`decide_to_gpu`): what the learner's code raised is evidence, a part's failure; what
the grader found tampered with while gathering it is not caught by ``check_parts``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_utils.checks import said_by_your_code
from course_utils.checks.core import check
from course_utils.checks.evidence.nb03 import TO_GPU_TENSORS, copy_to_gpu_moves, loader_settings
from course_utils.checks.values import answered
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed, plain_value
from course_utils.language import Messages

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
    """The failure of a part whose code raised (as :func:`~course_utils.checks.core.
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
    course_utils.feedback.CheckFailed: without pin_memory=True the batches stay in pageable \
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
    course_utils.feedback.CheckFailed: the images tensor (batch[0]) was not copied: ...
    """
    decide_to_gpu(to_gpu_evidence(to_gpu))


#: Notebook 03's check messages, by a stable name (see :data:`MESSAGES_01`). Exercise (b)'s
#: feedback on one tensor of the batch has one message per tensor of the check's batch
#: (``"to_gpu <tensor> <mistake>"``, the tensors of :data:`TO_GPU_TENSORS`).
MESSAGES_03 = Messages(
    "03",
    {
        "to_gpu pinned itself": "to_gpu pinned the tensors itself (.pin_memory()): the "
        "DataLoader's pin_memory=True has already pinned them, and pinning a pageable tensor "
        "in the loop costs one more copy of the batch; call .to(device, non_blocking=True) on "
        "the batch's own tensors",
        "to_gpu not a tensor": "to_gpu called a tensor method on a value that is not a tensor "
        "({error}): go inside tuples, lists and dicts, copy only the tensors, return other "
        "values as they are",
        "to_gpu raised": "to_gpu(batch, device) raised {kind}: {error}",
        "to_gpu changed the dict": "to_gpu changed the dict inside the batch it was given: "
        "build a new dict instead",
        "to_gpu shape": "return the batch in its own shape: here a sequence of 4 items whose "
        "second item is a dict with the same keys ('label', 'mask') and whose last is a list "
        "of 4 tensors",
        "to_gpu names": "the file names (batch[2]) are not tensors: return them as they are",
        "to_gpu images rebuilt": "the images tensor (batch[0]) was not copied: you copied a "
        "new tensor made from it (clone, contiguous, torch.tensor...), which is in pageable "
        "memory, so that copy cannot be asynchronous: call .to(device, non_blocking=True) on "
        "the batch's own tensor",
        "to_gpu images not copied": "the images tensor (batch[0]) was not copied: copy every "
        "tensor of the batch, also those inside dicts, lists and tuples, with .to(device)",
        "to_gpu images blocking": "the images tensor (batch[0]) is in pinned memory but was "
        "copied with non_blocking=False (the default), so the host waits for each copy: pass "
        "non_blocking=True (or non_blocking=tensor.is_pinned())",
        "to_gpu images not its copy": "to_gpu returned the images tensor (batch[0]) itself, "
        "not its copy: .to returns a new tensor on the device, it does not move the tensor in "
        "place",
        "to_gpu labels rebuilt": "the labels tensor (batch[1]['label']) was not copied: you "
        "copied a new tensor made from it (clone, contiguous, torch.tensor...), which is in "
        "pageable memory, so that copy cannot be asynchronous: call .to(device, "
        "non_blocking=True) on the batch's own tensor",
        "to_gpu labels not copied": "the labels tensor (batch[1]['label']) was not copied: "
        "copy every tensor of the batch, also those inside dicts, lists and tuples, with "
        ".to(device)",
        "to_gpu labels blocking": "the labels tensor (batch[1]['label']) is in pinned memory "
        "but was copied with non_blocking=False (the default), so the host waits for each "
        "copy: pass non_blocking=True (or non_blocking=tensor.is_pinned())",
        "to_gpu labels not its copy": "to_gpu returned the labels tensor (batch[1]['label']) "
        "itself, not its copy: .to returns a new tensor on the device, it does not move the "
        "tensor in place",
        "to_gpu mask rebuilt": "the mask tensor (batch[1]['mask']) was not copied: you copied "
        "a new tensor made from it (clone, contiguous, torch.tensor...), which is in pageable "
        "memory, so that copy cannot be asynchronous: call .to(device, non_blocking=True) on "
        "the batch's own tensor",
        "to_gpu mask not copied": "the mask tensor (batch[1]['mask']) was not copied: copy "
        "every tensor of the batch, also those inside dicts, lists and tuples, with "
        ".to(device)",
        "to_gpu mask not its copy": "to_gpu returned the mask tensor (batch[1]['mask']) "
        "itself, not its copy: .to returns a new tensor on the device, it does not move the "
        "tensor in place",
        "to_gpu first boxes rebuilt": "the boxes of the first image (batch[3][0], in a list) "
        "was not copied: you copied a new tensor made from it (clone, contiguous, "
        "torch.tensor...), which is in pageable memory, so that copy cannot be asynchronous: "
        "call .to(device, non_blocking=True) on the batch's own tensor",
        "to_gpu first boxes not copied": "the boxes of the first image (batch[3][0], in a "
        "list) was not copied: copy every tensor of the batch, also those inside dicts, lists "
        "and tuples, with .to(device)",
        "to_gpu first boxes blocking": "the boxes of the first image (batch[3][0], in a list) "
        "is in pinned memory but was copied with non_blocking=False (the default), so the "
        "host waits for each copy: pass non_blocking=True (or "
        "non_blocking=tensor.is_pinned())",
        "to_gpu first boxes not its copy": "to_gpu returned the boxes of the first image "
        "(batch[3][0], in a list) itself, not its copy: .to returns a new tensor on the "
        "device, it does not move the tensor in place",
        "to_gpu last boxes rebuilt": "the boxes of the last image (batch[3][3], in a list) "
        "was not copied: you copied a new tensor made from it (clone, contiguous, "
        "torch.tensor...), which is in pageable memory, so that copy cannot be asynchronous: "
        "call .to(device, non_blocking=True) on the batch's own tensor",
        "to_gpu last boxes not copied": "the boxes of the last image (batch[3][3], in a list) "
        "was not copied: copy every tensor of the batch, also those inside dicts, lists and "
        "tuples, with .to(device)",
        "to_gpu last boxes blocking": "the boxes of the last image (batch[3][3], in a list) "
        "is in pinned memory but was copied with non_blocking=False (the default), so the "
        "host waits for each copy: pass non_blocking=True (or "
        "non_blocking=tensor.is_pinned())",
        "to_gpu last boxes not its copy": "to_gpu returned the boxes of the last image "
        "(batch[3][3], in a list) itself, not its copy: .to returns a new tensor on the "
        "device, it does not move the tensor in place",
        "to_gpu container types": "keep each container's type: the batch is a tuple and its "
        "boxes a list, but you returned a {outer} holding a {inner}: build each one with "
        "type(batch)(...)",
        "gpu_loader failed": "gpu_loader(..., workers=0) failed: {error}",
        "gpu_loader not pinned": "without pin_memory=True the batches stay in pageable memory, "
        "where .to(device, non_blocking=True) is an ordinary blocking copy",
        "gpu_loader setting": "gpu_loader(dataset, 4, workers=2) should set {setting}={wanted!r}",
        "gpu_loader no shuffle": "the loader should shuffle (shuffle=True)",
        "gpu_loader not pinned on the GPU": "on this GPU machine the batches should arrive pinned",
        # (a) the knee of a batch-size sweep
        "knee table": "knee(table) returned {got}: the knee is the smallest batch whose rate is "
        "at least fraction × the best rate (rows (3, 40.0), (12, 92.0), (48, 100.0) give 12)",
        "knee order": "the rows can come in any order: do not assume they are sorted",
        "knee fraction ignored": "with fraction=0.99 your knee gave 16, the knee at the default "
        "0.9: use the fraction argument",
        "knee fraction": "with fraction=0.99 your knee gave {got}: a batch qualifies when its "
        "rate is at least fraction × the best rate",
        "knee strict": "at fraction=0.5 your knee gave 32, as if a rate of exactly half the best "
        "did not qualify: 'at least' includes it, so use >=, not >",
        "knee half": "at fraction=0.5 your knee gave {got} for the rows {half}: a batch "
        "qualifies when its rate is at least fraction × the best rate",
        "knee largest": "your knee gave 4 for rows whose best rate is not the largest batch's, "
        "as if the best were the largest batch's rate: take the highest rate of all the rows",
        "knee peak": "your knee gave {got} for the rows {peak}: the best rate is the highest of "
        "all the rows, wherever it comes",
    },
)


def check_knee(knee: Callable[..., Any]) -> None:
    """Exercise 03 (a): ``knee(rows, fraction=0.9)`` on four tables (in order, reversed, a
    fraction of 0.99, a rate of exactly half the best, the best rate mid-table). A mistake
    is named only when the answer's knee is the one that mistake gives on that table;
    otherwise the rule is said, with another table's knee, never the failed table's.

    >>> def knee(rows, fraction=0.9):
    ...     best = max(rate for _, rate in rows)
    ...     return min(size for size, rate in rows if rate >= fraction * best)
    >>> check_knee(knee)
    >>> check_knee(lambda rows, fraction=0.9: 16)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    course_utils.feedback.CheckFailed: with fraction=0.99 your knee gave 16, the knee at ...
    """
    table = [(1, 100.0), (4, 350.0), (16, 920.0), (64, 1000.0), (256, 1010.0)]
    got = plain_value(knee(table), "knee(table)")
    check(got == 16, MESSAGES_03["knee table"].format(got=got))
    check(plain_value(knee(list(reversed(table))), "knee(rows)") == 16, MESSAGES_03["knee order"])
    got = plain_value(knee(table, fraction=0.99), "knee(table, fraction=0.99)")
    check(got != 16, MESSAGES_03["knee fraction ignored"])
    check(got == 64, MESSAGES_03["knee fraction"].format(got=got))
    half = [(32, 1000.0), (8, 500.0), (2, 100.0)]
    got = plain_value(knee(half, fraction=0.5), "knee(rows, fraction=0.5)")
    check(got != 32, MESSAGES_03["knee strict"])
    check(got == 8, MESSAGES_03["knee half"].format(got=got, half=half))
    peak = [(4, 650.0), (16, 1000.0), (64, 700.0)]
    got = plain_value(knee(peak), "knee(rows)")
    check(got != 4, MESSAGES_03["knee largest"])
    check(got == 16, MESSAGES_03["knee peak"].format(got=got, peak=peak))
