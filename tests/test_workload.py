import pytest

from course_utils import workload


@pytest.mark.parametrize("value", ["small", "cpu", "full", " SMALL "])
def test_explicit_workload_is_used(monkeypatch, value):
    monkeypatch.setenv("COURSE_WORKLOAD", value)
    assert workload.workload() == value.strip().lower()


def test_auto_is_full_with_a_gpu_and_cpu_without(monkeypatch):
    monkeypatch.delenv("COURSE_WORKLOAD", raising=False)
    monkeypatch.setattr("course_utils.device.cuda_gpu_count", lambda: 1)
    monkeypatch.setattr(workload, "smallest_gpu_mib", lambda: 15360)  # a T4
    monkeypatch.setattr(workload, "_auto", None)
    assert workload.workload() == "full"
    monkeypatch.setattr("course_utils.device.cuda_gpu_count", lambda: 0)
    monkeypatch.setattr(workload, "_auto", None)
    assert workload.workload() == "cpu"
    monkeypatch.setenv("COURSE_WORKLOAD", "auto")
    assert workload.workload() == "cpu"


def test_unknown_workload_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("COURSE_WORKLOAD", "huge")
    with pytest.raises(ValueError, match="COURSE_WORKLOAD='huge'"):
        workload.workload()


def test_pick_returns_the_size_for_the_workload(monkeypatch):
    sizes = {"small": 1, "cpu": 2, "full": 3}
    for name, expected in sizes.items():
        monkeypatch.setenv("COURSE_WORKLOAD", name)
        assert workload.pick(small=1, cpu=2, gpu=3) == expected


@pytest.mark.parametrize(("gpus", "expected"), [
    ([("Tesla T4", 15360)], "full"),
    ([("NVIDIA GeForce RTX 3050 Laptop GPU", 4096)], "cpu"),
    ([("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9856)], "cpu"),  # a slice: its own memory
    ([("NVIDIA H200", 143771), ("NVIDIA GeForce GTX 1660", 6144)], "cpu"),  # the smaller
    ([("NVIDIA H200", None)], "full"),  # NVML did not say: the GPU's sizes
])
def test_auto_picks_the_full_sizes_only_where_they_fit_in_the_gpus_memory(
    monkeypatch, gpus, expected
):
    # gpu-paths N7: 09's full sizes peak near 5 GiB; a 4-8 GB GPU ran out of memory
    from types import SimpleNamespace

    monkeypatch.delenv("COURSE_WORKLOAD", raising=False)
    monkeypatch.setattr("course_utils.device.cuda_gpu_count", lambda: len(gpus))
    visible = [SimpleNamespace(name=name, memory_total_mib=mib) for name, mib in gpus]
    monkeypatch.setattr("course_utils.nvml.visible_gpus", lambda: visible)
    monkeypatch.setattr(workload, "_auto", None)
    assert workload.workload() == expected
    monkeypatch.setenv("COURSE_WORKLOAD", "full")  # asked for: the learner's choice
    assert workload.workload() == "full"
