"""FLOPs beyond single layers (tests/test_models_data.py has linear and conv), peaks, MFU."""

from __future__ import annotations

from types import SimpleNamespace
from unittest.mock import patch

import pytest
import torch
from torch import nn

from course_utils.flops import (
    GPU_PEAK_FLOPS,
    PeakFlops,
    achieved,
    count_flops,
    device_peak_flops,
    gpu_peak_flops,
    matmul_stream,
    mfu,
    tf32_allowed,
)


def test_a_training_step_costs_about_three_forward_passes():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    inputs = torch.randn(32, 64)
    forward = count_flops(model, inputs)
    assert forward == 2 * 32 * (64 * 128 + 128 * 10)
    step = count_flops(model, inputs, training=True)
    # backward: weight gradients of both layers, input gradient of the second only
    assert step == forward + 2 * 32 * (64 * 128 + 128 * 10) + 2 * 32 * 128 * 10


@pytest.mark.parametrize(
    ("name", "fp16", "fp32"),
    # the names exactly as the shared nvidia-smi corpus prints them
    [
        ("Tesla T4", 65.0, 8.1),
        ("Tesla V100-SXM2...", 125.0, 15.7),
        ("NVIDIA A100-SXM4-40GB", 312.0, 19.5),
        ("NVIDIA L4", 121.0, 30.3),
        ("NVIDIA H100 80GB HBM3", 989.0, 67.0),
        ("NVIDIA H200", 989.0, 67.0),
    ],
)
def test_names_as_nvidia_smi_prints_them_find_the_dense_datasheet_peak(name, fp16, fp32):
    peak = gpu_peak_flops(name)
    assert peak is not None and (peak.fp16, peak.fp32) == (fp16, fp32)


def test_achieved_and_mfu_agree_and_refuse_nonsense():
    peak = PeakFlops(10e12, "test")
    result = achieved(4e12, 2.0, peak)
    assert result.flops_per_s == 2e12 and result.mfu == pytest.approx(0.2)
    assert result.mfu == mfu(4e12, 2.0, 10e12)
    assert "20.0% of 10 TFLOP/s (test)" in str(result)
    assert achieved(4e12, 2.0, peak, devices=2).mfu == pytest.approx(0.1)
    with pytest.raises(ValueError):
        achieved(1.0, 0.0, peak)


def test_matmul_stream_runs_for_the_asked_time():
    count, elapsed = matmul_stream("cpu", 16, 0.05)
    assert count >= 16 and 0.05 <= elapsed < 2.0


def test_every_datasheet_row_cites_its_primary_source_inside_the_package():
    for peak in GPU_PEAK_FLOPS:
        assert "https://" in peak.source and "../" not in peak.source, peak
        assert peak.name.split()[0] in peak.source or (peak.name == "L4" and "Ada" in peak.source)


