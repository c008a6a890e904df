"""The exercises of notebook 06: their checks pass right answers written several ways and
fail the usual mistakes with feedback that names them. (b) and (c) run the learner's code
in 2 forked gloo processes, as the notebook does.

Each check cell runs as the grader runs it: after the notebook's imports and knobs, with the
learner's function defined in the same namespace.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from notebook_cells import code_cells, grade_apart, grade_cell, messages_matching, run_cells
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from course_utils.checks.nb06 import MESSAGES_06
from course_utils.data import SyntheticImages
from course_utils.feedback import CheckFailed
from course_utils.models import build_model

NB06 = Path(__file__).resolve().parent.parent / "notebooks" / "06_multi_gpu.ipynb"


def _grade_cell(grade_id: str) -> str:
    return grade_cell(NB06, grade_id)


@pytest.fixture(scope="module")
def nb06() -> dict:  # the imports cell sets PYTORCH_NVML_BASED_CUDA_CHECK too
    return run_cells(NB06, ("nb06-03", "nb06-03b", "nb06-04"), PYTORCH_NVML_BASED_CUDA_CHECK="1")


def _check(nb06: dict, grade_id: str, name: str, answer) -> None:
    exec(_grade_cell(grade_id), dict(nb06, **{name: answer}))


def _fails_with(nb06: dict, grade_id: str, name: str, answer, feedback: str) -> None:
    with pytest.raises(CheckFailed) as failure:
        _check(nb06, grade_id, name, answer)
    assert feedback in str(failure.value), str(failure.value)


# ----------------------------------------------------------------------------- (a)


def deal(order, rank, world_size):
    return list(order[rank::world_size])


def deal_with_a_loop(order, rank, world_size):
    return torch.tensor([order[i] for i in range(len(order)) if i % world_size == rank])


def positions(order, rank, world_size):
    return list(range(rank, len(order), world_size))


def chunks(order, rank, world_size):
    size = len(order) // world_size
    return order[rank * size : (rank + 1) * size]


@pytest.mark.parametrize("answer", [deal, deal_with_a_loop])
def test_rank_indices_passes_right_answers(nb06, answer, capsys):
    _check(nb06, "06-rank-indices-check", "rank_indices", answer)
    assert "all checks passed" in capsys.readouterr().out


def _swapped(order, world_size, rank):  # the arguments read in the other order
    return list(order[rank::world_size])


#: One wrong rank_indices per usual mistake of 06 (a), and the message that must name it.
RANK_INDICES_MISTAKES = {
    "rank_indices positions": positions,
    "rank_indices sorted order": lambda order, rank, world_size: sorted(order)[rank::world_size],
    "rank_indices dealt then sorted": lambda order, rank, world_size: sorted(
        order[rank::world_size]
    ),
    "rank_indices reordered": lambda order, rank, world_size: order[rank::world_size][::-1],
    "rank_indices block": chunks,
    "rank_indices from 1": lambda order, rank, world_size: order[rank + 1 :: world_size],
    "rank_indices from 1 wrapped": lambda order, rank, world_size: order[
        (rank + 1) % world_size :: world_size
    ],
    "rank_indices swapped": _swapped,
    "rank_indices wrong": lambda order, rank, world_size: order[:3],
    "rank_indices raised": lambda order, rank, world_size: [order[len(order)]],
    "rank_indices not indices": lambda order, rank, world_size: None,
}


@pytest.mark.parametrize("name", list(RANK_INDICES_MISTAKES))
def test_rank_indices_feedback_names_each_mistake_and_no_other(nb06, name):
    with pytest.raises(CheckFailed) as failed:
        _check(nb06, "06-rank-indices-check", "rank_indices", RANK_INDICES_MISTAKES[name])
    assert messages_matching(str(failed.value), MESSAGES_06) == [name], str(failed.value)


def test_a_sorted_order_is_not_called_positions(nb06):
    """On a sampler's order (0 to n - 1 shuffled) the two give the same indices: the check
    tells them apart on a made-up order of a subset's indices."""
    with pytest.raises(CheckFailed) as failed:
        _check(
            nb06,
            "06-rank-indices-check",
            "rank_indices",
            RANK_INDICES_MISTAKES["rank_indices sorted order"],
        )
    assert "sorted order" in str(failed.value) and "positions" not in str(failed.value)


