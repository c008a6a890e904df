"""The last mile for instructors and self-learners (issue 46): a similarity report of a
class taught from ``publish``'s output that names only the real copy, every roster student
in the gradebook, Canvas's submission times and anonymous downloads, and a self-learner's
JupyterLab without the answers."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from course_utils.instructor.gradebook import Task, _answers
from course_utils.instructor.similarity import OWN_CODE, SOLUTION, boilerplate, similar_pairs
from course_utils.instructor.student import nbgrader_role, read_notebook, write_notebook
from course_utils.tooling import publish

ROOT = Path(__file__).resolve().parent.parent
LAB1 = "01_runtime_and_devices.ipynb"

#: grace's own answers (distinctive), and a helper cell of hers.
GRACE = {
    "01-my-to-device": (
        "def my_to_device(batch, device):\n"
        "    def walk(node):\n"
        "        if torch.is_tensor(node):\n"
        "            return node.to(device, non_blocking=True)\n"
        "        if isinstance(node, dict):\n"
        "            return node.__class__((k, walk(v)) for k, v in node.items())\n"
        "        if hasattr(node, '_fields'):\n"
        "            return node.__class__(*map(walk, node))\n"
        "        if isinstance(node, (list, tuple)):\n"
        "            return node.__class__(map(walk, node))\n"
        "        return node\n"
        "    return walk(batch)\n"
    ),
    "01-mixed-forward": (
        "def mixed_forward(model, x, capability):\n"
        "    major, minor = capability\n"
        "    table = {9: torch.bfloat16, 8: torch.bfloat16, 7: torch.float16}\n"
        "    chosen = table.get(min(major, 9))\n"
        "    if chosen is None:\n"
        "        return model(x)\n"
        "    with torch.autocast(device_type=x.device.type, dtype=chosen):\n"
        "        out = model(x)\n"
        "    return out\n"
    ),
}
HELPER = (
    "def grace_timer(fn, reps):\n"
    "    samples = sorted(timeit_once(fn) for _ in range(reps * 3 + 1))\n"
    "    spread = samples[-1] - samples[0]\n"
    "    print('spread of the samples', spread, 'middle', samples[len(samples) // 2])\n"
    "    return samples[len(samples) // 2], spread\n"
)


def _renamed(code: str) -> str:
    """frank's copy: grace's code, names changed and reformatted."""
    for old, new in (
        ("walk", "visit"),
        ("node", "item"),
        ("chosen", "dt"),
        ("table", "m"),
        ("samples", "ts"),
        ("spread", "rng"),
        ("grace_timer", "frank_t"),
    ):
        code = re.sub(rf"\b{old}\b", new, code)
    return code.replace("    ", "  ")


def _published(tmp_path: Path) -> Path:
    """Notebook 01 as the ``colab`` branch publishes it (setup cell filled in)."""
    root = tmp_path / "checkout"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy2(ROOT / "notebooks" / LAB1, root / "notebooks" / LAB1)
    shutil.copy2(ROOT / "colab_setup.sh", root / "colab_setup.sh")
    shutil.copytree(ROOT / "translations", root / "translations")
    out = tmp_path / "colab"
    publish.stage_branch(root, out, repo="someorg/gpu-course", ref="a" * 40, branch="colab")
    return out / "notebooks" / LAB1


def _learner(student: Path, answers: dict[str, str], helper: str | None = None):
    notebook = read_notebook(student)
    for cell in notebook.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if nbgrader_role(cell) == "solution" and gid in answers:
            cell.source = answers[gid]
    if helper is not None:
        import nbformat

        notebook.cells.append(nbformat.v4.new_code_cell(helper))
    return notebook


def test_a_class_taught_from_publish_reports_only_the_real_copy(tmp_path):
    student = _published(tmp_path)
    cells = read_notebook(student).cells
    setup = next(c for c in cells if "colab-setup" in c.metadata.get("tags", []))
    assert 'COURSE_REPO = "someorg/gpu-course"' in setup.source  # filled in by publish
    reference = read_notebook(ROOT / "notebooks" / LAB1)
    solutions = {
        cell.metadata["nbgrader"]["grade_id"]: "\n".join(
            line for line in cell.source.splitlines() if "SOLUTION" not in line
        )
        for cell in reference.cells
        if nbgrader_role(cell) == "solution"
    }
    class_ = {
        "alice": _learner(student, solutions),
        "bob": _learner(student, solutions),
        "dave": _learner(student, solutions),
        "carol": _learner(student, {}),  # changed nothing
        "grace": _learner(student, GRACE, HELPER),
        "frank": _learner(student, {k: _renamed(v) for k, v in GRACE.items()}, _renamed(HELPER)),
    }
    tasks = []
    for name, notebook in class_.items():
        write_notebook(notebook, tmp_path / "class" / name / LAB1)
        tasks.append(
            Task(name, LAB1, str(tmp_path / "class" / name / LAB1), str(ROOT / "notebooks" / LAB1))
        )
    answers = _answers(tasks)
    assert OWN_CODE not in answers["carol"][LAB1]  # the setup cell is the instructor's
    pairs = similar_pairs(answers, {LAB1: boilerplate(reference)})
    learners = [p for p in pairs if p.learner_b != SOLUTION]
    assert learners, "the copy is found"
    assert {frozenset((p.learner_a, p.learner_b)) for p in learners} == {
        frozenset(("frank", "grace"))
    }
    assert {p.exercise for p in learners} == {"01-my-to-device", "01-mixed-forward", OWN_CODE}
    honest = {p.learner_a for p in pairs if p.learner_b == SOLUTION}
    assert honest == {"alice", "bob", "dave"}


ROSTER = (
    "Student,ID,SIS User ID,SIS Login ID,Section,01_ex (5501)\n"
    "    Points Possible,,,,,3\n"
    '"Lee, Ann",101,s-1,ann,Lab A,\n'
    '"Roe, Carol",103,s-3,carol,Lab B,\n'
    '"Doe, Dan",104,,,Lab B,\n'
    '"Student, Test",999,,,,\n'
)


def _rows(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("missing", ["0", "blank"])
def test_every_roster_student_has_a_row_in_both_files(tmp_path, missing):
    from course_utils.instructor.gradebook import ClassOutputs, write_class
    from course_utils.instructor.shards import ClassRun

    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    check = {"grade_id": "ex-a", "points": 2.0, "max_points": 3.0, "reason": "", "matched": ""}
    report = {"score": 2.0, "max_score": 3.0, "matched": [], "checks": [check]}
    result = {
        "learner": "ann",
        "notebook": "01_ex.ipynb",
        "report": report,
        "path": str(tmp_path / "none.ipynb"),
        "source": str(tmp_path / "none.ipynb"),
    }
    run = ClassRun(
        ["ann"],
        ["01_ex.ipynb"],
        {"01_ex.ipynb": 3.0},
        tasks=[("ann", "01_ex.ipynb")],
        handed={"ann": {"01_ex.ipynb": {"file": "01_ex.ipynb", "how": ""}}},
    )
    outputs = ClassOutputs(roster=roster, missing=missing)
    write_class(tmp_path / "out", run, [result], outputs, {"01_ex.ipynb": {"ex-a": 3.0}}, pairs=[])
    book = {row["learner"]: row for row in _rows(tmp_path / "out" / "gradebook.csv")}
    assert sorted(book) == ["104", "ann", "carol"]  # dan has no login: by his ID
    absent = "" if missing == "blank" else "0"
    assert book["ann"]["01_ex.ipynb"] == "2"
    assert book["carol"]["01_ex.ipynb"] == absent and book["carol"]["max"] == "3"
    assert book["carol"]["missing"] == "01_ex.ipynb"
    canvas = {row["ID"]: row for row in _rows(tmp_path / "out" / "canvas.csv")[1:]}
    assert sorted(canvas) == ["101", "103", "104"]  # not the test student
    assert canvas["101"]["01_ex (5501)"] == "2"
    assert canvas["103"]["01_ex (5501)"] == absent
    assert canvas["103"]["SIS Login ID"] == "carol" and canvas["104"]["Student"] == "Doe, Dan"


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
    return path


def _api(path: Path, submissions: list[dict]) -> str:
    """Canvas's submissions API answer for one assignment (the fields we read, and more)."""
    import json

    full = [
        {
            "id": 9000 + n,
            "assignment_id": 5501,
            "attempt": 1,
            "workflow_state": "submitted",
            "late": False,
            "seconds_late": 0,
            "score": None,
            **item,
        }
        for n, item in enumerate(submissions)
    ]
    path.write_text(json.dumps(full), encoding="utf-8")
    return str(path)


