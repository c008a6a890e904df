"""The grader's sandbox (bubblewrap): hostile submissions try to escape, each attempt fails
and the rest of the notebook is still graded.

These tests need bubblewrap. CI runs as root and installs it (.ci/run), so they skip only
where ``bwrap`` is missing and cannot be installed (not root); as root they fail instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import nbformat
import pytest
from test_grader import _instructor, _submit

from course_utils.instructor import sandbox
from course_utils.instructor.gradebook import find_sandbox
from course_utils.instructor.grading import KernelSettings, grade_submission
from course_utils.instructor.sandbox import Limits
from course_utils.instructor.student import write_notebook
from course_utils.units import GIB

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bwrap() -> None:
    if shutil.which("bwrap") is None:
        if os.geteuid() == 0:
            pytest.fail("bubblewrap is missing: .ci/run installs it (apt-get install bubblewrap)")
        pytest.skip("bubblewrap (bwrap) is not installed, and installing it needs root")
    assert sandbox.unavailable_reason() is None, sandbox.unavailable_reason()


def _hostile(attempts: list[str]) -> nbformat.NotebookNode:
    """The solved exercises, each attempt as a cell of its own before the first check."""
    notebook = _instructor()
    for offset, attempt in enumerate(attempts):
        notebook.cells.insert(2 + offset, nbformat.v4.new_code_cell(attempt))
    return notebook


def _errors(feedback: nbformat.NotebookNode) -> dict[str, str]:
    """The error each cell of the feedback notebook raised, by the cell's first line."""
    errors = {}
    for cell in feedback.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                errors[cell.source.splitlines()[0]] = output["ename"]
    return errors


@pytest.mark.slow
@pytest.mark.parametrize("user", ["own user id (root)", "user namespace"])
def test_escapes_fail_and_the_rest_is_graded(user, tmp_path, bwrap, monkeypatch):
    if user == "user namespace":  # how an instructor who is not root runs it
        monkeypatch.setattr(sandbox.Sandbox, "user_id", lambda self: None)
    elif os.geteuid() != 0:
        pytest.skip("switching to a user id of its own needs root")
    klass = tmp_path / "class"
    source = tmp_path / "instructor" / "source.ipynb"
    write_notebook(_instructor(), source)
    other = klass / "bob" / "sub.ipynb"
    write_notebook(_instructor(), other)
    canary = tmp_path / "canary.txt"
    canary.write_text("still here")
    written = tmp_path / "written-by-a-learner.txt"
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    solutions = sorted((ROOT / "notebooks").glob("*.ipynb"))[0]  # exists out here
    attempts = [
        f"# read another learner's submission\nprint(open({str(other)!r}).read()[:80])",
        f"# read the instructor's notebook\nprint(open({str(source)!r}).read()[:80])",
        f"# read the course's solutions\nprint(open({str(solutions)!r}).read()[:80])",
        f"# write outside scratch\nopen({str(written)!r}, 'w').write('pwned')",
        f"# delete outside scratch\nimport os\nos.remove({str(canary)!r})",
        f"# the network\nimport socket\nsocket.create_connection(('127.0.0.1', {port}), 3)",
        "# scratch is writable\nopen('notes.txt', 'w').write('mine')\n"
        "print(open('notes.txt').read())",
    ]
    learner = _submit(klass / "alice", _hostile(attempts))
    hidden = (str(klass), str(source.parent))
    box = sandbox.find("bwrap", hidden)
    report, feedback = grade_submission(learner, source, settings=KernelSettings(box))
    errors = _errors(feedback)
    assert errors == {
        "# read another learner's submission": "FileNotFoundError",
        "# read the instructor's notebook": "FileNotFoundError",
        "# read the course's solutions": "FileNotFoundError",
        "# write outside scratch": errors.get("# write outside scratch"),
        "# delete outside scratch": errors.get("# delete outside scratch"),
        "# the network": "ConnectionRefusedError",
    }, errors
    assert errors["# write outside scratch"] in ("FileNotFoundError", "PermissionError", "OSError")
    assert errors["# delete outside scratch"] in ("FileNotFoundError", "PermissionError", "OSError")
    assert canary.read_text() == "still here" and not written.exists()
    scratch = next(c for c in feedback.cells if c.source.startswith("# scratch"))
    assert scratch.outputs[0]["text"] == "mine\n"
    with pytest.raises(BlockingIOError):  # nobody ever connected
        server.accept()
    server.close()
    assert (report.score, report.max_score, report.sandbox) == (3, 3, "bwrap"), report.format()


