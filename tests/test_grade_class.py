"""grade-class: a folder of submissions graded in parallel into a gradebook, resumed when
interrupted; bad input to grade, grade-class and student is one line and exit 2."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from test_grader import _instructor

from course_utils.instructor.gradebook import find_submissions
from course_utils.instructor.student import student_version, write_notebook
from course_utils.tooling.cli import main


@pytest.fixture
def course(tmp_path: Path) -> tuple[Path, Path]:
    """Instructor notebooks (one with checks, one without) and a class of three."""
    source = tmp_path / "instructor"
    write_notebook(_instructor(), source / "01_ex.ipynb")
    lesson = _instructor()
    lesson.cells = lesson.cells[:2]
    write_notebook(lesson, source / "00_intro.ipynb")  # no checks: not graded
    klass = tmp_path / "class"
    write_notebook(_instructor(), klass / "alice" / "01_ex.ipynb")
    write_notebook(student_version(_instructor()), klass / "bob" / "01_ex.ipynb")
    write_notebook(_instructor(), klass / "bob" / "Untitled.ipynb")  # no such exercise
    (klass / "carol").mkdir()
    (klass / "carol" / "01_ex.ipynb").write_text('{"cells": [')  # broken JSON
    return source, klass


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_grade_class_in_parallel_then_resumes(course, tmp_path, capsys):
    source, klass = course
    out = tmp_path / "grades"
    args = ["grade-class", str(klass), "--source", str(source), "--out", str(out), "--jobs", "2"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert (
        "3 submission(s): 0 unchanged since the last run (kept), 3 to grade, 2 at a time"
        in captured.out
    )
    assert "alice  01_ex.ipynb  3/3" in captured.out and "bob  01_ex.ipynb  0/3" in captured.out
    assert "carol  01_ex.ipynb  not graded: " in captured.out
    assert "1 submission(s) could not be graded" in captured.err
    book = {row["learner"]: row for row in _rows(out / "gradebook.csv")}
    assert list(book) == ["alice", "bob", "carol"]
    assert (book["alice"]["01_ex.ipynb"], book["alice"]["total"], book["alice"]["max"]) == (
        "3",
        "3",
        "3",
    )
    assert book["bob"]["total"] == "0" and "Untitled.ipynb: skipped" in book["bob"]["notes"]
    assert "broken JSON" in book["carol"]["notes"] and "00_intro.ipynb" not in book["alice"]
    checks = _rows(out / "checks.csv")
    assert [(r["learner"], r["check"], r["points"]) for r in checks[:2]] == [
        ("alice", "t-double-check", "1"),
        ("alice", "t-greet-check", "2"),
    ]
    assert any("NotImplementedError" in r["reason"] for r in checks if r["learner"] == "bob")
    feedback = json.loads((out / "feedback" / "bob" / "01_ex.ipynb").read_text())
    assert feedback["cells"][0]["source"].startswith("**Grade: 0/3**")
    texts = ["".join(o.get("text", "")) for c in feedback["cells"] for o in c.get("outputs", [])]
    assert any("t-greet-check: 0/2 failed: not answered yet" in text for text in texts)
    assert "HIDDEN" not in json.dumps(feedback) and "double(-1)" not in json.dumps(feedback)

    # Resume: nothing changed, nothing regraded; then bob submits again.
    assert main(args) == 0
    assert "3 unchanged since the last run (kept), 0 to grade" in capsys.readouterr().out
    write_notebook(_instructor(), klass / "bob" / "01_ex.ipynb")
    (out / "results" / "alice" / "01_ex.json").unlink()  # as if interrupted before alice
    assert main(args) == 0
    out_text = capsys.readouterr().out
    assert "1 unchanged since the last run (kept), 2 to grade" in out_text
    assert "bob  01_ex.ipynb  3/3" in out_text and "alice  01_ex.ipynb  3/3" in out_text
    assert {row["learner"]: row["total"] for row in _rows(out / "gradebook.csv")} == {
        "alice": "3",
        "bob": "3",
        "carol": "0",
    }


def test_nbgrader_layout_is_found(tmp_path):
    for student in ("ann", "ben"):
        write_notebook(_instructor(), tmp_path / "submitted" / student / "ps1" / "01_ex.ipynb")
    (tmp_path / "submitted" / "ann" / "ps1" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n")  # the instructor's file
    found = find_submissions(tmp_path)
    assert {learner: [p.name for p in paths] for learner, paths in found.items()} == {
        "ann": ["01_ex.ipynb"],
        "ben": ["01_ex.ipynb"],
    }


@pytest.mark.slow
def test_grade_with_several_paths_unsandboxed_says_so_once(course, monkeypatch, capsys):
    import course_utils.instructor.gradebook as gradebook

    monkeypatch.setattr(gradebook, "_warned_unsandboxed", False)
    source, klass = course
    paths = [str(klass / name / "01_ex.ipynb") for name in ("alice", "bob")]
    args = ["grade", *paths, "--source", str(source), "--json", "--sandbox", "none", "--jobs", "1"]
    assert main(args) == 0
    captured = capsys.readouterr()
    reports = json.loads(captured.out)
    assert [(r["score"], r["max_score"], r["sandbox"]) for r in reports] == [
        (3, 3, "none"),
        (0, 3, "none"),
    ]
    assert captured.err.count("UNSANDBOXED") == 1


BAD_NOTEBOOKS = {
    "a JSON list": ("[1, 2, 3]", "its JSON is a list, not an object"),
    "no cells": ('{"metadata": {}, "nbformat": 4, "nbformat_minor": 5}', "no list of cells"),
    "broken JSON": ('{"cells": [', "broken JSON"),
}


@pytest.mark.parametrize("kind", list(BAD_NOTEBOOKS))
@pytest.mark.parametrize("command", ["grade", "grade-class", "student"])
def test_bad_notebooks_are_one_line_and_exit_2(command, kind, course, tmp_path, capsys):
    source, _ = course
    text, message = BAD_NOTEBOOKS[kind]
    bad = tmp_path / "bad" / "zed" / "01_ex.ipynb"
    bad.parent.mkdir(parents=True)
    bad.write_text(text)
    out = ["--out", str(tmp_path / "out")]
    if command == "grade":
        args = ["grade", str(bad), "--source", str(source / "01_ex.ipynb")]
    elif command == "student":
        args = ["student", str(bad), *out]
    else:  # a bad instructor notebook stops a class run; a bad submission does not
        (source / "01_ex.ipynb").write_text(text)
        args = ["grade-class", str(tmp_path / "bad"), "--source", str(source), *out]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["grade", "{sub}", "--cell-timeout", "-1"], "--cell-timeout must be a positive number"),
        (["grade", "{sub}", "--timeout", "nan"], "--timeout must be a positive number"),
        (["grade-class", "{klass}", "--cell-timeout", "0"], "--cell-timeout must be a positive"),
        (["grade-class", "{klass}", "--jobs", "0"], "--jobs must be at least 1"),
        (["grade-class", "{klass}", "--memory", "-2"], "--memory must be a positive number"),
        (["grade-class", "{missing}"], "no such folder"),
        (["grade-class", "{klass}", "--source", "{missing}"], "no such file or folder"),
        (["grade", "{missing}/01_ex.ipynb"], "no such file"),
        (["student", "{missing}"], "no such file or folder"),
        (["student", "{notes}"], "not a notebook"),
        (["grade", "{notes}"], "not a notebook: broken JSON"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args, message, course, tmp_path, capsys):
    source, klass = course
    names = {
        "sub": klass / "alice" / "01_ex.ipynb",
        "klass": klass,
        "missing": tmp_path / "missing",
        "notes": tmp_path / "notes.txt",
    }
    names["notes"].write_text("my notes, not a notebook")
    args = [arg.format(**names) for arg in args]
    if args[0] != "student" and "--source" not in args:
        args += ["--source", str(source)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


def test_a_long_tmpdir_gets_workers_that_need_no_socket_under_it(tmp_path, monkeypatch):
    """The fork server listens on a socket under TMPDIR (at most 107 bytes of path): with a
    long TMPDIR the workers are spawned instead ('AF_UNIX path too long' otherwise)."""
    import tempfile

    from course_utils.instructor.gradebook import _context

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("t" * 80)))
    assert _context().get_start_method() == "spawn"
