"""Batch size: the largest batch that fits in memory.

:func:`find_max_batch_size` calls ``trial(batch_size)`` (for example one training step at
that size) and finds the largest size that does not run out of memory: it doubles from
``low`` until a trial fails, then bisects between the last size that fitted and the first
that did not. With a true limit ``M`` it needs at most ``2 * ceil(log2(M)) + 2`` trials.
Used by notebooks 03, 04 and 07.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from course_utils.memory import is_out_of_memory, release_memory


@dataclass(frozen=True)
class Trial:
    """One call of the trial function."""

    batch_size: int
    fits: bool
    seconds: float
    error: str | None = None  # the first line of the out-of-memory message


@dataclass
class MaxBatchSize:
    """The result of :func:`find_max_batch_size`.

    ``batch_size`` is the answer (after the margin; 0 when not even a batch of 1 fits),
    ``limit`` the largest size that fitted, ``trials`` how many times the trial ran.
    """

    batch_size: int
    limit: int
    trials: int
    history: list[Trial] = field(default_factory=list)
    capped: bool = False  # the search stopped at ``high`` without running out of memory


def _attempt(trial: Callable[[int], Any], batch_size: int, history: list[Trial]) -> bool:
    start = time.perf_counter()
    message = None
    try:
        trial(batch_size)
        fits = True
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        fits = False
        message = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        # the exception's traceback refers to the frames that hold the big tensors:
        # drop it before freeing (Python deletes ``error`` at the end of this block).
    if not fits:  # a fitting trial's tensors die when it returns; a failed one's may sit
        release_memory()  # in reference cycles with the traceback, and in the GPU cache
    history.append(Trial(batch_size, fits, time.perf_counter() - start, message))
    return fits


def find_max_batch_size(
    trial: Callable[[int], Any],
    *,
    low: int = 1,
    high: int | None = None,
    margin: float = 0.0,
) -> MaxBatchSize:
    """The largest ``batch_size`` for which ``trial(batch_size)`` does not run out of memory.

    Out of memory means ``torch.cuda.OutOfMemoryError`` or a ``RuntimeError`` whose
    message says so (CUDA or the CPU allocator); any other exception is raised again.
    Memory is freed after each failed trial (``gc.collect()`` and ``empty_cache()``).
    ``high`` caps the search; ``margin`` (0 to <1) returns that fraction less than the
    limit found, leaving room for fragmentation and for other processes.

    >>> def trial(n):
    ...     if n > 100:
    ...         raise RuntimeError("CUDA out of memory (simulated)")
    >>> found = find_max_batch_size(trial)
    >>> found.batch_size, found.trials
    (100, 14)
    >>> find_max_batch_size(trial, margin=0.1).batch_size
    90
    """
    if low < 1:
        raise ValueError(f"low must be at least 1, got {low}")
    if high is not None and high < low:
        raise ValueError(f"high ({high}) must be at least low ({low})")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    history: list[Trial] = []
    good, bad = 0, None  # largest size known to fit; smallest known not to fit
    size = low
    while True:  # grow by doubling
        if high is not None:
            size = min(size, high)
        if _attempt(trial, size, history):
            good = size
            if high is not None and size >= high:
                break
            size *= 2
        else:
            bad = size
            break
    while bad is not None and bad - good > 1:  # bisect between good and bad
        middle = (good + bad) // 2
        if _attempt(trial, middle, history):
            good = middle
        else:
            bad = middle
    answer = good if margin == 0 else max(1 if good else 0, math.floor(good * (1 - margin)))
    return MaxBatchSize(
        batch_size=answer, limit=good, trials=len(history), history=history, capped=bad is None
    )
