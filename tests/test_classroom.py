"""Exercise format and student versions: every notebook's exercises follow the format, and
the student versions hide the answers but still run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from course_utils.checks.core import check, check_close, passed
from course_utils.feedback import CheckFailed
from course_utils.instructor.student import RAISES_TAG, nbgrader_role, student_version
from course_utils.spies import record_tensor_to
from course_utils.tooling.cli import main

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _solution_lines(notebook) -> list[str]:
    """The non-trivial lines between BEGIN and END SOLUTION markers."""
    lines: list[str] = []
    for cell in notebook.cells:
        inside = False
        for line in cell.source.splitlines():
            if "### BEGIN SOLUTION" in line:
                inside = True
            elif "### END SOLUTION" in line:
                inside = False
            elif inside and len(line.strip()) > 8:
                lines.append(line.strip())
    return lines


def _task_text(notebook) -> str:
    """The markdown of the instructor's notebook: an exercise's task may name a call its
    solution makes (e.g. ``step(batch_size)``); code cells, checks included, may not."""
    return "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")


def test_checks_give_the_feedback_they_were_given(capsys):
    check(True, "never shown")
    with pytest.raises(CheckFailed, match="left the labels on the CPU"):
        check(False, "your to_device left the labels on the CPU")
    with pytest.raises(AssertionError):  # nbgrader and nbval see an AssertionError
        check_close(1.0, 2.0, "the speed-up")
    passed("demo")
    assert "demo: all checks passed" in capsys.readouterr().out


def test_record_tensor_to_sees_how_each_tensor_was_moved():
    original = torch.Tensor.to
    x = torch.ones(3)
    with record_tensor_to() as moves:
        moved = x.to("cpu", non_blocking=True)
        x.to("cpu")
        x.to(torch.device("cpu"), torch.float64, True)  # positional non_blocking
        x.to(dtype=torch.float16)
    assert torch.equal(moved, x)  # the spy still runs the real call
    assert [m.non_blocking for m in moves] == [True, False, True, False]
    assert [m.source_device for m in moves] == ["cpu"] * 4
    assert not any(m.pinned for m in moves)  # nothing here is pinned
    assert moves[0].target == "cpu" and "float16" in moves[3].target
    assert torch.Tensor.to is original
    x.to("cpu", non_blocking=True)
    assert len(moves) == 4  # nothing recorded after the block


def test_record_tensor_to_restores_the_method_after_an_error():
    original = torch.Tensor.to
    with pytest.raises(RuntimeError), record_tensor_to():
        raise RuntimeError("the learner's code failed")
    assert torch.Tensor.to is original


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs a CUDA GPU")
def test_record_tensor_to_sees_pinned_sources():
    with record_tensor_to() as moves:
        torch.ones(4).pin_memory().to("cuda", non_blocking=True)
    assert moves[-1].pinned and moves[-1].non_blocking


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_uses_the_format(path):
    notebook = nbformat.read(path, as_version=4)
    roles = [(nbgrader_role(cell), cell) for cell in notebook.cells]
    solutions = [cell for role, cell in roles if role == "solution"]
    assert 2 <= len(solutions) <= 3 or "capstone" in path.name, "2 to 3 exercises"
    prefix = path.name[:2] + "-"
    for index, (role, cell) in enumerate(roles):
        if "### BEGIN SOLUTION" in cell.source:
            assert role == "solution", f"cell {index} has a solution but no nbgrader metadata"
        if role == "solution":
            meta = cell.metadata["nbgrader"]
            assert meta["grade_id"].startswith(prefix) and not meta["grade"]
            following = roles[index + 1]
            assert following[0] == "check", f"cell {index}: a check cell must follow"
        if role == "check":
            meta = cell.metadata["nbgrader"]
            assert meta["grade_id"].startswith(prefix) and meta["points"] > 0
            assert meta["locked"] and "passed(" in cell.source
            # check(...), check_close(...) or a check helper of the package (check_..._weights)
            assert re.search(r"\bcheck\w*\(", cell.source), f"cell {index} checks nothing"


def test_grade_ids_are_unique_across_the_course():
    ids = [
        cell.metadata["nbgrader"]["grade_id"]
        for path in NOTEBOOKS
        for cell in nbformat.read(path, as_version=4).cells
        if "nbgrader" in cell.metadata
    ]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_student_version_hides_solutions_and_hidden_checks(path):
    instructor = nbformat.read(path, as_version=4)
    student = student_version(instructor)
    text = json.dumps(student)
    assert _solution_lines(instructor), "the instructor notebook has solutions"
    task = _task_text(instructor)
    for line in _solution_lines(instructor):
        if line in task:
            continue  # the exercise's own text names it
        assert line not in text, f"solution text left in the student version: {line!r}"
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text
    assert instructor.cells[0].source == student.cells[0].source  # the badge
    assert [c.source for c in instructor.cells if "colab-setup" in c.metadata.get("tags", [])] == [
        c.source for c in student.cells if "colab-setup" in c.metadata.get("tags", [])
    ]
    assert len(student.cells) == len(instructor.cells)
    for cell in student.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
        if nbgrader_role(cell) == "solution" and cell.cell_type == "code":
            assert re.search(r"# YOUR CODE HERE\n\s*raise NotImplementedError\(\)", cell.source)
        if nbgrader_role(cell) is not None and cell.cell_type == "code":
            assert RAISES_TAG in cell.metadata["tags"]


@pytest.mark.slow
def test_student_command_writes_versions_that_run_under_nbval(tmp_path):
    out = tmp_path / "student"
    notebook = ROOT / "notebooks" / "01_runtime_and_devices.ipynb"
    assert main(["student", str(notebook), "--out", str(out)]) == 0
    written = out / notebook.name
    assert written.is_file()
    # nbval-lax: unanswered exercises raise NotImplementedError in their (tagged) check cells
    # and the notebook still passes; every other cell runs as in the instructor's notebook.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "--nbval-lax",
            str(written),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "COURSE_WORKLOAD": "small"},
    )
    assert result.returncode == 0, result.stdout[-3000:]
    executed = nbformat.read(written, as_version=4)  # nbval does not write outputs back
    assert all(cell.get("outputs", []) == [] for cell in executed.cells if cell.cell_type == "code")


def test_student_command_refuses_to_overwrite_the_instructor_notebooks(capsys):
    assert main(["student", str(ROOT / "notebooks"), "--out", str(ROOT / "notebooks")]) == 2
    assert "overwrite" in capsys.readouterr().err
