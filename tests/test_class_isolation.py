"""One learner's input stays that learner's problem (issue 43): an identifier used as a
path writes nothing outside ``--out``, a name that is not UTF-8 or a bad zip member is a
note for its learner, and the rest of the class is graded. The grading itself is faked
here (``grade_submission``): what is tested is intake and output."""

from __future__ import annotations

import csv
import json
import os
import re
import zipfile
from pathlib import Path

import nbformat
import pytest
from test_grader import _instructor

from course_utils.instructor import gradebook
from course_utils.instructor.grading import CheckResult, GradeReport, _read_judge
from course_utils.instructor.intake import unpack_zip
from course_utils.instructor.paths import OutsideOutput, safe_name, under
from course_utils.instructor.similarity import OWN_CODE, RUNS_TEXT, runs_text, similar_pairs
from course_utils.instructor.student import read_notebook, write_notebook
from course_utils.tooling.cli import main


def _fake_grade(submission: Path, source: Path, **_: object) -> tuple[GradeReport, object]:
    """Every check passed, in no time: the feedback notebook is the submission itself."""
    notebook = read_notebook(submission)
    notebook.cells.insert(0, nbformat.v4.new_markdown_cell("summary"))
    checks = [
        CheckResult("t-double-check", 1, 1, True, ""),
        CheckResult("t-greet-check", 2, 2, True, ""),
    ]
    return GradeReport(str(submission), str(source), checks, 0.0), notebook


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gradebook, "grade_submission", _fake_grade)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _files(root: Path) -> set[Path]:
    return {path for path in root.rglob("*")}


@pytest.mark.parametrize(
    "identifier", ["../../x", "/abs", "a/b", "..", ".", "", "a\x00b", "a\nb", "-rf", ".hidden"]
)
def test_a_safe_name_is_one_plain_file_name_and_distinct(identifier):
    name = safe_name(identifier)
    assert name not in ("", ".", "..") and "/" not in name and "\x00" not in name
    assert name.isprintable() and not name.startswith((".", "-"))
    assert safe_name(identifier) == name  # stable across runs
    assert safe_name("alice") == "alice" and safe_name("José") == "José"


def test_distinct_identifiers_stay_distinct():
    identifiers = ["a/b", "a_b", "a\\b", "a b", "../../x", "x", "..", ".", ""]
    assert len({safe_name(i) for i in identifiers}) == len(identifiers)


def test_a_link_planted_in_the_output_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "bob").symlink_to(tmp_path)
    with pytest.raises(OutsideOutput):
        under(out, "results", "bob", "01_ex.json")
    assert under(out, "results", "../../bob", "01_ex.json").parent.parent == out / "results"


ROSTER = (
    "Student,ID,SIS User ID,SIS Login ID,Section\n"
    "    Points Possible,,,,\n"
    '"Lee, Ann",101,s-1,ann,A\n'
    '"Evil, Eve",102,s-2,../../x,A\n'
    '"Slash, Sam",103,s-3,{absolute},A\n'
    '"Dot, Dan",104,s-4,..,A\n'
)


