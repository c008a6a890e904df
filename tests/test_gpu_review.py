"""The GPU review's findings (1, 5, 6, 7, 11, 12, 13, 14), each pinned on a CPU by faking
the hardware the way the real one behaves: NVML as the driver answers it (reference-
counted ``nvmlInit``, MIG devices with their own handles and memory), torch's fork
poisoning, ``is_pinned`` asking the driver, cuDNN's disguised out-of-memory errors.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from test_footprint import ESTIMATE_FACTOR, GPU_BREAKDOWN_BAND, GPU_BREAKDOWN_BATCH

from course_utils import batch, device, nvml, workload
from course_utils.footprint import activation_estimate
from course_utils.models import build_model
from course_utils.oom import is_out_of_memory
from course_utils.tooling.cli import main
from course_utils.units import MIB

ROOT = Path(__file__).resolve().parent.parent


class NVMLError(Exception):
    pass


class Driver:
    """A fake ``pynvml`` over ``gpus`` (dicts: name, uuid, cc, memory_mib (total, used),
    and for MIG ``migs``: a list of dicts name, uuid, memory_mib). Like the real library,
    ``nvmlInit`` is reference-counted: only the first of nested calls starts a session
    (the slow part on a server without persistence mode), counted in ``sessions``."""

    def __init__(self, gpus, cuda_version=13000):
        self.gpus, self.cuda_version = gpus, cuda_version
        self.depth = self.sessions = 0

    def nvmlInit(self):
        self.sessions += self.depth == 0
        self.depth += 1

    def nvmlShutdown(self):
        if self.depth == 0:
            raise NVMLError("Uninitialized")
        self.depth -= 1

    def _check(self):
        if self.depth == 0:
            raise NVMLError("Uninitialized")

    def _entry(self, handle):
        self._check()
        kind, index, slot = handle
        gpu = self.gpus[index]
        return gpu if kind == "gpu" else gpu["migs"][slot]

    def nvmlSystemGetDriverVersion(self):
        self._check()
        return "580.65.06" if self.cuda_version >= 13000 else "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        self._check()
        return self.cuda_version

    def nvmlDeviceGetCount(self):
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._check()
        if not 0 <= index < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return ("gpu", index, None)

    def nvmlDeviceGetName(self, handle):
        return self._entry(handle)["name"]

    def nvmlDeviceGetUUID(self, handle):
        return self._entry(handle)["uuid"]

    def nvmlDeviceGetPciInfo(self, handle):
        return types.SimpleNamespace(busId=f"00000000:{handle[1] + 7:02X}:00.0".encode())

    def nvmlDeviceGetMemoryInfo(self, handle):
        total, used = self._entry(handle)["memory_mib"]
        return types.SimpleNamespace(total=total * MIB, used=used * MIB, free=(total - used) * MIB)

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        if handle[0] != "gpu":
            raise NVMLError("Not Supported")
        return self._entry(handle)["cc"]

    def nvmlDeviceGetMigMode(self, handle):
        if "migs" not in self._entry(handle):
            raise NVMLError("Not Supported")  # a T4: no MIG
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        self._check()
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, slot):
        if slot >= len(self._entry(handle).get("migs", [])):
            raise NVMLError("Not Found")
        return ("mig", handle[1], slot)


T4 = {"name": "Tesla T4", "uuid": "GPU-t4t4-0000", "cc": (7, 5), "memory_mib": (15360, 0)}


def a100_with_migs(number, slices):
    return {
        "name": "NVIDIA A100-SXM4-80GB",
        "uuid": f"GPU-a100-{number}",
        "cc": (8, 0),
        "memory_mib": (81920, 2000),
        "migs": [
            {
                "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
                "uuid": f"MIG-{number}{slot}aa",
                "memory_mib": (9856, 13 + slot),
            }
            for slot in range(slices)
        ],
    }


@pytest.fixture
def driver(monkeypatch):
    """Install a fake driver: ``driver(gpus, cuda_version=...)``; a CUDA 13 build of torch
    whose kernels cover sm_75 to sm_90, CUDA not started, every GPU visible."""

    def install(gpus, cuda_version=13000, arch="sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"):
        fake = Driver(gpus, cuda_version)
        monkeypatch.setattr(nvml, "_pynvml", fake)
        monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
        monkeypatch.setattr(torch.version, "cuda", "13.0")
        monkeypatch.setattr(device, "_arch_flags", lambda: arch.split())
        monkeypatch.setattr(device, "_counted", None, raising=False)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.delenv("COURSE_DEVICE", raising=False)
        monkeypatch.delenv("COURSE_WORKLOAD", raising=False)
        return fake

    return install


# --- 1. no fork poisoning ------------------------------------------------------------------

FORK_CHECK = """
import os, sys
sys.path.insert(0, {tests!r})
import torch
from test_gpu_review import Driver, T4
from course_utils import device, env, nvml, workload
nvml._pynvml = Driver([T4])
os.environ.pop("COURSE_WORKLOAD", None)
env.doctor()
counted = device.cuda_gpu_count()
picked = workload.pick(small=1, cpu=2, gpu=3)
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.write(write, str(torch._C._cuda_isInBadFork()).encode())
    os._exit(0)
