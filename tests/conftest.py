"""Shared fixtures: paths, the shared nvidia-smi corpus, and GPU markers."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


def _cuda_gpus() -> int:
    from course_utils.device import cuda_gpu_count

    return cuda_gpu_count()


#: Doctests of the package that take seconds (a Lightning tuner's run): marked slow here,
#: as a test function would be, so that make quick leaves them out (make test runs them).
SLOW_DOCTESTS = {"course_utils/lightning.py::course_utils.lightning.scale_batch_size"}


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpus = _cuda_gpus()
    for item in items:
        if item.nodeid in SLOW_DOCTESTS:
            item.add_marker(pytest.mark.slow)
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (none visible)"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2+ CUDA GPUs ({gpus} visible)"))


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process sees a machine without an NVIDIA driver, whatever the real hardware:
    no NVML library, no device files, CUDA not started, no Apple GPU, no COURSE_DEVICE."""
    import torch

    from course_utils import device, nvml

    monkeypatch.setattr(nvml, "_pynvml", None)
    monkeypatch.setattr(device, "_driver_present", lambda: False)
    monkeypatch.setattr(device, "mps_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.delenv("COURSE_DEVICE", raising=False)


#: For a child process: no GPU visible, on any machine (the driver may still answer).
NO_GPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "COURSE_DEVICE": ""}
