"""The GPU record: run the course on the GPU and PyTorch that are there, and keep the figures.

``python -m course_utils gpu-record --out DIR`` (and ``make gpu-lane``) works in any Python
that has torch and a GPU: it installs nothing and needs no network. First it checks, within
seconds, what it needs and stops with one line when something is missing (the packages
the course and the notebook runner import, with the ``pip install --no-index`` line that
adds them from a wheel folder; a GPU this torch can use: the doctor's ``--require-gpu``).
Then it runs the GPU probes (:mod:`course_utils.tooling.gpu_probes`: short checks of the GPU-only
mechanisms behind the course's findings, in a child process, about a minute), the
``gpu``/``multigpu`` tests (when pytest and the tests are there) and
every notebook at the ``full`` workload, most informative first (:data:`ORDER`), each
within its time limit and all within the run's budget. The record
(``DIR/gpu-record-<gpu>-<date>.json``, schema in ``course_utils/records/schema.json``)
is rewritten after every step, so a run that is killed still leaves a valid, partial
record.

GPU claims (:mod:`course_utils.claims`): the notebooks run with ``COURSE_CLAIMS=report``
so that a claim that does not hold is recorded and the notebook goes on to record the
rest of its figures; the run itself is strict: any claim that did not hold fails it
(exit status 1), with every measurement and verdict in the record.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO
from unittest import mock

import course_utils
from course_utils.records import SCHEMA_ID, Record, notebook_key, validate_record
from course_utils.tooling.gpu_probes import probe_step

# The order notebooks run in, most informative per GPU-minute first, so that a short slot
# (9 minutes) records what matters most: 09, 04, 03 and 08 hold the GPU-only checks the
# reviews predicted to fail (issue 31: SDPA kernels and fused AdamW, AMP on TF32 GPUs, the
# memory-capped batch finder, the capstone's rows) and the comparison's figures (tokens/s,
# MFU, largest batch, memory per technique); 02 and 01 are short and give MFU and speed-up;
# 07 the allocator; 05 wraps 03's and 04's loop in Lightning; 06 needs two GPUs for its
# claims (with two or more it runs second, after 09).
ORDER = ("09", "04", "03", "08", "02", "01", "07", "05", "06")
MULTI_GPU_NOTEBOOK = "06"

# Import name -> distribution: what the notebooks import (course-utils's own dependencies,
# pyproject.toml) and what runs them (the notebook runner). A test keeps these in step.
COURSE_IMPORTS = {
    "torch": "torch",
    "torchvision": "torchvision",
    "lightning": "lightning",
    "matplotlib": "matplotlib",
    "ipywidgets": "ipywidgets",
    "pynvml": "nvidia-ml-py",
    "psutil": "psutil",
    "tqdm": "tqdm",
    "numpy": "numpy",
    "tensorboard": "tensorboard",
}
RUNNER_IMPORTS = {
    "IPython": "ipython",
    "nbclient": "nbclient",
    "nbformat": "nbformat",
    "jupyter_client": "jupyter-client",
    "ipykernel": "ipykernel",
}
# Import names whose distribution is named otherwise (dependencies of the above).
DISTRIBUTIONS = {"zmq": "pyzmq", "yaml": "pyyaml", "dateutil": "python-dateutil"}
WHEEL_FOLDER = "WHEELS"  # in the pip line: the folder of wheels carried to the machine
MIN_NOTEBOOK_S = 30  # a notebook is not started with less time than this left
RESERVE_S = 5  # kept from the budget to write the record


@dataclass
class Settings:
    """What ``gpu-record`` runs and its time limits (seconds)."""

    out: Path
    notebooks: list[Path] = field(default_factory=lambda: [Path("notebooks")])
    tests: Path | None = Path("tests")  # None: no tests
    budget_s: float = 3600.0
    notebook_timeout_s: float = 900.0
    tests_timeout_s: float = 300.0
    probes: bool = True
    probes_timeout_s: float = 240.0
    # ``auto``: workload.workload()'s rule (full only on a GPU with FULL_MIN_GPU_MIB or
    # more: a 1g.5gb MIG slice or an 8 GB GPU runs the cpu sizes, review finding G8)
    workload: str = "auto"
    rehearse: bool = False  # no GPU needed: the whole pipeline, GPU-only steps skipped
    copy_to: Path | None = None  # where the record (and its files) is copied after each step
    commit: str | None = None  # the course's commit when ``out``'s checkout has no .git


# ------------------------------------------------------------------ checks, up front


def missing_packages() -> list[str]:
    """Distributions the record needs and this Python lacks (import names mapped to pip
    names), in a stable order; empty when nothing is missing. The runner is imported (it
    runs in this process); what the notebooks import is only looked up."""
    missing: list[str] = []
    for module, distribution in RUNNER_IMPORTS.items():
        try:
            importlib.import_module(module)
        except ImportError as error:  # the package, or one it needs
            name = (getattr(error, "name", None) or module).split(".")[0]
            missing.append(distribution if name == module else DISTRIBUTIONS.get(name, name))
    for module, distribution in COURSE_IMPORTS.items():
        if importlib.util.find_spec(module) is None:
            missing.append(distribution)
    return list(dict.fromkeys(missing))


def install_line(distributions: Sequence[str]) -> str:
    """The pip line that adds ``distributions`` from a folder of wheels, with no network."""
    return (
        f"{Path(sys.executable).name} -m pip install --no-index --find-links {WHEEL_FOLDER} "
        + " ".join(distributions)
    )


def require_gpu(what: str = "the GPU lane") -> None:
    """The doctor's ``--require-gpu``: ``RuntimeError`` (one line, the reason) unless this
    torch can use a GPU here. CUDA is not initialized."""
    from course_utils.device import cuda_gpu_count, no_gpu_reason  # lazy: imports torch

    if cuda_gpu_count() == 0:
        raise RuntimeError(f"{what} needs a GPU this torch can use; {no_gpu_reason()}")


def check_ready(rehearse: bool = False) -> None:
    """Everything ``gpu-record`` checks before it starts: the packages, then the GPU
    (not in a rehearsal). ``RuntimeError`` with one line naming what is missing."""
    missing = missing_packages()
    if missing:
        raise RuntimeError(
            f"gpu-record needs {', '.join(missing)}, which this Python ({sys.executable}) "
            f"lacks; add them from a folder of wheels, with no network: {install_line(missing)}"
        )
    if not rehearse:
        require_gpu("gpu-record")


# ------------------------------------------------------------------ the machine


REHEARSAL_GPU = "no GPU (a rehearsal)"  # the record's GPU in a rehearsal without one


def machine_in_report(report: dict[str, Any], rehearse: bool = False) -> dict[str, Any]:
    """The record's ``machine`` from the doctor's report (NVML: CUDA is not started here,
    so the notebooks' memory figures are not the recorder's). A rehearsal without a GPU
    names :data:`REHEARSAL_GPU` instead."""
    gpus = [
        {
            "index": gpu.get("index"),
            "name": gpu.get("name") or "unknown NVIDIA GPU",
            "uuid": gpu.get("uuid"),
            "memory_total_mib": gpu.get("memory_total_mib"),
            "compute_capability": gpu.get("compute_capability"),
            "mig": bool(gpu.get("mig_uuids")),
        }
        for gpu in report.get("gpus", [])
    ] or torch_gpus()
    if not gpus and rehearse:
        gpus = [{"index": None, "name": REHEARSAL_GPU, "uuid": None,
                 "memory_total_mib": None, "compute_capability": None, "mig": None}]  # fmt: skip
    return {
        "gpu_name": gpus[0]["name"] if gpus else "unknown NVIDIA GPU",
        "gpu_count": max(1, int(report.get("gpu_count") or len(gpus))),
        "gpus": gpus,
        "driver": report.get("driver"),
        "driver_cuda": report.get("driver_cuda"),
        "cuda": report.get("torch_cuda_build"),
        "cudnn": report.get("cudnn"),
        "torch": str(report.get("torch")),
        "python": platform.python_version(),
        "platform": str(report.get("platform") or platform.platform()),
        "cpu_cores": int(report.get("cpu_cores") or os.cpu_count() or 1),
        "environment": str(report.get("environment") or "script"),
    }


TORCH_GPUS = """
import json, torch
print(json.dumps([{"index": i, "name": p.name, "uuid": str(p.uuid),
    "memory_total_mib": p.total_memory // 2**20, "compute_capability": f"{p.major}.{p.minor}",
    "mig": None} for i, p in enumerate(map(torch.cuda.get_device_properties,
    range(torch.cuda.device_count())))]))
