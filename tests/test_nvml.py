"""NVML wrapper: no library, a failing driver, and a fake two-GPU machine."""

from __future__ import annotations

import types

import pytest

from course_utils import nvml
from course_utils.nvml import GpuInfo, parse_visible_devices

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


def fake_pynvml(gpus: list[dict], fail_init: bool = False) -> types.SimpleNamespace:
    """A stand-in for the pynvml module describing ``gpus``; unsupported fields raise."""
    calls = {"init": 0, "shutdown": 0}

    def init():
        if fail_init:
            raise NVMLError("Driver Not Loaded")
        calls["init"] += 1

    def field(name):
        def read(handle):
            value = gpus[handle].get(name)
            if value is None:
                raise NVMLError("Not Supported")
            return value

        return read

    def memory(handle):
        total, used = gpus[handle]["memory_mib"]
        return types.SimpleNamespace(total=total * MIB, used=used * MIB, free=(total - used) * MIB)

    return types.SimpleNamespace(
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlSystemGetCudaDriverVersion_v2=lambda: 12040,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=field("name"),
        nvmlDeviceGetUUID=field("uuid"),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=gpus[h]["bus"].encode()),
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetCudaComputeCapability=field("cc"),
    )


TWO_GPUS = [
    {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-aaaa-1111", "bus": "00000000:07:00.0",
     "memory_mib": (40960, 1024), "cc": (8, 0)},
    {"name": "Tesla T4", "uuid": "GPU-bbbb-2222", "bus": "00000000:0F:00.0",
     "memory_mib": (15360, 5000), "cc": None},  # capability query "not supported"
]


def test_without_the_library_every_answer_is_not_available(monkeypatch):
    monkeypatch.setattr(nvml, "_pynvml", None)
    assert nvml.nvml_status().startswith("the NVML binding")
    assert nvml.list_gpus() == []
    assert nvml.gpu_count() == 0
    assert nvml.driver_version() is None
    assert nvml.cuda_driver_version() is None
    assert nvml.nvml_call("nvmlDeviceGetCount", default=-1) == -1


def test_a_driver_that_fails_to_load_gives_empty_answers(monkeypatch):
    monkeypatch.setattr(nvml, "_pynvml", fake_pynvml(TWO_GPUS, fail_init=True))
    assert "Driver Not Loaded" in nvml.nvml_status()
    assert nvml.list_gpus() == []
    assert nvml.driver_version() is None


def test_fake_two_gpu_machine_is_read_field_by_field(monkeypatch):
    fake = fake_pynvml(TWO_GPUS)
    monkeypatch.setattr(nvml, "_pynvml", fake)
    gpus = nvml.list_gpus()
    assert [gpu.name for gpu in gpus] == ["NVIDIA A100-SXM4-40GB", "Tesla T4"]
    assert gpus[0].memory_total_mib == 40960 and gpus[0].memory_free_mib == 39936
    assert gpus[0].compute_capability == (8, 0)
    assert gpus[1].compute_capability is None  # "Not Supported" became None
    assert gpus[1].bus_id == "00000000:0F:00.0"
    assert nvml.driver_version() == "550.54.15"
    assert nvml.cuda_driver_version() == "12.4"
    assert fake.calls["init"] == fake.calls["shutdown"] > 0  # every init is shut down


def test_nvml_call_turns_errors_into_the_default(monkeypatch):
    def broken():
        raise NVMLError("Unknown Error")

    monkeypatch.setattr(nvml, "_pynvml", types.SimpleNamespace(nvmlBroken=broken))
    assert nvml.nvml_call("nvmlBroken", default="n/a") == "n/a"
    assert nvml.nvml_call("nvmlMissing", default=0) == 0


GPUS = [
    GpuInfo(0, "a", "GPU-aaaa-1111", None, 1, 0, 1, None),
    GpuInfo(1, "b", "GPU-bbbb-2222", None, 1, 0, 1, None),
    GpuInfo(2, "c", "GPU-cccc-3333", None, 1, 0, 1, None),
]


@pytest.mark.parametrize(
    ("value", "names"),
    [
        (None, ["a", "b", "c"]),  # unset: every GPU
        ("2,0", ["c", "a"]),  # CUDA renumbers: cuda:0 is physical GPU 2
        ("GPU-bbbb", ["b"]),  # a UUID prefix
        ("1,7,2", ["b"]),  # the list stops at the first unknown entry
        ("0,0", ["a"]),  # and at a repeated one
        ("-1", []),
        ("", []),
        (" 1 , 2 ", ["b", "c"]),
    ],
)
def test_cuda_visible_devices_is_interpreted_like_cuda(value, names):
    assert [gpu.name for gpu in parse_visible_devices(value, GPUS)] == names


def test_visible_gpus_reads_the_environment(monkeypatch):
    monkeypatch.setattr(nvml, "_pynvml", fake_pynvml(TWO_GPUS))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [gpu.name for gpu in nvml.visible_gpus()] == ["Tesla T4"]


def test_binding_problem_is_none_with_the_official_binding():
    # This environment installs nvidia-ml-py and not the deprecated pynvml package.
    assert nvml.binding_problem() is None
