"""Notebook 03's GPU lessons against the helpers that take them over: the sweep's
peak-memory lines and ``batch_size_sweep`` agree, and a search under ``memory_cap`` really
runs out of memory (so "the limit fits, limit + 1 does not" is checked, not skipped)."""

from __future__ import annotations

import pytest
import torch

from course_utils.batch import TrainTrial, batch_size_sweep, find_max_batch_size
from course_utils.memory import memory_cap
from course_utils.oom import is_out_of_memory


def _peak_by_hand(trial: TrainTrial, size: int, device: torch.device) -> int:
    """The notebook's loop: warm-up step, reset the peak, a step, read the peak."""
    trial(size)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    trial(size)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


@pytest.mark.gpu
def test_the_peak_memory_lines_agree_with_batch_size_sweep():
    device = torch.device("cuda", torch.cuda.current_device())
    trial = TrainTrial("small_cnn", str(device), model_kwargs={"width": 16})
    sweep = batch_size_sweep(trial, [64, 256], device, repeats=2)
    for row in sweep.rows:
        by_hand = _peak_by_hand(trial, row.batch_size, device)
        assert abs(by_hand - row.peak_bytes) <= 0.05 * row.peak_bytes + 2**20, (
            row.batch_size,
            by_hand,
            row.peak_bytes,
        )
    assert sweep.rows[1].peak_bytes > sweep.rows[0].peak_bytes


@pytest.mark.gpu
def test_a_search_under_memory_cap_runs_out_of_memory_for_real():
    device = torch.device("cuda", torch.cuda.current_device())
    trial = TrainTrial("small_cnn", str(device), model_kwargs={"width": 16})
    with memory_cap(device, 512):
        found = find_max_batch_size(trial, low=2, high=2**16)
        assert not found.capped and found.batch_size > 2
        trial(found.batch_size)
        with pytest.raises(RuntimeError) as error:
            trial(found.batch_size + 1)
        assert is_out_of_memory(error.value)
