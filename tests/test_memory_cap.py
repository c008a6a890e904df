"""``memory_cap`` and the finders' cost per failed trial (issue 31; reviews 03-N1, 04-N2,
X-N2), pinned on a CPU by faking the CUDA caching allocator the way the real one behaves
(``c10/cuda/CUDACachingAllocator.cpp``): a freed block stays cached and is reused
without the per-process cap's check; only a new segment is checked against the cap, and
before raising out of memory the allocator frees its cache and tries once more.
"""

from __future__ import annotations

import gc
import types
import weakref

import pytest
import torch

from course_utils import memory, oom
from course_utils.batch import TrainTrial, batch_size_sweep, find_max_batch_size
from course_utils.oom import MemoryBudget
from course_utils.units import MIB

GIB = 1024 * MIB
PER_SAMPLE = MIB  # bytes one sample of the fake trial needs


class FakeAllocator:
    """One GPU's caching allocator: ``malloc`` reuses the smallest cached block that is
    large enough (no cap check), else asks for a new segment, which must fit under
    ``fraction * total`` (after emptying the cache once, as the real one does)."""

    def __init__(self, total: int):
        self.total, self.fraction = total, 1.0
        self.allocated, self.cached = 0, []  # bytes of live blocks; sizes of free blocks

    def malloc(self, nbytes: int) -> int:
        fitting = sorted(size for size in self.cached if size >= nbytes)
        if fitting:  # reused from the cache: the cap is not consulted
            self.cached.remove(fitting[0])
            self.allocated += fitting[0]
            return fitting[0]
        limit = self.fraction * self.total
        if self.allocated + sum(self.cached) + nbytes > limit:
            self.cached.clear()  # release_cached_blocks, then try again
            if self.allocated + nbytes > limit:
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {nbytes / MIB:.2f} MiB (fake)"
                )
        self.allocated += nbytes
        return nbytes

    def free(self, block: int) -> None:
        self.allocated -= block
        self.cached.append(block)

    def trial(self, batch_size: int) -> None:
        """A training step's memory: one block of ``batch_size`` samples, freed after."""
        self.free(self.malloc(batch_size * PER_SAMPLE))


@pytest.fixture
def allocator(monkeypatch):
    """A fake 80 GiB GPU behind torch.cuda's memory calls."""
    fake = FakeAllocator(80 * GIB)
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=fake.total)
    )
    monkeypatch.setattr(cuda, "memory_allocated", lambda i=None: fake.allocated)
    monkeypatch.setattr(cuda, "empty_cache", lambda: fake.cached.clear())
    monkeypatch.setattr(cuda, "get_per_process_memory_fraction", lambda i=None: fake.fraction)

    def set_fraction(fraction, index=None):
        fake.fraction = fraction

    monkeypatch.setattr(cuda, "set_per_process_memory_fraction", set_fraction)
    return fake


def test_the_fake_reuses_cached_blocks_past_the_cap_as_the_real_allocator_does(allocator):
    allocator.trial(8192)  # a sweep's top size, now cached
    allocator.fraction = 2 * GIB / allocator.total  # a cap set without emptying the cache
    allocator.trial(8192)  # 8 GiB under a 2 GiB cap: served from the cache
    with pytest.raises(torch.OutOfMemoryError):
        allocator.trial(16384)  # a new segment: checked, the cache released, still too big
    assert allocator.cached == []


def test_a_search_under_the_cap_finds_the_cap_not_the_memory_cached_before_it(allocator):
    allocator.trial(8192)  # notebook 03's sweep ran up to its top size before the finder
    assert allocator.cached == [8192 * PER_SAMPLE]
    with memory.memory_cap("cuda:0", 2048):  # 2 GiB: 2048 samples of the fake trial
        assert allocator.cached == [], "the cap must start with an empty cache"
        found = find_max_batch_size(allocator.trial, high=2**15)
        refit = allocator.trial(found.batch_size)  # notebook 03 runs the answer again
    assert found.batch_size == 2048, found.history  # 8192 before the fix: the cached block
    assert refit is None and allocator.fraction == 1.0


def test_the_cap_label_says_when_the_gpu_itself_is_the_limit():
    t4 = int(14.58 * GIB)  # torch's total_memory for a T4 (nvidia-smi: 15360 MiB)
    assert memory.memory_cap_label(15 * 1024, t4).startswith("this GPU's own memory")
    assert memory.memory_cap_label(15 * 1024, 80 * GIB).startswith("a 15.0 GiB cap")


@pytest.fixture
def collections(monkeypatch):
    """Count full collections (``gc.collect``), still running them."""
    calls = []
    collect = gc.collect

    def counted(*args):
        calls.append(args)
        return collect(*args)

    monkeypatch.setattr(gc, "collect", counted)
    return calls


def test_a_failed_trial_on_a_cpu_budget_frees_its_tensors_without_a_full_collection(collections):
    made = []  # weak references to every tensor a trial allocated

    def trial(n):
        activations = torch.empty(n * 256)  # 1 KiB a sample
        made.append(weakref.ref(activations))
        MemoryBudget(100 * 1024).charge(activations.nbytes)

    found = find_max_batch_size(trial)
    assert found.batch_size == 100 and found.trials == 14
    assert collections == [], "a CPU budget has no cache: no gc.collect() per failed trial"
    assert all(ref() is None for ref in made), "the failed trials' tensors went with them"


def test_the_course_models_cpu_trials_and_sweep_run_no_full_collection(collections):
    trial = TrainTrial("mlp", budget_bytes=TrainTrial("mlp").peak_bytes(24))
    found = find_max_batch_size(trial, high=256)
    assert 16 <= found.batch_size < 48 and not found.capped
    sweep = batch_size_sweep(trial, [8, 64], repeats=1)
    assert sweep.rows[-1].out_of_memory
    assert collections == []


@pytest.mark.slow
def test_on_a_gpu_the_heap_is_collected_only_when_a_cycle_still_holds_the_memory(
    allocator, collections
):
    class Step:  # a failed step whose activations a reference cycle keeps alive
        def __init__(self):
            self.block = allocator.malloc(PER_SAMPLE)
            self.me = self

        def __del__(self):
            allocator.free(self.block)

    def plain(n):
        allocator.trial(n)

    def cyclic(n):  # runs out of memory above 50 samples, after the forward made a cycle
        Step()  # dropped at once, but only gc frees it
        if n > 50:
            raise torch.OutOfMemoryError("CUDA out of memory. (fake, after the forward)")

    with memory.memory_cap("cuda:0", 100):
        collections.clear()
        assert find_max_batch_size(plain).batch_size == 100
        assert collections == [], "nothing left allocated: empty_cache only"
        found = find_max_batch_size(cyclic)
    failed = sum(not t.fits for t in found.history)
    assert found.batch_size == 50 and failed >= 1
    assert len(collections) >= failed, "a cycle held device memory: collect it"
    assert oom.allocated_cuda_bytes() == 0
