"""The GPU record in the shapes GPUs come in (review 2026-12-06, findings G1-G17): a Python
without Jupyter, Colab's environment, small GPUs and MIG slices, many GPUs, a copy of the
checkout without ``.git``, a slot that is cut short. Each environment is faked as it
really behaves: a module whose import fails, environment variables, a fake NVML."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_gpu_record import MEASURE_AND_CLAIM, fake_gpu_python, small_tests, stand_in
from test_gpu_review import T4, Driver

from course_utils import device, nvml
from course_utils.records import load_record
from course_utils.tooling import gpu_probes, gpu_record
from course_utils.tooling.gpu_probes import PROBES, Probe

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "gpu-record-device.sh"

# A Python whose IPython (and Jupyter) is not installed: the import fails as it does there
WITHOUT_IPYTHON = """
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("IPython", "ipykernel", "nbclient"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NotInstalled())
"""


def fake_gpu(monkeypatch, gpus) -> Driver:
    fake = Driver(gpus, 13000)
    monkeypatch.setattr(nvml, "_pynvml", fake)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(device, "_arch_flags", lambda: ["sm_75", "sm_80", "sm_90"])
    monkeypatch.setattr(device, "_counted", None, raising=False)
    monkeypatch.setattr("course_utils.workload._auto", None)
    for name in ("CUDA_VISIBLE_DEVICES", "COURSE_DEVICE", "COURSE_WORKLOAD", "COURSE_CLAIMS"):
        monkeypatch.delenv(name, raising=False)
    return fake


SMALL_GPU = {**T4, "name": "NVIDIA GeForce RTX 3070", "uuid": "GPU-3070", "cc": (8, 6),
             "memory_mib": (8192, 0)}  # fmt: skip


# --- G1: a Python without IPython -----------------------------------------------------------


@pytest.mark.slow
def test_g1_without_ipython_the_check_names_what_is_missing_instead_of_crashing():
    code = WITHOUT_IPYTHON + (
        "from course_utils.tooling.gpu_record import missing_packages\n"
        "from course_utils.claims import gpu_claim\n"
        "print(missing_packages())\n"
        "gpu_claim('x', 2.0, at_least=1.0, why='w', label='l')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-800:]
    listed, verdict = done.stdout.strip().splitlines()
    assert {"ipython", "ipykernel", "nbclient"} <= set(eval(listed))
    assert verdict.startswith("Claim held: x")  # a claim is printed without IPython


# --- G5 and G8: Colab's environment, a GPU under the full sizes' rule --------------------------


def test_g8_the_record_runs_the_sizes_the_workload_rule_picks_for_the_gpu(monkeypatch, tmp_path):
    fake_gpu(monkeypatch, [SMALL_GPU])
    assert gpu_record.workload_for(gpu_record.Settings(out=tmp_path)) == "cpu"  # 8 GiB < 12
    fake_gpu(monkeypatch, [T4])
    assert gpu_record.workload_for(gpu_record.Settings(out=tmp_path)) == "full"


def first_code_cell(notebook: Path) -> str:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return "".join(next(cell for cell in cells if cell["cell_type"] == "code")["source"])


@pytest.mark.slow
def test_g5_g8_on_colab_the_notebooks_setup_cells_pass_and_a_small_gpu_runs_cpu_sizes(
    monkeypatch, tmp_path
):
    fake_gpu(monkeypatch, [SMALL_GPU])
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20261201-060000_RC00")
    setup = first_code_cell(ROOT / "notebooks" / "01_runtime_and_devices.ipynb")
    measure = "import os\nfrom course_utils.measurements import record_measurement\n"
    measure += "record_measurement('workload', os.environ['COURSE_WORKLOAD'], label='here')"
    stand_in(tmp_path / "notebooks", "09_tiny.ipynb", setup, measure)
    settings = gpu_record.Settings(out=tmp_path / "out", notebooks=[tmp_path / "notebooks"],
                                   tests=None, probes=False, budget_s=300)  # fmt: skip
    _, record = gpu_record.gpu_record(settings, progress=open(os.devnull, "w"))  # noqa: SIM115
    (entry,) = record["notebooks"]
    assert entry["status"] == "ok", entry["error"]
    assert entry["measurements"][0]["value"] == "cpu" and record["settings"]["workload"] == "cpu"


# --- G6: a test module that imports what the GPU node lacks ---------------------------------


@pytest.mark.slow
def test_g6_a_test_module_that_cannot_be_imported_does_not_stop_the_gpu_tests(tmp_path):
    tests = small_tests(tmp_path / "tests")
    (tests / "test_translations.py").write_text("import babel_not_on_this_node\n")
    found = gpu_record.run_tests(tests, tmp_path, limit_s=120)
    assert found["status"] == "passed" and "1 passed" in found["summary"], found


# --- G11: Lightning trains on the GPU the course picked --------------------------------------


def test_g11_one_device_trains_on_the_gpu_pick_device_chose(monkeypatch):
    from course_utils import lightning

    seen = {}
    monkeypatch.setattr(lightning, "pick_device", lambda prefer=None: torch.device("cuda", 2))
    monkeypatch.setattr(lightning.pl, "Trainer", lambda **options: seen.update(options))
    lightning.make_trainer(max_steps=1, devices=1, precision="32-true", logger=False)
    assert seen["devices"] == [2]
    lightning.make_trainer(max_steps=1, devices=1, accelerator="cpu", logger=False)
    assert seen["devices"] == 1  # the CPU: unchanged


# --- G12: the multi-GPU notebook on many GPUs -------------------------------------------------


def test_g12_the_multi_gpu_notebook_gets_more_time_on_more_gpus(tmp_path):
    settings = gpu_record.Settings(out=tmp_path, notebook_timeout_s=900)
    six, nine = Path("06_multi_gpu.ipynb"), Path("09_transformers_on_the_gpu.ipynb")
    assert gpu_record.notebook_limit_s(six, settings, 8) == 3600
    assert gpu_record.notebook_limit_s(six, settings, 2) == 900
    assert gpu_record.notebook_limit_s(nine, settings, 8) == 900


# --- G13: a probe past its limit ------------------------------------------------------------


def test_g13_a_probe_past_its_limit_ends_its_process_and_the_rest_run_in_a_fresh_one(
    monkeypatch, tmp_path
):
    slow = Probe("slow", lambda d: time.sleep(5) or {}, "f", 0.2)
    fast = Probe("fast", lambda d: {"verdict": "held"}, "f", 5)
    entries = gpu_probes.run_probes([slow, fast], "cpu", 30)
    assert [(e["name"], e["status"]) for e in entries] == [("slow", "timeout")]

    child = (
        "import json, sys\n"
        "from course_utils.tooling.gpu_probes import PROBES, entry\n"
        "out, only = sys.argv[1], (sys.argv[2].split(',') if len(sys.argv) > 2 else None)\n"
        "probes = [p for p in PROBES if only is None or p.name in only]\n"
        "found = [entry(probes[0], 'ok' if only else 'timeout', 1.0)]\n"
        "found += [entry(p, 'ok', 1.0) for p in probes[1:] if only]\n"
        "json.dump(found, open(out, 'w'))\n"
    )
    calls = []

    def command(out, budget, only=()):
        calls.append(list(only))
        return [sys.executable, "-c", child, str(out), *([",".join(only)] if only else [])]

    monkeypatch.setattr(gpu_probes, "probe_command", command)
    entries = gpu_probes.probe_step(tmp_path / "probes.json", limit_s=60)
    assert [e["name"] for e in entries] == [p.name for p in PROBES]
    assert [e["status"] for e in entries] == ["timeout"] + ["ok"] * (len(PROBES) - 1)
    assert calls == [[], [p.name for p in PROBES[1:]]]
    assert json.loads((tmp_path / "probes.json").read_text()) == entries
    record = {"pytest": {"status": "passed"}, "probes": entries, "notebooks": []}
    assert gpu_record.failures(record) == []  # a probe's timeout is informative


# --- G14: a copy without .git ---------------------------------------------------------------


def test_g14_a_copy_without_git_names_the_commit_it_was_given(monkeypatch, tmp_path):
    commit = "26d162d" + "0" * 33
    monkeypatch.setenv("COURSE_COMMIT", commit)
    assert gpu_record.course_version(tmp_path)["commit"] == commit
    monkeypatch.delenv("COURSE_COMMIT")
    assert gpu_record.course_version(tmp_path, commit[:12])["commit"] == commit[:12]
    with pytest.raises(ValueError, match="not a git commit"):
        gpu_record.course_version(tmp_path, "main; rm -rf /")


# --- G17: MIG mode with no MIG device -------------------------------------------------------


def test_g17_mig_mode_without_a_mig_device_is_no_gpu_with_a_one_line_reason(monkeypatch):
    empty = {"name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-a100-0", "cc": (8, 0),
             "memory_mib": (81920, 0), "migs": []}  # fmt: skip
    fake_gpu(monkeypatch, [empty])
    assert device.cuda_gpu_count() == 0
    with pytest.raises(RuntimeError) as raised:
        gpu_record.require_gpu("gpu-record")
    message = str(raised.value)
    assert "\n" not in message and "MIG mode is on for GPU 0 (NVIDIA A100-SXM4-80GB)" in message


# --- G7: a slot cut short still brings the record back ----------------------------------------


@pytest.mark.slow
def test_g7_a_slot_killed_mid_run_still_leaves_the_record_in_out(tmp_path):
    notebooks = tmp_path / "notebooks"
    holds = MEASURE_AND_CLAIM.replace("0.9, at_least", "1.2, at_least")
    stand_in(notebooks, "09_tiny.ipynb", holds)
    stand_in(notebooks, "04_long.ipynb", "import time\ntime.sleep(600)")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "PY": str(fake_gpu_python(tmp_path)),
        "GPU_RECORD_NOTEBOOKS": str(notebooks),
        "GPU_RECORD_ARGS": "--no-tests --no-probes",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    script = subprocess.Popen(["bash", str(SCRIPT), "400"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # until 09 is recorded and 04 runs
            records = list(out.glob("gpu-record-*.json"))
            if records and load_record(records[0])["notebooks"]:
                break
            assert script.poll() is None, "the script ended before it was killed"
            time.sleep(2)
    finally:
        os.killpg(script.pid, signal.SIGKILL)  # as the device tool stops a command
        script.wait()
    (path,) = out.glob("gpu-record-*.json")
    record = load_record(path)
    assert record["outcome"] == "running" and record["notebooks"][0]["status"] == "ok"


# --- G2, G3, G4 and G14: prepare -------------------------------------------------------------


def test_g2_prepare_with_a_python_that_lacks_the_runner_stops_with_one_line(tmp_path):
    python = tmp_path / "python"  # a Python with no packages: the runner's versions unknown
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "PY": str(python), "WHEELS": str(tmp_path / "w")}
    done = subprocess.run(["bash", str(SCRIPT), "prepare"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: prepare copies the versions installed in") and "ipython" in line
    assert not list((tmp_path / "w").glob("*.whl"))


@pytest.mark.slow
def test_g3_g4_prepare_keeps_nvidia_ml_py_names_the_commit_and_fails_on_an_uncovered_python(
    tmp_path,
):
    wheels = tmp_path / "w"
    env = {**os.environ, "PY": sys.executable, "WHEELS": str(wheels),
           "GPU_PY_VERSIONS": "3.10 3.11"}  # fmt: skip
    done = subprocess.run(["bash", str(SCRIPT), "prepare", "nvidia-ml-py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=400, env=env)  # fmt: skip
    assert done.returncode == 1, done.stdout[-1500:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"error: {wheels} does not cover Python 3.10 (No matching ")
    assert "for ipython==" in last and "Python 3.11" not in last
    assert list(wheels.glob("nvidia_ml_py-*.whl")) and list(wheels.glob("ipython-*-py3-*.whl"))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert (wheels / "commit.txt").read_text().strip() == head.stdout.strip()


# --- G15: which build a GPU older than Turing needs -----------------------------------------


@pytest.mark.parametrize(
    ("name", "capability", "build"),
    [("Tesla V100-SXM2-16GB", (7, 0), "whl/cu128"), ("Tesla P100-PCIE-16GB", (6, 0), "whl/cu126")],
)
def test_g15_a_volta_gpu_is_sent_to_cu128_and_a_pascal_gpu_to_cu126(name, capability, build):
    hint = device._legacy_build_hint(capability)
    assert build in hint and hint.count("--index-url") == 1
    assert ("keep 7.0" in hint) == (capability == (7, 0))
