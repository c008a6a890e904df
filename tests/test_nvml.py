"""NVML wrapper: no library, a failing driver, and a fake two-GPU machine."""

from __future__ import annotations

import os
import sys
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
    {
        "name": "NVIDIA A100-SXM4-40GB",
        "uuid": "GPU-aaaa-1111",
        "bus": "00000000:07:00.0",
        "memory_mib": (40960, 1024),
        "cc": (8, 0),
    },
    {
        "name": "Tesla T4",
        "uuid": "GPU-bbbb-2222",
        "bus": "00000000:0F:00.0",
        "memory_mib": (15360, 5000),
        "cc": None,
    },  # capability query "not supported"
]


def test_without_the_library_every_answer_is_not_available(monkeypatch):
    monkeypatch.setattr(nvml, "_pynvml", None)
    assert nvml.nvml_status().startswith("the NVML binding")
    assert nvml.list_gpus() == []
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


def full_fake(mig: bool = False, process_memory: int | None = 700 * MIB):
    """A one-GPU fake with every snapshot field; ``mig=True`` makes utilization fail."""
    fake = fake_pynvml([TWO_GPUS[1]])

    def utilization(handle):
        if mig:
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=97, memory=41)

    def processes(handle):
        return [
            types.SimpleNamespace(pid=4242, usedGpuMemory=process_memory),
            types.SimpleNamespace(pid=77, usedGpuMemory=None),
        ]

    def graphics(handle):
        return [types.SimpleNamespace(pid=77, usedGpuMemory=None)]

    def handle(index):
        if index != 0:
            raise NVMLError("Invalid Argument")
        return index

    def name_of(pid):
        if pid == 77:
            raise NVMLError("Not Found")  # another PID namespace
        return b"python3"

    fake.__dict__.update(
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetPowerUsage=lambda h: 68_410,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 70_000,
        nvmlDeviceGetTemperature=lambda h, sensor: 61,
        nvmlDeviceGetClockInfo=lambda h, clock: 1590,
        nvmlDeviceGetPerformanceState=lambda h: 0,
        nvmlDeviceGetMigMode=lambda h: (1, 1) if mig else (0, 0),
        nvmlDeviceGetComputeRunningProcesses=processes,
        nvmlDeviceGetGraphicsRunningProcesses=graphics,
        nvmlSystemGetProcessName=name_of,
    )
    return fake


def test_snapshot_reads_every_field_with_processes(monkeypatch):
    fake = full_fake()
    monkeypatch.setattr(nvml, "_pynvml", fake)
    shot = nvml.snapshot(0)
    assert (shot.name, shot.uuid, shot.bus_id) == ("Tesla T4", "GPU-bbbb-2222", "00000000:0F:00.0")
    assert (shot.memory_total_mib, shot.memory_used_mib, shot.memory_free_mib) == (
        15360,
        5000,
        10360,
    )
    assert (shot.utilization_gpu_pct, shot.utilization_memory_pct) == (97, 41)
    assert (shot.power_draw_w, shot.power_limit_w) == (68.41, 70.0)
    assert (shot.temperature_c, shot.sm_clock_mhz, shot.pstate) == (61, 1590, "P0")
    assert shot.mig_enabled is False
    assert shot.processes == (
        nvml.GpuProcess(4242, "python3", 700, "C"),
        nvml.GpuProcess(77, None, None, "C+G"),  # compute and graphics, name not visible
    )
    assert nvml.snapshot(0, processes=False).processes == ()
    assert nvml.snapshot(5) is None  # no such GPU
    assert fake.calls["init"] == fake.calls["shutdown"]


def test_snapshot_under_mig_has_no_utilization_but_everything_else(monkeypatch):
    monkeypatch.setattr(nvml, "_pynvml", full_fake(mig=True))
    shot = nvml.snapshot(0)
    assert shot.mig_enabled is True
    assert shot.utilization_gpu_pct is None and shot.utilization_memory_pct is None
    assert shot.memory_used_mib == 5000 and shot.power_draw_w == 68.41


def test_process_memory_not_available_value_becomes_none(monkeypatch):
    monkeypatch.setattr(nvml, "_pynvml", full_fake(process_memory=2**64 - 1))
    assert nvml.snapshot(0).processes[0].used_memory_mib is None