def _anonymous_class(tmp_path: Path) -> dict[str, Path]:
    """An anonymously graded assignment of two notebooks, as Canvas's download names it."""
    from test_grader import _instructor

    source = tmp_path / "instructor"
    write_notebook(_instructor(), source / "01_ex.ipynb")
    write_notebook(_instructor(), source / "02_ex.ipynb")
    files = tmp_path / "files"
    members = {}
    for name in (
        "anon_Xa7Qp_9001_01_ex.ipynb",
        "anon_Xa7Qp_9002_02_ex.ipynb",
        "anon_bT3kZ_9003_01_ex-1.ipynb",
    ):
        write_notebook(_instructor(), files / name)
        members[name] = (files / name).read_bytes()
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    return {"source": source, "zip": _zip(tmp_path / "download.zip", members), "roster": roster}


def test_an_anonymous_download_is_mapped_through_the_api_and_times_are_per_notebook(tmp_path):
    from datetime import datetime, timezone

    from course_utils.instructor.canvas import read_roster
    from course_utils.instructor.intake import collect, read_times
    from course_utils.instructor.student import InputError

    made = _anonymous_class(tmp_path)
    students = read_roster(made["roster"])[0]
    notebooks = ["01_ex.ipynb", "02_ex.ipynb"]
    with pytest.raises(InputError, match="anonymous download"):
        collect(made["zip"], notebooks, tmp_path / "d", students)
    lab1 = _api(
        tmp_path / "lab1.json",
        [
            {"user_id": 101, "anonymous_id": "Xa7Qp", "submitted_at": "2026-12-03T10:00:00Z"},
            {"user_id": 103, "anonymous_id": "bT3kZ", "submitted_at": "2026-12-01T12:00:00Z"},
            {"user_id": 104, "anonymous_id": "qq111", "submitted_at": None},  # nothing handed in
        ],
    )
    lab2 = _api(
        tmp_path / "lab2.json",
        [
            {"user_id": 101, "anonymous_id": "Xa7Qp", "submitted_at": "2026-12-05T08:30:00-05:00"},
        ],
    )
    times = read_times([f"01_ex={lab1}", f"02_ex.ipynb={lab2}"], notebooks)
    intake = collect(made["zip"], notebooks, tmp_path / "d", students, times)
    assert sorted(intake.handed) == ["ann", "carol"]
    utc = timezone.utc
    assert intake.handed["ann"]["01_ex.ipynb"].submitted_at == datetime(2026, 12, 3, 10, tzinfo=utc)
    assert intake.handed["ann"]["02_ex.ipynb"].submitted_at == datetime(
        2026, 12, 5, 13, 30, tzinfo=utc
    )
    assert intake.handed["carol"]["01_ex.ipynb"].submitted_at == datetime(
        2026, 12, 1, 12, tzinfo=utc
    )
    # a CSV still works, for every notebook or with a notebook column
    csv_times = tmp_path / "times.csv"
    csv_times.write_text("ID,notebook,submitted_at\n101,02_ex,2026-12-02T00:00:00Z\n")
    intake = collect(
        made["zip"],
        notebooks,
        tmp_path / "d",
        students,
        read_times([lab1, str(csv_times)], notebooks),
    )
    assert intake.handed["ann"]["02_ex.ipynb"].submitted_at == datetime(2026, 12, 2, tzinfo=utc)
    bad = tmp_path / "bad.json"
    bad.write_text('{"errors": [{"message": "Invalid access token."}]}')
    with pytest.raises(InputError, match="submissions API"):
        read_times([str(bad)], notebooks)


