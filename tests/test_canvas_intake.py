"""Canvas in and out: the submissions download (zip or unpacked) graded as it is, files
matched by name loosely, a notebook that matches nothing reported and never scored 0,
hostile zips refused; overrides and late penalties in every output."""

from __future__ import annotations

import contextlib
import csv
import json
import shutil
import stat
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import pytest
from test_grader import _instructor

from course_utils.instructor.adjust import LatePolicy, adjust, days_late, late_policy
from course_utils.instructor.intake import collect, match_notebook, unpack_zip
from course_utils.instructor.student import InputError, student_version, write_notebook
from course_utils.tooling.cli import main

NOTEBOOKS = ["01_runtime_and_devices.ipynb", "03_data_loading.ipynb", "03_data_loading_extra.ipynb"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("03_data_loading.ipynb", "03_data_loading.ipynb"),
        ("03_data_loading-1.ipynb", "03_data_loading.ipynb"),  # Canvas's resubmission
        ("03_data_loading (1).ipynb", "03_data_loading.ipynb"),  # a browser's copy
        ("03_Data_Loading (2)-1.ipynb", "03_data_loading.ipynb"),
        ("Copy of 01_runtime_and_devices.ipynb", "01_runtime_and_devices.ipynb"),  # Colab
        ("alice_01_runtime_and_devices.ipynb", "01_runtime_and_devices.ipynb"),
        ("3 data loading - José.ipynb", "03_data_loading.ipynb"),
        ("03_data_loading_extra (1).ipynb", "03_data_loading_extra.ipynb"),  # the longer one
        ("Untitled.ipynb", None),
        ("02_nvidia_smi.ipynb", None),
    ],
)
def test_file_names_are_matched_loosely(name, expected):
    assert match_notebook(name, NOTEBOOKS)[0] == expected


def test_two_notebooks_equally_like_a_name_match_neither():
    notebook, why = match_notebook("lab.ipynb", ["lab_a.ipynb", "lab_b.ipynb", "x.ipynb"])
    assert notebook is None and "no instructor notebook" in why
    notebook, why = match_notebook("a b c.ipynb", ["a_b.ipynb", "b_c.ipynb"])
    assert notebook is None and "several" in why