# ----------------------------------------------------------------------------- (b)


def all_reduce_in_place(gradient):
    dist.all_reduce(gradient)
    gradient /= dist.get_world_size()


def all_gather_mean(gradient):
    parts = [torch.empty_like(gradient) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, gradient)
    return torch.stack(parts).mean(dim=0)


def keeps_its_own(gradient):
    return gradient


def sums(gradient):
    dist.all_reduce(gradient, op=dist.ReduceOp.SUM)
    return gradient


def halves(gradient):  # issue 35: division by 2 instead of the world size
    dist.all_reduce(gradient, op=dist.ReduceOp.SUM)
    return gradient / 2


def uses_avg(gradient):
    dist.all_reduce(gradient, op=dist.ReduceOp.AVG)
    return gradient


def divides_its_own(gradient):  # no all-reduce at all
    return gradient / dist.get_world_size()


def reduces_a_copy(gradient):  # the sum lands in the copy, the original is returned
    dist.all_reduce(gradient.clone())
    return gradient / dist.get_world_size()


def reduces_to_rank_0(gradient):
    dist.reduce(gradient, dst=0)
    return gradient / dist.get_world_size()


def floor_divides(gradient):
    dist.all_reduce(gradient)
    return gradient // dist.get_world_size()


def takes_the_max(gradient):
    dist.all_reduce(gradient, op=dist.ReduceOp.MAX)
    return gradient


@pytest.mark.parametrize("answer", [all_reduce_in_place, all_gather_mean, uses_avg])
def test_average_gradient_passes_right_answers(nb06, answer, capsys):
    _check(nb06, "06-average-gradients-check", "average_gradient", answer)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (keeps_its_own, "dist.all_reduce(gradient)"),
        (sums, "you summed the gradients"),
        (halves, "you divided by 2, but 4 processes ran"),
        (divides_its_own, "divided its own gradient by the world size, but never got"),
        (reduces_a_copy, "divided its own gradient by the world size, but never got"),
        (reduces_to_rank_0, "dist.reduce sends the sum to one process only"),
        (floor_divides, "floor division"),
        (takes_the_max, "ReduceOp.MAX"),
    ],
)
def test_average_gradient_names_the_mistake(nb06, answer, feedback):
    _fails_with(nb06, "06-average-gradients-check", "average_gradient", answer, feedback)


# ----------------------------------------------------------------------------- (c)


def _ddp_main(
    out_dir,
    epochs=2,
    batch_size=8,
    *,
    sampler=True,
    set_epoch=True,
    destroy=True,
    wrap=True,
    shuffle=True,
    seed=0,
    loader_batch=None,
    loss_divided=False,
    zero_grad=True,
):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(build_model("mlp")) if wrap else build_model("mlp")
    data = SyntheticImages(size=64, seed=0)
    seed = dist.get_rank() if seed == "rank" else seed
    shard = DistributedSampler(data, shuffle=shuffle, seed=seed) if sampler else None
    loader = DataLoader(data, batch_size=loader_batch or batch_size, sampler=shard)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(epochs):
        if shard is not None and set_epoch:
            shard.set_epoch(epoch)
        for inputs, targets in loader:
            if zero_grad:
                optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), targets)
            (loss / dist.get_world_size() if loss_divided else loss).backward()
            optimizer.step()
    if dist.get_rank() == 0:
        torch.save((model.module if wrap else model).state_dict(), f"{out_dir}/ddp_model.pt")
    if destroy:
        dist.destroy_process_group()


def right_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size)


def no_sampler_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size, sampler=False)


def no_set_epoch_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size, set_epoch=False)


def left_open_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size, destroy=False)


def unwrapped_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size, wrap=False)


def unshuffled_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size, shuffle=False)


def seed_per_rank_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size, seed="rank")


def hard_coded_batch_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size, loader_batch=4)


def loss_divided_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size, loss_divided=True)


def no_zero_grad_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size, zero_grad=False)