@pytest.mark.slow
def test_an_anonymous_zip_grades_with_per_notebook_lateness_from_the_api(tmp_path, capsys):
    from course_utils.tooling.cli import main

    made = _anonymous_class(tmp_path)
    lab1 = _api(
        tmp_path / "lab1.json",
        [  # Canvas's late: its own due dates and extensions
            {
                "user_id": 101,
                "anonymous_id": "Xa7Qp",
                "submitted_at": "2026-12-03T10:00:00Z",
                "late": True,
                "seconds_late": 122460,
            },
            {"user_id": 103, "anonymous_id": "bT3kZ", "submitted_at": "2026-12-01T12:00:00Z"},
        ],
    )
    lab2 = _api(
        tmp_path / "lab2.json",
        [
            {"user_id": 101, "anonymous_id": "Xa7Qp", "submitted_at": "2026-12-01T08:00:00Z"},
        ],
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "grade-class",
                str(made["zip"]),
                "--source",
                str(made["source"]),
                "--roster",
                str(made["roster"]),
                "--out",
                str(out),
                "--jobs",
                "1",
                "--sandbox",
                "none",
                "--late-penalty",
                "10%/day",
                "--due",
                "2026-12-01T23:59:00Z",
                "--submitted-at",
                f"01_ex={lab1}",
                "--submitted-at",
                f"02_ex={lab2}",
            ]
        )
        == 0
    )
    book = {row["learner"]: row for row in _rows(out / "gradebook.csv")}
    assert sorted(book) == ["104", "ann", "carol"]
    assert book["ann"]["late"] == "01_ex.ipynb: 2 days late: -0.6"  # 02 was on time
    assert (book["ann"]["01_ex.ipynb"], book["ann"]["02_ex.ipynb"]) == ("2.4", "3")
    assert book["carol"]["01_ex.ipynb"] == "3" and book["carol"]["late"] == ""


def _check_cell(notebook: str, grade_id: str, student: bool) -> str:
    from course_utils.instructor.student import student_version

    source = read_notebook(ROOT / "notebooks" / notebook)
    if student:
        source = student_version(source)
    return next(
        cell.source
        for cell in source.cells
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id
    )


