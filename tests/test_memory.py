"""course_utils.memory: freeing what a notebook keeps alive, the report, allocator
settings and OOM recovery. GPU paths are marked ``gpu``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest
import torch

from course_utils import memory, oom
from course_utils.batch import run_with_oom_recovery
from course_utils.memory import (
    ALLOC_CONF_VARIABLES,
    AllocatorAlreadyInitializedError,
    GpuMemory,
    MemoryReport,
    configure_allocator,
    empty_cache_experiment,
    memory_report,
    summarize_segments,
)
from course_utils.oom import MemoryBudget, drop_references
from course_utils.units import MIB

ROOT = Path(__file__).resolve().parent.parent
BIG = 4 * MIB  # elements: a 16 MiB float32 tensor


@pytest.fixture
def saved_traceback_attributes():
    """Restore sys.last_* after a test that sets them."""
    saved = {name: getattr(sys, name) for name in oom._TRACEBACK_ATTRIBUTES if hasattr(sys, name)}
    yield
    for name in oom._TRACEBACK_ATTRIBUTES:
        if hasattr(sys, name):
            delattr(sys, name)
    for name, value in saved.items():
        setattr(sys, name, value)


@pytest.mark.slow
def test_drop_references_drops_a_tensor_held_only_by_the_out_history():
    tensor = torch.ones(BIG)
    alive = weakref.ref(tensor)
    namespace = {"Out": {3: tensor, 4: "some text"}, "_3": tensor, "_": tensor, "_4": "some text"}
    del tensor
    assert alive() is not None, "the fake history should keep the tensor alive"
    freed = drop_references(namespace=namespace)
    assert alive() is None, "the tensor survived drop_references"
    assert set(freed.history_entries) >= {"Out[3]", "_"}
    assert namespace["Out"] == {4: "some text"}, "an entry without a tensor was dropped"
    assert namespace["_4"] == "some text" and "_3" not in namespace


@pytest.mark.slow
def test_drop_references_drops_history_entries_that_hold_a_named_object():
    class Holder:  # not a tensor: matched because it is the named variable
        pass

    holder = Holder()
    namespace = {"holder": holder, "Out": {1: holder, 2: [torch.ones(2)], 3: 42}}
    alive = weakref.ref(holder)
    del holder
    freed = drop_references("holder", namespace=namespace)
    assert alive() is None
    assert freed.deleted == ["holder"]
    assert namespace["Out"] == {3: 42}, "a list holding a tensor is an entry to drop too"


def test_drop_references_clears_a_saved_traceback(saved_traceback_attributes):
    probes: list[weakref.ref[torch.Tensor]] = []

    def failing_step() -> None:
        activations = torch.ones(BIG)
        probes.append(weakref.ref(activations))
        raise RuntimeError("CUDA out of memory (simulated)")

    try:
        failing_step()
    except RuntimeError as error:  # what IPython does when a cell raises
        sys.last_type, sys.last_value, sys.last_traceback = type(error), error, error.__traceback__
        sys.last_exc = error
    assert probes[0]() is not None, "the saved traceback should keep the frame's tensor"
    freed = drop_references(namespace={})
    assert freed.cleared_traceback
    assert probes[0]() is None, "the tensor in the failed frame survived drop_references"
    assert not any(getattr(sys, name, None) for name in oom._TRACEBACK_ATTRIBUTES)


@pytest.mark.slow
def test_drop_references_deletes_names_and_an_optimizer_keeps_parameters_alive():
    model = torch.nn.Linear(256, 256)
    namespace = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    weight = weakref.ref(model.weight)
    del model
    freed = drop_references("model", "missing", namespace=namespace)
    assert freed.deleted == ["model"] and freed.not_found == ["missing"]
    assert weight() is not None, "the optimizer still refers to the parameters"
    drop_references("optimizer", namespace=namespace)
    assert weight() is None and namespace == {}
    assert "missing" in str(freed)


_module_level_tensor = None


def test_drop_references_defaults_to_the_callers_globals_outside_ipython():
    global _module_level_tensor
    _module_level_tensor = torch.ones(BIG)
    alive = weakref.ref(_module_level_tensor)
    freed = drop_references("_module_level_tensor")
    assert "_module_level_tensor" not in globals()
    assert alive() is None and freed.deleted == ["_module_level_tensor"]


@pytest.mark.slow
def test_drop_references_in_a_real_ipython_shell():
    """The Out history, _N and a cell's traceback as IPython keeps them."""
    script = textwrap.dedent(
        """
        import weakref
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        cells = [
            "import torch, weakref, sys",
            "big = torch.ones(4 * 1024 * 1024); alive = weakref.ref(big)",
            "big",
            "del big",
            "def f():\\n    t = torch.ones(4 * 1024 * 1024); probes.append(weakref.ref(t)); 1 / 0",
            "probes = []",
            "f()",
        ]
        for cell in cells:
            shell.run_cell(cell, store_history=True, silent=False)
        ns = shell.user_ns
        assert ns["alive"]() is not None, "Out should hold the tensor"
        assert ns["probes"][0]() is not None, "the traceback should hold the tensor"
        shell.run_cell("from course_utils.oom import drop_references; r = drop_references()")
        print("OUT", ns["alive"]() is None, "TB", ns["probes"][0]() is None,
              "ENTRIES", ns["r"].history_entries, "CLEARED", ns["r"].cleared_traceback)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("OUT True TB True"), last
    assert "Out[3]" in last and "CLEARED True" in last


def test_configure_allocator_sets_both_variables(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for name in ALLOC_CONF_VARIABLES:  # setenv first, so monkeypatch restores the original
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    text = configure_allocator(expandable_segments=True, max_split_size_mb=128)
    assert text == "expandable_segments:True,max_split_size_mb:128"
    assert all(os.environ[name] == text for name in ALLOC_CONF_VARIABLES)
    # options set earlier are kept; the one named again is replaced
    assert configure_allocator(expandable_segments=False) == (
        "expandable_segments:False,max_split_size_mb:128"
    )
    with pytest.raises(ValueError, match="which option"):
        configure_allocator()


def test_configure_allocator_refuses_once_cuda_is_initialized(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    for name in ALLOC_CONF_VARIABLES:
        monkeypatch.setenv(name, "max_split_size_mb:64")
    with pytest.raises(AllocatorAlreadyInitializedError, match="Restart the kernel"):
        configure_allocator(expandable_segments=True)
    assert all(os.environ[name] == "max_split_size_mb:64" for name in ALLOC_CONF_VARIABLES)


def test_memory_report_on_the_cpu_path(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    report = memory_report()
    assert report.gpus == []
    assert report.process_rss_mib > 10
    text = str(report)
    assert "no caching allocator" in text and "RSS" in text


def test_gpu_table_labels_the_context_overhead():
    gpus = [
        GpuMemory("cuda:0", "Tesla T4", 512, 1024, 600, 14000, 15360, 1400),
        GpuMemory("cuda:1", "Tesla T4", 0, 0, 0, 15000, 15360, None),
    ]
    assert gpus[0].cached_mib == 512 and gpus[0].outside_allocator_mib == 376
    assert gpus[1].outside_allocator_mib is None
    table = str(MemoryReport(gpus, 0.0, ""))
    context_row = next(line for line in table.splitlines() if "CUDA context" in line)
    assert context_row.split()[-2:] == ["376.0", "n/a"]


@pytest.mark.slow
def test_empty_cache_experiment_on_the_cpu_frees_at_del():
    readings = empty_cache_experiment("cpu", 64)
    assert [r.reserved_mib for r in readings] == [None] * 6, "a CPU has no reserved memory"
    grew = readings[1].rss_mib - readings[0].rss_mib
    dropped = readings[1].rss_mib - readings[2].rss_mib
    assert grew > 32, f"RSS grew by only {grew:.1f} MiB for a 64 MiB tensor"
    assert dropped > 32, f"del gave back only {dropped:.1f} MiB: there is no cache on a CPU"
    assert "malloc_trim" in readings[2].stage, "the CPU row runs del and malloc_trim: say so"


@pytest.mark.slow
def test_oom_recovery_finds_a_smaller_batch_and_reraises_other_errors():
    sizes: list[int] = []

    def step(n: int) -> None:
        sizes.append(n)
        MemoryBudget(40 * MIB).charge(n * MIB)

    result = run_with_oom_recovery(step, 100)
    assert result.recovered and result.batch_size == 40 and result.requested == 100
    assert "simulated" in (result.error or "")
    assert max(sizes[1:]) < 100, "the search must stay below the size that failed"
    fits = run_with_oom_recovery(step, 8)
    assert not fits.recovered and fits.batch_size == 8

    def broken(n: int) -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        run_with_oom_recovery(broken, 16)
    with pytest.raises(MemoryError, match="not even a batch of 1"):
        run_with_oom_recovery(lambda n: MemoryBudget(MIB // 2).charge(n * MIB), 16)


def test_summarize_segments_finds_stuck_cache():
    segments = [
        {"total_size": 20 * MIB, "blocks": [{"size": 20 * MIB, "state": "inactive"}]},
        {
            "total_size": 20 * MIB,
            "blocks": [
                {"size": 12 * MIB, "state": "inactive"},
                {"size": 8 * MIB, "state": "active_allocated"},
            ],
        },
    ]
    summary = summarize_segments(segments)
    assert summary.cached_mib == 32 and summary.largest_free_block_mib == 20
    assert summary.stuck_mib == 12, "only the free block next to a live tensor is stuck"


@pytest.mark.slow
def test_expandable_segments_comparison_reports_a_failing_child_in_one_line(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the children see no GPU, on any machine
    with pytest.raises(RuntimeError, match=r"^default: ") as caught:
        memory.compare_expandable_segments(blocks=3, block_mib=2)
    assert "ModuleNotFoundError" not in str(caught.value), "the child could not import us"


# --------------------------------------------------------------------- GPU (real) paths


@pytest.mark.gpu
def test_reserved_returns_to_baseline_after_del_and_empty_cache():
    readings = empty_cache_experiment("cuda", 256)
    base, allocated, deleted, again, emptied_alive, emptied = readings
    assert allocated.allocated_mib >= base.allocated_mib + 256
    assert deleted.allocated_mib == base.allocated_mib, "del should free the tensor"
    assert deleted.reserved_mib == allocated.reserved_mib, "del keeps the block cached"
    assert again.reserved_mib == deleted.reserved_mib, "the same size reuses the cache"
    assert emptied_alive.reserved_mib == again.reserved_mib, "empty_cache freed a live tensor?"
    assert emptied.reserved_mib == base.reserved_mib


@pytest.mark.gpu
def test_memory_report_and_drop_references_on_a_gpu():
    namespace = {"x": torch.ones(64 * MIB, device="cuda")}  # 256 MiB
    namespace["Out"] = {1: namespace["x"]}
    report = memory_report()
    assert report.gpus and report.gpus[0].allocated_mib >= 256
    gpu = report.gpus[0]
    assert gpu.allocated_mib <= gpu.reserved_mib and gpu.free_mib <= gpu.total_mib
    if gpu.outside_allocator_mib is not None:
        assert gpu.outside_allocator_mib > 0, "the CUDA context should show in NVML"
    freed = drop_references("x", namespace=namespace)
    assert freed.released_mib >= 256


@pytest.mark.gpu
def test_oom_recovery_under_a_real_memory_cap():
    def step(n: int) -> None:  # n MiB of activations, plus a matmul on them
        x = torch.ones(n, 256, 1024, device="cuda")
        (x * 2).sum().item()

    with memory.memory_cap("cuda", 1024):
        result = run_with_oom_recovery(step, 4096)
    assert result.recovered, "4 GiB should not fit under a 1 GiB cap"
    assert 0 < result.batch_size < 1024
    step(2048)  # the cap is lifted afterwards


@pytest.mark.gpu
def test_expandable_segments_do_not_leave_more_stuck_cache():
    results = memory.compare_expandable_segments(blocks=30, block_mib=6)
    default, expandable = results["default"], results["expandable_segments"]
    assert default.stuck_mib > 0, "two of three freed 6 MiB blocks should pin 20 MiB segments"
    assert expandable.stuck_mib <= default.stuck_mib


@pytest.mark.gpu
def test_expandable_segments_reuse_the_freed_range_when_a_batch_grows():
    # 07-M1: 8 x 48 MiB freed, then 8 x 50.4 MiB: ~800 MiB by default, ~420 expandable
    reserved = memory.compare_regrowth(tensors=8, tensor_mib=48, growth=1.05)
    assert reserved["default"] >= 8 * (48 + 50)
    assert reserved["expandable_segments"] / reserved["default"] <= 0.8