@pytest.mark.slow
def test_a_roster_id_like_a_path_writes_nothing_outside_out(tmp_path, fake, capsys):
    source = tmp_path / "work" / "instructor"
    write_notebook(_instructor(), source / "01_ex.ipynb")
    archive = tmp_path / "work" / "submissions.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for user in (101, 102, 103, 104):
            write_notebook(_instructor(), tmp_path / "nb.ipynb")
            zipped.write(tmp_path / "nb.ipynb", f"learner_{user}_{9000 + user}_01_ex.ipynb")
    roster = tmp_path / "work" / "roster.csv"
    absolute = str(tmp_path / "abs")  # an absolute path, but one inside the test's folder
    roster.write_text(ROSTER.format(absolute=absolute), encoding="utf-8")
    out = tmp_path / "work" / "deep" / "out"
    out.mkdir(parents=True)
    before = _files(tmp_path) - _files(out)
    args = ["grade-class", str(archive), "--source", str(source), "--roster", str(roster),
            "--out", str(out), "--jobs", "1", "--sandbox", "none"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr()
    after = _files(tmp_path) - _files(out)
    assert after - before == set()  # nothing written outside --out
    assert not (tmp_path / "work" / "x").exists() and not (tmp_path / "abs").exists()
    book = {row["learner"]: row for row in _rows(out / "gradebook.csv")}
    assert {learner: row["total"] for learner, row in book.items()} == {
        "ann": "3",
        "../../x": "3",
        absolute: "3",
        "..": "3",
    }
    assert (out / "feedback" / "ann" / "01_ex.ipynb").is_file()
    for login in ("../../x", absolute, ".."):
        assert (out / "feedback" / safe_name(login) / "01_ex.html").is_file()
        assert (out / "results" / safe_name(login) / "01_ex.json").is_file()
    canvas = {row["SIS Login ID"]: row for row in _rows(out / "canvas.csv")[1:]}
    assert canvas["../../x"]["01_ex"] == "3"


@pytest.mark.slow
def test_names_that_are_not_utf8_are_a_note_for_their_learner(tmp_path, fake, capsys):
    source = tmp_path / "instructor"
    write_notebook(_instructor(), source / "01_ex.ipynb")
    klass = tmp_path / "class"
    write_notebook(_instructor(), klass / "alice" / "01_ex.ipynb")
    os.mkdir(os.fsencode(klass) + b"/caf\xe9")  # a folder whose name is not UTF-8
    write_notebook(_instructor(), Path(os.fsdecode(os.fsencode(klass) + b"/caf\xe9/01_ex.ipynb")))
    bad = os.fsencode(klass) + b"/alice/caf\xe9 01_ex.ipynb"  # a file's name, too
    Path(os.fsdecode(bad)).write_bytes((klass / "alice" / "01_ex.ipynb").read_bytes())
    out = tmp_path / "out"
    args = ["grade-class", str(klass), "--source", str(source), "--out", str(out),
            "--jobs", "1", "--sandbox", "none"]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    book = {row["learner"]: row for row in _rows(out / "gradebook.csv")}
    assert book["alice"]["total"] == "3"
    assert "caf? 01_ex.ipynb: refused: its name is not UTF-8" in book["alice"]["notes"]
    assert book["caf?"]["total"] == "3"  # graded, under its name as it can be shown
    assert "its folder's name is not UTF-8" in book["caf?"]["notes"]
    for name in ("checks.csv", "canvas.csv", "submissions.csv", "similarity.csv"):
        (out / name).read_text(encoding="utf-8")  # every file is UTF-8 text


@pytest.mark.slow
def test_a_canvas_file_name_that_is_not_utf8_is_a_note_for_its_learner(tmp_path, fake, capsys):
    source = tmp_path / "instructor"
    write_notebook(_instructor(), source / "01_ex.ipynb")
    flat = tmp_path / "download"
    write_notebook(_instructor(), flat / "leeann_101_9001_01_ex.ipynb")
    bad = os.fsencode(flat) + b"/roebob_102_9002_01_ex caf\xe9.ipynb"
    Path(os.fsdecode(bad)).write_bytes((flat / "leeann_101_9001_01_ex.ipynb").read_bytes())
    book = _graded_class(tmp_path, flat, source, capsys, ["Lee, Ann", "Roe, Bob"])
    assert book["ann"]["total"] == "3"
    assert (
        "roebob_102_9002_01_ex caf?.ipynb: refused: its name is not UTF-8" in book["bob"]["notes"]
    )


def _graded_class(
    tmp_path: Path, submissions: Path, source: Path, capsys, students: list[str]
) -> dict[str, dict[str, str]]:
    """Grade ``submissions`` with a roster of ``students`` ("Last, First", IDs 101, 102...,
    login IDs the first names in lower case); the gradebook's rows by login ID."""
    rows = "".join(
        f'"{name}",{101 + i},s-{i + 1},{name.split(", ")[1].lower()},A\n'
        for i, name in enumerate(students)
    )
    roster = tmp_path / "roster.csv"
    roster.write_text("Student,ID,SIS User ID,SIS Login ID,Section\n" + rows, encoding="utf-8")
    out = tmp_path / "out"
    args = ["grade-class", str(submissions), "--source", str(source), "--out", str(out),
            "--roster", str(roster), "--jobs", "1", "--sandbox", "none"]  # fmt: skip
    assert main(args) == 0
    assert "Traceback" not in capsys.readouterr().err
    return {row["learner"]: row for row in _rows(out / "gradebook.csv")}


def _lying_zip(path: Path, name: str, data: bytes, claimed: int) -> Path:
    """A zip whose member's headers (local and central) claim ``claimed`` bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr(name, data)
    raw = bytearray(path.read_bytes())
    size = len(data).to_bytes(4, "little")
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = raw.index(signature)
        assert raw[at + offset : at + offset + 4] == size
        raw[at + offset : at + offset + 4] = claimed.to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    return path


def test_a_member_whose_header_lies_is_a_note_and_the_rest_is_unpacked(tmp_path):
    archive = _lying_zip(tmp_path / "lie.zip", "a_1_2_x.ipynb", b"0" * 3_000_000, 1000)
    with zipfile.ZipFile(archive, "a") as zipped:
        zipped.writestr("b_3_4_x.ipynb", b"{}")
    assert zipfile.ZipFile(archive).getinfo("a_1_2_x.ipynb").file_size == 1000
    notes = unpack_zip(archive, tmp_path / "d")
    assert len(notes) == 1 and notes[0].startswith("a_1_2_x.ipynb: not graded: not unpacked (")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["b_3_4_x.ipynb"]


@pytest.mark.slow
def test_one_oversize_or_lying_zip_member_is_a_note_and_the_class_is_graded(
    tmp_path, fake, capsys, monkeypatch
):
    monkeypatch.setitem(unpack_zip.__kwdefaults__, "max_file_bytes", 2_000_000)
    source = tmp_path / "instructor"
    write_notebook(_instructor(), source / "01_ex.ipynb")
    write_notebook(_instructor(), tmp_path / "nb.ipynb")
    archive = _lying_zip(
        tmp_path / "sub.zip", "roebob_102_9002_01_ex.ipynb", b" " * 3_000_000, 2000
    )
    with zipfile.ZipFile(archive, "a", zipfile.ZIP_DEFLATED) as zipped:
        zipped.write(tmp_path / "nb.ipynb", "leeann_101_9001_01_ex.ipynb")
        zipped.writestr("doedan_103_9003_01_ex.ipynb", b" " * 5_000_000)  # a bomb, honest header
    book = _graded_class(tmp_path, archive, source, capsys, ["Lee, Ann", "Roe, Bob", "Doe, Dan"])
    assert book["ann"]["total"] == "3"
    assert book["bob"]["total"] == book["dan"]["total"] == "0"
    assert (
        "roebob_102_9002_01_ex.ipynb: not graded: not unpacked (it cannot be read"
        in (book["bob"]["notes"])
    )
    assert (
        "doedan_103_9003_01_ex.ipynb: not graded: not unpacked (it inflates past"
        in (book["dan"]["notes"])
    )


HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    "[click](javascript:alert(3))",
    '<a href="javascript:alert(4)">click</a>',
    "<iframe src=javascript:alert(5)></iframe>",
]


@pytest.mark.slow
def test_learner_html_is_inert_in_feedback_pages(tmp_path, fake, capsys):
    source = tmp_path / "instructor"
    write_notebook(_instructor(), source / "01_ex.ipynb")
    learner = _instructor()
    learner.cells.append(nbformat.v4.new_markdown_cell("\n\n".join(HOSTILE)))
    learner.cells.append(nbformat.v4.new_raw_cell(HOSTILE[0], metadata={"format": "text/html"}))
    html_output = nbformat.v4.new_output(
        "display_data", data={"text/html": "".join(HOSTILE), "text/plain": "x"}
    )
    stream = nbformat.v4.new_output("stream", name="stdout", text="".join(HOSTILE))
    learner.cells.append(
        nbformat.v4.new_code_cell(f"print({HOSTILE[0]!r})", outputs=[stream, html_output])
    )
    write_notebook(learner, tmp_path / "class" / "eve" / "01_ex.ipynb")
    out = tmp_path / "out"
    overrides = tmp_path / "overrides.csv"  # a page rendered again after the grading too
    overrides.write_text("learner,check,points,comment\neve,t-greet-check,1,<script>x</script>\n")
    for extra in ([], ["--overrides", str(overrides)]):
        args = ["grade-class", str(tmp_path / "class"), "--source", str(source), "--out",
                str(out), "--jobs", "1", "--sandbox", "none", *extra]  # fmt: skip
        assert main(args) == 0, capsys.readouterr()
        page = (out / "feedback" / "eve" / "01_ex.html").read_text(encoding="utf-8")
        assert "alert(1)" in page  # the learner's text is there, as text
        assert re.search(r"<script[^>]*>\s*(alert|x<)", page) is None
        assert re.search(r"<[a-z]+[^<>]*\son[a-z]+\s*=", page, re.IGNORECASE) is None
        assert (
            re.search(r"<[a-z]+[^<>]*(href|src)\s*=\s*[\"']?\s*javascript:", page, re.IGNORECASE)
            is None
        )
        assert "<iframe" not in page


HIDDEN = (
    "import base64\n"
    "exec(base64.b64decode('ZGVmIGRvdWJsZSh4KTogcmV0dXJuIDIgKiB4'))  # def double(x): ...\n"
)


def test_an_answer_that_runs_text_as_code_is_flagged_for_review():
    answers = {
        "eve": {"01_ex.ipynb": {"t-double": HIDDEN, OWN_CODE: HIDDEN + "\nx = 1\n"}},
        "mia": {"01_ex.ipynb": {"t-double": "m = torch.compile(model)\nmodel.eval()\n"}},
        "raj": {"01_ex.ipynb": {OWN_CODE: "f = __import__('mar' + 'shal').loads\n"}},
    }
    given = {"01_ex.ipynb": {"t-double": "def double(x):\n    return 2 * x\n"}}
    pairs = similar_pairs(answers, given)
    flagged = [(p.learner_a, p.exercise, p.shared_lines) for p in pairs if p.learner_b == RUNS_TEXT]
    assert flagged == [
        ("eve", "t-double", "import base64\n" + HIDDEN.splitlines()[1]),
        ("raj", OWN_CODE, "f = __import__('mar' + 'shal').loads"),
    ]  # eve once (her own code repeats the answer); torch.compile and .eval() are not flagged
    assert runs_text("%timeit eval(s)") == ["%timeit eval(s)"]
    assert runs_text("x = (") == [] and runs_text("compile(s, 'f', 'exec')  # ((") != []


def test_the_judges_lines_give_no_point_and_a_forged_one_is_a_flag():
    """The judge holds no key (issue 43): its lines are advice on time. A line that is not
    one of its kinds (a forged verdict, garbage) is a flag and no state; a cell's place only
    moves forward; a line after ``done`` is a forgery too."""
    read, write = os.pipe()
    lines = [
        json.dumps({"kind": "armed"}),
        "done",  # what a learner who finds the pipe may write
        json.dumps({"kind": "result", "nonce": "n1", "status": "completed"}),
        json.dumps({"kind": "at", "cell": "2"}),
        json.dumps({"kind": "at", "cell": "0"}),  # back to an earlier cell: ignored
        json.dumps({"kind": "done"}),
        json.dumps({"kind": "at", "cell": "3"}),  # after done: forged
    ]
    os.write(write, ("\n".join(lines) + "\n").encode())
    os.close(write)  # then the judge ends
    try:
        state = _read_judge(read, [5.0] * 4, 5.0, apart={"n1"})
    finally:
        os.close(read)
    assert state.armed and state.done and not state.timed_out
    assert state.at == 2 and state.results == {}
    assert state.flags == ["the notebook's code wrote forged messages to the grader's channel"]


class _Broken:
    def from_notebook_node(self, notebook: object) -> tuple[str, dict]:
        raise ValueError("<b>no</b> such template")


@pytest.mark.slow
def test_a_page_nbconvert_cannot_render_is_a_plain_page_not_a_stopped_run(
    tmp_path, fake, capsys, monkeypatch
):
    monkeypatch.setattr(gradebook, "_html_exporter", _Broken)
    source = tmp_path / "instructor"
    write_notebook(_instructor(), source / "01_ex.ipynb")
    write_notebook(_instructor(), tmp_path / "class" / "ann" / "01_ex.ipynb")
    out = tmp_path / "out"
    args = ["grade-class", str(tmp_path / "class"), "--source", str(source), "--out",
            str(out), "--jobs", "1", "--sandbox", "none"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr()
    page = (out / "feedback" / "ann" / "01_ex.html").read_text(encoding="utf-8")
    assert "could not be shown as a page (ValueError: &lt;b&gt;no&lt;/b&gt;" in page
    assert (out / "feedback" / "ann" / "01_ex.ipynb").is_file()


def test_a_page_is_inert_even_where_the_template_does_not_sanitize():
    """A full make test once rendered feedback pages through a template that did not clean
    (the cause not found): the notebook is cleaned before any template (SanitizeHTML), and
    a link that would run script is blocked after it."""
    exporter = gradebook._html_exporter.__wrapped__()  # a fresh one, not the cached one
    exporter.sanitize_html = False  # as if the template found had no sanitizing of its own
    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(nbformat.v4.new_markdown_cell("\n\n".join(HOSTILE)))
    page = gradebook._page(exporter, notebook)
    assert "alert(1)" in page and "click" in page  # the learner's text, as text
    assert re.search(r"<script[^>]*>\s*alert", page) is None
    assert re.search(r"<[a-z]+[^<>]*\son[a-z]+\s*=", page, re.IGNORECASE) is None
    assert re.search(r"(href|src)\s*=\s*[\"']?\s*javascript:", page, re.IGNORECASE) is None
    assert "<iframe" not in page