@pytest.mark.parametrize(
    ("notebook", "grade_id", "answers"),
    [
        # the course's own mfu(), or an expected MFU (0.1 of 6.5 TFLOP per second on a T4)
        (
            "02_nvidia_smi_and_monitoring.ipynb",
            "02-run-mfu-check",
            [r"\bmfu\(", r"6\.5e12", r"\b0\.1\b\s*,\s*\""],
        ),
        (
            "03_data_loading_and_batch_size.ipynb",
            "03-accumulation-check",
            [r"\b256\b", r"\b0\.8\b", r"scaled_lr\(", r"32 \* 8"],
        ),
    ],
)
def test_a_visible_check_states_properties_not_the_value(notebook, grade_id, answers):
    visible = _check_cell(notebook, grade_id, student=True)
    for answer in answers:
        assert not re.search(answer, visible), f"the visible check of {grade_id}: {answer!r}"
    assert "HIDDEN TESTS" in _check_cell(notebook, grade_id, student=False)


def test_a_wrong_accumulation_that_keeps_the_rule_passes_the_visible_check_only():
    from course_utils.checks.core import check, check_close, passed
    from course_utils.feedback import CheckFailed
    from course_utils.training import scaled_lr

    namespace = {
        "check": check,
        "check_close": check_close,
        "passed": passed,
        "scaled_lr": scaled_lr,
        "effective_batch": 64,
        "new_lr": 0.2,
    }
    nb03 = "03_data_loading_and_batch_size.ipynb"
    exec(_check_cell(nb03, "03-accumulation-check", student=True), dict(namespace))
    with pytest.raises(CheckFailed, match="effective_batch is 64"):
        exec(_check_cell(nb03, "03-accumulation-check", student=False), dict(namespace))


@pytest.mark.slow
def test_torch_profiler_prints_nothing_on_a_machine_without_a_gpu():
    import os
    import subprocess
    import sys

    from course_utils.nvml import nvml_status

    if nvml_status() == "ok":
        pytest.skip("an NVIDIA driver answers here: kineto's messages are left as they are")
    code = (
        "import torch\nimport course_utils.profiling\n"
        "from torch.profiler import ProfilerActivity, profile\n"
        "with profile(activities=[ProfilerActivity.CPU]):\n    torch.ones(3) + 1\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    assert "gpuGetDeviceCount" not in done.stderr and "USDT" not in done.stderr, done.stderr


@pytest.mark.slow
def test_the_grader_does_not_print_torchs_no_cuda_runtime_warning():
    import subprocess
    import sys

    def stderr(code: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
        )
        return done.stderr

    if "No CUDA runtime is found" not in stderr("import torch.utils.benchmark"):
        pytest.skip("torch does not warn here (a GPU, or no CUDA toolkit)")
    # what the workers' server does at every grading start: the grader, then the checks'
    # modules (01 imports torch.utils.benchmark)
    code = "import course_utils.instructor.gradebook\nimport torch.utils.benchmark\n"
    assert "No CUDA runtime is found" not in stderr(code)


def test_the_call_for_a_gpu_record_goes_to_contributors_not_learners(capsys):
    from course_utils import records
    from course_utils.tooling import report

    assert records.recorded_gpu_figures("05", records=[]) == []
    said = capsys.readouterr().out
    assert "No GPU record holds notebook 05's figures yet" in said  # what a learner reads
    assert "send the record" not in said and "gpu-record" not in said
    assert "gpu-record" in report._recorded_html("05", [])  # the run report asks for one


@pytest.mark.slow
def test_a_colab_branch_without_a_solutions_branch_beside_it_says_so(tmp_path):
    import subprocess

    def git(where: Path, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(where), *args], check=True, text=True, capture_output=True
        ).stdout.strip()

    root = tmp_path / "private"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy2(ROOT / "notebooks" / LAB1, root / "notebooks" / LAB1)
    for name in ("colab_setup.sh", "README.md"):
        shutil.copy2(ROOT / name, root / name)
    shutil.copytree(ROOT / "translations", root / "translations")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "course")
    public = tmp_path / "public.git"
    subprocess.run(["git", "init", "-q", "--bare", str(public)], check=True)

    def readme(answers_branch: str | None = publish.AUTO) -> str:
        publish.publish(
            root, repo="org/public", ref="a" * 40, remote=str(public), answers_branch=answers_branch
        )
        return git(public, "show", "colab:README.md")

    assert "The answers are not published in this repository" in readme()  # two repositories
    git(root, "push", "-q", str(public), "main:refs/heads/solutions")  # one repository
    note = readme()
    assert "The `solutions` branch has them" in note and "not published" not in note
    assert "not published in this repository" in readme(None)  # --answers-branch none
