"""Notebook 08's deciding halves, from the evidence of :mod:`course_utils.checks.evidence.
nb08`: exercise (b)'s GPU habits (what the spies saw while the loop ran as on a GPU) and
its habits on this machine (what :func:`~course_utils.capstone.run_loop` counted). The
throughput, data-wait and loss thresholds are read in the check cell, on the runs'
figures."""

from __future__ import annotations

import builtins
from typing import Any

import torch
from torch import nn

from course_utils.capstone import LoopRun
from course_utils.checks import said_by_your_code
from course_utils.checks.evidence.nb08 import fast_loop_as_on_a_gpu, loop_runs
from course_utils.classroom import MESSAGES_08, MESSAGES_CHECKS, CheckFailed, check
from course_utils.instructor.checker import builtin_error


def _refused(evidence: dict[str, Any]) -> None:
    """A spy refused a value of the learner's that is not plain (a subclass of a built-in
    type): the check fails with the spy's sentence (raised while the learner's code ran,
    so the grader shows it as the learner's words)."""
    refusal = evidence["refused"]
    if refusal:
        said_by_your_code(refusal)
        raise CheckFailed(refusal)


def check_fast_loop_on_a_gpu(
    fast_loop: Any, data: Any, width: int = 8, steps: int = 3, model: nn.Module | None = None
) -> None:
    """Exercise 08 (b)'s GPU habits, seen on any grader
    (:func:`~course_utils.checks.evidence.nb08.fast_loop_as_on_a_gpu`: ``steps`` steps of a
    ``small_cnn`` of ``width``, or ``model``, given a CUDA device). The loop must pin its
    batches, copy them with ``non_blocking=True``, run the model under autocast for the
    device, and scale the loss when that is float16."""
    seen = fast_loop_as_on_a_gpu(fast_loop, data, width, steps, model)
    _refused(seen)
    if seen["raised"] is not None:
        kind, message = seen["raised"]
        found = vars(builtins).get(kind)  # a class of Python's own: not the learner's words
        pythons = isinstance(found, type) and builtin_error(found) == kind
        said_by_your_code(message, *([] if pythons else [kind]))
        error = MESSAGES_CHECKS["function raised"].format(kind=kind, error=message)
        raise CheckFailed(MESSAGES_08["fast_loop raised"].format(error=error))
    check(seen["batches"] > 0, MESSAGES_08["fast_loop no batches"])
    asked = seen["asked"]  # torch.cuda.is_available(), by the learner's code
    if not any(seen["pinned"]):
        raise CheckFailed(
            MESSAGES_08["fast_loop pinned by CUDA" if asked else "fast_loop not pinned"]
        )
    check(
        seen["blocking"] == 0,
        MESSAGES_08["fast_loop blocking copy"].format(
            blocking=seen["blocking"], moved=seen["copies"]
        ),
    )
    autocasts, forwards = seen["autocasts"], seen["forwards"]
    if "cuda" not in autocasts or not any(dtype is not None for dtype in forwards):
        others = sorted(set(autocasts) - {"cuda"})
        raise CheckFailed(
            MESSAGES_08["fast_loop autocast elsewhere"].format(devices=", ".join(others))
            if others and "cuda" not in autocasts
            else MESSAGES_08["fast_loop no autocast"]
        )
    if torch.float16 in forwards:
        check(any(seen["scalers"]), MESSAGES_08["fast_loop no scaler"])


def measured_loops(
    loops: list[Any], data: Any, device: Any, *, samples: int, width: int, rounds: int = 1
) -> list[LoopRun]:
    """The fastest of ``rounds`` measured runs of each loop, in turns
    (:func:`~course_utils.checks.evidence.nb08.loop_runs`), as figures: their rates,
    profiles, spied habits and losses decide here."""
    seen = loop_runs(loops, data, device, samples=samples, width=width, rounds=rounds)
    _refused(seen)
    return list(seen["runs"])


def check_loop_habits(run: LoopRun) -> None:
    """Exercise 08 (b): the habits the fixed loop must drop, each with its own feedback:
    the loss read on the host every step, ``empty_cache()`` in the loop, and a batch whose
    labels (or images) were left on the CPU: invisible on a CPU grader, fatal on a GPU."""
    check(
        run.item_calls <= 1 + run.steps // 10,
        MESSAGES_08["loop reads the loss"].format(reads=run.item_calls, steps=run.steps),
    )
    check(run.empty_cache_calls == 0, MESSAGES_08["loop empties the cache"])
    check(
        run.unmoved_labels == 0,
        MESSAGES_08["loop labels left"].format(left=run.unmoved_labels, steps=run.steps),
    )
    check(
        run.unmoved_inputs == 0,
        MESSAGES_08["loop images left"].format(left=run.unmoved_inputs, steps=run.steps),
    )
