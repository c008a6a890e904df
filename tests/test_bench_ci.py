"""benchmarks/bench_ci.py's reading of ``.ci/run``'s and ``make course``'s output, on
logs kept in tests/fixtures/bench-ci/ (the benchmark itself takes half an hour)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "bench-ci"


@pytest.fixture(scope="module")
def bench_ci():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # a script beside common.py, not a package
    try:
        yield importlib.import_module("bench_ci")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_each_stage_of_ci_run_is_read_with_its_seconds_and_exit_code(bench_ci):
    stages = bench_ci.parse_stages((FIXTURES / "ci-run.log").read_text())
    assert list(stages) == ["env", "test", "colab-prepare-wait", "colab-check", "gpu-rehearsal"]
    assert stages["test"] == {"seconds": 815.2, "exit": 0}
    assert stages["env"] == {"seconds": 212.6, "exit": 0}


def test_make_tests_summary_is_its_own_not_a_later_stages(bench_ci):
    """colab-check and gpu-rehearsal print pytest summaries too (334 passed, 1 passed)."""
    figures = bench_ci.summarize((FIXTURES / "ci-run.log").read_text(), 1432.1, 0)
    assert figures["make_test"] == {
        "seconds": 815.2,
        "pytest": {"passed": 2217, "skipped": 25, "warnings": 13, "seconds": 806.84},
    }
    assert figures["within_goal"] == {"make_test": True}
    assert (figures["seconds"], figures["exit"]) == (1432.1, 0)


def test_a_make_test_over_its_goal_is_data_and_a_stage_that_never_ran_is_none(bench_ci):
    log = (FIXTURES / "ci-run.log").read_text().replace("test 815.2 s", "test 930.0 s")
    assert bench_ci.summarize(log, 1500.0, 0)["within_goal"] == {"make_test": False}
    failed = "ci-stage: env started\nci-stage: env 3.0 s exit 2\n"
    figures = bench_ci.summarize(failed, 3.1, 2)
    assert figures["make_test"] == {"seconds": None, "pytest": None}
    assert figures["within_goal"] == {"make_test": None}
    assert figures["stages"] == {"env": {"seconds": 3.0, "exit": 2}}


def test_a_failed_run_is_read_with_its_failures_and_errors(bench_ci):
    log = (
        "ci-stage: test started\n"
        "FAILED tests/test_judge.py::test_x - assert 1 == 3\n"
        "2 failed, 2215 passed, 25 skipped, 1 error in 799.10s (0:13:19)\n"
        "ci-stage: test 805.0 s exit 2\n"
    )
    figures = bench_ci.summarize(log, 806.0, 2)
    assert figures["make_test"]["pytest"] == {
        "failed": 2, "passed": 2215, "skipped": 25, "errors": 1, "seconds": 799.1,
    }  # fmt: skip
    assert figures["stages"]["test"]["exit"] == 2


def test_each_notebook_of_make_course_is_read_with_its_status_and_seconds(bench_ci):
    notebooks = bench_ci.parse_notebooks((FIXTURES / "make-course.log").read_text())
    assert notebooks == {
        "01_runtime_and_devices.ipynb": {"status": "ok", "seconds": 21.4},
        "06_multi_gpu.ipynb": {"status": "failed", "seconds": 88.0},
    }


def test_the_table_names_every_stage_and_the_goals(bench_ci):
    figures = {
        "ci_run": bench_ci.summarize((FIXTURES / "ci-run.log").read_text(), 1432.1, 0),
        "make_course": {"seconds": 250.0, "exit": 0, "notebooks": {}},
        "within_goal": {"make_test": True, "make_course": True},
    }
    text = bench_ci.table(figures)
    for name in ("env", "test", "colab-check", "gpu-rehearsal", "make course", "2217"):
        assert name in text, name