def test_a_gpu_without_any_optional_query_gives_nones(monkeypatch):
    monkeypatch.setattr(nvml, "_pynvml", fake_pynvml([TWO_GPUS[0]]))  # no power, no clocks...
    shot = nvml.snapshot(0)
    assert shot.memory_used_mib == 1024 and shot.utilization_gpu_pct is None
    assert shot.power_draw_w is None and shot.pstate is None and shot.mig_enabled is None
    assert shot.processes == ()


MIG_GPUS = [
    GpuInfo(
        0,
        "NVIDIA A100-SXM4-40GB",
        "GPU-aaaa-1111",
        None,
        1,
        0,
        1,
        (8, 0),
        mig_uuids=("MIG-1111-aaaa", "MIG-2222-bbbb"),
    ),
    GpuInfo(
        1,
        "NVIDIA A100-SXM4-40GB",
        "GPU-bbbb-2222",
        None,
        1,
        0,
        1,
        (8, 0),
        mig_uuids=("MIG-3333-cccc",),
    ),
]


@pytest.mark.parametrize(
    ("value", "indices"),
    [
        ("MIG-3333-cccc", [1]),  # what Slurm and Kubernetes set: a slice of GPU 1
        ("MIG-2222", [0]),  # a prefix, as for GPU UUIDs
        ("MIG-GPU-bbbb-2222/1/0", [1]),  # the CUDA 11 form names the parent GPU
        ("MIG-9999", []),  # no such slice: nothing visible, as in CUDA
    ],
)
def test_mig_devices_in_cuda_visible_devices_match_their_gpu(value, indices):
    assert [gpu.index for gpu in parse_visible_devices(value, MIG_GPUS)] == indices


def test_mig_uuids_are_read_from_nvml(monkeypatch):
    fake = fake_pynvml(TWO_GPUS)
    migs = {("mig", 0, 0): "MIG-1111-aaaa", ("mig", 0, 1): "MIG-2222-bbbb"}
    fake.nvmlDeviceGetMigMode = lambda handle: (1, 1) if handle == 0 else (0, 0)
    fake.nvmlDeviceGetMaxMigDeviceCount = lambda handle: 7
    real_uuid = fake.nvmlDeviceGetUUID

    def mig_handle(handle, slot):
        if ("mig", handle, slot) not in migs:
            raise NVMLError("Not Found")
        return ("mig", handle, slot)

    fake.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    fake.nvmlDeviceGetUUID = lambda h: migs[h] if isinstance(h, tuple) else real_uuid(h)
    monkeypatch.setattr(nvml, "_pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-2222-bbbb")
    gpus = nvml.list_gpus()
    assert gpus[0].mig_uuids == ("MIG-1111-aaaa", "MIG-2222-bbbb") and gpus[1].mig_uuids == ()
    assert [gpu.index for gpu in nvml.visible_gpus()] == [0]
    assert nvml.nvml_index(0) == 0 and nvml.nvml_index(1) is None


def test_cuda_index_maps_through_cuda_visible_devices(monkeypatch):
    monkeypatch.setattr(nvml, "list_gpus", lambda: list(GPUS))
    for value, expected in [
        ("2,0", [2, 0, None]),
        ("GPU-bbbb", [1, None, None]),
        (None, [0, 1, 2]),
    ]:
        if value is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert [nvml.nvml_index(k) for k in range(3)] == expected


def test_once_cuda_runs_the_uuid_decides(monkeypatch):
    # CUDA already started (fastest-first order, say): cuda:0 reports GPU 2's UUID.
    fake_torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            is_initialized=lambda: True,
            get_device_properties=lambda k: types.SimpleNamespace(
                uuid=["cccc-3333", "aaaa-1111"][k]
            ),
        )
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml.gpu_for_cuda_index(0, GPUS).index == 2
    assert nvml.gpu_for_cuda_index(1, GPUS).index == 0


def test_cuda_device_order_is_set_to_pci_order_before_cuda_starts(monkeypatch):
    import torch

    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert nvml.align_cuda_device_order() is False  # too late: CUDA read it already
    assert "CUDA_DEVICE_ORDER" not in os.environ
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert nvml.align_cuda_device_order() is True
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")  # a user's choice stays
    assert nvml.align_cuda_device_order() is False