def _zip(path: Path, members: dict[str, bytes], links: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zipped.writestr(info, "/etc/passwd")
    return path


def test_a_hostile_zip_writes_only_notebooks_inside_the_folder(tmp_path):
    archive = _zip(
        tmp_path / "sub.zip",
        {
            "../escape.ipynb": b"{}",
            "/abs/path.ipynb": b"{}",
            "a/../../up.ipynb": b"{}",
            "C:\\win.ipynb": b"{}",
            "report.pdf": b"%PDF",
            "ann_1_2_01_x.ipynb": b"{}",
            ".hidden.ipynb": b"{}",
            "ANN_1_2_01_X.ipynb": b"{}",
        },
        links=("bob_3_4_link.ipynb",),
    )
    dest = tmp_path / "out" / "download"
    notes = unpack_zip(archive, dest)
    assert sorted(p.name for p in dest.rglob("*") if p.is_file()) == ["ann_1_2_01_x.ipynb"]
    assert not (tmp_path / "escape.ipynb").exists() and not (tmp_path / "out" / "up.ipynb").exists()
    said = "\n".join(notes)
    for name in ("../escape.ipynb", "/abs/path.ipynb", "a/../../up.ipynb", "C:\\win.ipynb"):
        assert f"{name}: refused (a path outside the folder)" in said
    assert "bob_3_4_link.ipynb: refused (a symbolic link)" in said
    assert "report.pdf: ignored (not a notebook)" in said
    assert "ANN_1_2_01_X.ipynb: ignored (a second file of that name)" in said


def test_a_zip_bomb_is_refused_by_the_bytes_it_inflates_to(tmp_path):
    archive = _zip(tmp_path / "bomb.zip", {"a_1_2_x.ipynb": b"0" * 5_000_000})
    assert archive.stat().st_size < 50_000
    notes = unpack_zip(archive, tmp_path / "d", max_file_bytes=1_000_000)  # one member: a note
    assert notes == ["a_1_2_x.ipynb: not graded: not unpacked (it inflates past 0.954 MiB, "
                     "the cap for one file: a zip bomb, or not a notebook)"]  # fmt: skip
    assert not list((tmp_path / "d").iterdir())
    archive = _zip(tmp_path / "many.zip", {f"a_1_{n}_x{n}.ipynb": b"0" * 600 for n in range(3)})
    with pytest.raises(InputError, match="the whole download"):
        unpack_zip(archive, tmp_path / "d", max_total_bytes=1_000)
    with pytest.raises(InputError, match="has 3 files, more than 2"):
        unpack_zip(archive, tmp_path / "d", max_members=2)
    (tmp_path / "fake.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(InputError):
        collect(tmp_path / "fake.zip", ["x.ipynb"], tmp_path / "d")


ROSTER = (
    "Student,ID,SIS User ID,SIS Login ID,Section,01_ex (5501)\n"
    "    Points Possible,,,,,3\n"
    '"Lee, Ann",101,s-1,ann,Lab A,\n'
    '"Roe, Bob",102,s-2,bob,Lab A,\n'
    '"Núñez, José",103,s-3,jose,Lab B,\n'
    '"Doe, Dan",104,s-4,dan,Lab B,\n'
)


def _bob() -> object:
    """double right (1 point), greet unanswered (0 of 2)."""
    notebook = student_version(_instructor())
    notebook.cells[2].source = "def double(x):\n    return 2 * x"
    return notebook


@pytest.fixture
def download(tmp_path: Path) -> dict[str, Path]:
    """Canvas's download of a one-notebook assignment, and the same class as folders."""
    source = tmp_path / "instructor"
    write_notebook(_instructor(), source / "01_ex.ipynb")
    files = tmp_path / "files"
    handed = {  # Canvas's name -> (login, notebook)
        "leeann_101_9001_01_ex.ipynb": ("ann", _instructor()),
        "roebob_late_102_9002_01_ex-1.ipynb": ("bob", _bob()),
        "nunezjose_103_9003_01_EX (1).ipynb": ("jose", _instructor()),
        "doedan_104_9004_Untitled.ipynb": ("dan", _instructor()),
    }
    members = {}
    folders = tmp_path / "folders"
    for name, (login, notebook) in handed.items():
        write_notebook(notebook, files / name)
        members[name] = (files / name).read_bytes()
        (folders / login).mkdir(parents=True)  # the same, as a folder per login
        plain = "Untitled.ipynb" if login == "dan" else "01_ex.ipynb"
        shutil.copy(files / name, folders / login / plain)
    members["roebob_late_102_9002_notes.pdf"] = b"%PDF-1.4"
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    archive = _zip(tmp_path / "submissions.zip", members)
    return {"source": source, "zip": archive, "folders": folders, "roster": roster}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_canvas_download_grades_as_the_folder_layout_and_never_scores_unmatched_zero(
    download, tmp_path, capsys
):
    common = [
        "--source",
        str(download["source"]),
        "--roster",
        str(download["roster"]),
        "--jobs",
        "2",
        "--sandbox",
        "none",
    ]
    by_zip, by_folder = tmp_path / "by_zip", tmp_path / "by_folder"
    assert main(["grade-class", str(download["zip"]), "--out", str(by_zip), *common]) == 3
    captured = capsys.readouterr()
    assert "NOT MATCHED: dan  Untitled.ipynb: handed in" in captured.out
    assert "roebob_late_102_9002_notes.pdf: ignored (not a notebook)" in captured.out
    assert "1 notebook(s) handed in were matched to no instructor notebook" in captured.err
    assert main(["grade-class", str(download["folders"]), "--out", str(by_folder), *common]) == 3
    capsys.readouterr()
    for name in ("gradebook.csv", "checks.csv", "canvas.csv"):
        assert (by_zip / name).read_text() == (by_folder / name).read_text(), name
    book = {row["learner"]: row for row in _rows(by_zip / "gradebook.csv")}
    assert [book[n]["01_ex.ipynb"] for n in ("ann", "bob", "dan", "jose")] == ["3", "1", "", "3"]
    assert book["dan"]["unmatched"] and book["dan"]["missing"] == ""
    with (by_zip / "canvas.csv").open(newline="") as handle:
        canvas = list(csv.reader(handle))
    assert canvas[0][5] == "01_ex (5501)"
    points = {row[3]: row[5] for row in canvas[2:]}
    assert points == {"ann": "3", "bob": "1", "dan": "", "jose": "3"}
    assert {row[1] for row in canvas[2:]} == {"101", "102", "103", "104"}
    handed = {(r["learner"], r["file"]): r for r in _rows(by_zip / "submissions.csv")}
    assert handed[("bob", "roebob_late_102_9002_01_ex-1.ipynb")]["late"] == "late"
    assert handed[("jose", "nunezjose_103_9003_01_EX (1).ipynb")]["how"] == "name matched loosely"
    assert (by_zip / "feedback" / "jose" / "01_ex.html").is_file()

    # The unpacked download is the same download: every result is kept, same gradebook.
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(download["zip"]) as zipped:
        zipped.extractall(unpacked)
    assert main(["grade-class", str(unpacked), "--out", str(by_zip), *common]) == 3
    assert "3 unchanged since the last run (kept), 0 to grade" in capsys.readouterr().out
    assert (by_zip / "gradebook.csv").read_text() == (by_folder / "gradebook.csv").read_text()

    # The instructor's word, without grading again: an override and Canvas's _late marker.
    overrides = tmp_path / "overrides.csv"
    overrides.write_text(
        "learner,check,points,comment\nann,t-greet-check,1,greets with a typo: half marks\n"
    )
    adjusted = [*common, "--overrides", str(overrides), "--late-penalty", "10%/day"]
    assert main(["grade-class", str(download["zip"]), "--out", str(by_zip), *adjusted]) == 3
    assert "0 to grade" in capsys.readouterr().out
    book = {row["learner"]: row for row in _rows(by_zip / "gradebook.csv")}
    assert (book["ann"]["01_ex.ipynb"], book["bob"]["01_ex.ipynb"]) == ("2", "0.7")
    assert book["bob"]["late"] == "01_ex.ipynb: 1 day late: -0.3"
    checks = {(r["learner"], r["check"]): r for r in _rows(by_zip / "checks.csv")}
    assert checks[("ann", "t-greet-check")]["points"] == "1"
    assert checks[("ann", "t-greet-check")]["reason"].startswith("instructor: greets with a typo")
    assert checks[("bob", "late-penalty")]["points"] == "-0.3"
    feedback = json.loads((by_zip / "feedback" / "ann" / "01_ex.ipynb").read_text())
    assert feedback["cells"][0]["source"].startswith("**Grade: 2/3**")
    assert "greets with a typo" in json.dumps(feedback)
    assert "greets with a typo" in (by_zip / "feedback" / "ann" / "01_ex.html").read_text()
    late = json.loads((by_zip / "feedback" / "bob" / "01_ex.ipynb").read_text())
    assert late["cells"][0]["source"].startswith("**Grade: 0.7/3** (1 day late: -0.3 of 1)")

    # --student regrades one learner and keeps the rest.
    assert (
        main(
            [
                "grade-class",
                str(download["zip"]),
                "--out",
                str(by_zip),
                *common,
                "--student",
                "jose",
            ]
        )
        == 3
    )
    out = capsys.readouterr().out
    assert "1 submission(s): 0 unchanged since the last run (kept), 1 to grade" in out
    assert "jose  01_ex.ipynb  3/3" in out
    assert (by_zip / "gradebook.csv").read_text() == (by_folder / "gradebook.csv").read_text()


def test_a_canvas_download_needs_a_roster_that_knows_every_user_id(download, tmp_path, capsys):
    out = tmp_path / "out"
    args = [
        "grade-class",
        str(download["zip"]),
        "--source",
        str(download["source"]),
        "--out",
        str(out),
    ]
    assert main(args) == 2
    assert "pass --roster" in capsys.readouterr().err
    short = tmp_path / "short.csv"
    short.write_text("\n".join(ROSTER.splitlines()[:3]) + "\n")
    out.mkdir(exist_ok=True)
    (out / "canvas.csv").write_text("stale")
    assert main([*args, "--roster", str(short)]) == 2
    err = capsys.readouterr().err
    assert "no student with the Canvas user id 102 (roebob), 103 (nunezjose), 104" in err
    assert len(err.splitlines()) == 1


def test_the_roster_check_fails_before_grading_and_removes_a_stale_canvas_csv(
    download, tmp_path, capsys
):
    short = tmp_path / "short.csv"
    short.write_text("\n".join(ROSTER.splitlines()[:3]) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "canvas.csv").write_text("stale")
    args = [
        "grade-class",
        str(download["folders"]),
        "--source",
        str(download["source"]),
        "--out",
        str(out),
        "--roster",
        str(short),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "has no student named bob, dan, jose (no canvas.csv written)" in err
    assert not (out / "canvas.csv").exists() and not (out / "results").exists()


def test_lateness_from_the_marker_or_the_time_and_the_penalty_cap():
    due = datetime(2026, 12, 1, 23, 59, tzinfo=timezone.utc)
    policy = late_policy("10%/day", "25%", "2026-12-01T23:59:00Z")
    assert policy == LatePolicy(0.1, True, 0.25, due)
    assert days_late({"late": True}, policy) == 1  # the marker alone: one day
    assert days_late({"late": True, "submitted_at": "2026-12-04T00:30:00+00:00"}, policy) == 3
    assert days_late({"late": False, "submitted_at": "2026-12-04T00:30:00+00:00"}, policy) == 0
    assert days_late({"late": None, "submitted_at": "2026-12-02T00:00:00Z"}, policy) == 1
    assert days_late({"late": None, "submitted_at": "2026-12-01T10:00:00Z"}, policy) == 0
    assert [policy.penalty(d) for d in (0, 1, 2, 5)] == [0, 0.1, 0.2, 0.25]
    assert late_policy("5%", None, None).penalty(9) == 0.05  # once, whatever the days
    check = {"grade_id": "c", "points": 0.2, "max_points": 3.0, "passed": False, "reason": ""}
    report = {"score": 0.2, "max_score": 3.0, "checks": [check]}
    results = [{"learner": "a", "notebook": "n.ipynb", "report": report}]
    [late], _ = adjust(results, (), policy, {"a": {"n.ipynb": {"late": True}}})
    assert late["report"]["score"] == 0 and late["report"]["late"]["penalty"] == 0.2
    assert report["score"] == 0.2  # the stored result is not changed
    for bad in (
        ("10", None, None),
        ("10%/week", None, None),
        ("10%", "5%/day", None),
        (None, "50%", None),
        ("10%", None, "tomorrow"),
    ):
        with pytest.raises(InputError):
            late_policy(*bad)


def test_overrides_file_is_checked_line_by_line(tmp_path, capsys):
    from course_utils.instructor.adjust import read_overrides

    checks = {"01_ex.ipynb": {"t-double-check": 1.0, "t-greet-check": 2.0}}
    path = tmp_path / "o.csv"
    for text, message in [
        ("learner,check,points,comment\nzed,t-double-check,1,x\n", "line 2: no learner 'zed'"),
        ("learner,check,points,comment\nann,nope,1,x\n", "'nope' is no check"),
        ("learner,check,points,comment\nann,t-greet-check,3,x\n", "from 0 to 2"),
        ("learner,check,points,comment\nann,t-greet-check,lots,x\n", "from 0 to 2"),
        ("who,what\nann,x\n", "needs the columns"),
    ]:
        path.write_text(text)
        with pytest.raises(InputError, match=message):
            read_overrides(path, checks, ["ann"])
    path.write_text("learner,check,points,comment\nann,t-greet-check,1.5,  nearly   right \n")
    [override] = read_overrides(path, checks, ["ann"])
    assert (override.notebook, override.points, override.comment) == (
        "01_ex.ipynb",
        1.5,
        "nearly right",
    )


def test_the_resume_key_ignores_jobs_and_threads(tmp_path):
    from course_utils.instructor.gradebook import Options, Task, result_key

    write_notebook(_instructor(), tmp_path / "01_ex.ipynb")
    task = Task("ann", "01_ex.ipynb", str(tmp_path / "01_ex.ipynb"), str(tmp_path / "01_ex.ipynb"))
    key = result_key(task, Options(jobs=1, threads=2))
    assert result_key(task, Options(jobs=9, threads=1, hidden=("/x",))) == key
    assert result_key(task, Options(jobs=1, cell_timeout_s=5)) != key


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM to the main process", "SIGINT to the process group"])
def test_an_interrupted_class_run_leaves_no_scratch_folder(how, tmp_path):
    """A real signal to a real grade-class: the scratch folders (the learner's working
    folder, the kernel's and the judge's grader-owned start-up folders) are removed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    source = tmp_path / "instructor"
    write_notebook(_instructor(), source / "01_ex.ipynb")
    for learner in ("ann", "bob"):
        looping = _instructor()
        looping.cells[2].source = "while True:\n    pass"
        write_notebook(looping, tmp_path / "class" / learner / "01_ex.ipynb")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    command = [
        sys.executable,
        "-m",
        "course_utils",
        "grade-class",
        str(tmp_path / "class"),
        "--source",
        str(source),
        "--out",
        str(tmp_path / "out"),
        "--jobs",
        "2",
        "--sandbox",
        "none",
        "--cell-timeout",
        "300",
    ]
    process = subprocess.Popen(
        command,
        env={**os.environ, "TMPDIR": str(scratch)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    # A submission's scratch folder holds its kernel's grader-owned start-up folder.
    while not list(scratch.glob("course-grade-run-*/course-grade-*/kernel-*/kernel.json")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.5)
    if how.startswith("SIGTERM"):
        process.send_signal(signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "error: interrupted" in err and "run the same command again" in err
    assert "Traceback" not in err
    assert not list(scratch.glob("course-grade*")), list(scratch.rglob("*"))
    assert not (tmp_path / "out" / "gradebook.csv").exists()


WORKER = """
import subprocess, sys, time
from course_utils.instructor.gradebook import _worker_start
_worker_start()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True)  # as a kernel or the judge starts
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_stopped_worker_ends_what_it_started_before_it_exits(signum):
    """A grading worker's kernel and judge run in sessions of their own, so the signal
    that stops the worker does not reach them: the worker ends them and waits for them
    before it exits, so none writes into the scratch folder the main process removes."""
    import os
    import signal
    import subprocess
    import sys

    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None
    child = int(worker.stdout.readline())
    try:
        worker.send_signal(getattr(signal, signum))
        assert worker.wait(60) == -getattr(signal, signum)  # it died of the signal
        with pytest.raises(ProcessLookupError):  # ended and reaped, not left running
            os.kill(child, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        worker.kill()


STARTING_WORKER = """
import multiprocessing, os, signal, sys, time
from course_utils.instructor.gradebook import _ctrl_c_held_for_new_workers, _worker_start

def starting():
    time.sleep(1.5)  # a worker still starting (importing, unpickling its task)
    _worker_start()  # its handler set: the Ctrl-C held back ends it here
    print("the Ctrl-C was lost", flush=True)
    time.sleep(30)

if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[1])
    with _ctrl_c_held_for_new_workers():
        worker = context.Process(target=starting)
        worker.start()
    time.sleep(0.5)
    os.kill(worker.pid, signal.SIGINT)  # Ctrl-C, as the process group gets it, mid-start
    worker.join(60)
    print(worker.exitcode, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_ctrl_c_while_a_worker_starts_ends_it_without_a_traceback(method, tmp_path):
    """A Ctrl-C to the process group can reach a grading worker before it has set its
    handler: it is held back until then and ends the worker there, quietly (once, a
    spawned worker printed KeyboardInterrupt's traceback mid-import in CI)."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "starting_worker.py"
    script.write_text(STARTING_WORKER, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), method], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(-signal.SIGINT)], done.stdout  # died of the Ctrl-C
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
