"""find_max_batch_size: exact limits, call counts, caps, margins and error handling."""

from __future__ import annotations

import math

import pytest
import torch

from course_utils.batch import find_max_batch_size


def limit_at(maximum, error=RuntimeError):
    calls = []

    def trial(batch_size):
        calls.append(batch_size)
        if batch_size > maximum:
            raise error("CUDA out of memory. Tried to allocate 2.00 GiB")

    return trial, calls


@pytest.mark.slow
@pytest.mark.parametrize("maximum", [1, 2, 3, 7, 8, 9, 100, 127, 128, 129, 1000, 4097, 65535])
def test_finds_the_exact_maximum_within_the_promised_number_of_calls(maximum):
    trial, calls = limit_at(maximum)
    found = find_max_batch_size(trial)
    assert found.batch_size == found.limit == maximum
    assert found.trials == len(calls) == len(found.history)
    assert found.trials <= 2 * math.ceil(math.log2(maximum)) + 2
    assert [t.batch_size for t in found.history] == calls
    assert all(t.fits == (t.batch_size <= maximum) for t in found.history)


def test_torch_out_of_memory_error_counts():
    trial, _ = limit_at(33, error=torch.cuda.OutOfMemoryError)
    assert find_max_batch_size(trial).batch_size == 33


def test_high_caps_the_search():
    trial, calls = limit_at(10_000)
    found = find_max_batch_size(trial, high=300)
    assert found.batch_size == 300 and found.capped and max(calls) == 300


@pytest.mark.slow
def test_low_that_does_not_fit_searches_below_it():
    trial, _ = limit_at(5)
    found = find_max_batch_size(trial, low=64)
    assert found.batch_size == 5
    nothing, _ = limit_at(0)
    assert find_max_batch_size(nothing).batch_size == 0


@pytest.mark.slow
def test_margin_leaves_room():
    trial, _ = limit_at(200)
    found = find_max_batch_size(trial, margin=0.25)
    assert found.limit == 200 and found.batch_size == 150


def test_other_errors_are_not_mistaken_for_out_of_memory():
    def trial(batch_size):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        find_max_batch_size(trial)


@pytest.mark.parametrize("kwargs", [{"low": 0}, {"low": 8, "high": 4}, {"margin": 1.0}])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        find_max_batch_size(lambda n: None, **kwargs)


def test_memory_is_released_between_trials():
    """A tensor made by a failing trial is freed before the next trial starts."""
    import weakref

    refs = []

    def trial(batch_size):
        for ref in refs:
            assert ref() is None, "a previous trial's tensor is still alive"
        tensor = torch.empty(batch_size, 1000)
        refs.append(weakref.ref(tensor))
        if batch_size > 20:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    assert find_max_batch_size(trial).batch_size == 20


def test_a_batchnorm_model_starts_the_search_at_two():
    """BatchNorm in training mode needs more than one value per channel: small_cnn on
    8 x 8 images ends at 1 x 1, so a batch of 1 raises ValueError (not out of memory)."""
    from course_utils.batch import TrainTrial

    trial = TrainTrial("small_cnn", image_size=8, model_kwargs={"width": 4})
    assert trial.min_batch_size == 2
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        find_max_batch_size(trial, high=4)
    found = find_max_batch_size(trial, low=trial.min_batch_size, high=4)
    assert found.batch_size == 4 and [t.batch_size for t in found.history] == [2, 4]
    no_norm = TrainTrial("small_cnn", image_size=8, model_kwargs={"width": 4, "norm": "group"})
    assert no_norm.min_batch_size == 1
    no_norm(1)