@pytest.mark.slow
def test_memory_and_fork_bomb_hit_their_limits(tmp_path, bwrap):
    source = tmp_path / "source.ipynb"
    write_notebook(_instructor(), source)
    attempts = [
        "# memory\nhog = bytearray(3 * 1024**3)",
        "# fork bomb\nimport os, time\nchildren = 0\nwhile children < 400:\n"
        "    if os.fork() == 0:\n        time.sleep(300)\n        os._exit(0)\n"
        "    children += 1",
    ]
    learner = _submit(tmp_path / "alice", _hostile(attempts))
    box = sandbox.find("bwrap", (), Limits(memory_bytes=2 * GIB, processes=64))
    assert box is not None
    uid = box.user_id()
    report, feedback = grade_submission(learner, source, settings=KernelSettings(box))
    errors = _errors(feedback)
    assert errors == {"# memory": "MemoryError", "# fork bomb": "BlockingIOError"}, errors
    assert (report.score, report.max_score) == (3, 3), report.format()
    if uid is not None:  # every process the submission started dies with its sandbox
        deadline = time.monotonic() + 20  # the kernel kills them asynchronously
        while _processes_of(uid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_of(uid) == []


def _processes_of(uid: int) -> list[Path]:
    return [p for p in Path("/proc").glob("[0-9]*") if _uid(p) == uid]


def _uid(process: Path) -> int | None:
    try:
        return process.stat().st_uid
    except OSError:
        return None


def test_without_a_sandbox_grading_says_so_once(monkeypatch, capsys):
    import course_utils.instructor.gradebook as gradebook

    monkeypatch.setattr(gradebook, "_warned_unsandboxed", False)
    assert find_sandbox("none") is None and find_sandbox("none") is None
    err = capsys.readouterr().err
    assert err.count("UNSANDBOXED") == 1 and len(err.strip().splitlines()) == 1
    monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "bwrap is not installed")
    with pytest.raises(RuntimeError, match="bwrap is not installed"):
        sandbox.find("bwrap")
    assert sandbox.find("auto") is None


def test_hidden_paths_under_a_shown_folder_are_covered(tmp_path):
    (tmp_path / "shown" / "submissions").mkdir(parents=True)
    (tmp_path / "shown" / "solution.ipynb").write_text("{}")
    shown = str(tmp_path / "shown")
    hidden = (f"{shown}/submissions", f"{shown}/solution.ipynb", f"{shown}/not-yet", "/elsewhere")
    assert sandbox._hide(hidden, [(shown, "/inside")]) == [
        "--tmpfs",
        "/inside/submissions",
        "--ro-bind",
        "/dev/null",
        "/inside/solution.ipynb",
    ]


def test_a_checkout_under_tmp_stays_visible_above_the_private_tmp(tmp_path, monkeypatch):
    """The private /tmp is mounted before the read-only binds: a clone under /tmp (CI's,
    a learner's) keeps its .venv and package visible to the kernel. Mounted after them,
    it covered them and every sandboxed kernel died before it started."""
    venv = tmp_path / "clone" / ".venv"
    monkeypatch.setattr(sandbox, "_read_only_binds", lambda: [(str(venv), str(venv))])
    monkeypatch.setattr(sandbox.cgroups, "join_command", lambda limits: [])  # no group made
    control = tmp_path / "control"
    command = sandbox.Sandbox("bwrap").command(["true"], tmp_path / "scratch", control)
    tmpfs = command.index("/tmp", command.index("--tmpfs"))
    bind = command.index(str(venv))
    assert command[bind - 1] == "--ro-bind" and tmpfs < bind
    assert command.index("--bind") > tmpfs  # the control folder too
    scratch = command.index(str(tmp_path / "scratch"), command.index("--bind"))
    assert command[scratch - 1] == "--tmpfs" and scratch > tmpfs  # a capped tmpfs of its own