"""


def torch_gpus() -> list[dict[str, Any]]:
    """The GPUs as torch sees them, asked in a child process (no NVML binding here; CUDA
    stays unstarted in this one); [] if that fails."""
    with contextlib.suppress(Exception):
        done = subprocess.run(
            [sys.executable, "-c", TORCH_GPUS], capture_output=True, text=True, timeout=120
        )
        found: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
        return found
    return []


COMMIT_VAR = "COURSE_COMMIT"  # the commit of a copy without .git (the device script sets it)


def course_version(where: Path, commit: str | None = None) -> dict[str, Any]:
    """The course's commit (git, when ``where`` is in a checkout; else ``commit`` or
    ``$COURSE_COMMIT``, e.g. written by the device script's ``prepare`` into a copy
    carried without ``.git``) and the package version."""
    given = (commit or os.environ.get(COMMIT_VAR, "")).strip().lower()
    if given and not re.fullmatch(r"[0-9a-f]{7,40}", given):
        raise ValueError(f"--commit / ${COMMIT_VAR}: not a git commit: {given[:60]!r}")
    dirty = None
    commit = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if head.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", head.stdout.strip()):
            commit = head.stdout.strip()
            status = subprocess.run(
                ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"commit": commit or given or None, "dirty": dirty, "version": course_utils.__version__}


# ------------------------------------------------------------------ the run


def order_notebooks(paths: Sequence[Path], gpu_count: int = 1) -> list[Path]:
    """``paths`` in :data:`ORDER` (others after, by name); 06 second with 2+ GPUs."""
    order = list(ORDER)
    if gpu_count >= 2:
        order.remove(MULTI_GPU_NOTEBOOK)
        order.insert(1, MULTI_GPU_NOTEBOOK)
    rank = {key: position for position, key in enumerate(order)}
    return sorted(paths, key=lambda p: (rank.get(notebook_key(p.name), len(rank)), p.name))


def record_file_name(record: Record) -> str:
    """``gpu-record-nvidia-h200-x1-20261203-101500.json``."""
    gpu = re.sub(r"[^a-z0-9]+", "-", str(record["machine"]["gpu_name"]).lower()).strip("-")
    stamp = re.sub(r"[^0-9]", "", str(record["started"]))[:14]
    return f"gpu-record-{gpu}-x{record['machine']['gpu_count']}-{stamp[:8]}-{stamp[8:]}.json"


def write_record(record: Record, path: Path) -> None:
    """Validate and write ``record`` atomically (a kill leaves the previous version)."""
    validate_record(record, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(partial, path)


GPU_MARK = re.compile(r"\bmark\.(gpu|multigpu)\b")


def gpu_test_files(tests: Path) -> list[Path]:
    """The test modules under ``tests`` that mark a test ``gpu`` or ``multigpu``: only
    those are collected, so a module that imports what a GPU node lacks (the lock's
    ``babel``) does not stop the GPU tests (review finding G6)."""
    return sorted(
        path
        for path in tests.rglob("test_*.py")
        if GPU_MARK.search(path.read_text(encoding="utf-8", errors="replace"))
    )


def run_tests(tests: Path, out: Path, limit_s: float) -> dict[str, Any]:
    """The ``gpu``/``multigpu`` tests in a child pytest, strict claims; its summary line.
    Only the files that hold such tests are collected; a module that cannot be collected
    fails the step but the others still run."""
    if importlib.util.find_spec("pytest") is None:
        return {"status": "skipped", "summary": "pytest is not installed", "seconds": 0.0}
    if not tests.is_dir():
        return {"status": "skipped", "summary": f"no tests folder at {tests}", "seconds": 0.0}
    files = gpu_test_files(tests)
    if not files:
        return {"status": "no tests", "summary": f"no gpu tests under {tests}", "seconds": 0.0}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"]
    command += ["--continue-on-collection-errors", "-m", "gpu or multigpu", *map(str, files)]
    env = {**os.environ, "COURSE_CLAIMS": "strict", "COURSE_PROGRESS": "off"}
    start = time.monotonic()
    log = out / "pytest.txt"
    try:
        with log.open("w") as output:
            done = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, env=env, timeout=limit_s
            )
    except subprocess.TimeoutExpired:
        seconds = time.monotonic() - start
        return {
            "status": "timeout",
            "summary": f"stopped after {limit_s:.0f} s",
            "seconds": seconds,
        }
    seconds = time.monotonic() - start
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    summary = lines[-1] if lines else f"pytest exited {done.returncode}"
    status = {0: "passed", 5: "no tests"}.get(done.returncode, "failed")
    return {"status": status, "summary": summary[:300], "seconds": round(seconds, 2)}


@contextlib.contextmanager
def this_python_kernel() -> Any:
    """A Jupyter kernel spec that runs this Python, found before any other: a "python3"
    kernel spec elsewhere on the machine (an image's own Jupyter) may run another one."""
    with tempfile.TemporaryDirectory(prefix="gpu-record-kernel-") as folder:
        spec = Path(folder) / "kernels" / "course-gpu-record"
        spec.mkdir(parents=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        spec.joinpath("kernel.json").write_text(
            json.dumps({"argv": argv, "display_name": "gpu-record", "language": "python"})
        )
        path = os.pathsep.join(filter(None, [folder, os.environ.get("JUPYTER_PATH")]))
        with mock.patch.dict(os.environ, {"JUPYTER_PATH": path}):
            yield spec.name


def run_one_notebook(
    path: Path, out: Path, limit_s: float, kernel: str, progress: TextIO
) -> dict[str, Any]:
    """Run one notebook within ``limit_s``; its record entry (figures and verdicts)."""
    import nbformat  # lazy: the runner's packages, checked by check_ready() first

    from course_utils.claims import claims_in_notebook  # lazy: IPython (likewise)
    from course_utils.tooling.runner import run_notebook  # lazy: imports nbclient (likewise)

    deadline = time.monotonic() + limit_s
    result = run_notebook(
        path,
        out,
        cell_timeout_s=max(1, int(limit_s)),
        progress=progress,
        deadline=deadline,
        kernel_name=kernel,
        render=False,  # the record needs the figures, not web pages (nor nbconvert)
    )
    claims: list[dict[str, Any]] = []
    executed = out / path.name
    if executed.is_file():
        with contextlib.suppress(Exception):  # an unreadable copy: its figures are lost
            claims = [asdict(c) for c in claims_in_notebook(nbformat.read(executed, 4))]
    status = result.status
    if status == "failed" and time.monotonic() >= deadline - 1:
        status = "timeout"
    return {
        "notebook": path.name,
        "status": status,
        "seconds": round(result.seconds, 2),
        "error": result.error,
        "measurements": [asdict(m) for m in result.measurements],
        "claims": claims,
    }


def probes_summary(entries: Sequence[dict[str, Any]]) -> str:
    """``10 ok, 1 error, 1 timeout`` (statuses in the order first seen)."""
    counts: dict[str, int] = {}
    for found in entries:
        counts[found["status"]] = counts.get(found["status"], 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items()) or "none"


def failures(record: Record) -> list[str]:
    """Why a record's run failed, one short phrase each (empty: it passed)."""
    found = []
    if record["pytest"]["status"] in ("failed", "timeout"):
        found.append(f"gpu tests {record['pytest']['status']}: {record['pytest']['summary']}")
    found += [  # a probe past its limit is informative (a slow compile on 2 vCPUs): not here
        f"probe {probe['name']} {probe['status']}: {probe['error']}"
        for probe in record.get("probes", [])
        if probe["status"] == "error"
    ]
    for entry in record["notebooks"]:
        if entry["status"] != "ok":
            found.append(f"{entry['notebook']} {entry['status']}")
        found += [
            f"{entry['notebook']}: claim not held: {claim['name']}"
            for claim in entry["claims"]
            if not claim["held"]
        ]
    return found


def workload_for(settings: Settings) -> str:
    """The workload the notebooks run at: ``settings.workload``, ``auto`` resolved by
    :func:`course_utils.workload.workload` here, through NVML (CUDA is not started), so
    the record says which one ran and every kernel runs the same."""
    from course_utils import workload  # lazy: imports torch (checked first)

    with mock.patch.dict(os.environ, {workload.ENV_VAR: settings.workload}):
        return workload.workload()


def notebook_limit_s(notebook: Path, settings: Settings, gpu_count: int) -> float:
    """A notebook's time limit: ``settings.notebook_timeout_s``; the multi-GPU notebook
    measures DDP's scaling with one torchrun job per GPU count and repeat, so on more than
    two GPUs it gets that limit once per pair of GPUs (review finding G12)."""
    if notebook_key(notebook.name) == MULTI_GPU_NOTEBOOK and gpu_count > 2:
        return settings.notebook_timeout_s * gpu_count / 2
    return settings.notebook_timeout_s


# What the notebooks' kernels must not do: the setup cell installs the course on Colab
# (COLAB_RELEASE_TAG is in every process's environment there), but gpu-record runs the
# course it is part of (review finding G5).
KERNEL_SETUP = {"COURSE_SETUP": "skip"}
COPIED = ("doctor.txt", "probes.json", "pytest.txt")  # beside the record, when copied out


def copy_out(path: Path, to: Path | None) -> None:
    """Copy the record and the files beside it to ``to`` (a folder that comes back from
    a machine even when the run is killed: the device script's ``$OUT``)."""
    if to is None:
        return
    to.mkdir(parents=True, exist_ok=True)
    for source in (path, *(path.parent / name for name in COPIED)):
        if source.is_file():
            partial = to / (source.name + ".partial")
            partial.write_bytes(source.read_bytes())
            os.replace(partial, to / source.name)


def now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def gpu_record(
    settings: Settings,
    progress: TextIO = sys.stdout,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Path, Record]:
    """Check, then run the tests and notebooks and write the record after each step;
    return the record's path and the record (``outcome``: passed or failed)."""
    from course_utils.env import doctor, format_doctor  # lazy: imports torch (checked first)
    from course_utils.instructor.student import find_notebooks  # lazy: imports nbformat

    check_ready(settings.rehearse)
    if settings.rehearse:
        progress.write(
            "gpu-record --rehearse: the whole run without a GPU; skipped: the GPU check, "
            "the GPU probes (each says skipped: no GPU) and the GPU tests' GPU parts\n"
        )
    workload_name = workload_for(settings)
    start = clock()
    deadline = start + settings.budget_s
    notebooks = find_notebooks(settings.notebooks)  # FileNotFoundError: bad input
    settings.out.mkdir(parents=True, exist_ok=True)
    report = doctor()
    (settings.out / "doctor.txt").write_text(format_doctor(report) + "\n")
    found = machine_in_report(report, settings.rehearse)
    notebooks = order_notebooks(notebooks, found["gpu_count"])
    record: Record = {
        "schema": SCHEMA_ID,
        "sample": settings.rehearse,  # a rehearsal measures no GPU
        "outcome": "running",
        "failures": [],
        "started": now(),
        "finished": None,
        "wall_s": 0.0,
        "machine": found,
        "course": course_version(notebooks[0].parent, settings.commit),
        "settings": {
            "workload": workload_name,
            "workload_asked": settings.workload,
            "budget_s": settings.budget_s,
            "notebook_timeout_s": settings.notebook_timeout_s,
            "claims": "report in the notebooks (each verdict recorded); a claim not held "
            "fails the run",
            "order": [path.name for path in notebooks],
        },
        "doctor": json.loads(json.dumps(report, default=str)),
        "pytest": {"status": "not run", "summary": "", "seconds": 0.0},
        "probes": [],
        "notebooks": [],
    }
    if settings.rehearse:
        record["settings"]["rehearsal"] = "no GPU: the GPU check and GPU-only steps skipped"
    path = settings.out / record_file_name(record)

    def save() -> None:
        record["wall_s"] = round(clock() - start, 2)
        write_record(record, path)
        copy_out(path, settings.copy_to)

    save()
    progress.write(f"GPU record of {found['gpu_count']}x {found['gpu_name']}: {path}\n")
    if settings.probes:  # at most a quarter of the budget: the notebooks matter most
        limit = min(settings.probes_timeout_s, max(1.0, (deadline - clock()) / 4))
        progress.write(f"GPU probes (limit {limit:.0f} s) ...\n")
        progress.flush()
        record["probes"] = probe_step(settings.out / "probes.json", limit)
        progress.write(f"  probes: {probes_summary(record['probes'])}\n")
        save()
    if settings.tests is not None:
        limit = min(settings.tests_timeout_s, max(1.0, (deadline - clock()) / 3))
        progress.write(f"gpu/multigpu tests (limit {limit:.0f} s) ...\n")
        progress.flush()
        record["pytest"] = run_tests(settings.tests, settings.out, limit)
        progress.write(f"  tests: {record['pytest']['status']}: {record['pytest']['summary']}\n")
        save()
    # The kernels import the course_utils that records them (a checkout not installed too)
    package_root = str(Path(__file__).resolve().parents[2])
    python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    updates = {"COURSE_WORKLOAD": workload_name, "COURSE_CLAIMS": "report", **KERNEL_SETUP}
    updates |= {"COURSE_PROGRESS": "line", "PYTHONPATH": python_path, "MPLBACKEND": "Agg"}
    with this_python_kernel() as kernel, mock.patch.dict(os.environ, updates):
        for number, notebook in enumerate(notebooks, start=1):
            left = deadline - clock() - RESERVE_S
            head = f"[{number}/{len(notebooks)}] {notebook.name}"
            if left < MIN_NOTEBOOK_S:
                progress.write(f"{head}: not run ({left:.0f} s of the budget left)\n")
                entry: dict[str, Any] = {
                    "notebook": notebook.name, "status": "not run", "seconds": 0.0,
                    "error": f"not run: {max(0.0, left):.0f} s of the budget left",
                    "measurements": [], "claims": [],
                }  # fmt: skip
            else:
                limit = min(notebook_limit_s(notebook, settings, found["gpu_count"]), left)
                progress.write(f"{head} (limit {limit:.0f} s) ...\n")
                progress.flush()
                entry = run_one_notebook(
                    notebook, settings.out / "notebooks", limit, kernel, progress
                )
                held = sum(claim["held"] for claim in entry["claims"])
                progress.write(
                    f"{head}: {entry['status']} in {entry['seconds']:.1f} s, "
                    f"{len(entry['measurements'])} measurement(s), "
                    f"{held}/{len(entry['claims'])} claim(s) held\n"
                )
            record["notebooks"].append(entry)
            save()
    record["failures"] = failures(record)
    record["outcome"] = "failed" if record["failures"] else "passed"
    record["finished"] = now()
    save()
    return path, record


def summary(path: Path, record: Record) -> str:
    """One line on how the run went, for the end of the command's output."""
    entries = record["notebooks"]
    ran = sum(entry["status"] != "not run" for entry in entries)
    claims = [claim for entry in entries for claim in entry["claims"]]
    measured = sum(len(entry["measurements"]) for entry in entries)
    not_held = sum(not claim["held"] for claim in claims)
    return (
        f"record: {path} ({record['outcome']}: {ran} of {len(entries)} notebook(s) ran, "
        f"{measured} measurement(s), {len(claims)} claim(s), {not_held} not held)"
    )
