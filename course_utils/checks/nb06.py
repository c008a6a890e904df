"""Notebook 06's deciding halves: the ranks' evidence (:mod:`course_utils.checks.evidence.
nb06`) against one process. Exercise (b): each rank's averaged gradient against the
gradient of one process on the whole batch; (c): the weights rank 0 saved against one
process trained on the combined batch (:func:`~course_utils.distributed.reference_model`),
with feedback naming what the ranks did differently."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any
from unittest import mock

import torch
from torch import nn

from course_utils.checks import said_by_your_code
from course_utils.checks.core import answer_and_error, check_close, matching_mistake
from course_utils.checks.evidence.nb06 import averaged_on_ranks, ddp_main_on_ranks
from course_utils.distributed import (
    TOLERANCE,
    RanksRun,
    RunConfig,
    max_parameter_difference,
    reference_model,
    sampler_indices,
)
from course_utils.feedback import CheckFailed
from course_utils.language import Messages


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


#: Notebook 06's check messages for exercise (a), by a stable name: one sentence each,
#: ``{placeholders}`` for the case the answer failed (never what the sampler gives there).
MESSAGES_06 = Messages(
    "06",
    {
        "rank_indices raised": "{error} (rank {rank} of {world}, order {order})",
        "rank_indices not indices": "rank {rank} of {world}: return the indices as a list of "
        "ints, got {kind}",
        "rank_indices positions": "rank {rank} of {world}, order {order}: you gave {got}, the "
        "positions rank, rank + world_size, ...: deal the elements of the order itself, "
        "order[rank::world_size]",
        "rank_indices sorted order": "rank {rank} of {world}, order {order}: you gave {got}, the "
        "sorted order dealt out: the sampler deals the shuffled order as it is, "
        "order[rank::world_size]",
        "rank_indices dealt then sorted": "rank {rank} of {world}, order {order}: you gave {got}, "
        "the right indices but sorted: keep the order they are dealt in, order[rank::world_size]",
        "rank_indices reordered": "rank {rank} of {world}, order {order}: you gave {got}, the "
        "right indices in another order: keep the order they are dealt in, "
        "order[rank::world_size]",
        "rank_indices block": "rank {rank} of {world}, order {order}: you gave {got}, a "
        "contiguous block of the order: DistributedSampler deals it like cards, one index to "
        "each process in turn, order[rank::world_size]",
        "rank_indices from 1": "rank {rank} of {world}, order {order}: you gave {got}, starting "
        "one place off: ranks count from 0, and rank r's first index is order[r]",
        "rank_indices from 1 wrapped": "rank {rank} of {world}, order {order}: you gave {got}, "
        "the next rank's share: ranks count from 0, and rank r's first index is order[r]",
        "rank_indices swapped": "rank {rank} of {world}, order {order}: your function read rank "
        "as the number of processes and world_size as the rank: the arguments come as "
        "rank_indices(order, rank, world_size)",
        "rank_indices wrong": "rank {rank} of {world}, order {order}: you gave {got}, which is not "
        "what DistributedSampler deals that rank: one index to each process in turn, like "
        "cards (order 7, 3, 9, 1 on 2 processes: rank 1 gets 3 and 1)",
        "average not a gradient": "return one tensor with the gradient's shape (or change it "
        "in place)",
        "average own": "each process kept its own gradient: combine them across processes with "
        "dist.all_reduce(gradient), which sums the tensor in place on every process (it returns "
        "None, not the sum), then divide it",
        "average own divided": "each process divided its own gradient by the world size, but "
        "never got the others': combine them across processes with dist.all_reduce(gradient), "
        "which sums the tensor in place on every process (it returns None, not the sum), then "
        "divide it",
        "average summed": "you summed the gradients: DDP averages them (divide by "
        "dist.get_world_size())",
        "average by 2": "you divided by 2, but {world} processes ran: divide by "
        "dist.get_world_size(), not by a number you know",
        "average floor": "you divided with // (floor division), which rounds each value down: "
        "divide with /",
        "average max": "each value is the largest of the processes' (op=ReduceOp.MAX): sum them, "
        "the default op=ReduceOp.SUM, then divide by dist.get_world_size()",
        "average rank 0 only": "rank 0 has the average but ranks {ranks} do not: dist.reduce "
        "sends the sum to one process only; dist.all_reduce gives it to every process",
        "ddp no wrapper": "your weights differ from one process on the combined batch by "
        "{gap:.1e}: wrap the model in DDP(model) in every process: without it each process "
        "trains its own copy on its shard, and backward never averages the gradients across "
        "processes",
        "ddp no shuffle": "your weights differ from one process on the combined batch by "
        "{gap:.1e}: your DistributedSampler does not shuffle: DistributedSampler(dataset, "
        "shuffle=True, seed=0)",
        "ddp seed": "your weights differ from one process on the combined batch by {gap:.1e}: "
        "your DistributedSampler's seed is {got}: give every process the same seed, {seed}, so "
        "that they deal out one shuffled order",
        "ddp seeds differ": "your weights differ from one process on the combined batch by "
        "{gap:.1e}: your processes' DistributedSamplers have different seeds ({seeds}): every "
        "process must use the same seed, so that they deal out one shuffled order",
        "ddp batch size": "your weights differ from one process on the combined batch by "
        "{gap:.1e}: your DataLoader's batch_size is {got}: use the batch_size argument "
        "({batch_size} per process)",
        "ddp steps": "your weights differ from one process on the combined batch by {gap:.1e}: "
        "each process should take {steps} optimizer steps (epochs × batches per epoch); yours "
        "took {got}: loop over range(epochs), and over the whole loader in each",
        "ddp loss divided": "your weights differ from one process on the combined batch by "
        "{gap:.1e}: you divided the loss by the world size: DDP already averages the gradients "
        "across processes, so each step was {world} times too small",
        "ddp no zero_grad": "your weights differ from one process on the combined batch by "
        "{gap:.1e}, and are those of a run that never clears its gradients: call "
        "optimizer.zero_grad() once per batch, before backward, or each step adds in every "
        "earlier batch's gradients",
        "ddp wrong": "your weights differ from one process on the combined batch by {gap:.1e}: "
        "wrap the model in DDP, give the loader the DistributedSampler, and take one optimizer "
        "step per batch after zero_grad and backward",
    },
)


def _rank_cases() -> list[tuple[list[int], int, int]]:
    """Exercise 06 (a)'s cases (order, rank, world_size): three of the sampler's shuffles
    on 1, 2 and 4 processes, and a made-up order of a subset's indices (not 0 to n - 1), so
    that positions, the sorted order and the order itself all differ."""
    orders = [[21, 5, 13, 8, 30, 2, 17, 11]]  # first: the feedback shows the first failed
    orders += [sampler_indices(n, 1, 0, seed, epoch) for n, seed, epoch in SHUFFLES]
    return [
        (order, rank, world) for order in orders for world in (4, 2, 1) for rank in range(world)
    ]


SHUFFLES = [(12, 0, 0), (12, 3, 1), (16, 7, 2)]  # (size, seed, epoch) of 06 (a)'s orders


def _outcome(function: Callable[..., Any], *args: Any) -> Any:
    """What ``function(*args)`` gives as a list of ints, or the name of what it raised."""
    out, error = answer_and_error(function, *args)
    if error is not None:
        return ("raised", error)
    try:
        return [int(i) for i in out]
    except (TypeError, ValueError):
        return ("not indices", out)


#: Each usual mistake of exercise 06 (a), as what it returns for (order, rank, world_size).
RANK_MISTAKES: dict[str, Callable[[list[int], int, int], list[int]]] = {
    "rank_indices positions": lambda order, rank, world: list(range(rank, len(order), world)),
    "rank_indices sorted order": lambda order, rank, world: sorted(order)[rank::world],
    "rank_indices dealt then sorted": lambda order, rank, world: sorted(order[rank::world]),
    "rank_indices reordered": lambda order, rank, world: order[rank::world][::-1],
    "rank_indices block": lambda order, rank, world: order[
        rank * (len(order) // world) : (rank + 1) * (len(order) // world)
    ],
    "rank_indices from 1": lambda order, rank, world: order[rank + 1 :: world],
    "rank_indices from 1 wrapped": lambda order, rank, world: order[(rank + 1) % world :: world],
    "rank_indices swapped": lambda order, rank, world: order[world::rank],
}


def check_rank_indices(rank_indices: Callable[[list[int], int, int], Any]) -> None:
    """Exercise 06 (a): ``rank_indices(order, rank, world_size)`` against
    :func:`sampler_indices` on :func:`_rank_cases`; the feedback names the usual mistake
    (:data:`RANK_MISTAKES`) whose results match the answer's on every case, or else says
    what it gave for the first case it got wrong, never what the sampler gives there."""
    cases = _rank_cases()
    got = [_outcome(rank_indices, list(order), rank, world) for order, rank, world in cases]
    right = [order[rank::world] for order, rank, world in cases]
    if got == right:
        return
    first = next(i for i, (a, b) in enumerate(zip(got, right, strict=True)) if a != b)
    order, rank, world = cases[first]
    where = {"rank": rank, "world": world, "order": order}
    values = {
        name: [_outcome(mistake, list(o), r, w) for o, r, w in cases]
        for name, mistake in RANK_MISTAKES.items()
    }
    name = matching_mistake(got, values, right, lambda a, b: a == b)
    if name is None and isinstance(got[first], tuple):
        kind, what = got[first]
        if kind == "raised":
            raise CheckFailed(MESSAGES_06["rank_indices raised"].format(error=what, **where))
        raise CheckFailed(
            MESSAGES_06["rank_indices not indices"].format(
                kind="None" if what is None else type(what).__name__, **where
            )
        )
    shown = got[first] if isinstance(got[first], list) else got[first][1]
    raise CheckFailed(MESSAGES_06[name or "rank_indices wrong"].format(got=shown, **where))
