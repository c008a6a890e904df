"""A class run no submission can break (issue 33): the layout comes from the instructor's
files, links and paths out of a learner's folder are refused, a notebook handed in twice
is refused, bad notebooks are one row each, and no CSV cell is a spreadsheet formula."""

from __future__ import annotations

import csv
import json

from test_grader import _instructor

from course_utils.instructor import validation
from course_utils.instructor.gradebook import find_submissions, write_gradebook
from course_utils.instructor.similarity import SOLUTION, boilerplate, similar_pairs
from course_utils.instructor.student import read_notebook, write_notebook


def test_a_learner_folder_named_submitted_is_a_learner(tmp_path):
    for learner in ("ann", "submitted"):
        write_notebook(_instructor(), tmp_path / learner / "01_ex.ipynb")
    assert sorted(find_submissions(tmp_path)) == ["ann", "submitted"]


def test_links_paths_out_and_duplicates_are_refused_and_said(tmp_path):
    other = tmp_path / "instructor.ipynb"
    write_notebook(_instructor(), other)
    write_notebook(_instructor(), tmp_path / "class" / "ann" / "01_ex.ipynb")
    (tmp_path / "class" / "bob").mkdir(parents=True)
    (tmp_path / "class" / "bob" / "01_ex.ipynb").symlink_to(other)
    (tmp_path / "class" / "cat").symlink_to(tmp_path / "class" / "ann")
    write_notebook(_instructor(), tmp_path / "class" / "dan" / "01_ex.ipynb")
    write_notebook(_instructor(), tmp_path / "class" / "dan" / "copy" / "01_ex.ipynb")
    notes: dict[str, list[str]] = {}
    found = find_submissions(tmp_path / "class", notes)
    assert sorted(found) == ["ann"]
    assert "symbolic link" in notes["bob"][0]
    assert "link" in notes["cat"][0]
    assert "handed in 2 times" in notes["dan"][0]


def test_bad_notebooks_are_named_not_fatal(tmp_path):
    deep = tmp_path / "deep.ipynb"
    deep.write_text('{"cells": ' + "[" * 5000 + "]" * 5000 + "}")
    bad_meta = tmp_path / "meta.ipynb"
    notebook = json.loads(json.dumps(_instructor()))
    notebook["cells"][1]["metadata"]["nbgrader"] = "a string"
    bad_meta.write_text(json.dumps(notebook))
    assert "nested more than" in validation.problem(deep, tmp_path)
    assert "nbgrader metadata is not an object" in validation.problem(bad_meta, tmp_path)
    for path in (deep, bad_meta):
        try:
            read_notebook(path)
        except ValueError as error:  # InputError: one line, never a traceback
            assert str(path) in str(error)
        else:
            raise AssertionError(path)


def test_csv_cells_are_never_formulas_but_negative_numbers_stay(tmp_path):
    report = {
        "score": -1.5,
        "max_score": 3,
        "matched": [],
        "tampering": ["=cmd|' /C calc'!A0"],
        "checks": [
            {
                "grade_id": "@x",
                "points": -1.5,
                "max_points": 3,
                "reason": "+SUM(A1)",
                "matched": "\tx",
            }
        ],
    }
    result = {"learner": "=evil()", "notebook": "01.ipynb", "report": report}
    book, checks = write_gradebook(
        tmp_path, ["=evil()"], ["01.ipynb"], [result], {"=evil()": ["-note"]}
    )
    for path in (book, checks):
        for row in list(csv.reader(path.open()))[1:]:
            for value in row:
                assert not value.startswith(("=", "+", "@", "\t", "\r")), (path, value)
                assert not value.startswith("-") or validation._NUMBER.match(value), value
    rows = list(csv.DictReader(book.open()))
    assert rows[0]["01.ipynb"] == "-1.5" and rows[0]["learner"] == "'=evil()"


def test_similarity_sees_helper_cells_and_the_published_solution():
    reference = _instructor()
    given = {"01_ex.ipynb": boilerplate(reference)}
    gid = next(iter(given["01_ex.ipynb"]))
    solution = given["01_ex.ipynb"][gid].split("\n# -- the student")[0]
    copied = (
        "def helper(values):\n"
        + "".join(f"    total_{i} = sum(v * {i} for v in values if v > {i})\n" for i in range(6))
        + "    return total_0\n"
    )
    answers = {
        "ann": {"01_ex.ipynb": {gid: solution.replace("### BEGIN SOLUTION", "# mine")}},
        "bob": {"01_ex.ipynb": {"(all own code)": copied}},
        "cat": {"01_ex.ipynb": {"(all own code)": copied.replace("values", "xs")}},
    }
    first = similar_pairs(answers, given)
    assert first == similar_pairs(answers, given)  # deterministic
    assert any(p.learner_a == "ann" and p.learner_b == SOLUTION for p in first)
    assert any({p.learner_a, p.learner_b} == {"bob", "cat"} for p in first)
