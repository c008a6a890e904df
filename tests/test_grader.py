"""The grader: scores come from the instructor's checks, and no submission can hang it.

Small synthetic notebooks keep each grading run to a kernel start and a few cells; one test
grades notebook 01 itself, solved and unsolved.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from course_utils.instructor.grading import GradeReport, grade_submission
from course_utils.instructor.student import student_version, write_notebook
from course_utils.tooling.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _meta(grade_id: str, *, solution: bool, points: int = 1) -> dict:
    meta = {
        "grade": not solution,
        "grade_id": grade_id,
        "locked": not solution,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if not solution:
        meta["points"] = points
    return {"nbgrader": meta}


def _notebook(cells: list[tuple[str, str, dict]]) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    for kind, source, metadata in cells:
        maker = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
        notebook.cells.append(maker(source, metadata=metadata))
    return notebook


SOLUTION_A = "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"
CHECK_A = (
    "check(double(3) == 6, 'double(3) should be 6')\n"
    "### BEGIN HIDDEN TESTS\ncheck(double(-1) == -2, 'double(-1) should be -2')\n"
    "### END HIDDEN TESTS\npassed('double')"
)
SOLUTION_B = (
    "def greet(name):\n    ### BEGIN SOLUTION\n    return 'hi ' + name\n    ### END SOLUTION"
)
CHECK_B = "check(greet('ann') == 'hi ann', \"greet('ann') should be 'hi ann'\")\npassed('greet')"


def _instructor() -> nbformat.NotebookNode:
    return _notebook(
        [
            ("markdown", "# Synthetic exercises", {}),
            ("code", "from course_utils.checks.core import check, passed", {}),
            ("code", SOLUTION_A, _meta("t-double", solution=True)),
            ("code", CHECK_A, _meta("t-double-check", solution=False)),
            ("code", SOLUTION_B, _meta("t-greet", solution=True)),
            ("code", CHECK_B, _meta("t-greet-check", solution=False, points=2)),
        ]
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "source.ipynb"
    write_notebook(_instructor(), path)
    return path


def _submit(tmp_path: Path, notebook: nbformat.NotebookNode, name: str = "sub.ipynb") -> Path:
    path = tmp_path / name
    write_notebook(notebook, path)
    return path


def grade(submission: Path, source: Path, **limits: float) -> GradeReport:
    """The report of grading ``submission`` unsandboxed (test_sandbox covers the sandbox)."""
    return grade_submission(submission, source, **limits)[0]


def _scores(report) -> dict[str, tuple[float, str]]:
    return {check.grade_id: (check.points, check.reason) for check in report.checks}


@pytest.mark.slow
def test_checks_come_from_the_source_hidden_ones_included(tmp_path, source):
    submission = student_version(_instructor())  # its check A has no hidden part
    submission.cells[2].source = "def double(x):\n    return 6 if x == 3 else 0"  # gamed
    submission.cells[5].source = "pass  # the learner 'edited the check away'"
    report = grade(_submit(tmp_path, submission), source)
    scores = _scores(report)
    assert scores["t-double-check"] == (0, "double(-1) should be -2")  # the hidden check
    assert scores["t-greet-check"][0] == 0  # greet is unanswered; the real check ran
    assert "NotImplementedError" in scores["t-greet-check"][1]
    assert (report.score, report.max_score) == (0, 3)


@pytest.mark.slow
def test_broken_submission_gets_a_score_and_reasons(tmp_path, source):
    submission = _instructor()
    submission.cells[2].source = "import os\nos._exit(1)"  # the solution kills the kernel
    submission.cells.insert(4, nbformat.v4.new_code_cell("while True:\n    pass"))  # hangs
    submission.cells.insert(5, nbformat.v4.new_code_cell("import sys\nsys.exit(3)"))
    submission.cells.insert(6, nbformat.v4.new_code_cell("1 / 0"))  # a plain error
    report = grade(_submit(tmp_path, submission), source, cell_timeout_s=3)
    scores = _scores(report)
    # cell 3 (after the killed kernel): double is undefined; greet still passes
    assert scores["t-double-check"][0] == 0
    assert "NameError" in scores["t-double-check"][1]
    assert (
        "your solution cell above failed first: it killed the kernel"
        in (scores["t-double-check"][1])
    )
    assert scores["t-greet-check"] == (2, "")
    assert any("killed the kernel" in note for note in report.notes)
    assert any("timed out" in note for note in report.notes)


@pytest.mark.slow
def test_deleted_check_and_whole_run_limit(tmp_path, source):
    submission = _instructor()
    del submission.cells[5]  # greet's check
    submission.cells.insert(3, nbformat.v4.new_code_cell("import time\ntime.sleep(60)"))
    report = grade(_submit(tmp_path, submission), source, cell_timeout_s=30, total_timeout_s=4)
    scores = _scores(report)
    assert scores["t-greet-check"][0] == 0
    assert scores["t-greet-check"][1].startswith("cell missing: deleted from the submission")
    assert scores["t-double-check"][0] == 0
    assert scores["t-double-check"][1].startswith("not run")
    assert report.seconds < 20


@pytest.mark.slow
def test_grade_command_scores_a_solved_notebook_in_json(tmp_path, source, capsys):
    submission = _submit(tmp_path, _instructor())
    assert main(["grade", str(submission), "--source", str(source), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["score"], result["max_score"]) == (3, 3)
    assert all(check["passed"] and not check["reason"] for check in result["checks"])
    assert [c["grade_id"] for c in result["checks"]] == ["t-double-check", "t-greet-check"]


def test_grade_command_rejects_a_file_that_is_not_a_notebook(tmp_path, source, capsys):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("not json")
    assert main(["grade", str(bad), "--source", str(source)]) == 2  # bad input: exit 2
    assert capsys.readouterr().err.startswith("error:")
    assert main(["grade", str(tmp_path / "nope.ipynb")]) == 2  # no instructor notebook


@pytest.mark.slow
def test_notebook_01_unsolved_fails_each_check_as_not_answered(tmp_path):
    # The solved notebook 01 passes all its checks under nbval (make test runs it).
    instructor = ROOT / "notebooks" / "01_runtime_and_devices.ipynb"
    student = _submit(
        tmp_path, student_version(nbformat.read(instructor, as_version=4)), instructor.name
    )
    unsolved = grade(student, instructor)
    assert unsolved.max_score == 3 and unsolved.score == 0, unsolved.format()
    assert all("NotImplementedError" in check.reason for check in unsolved.checks)
    assert "total" in unsolved.format() and "0/3" in unsolved.format()
