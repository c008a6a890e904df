"""The GPU record (``python -m course_utils gpu-record``), checked with no GPU.

A faked driver (as in ``test_gpu_review.py``) gives the recorder a T4, and tiny stand-in
notebooks run in a real kernel instead of the course's: the command writes a record that
validates, holds every figure and verdict, fails (exit 1) when a claim did not hold,
stops at its budget with a partial valid record, and on this CPU machine stops at once
with one line. The records' schema, loader, labels, comparison page and notebook helper
are checked on the sample records in ``tests/fixtures/gpu-records/`` (made up, and
labelled so: ``"sample": true``).
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib
from conftest import NO_GPU_ENV
from test_gpu_review import T4, Driver

from course_utils import device, nvml, records
from course_utils.records import RecordError, load_record, load_records, validate_record
from course_utils.tooling import gpu_record
from course_utils.tooling.cli import main
from course_utils.tooling.record_compare import comparison_page

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "fixtures" / "gpu-records"
LABEL = "measured on this machine (GPU: Tesla T4)"


@pytest.fixture
def fake_t4(monkeypatch):
    """One T4 behind a fake NVML and a CUDA build of torch that can use it."""
    import torch

    monkeypatch.setattr(nvml, "_pynvml", Driver([T4], 13000))
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(device, "_arch_flags", lambda: ["sm_75", "sm_80", "sm_90"])
    monkeypatch.setattr(device, "_counted", None, raising=False)
    for name in ("CUDA_VISIBLE_DEVICES", "COURSE_DEVICE", "COURSE_WORKLOAD", "COURSE_CLAIMS"):
        monkeypatch.delenv(name, raising=False)


def stand_in(folder: Path, name: str, *sources: str) -> Path:
    """A tiny notebook standing in for a lesson."""
    folder.mkdir(parents=True, exist_ok=True)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    path = folder / name
    nbformat.write(notebook, path)
    return path


MEASURE_AND_CLAIM = f"""
from course_utils.measurements import record_measurement
from course_utils.claims import gpu_claim
import os
record_measurement("GPT training: tokens per second", 41000.0, "tokens/s", label={LABEL!r})
record_measurement("workload", os.environ["COURSE_WORKLOAD"], label={LABEL!r})
gpu_claim("AMP / fp32", 2.0, at_least=1.5, unit="x", why="tensor cores", label={LABEL!r})
gpu_claim("fused / foreach", 0.9, at_least=1.05, unit="x", why="one kernel", label={LABEL!r})
record_measurement("after a claim that did not hold", 3, label={LABEL!r})
"""


def small_tests(folder: Path) -> Path:
    folder.mkdir()
    (folder / "test_on_gpu.py").write_text(
        "import pytest\n\n@pytest.mark.gpu\ndef test_a():\n    assert True\n\n"
        "def test_not_selected():\n    assert False\n"
    )
    return folder


def the_record(out: Path) -> dict:
    (path,) = out.glob("gpu-record-*.json")
    return load_record(path)


# --- the run, with a faked GPU ------------------------------------------------------------


@pytest.mark.slow
def test_with_a_faked_gpu_the_command_writes_a_record_that_validates(fake_t4, tmp_path, capsys):
    notebooks = tmp_path / "notebooks"
    stand_in(notebooks, "09_tiny.ipynb", MEASURE_AND_CLAIM)
    stand_in(notebooks, "01_tiny.ipynb", "print('nothing measured')")
    out = tmp_path / "out"
    argv = [
        "gpu-record",
        str(notebooks),
        "--out",
        str(out),
        "--tests",
        str(small_tests(tmp_path / "tests")),
        "--budget-s",
        "600",
    ]
    assert main(argv) == 1  # a claim did not hold: the run fails
    stdout, stderr = capsys.readouterr()
    assert stderr.count("\n") == 1 and stderr.startswith("error: the GPU record's run failed (")
    assert "09_tiny.ipynb: claim not held: fused / foreach" in stderr
    record = the_record(out)
    assert re.fullmatch(
        r"gpu-record-tesla-t4-x1-\d{8}-\d{6}\.json", next(out.glob("gpu-record-*")).name
    )
    assert record["outcome"] == "failed" and record["sample"] is False
    machine = record["machine"]
    assert (machine["gpu_name"], machine["gpu_count"], machine["cuda"]) == ("Tesla T4", 1, "13.0")
    assert machine["gpus"][0]["compute_capability"] == "7.5" and machine["gpus"][0]["mig"] is False
    assert record["settings"]["order"] == ["09_tiny.ipynb", "01_tiny.ipynb"]  # 09 first
    assert record["pytest"]["status"] == "passed" and "1 passed" in record["pytest"]["summary"]
    first, second = record["notebooks"]
    assert first["status"] == "ok" and second["status"] == "ok"
    figures = {m["name"]: m["value"] for m in first["measurements"]}
    assert figures == {
        "GPT training: tokens per second": 41000.0,
        "workload": "full",
        "after a claim that did not hold": 3,
    }  # the notebook went on
    assert [(c["name"], c["held"]) for c in first["claims"]] == [
        ("AMP / fp32", True),
        ("fused / foreach", False),
    ]
    assert record["doctor"]["gpu_count"] == 1 and (out / "doctor.txt").is_file()
    assert "record: " in stdout and "2 of 2 notebook(s) ran" in stdout


@pytest.mark.slow
def test_a_notebook_past_its_time_limit_is_stopped_and_the_next_one_runs(fake_t4, tmp_path):
    notebooks = tmp_path / "notebooks"
    stand_in(notebooks, "03_slow.ipynb", "import time\ntime.sleep(120)", "print('never')")
    stand_in(notebooks, "05_quick.ipynb", "print('ran')")
    settings = gpu_record.Settings(
        out=tmp_path / "out", notebooks=[notebooks], tests=None, budget_s=600, notebook_timeout_s=8
    )
    started = time.monotonic()
    path, record = gpu_record.gpu_record(settings)
    assert time.monotonic() - started < 110  # far less than the 120 s sleep
    slow, quick = record["notebooks"]
    assert (slow["status"], quick["status"]) == ("timeout", "ok")
    assert record["failures"] == ["03_slow.ipynb timeout"]
    assert load_record(path) == record


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.mark.slow
def test_the_budget_stops_the_run_and_the_record_says_what_did_not_run(
    fake_t4, tmp_path, monkeypatch
):
    notebooks = tmp_path / "notebooks"
    for name in ("01_a.ipynb", "02_b.ipynb", "04_c.ipynb"):
        stand_in(notebooks, name, "pass")
    clock, limits = FakeClock(), []

    def run_one(path, out, limit_s, kernel, progress):  # each notebook takes 100 s
        limits.append(limit_s)
        clock.now += 100
        return {
            "notebook": path.name,
            "status": "ok",
            "seconds": 100.0,
            "error": None,
            "measurements": [{"name": "x", "value": 1, "unit": "", "label": LABEL}],
            "claims": [],
        }

    monkeypatch.setattr(gpu_record, "run_one_notebook", run_one)
    settings = gpu_record.Settings(
        out=tmp_path, notebooks=[notebooks], tests=None, budget_s=150, notebook_timeout_s=120
    )
    path, record = gpu_record.gpu_record(settings, clock=clock)
    # 04 first (ORDER), limited by the notebook limit, then 02 by what is left of the budget
    assert [entry["notebook"] for entry in record["notebooks"]] == [
        "04_c.ipynb",
        "02_b.ipynb",
        "01_a.ipynb",
    ]
    assert limits == [120, 150 - 100 - gpu_record.RESERVE_S]
    assert [entry["status"] for entry in record["notebooks"]] == ["ok", "ok", "not run"]
    assert record["outcome"] == "failed" and record["failures"] == ["01_a.ipynb not run"]
    assert load_record(path)["wall_s"] == 200


@pytest.mark.slow
def test_a_killed_run_leaves_a_partial_record_that_validates(fake_t4, tmp_path, monkeypatch):
    notebooks = tmp_path / "notebooks"
    stand_in(notebooks, "09_a.ipynb", "pass")
    stand_in(notebooks, "08_b.ipynb", "pass")
    done = []

    def run_one(path, out, limit_s, kernel, progress):
        if done:
            raise KeyboardInterrupt  # the slot ended during the second notebook
        done.append(path.name)
        return {
            "notebook": path.name,
            "status": "ok",
            "seconds": 1.0,
            "error": None,
            "measurements": [{"name": "tokens/s", "value": 9.5, "unit": "", "label": LABEL}],
            "claims": [],
        }

    monkeypatch.setattr(gpu_record, "run_one_notebook", run_one)
    settings = gpu_record.Settings(out=tmp_path, notebooks=[notebooks], tests=None)
    with pytest.raises(KeyboardInterrupt):
        gpu_record.gpu_record(settings)
    record = the_record(tmp_path)
    assert record["outcome"] == "running" and record["finished"] is None
    assert [entry["notebook"] for entry in record["notebooks"]] == ["09_a.ipynb"]
    assert record["notebooks"][0]["measurements"][0]["value"] == 9.5
    assert not list(tmp_path.glob("*.partial"))


def test_with_two_gpus_the_multi_gpu_notebook_runs_second():
    paths = [Path(f"{n}_x.ipynb") for n in ("01", "06", "09", "04", "10")]

    def order(gpus):
        return [p.name[:2] for p in gpu_record.order_notebooks(paths, gpus)]

    assert order(1) == ["09", "04", "01", "06", "10"]
    assert order(2) == ["09", "06", "04", "01", "10"]


# --- checks up front ------------------------------------------------------------------------


@pytest.mark.slow
def test_on_a_machine_without_a_gpu_it_stops_within_seconds_with_one_line(tmp_path):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "course_utils", "gpu-record", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **NO_GPU_ENV},
    )
    # seconds: imports only (torch, the runner); a sanity bound for a busy machine
    assert time.monotonic() - started < 120
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "error: gpu-record needs a GPU this torch can use; no GPU: CUDA_VISIBLE_DEVICES "
        "hides every GPU\n"
    )
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_missing_packages_are_named_with_the_line_that_adds_them_offline(
    fake_t4, monkeypatch, capsys, tmp_path
):
    real_import, real_find = importlib.import_module, importlib.util.find_spec

    def failing_import(name, *args):
        if name == "nbclient":
            raise ModuleNotFoundError("No module named 'nbclient'", name="nbclient")
        if name == "ipykernel":  # installed, but one of its own packages is not
            raise ModuleNotFoundError("No module named 'zmq'", name="zmq")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", failing_import)
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "lightning" else real_find(name, *a),
    )
    assert main(["gpu-record", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "gpu-record needs nbclient, pyzmq, lightning, which this Python" in err
    line = "-m pip install --no-index --find-links WHEELS nbclient pyzmq lightning"
    assert err.rstrip().endswith(line)
    assert not (tmp_path / "out").exists()


def test_check_says_ready_when_everything_is_here(fake_t4, capsys):
    assert main(["gpu-record", "--check"]) == 0
    assert capsys.readouterr().out.startswith("gpu-record: ready")


@pytest.mark.parametrize("option", ["--budget-s", "--notebook-timeout-s", "--tests-timeout-s"])
def test_a_limit_that_is_not_a_positive_number_is_bad_input(option, capsys):
    assert main(["gpu-record", option, "0"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {option} must be a positive number of seconds, not 0\n"


def test_the_imports_it_checks_are_the_course_and_the_runner_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=;\[ ]", dep)[0].lower() for dep in project["dependencies"]}
    runner = {
        re.split(r"[<>=;\[ ]", dep)[0].lower()
        for dep in project["optional-dependencies"]["notebooks"]
    }
    assert set(gpu_record.COURSE_IMPORTS.values()) == declared
    assert set(gpu_record.RUNNER_IMPORTS.values()) >= runner


def distribution_closure(names: set[str]) -> set[str]:
    """``names`` and every distribution they require (installed ones), recursively, with
    their extras: a package an allowed one imports only when it is there (jsonschema's
    format checkers) cannot be missing from a run."""
    from importlib import metadata

    seen, todo = set(), [name.lower() for name in names]
    while todo:
        name = todo.pop().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            todo.append(re.split(r"[<>=!~;\[ (]", requirement.strip())[0].lower())
    return seen


IMPORTS_OF_A_RUN = f"""
import json, sys
sys.path.insert(0, {str(ROOT / "tests")!r})
import torch
from test_gpu_review import Driver, T4
from course_utils import device, nvml
from course_utils.tooling.cli import main
nvml._pynvml = Driver([T4], 13000)
torch.backends.cuda.is_built = lambda: True
torch.cuda.is_initialized = lambda: False
torch.version.cuda = "13.0"
device._arch_flags = lambda: ["sm_75"]
before = set(sys.modules)  # the fake driver's own imports (pytest) are not the command's
code = main(sys.argv[1:])
added = {{m.split(".")[0] for m in set(sys.modules) - before}}
print(json.dumps({{"code": code, "modules": sorted(added)}}))
"""


@pytest.mark.slow
def test_a_run_imports_only_the_course_dependencies_and_the_runner(tmp_path):
    """What a Python with torch but not the lock needs: the command imports nothing
    outside course-utils's declared dependencies, the runner and their own."""
    from importlib import metadata

    notebooks = tmp_path / "notebooks"
    stand_in(notebooks, "01_tiny.ipynb", "x = 1")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            IMPORTS_OF_A_RUN,
            "gpu-record",
            str(notebooks),
            "--out",
            str(tmp_path / "out"),
            "--no-tests",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, done.stderr[-2000:]
    allowed = distribution_closure(
        set(gpu_record.COURSE_IMPORTS.values()) | set(gpu_record.RUNNER_IMPORTS.values())
    )
    owners = metadata.packages_distributions()
    outside = {}
    for module in result["modules"]:
        if module in sys.stdlib_module_names or module == "course_utils":
            continue
        dists = {d.lower().replace("_", "-") for d in owners.get(module, [])}
        if dists and not dists & allowed:
            outside[module] = sorted(dists)
    assert outside == {}, f"gpu-record imported packages outside its dependencies: {outside}"