@pytest.mark.parametrize(
    ("name", "dtype", "tf32", "tflops", "column"),
    [
        ("Tesla T4", torch.float16, False, 65.0, "fp16 tensor-core"),
        ("NVIDIA A100-SXM4-80GB", torch.float32, False, 19.5, "fp32 (no tensor cores)"),
        ("NVIDIA A100-SXM4-80GB", torch.float32, True, 156.0, "TF32 tensor-core"),
        ("NVIDIA H200", torch.bfloat16, False, 989.0, "bf16 tensor-core"),
    ],
)
def test_a_gpu_peak_names_the_column_it_divides_by_and_its_datasheet(
    name, dtype, tf32, tflops, column
):
    before = torch.backends.cuda.matmul.allow_tf32  # a property of torch's cuBLAS module
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        with patch("torch.cuda.get_device_name", return_value=name):
            peak = device_peak_flops("cuda", dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert peak.flops_per_s == tflops * 1e12
    assert f"dense {column} peak" in peak.source and gpu_peak_flops(name).source in peak.source


@pytest.fixture
def fp32_precision():
    """Set torch >= 2.9's TF32 switches (matmul, cuDNN conv); restored afterwards."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    saved = (matmul.fp32_precision, conv.fp32_precision)

    def set_precision(for_matmul: str, for_conv: str) -> None:
        matmul.fp32_precision, conv.fp32_precision = for_matmul, for_conv

    yield set_precision
    set_precision(*saved)


def _fake_gpu(monkeypatch, name: str, capability: tuple[int, int]) -> None:
    """A GPU as torch reports it (the review's emulation); a measured peak would fail."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)

    def no_benchmark(*args, **kwargs):
        raise AssertionError("a GPU in the datasheet table must not time a matmul")

    monkeypatch.setattr("course_utils.flops.benchmark", no_benchmark)


@pytest.mark.parametrize(
    ("name", "capability", "fp32_tflops"),
    [("Tesla T4", (7, 5), 8.1), ("Tesla V100-SXM2-16GB", (7, 0), 15.7)],
)
def test_a_gpu_without_tf32_divides_a_cnn_by_its_fp32_column(
    monkeypatch, fp32_precision, name, capability, fp32_tflops
):
    # cuDNN's conv precision is "tf32" by default on every GPU, also where there is no TF32.
    fp32_precision("none", "tf32")
    _fake_gpu(monkeypatch, name, capability)
    peak = device_peak_flops("cuda", torch.float32, convolutions=True)
    assert peak.flops_per_s == fp32_tflops * 1e12
    assert "fp32 (no tensor cores)" in peak.source and "measured" not in peak.source


@pytest.mark.parametrize(
    ("name", "capability", "fp32_tflops", "tf32_tflops"),
    [
        ("NVIDIA A100-SXM4-80GB", (8, 0), 19.5, 156.0),
        ("NVIDIA L4", (8, 9), 30.3, 60.0),
        ("NVIDIA H200", (9, 0), 67.0, 495.0),
    ],
)
def test_ampere_and_later_follow_the_fp32_precision_settings(
    monkeypatch, fp32_precision, name, capability, fp32_tflops, tf32_tflops
):
    _fake_gpu(monkeypatch, name, capability)
    fp32_precision("none", "tf32")  # PyTorch's defaults: TF32 convolutions, IEEE matmuls
    conv = device_peak_flops("cuda", torch.float32, convolutions=True)
    assert conv.flops_per_s == tf32_tflops * 1e12 and "TF32 tensor-core" in conv.source
    assert device_peak_flops("cuda", torch.float32).flops_per_s == fp32_tflops * 1e12
    fp32_precision("none", "ieee")  # reading the old flag now would raise: never mixed
    assert device_peak_flops("cuda", torch.float32, convolutions=True).flops_per_s == (
        fp32_tflops * 1e12
    )
    fp32_precision("tf32", "ieee")
    assert device_peak_flops("cuda", torch.float32).flops_per_s == tf32_tflops * 1e12


def test_tf32_allowed_reads_the_new_settings_and_their_fallback(fp32_precision):
    fp32_precision("none", "ieee")
    assert tf32_allowed(convolutions=True) is False and tf32_allowed() is False
    fp32_precision("tf32", "none")  # "none": the cuDNN level, then the global one decide
    before = torch.backends.fp32_precision
    torch.backends.fp32_precision = "tf32"
    try:
        assert tf32_allowed() is True and tf32_allowed(convolutions=True) is True
    finally:
        torch.backends.fp32_precision = before


def test_tf32_allowed_reads_the_old_flags_on_torch_before_2_9(monkeypatch):
    class OldFlags:  # torch < 2.9: allow_tf32 only, no fp32_precision, no cudnn.conv
        allow_tf32 = True

    monkeypatch.setattr(torch.backends, "cudnn", OldFlags())
    assert tf32_allowed(convolutions=True) is True
    OldFlags.allow_tf32 = False
    assert tf32_allowed(convolutions=True) is False


@pytest.mark.parametrize(
    ("name", "sms", "full_sms", "fp32_tflops"),
    [
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 14, 108, 19.5),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, 132, 67.0),
        ("NVIDIA H200 MIG 3g.71gb", 60, 132, 67.0),
    ],
)
def test_a_mig_slice_gets_its_share_of_the_peak_not_the_whole_gpus(
    monkeypatch, fp32_precision, name, sms, full_sms, fp32_tflops
):
    # gpu-paths N5: a slice's MFU divided by the whole GPU's peak is ~7x too small
    fp32_precision("ieee", "ieee")
    _fake_gpu(monkeypatch, name, (8, 0))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device=None: SimpleNamespace(multi_processor_count=sms),
    )
    peak = device_peak_flops("cuda", torch.float32)
    assert peak.flops_per_s == pytest.approx(fp32_tflops * 1e12 * sms / full_sms)
    assert f"{sms} of {full_sms} SMs" in peak.source
    assert gpu_peak_flops(name) is None  # the name alone does not say the share
    assert gpu_peak_flops(name.split(" MIG")[0]).fp32 == fp32_tflops  # the whole GPU


def test_a_mig_slice_with_an_impossible_share_has_no_peak():
    assert gpu_peak_flops("NVIDIA A100 MIG 1g.5gb", 500) is None  # more SMs than an A100
    assert gpu_peak_flops("NVIDIA A100 MIG 1g.5gb", 14).name == "A100 MIG slice (14 of 108 SMs)"


def test_a_gpu_without_a_datasheet_row_is_not_given_a_peak_its_model_can_beat(monkeypatch):
    # review G16: on an RTX 4090, L40S or B200 (no row) the peak was one 1024^2 matmul, which
    # leaves most SMs idle; a model's larger matmuls then ran "above the peak" (MFU > 1).
    # The fake GPU runs as real ones do: the larger the matmul, the nearer the true peak.
    true_peak = 80e12

    def efficiency(n: int) -> float:  # a 1024^2 matmul fills a third of a large GPU
        return min(0.9, 0.3 * n / 1024)

    sizes: list[int] = []

    def randn(n, m, **kwargs):
        sizes.append(n)
        return SimpleNamespace(n=n)

    def timed(fn, **kwargs):
        n = sizes[-1]
        return SimpleNamespace(min_s=2 * n**3 / (true_peak * efficiency(n)))

    _fake_gpu(monkeypatch, "NVIDIA GeForce RTX 4090", (8, 9))
    monkeypatch.setattr("course_utils.flops.benchmark", timed)
    monkeypatch.setattr(torch, "randn", randn)
    monkeypatch.setattr("course_utils.flops._MEASURED_PEAKS", {})
    peak = device_peak_flops("cuda", torch.float16)
    model_step = 0.7 * true_peak  # a large model's training step: 70 % of the true peak
    assert mfu(model_step, 1.0, peak.flops_per_s) <= 1.0, peak
    assert f"{sizes[-1]}x{sizes[-1]}" in peak.source and "measured" in peak.source
