"""The GPU record rehearsed on this CPU machine as a lent GPU machine would run it (issue 41).

A fresh virtual environment holds what such a machine has: torch and torchvision, Lightning
and pytest, and no IPython, no Jupyter (the lent H100/H200 image; a cluster's container).
The checkout is copied without ``.git``. ``bash .ci/gpu-record-device.sh prepare`` makes the
wheel folder here (the registry: PyPI), then the device script runs in the copy with
``--rehearse`` exactly as there, installing with ``pip install --no-index`` from that folder
only, and must bring back a record that validates, names the commit and has every notebook
``ok`` (the small workload), within a slot that leaves a margin under the device tool's 600 s.

The torch is the lock's (a CUDA build, which runs on a CPU), linked into the fresh
environment with torchvision, Lightning and pytest and their dependencies: PyPI has no CPU
torchvision, and its torchvision does not import beside the CPU-only torch wheel
(``operator torchvision::nms does not exist``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from course_utils.records import load_record

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ".ci/gpu-record-device.sh"
SLOT_S = 540  # the device tool's 600 s, less the machine's own start and a margin
THE_MACHINES = ("torch", "torchvision", "lightning", "pytest", "pip")


def closure(names: tuple[str, ...]) -> set[str]:
    """``names`` and what they require here (markers evaluated, no extras), recursively."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def machine_python(folder: Path) -> Path:
    """A fresh venv whose packages are only :data:`THE_MACHINES` and their dependencies,
    linked from this Python's (one ``.pth`` line: a machine's own site folder)."""
    site = folder / "machine" / "site-packages"
    site.mkdir(parents=True)
    for name in closure(THE_MACHINES):
        for file in metadata.distribution(name).files or []:
            top = file.parts[0]
            source = Path(str(file.locate())).parents[len(file.parts) - 1] / top
            if top != ".." and not top.endswith(".pth") and not (site / top).exists():
                (site / top).symlink_to(source)
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (next(venv.glob("lib/python*/site-packages")) / "machine.pth").write_text(f"{site}\n")
    return venv / "bin" / "python"


def copy_without_git(folder: Path) -> Path:
    """The working tree's files that git tracks, without ``.git`` (as a lent machine gets)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source, target = ROOT / name, folder / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return folder


@pytest.mark.slow
@pytest.mark.rehearsal
def test_the_record_rehearsed_as_a_lent_machine_runs_it_passes_every_notebook(tmp_path):
    python = machine_python(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "PYTHON"))}
    lacks = subprocess.run(
        [str(python), "-c", "from course_utils.tooling.gpu_record import missing_packages as m; "
         "print(' '.join(m()))"], cwd=ROOT, capture_output=True, text=True, env=env, check=True,
    ).stdout.split()  # fmt: skip
    assert "ipython" in lacks and "torch" not in lacks and "lightning" not in lacks
    copy = copy_without_git(tmp_path / "course")
    wheels = copy / ".gpu-wheels"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    prepare = {**env, "WHEELS": str(wheels), "GPU_PY_VERSIONS": version}
    done = subprocess.run(["bash", SCRIPT, "prepare", *lacks], cwd=ROOT, env=prepare,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    out = tmp_path / "out"
    there = {**env, "OUT": str(out), "PY": str(python), "CUDA_VISIBLE_DEVICES": ""}
    start = time.monotonic()
    done = subprocess.run(["bash", SCRIPT, str(SLOT_S), "--rehearse"], cwd=copy, env=there,
                          capture_output=True, text=True, timeout=SLOT_S + 30)  # fmt: skip
    seconds = time.monotonic() - start
    log = (out / "log.txt").read_text() if (out / "log.txt").is_file() else done.stdout
    assert done.returncode == 0, log[-3000:]
    assert seconds < SLOT_S
    assert "adding them from" in log and "skipped" in log  # installed, GPU steps said skipped
    (path,) = out.glob("gpu-record-*.json")
    record = load_record(path)  # validates
    assert record["sample"] is True and "rehearsal" in record["settings"]
    commit = (wheels / "commit.txt").read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and record["course"]["commit"] == commit
    statuses = {entry["notebook"]: entry["status"] for entry in record["notebooks"]}
    assert len(statuses) == len(list((ROOT / "notebooks").glob("0*.ipynb")))
    assert set(statuses.values()) == {"ok"}, statuses
    assert record["outcome"] == "passed", record["failures"]
    assert {p.name for p in out.iterdir()} >= {"log.txt", "missing.txt", "notebooks.tar.gz"}
