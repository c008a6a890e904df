"""Device choice, precision choice and to_device, on CPU with a simulated GPU list."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
import torch

from course_utils import device as dev
from course_utils import nvml
from course_utils.nvml import GpuInfo


def gpu(index, free, cc=(7, 5), name="Tesla T4"):
    return GpuInfo(index, name, f"GPU-{index}", None, 15360, 15360 - free, free, cc)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.setattr(dev, "cuda_gpu_count", lambda: 0)
    monkeypatch.setattr(dev, "mps_available", lambda: False)
    monkeypatch.setattr(dev, "nvml_status", lambda: "NVML is not available (faked)")


def test_cpu_when_nothing_else(no_gpu):
    choice = dev.choose_device()
    assert choice.device == torch.device("cpu")
    assert choice.reason.startswith("no GPU")


def test_mps_before_cpu(no_gpu, monkeypatch):
    monkeypatch.setattr(dev, "mps_available", lambda: True)
    assert dev.pick_device() == torch.device("mps")


def test_gpu_with_most_free_memory_wins(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.setattr(dev, "cuda_gpu_count", lambda: 3)
    monkeypatch.setattr(dev, "visible_gpus", lambda: [gpu(0, 100), gpu(1, 9000), gpu(2, 50)])
    choice = dev.choose_device()
    assert choice.device == torch.device("cuda", 1)
    assert "9000 MiB free" in choice.reason


def test_a_tie_picks_the_first_gpu(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.setattr(dev, "cuda_gpu_count", lambda: 2)
    monkeypatch.setattr(dev, "visible_gpus", lambda: [gpu(0, 500), gpu(1, 500)])
    assert dev.pick_device() == torch.device("cuda", 0)


def test_explicit_choice_and_environment_override(no_gpu, monkeypatch):
    assert dev.pick_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert dev.choose_device().reason == "asked for the CPU"


@pytest.mark.parametrize(
    ("wanted", "message"),
    [("cuda:3", "PyTorch sees 0 CUDA GPU"), ("mps", "no usable Apple MPS"), ("tpu", "unknown")],
)
def test_unavailable_or_unknown_devices_are_clear_errors(no_gpu, wanted, message):
    with pytest.raises(ValueError, match=message):
        dev.pick_device(wanted)


def test_asking_for_a_gpu_index_that_exists(monkeypatch):
    monkeypatch.setattr(dev, "cuda_gpu_count", lambda: 2)
    assert dev.pick_device("cuda:1") == torch.device("cuda", 1)
    assert dev.pick_device("cuda") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"sees 2 CUDA GPU\(s\): use cuda:0 to cuda:1$"):
        dev.pick_device("cuda:2")


def test_cuda_gpu_count_is_zero_without_a_driver_and_leaves_cuda_untouched(monkeypatch):
    # Fake "no NVIDIA driver" (the library is missing, no device files), on any machine.
    monkeypatch.setattr(nvml, "_pynvml", None)
    monkeypatch.setattr(dev, "_driver_present", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(dev, "_count_gpus_in_subprocess", lambda: pytest.fail("no driver"))
    assert dev.cuda_gpu_count() == 0
    assert dev.choose_device("cpu").device == torch.device("cpu")


@pytest.fixture
def fake_cuda(monkeypatch):
    """A CUDA build of torch on a machine whose driver (faked) shows the GPUs given."""

    def setup(gpus, *, built="13.0", driver="13.0", arch="sm_75 sm_80 sm_90 compute_90"):
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
        monkeypatch.setattr(torch.version, "cuda", built)
        monkeypatch.setattr(dev, "nvml_status", lambda: "ok")
        monkeypatch.setattr(dev, "visible_gpus", lambda: gpus)
        monkeypatch.setattr(dev, "cuda_driver_version", lambda: driver)
        monkeypatch.setattr(dev, "_arch_flags", lambda: arch.split())
        monkeypatch.setattr(dev, "_counted", None)  # forget the last count

    return setup


def test_gpus_this_torch_can_run_on_are_counted(fake_cuda):
    fake_cuda([gpu(0, 1, cc=(7, 5)), gpu(1, 1, cc=(8, 6))])  # sm_86 runs sm_80 code
    assert dev.cuda_gpu_count() == 2 and dev.gpu_problems() == []


def test_a_p100_is_not_counted_by_a_build_without_sm_60(fake_cuda):
    fake_cuda([gpu(0, 1, cc=(6, 0), name="Tesla P100-PCIE-16GB")])
    assert dev.cuda_gpu_count() == 0
    (problem,) = dev.gpu_problems()
    assert "Tesla P100-PCIE-16GB, compute capability 6.0" in problem and "sm_60" in problem
    assert "compute capability 6.0" in dev.choose_device().reason


def test_ptx_runs_on_newer_gpus_only(fake_cuda):
    fake_cuda([gpu(0, 1, cc=(10, 0))], arch="sm_80 sm_90 compute_90")
    assert dev.cuda_gpu_count() == 1
    fake_cuda([gpu(0, 1, cc=(7, 5))], arch="sm_80 sm_90 compute_90")
    assert dev.cuda_gpu_count() == 0


def test_a_driver_too_old_for_the_build_counts_no_gpu(fake_cuda):
    # The locked torch is a CUDA 13 build; Colab's driver is built around CUDA 12.8.
    fake_cuda([gpu(0, 1, cc=(7, 5))], built="13.0", driver="12.8")
    assert dev.cuda_gpu_count() == 0
    assert "supports CUDA up to 12.8" in dev.gpu_problems()[0]
    fake_cuda([gpu(0, 1, cc=(7, 5))], built="12.8", driver="12.4")  # minor-version compatible
    assert dev.cuda_gpu_count() == 1


def test_the_doctor_says_why_a_gpu_is_not_used(fake_cuda, monkeypatch):
    from course_utils import env

    fake_cuda([gpu(0, 1, cc=(6, 0), name="Tesla P100-PCIE-16GB")])
    monkeypatch.setattr(nvml, "visible_gpus", lambda: [gpu(0, 1, cc=(6, 0))])
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    report = env.doctor()
    assert report["gpu_count"] == 0 and report["device"] == "cpu"
    assert any("sm_60" in item for item in report["advice"]) and report["gpu_problems"]
    assert "or P100" not in env.gpu_runtime_advice("kaggle")


@pytest.mark.slow
def test_arch_flags_are_read_without_initializing_cuda():
    flags = dev._arch_flags()
    assert all(flag.startswith(("sm_", "compute_")) for flag in flags)
    assert not torch.cuda.is_initialized() or torch.cuda.device_count() > 0


@pytest.mark.parametrize(
    ("capability", "name", "scaler"),
    [
        ((7, 5), "fp16", True),  # T4
        ((7, 0), "fp16", True),  # V100
        ((8, 0), "bf16", False),  # A100
        ((8, 9), "bf16", False),  # L4
        ((9, 0), "bf16", False),  # H100
        ((6, 1), "fp32", False),  # GTX 1080
    ],
)
def test_precision_follows_compute_capability(capability, name, scaler):
    precision = dev.pick_precision("cuda", capability=capability)
    assert (precision.name, precision.grad_scaler) == (name, scaler)
    assert dev.pick_precision("cuda", name).name == name  # a requested name is kept
    assert precision.autocast == (name != "fp32")
    assert f"{capability[0]}.{capability[1]}" in precision.reason


def test_precision_reads_the_gpu_capability_through_nvml(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(nvml, "list_gpus", lambda: [gpu(0, 1, cc=(7, 5)), gpu(1, 1, cc=(9, 0))])
    assert dev.pick_precision("cuda:0").name == "fp16"
    assert dev.pick_precision("cuda:1").name == "bf16"


@pytest.mark.parametrize("device", ["cpu", "mps", "meta"])
def test_cpu_like_devices_use_fp32(device):
    precision = dev.pick_precision(device)
    assert precision.dtype == torch.float32 and not precision.autocast


def test_precision_support_table():
    t4 = dev.precision_support((7, 5))
    assert (t4.fp16_tensor_cores, t4.bf16, t4.tf32) == (True, "emulated", False)
    a100 = dev.precision_support((8, 0))
    assert (a100.fp16_tensor_cores, a100.bf16, a100.tf32) == (True, "native", True)
    assert dev.precision_support((6, 0)).fp16_tensor_cores is False


Pair = namedtuple("Pair", "image label")


def test_to_device_moves_every_tensor_of_a_nested_batch():
    batch = {
        "images": torch.ones(2, 3),
        "targets": [torch.zeros(2), (torch.arange(2), "id-7")],
        "pair": Pair(torch.ones(1), torch.tensor([3])),
        "ordered": OrderedDict(a=torch.ones(1)),
        "meta": None,
    }
    moved = dev.to_device(batch, "meta")  # the meta device exists everywhere
    assert moved["images"].device.type == "meta"
    assert moved["targets"][0].device.type == "meta"
    assert moved["targets"][1][0].device.type == "meta"
    assert moved["targets"][1][1] == "id-7"
    assert isinstance(moved["targets"][1], tuple)
    assert isinstance(moved["pair"], Pair) and moved["pair"].label.device.type == "meta"
    assert isinstance(moved["ordered"], OrderedDict)
    assert moved["meta"] is None
    assert batch["images"].device.type == "cpu"  # the input is left as it was


def test_to_device_is_non_blocking_exactly_for_pinned_memory_to_cuda(monkeypatch):
    calls = []

    def fake_to(self, device, non_blocking=False):
        calls.append((str(device), non_blocking))
        return self

    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
    dev.to_device([torch.ones(1)], "cuda")
    dev.to_device([torch.ones(1)], "cpu")
    dev.to_device([torch.ones(1)], "cuda", non_blocking=False)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: False)
    dev.to_device([torch.ones(1)], "cuda")
    assert calls == [("cuda", True), ("cpu", False), ("cuda", False), ("cuda", False)]


@pytest.mark.gpu
def test_to_device_on_a_real_gpu():
    device = dev.pick_device()
    batch = {"x": torch.ones(4, 4).pin_memory(), "y": [torch.zeros(3)]}
    moved = dev.to_device(batch, device)
    torch.cuda.synchronize()
    assert moved["x"].is_cuda and moved["y"][0].is_cuda
    assert moved["x"].sum().item() == 16


@pytest.mark.gpu
def test_precision_on_a_real_gpu_matches_torch():
    device = dev.pick_device()
    capability = torch.cuda.get_device_capability(device)
    expected = "bf16" if capability >= (8, 0) else "fp16" if capability >= (7, 0) else "fp32"
    assert dev.pick_precision(device).name == expected


def test_tensors_in_finds_every_tensor_and_confirms_a_move():
    batch = {"a": torch.ones(1), "b": [Pair(torch.ones(2), "x"), (3, torch.zeros(3))], "s": "t"}
    assert [t.numel() for t in dev.tensors_in(batch)] == [1, 2, 3]
    moved = dev.to_device(batch, "meta")
    assert all(t.device.type == "meta" for t in dev.tensors_in(moved))
    assert list(dev.tensors_in("no tensors")) == []