# --- the records: schema, loader, labels ---------------------------------------------------


def test_the_sample_records_validate_and_say_they_are_samples():
    found = load_records(SAMPLES)
    assert [r["machine"]["gpu_name"] for r in found] == ["NVIDIA H200", "Tesla T4"]
    assert all(r["sample"] for r in found)
    assert records.record_label(found[0]) == (
        "SAMPLE record, not a measurement: measured on an NVIDIA H200, driver 580.65.06, "
        "torch 2.14.1+cu130, CUDA 13.0, 2026-12-03"
    )
    real = {**found[1], "sample": False}
    assert records.record_label(real).startswith("measured on a Tesla T4, driver 535")


def test_the_records_shipped_in_the_package_validate_and_none_is_a_sample():
    for record in load_records():  # none yet; each one added later is checked here
        assert record["sample"] is False, "a sample record must not ship with the course"
    assert (records.RECORDS_DIR / "README.md").is_file()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("machine"), "at the top level: 'machine' is a required property"),
        (lambda r: r["machine"].update(gpu_count=0), "at machine/gpu_count: 0 is less than"),
        (lambda r: r["notebooks"][0].update(status="fine"), "at notebooks/0/status: 'fine' is not"),
        (
            lambda r: r["notebooks"][0]["measurements"][0].update(value=None),
            "at notebooks/0/measurements/0/value: None is not of type",
        ),
        (
            lambda r: r["notebooks"][0]["claims"][0].update(held="yes"),
            "at notebooks/0/claims/0/held: 'yes' is not of type 'boolean'",
        ),
        (lambda r: r.update(schema="course-utils/gpu-record/0"), "at schema:"),
    ],
    ids=["no-machine", "no-gpu", "status", "value", "held", "schema"],
)
def test_a_garbled_record_is_refused_with_one_line(tmp_path, capsys, change, message):
    record = copy.deepcopy(load_records(SAMPLES)[0])
    change(record)
    with pytest.raises(RecordError, match=re.escape(message)):
        validate_record(record)
    path = tmp_path / "gpu-record-x.json"
    path.write_text(json.dumps(record))
    assert main(["gpu-record", "--validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path} is not a valid GPU record")


def test_a_record_that_is_not_json_is_refused_with_one_line(tmp_path, capsys):
    path = tmp_path / "gpu-record-cut.json"
    path.write_text('{"schema": "course-utils/gpu-record/1", "machine": {')  # cut short
    assert main(["gpu-record", "--validate", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {path} is not a valid GPU record: not JSON")
    with pytest.raises(RecordError, match="not JSON"):
        load_records(tmp_path)


# --- shown: notebooks, report, website -----------------------------------------------------


def test_a_notebook_shows_the_recorded_figures_labelled_or_says_none_is_recorded(capsys):
    found = load_records(SAMPLES)
    blocks = records.recorded_gpu_figures("09", names=["tokens per second"], records=found)
    out = capsys.readouterr().out
    assert [len(figures) for _, figures in blocks] == [1, 1]
    assert "measured on an NVIDIA H200, driver 580.65.06" in out
    assert "GPT training: tokens per second (fp32): 512,000 tokens/s" in out
    assert "41,000 tokens/s" in out and "MFU" not in out
    assert records.recorded_gpu_figures("05", records=found) == []
    assert "No GPU record holds notebook 05's figures yet" in capsys.readouterr().out


def test_the_comparison_page_puts_every_recorded_gpu_side_by_side():
    page = comparison_page(load_records(SAMPLES))
    lesson = page[page.index("## Lesson 09") : page.index("## GPU claims")]
    rows = [line for line in lesson.splitlines() if line.startswith("| GPT")]
    assert rows == [
        "| GPT training: MFU (fp32) | 0.31 | 0.38 |",
        "| GPT training: tokens per second (fp32) | 512,000 tokens/s | 41,000 tokens/s |",
    ]
    assert "| SDPA kernel chosen by default | flash |  |" in lesson  # the T4 did not record it
    assert "## Lesson 06" not in page  # not run: nothing to compare
    assert "| (1) | 03 | finder's limit fits again | 0 | >= 1 | **no** |" in page
    assert "SAMPLE record, not a measurement: measured on a Tesla T4" in page
    assert "No GPU record ships with the course yet" in comparison_page([])


def test_the_report_shows_each_notebooks_recorded_gpu_figures(tmp_path):
    from course_utils.tooling.report import Measurement, NotebookResult, write_report

    cpu = [Measurement("GPT training: tokens per second (fp32)", 950.0, "tokens/s", "CPU")]
    results = [
        NotebookResult("notebooks/09_transformers_on_the_gpu.ipynb", "ok", 1.0, None, cpu),
        NotebookResult("notebooks/05_lightning.ipynb", "ok", 1.0, None, []),
    ]
    page = write_report(results, {}, tmp_path, load_records(SAMPLES)).read_text()
    row_09, row_05 = page.split("<tr class='ok'>")[1:]
    assert "measured on an NVIDIA H200" in row_09 and "512,000 tokens/s" in row_09
    assert "none recorded yet" in row_05


@pytest.mark.slow
def test_the_site_builds_the_gpu_comparison_page_from_the_records(tmp_path):
    pytest.importorskip("mkdocs")
    from course_utils.tooling.site import build_site

    notebooks = tmp_path / "notebooks"
    stand_in(notebooks, "01_tiny.ipynb", "x = 1")
    build_site(ROOT, notebooks, tmp_path / "site", None, load_records(SAMPLES))
    page = (tmp_path / "site" / "gpu-comparison.html").read_text(encoding="utf-8")
    assert "GPUs compared" in page and "512,000 tokens/s" in page and "41,000 tokens/s" in page
    assert "<table>" in page


# --- the device script ----------------------------------------------------------------------


def fake_gpu_python(folder: Path) -> Path:
    """A "python" whose ``-m course_utils`` sees a faked T4 (the device script's PY)."""
    harness = folder / "harness.py"
    harness.write_text(IMPORTS_OF_A_RUN)
    python = folder / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "course_utils" ]; then shift 2; '
        f'exec {sys.executable} {harness} "$@"; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return python


@pytest.mark.slow
def test_the_device_script_stops_with_one_line_without_a_gpu(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu-record-device.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **NO_GPU_ENV, "OUT": str(out), "PY": sys.executable},
    )
    assert done.returncode == 1
    assert "error: gpu-record needs a GPU this torch can use" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "missing.txt"]
    assert (out / "missing.txt").read_text() == "nothing\n"


@pytest.mark.slow
def test_the_device_script_brings_back_the_record_with_a_faked_gpu(tmp_path):
    notebooks = tmp_path / "notebooks"
    every_claim_holds = MEASURE_AND_CLAIM.replace("0.9, at_least", "1.2, at_least")
    stand_in(notebooks, "09_tiny.ipynb", every_claim_holds)
    python = fake_gpu_python(tmp_path)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "PY": str(python),
        "GPU_RECORD_NOTEBOOKS": str(notebooks),
        "GPU_RECORD_ARGS": "--no-tests --budget-s 300",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu-record-device.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    names = sorted(p.name for p in out.iterdir())
    assert len(names) <= 8 and all(p.is_file() for p in out.iterdir())  # the device's limits
    (record_name,) = [name for name in names if name.startswith("gpu-record-tesla-t4")]
    assert {"log.txt", "doctor.txt", "notebooks.tar.gz"} <= set(names)
    record = load_record(out / record_name)
    assert record["outcome"] == "passed" and record["notebooks"][0]["claims"][1]["held"]
