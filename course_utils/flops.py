"""FLOPs of a model, datasheet peak FLOP/s of GPUs, and model FLOP utilization (MFU).

:func:`count_flops` runs a model once under ``torch.utils.flop_counter.FlopCounterMode``
and returns the FLOPs of the forward pass, or of forward plus backward (a training step,
about 3x the forward). One multiply-add counts as 2 FLOPs, the convention of datasheet
peaks. "Peak" here is always FLOP/s (a peak of memory: ``footprint.PeakMemory``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from course_utils.timing import benchmark, synchronizer


def count_flops(
    model: nn.Module | Callable[..., Any],
    *inputs: Any,
    training: bool = False,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> int:
    """FLOPs of one call of ``model(*inputs)`` (with ``training=True``: plus backward of
    ``loss_fn(output)``, default the output's sum; the gradients stay on the parameters).

    >>> count_flops(nn.Linear(4, 3, bias=False), torch.ones(2, 4))  # 2 * 2*4*3
    48
    """
    with FlopCounterMode(display=False) as counter:
        if training:
            output = model(*inputs)
            loss = loss_fn(output) if loss_fn is not None else output.float().sum()
            loss.backward()
        else:
            with torch.no_grad():
                model(*inputs)
    return int(counter.get_total_flops())


# ------------------------------------------------------------------ peaks and MFU

# The primary source of each row of GPU_PEAK_FLOPS: NVIDIA's datasheets (for the L4, NVIDIA's
# Ada architecture whitepaper, the source Lightning's throughput utilities cite too).
_T4 = "NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet, https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_A10 = "NVIDIA A10 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf"
_L4 = "NVIDIA Ada GPU architecture whitepaper v2.1 (L4), https://images.nvidia.com/aem-dam/Solutions/Data-Center/l4/nvidia-ada-gpu-architecture-whitepaper-v2.1.pdf"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet, https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446"


@dataclass(frozen=True)
class GpuPeakFlops:
    """A GPU's dense datasheet peaks in TFLOP/s (``None``: no such tensor-core mode).
    Ampere and newer datasheets quote tensor figures with 2:4 sparsity; these are dense."""

    name: str
    compute_capability: tuple[int, int]
    fp32: float
    tf32: float | None
    fp16: float
    bf16: float | None
    source: str  # the document the figures come from
    sms: int | None = None  # streaming multiprocessors of the whole GPU (for MIG slices)

    def slice_of(self, sm_count: int) -> GpuPeakFlops:
        """The peaks of a MIG slice with ``sm_count`` of this GPU's SMs: the same clocks,
        the slice's share of the SMs (a 1g slice of an A100 has 14 of 108).

        >>> slice = gpu_peak_flops("A100").slice_of(14)
        >>> round(slice.fp32, 2), slice.name
        (2.53, 'A100 MIG slice (14 of 108 SMs)')
        """
        if self.sms is None or not 0 < sm_count <= self.sms:
            raise ValueError(f"{self.name}: cannot scale to {sm_count} SMs")
        share = sm_count / self.sms

        def scaled(tflops: float | None) -> float | None:
            return None if tflops is None else tflops * share

        return GpuPeakFlops(
            f"{self.name} MIG slice ({sm_count} of {self.sms} SMs)",
            self.compute_capability,
            self.fp32 * share,
            scaled(self.tf32),
            self.fp16 * share,
            scaled(self.bf16),
            f"{self.source}; scaled by the slice's share of the SMs",
            sm_count,
        )


GPU_PEAK_FLOPS: tuple[GpuPeakFlops, ...] = (
    GpuPeakFlops("T4", (7, 5), 8.1, None, 65.0, None, _T4),
    GpuPeakFlops("V100", (7, 0), 15.7, None, 125.0, None, _V100),  # SXM2
    GpuPeakFlops("A100", (8, 0), 19.5, 156.0, 312.0, 312.0, _A100, 108),
    GpuPeakFlops("A10", (8, 6), 31.2, 62.5, 125.0, 125.0, _A10),
    GpuPeakFlops("L4", (8, 9), 30.3, 60.0, 121.0, 121.0, _L4),
    GpuPeakFlops("H100 PCIe", (9, 0), 51.0, 378.0, 756.0, 756.0, _H100, 114),
    GpuPeakFlops("H100", (9, 0), 67.0, 495.0, 989.0, 989.0, _H100, 132),  # SXM
    GpuPeakFlops("H200", (9, 0), 67.0, 495.0, 989.0, 989.0, _H200, 132),  # SXM
)


def gpu_peak_flops(gpu_name: str, sm_count: int | None = None) -> GpuPeakFlops | None:
    """The datasheet row for a GPU name as NVML or torch prints it, or ``None``.

    A MIG slice ("NVIDIA A100-SXM4-80GB MIG 1g.10gb") has only a share of the GPU: its
    row is scaled by ``sm_count`` (the slice's SMs, ``multi_processor_count``), and
    without it the peak is unknown (``None``), never the whole GPU's.

    >>> gpu_peak_flops("Tesla T4").fp16
    65.0
    >>> gpu_peak_flops("NVIDIA A100-SXM4-80GB").name, gpu_peak_flops("NVIDIA A10").name
    ('A100', 'A10')
    >>> gpu_peak_flops("NVIDIA H100 PCIe").fp32, gpu_peak_flops("NVIDIA GeForce RTX 3090")
    (51.0, None)
    >>> gpu_peak_flops("NVIDIA H100 NVL") is None  # not the SXM part: no datasheet row here
    True
    >>> gpu_peak_flops("NVIDIA A100-SXM4-80GB MIG 1g.10gb") is None  # a slice: how much?
    True
    """
    words = gpu_name.upper().replace("-", " ").split()
    if "NVL" in words:  # H100 NVL: other clocks and memory, not in the table
        return None
    # longest names first, so "H100 PCIe" wins over "H100" and "A100" never matches "A10"
    for peak in sorted(GPU_PEAK_FLOPS, key=lambda p: -len(p.name)):
        if all(part in words for part in peak.name.upper().split()):
            if "MIG" not in words:
                return peak
            if sm_count is None or peak.sms is None or not 0 < sm_count <= peak.sms:
                return None
            return peak.slice_of(sm_count)
    return None


def datasheet_tflops(
    gpu_name: str, dtype: torch.dtype, tf32: bool = False, sm_count: int | None = None
) -> float | None:
    """Dense datasheet TFLOP/s for matmuls in ``dtype`` (fp32 with ``tf32=True``: TF32
    tensor cores), or ``None`` when the GPU is unknown or lacks that mode.

    >>> datasheet_tflops("Tesla T4", torch.float16), datasheet_tflops("Tesla T4", torch.bfloat16)
    (65.0, None)
    """
    peak = gpu_peak_flops(gpu_name, sm_count)
    if peak is None:
        return None
    if dtype == torch.float16:
        return peak.fp16
    if dtype == torch.bfloat16:
        return peak.bf16
    return peak.tf32 if tf32 else peak.fp32


def mfu(
    flops_per_step: float, step_seconds: float, peak_flops_per_s: float, devices: int = 1
) -> float:
    """Model FLOP utilization: achieved FLOP/s over the peak of all ``devices``."""
    if step_seconds <= 0 or peak_flops_per_s <= 0 or devices < 1:
        raise ValueError("step_seconds, peak_flops_per_s and devices must be positive")
    return flops_per_step / step_seconds / (devices * peak_flops_per_s)


@dataclass(frozen=True)
class PeakFlops:
    """A peak throughput in FLOP/s and where it comes from."""

    flops_per_s: float
    source: str


def tf32_allowed(*, convolutions: bool = False) -> bool:
    """Whether float32 matmuls (``convolutions=True``: cuDNN convolutions) may run on TF32
    tensor cores on Ampere and newer GPUs.

    torch >= 2.9 reads ``torch.backends.cuda.matmul.fp32_precision`` and
    ``torch.backends.cudnn.conv.fp32_precision`` (``"tf32"`` or ``"ieee"``; ``"none"``
    defers to ``torch.backends.cudnn.fp32_precision``, then ``torch.backends.fp32_precision``).
    Older torch reads ``matmul.allow_tf32`` / ``cudnn.allow_tf32``. The two spellings are not
    mixed: torch >= 2.9 raises when the old flag is read after the new one was set.

    >>> tf32_allowed(convolutions=True), tf32_allowed()  # PyTorch's defaults
    (True, False)
    """
    backends = torch.backends
    op = getattr(backends.cudnn, "conv", None) if convolutions else backends.cuda.matmul
    if getattr(op, "fp32_precision", None) is None:  # torch < 2.9
        flags = backends.cudnn if convolutions else backends.cuda.matmul
        return bool(flags.allow_tf32)
    for level in (op, backends.cudnn, backends):  # "none" defers to the level above
        value = getattr(level, "fp32_precision", "none")
        if value != "none":
            return bool(value == "tf32")
    return False


def device_peak_flops(
    device: torch.device | str, dtype: torch.dtype = torch.float32, *, convolutions: bool = False
) -> PeakFlops:
    """The peak to divide by for MFU: the datasheet's dense figure for a known GPU,
    otherwise the FLOP/s of a large matmul measured here (CPU, MPS, GPUs not in the table:
    ``MEASURED_PEAK_N_GPU`` squared on a GPU, large enough that a model's matmuls do not beat it),
    once per process, device and dtype (its source says with how many CPU threads), so
    that every MFU of a run divides by the same figure.

    float32 work runs on TF32 tensor cores only on GPUs that have them (compute capability
    8.0 and newer: the rows with a TF32 column) and only where :func:`tf32_allowed`:
    matmuls when allowed (off by default), convolutions by default (pass
    ``convolutions=True`` for a CNN). The peak is then TF32's; on a T4 or a V100 (no TF32)
    it stays the fp32 column. Its source names the column it divides by.
    """
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        sm_count = None
        if "MIG" in name.upper().split():  # a slice: its own SMs, not the whole GPU's
            sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        row = gpu_peak_flops(name, sm_count)
        if row is not None:
            tf32 = (
                dtype == torch.float32
                and row.tf32 is not None  # Ampere and newer; a T4 or V100 has no TF32
                and (tf32_allowed() or (convolutions and tf32_allowed(convolutions=True)))
            )
            tflops = datasheet_tflops(name, dtype, tf32=tf32, sm_count=sm_count)
            if tflops is not None:
                column = {
                    torch.float16: "fp16 tensor-core",
                    torch.bfloat16: "bf16 tensor-core",
                }.get(dtype, "TF32 tensor-core" if tf32 else "fp32 (no tensor cores)")
                where = f"{name} ({row.name})" if sm_count is not None else name
                return PeakFlops(tflops * 1e12, f"{where}: dense {column} peak, {row.source}")
    key = (str(device), dtype)
    if key not in _MEASURED_PEAKS:  # measured once: a peak that moves is no denominator
        n = MEASURED_PEAK_N_GPU if device.type != "cpu" else MEASURED_PEAK_N_CPU
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        timing = benchmark(lambda: a @ b, device=device, warmup=2, repeats=5)
        what = f"{n}x{n} {str(dtype).removeprefix('torch.')} matmuls"
        count = torch.get_num_threads()
        threads = f", {count} CPU thread{'s' * (count != 1)}" if device.type == "cpu" else ""
        source = f"measured once in this process: best of 5 {what}{threads}"
        _MEASURED_PEAKS[key] = PeakFlops(2 * n**3 / timing.min_s, source)
    return _MEASURED_PEAKS[key]


# the matmul a peak is measured with where no datasheet row applies: on a GPU a 1024^2
# matmul leaves SMs idle, and a model's larger matmuls would beat that "peak" (MFU > 1,
# review G16); 4096^2 (137 GFLOP) fills any current GPU's SMs. On a CPU 1024^2 already
# keeps the cores busy, and a 4096^2 one takes seconds on a busy machine.
MEASURED_PEAK_N_GPU = 4096
MEASURED_PEAK_N_CPU = 1024

# measured peaks, by (device, dtype): a CPU's "peak" re-measured in each cell of a busy
# machine moved by 1.5x between two cells (review 02-N1); the source names the threads
_MEASURED_PEAKS: dict[tuple[str, torch.dtype], PeakFlops] = {}


@dataclass(frozen=True)
class Achieved:
    """FLOP/s a run achieved and its MFU against ``peak``."""

    flops: float
    seconds: float
    flops_per_s: float
    mfu: float
    peak: PeakFlops

    def __str__(self) -> str:
        return (
            f"{self.flops_per_s / 1e9:,.1f} GFLOP/s = {self.mfu:.1%} of "
            f"{self.peak.flops_per_s / 1e12:.3g} TFLOP/s ({self.peak.source})"
        )


def achieved(flops: float, seconds: float, peak: PeakFlops, devices: int = 1) -> Achieved:
    """The FLOP/s of ``flops`` done in ``seconds``, and the MFU against ``peak``."""
    utilization = mfu(flops, seconds, peak.flops_per_s, devices)
    return Achieved(flops, seconds, flops / seconds, utilization, peak)


def matmul_stream(
    device: torch.device | str, n: int, seconds: float, dtype: torch.dtype = torch.float32
) -> tuple[int, float]:
    """Launch ``n x n`` matmuls back to back for about ``seconds``; return ``(count,
    elapsed seconds)`` including a final synchronization. Each matmul is ``2 n**3`` FLOPs.
    """
    sync = synchronizer(torch.device(device))
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    a @ b  # warm-up: library loading and kernel selection are not measured
    sync()
    return launch_for(lambda: a @ b, sync, seconds)


def launch_for(
    launch: Callable[[], object], sync: Callable[[], None], seconds: float
) -> tuple[int, float]:
    """Call ``launch`` in groups for about ``seconds`` of *finished* work; return
    ``(count, elapsed seconds)``. A GPU queues work and returns at once, so each group is
    synchronized before the clock is read; groups double while one takes under 20 ms."""
    count, group = 0, 1
    start = time.perf_counter()
    while True:
        began = time.perf_counter()
        for _ in range(group):
            launch()
        sync()  # read the clock on work done, not on work queued
        count += group
        now = time.perf_counter()
        if now - start >= seconds:
            return count, now - start
        if now - began < 0.02 and group < 4096:
            group *= 2


def step_flops(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    backward: bool = True,
    math_kernel: bool = True,
) -> int:
    """FLOPs of one training step's forward (and backward) of ``model`` on tokens ``x``
    and targets ``y``, counted by ``FlopCounterMode``; attention under the math kernel
    (whose matmuls the counter sees), or the default one. The gradients are cleared after."""
    kernel = sdpa_kernel(SDPBackend.MATH) if math_kernel else _nothing()
    with kernel, FlopCounterMode(display=False) as counter:
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        if backward:
            loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None