def test_groups_left_by_a_grader_that_ended_are_swept(tmp_path, monkeypatch):
    from course_utils.instructor import cgroups

    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    (tmp_path / "pids").mkdir()
    gone = tmp_path / "pids" / "course-grade-999999999-abcd"  # no such process
    alive = tmp_path / "pids" / f"course-grade-{os.getpid()}-abcd"
    gone.mkdir()
    alive.mkdir()
    assert cgroups.sweep() == 1 and not gone.exists() and alive.exists()


@pytest.mark.slow
def test_each_limit_hit_is_noted_and_no_other_grade_changes(tmp_path, bwrap):
    """A class run where one submission allocates past the memory cap, one fills its
    working folder, one writes a file past the size limit and one forks past the process
    limit: each is noted with the limit it hit, each still scores its solved checks (in
    the kernel and in the judge: the limits stop one cell, not the run), and the honest
    submission beside them scores in full with no note."""
    import io

    from course_utils.instructor.gradebook import Options, Task, grade_tasks

    source = tmp_path / "source" / "ex.ipynb"
    write_notebook(_instructor(), source)
    attempts = {
        "memory": "# memory\nhog = bytearray(3 * 1024**3)",
        "disk": "# disk\nchunk = b'x' * 2**20\nfor n in range(200):\n"
        "    with open(f'fill-{n}.bin', 'wb') as f:\n        f.write(chunk * 4)",
        "file-size": "# file size\nwith open('big.bin', 'wb') as f:\n"
        "    for _ in range(64):\n        f.write(b'x' * 2**20)",
        "processes": "# fork bomb\nimport os, time\nchildren = 0\nwhile children < 400:\n"
        "    if os.fork() == 0:\n        time.sleep(300)\n        os._exit(0)\n"
        "    children += 1",
        "honest": "# honest\nprint('fine')",
    }
    tasks = []
    for learner, attempt in attempts.items():
        path = _submit(tmp_path / "class" / learner, _hostile([attempt]))
        tasks.append(Task(learner, path.name, str(path), str(source)))
    limits = Limits(memory_bytes=2 * GIB, processes=64, file_bytes=32 * 2**20,
                    scratch_bytes=128 * 2**20)  # fmt: skip
    options = Options(sandbox="bwrap", limits=limits, jobs=2, threads=1)
    out = tmp_path / "out"
    results = grade_tasks(tasks, options, out, io.StringIO(), resume=False)
    reports = {t.learner: result.get("report") for t, result in zip(tasks, results, strict=True)}
    assert all(reports.values()), results
    for learner, report in reports.items():
        assert (report["score"], report["max_score"]) == (3, 3), (learner, report)
    said = {learner: " ".join(r["notes"]) for learner, r in reports.items()}
    assert "it ran out of memory (the sandbox's memory limit)" in said["memory"], said
    assert "it filled its working folder (the sandbox's disk limit)" in said["disk"], said
    assert "it wrote a file larger than the sandbox allows" in said["file-size"], said
    assert "process" in said["processes"] and "limit" in said["processes"], said
    assert "limit" not in said["honest"], said
    for learner in ("memory", "disk", "file-size"):  # one limit each, not the others'
        assert said[learner].count("the submission hit a limit") == 1, said
    assert {p.name for p in out.rglob("*") if p.is_file() and p.suffix == ".bin"} == set()
