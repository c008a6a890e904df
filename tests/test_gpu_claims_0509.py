"""The 2026-12-06 teaching review of notebooks 05-09 (07-E1, 07-M1, 08-E1, 08-M1, 09-E1,
09-M1, X-M1, GPU G9, G10): each GPU cell runs here on a CPU with the GPU faked the way a
real one behaves (an allocator that runs out of memory above a cap, PyTorch's SDPA
warnings in the order ``sdp_utils.cpp`` writes them, a launch-bound step at small sizes)."""

from __future__ import annotations

import contextlib
import gc
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from notebook_cells import code_cells

from course_utils import claims
from course_utils.claims import ClaimNotHeld, gpu_claim
from course_utils.oom import error_summary
from course_utils.units import MIB

ROOT = Path(__file__).resolve().parent.parent
NB07 = ROOT / "notebooks" / "07_gpu_memory_and_cache.ipynb"
NB08 = ROOT / "notebooks" / "08_capstone.ipynb"
NB09 = ROOT / "notebooks" / "09_transformers_on_the_gpu.ipynb"
LABEL = "measured on this machine (GPU: faked)"


class FakeAllocator:
    """A GPU's caching allocator in miniature: a training step keeps ``fixed`` bytes (the
    optimizer's state, made by the first step) plus ``per_sample`` bytes per image, and
    raises ``torch.cuda.OutOfMemoryError`` above the cap in force."""

    def __init__(self, fixed: int, per_sample: int) -> None:
        self.fixed, self.per_sample = fixed, per_sample
        self.state = 0  # the optimizer's state, after the first step
        self.peak = 0
        self.cap: int | None = None

    def step(self, batch: int) -> torch.Tensor:
        need = self.state + self.fixed + batch * self.per_sample
        if self.cap is not None and need > self.cap:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried {need / MIB:.0f} MiB")
        self.state = self.fixed
        self.peak = max(self.peak, need - self.state)
        return torch.tensor(1.0)

    @contextlib.contextmanager
    def memory_cap(self, device, mib):
        self.cap = mib * MIB
        try:
            yield
        finally:
            self.cap = None


@pytest.fixture
def fake_gpu_memory(monkeypatch):
    allocator = FakeAllocator(fixed=20 * MIB, per_sample=853 * 1024)  # small_cnn, fp32
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: setattr(
        allocator, "peak", 0))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocator.state)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated",
                        lambda device=None: allocator.state + allocator.peak)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return allocator


@pytest.mark.parametrize("requested", [32, 256, 16384])  # small, cpu, full
def test_07_the_oom_demo_runs_out_of_memory_on_a_gpu_at_every_workload(
    fake_gpu_memory, capsys, requested
):
    # 07-E1: a GPU under 12 GiB runs the cpu sizes (batch 256, ~213 MiB): no OOM in a
    # 1 GiB cap, and the demo's assert stopped Run All. The request now follows the step.
    cells = code_cells(NB07)
    names = {"torch": torch, "gc": gc, "contextlib": contextlib, "MIB": MIB,
             "device": torch.device("cuda", 0), "ON_GPU": True, "budget": None,
             "REQUESTED_BATCH": requested, "GPU_CAP_MIB": 1024, "CPU_BUDGET_SAMPLES": 100,
             "train_at": fake_gpu_memory.step, "memory_cap": fake_gpu_memory.memory_cap,
             "measured_on": lambda device: LABEL, "error_summary": error_summary}
    for cell in ("nb07-21p", "nb07-21c", "nb07-21d"):
        exec(cells[cell], names)
    assert names["ran"] < names["REQUESTED_BATCH"]
    assert "CUDA out of memory" in capsys.readouterr().out


# sdp_utils.cpp (select_sdp_backend in debug mode) on a T4 (sm 7.5) with one backend
# enabled: each backend's header, then its reasons, in the order mem-efficient, flash, cuDNN
_T4_REASONS = {
    "EFFICIENT_ATTENTION": ("Memory efficient kernel not used because:",
                            "Memory Efficient attention has been runtime disabled."),
    "FLASH_ATTENTION": ("Flash attention kernel not used because:",
                        "Flash attention only supports gpu architectures in the range "
                        "[sm80, sm121]. Attempting to run on a sm 7.5 gpu."),
    "CUDNN_ATTENTION": ("CuDNN attention kernel not used because:",
                        "CuDNN attention has been runtime disabled."),
}


