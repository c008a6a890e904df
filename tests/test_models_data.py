"""Models, synthetic data, OOM detection, FLOP counting and the classroom checks."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from course_utils.checks.core import check, check_close
from course_utils.data import SyntheticImages
from course_utils.feedback import CheckFailed
from course_utils.flops import count_flops
from course_utils.models import MODEL_NAMES, blocks_of, build_model, count_parameters
from course_utils.oom import is_out_of_memory


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_classifies_a_cifar_batch(name):
    model = build_model(name, num_classes=7)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    assert count_parameters(model) == sum(p.numel() for p in model.parameters()) > 0
    assert len(blocks_of(model)) >= 2


def test_known_parameter_counts():
    # torchvision's ResNet-18 with 1000 classes has 11,689,512 parameters (its docs).
    assert count_parameters(build_model("resnet18", num_classes=1000)) == 11_689_512
    assert count_parameters(nn.Linear(3, 2)) == 8
    with pytest.raises(ValueError, match="unknown model"):
        build_model("vgg99")


def test_synthetic_images_are_deterministic_picklable_and_bounded():
    data = SyntheticImages(size=16, seed=3)
    clone = pickle.loads(pickle.dumps(data))
    assert torch.equal(data[5][0], clone[5][0]) and data[5][1] == clone[5][1]
    assert not torch.equal(data[5][0], SyntheticImages(size=16, seed=4)[5][0])
    assert {data.label(i) for i in range(16)} == set(range(10))
    with pytest.raises(IndexError):
        data[16]


def test_out_of_memory_recognition():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("x"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"
        )
    )
    assert not is_out_of_memory(ValueError("out of memory"))
    assert not is_out_of_memory(RuntimeError("expected scalar type Float"))


def test_flops_of_linear_and_conv_match_the_hand_formula():
    batch, n_in, n_out = 8, 64, 32
    assert count_flops(nn.Linear(n_in, n_out), torch.randn(batch, n_in)) == 2 * batch * n_in * n_out
    conv = nn.Conv2d(3, 16, kernel_size=3, padding=1, bias=False)
    x = torch.randn(2, 3, 32, 32)
    forward = 2 * 2 * 32 * 32 * 16 * 3 * 3 * 3  # 2 * N * H_out * W_out * C_out * C_in * k * k
    assert count_flops(conv, x) == forward
    # training: forward + grad of weight (+ grad of input when it requires grad)
    assert count_flops(conv, x, training=True) == 2 * forward
    assert count_flops(conv, x.requires_grad_(), training=True) == 3 * forward


def test_classroom_checks_give_the_feedback():
    check(True, "never shown")
    with pytest.raises(CheckFailed, match="labels on the CPU"):
        check(False, "your to_device left the labels on the CPU")
    check_close(torch.ones(3), torch.ones(3) + 1e-9, "the gradient")
    with pytest.raises(CheckFailed, match="shape"):
        check_close(torch.ones(3), torch.ones(4), "the gradient")
    with pytest.raises(CheckFailed, match="should be a number"):
        check_close("fast", 2.0, "the speed-up")


def test_saved_activation_bytes_grow_linearly_with_the_batch_and_drop_with_checkpointing():
    from course_utils.footprint import peak_memory
    from course_utils.models import checkpoint_blocks

    model = build_model("small_cnn", width=8)

    def step(n):
        return lambda: model(torch.randn(n, 3, 32, 32)).sum().backward()

    small, large = peak_memory(step(4), "cpu"), peak_memory(step(8), "cpu")
    assert "CPU" in small.method and small.peak_bytes > 0
    # parameters are saved too (a fixed part), so the ratio is a little under 2
    assert 1.8 < large.peak_bytes / small.peak_bytes <= 2.0
    checkpoint_blocks(model)
    assert peak_memory(step(8), "cpu").peak_bytes < large.peak_bytes / 3


def test_peaks_mfu_and_a_measured_cpu_peak():
    from course_utils.flops import datasheet_tflops, device_peak_flops, gpu_peak_flops, mfu

    assert gpu_peak_flops("NVIDIA H200").fp16 == 989.0
    assert gpu_peak_flops("Tesla V100-SXM2-16GB").fp32 == 15.7
    assert datasheet_tflops("NVIDIA A100-SXM4-40GB", torch.float32, tf32=True) == 156.0
    assert mfu(2e12, 1.0, 1e12, devices=4) == 0.5
    with pytest.raises(ValueError):
        mfu(1.0, 0.0, 1.0)
    peak = device_peak_flops("cpu")
    assert peak.source.startswith("measured") and 1e8 < peak.flops_per_s < 1e14


def test_model_costs_match_the_hand_formula_including_attention():
    from course_utils.models import model_costs

    mlp = model_costs("mlp", batch_size=3, hidden=16, depth=1)
    assert mlp.forward_flops == 3 * 2 * (3 * 32 * 32 * 16 + 16 * 10)
    assert mlp.training_flops == 3 * mlp.forward_flops
    assert mlp.training_flops_per_sample == mlp.training_flops / 3
    # tiny_transformer: 64 patch tokens of dim 64; per block: qkv projection, scores and
    # weighted sum (L x L x E each), output projection, two-layer MLP of width 128
    tokens, dim = 64, 64
    block = 2 * tokens * dim * (3 * dim + 2 * tokens + dim + 2 * 2 * dim)
    expected = 2 * tokens * dim * 48 + 4 * block + 2 * dim * 10
    assert model_costs("tiny_transformer").forward_flops == expected
    # models whose first layer depends on the image size are built for it
    assert model_costs("mlp", image_size=16, hidden=16, depth=1).forward_flops == 2 * (
        3 * 16 * 16 * 16 + 16 * 10
    )
    assert model_costs("tiny_transformer", image_size=16).forward_flops < expected


def test_tiny_transformer_blocks_and_parameters():
    model = build_model("tiny_transformer", depth=2, dim=32, heads=2)
    assert [name for name, _ in blocks_of(model)] == ["blocks.0", "blocks.1"]
    assert count_parameters(model) < count_parameters(build_model("small_cnn"))
    with pytest.raises(ValueError, match="multiple of patch"):
        build_model("tiny_transformer", image_size=30)
