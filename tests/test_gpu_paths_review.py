"""The 2026-12 GPU-paths review's findings for notebooks 05-07 pinned on a CPU, with the
hardware faked as it behaves: N6 (a plain ``torch.cuda.is_available()`` before a fork) and
N1 (DataParallel and DDP fed the same way). N4 (Lightning's tuner and cuDNN's disguised
out-of-memory errors) is in ``test_lightning.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_utils import device, env, nvml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def nvml_does_not_know_the_gpu(monkeypatch):
    """One CUDA device that NVML cannot see (no binding, or a GPU it does not list), CUDA
    not initialized, and a plain ``torch.cuda.is_available()`` that would poison fork."""
    asked = []
    monkeypatch.setattr(nvml, "gpu_for_cuda_index", lambda index, gpus=None: None)
    monkeypatch.setattr(device, "gpu_for_cuda_index", lambda index, gpus=None: None)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or True)
    monkeypatch.setattr(device, "cuda_gpu_count", lambda: 1)  # NVML, else a child process
    monkeypatch.setattr(
        device, "_device_facts_in_subprocess", lambda position: ("Tesla T4", (7, 5))
    )
    monkeypatch.setattr(device, "_device_facts", {})
    return asked


def test_the_fallbacks_without_nvml_ask_a_child_process_not_this_one(nvml_does_not_know_the_gpu):
    """GPU review N6: ``env.measured_on`` and ``device._cuda_capability`` fell back to a
    plain ``torch.cuda.is_available()`` in this process when NVML did not know the GPU."""
    assert env.measured_on("cuda:0") == "measured on this machine (GPU: Tesla T4)"
    assert device._cuda_capability(torch.device("cuda:0")) == (7, 5)
    assert device.pick_precision("cuda:0").name.value == "fp16"  # a T4: fp16 + GradScaler
    assert nvml_does_not_know_the_gpu == [], "torch.cuda.is_available() was called here"
    assert device.cuda_device_facts(1) is None  # one device: cuda:1 does not exist


def test_the_child_process_reads_name_and_capability(monkeypatch):
    """The child's answer is parsed as CUDA prints it; a child that fails gives ``None``."""
    printed = subprocess.CompletedProcess([], 0, "some warning\n8 0 NVIDIA A100-SXM4-80GB\n", "")
    monkeypatch.setattr(device.subprocess, "run", lambda *a, **k: printed)
    assert device._device_facts_in_subprocess(0) == ("NVIDIA A100-SXM4-80GB", (8, 0))
    failed = subprocess.CompletedProcess([], 1, "", "RuntimeError: no CUDA GPUs")
    monkeypatch.setattr(device.subprocess, "run", lambda *a, **k: failed)
    assert device._device_facts_in_subprocess(0) is None


FORK_AFTER_FALLBACKS = """
import os
import torch
from course_utils import device, env, nvml
nvml._pynvml = None  # NVML unavailable: the fallbacks run
label = env.measured_on("cuda:0")
capability = device._cuda_capability(torch.device("cuda:0"))
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.write(write, str(torch._C._cuda_isInBadFork()).encode())
    os._exit(0)
os.waitpid(child, 0)
print(capability is None or capability[0] > 0, os.read(read, 16).decode())
"""


@pytest.mark.slow
def test_a_process_forked_after_the_fallbacks_can_still_use_cuda():
    """N6 with torch's real mechanism: on this machine (no driver) a plain
    ``torch.cuda.is_available()`` already marks a forked child as poisoned (reproduced
    by the review with torch 2.14.1+cu130); the course's fallbacks must not."""
    env_vars = {**os.environ, "PYTHONPATH": str(ROOT)}
    env_vars.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    done = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_FALLBACKS],
        capture_output=True,
        text=True,
        timeout=300,
        env=env_vars,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    sane, bad_fork = done.stdout.split()
    assert sane == "True"
    assert bad_fork == "False", "a child forked after measured_on('cuda:0') cannot use CUDA"
