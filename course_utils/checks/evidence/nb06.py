"""Notebook 06's observing halves: the learner's function runs in several forked CPU
processes of a gloo group (:func:`course_utils.distributed.run_as_ranks`, whose spies watch
each rank), and what the ranks did and wrote comes back as data: the spies'
:class:`~course_utils.distributed.RanksRun` and the tensors the ranks saved, read here
(``weights_only``) from a folder of this process's own. What they should be is decided in
:mod:`course_utils.checks.nb06`."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from course_utils.checks.boundary import observed
from course_utils.distributed import RanksRun, exercise_gradient, run_as_ranks


def _average_rank(average: Callable[[torch.Tensor], Any], folder: str) -> None:
    """One rank of exercise 06 (b), under :func:`run_as_ranks`: join a gloo group, take
    :func:`exercise_gradient` of this rank's share of the batch, give it to ``average``,
    and save ``{"own": ..., "result": ...}`` (``result``: what ``average`` returned, or
    the gradient it changed in place; ``None`` when that is not a plain tensor) to
    ``folder/rank-<rank>.pt``."""
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        share = 8 // world
        gradient = exercise_gradient(slice(share * rank, share * (rank + 1)))
        own = gradient.clone()
        result = average(gradient)
        result = gradient if result is None else result
        plain = type(result) in (torch.Tensor, torch.nn.Parameter)  # a subclass could lie
        kept = result.detach().clone() if plain else None
        torch.save({"own": own, "result": kept}, Path(folder) / f"rank-{rank}.pt")
    finally:
        dist.destroy_process_group()


@observed
def averaged_on_ranks(
    average_gradient: Any, world_size: int = 4, timeout_s: float = 90.0
) -> tuple[RanksRun, list[Any]]:
    """Exercise 06 (b): ``average_gradient`` in ``world_size`` ranks (:func:`_average_rank`);
    what the spies saw, and each rank's ``{"own": its gradient, "result": what the learner's
    function gave}`` (``None`` for a rank that saved nothing: it failed)."""
    with tempfile.TemporaryDirectory(prefix="nb06-average-") as folder:
        run = run_as_ranks(
            _average_rank, world_size=world_size, args=(average_gradient, folder),
            timeout_s=timeout_s,
        )  # fmt: skip
        files = [Path(folder) / f"rank-{rank}.pt" for rank in range(world_size)]
        ranks = [torch.load(path, weights_only=True) if path.exists() else None for path in files]
    return run, ranks


@observed
def ddp_main_on_ranks(
    ddp_main: Any, world_size: int = 2, epochs: int = 2, batch_size: int = 8,
    timeout_s: float = 120.0,
) -> tuple[RanksRun, Any]:  # fmt: skip
    """Exercise 06 (c): ``ddp_main(out_dir, epochs, batch_size)`` in ``world_size`` ranks
    with torchrun's environment; what the spies saw, and the ``ddp_model.pt`` it saved in
    ``out_dir`` (read with ``weights_only=True``; ``None`` when there is none)."""
    with tempfile.TemporaryDirectory(prefix="nb06-exercise-") as folder:
        run = run_as_ranks(
            ddp_main, world_size=world_size, args=(folder, epochs, batch_size), timeout_s=timeout_s
        )
        path = Path(folder) / "ddp_model.pt"
        try:
            saved = torch.load(path, weights_only=True) if path.exists() else None
        except Exception as error:  # not tensors alone (a whole model, say): a plain error
            raise ValueError(
                "torch.load(ddp_model.pt, weights_only=True) cannot read what ddp_main saved "
                f"({type(error).__name__}): save model.module.state_dict()"
            ) from None
    return run, saved
