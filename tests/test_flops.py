"""FLOPs beyond single layers (tests/test_models_data.py has linear and conv), peaks, MFU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils.flops import Peak, achieved, count_flops, gpu_peak, matmul_stream, mfu


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
    [("Tesla T4", 65.0, 8.1), ("Tesla V100-SXM2...", 125.0, 15.7),
     ("NVIDIA A100-SXM4-40GB", 312.0, 19.5), ("NVIDIA L4", 121.0, 30.3),
     ("NVIDIA H100 80GB HBM3", 989.0, 67.0), ("NVIDIA H200", 989.0, 67.0)],
)
def test_names_as_nvidia_smi_prints_them_find_the_dense_datasheet_peak(name, fp16, fp32):
    peak = gpu_peak(name)
    assert peak is not None and (peak.fp16, peak.fp32) == (fp16, fp32)


def test_achieved_and_mfu_agree_and_refuse_nonsense():
    peak = Peak(10e12, "test")
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

