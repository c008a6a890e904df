"""Notebook 06's deciding halves: the ranks' evidence (:mod:`course_utils.checks.evidence.
nb06`) against one process. Exercise (b): each rank's averaged gradient against the
gradient of one process on the whole batch; (c): the weights rank 0 saved against one
process trained on the combined batch (:func:`~course_utils.distributed.reference_model`),
with feedback naming what the ranks did differently."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any
from unittest import mock

import torch
from torch import nn

from course_utils.checks import said_by_your_code
from course_utils.checks.evidence.nb06 import averaged_on_ranks, ddp_main_on_ranks
from course_utils.classroom import CheckFailed, check_close
from course_utils.distributed import (
    MESSAGES_06,
    TOLERANCE,
    RanksRun,
    RunConfig,
    max_parameter_difference,
    reference_model,
)


def _heard(run: RanksRun) -> RanksRun:
    """``run``, its ranks' errors marked as the learner's words (:func:`said_by_your_code`)."""
    said_by_your_code(*(text for texts in run.said.values() for text in texts))
    return run


# --------------------------------------------------------- exercise 06 (b): all-reduce


def run_average_gradient(
    average_gradient: Any, world_size: int = 4, timeout_s: float = 90.0
) -> tuple[RanksRun, list[Any]]:
    """Exercise 06 (b)'s evidence (:func:`~course_utils.checks.evidence.nb06.
    averaged_on_ranks`): what the spies saw, and each rank's gradient and result."""
    run, ranks = averaged_on_ranks(average_gradient, world_size, timeout_s)
    return _heard(run), ranks


def check_averaged_gradients(ranks: Sequence[dict[str, Any]], full: torch.Tensor) -> None:
    """Exercise 06 (b): what each rank saved (``own``: its gradient, ``result``: what the
    learner's function gave, ``None`` when not a plain tensor) must be ``full``, the gradient
    of one process over the whole batch; the feedback names the usual mistake the results
    match (no all-reduce, the sum, a fixed divisor, reduce to rank 0 only, floor division,
    MAX)."""
    world = len(ranks)
    results = [r["result"] for r in ranks]
    owns = torch.stack([r["own"] for r in ranks])
    if not all(isinstance(t, torch.Tensor) and t.shape == full.shape for t in results):
        raise CheckFailed(MESSAGES_06["average not a gradient"])

    def everywhere(expected: list[torch.Tensor] | torch.Tensor) -> bool:
        wanted = expected if isinstance(expected, list) else [expected] * world
        return all(torch.allclose(t, w, atol=1e-6) for t, w in zip(results, wanted, strict=True))

    if everywhere([r["own"] for r in ranks]):
        raise CheckFailed(MESSAGES_06["average own"])
    if everywhere([r["own"] / world for r in ranks]):
        raise CheckFailed(MESSAGES_06["average own divided"])
    if everywhere(world * full):
        raise CheckFailed(MESSAGES_06["average summed"])
    if world != 2 and everywhere(world / 2 * full):
        raise CheckFailed(MESSAGES_06["average by 2"].format(world=world))
    if everywhere(torch.div(owns.sum(0), world, rounding_mode="floor")):
        raise CheckFailed(MESSAGES_06["average floor"])
    if everywhere(owns.max(0).values):
        raise CheckFailed(MESSAGES_06["average max"])
    wrong = [rank for rank, t in enumerate(results) if not torch.allclose(t, full, atol=1e-6)]
    if wrong and 0 not in wrong:
        raise CheckFailed(MESSAGES_06["average rank 0 only"].format(ranks=wrong))
    for rank, result in enumerate(results):
        check_close(result, full, f"rank {rank}'s average (vs one process on the whole batch)")


# --------------------------------------------------- exercise 06 (c): a DDP script's set-up


def run_ddp_main(
    ddp_main: Any, world_size: int = 2, epochs: int = 2, batch_size: int = 8,
    timeout_s: float = 120.0,
) -> tuple[RanksRun, Any]:  # fmt: skip
    """Exercise 06 (c)'s evidence (:func:`~course_utils.checks.evidence.nb06.
    ddp_main_on_ranks`): what the spies saw, and the state dict rank 0 saved (or None)."""
    run, saved = ddp_main_on_ranks(ddp_main, world_size, epochs, batch_size, timeout_s)
    return _heard(run), saved


def check_ddp_weights(
    run: RanksRun, saved: dict[str, torch.Tensor], config: RunConfig, world_size: int
) -> None:
    """Exercise 06 (c): the weights rank 0 saved must be those of one process trained on
    the combined batch (:func:`reference_model` of ``config``, computed here); when they are
    not, the feedback names what the ranks did differently (watched by
    :func:`~course_utils.distributed.run_as_ranks`): no DDP wrapper, a sampler that does not
    shuffle or has another seed, another batch size, another number of steps, or a loss
    divided by the world size (DDP already averages)."""
    gap = max_parameter_difference(saved, reference_model(config, world_size))
    if gap < TOLERANCE:
        return
    ranks = range(world_size)
    steps = config.steps  # in all, over the epochs
    if run.wrapped_in_ddp != list(ranks):
        raise CheckFailed(MESSAGES_06["ddp no wrapper"].format(gap=gap))
    settings = sorted({s for rank in ranks for s in run.sampler_settings.get(rank, [])})
    if any(not shuffle for shuffle, _ in settings):
        raise CheckFailed(MESSAGES_06["ddp no shuffle"].format(gap=gap))
    seeds = sorted({seed for _, seed in settings})
    if len(seeds) > 1:  # the processes disagree: quote each one's, not rank 0's
        by_rank = ", ".join(
            f"rank {rank}: {'/'.join(str(s) for s in sorted({s for _, s in seen}))}"
            for rank in ranks
            if (seen := run.sampler_settings.get(rank, []))
        )
        raise CheckFailed(MESSAGES_06["ddp seeds differ"].format(gap=gap, seeds=by_rank))
    if seeds and seeds[0] != config.seed:
        raise CheckFailed(MESSAGES_06["ddp seed"].format(gap=gap, got=seeds[0], seed=config.seed))
    sizes = sorted({b for rank in ranks for b in run.batch_sizes.get(rank, []) if b})
    if sizes and sizes != [config.batch_size]:
        raise CheckFailed(
            MESSAGES_06["ddp batch size"].format(
                gap=gap, got=sizes[0], batch_size=config.batch_size
            )
        )
    taken = sorted({run.optimizer_steps.get(rank, 0) for rank in ranks})
    if taken != [steps]:
        raise CheckFailed(MESSAGES_06["ddp steps"].format(gap=gap, steps=steps, got=taken[0]))
    divided = RunConfig(**{**asdict(config), "lr": config.lr / world_size})
    if max_parameter_difference(saved, reference_model(divided, world_size)) < TOLERANCE:
        raise CheckFailed(MESSAGES_06["ddp loss divided"].format(gap=gap, world=world_size))
    if max_parameter_difference(saved, _never_cleared_model(config, world_size)) < TOLERANCE:
        raise CheckFailed(MESSAGES_06["ddp no zero_grad"].format(gap=gap))
    raise CheckFailed(MESSAGES_06["ddp wrong"].format(gap=gap))


def _never_cleared_model(config: RunConfig, world_size: int) -> nn.Module:
    """:func:`reference_model` with gradients never cleared (``zero_grad`` does nothing):
    what a DDP script without ``optimizer.zero_grad()`` trains, each step adding its
    gradients to all the earlier ones."""

    def keep_gradients(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        del self, set_to_none

    with mock.patch.object(torch.optim.Optimizer, "zero_grad", keep_gradients):
        return reference_model(config, world_size)