def test_ddp_setup_passes_the_right_answer(nb06, capsys):
    _check(nb06, "06-ddp-setup-check", "ddp_main", right_main)
    assert "all checks passed" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (no_sampler_main, "DistributedSampler"),
        (no_set_epoch_main, "set_epoch"),
        (left_open_main, "destroy_process_group"),
        (unwrapped_main, "wrap the model in DDP(model) in every process"),
        (unshuffled_main, "your DistributedSampler does not shuffle"),
        (seed_per_rank_main, "have different seeds (rank 0: 0, rank 1: 1): every process must"),
        (hard_coded_batch_main, "your DataLoader's batch_size is 4"),
        (loss_divided_main, "you divided the loss by the world size"),
        (no_zero_grad_main, "are those of a run that never clears its gradients"),
    ],
)
def test_ddp_setup_names_the_mistake(nb06, answer, feedback):
    _fails_with(nb06, "06-ddp-setup-check", "ddp_main", answer, feedback)


def zero_grad_once_per_epoch_main(out_dir, epochs=2, batch_size=8):
    """Gradients cleared at each epoch's start only: not what never clearing them gives."""
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(build_model("mlp"))
    data = SyntheticImages(size=64, seed=0)
    shard = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=batch_size, sampler=shard)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(epochs):
        shard.set_epoch(epoch)
        optimizer.zero_grad()
        for inputs, targets in loader:
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), f"{out_dir}/ddp_model.pt")
    dist.destroy_process_group()


#: Each message of checks.nb06.check_ddp_weights that names a mistake, and the answer making it.
DDP_WEIGHT_MISTAKES = {
    "ddp no wrapper": unwrapped_main,
    "ddp no shuffle": unshuffled_main,
    "ddp seeds differ": seed_per_rank_main,
    "ddp batch size": hard_coded_batch_main,
    "ddp loss divided": loss_divided_main,
    "ddp no zero_grad": no_zero_grad_main,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DDP_WEIGHT_MISTAKES))
def test_ddp_weights_feedback_names_each_mistake_and_no_other(nb06, name):
    """Issue 45: no optimizer.zero_grad() read as the generic "wrap the model, give the
    loader the sampler, ..."; each mistake's message now names it, and only it."""
    with pytest.raises(CheckFailed) as failed:
        _check(nb06, "06-ddp-setup-check", "ddp_main", DDP_WEIGHT_MISTAKES[name])
    assert messages_matching(str(failed.value), MESSAGES_06) == [name], str(failed.value)


@pytest.mark.slow
def test_gradients_cleared_once_per_epoch_are_not_called_never_cleared(nb06):
    with pytest.raises(CheckFailed) as failed:
        _check(nb06, "06-ddp-setup-check", "ddp_main", zero_grad_once_per_epoch_main)
    assert messages_matching(str(failed.value), MESSAGES_06) == ["ddp wrong"], str(failed.value)


def test_seeds_that_differ_by_rank_are_quoted_by_rank(nb06):
    """Issue 45: each rank seeding its sampler with its rank is told the seeds by rank, not
    rank 0's seed (the right one) as if it were the mistake."""
    with pytest.raises(CheckFailed) as failure:
        _check(nb06, "06-ddp-setup-check", "ddp_main", seed_per_rank_main)
    message = str(failure.value)
    assert messages_matching(message, MESSAGES_06) == ["ddp seeds differ"], message
    assert "rank 1: 1" in message and "seed is 0" not in message, message


def same_other_seed_main(out_dir, epochs=2, batch_size=8):
    _ddp_main(out_dir, epochs, batch_size, seed=7)


@pytest.mark.slow
def test_one_seed_shared_by_all_ranks_but_not_the_course_one_is_still_told_its_seed(nb06):
    _fails_with(
        nb06,
        "06-ddp-setup-check",
        "ddp_main",
        same_other_seed_main,
        "your DistributedSampler's seed is 7: give every process the same seed, 0",
    )


# ------------------------------------------------- (b) and (c) across the grader's boundary
# The ranks run in a process forked from the learner's runtime (the evidence: what the spies
# saw and the tensors the ranks saved); the comparisons with one process run in the checker.


