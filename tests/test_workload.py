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


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ([("Tesla T4", 15360)], "full"),
        ([("NVIDIA GeForce RTX 3050 Laptop GPU", 4096)], "cpu"),
        ([("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9856)], "cpu"),  # a slice: its own memory
        ([("NVIDIA H200", 143771), ("NVIDIA GeForce GTX 1660", 6144)], "cpu"),  # the smaller
        ([("NVIDIA H200", None)], "full"),  # NVML did not say: the GPU's sizes
    ],
)
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


# --- sizes that follow the GPU's memory (issue 42: every GPU size) -----------------------------

_LAPTOP = {
    "name": "NVIDIA GeForce RTX 3060 Laptop GPU",
    "uuid": "GPU-lap-0",
    "cc": (8, 6),
    "memory_mib": (6144, 300),
}
_H200 = {"name": "NVIDIA H200", "uuid": "GPU-h200-0", "cc": (9, 0), "memory_mib": (143771, 0)}


def _mig_1g5gb():
    from test_gpu_review import a100_with_migs

    gpu = a100_with_migs(0, 1)
    gpu["migs"][0] = {
        **gpu["migs"][0],
        "name": "NVIDIA A100-PCIE-40GB MIG 1g.5gb",
        "memory_mib": (4864, 13),
    }
    return gpu


@pytest.fixture
def nvml_with(monkeypatch):
    """Fake NVML (as the driver answers, MIG slices with their own memory) over ``gpus``."""
    from test_gpu_review import Driver

    from course_utils import device, nvml

    def install(gpus):
        fake = Driver(gpus)
        monkeypatch.setattr(nvml, "_pynvml", fake)
        monkeypatch.setattr("torch.backends.cuda.is_built", lambda: True)
        monkeypatch.setattr("torch.cuda.is_initialized", lambda: False)
        monkeypatch.setattr(device, "_arch_flags", lambda: ["sm_75", "sm_80", "sm_86", "sm_90"])
        monkeypatch.setattr(device, "_counted", None, raising=False)
        monkeypatch.setattr(workload, "_auto", None)
        monkeypatch.setattr(workload, "_usable", None)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.delenv("COURSE_WORKLOAD", raising=False)
        return fake

    return install


@pytest.mark.parametrize(
    ("gpu", "usable", "old_pick", "three_gib", "six_gib"),
    [
        (_LAPTOP, 5120, 2, 3, 2),  # a 6 GiB laptop GPU: auto was cpu for everything
        ("mig", 3840, 2, 3, 2),  # a MIG 1g.5gb slice: its own 4.75 GiB
        (
            {"name": "Tesla T4", "uuid": "GPU-t4", "cc": (7, 5), "memory_mib": (15360, 0)},
            14336,
            3,
            3,
            3,
        ),
        (_H200, 142747, 3, 3, 3),
    ],
)
def test_an_experiments_gpu_size_follows_the_gpus_memory(
    nvml_with, gpu, usable, old_pick, three_gib, six_gib
):
    nvml_with([_mig_1g5gb() if gpu == "mig" else gpu])
    assert workload.usable_gpu_mib() == usable
    assert workload.pick(small=1, cpu=2, gpu=3) == old_pick  # pick() is unchanged
    assert workload.pick_by_memory(small=1, cpu=2, gpu=3, gpu_needs_mib=3072) == three_gib
    assert workload.pick_by_memory(small=1, cpu=2, gpu=3, gpu_needs_mib=6144) == six_gib
    assert workload.gpu_sizes_run(3072) and workload.gpu_sizes_run(6144) == (six_gib == 3)
    assert workload.cap_by_memory(16384, 1.0, share=0.25) == min(16384, usable // 4)


def test_sizes_by_memory_keep_an_explicit_workload(nvml_with, monkeypatch):
    nvml_with([_H200])
    for chosen, expected in (("small", 1), ("cpu", 2), ("full", 3)):
        monkeypatch.setenv("COURSE_WORKLOAD", chosen)
        assert workload.pick_by_memory(small=1, cpu=2, gpu=3, gpu_needs_mib=1) == expected
    nvml_with([_LAPTOP])
    monkeypatch.setenv("COURSE_WORKLOAD", "full")  # asked for, but this GPU cannot hold it
    assert workload.pick_by_memory(small=1, cpu=2, gpu=3, gpu_needs_mib=8192) == 2
    assert "5.0 GiB usable on this GPU" in workload.not_at_this_size("a claim", "Why.")


def test_sizes_by_memory_open_one_nvml_session_however_often_they_are_asked(nvml_with):
    fake = nvml_with([_LAPTOP])  # a knobs cell asks for each size (GPU review finding 14)
    sizes = [workload.pick_by_memory(small=1, cpu=2, gpu=3, gpu_needs_mib=3072) for _ in range(9)]
    assert sizes == [3] * 9 and fake.sessions == 1


def test_without_a_gpu_sizes_by_memory_are_picks(monkeypatch):
    monkeypatch.setattr("course_utils.device.cuda_gpu_count", lambda: 0)
    monkeypatch.setattr(workload, "_auto", None)
    monkeypatch.setattr(workload, "_usable", None)
    monkeypatch.delenv("COURSE_WORKLOAD", raising=False)
    assert workload.usable_gpu_mib() is None and not workload.gpu_sizes_run(1)
    assert workload.pick_by_memory(small=1, cpu=2, gpu=3, gpu_needs_mib=1) == 2
    assert workload.cap_by_memory(500, 1.0) == 500
    monkeypatch.setenv("COURSE_WORKLOAD", "full")
    assert workload.pick_by_memory(small=1, cpu=2, gpu=3, gpu_needs_mib=1) == 3
    with pytest.raises(ValueError, match="mib_per_unit"):
        workload.cap_by_memory(500, 0)
