import pytest

from course_utils import workload


@pytest.mark.parametrize("value", ["small", "cpu", "full", " SMALL "])
def test_explicit_workload_is_used(monkeypatch, value):
    monkeypatch.setenv("COURSE_WORKLOAD", value)
    assert workload.workload() == value.strip().lower()


def test_auto_is_full_with_a_gpu_and_cpu_without(monkeypatch):
    monkeypatch.delenv("COURSE_WORKLOAD", raising=False)
    monkeypatch.setattr("course_utils.device.cuda_gpu_count", lambda: 1)
    assert workload.workload() == "full"
    monkeypatch.setattr("course_utils.device.cuda_gpu_count", lambda: 0)
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
