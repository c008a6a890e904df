"""The capstone's set-up: knobs are validated, runs are profiled, the diagnosis helper
names the largest phase."""

from __future__ import annotations

import pytest

from course_utils.capstone import (
    SLOW,
    Recipe,
    compare_recipes,
    largest_phase,
    make_data,
    run_recipe,
)
from course_utils.profiling import LoopProfile, StepTimes


def test_slow_recipe_has_every_bad_habit():
    assert (SLOW.decode, SLOW.num_workers, SLOW.batch_size) == ("per-sample", 0, 8)
    assert not SLOW.pin_memory and SLOW.precision == "fp32"
    assert SLOW.item_every_step and SLOW.empty_cache_every_step
    fast = SLOW.changed(batch_size=32)
    assert fast.batch_size == 32 and SLOW.batch_size == 8  # a copy; SLOW is unchanged
    with pytest.raises(ValueError, match="decode"):
        Recipe(decode="twice")
    with pytest.raises(ValueError):
        Recipe(batch_size=0)


@pytest.mark.parametrize("times, expected", [
    ((0.3, 0.01, 0.1), "data"), ((0.01, 0.3, 0.1), "copy"), ((0.01, 0.02, 0.5), "compute"),
])
def test_largest_phase(times, expected):
    profile = LoopProfile(steps=[StepTimes(*times, 8)] * 3, wall_s=3 * sum(times))
    assert largest_phase(profile) == expected


def test_run_recipe_profiles_the_requested_steps_on_cpu():
    data = make_data(24, stored_size=36)
    run = run_recipe(SLOW.changed(decode="once", batch_size=4), data, "cpu", samples=16,
                     width=4, repeats=2)
    assert run.profile.num_steps == 4 and run.profile.samples == 16  # warm-up excluded
    assert run.samples_per_s > 0 and run.monitor["source"] == "cpu"
    assert "samples/s" in run.summary()
    slow = run_recipe(SLOW.changed(batch_size=4), data, "cpu", samples=8, width=4)
    assert slow.profile.num_steps == 3  # at least three steps are timed
    assert slow.profile.data_s > 0  # per-sample decoding shows up as data wait


def test_compare_recipes_keeps_the_best_run_of_each_in_order():
    data = make_data(16, stored_size=36)
    slow, fast = compare_recipes([SLOW.changed(batch_size=4),
                                  SLOW.changed(decode="once", batch_size=8)],
                                 data, "cpu", samples=8, width=4, rounds=2)
    assert slow.recipe.batch_size == 4 and fast.recipe.decode == "once"
    assert slow.profile.num_steps == 3 and fast.profile.num_steps == 3