os.waitpid(child, 0)
print(counted, picked, os.read(read, 16).decode())
"""


@pytest.mark.slow
def test_a_process_forked_after_the_course_helpers_can_still_use_cuda():
    """Finding 1: ``torch._C._cuda_getArchFlags()`` poisons fork; Lightning's
    ddp_notebook forks after nb06's ``cuda_gpu_count()``. In a fresh process (pytest's
    own may be poisoned by other tests), with a faked T4 and a CUDA 13 driver."""
    code = FORK_CHECK.format(tests=str(ROOT / "tests"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    counted, picked, bad_fork = done.stdout.split()
    assert (counted, picked) == ("1", "3"), "the faked T4 was not counted: the check is void"
    assert bad_fork == "False", "a child forked after doctor(), cuda_gpu_count(), pick(): no CUDA"


@pytest.mark.slow
def test_the_arch_flags_of_this_torch_are_read_in_a_child_process(monkeypatch):
    seen = []
    real_run = subprocess.run
    monkeypatch.setattr(
        device.subprocess, "run", lambda argv, **kw: seen.append(argv) or real_run(argv, **kw)
    )
    device._arch_flags.cache_clear()
    try:
        flags = device._arch_flags()
        assert device._arch_flags() is flags  # read once per process
    finally:
        device._arch_flags.cache_clear()
    assert len(seen) == 1 and seen[0][0] == sys.executable
    assert all(flag.startswith(("sm_", "compute_")) for flag in flags)


# --- 5. make gpu-lane fails loudly ----------------------------------------------------------


def gpu_lane_first_command() -> list[str]:
    """The first command of the Makefile's gpu-lane recipe, with $(PY) as this Python."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^gpu-lane:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert recipe, "no gpu-lane target in the Makefile"
    first = recipe.group(1).splitlines()[0].strip().lstrip("@")
    return first.replace("$(PY)", sys.executable).split()


@pytest.mark.slow
def test_the_gpu_lane_stops_at_once_with_one_line_when_no_gpu_is_visible():
    command = gpu_lane_first_command()
    assert command[1:] == ["-m", "course_utils", "doctor", "--require-gpu"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "error: the GPU lane needs a GPU this torch can use; no GPU: CUDA_VISIBLE_DEVICES "
        "hides every GPU\n"
    )