def _apart(nb06: dict, grade_id: str, **answer) -> dict:
    return grade_apart(NB06, grade_id, dict(nb06, **answer))


def _solution(nb06: dict, cell_id: str, name: str):
    namespace = dict(nb06)
    exec(code_cells(NB06)[cell_id], namespace)
    return namespace[name]


class Agreeing(torch.Tensor):
    """A tensor that says it is close to anything and equal to everything."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})

    def __eq__(self, other):
        return True


def forged_average(gradient):  # the sum everywhere, dressed as a tensor that agrees
    dist.all_reduce(gradient)
    return gradient.as_subclass(Agreeing)


def secret_average(gradient):
    raise ValueError("the learner's own words")


@pytest.mark.slow
def test_average_gradient_apart_passes_the_solution(nb06):
    answer = _solution(nb06, "nb06-33", "average_gradient")
    verdict = _apart(nb06, "06-average-gradients-check", average_gradient=answer)
    assert verdict["status"] == "completed", verdict


@pytest.mark.parametrize(
    ("answer", "name"), [(keeps_its_own, "average own"), (sums, "average summed")]
)
def test_average_gradient_apart_names_the_mistake(nb06, answer, name):
    verdict = _apart(nb06, "06-average-gradients-check", average_gradient=answer)
    assert verdict["status"] == "failed", verdict
    assert messages_matching(verdict["evalue"], MESSAGES_06) == [name], verdict


def test_average_gradient_apart_cannot_be_forged_by_a_tensor_that_agrees(nb06):
    verdict = _apart(nb06, "06-average-gradients-check", average_gradient=forged_average)
    assert verdict["status"] == "failed", verdict
    assert messages_matching(verdict["evalue"], MESSAGES_06) == ["average not a gradient"]


def test_average_gradient_apart_quotes_no_words_of_the_learners_code(nb06):
    """What a rank's exception said is the learner's: the grader names the rank and the
    class, never the message (in the learner's own notebook it is shown)."""
    verdict = _apart(nb06, "06-average-gradients-check", average_gradient=secret_average)
    assert verdict["status"] == "failed", verdict
    assert "average_gradient failed in 4 processes: rank " in verdict["evalue"], verdict
    assert "ValueError: (your code's message)" in verdict["evalue"], verdict
    assert "own words" not in verdict["evalue"], verdict
    with pytest.raises(CheckFailed, match="own words"):
        _check(nb06, "06-average-gradients-check", "average_gradient", secret_average)


def forged_ddp_main(out_dir, epochs=2, batch_size=8):
    """The right training, saved as tensors that agree with anything: the weights that
    cross to the checker are plain data or nothing."""
    right_main(out_dir, epochs, batch_size)
    if int(os.environ["RANK"]) == 0:  # the group is closed: torchrun's variables say
        saved = f"{out_dir}/ddp_model.pt"
        state = torch.load(saved, weights_only=True)
        torch.save({key: value.as_subclass(Agreeing) for key, value in state.items()}, saved)


@pytest.mark.slow
def test_ddp_setup_apart_passes_the_solution(nb06):
    answer = _solution(nb06, "nb06-36", "ddp_main")
    verdict = _apart(nb06, "06-ddp-setup-check", ddp_main=answer)
    assert verdict["status"] == "completed", verdict


@pytest.mark.slow
@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        (no_sampler_main, "build a DistributedSampler(dataset, shuffle=True, seed=0)"),
        (left_open_main, "call dist.destroy_process_group() at the end (ranks [0, 1]"),
        (no_zero_grad_main, "are those of a run that never clears its gradients"),
    ],
)
def test_ddp_setup_apart_names_the_mistake(nb06, answer, feedback):
    verdict = _apart(nb06, "06-ddp-setup-check", ddp_main=answer)
    assert verdict["status"] == "failed" and feedback in verdict["evalue"], verdict


def test_ddp_setup_apart_cannot_be_forged_by_weights_that_agree(nb06):
    verdict = _apart(nb06, "06-ddp-setup-check", ddp_main=forged_ddp_main)
    assert verdict["status"] == "failed", verdict
