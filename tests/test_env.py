"""The doctor report and environment detection, including 'CUDA is never initialized'."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from course_utils import env

ENV_VARS = ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", "CI")


@pytest.fixture
def plain(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(env, "_ipython_shell", lambda: None)


@pytest.mark.parametrize(
    ("variable", "expected"),
    [("COLAB_RELEASE_TAG", "colab"), ("KAGGLE_KERNEL_RUN_TYPE", "kaggle"), ("CI", "ci")],
)
def test_where_am_i_from_the_environment(plain, monkeypatch, variable, expected):
    assert env.where_am_i() == "script"
    monkeypatch.setenv(variable, "1")
    assert env.where_am_i() == expected


def test_where_am_i_in_jupyter(plain, monkeypatch):
    monkeypatch.setattr(env, "_ipython_shell", lambda: "ZMQInteractiveShell")
    assert env.where_am_i() == "jupyter"
    monkeypatch.setattr(env, "_ipython_shell", lambda: "TerminalInteractiveShell")
    assert env.where_am_i() == "ipython"


def test_stale_imports_finds_a_package_replaced_after_import(monkeypatch):
    installed = env.installed_version("pytest")
    monkeypatch.setattr(env, "PACKAGES", {"fake_module": "pytest"})
    monkeypatch.setitem(sys.modules, "fake_module", types.SimpleNamespace(__version__="0.0.1"))
    assert env.stale_imports() == [
        {"package": "pytest", "in_memory": "0.0.1", "installed": installed}
    ]
    monkeypatch.setitem(sys.modules, "fake_module", types.SimpleNamespace(__version__=installed))
    assert env.stale_imports() == []
    # torch's own version string carries a local label that pip's metadata lacks
    local = types.SimpleNamespace(__version__=installed + "+cu128")
    monkeypatch.setitem(sys.modules, "fake_module", local)
    assert env.stale_imports() == []


def test_stale_imports_shows_up_as_advice(monkeypatch):
    monkeypatch.setattr(
        env,
        "stale_imports",
        lambda: [{"package": "lightning", "in_memory": "2.5.0", "installed": "2.6.6"}],
    )
    advice = env.doctor()["advice"]
    assert any("restart the runtime" in item and "lightning 2.6.6" in item for item in advice)


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("colab", "Runtime > Change runtime type"),
        ("kaggle", "Accelerator"),
        ("jupyter", "nvidia-smi"),
    ],
)
def test_gpu_advice_fits_the_environment(where, words):
    assert words in env.gpu_runtime_advice(where)


def test_doctor_reports_a_machine_without_a_driver_honestly(no_driver):
    report = env.doctor()
    for key in (
        "python",
        "torch",
        "cuda_available",
        "torch_cuda_build",
        "device",
        "gpus",
        "precision",
        "environment",
    ):
        assert key in report
    # No NVIDIA driver (faked): the report must say so rather than guess.
    assert report["cuda_available"] is False and report["gpus"] == []
    assert report["device"] == "cpu" and report["precision"] == "fp32"
    assert report["nvml"] != "ok" and report["driver"] is None
    assert any("GPU" in item for item in report["advice"])
    json.dumps(report)  # JSON-ready
    text = env.format_doctor(report)
    assert "CUDA available : False" in text and "advice:" in text


def test_measured_on_labels_the_hardware():
    assert env.measured_on("cpu").startswith("measured on this machine (CPU:")
    assert "MPS" in env.measured_on("mps")


SPY = """
import torch, torch.cuda
calls = []
def spy(name, real):
    def wrapper(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)
    return wrapper
torch.cuda._lazy_init = spy("_lazy_init", torch.cuda._lazy_init)
torch.cuda.init = spy("init", torch.cuda.init)
# cudaGetDeviceCount creates a driver context that makes a later fork unusable
torch._C._cuda_getDeviceCount = spy("_cuda_getDeviceCount", torch._C._cuda_getDeviceCount)
from course_utils.env import doctor, format_doctor
from course_utils.device import choose_device, pick_precision
format_doctor(doctor())
pick_precision(choose_device().device)
print(calls, torch.cuda.is_initialized())
"""


@pytest.mark.slow
def test_doctor_never_initializes_cuda():
    done = subprocess.run(
        [sys.executable, "-c", SPY], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[] False"


@pytest.mark.gpu
def test_doctor_on_a_gpu_machine_agrees_with_torch():
    import torch

    report = env.doctor()
    assert report["cuda_available"] and report["driver"] and report["gpus"]
    assert report["device"].startswith("cuda:")
    index = int(report["device"].split(":")[1])
    properties = torch.cuda.get_device_properties(index)
    gpu = report["gpus"][index]
    assert gpu["compute_capability"] == f"{properties.major}.{properties.minor}"
    assert abs(gpu["memory_total_mib"] - properties.total_memory / 2**20) < 1024
