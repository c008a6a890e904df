"""Notebook 08's deciding halves, from the evidence of :mod:`course_utils.checks.evidence.
nb08`: exercise (b)'s GPU habits (what the spies saw while the loop ran as on a GPU) and
its habits on this machine (what :func:`~course_utils.capstone.run_loop` counted). The
throughput, data-wait and loss thresholds are read in the check cell, on the runs'
figures."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from course_utils.capstone import LoopRun
from course_utils.checks import said_by_your_code
from course_utils.checks.core import _kind, answer_and_error, check, matching_mistake
from course_utils.checks.evidence.nb08 import fast_loop_as_on_a_gpu, loop_runs
from course_utils.feedback import MESSAGES_CHECKS, CheckFailed, builtin_error, plain_value
from course_utils.language import Messages


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


#: Notebook 08's check messages, by a stable name (see :data:`MESSAGES_01`).
MESSAGES_08 = Messages(
    "08",
    {
        "read_profile raised": "{error} (on a profile where {phase} took most of the step time)",
        "read_profile not a pair": "return two things, the bottleneck and the speed-up: "
        "return bottleneck, max_speedup (got {kind})",
        "bottleneck not a phase": 'the bottleneck should be "data", "copy" or "compute", not '
        "{bottleneck}",
        "bottleneck constant": "read_profile gave {bottleneck!r} for a profile where {phase} took "
        "most of the step time: compute the answer from the profile argument, not from this run",
        "bottleneck smallest": "read_profile gave {bottleneck!r}, the phase that took the least "
        "time, for a profile where {phase} took the most: the bottleneck is the largest phase",
        "bottleneck wrong": "read_profile gave {bottleneck!r} for a profile where {phase} took "
        "most of the step time (data {data:.0%}, copy {copy:.0%}, compute {compute:.0%})",
        "speedup not a number": "the speed-up should be a number, got {kind}",
        "speedup constant": "read_profile gave the same speed-up, {got:.2f}, for profiles whose "
        "bottleneck took different shares of the step: compute it from the profile argument",
        "speedup share": "the speed-up {got:.2f} is the bottleneck's share of the step time; "
        "removing the phase leaves the rest of the step: total / (total - phase), above 1",
        "speedup rest share": "the speed-up {got:.2f} is the share of the step left without the "
        "phase; a speed-up is the old time over the new one: total / (total - phase)",
        "speedup total over phase": "the speed-up {got:.2f} is the step time over the phase; "
        "removing the phase leaves the rest of the step: total / (total - phase)",
        "speedup minus one": "the speed-up {got:.2f} is the time saved over the time left, one "
        "less than the speed-up: total / (total - phase) (1 s steps with 0.75 s of data: 4x)",
        "speedup of the data phase": "the speed-up {got:.2f} is what removing the data phase "
        "gains, for a profile where {phase} took most of the step time: use the bottleneck's time",
        "fast_loop raised": "{error} (your fast_loop run as on a GPU, device cuda)",
        "fast_loop no batches": "your fast_loop took no batch from timed(loader) on a GPU "
        "device: iterate for inputs, targets in timed(loader)",
        "fast_loop not pinned": "on a GPU your DataLoader does not pin its batches: pass "
        "pin_memory=True when device.type == 'cuda', so that the copy to the GPU can overlap "
        "the compute",
        "fast_loop pinned by CUDA": "on a GPU your DataLoader's pin_memory followed "
        "torch.cuda.is_available(), not the device you were given: decide with device.type == "
        "'cuda'",
        "fast_loop blocking copy": "on a GPU your loop copied {blocking} of {moved} batch "
        "tensors with .to(device) without non_blocking=True: from pinned memory "
        "non_blocking=True lets the CPU go on while the copy runs",
        "fast_loop no autocast": "on a GPU your loop ran the model without torch.autocast: "
        "wrap the forward pass and the loss in torch.autocast(device.type, "
        "dtype=torch.float16) (mixed precision)",
        "fast_loop autocast elsewhere": "on a GPU your loop's autocast was for {devices}, not "
        "the device the model runs on: write torch.autocast(device.type, dtype=torch.float16)",
        "fast_loop no scaler": "on a GPU your loop trains in float16 without a gradient "
        "scaler: small gradients underflow to 0 in float16; scale the loss with "
        "torch.amp.GradScaler() (scaler.scale(loss).backward(), scaler.step, scaler.update)",
        "speedup wrong": "read_profile gave a speed-up of {got:.2f} for a profile where {phase} "
        "took {share:.0%} of the step time: without the phase the step takes the rest, so the "
        "most it can gain is total / (total - phase) (1 s steps with 0.75 s of data: 4x)",
        "loop reads the loss": "your loop read the loss on the CPU {reads} times in {steps} "
        "steps (.item() or float()): each read makes the CPU wait for the GPU; keep the losses "
        "as tensors, or log every 10th step",
        "loop empties the cache": "you call torch.cuda.empty_cache() in the loop: it gives the "
        "cache back and the next step allocates it again; drop it",
        "loop labels left": "your loop moved the images to the device but left the labels on "
        "the CPU in {left} of {steps} steps: move them too, labels.to(device, "
        "non_blocking=True); on a GPU, cross_entropy of GPU logits and CPU labels fails",
        "loop images left": "your loop moved the labels to the device but not the images in "
        "{left} of {steps} steps: move them with images.to(device, non_blocking=True) before "
        "the model",
    },
)


def _profiles_for_read_profile(own: Any) -> list[Any]:
    """This run's profile and three made up, one per bottleneck, whose phases add up to
    the step time, so that each usual mistake of 08 (a) differs from the right answer."""
    from course_utils.profiling import LoopProfile  # lazy: profiling imports the package

    made_up = [(0.7, 0.01, 0.29), (0.15, 0.05, 0.8), (0.2, 0.55, 0.25)]
    shares = [LoopProfile(10, 80, d, c, m, wall_s=1.0) for d, c, m in made_up]
    return [own, *shares]


def _phases(profile: Any) -> dict[str, float]:
    return {"data": profile.data_s, "copy": profile.copy_s, "compute": profile.compute_s}


def check_read_profile(read_profile: Callable[[Any], Any], own: Any) -> None:
    """Exercise 08 (a): ``read_profile(profile)`` gives ``(bottleneck, max_speedup)`` for
    this run's profile ``own`` and for made-up profiles where each phase dominates in turn,
    so that an answer written down from one run (a constant) fails. A wrong answer is told
    the usual mistake its results match on every profile, else what it gave for one
    profile and the property it breaks, never that profile's speed-up."""
    profiles = _profiles_for_read_profile(own)
    names, speedups = [], []
    for profile in profiles:
        phases = _phases(profile)
        phase = max(phases, key=lambda name: phases[name])
        out, error = answer_and_error(read_profile, profile)
        check(error is None, MESSAGES_08["read_profile raised"].format(error=error, phase=phase))
        plain_value(out, "read_profile(profile)")
        check(
            isinstance(out, tuple | list) and len(out) == 2,
            MESSAGES_08["read_profile not a pair"].format(kind=_kind(out)),
        )
        bottleneck, speedup = out
        check(
            bottleneck in ("data", "copy", "compute"),
            MESSAGES_08["bottleneck not a phase"].format(bottleneck=repr(bottleneck)),
        )
        speedup = speedup.item() if isinstance(speedup, torch.Tensor) else speedup
        check(
            isinstance(speedup, int | float) and not isinstance(speedup, bool),
            MESSAGES_08["speedup not a number"].format(kind=_kind(speedup)),
        )
        names.append(bottleneck)
        speedups.append(float(speedup))
    largest = [max(phases, key=phases.__getitem__) for phases in map(_phases, profiles)]
    smallest = [min(phases, key=phases.__getitem__) for phases in map(_phases, profiles)]
    wrong = next((i for i, (a, b) in enumerate(zip(names, largest, strict=True)) if a != b), None)
    if wrong is not None:
        p, phase = profiles[wrong], largest[wrong]
        name = matching_mistake(
            names,
            {"bottleneck constant": [names[0]] * len(names), "bottleneck smallest": smallest},
            largest,
            lambda a, b: a == b,
        )
        shares = {k: v / p.wall_s for k, v in _phases(p).items()}
        raise CheckFailed(
            MESSAGES_08[name or "bottleneck wrong"].format(
                bottleneck=names[wrong], phase=phase, **shares
            )
        )
    wall = [p.wall_s for p in profiles]
    phase_s = [_phases(p)[n] for p, n in zip(profiles, largest, strict=True)]
    right = [w / (w - s) for w, s in zip(wall, phase_s, strict=True)]

    def same(a: float, b: float) -> bool:
        return abs(a - b) < 0.05 * abs(b)

    if all(map(same, speedups, right)):
        return
    mistakes = {
        "speedup constant": [speedups[0]] * len(speedups),
        "speedup share": [s / w for w, s in zip(wall, phase_s, strict=True)],
        "speedup rest share": [(w - s) / w for w, s in zip(wall, phase_s, strict=True)],
        "speedup total over phase": [w / s for w, s in zip(wall, phase_s, strict=True)],
        "speedup minus one": [s / (w - s) for w, s in zip(wall, phase_s, strict=True)],
        "speedup of the data phase": [p.wall_s / (p.wall_s - p.data_s) for p in profiles],
    }
    name = matching_mistake(speedups, mistakes, right, same) or "speedup wrong"
    first = next(i for i, (a, b) in enumerate(zip(speedups, right, strict=True)) if not same(a, b))
    raise CheckFailed(
        MESSAGES_08[name].format(
            got=speedups[first], phase=largest[first], share=phase_s[first] / wall[first]
        )
    )