@pytest.mark.parametrize(
    ("gpus", "cuda_version", "reason"),
    [
        ([T4], 12080, "built for CUDA 13.0, but the NVIDIA driver supports CUDA up to 12.8"),
        (
            [{**T4, "name": "Tesla P100-PCIE-16GB", "cc": (6, 0)}],
            13000,
            "compute capability 6.0) is not supported by this torch",
        ),
        ([], 13000, "CUDA_VISIBLE_DEVICES leaves no GPU visible"),
    ],
    ids=["driver-too-old", "architecture-not-in-the-wheel", "none-visible"],
)
def test_require_gpu_names_the_reason_in_one_line(driver, capsys, gpus, cuda_version, reason):
    driver(gpus, cuda_version)
    assert main(["doctor", "--require-gpu"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and reason in err, err


def test_require_gpu_prints_the_report_when_a_gpu_is_usable(driver, capsys):
    driver([T4])
    assert main(["doctor", "--require-gpu"]) == 0
    assert "CUDA available : True (1 GPU(s))" in capsys.readouterr().out


def test_the_docs_say_which_torch_to_use_on_a_driver_older_than_580():
    text = (ROOT / "docs" / "running-locally.md").read_text()
    section = text[text.index("## The GPU lane") :]
    assert "580" in section and "https://download.pytorch.org/whl/cu128" in section


# --- the doctor's warning for GPUs older than Turing (teaching review 01-2) -----------------


def test_the_doctor_sends_a_gpu_older_than_turing_to_the_cu126_build(driver):
    from course_utils import env

    driver([{**T4, "name": "Tesla V100-SXM2-16GB", "cc": (7, 0)}])
    report = env.doctor()
    assert report["gpu_count"] == 0
    (advice,) = [item for item in report["advice"] if "V100" in item]
    assert "compute capability >= 7.5" in advice and "whl/cu126" in advice


# --- 6, 7. MIG ---------------------------------------------------------------------------------


def test_a_mig_slice_is_described_by_its_own_memory_and_name(driver, monkeypatch):
    driver([a100_with_migs(0, 2)], arch="sm_80")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-01aa")
    (gpu,) = nvml.visible_gpus()
    assert (gpu.name, gpu.uuid, gpu.index) == ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "MIG-01aa", 0)
    assert (gpu.memory_total_mib, gpu.memory_free_mib) == (9856, 9856 - 14)
    assert nvml.gpu_for_cuda_index(0).memory_total_mib == 9856


def test_cuda_enumerates_one_mig_device_per_process(driver):
    driver([a100_with_migs(0, 2), a100_with_migs(1, 1), a100_with_migs(2, 3)], arch="sm_80")
    assert device.cuda_gpu_count() == 1
    (gpu,) = nvml.visible_gpus()
    assert gpu.uuid == "MIG-00aa" and gpu.memory_total_mib == 9856


def test_mig_devices_beside_a_whole_gpu(driver, monkeypatch):
    driver([a100_with_migs(0, 2), {**T4, "uuid": "GPU-t4-1"}], arch="sm_75 sm_80")
    assert [gpu.uuid for gpu in nvml.visible_gpus()] == ["MIG-00aa", "GPU-t4-1"]
    monkeypatch.setattr(device, "_counted", None, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-00aa,MIG-01aa")
    assert device.cuda_gpu_count() == 1


# --- 12. CPU work creates no CUDA context ----------------------------------------------------


def test_moving_a_batch_to_the_cpu_never_asks_the_cuda_driver(monkeypatch):
    """On a CUDA machine ``is_pinned()`` calls cudaPointerGetAttributes, which creates a
    context on GPU 0; faked here as a flag, set the way the driver would set it."""
    contexts = []
    real = torch.Tensor.is_pinned

    def is_pinned(self, *args, **kwargs):
        contexts.append("GPU 0")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "is_pinned", is_pinned)
    moved = device.to_device({"x": torch.ones(2), "y": [torch.zeros(1)]}, "cpu")
    assert torch.equal(moved["x"], torch.ones(2)) and contexts == []
    calls = []
    monkeypatch.setattr(
        torch.Tensor, "to", lambda self, dev, non_blocking=False: calls.append(non_blocking) or self
    )
    device.to_device(torch.ones(2), "cuda")
    assert contexts == ["GPU 0"] and calls == [False]  # to a GPU it asks, as before


# --- 13. cuDNN's and cuBLAS's disguised out-of-memory errors ---------------------------------

DISGUISED = [
    "GET was unable to find an engine to execute this computation",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
]


@pytest.mark.parametrize("message", DISGUISED)
def test_disguised_out_of_memory_errors_are_out_of_memory(message):
    assert is_out_of_memory(RuntimeError(message))


def test_other_errors_are_still_errors():
    for message in ("mat1 and mat2 shapes cannot be multiplied", "CUDNN_STATUS_BAD_PARAM"):
        assert not is_out_of_memory(RuntimeError(message))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_the_finder_bisects_through_cudnns_engine_error():
    """Near a T4's limit the convolution fails with cuDNN's message, not "out of memory"."""

    def trial(size):
        if size > 300:
            raise RuntimeError(DISGUISED[0] if size % 2 else DISGUISED[1])

    found = batch.find_max_batch_size(trial, low=1, high=4096)
    assert found.batch_size == 300


# --- 14. one NVML session per process for pick() ---------------------------------------------


def test_pick_opens_one_nvml_session_however_often_it_is_called(driver):
    fake = driver([T4, {**T4, "uuid": "GPU-t4t4-1111"}])
    sizes = [workload.pick(small=1, cpu=2, gpu=3) for _ in range(12)]
    assert sizes == [3] * 12 and fake.sessions == 1


def test_the_count_follows_cuda_visible_devices(driver, monkeypatch):
    driver([T4, {**T4, "uuid": "GPU-t4t4-1111"}])
    assert device.cuda_gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert device.cuda_gpu_count() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert device.cuda_gpu_count() == 0


# --- 11. the gpu-lane band of the memory breakdown --------------------------------------------


def test_the_gpu_breakdown_band_leaves_room_for_one_layers_temporaries():
    """tests/test_footprint.py's GPU test: measured activations (up to ESTIMATE_FACTOR x
    the estimate) plus the largest weight gradient plus 64 MiB of cuDNN workspace must
    stay inside the band at its batch size (at batch 32 they did not)."""
    model = build_model("resnet18")
    inputs = torch.empty(GPU_BREAKDOWN_BATCH, 3, 32, 32, device="meta")
    estimate = activation_estimate(model, inputs)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    worst = ESTIMATE_FACTOR * estimate + largest + 64 * MIB
    assert worst / estimate <= GPU_BREAKDOWN_BAND[1], (worst / MIB, estimate / MIB)
