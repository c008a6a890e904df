"""Exercise cells whose nbgrader metadata went missing are found by content and graded."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from test_grader import CHECK_B, _instructor, _scores, _submit, grade

from course_utils.instructor.matching import match_cells
from course_utils.instructor.student import student_version, write_notebook


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "source.ipynb"
    write_notebook(_instructor(), path)
    return path


def _strip(notebook, *indices):
    """The notebook with the nbgrader metadata of these cells (default: all) removed, as
    a learner who retypes a cell, or an editor that re-saves the notebook, leaves it."""
    for index, cell in enumerate(notebook.cells):
        if not indices or index in indices:
            cell.metadata.pop("nbgrader", None)
    return notebook


def _found(matches) -> dict[str, tuple[int, bool]]:
    return {gid: (match.index, bool(match.how)) for gid, match in matches.items()}


def test_every_cell_is_found_by_content_when_all_metadata_is_gone():
    matches = match_cells(_strip(_instructor()), _instructor())
    assert _found(matches) == {
        "t-double": (2, True),
        "t-double-check": (3, True),
        "t-greet": (4, True),
        "t-greet-check": (5, True),
    }
    assert "double" in matches["t-double"].how and "greet" in matches["t-greet"].how
    assert "like the check" in matches["t-greet-check"].how


def test_retyped_and_moved_cells_are_found_unrelated_ones_are_not():
    submission = _strip(student_version(_instructor()), 3, 4, 5)
    submission.cells[4].source = "def greet(who):\n    return 'hi ' + who"  # retyped answer
    submission.cells[5].source = CHECK_B.replace("passed('greet')", "passed( 'greet' )  # run")
    moved = submission.cells.pop(3)  # double's check, now at the end
    submission.cells.append(moved)
    submission.cells.insert(2, nbformat.v4.new_code_cell("print('my own experiment')"))
    matches = match_cells(submission, _instructor())
    found = _found(matches)
    assert found["t-double"] == (3, False)  # kept its grade_id
    assert found["t-greet"] == (4, True) and found["t-greet-check"] == (5, True)
    assert found["t-double-check"] == (6, True)  # elsewhere, but identical
    assert all(match.index != 2 for match in matches.values())


def test_a_cell_unlike_any_exercise_is_not_matched():
    submission = _strip(_instructor(), 4, 5)
    submission.cells[4].source = "def hello(name):\n    return 'hi ' + name"  # renamed
    submission.cells[5].source = "print(hello('ann'))"  # not the check
    submission.cells.insert(5, nbformat.v4.new_code_cell("x = 1"))  # two candidates now
    matches = match_cells(submission, _instructor())
    assert set(matches) == {"t-double", "t-double-check"}


@pytest.mark.slow
def test_a_notebook_without_any_metadata_gets_full_marks_and_the_matching_is_reported(
    tmp_path, source
):
    report = grade(_submit(tmp_path, _strip(_instructor())), source)
    assert (report.score, report.max_score) == (3, 3), report.format()
    assert len(report.matched) == 4 and all("cell" in line for line in report.matched)
    assert all(check.matched for check in report.checks)
    assert "found without grade_id: t-greet-check: cell 6, by its source" in report.format()


@pytest.mark.slow
def test_partial_loss_and_unmatched_checks_are_graded(tmp_path, source):
    submission = _strip(_instructor(), 5)  # greet's check lost its metadata only
    del submission.cells[3]  # double's check deleted
    submission.cells[4].source = "print('I deleted the check and wrote this')"
    report = grade(_submit(tmp_path, submission), source)
    scores = _scores(report)
    assert scores["t-double-check"][0] == 0
    assert scores["t-double-check"][1].startswith("cell missing")
    assert scores["t-greet-check"][0] == 0 and scores["t-greet-check"][1].startswith("cell m")
    # the same with greet's check retyped: found by content, graded, reported
    submission.cells[4].source = CHECK_B
    write_notebook(submission, tmp_path / "sub.ipynb")
    report = grade(tmp_path / "sub.ipynb", source)
    scores = _scores(report)
    assert scores["t-greet-check"] == (2, "") and scores["t-double-check"][0] == 0
    assert [line.split(":")[0] for line in report.matched] == ["t-greet-check"]


NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_course_exercises_are_found_in_a_student_copy_without_metadata(path):
    instructor = nbformat.read(path, as_version=4)
    expected = {
        cell.metadata["nbgrader"]["grade_id"]: index
        for index, cell in enumerate(instructor.cells)
        if "nbgrader" in cell.metadata
    }
    matches = match_cells(_strip(student_version(instructor)), instructor)
    assert {gid: match.index for gid, match in matches.items()} == expected
