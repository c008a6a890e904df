"""The capstone's set-up: knobs are validated, runs are profiled, the diagnosis helper
names the largest phase."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from course_utils.capstone import (
    SLOW,
    Recipe,
    compare_loops,
    largest_phase,
    run_loop,
    run_recipe,
)
from course_utils.data import EncodedImages, PreDecodedImages, augment_on_device
from course_utils.profiling import LoopProfile


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


@pytest.mark.parametrize(
    "times, expected",
    [
        ((0.3, 0.01, 0.1), "data"),
        ((0.01, 0.3, 0.1), "copy"),
        ((0.01, 0.02, 0.5), "compute"),
    ],
)
def test_largest_phase(times, expected):
    data_s, copy_s, compute_s = times
    profile = LoopProfile(num_steps=1, data_s=data_s, copy_s=copy_s, compute_s=compute_s)
    assert largest_phase(profile) == expected


def test_run_recipe_profiles_the_requested_steps_on_cpu():
    data = EncodedImages(24, stored_size=36)
    run = run_recipe(
        SLOW.changed(decode="once", batch_size=4), data, "cpu", samples=16, width=4, repeats=2
    )
    assert run.profile.num_steps == 4 and run.profile.samples == 16  # warm-up excluded
    assert run.samples_per_s > 0 and run.monitor["source"] == "cpu"
    slow = run_recipe(SLOW.changed(batch_size=4), data, "cpu", samples=8, width=4)
    assert slow.profile.num_steps == 3  # at least three steps are timed
    assert slow.profile.data_s > 0  # per-sample decoding shows up as data wait


def _habits_loop(data, model, device, timed):
    """The notebook's slow loop, in short: per-sample decoding, .item(), empty_cache()."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for inputs, targets in timed(DataLoader(data, batch_size=4, shuffle=True)):
        loss = nn.functional.cross_entropy(model(inputs.to(device)), targets.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        torch.cuda.empty_cache()
    return losses


def _fixed_loop(data, model, device, timed, lr=0.05):
    decoded = PreDecodedImages.from_encoded(data)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for images, labels in timed(DataLoader(decoded, batch_size=8, shuffle=True)):
        images = augment_on_device(images.to(device), data.image_size)
        loss = nn.functional.cross_entropy(model(images), labels.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def test_run_loop_times_the_data_wait_and_spies_on_the_habits():
    data = EncodedImages(24, stored_size=36)
    threads = torch.get_num_threads()
    slow = run_loop(_habits_loop, data, "cpu", samples=12, width=4)
    assert torch.get_num_threads() == threads  # one thread during the run only
    assert slow.profile.num_steps == 3 and slow.profile.samples == 12  # + 1 warm-up step
    assert len(slow.losses) == 4 and slow.item_calls == 4 and slow.empty_cache_calls == 4
    assert slow.profile.data_s > 0 and slow.name == "_habits_loop"
    fast = run_loop(_fixed_loop, data, "cpu", samples=8 * 16, width=4)
    assert fast.item_calls == 0 and fast.empty_cache_calls == 0
    assert fast.profile.num_steps == 16 and len(fast.losses) == 17
    # decoding left the loop: far less waiting per sample
    assert fast.profile.data_s / fast.profile.samples < slow.profile.data_s / slow.profile.samples
    assert fast.loss_after < 0.99 * fast.loss_before  # it trains ...
    frozen = run_loop(lambda *args: _fixed_loop(*args, lr=0.0), data, "cpu", samples=32, width=4)
    # ... and the notebook's check can fail: BatchNorm's running statistics still move
    assert not frozen.loss_after < 0.99 * frozen.loss_before


def test_compare_loops_keeps_the_best_run_of_each_in_order():
    data = EncodedImages(16, stored_size=36)
    slow, fast = compare_loops(
        [_habits_loop, _fixed_loop], data, "cpu", samples=8, width=4, rounds=2
    )
    assert (slow.name, fast.name) == ("_habits_loop", "_fixed_loop")
    assert slow.profile.samples == 12 and fast.profile.samples == 24  # at least 3 steps each


def _slow_setup_loop(data, model, device, timed):
    """Work before the first batch (as decoding once is) counts in the end-to-end rate."""
    time.sleep(0.3)
    return _fixed_loop(data, model, device, timed)


def test_run_loop_counts_the_set_up_before_the_first_batch():
    data = EncodedImages(16, stored_size=36)
    quick = run_loop(_fixed_loop, data, "cpu", samples=32, width=4)
    late = run_loop(_slow_setup_loop, data, "cpu", samples=32, width=4)
    assert late.setup_s >= 0.3 > quick.setup_s
    assert late.profile.samples == 32 and late.epochs == 2.0  # 4 steps of 8 after the warm-up
    # the steps alone run as fast, but the set-up is paid
    assert late.samples_per_s < 32 / 0.3 and late.samples_per_s < quick.samples_per_s
    assert late.samples_per_s < late.profile.samples_per_s
    # sleeping costs no CPU time: the CPU rate sees the steps only, and compares loops there
    assert late.setup_cpu_s < 0.1 and late.samples_per_cpu_s > 32 / 0.3
    assert late.rate() == late.samples_per_cpu_s


def _sync_loop(read):
    def loop(data, model, device, timed):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for step, (inputs, targets) in enumerate(timed(DataLoader(data, batch_size=4))):
            loss = nn.functional.cross_entropy(model(inputs.to(device)), targets.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            read(step, loss)

    return loop


@pytest.mark.parametrize(
    "read, calls",
    [
        (lambda step, loss: loss.item(), 4),
        (lambda step, loss: float(loss), 4),
        (lambda step, loss: loss.detach().item(), 4),
        (lambda step, loss: loss.detach().cpu().tolist(), 4),
        (lambda step, loss: step % 2 == 0 and loss.item(), 2),  # every other step
        (lambda step, loss: loss.detach().sum(), 0),  # stays on the device
    ],
)
def test_spies_count_every_way_of_reading_the_loss_on_the_host(read, calls):
    data = EncodedImages(16, stored_size=36)
    run = run_loop(_sync_loop(read), data, "cpu", samples=12, width=4)
    assert run.item_calls == calls


def test_decoding_once_is_paid_inside_the_run():
    data = EncodedImages(32, stored_size=64)
    once = run_recipe(SLOW.changed(decode="once"), data, "cpu", samples=16, width=4)
    per_sample = run_recipe(SLOW, data, "cpu", samples=16, width=4)
    assert once.setup_s > per_sample.setup_s  # 32 decodes before the first step ...
    assert once.samples_per_s < once.profile.samples_per_s  # ... counted in the rate


def _burn_cpu(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _loop_with_a_busy_child(data, model, device, timed):
    """Its work runs in another process (as DataLoader workers' decoding does)."""
    import multiprocessing

    losses = _fixed_loop(data, model, device, timed)
    child = multiprocessing.get_context("fork").Process(target=_burn_cpu, args=(0.4,))
    child.start()
    child.join()  # reaped: only RUSAGE_CHILDREN still knows its CPU time
    return losses


@pytest.mark.slow
def test_cpu_time_counts_the_child_processes_the_loop_ran():
    data = EncodedImages(16, stored_size=36)
    run = run_loop(_loop_with_a_busy_child, data, "cpu", samples=16, width=4)
    assert run.children_cpu_s >= 0.3  # the child's 0.4 s of CPU, on a busy machine too
    assert run.steps_cpu_s >= run.profile.cpu_s + 0.3
    assert run.rate() <= run.profile.samples / run.children_cpu_s


def _worker_loop(workers):
    def loop(data, model, device, timed):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = DataLoader(data, batch_size=8, num_workers=workers, persistent_workers=workers > 0)
        for inputs, targets in timed(loader):  # each sample decoded in a worker
            loss = nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    loop.__name__ = f"workers_{workers}"
    return loop


@pytest.mark.slow
def test_decoding_in_workers_is_not_free_cpu_time():
    # 08-N3: per CPU-second of this process alone, a num_workers=2 loop scored 4.38x the
    # same loop decoding in the main process; counting the workers, it does the same work
    data = EncodedImages(32, stored_size=128)
    here, workers = compare_loops(
        [_worker_loop(0), _worker_loop(2)], data, "cpu", samples=64, width=4, rounds=2
    )
    assert workers.children_cpu_s > 0.5 * here.steps_cpu_s  # the decoding moved there
    assert workers.rate() < 1.5 * here.rate()  # ... and is counted
    only_this_process = workers.profile.samples / (workers.setup_cpu_s + workers.profile.cpu_s)
    assert only_this_process > 1.5 * workers.rate()  # what the old rate would have said


def test_whole_batches_index_the_decoded_tensor_once_per_batch():
    data = EncodedImages(24, stored_size=36)
    recipe = SLOW.changed(decode="once", batch_size=8, whole_batches=True)
    run = run_recipe(recipe, data, "cpu", samples=16, width=4)
    assert run.profile.num_steps == 3 and run.profile.samples == 24  # 8 per batch, >= 3 steps
    assert run.loss_after == run.loss_after and run.steps_rate() > 0
    with pytest.raises(ValueError, match="decode='once'"):
        SLOW.changed(whole_batches=True)


def test_gpu_only_knobs_change_nothing_on_a_cpu_and_everything_on_a_gpu():
    once = SLOW.changed(decode="once", batch_size=16)
    for knobs in (
        dict(empty_cache_every_step=False),
        dict(pin_memory=True),
        dict(item_every_step=False),
        dict(precision="auto"),
    ):
        assert once.changed(**knobs).as_run_on("cpu") == once.as_run_on("cpu")
        assert once.changed(**knobs).as_run_on("cuda:0") != once.as_run_on("cuda:0")
    assert once.changed(batch_size=8).as_run_on("cpu") != once.as_run_on("cpu")
    assert once.changed(whole_batches=True).as_run_on("cpu") != once.as_run_on("cpu")
    assert once.changed(precision="bf16").as_run_on("cpu") != once.as_run_on("cpu")  # asked
    assert once.changed(item_every_step=False).as_run_on("mps") != once.as_run_on("mps")


def test_the_steps_rate_leaves_out_the_set_up():
    data = EncodedImages(16, stored_size=36)
    late = run_loop(_slow_setup_loop, data, "cpu", samples=32, width=4)
    assert late.steps_rate() == late.profile.samples / late.steps_cpu_s
    assert late.steps_rate() >= late.rate()