def _t4_sdpa(enabled):
    def attention(q, k, v, is_causal=False):
        if enabled[0] in ("MATH", "EFFICIENT_ATTENTION"):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        for backend, (header, reason) in _T4_REASONS.items():
            warnings.warn(header, stacklevel=2)
            disabled = "Memory Efficient attention has been runtime disabled."
            warnings.warn(reason if backend == enabled[0] else disabled.replace(
                "Memory Efficient", backend.split("_")[0].title()), stacklevel=2)
        raise RuntimeError("No available kernel. Aborting execution.")

    @contextlib.contextmanager
    def sdpa_kernel(backend):
        enabled[0] = backend.name
        yield

    return attention, sdpa_kernel


def test_09_the_refusal_table_gives_each_kernels_own_reason(capsys):
    # 09-M1: on a T4 the table read "FLASH_ATTENTION refused: Memory Efficient attention
    # has been runtime disabled." (the first warning), not flash's sm80 reason
    from torch.nn.attention import SDPBackend

    enabled = [None]
    attention, sdpa_kernel = _t4_sdpa(enabled)
    names = {"torch": torch, "F": SimpleNamespace(scaled_dot_product_attention=attention),
             "sdpa_kernel": sdpa_kernel, "SDPBackend": SDPBackend, "warnings": warnings,
             "naive_attention": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                 q, k, v, is_causal=True),
             "device": torch.device("cpu"), "attn_dtype": torch.float32, "ATTN_HEADS": 2,
             "HEAD_DIM": 8, "measured_on": lambda device: LABEL}
    exec(code_cells(NB09)["nb09-11"], names)
    assert names["runs"]["FLASH_ATTENTION"].startswith("refused: Flash attention only supports")
    assert "disabled" not in names["runs"]["CUDNN_ATTENTION"]
    assert names["runs"]["EFFICIENT_ATTENTION"].startswith("runs")


# --- the rule (08-E1, 09-E1, G9): what the code decides on every GPU is an assert -----------


def _nb08_sync(monkeypatch, waits_per_step):
    def slow_loop(data, model, device, limit):
        for _ in range(5):
            for _ in range(waits_per_step):
                warnings.warn("called a synchronizing CUDA operation", stacklevel=1)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    import collections
    import itertools
    import linecache

    names = {"torch": torch, "warnings": warnings, "itertools": itertools,
             "linecache": linecache, "Counter": collections.Counter, "WIDTH": 4,
             "device": torch.device("cuda", 0), "data": None, "slow_loop": slow_loop,
             "build_model": lambda name, width: SimpleNamespace(to=lambda device: None),
             "gpu_claim": gpu_claim, "measured_on": lambda device: LABEL}
    exec(code_cells(NB08)["nb08-sync"], names)


def test_08_no_sync_warning_at_item_stops_every_run(monkeypatch):
    # 08-E1: whether .item() waits is PyTorch's behaviour on every GPU, not a GPU figure:
    # a lesson whose sync finder finds nothing is wrong, in a learner's run too
    monkeypatch.setenv(claims.MODE_VAR, "report")
    _nb08_sync(monkeypatch, waits_per_step=3)  # .item() and two pageable copies
    with pytest.raises(AssertionError, match="waits"):
        _nb08_sync(monkeypatch, waits_per_step=0)


def _nb09_mfu(utilization, source):
    import course_utils.flops as flops

    names = {"torch": torch, "get_batch": lambda b, g: (None, None), "BATCH": 1,
             "generator": None, "REPEATS": 1, "model": None, "optimizer": None,
             "train_step": None, "tokens": 1000, "N": 10, "counts": {"math": 6e4},
             "benchmark": lambda fn, device, repeats: SimpleNamespace(median_s=1.0),
             "device_peak_flops": lambda device, dtype: flops.PeakFlops(1e12, source),
             "mfu": lambda flop, seconds, peak: utilization, "device": torch.device("cuda", 0),
             "format_seconds": str, "measured_on": lambda device: LABEL,
             "record_measurement": lambda *a, **k: None, "gpu_claim": gpu_claim}
    exec(code_cells(NB09)["nb09-24"], names)


def test_09_an_mfu_over_1_against_a_datasheet_peak_is_wrong_arithmetic_everywhere(
    monkeypatch, capsys
):
    # 09-E1/G9: the course's own FLOP count, clock and peak: an assert, in report mode too
    monkeypatch.setenv(claims.MODE_VAR, "report")
    datasheet = "Tesla T4: dense fp32 peak, NVIDIA T4 datasheet"
    _nb09_mfu(0.3, datasheet)
    with pytest.raises(AssertionError, match="wrong FLOPs"):
        _nb09_mfu(1.3, datasheet)
    # G16: a peak measured here from one matmul can be beaten by larger ones: said, not raised
    monkeypatch.setenv(claims.MODE_VAR, "strict")
    _nb09_mfu(1.3, "measured once in this process: best of 5 fp32 matmuls")
    assert "the machine was busy" in capsys.readouterr().out
