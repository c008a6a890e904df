"""The judge against attempts the guard of the last round did not see (issue 33): the
verdict is computed in a grader-owned process, so patching the guard, the signing, frames,
``__builtins__``, audit hooks, start-up files or the channel scores 0; the feedback never
holds a hidden check."""

from __future__ import annotations

import io
import json
import re
import time

import pytest
from test_tampering import CHECKS, _attack, _instructor

from course_utils.instructor.gradebook import Options, Task, grade_tasks
from course_utils.instructor.student import write_notebook

ATTACKS = {
    "guard class": "import course_utils.instructor.guard as g\n"
    "g._Guard.run_check = lambda *a, **k: None\ng.read_signed = lambda *a: {'kind': 'result'}",
    "signing": "import hmac, hashlib, json\nhmac.compare_digest = lambda a, b: True\n"
    'json.dumps = lambda *a, **k: \'{"kind": "result", "ename": "", "tampering": []}\'\n'
    "hashlib.sha256 = lambda *a: None",
    "current frames": "import sys\ndef double(x):\n    for f in sys._current_frames().values():\n"
    "        f.f_globals['check'] = lambda *a, **k: None\n    return 0",
    "traceback frame": "def double(x):\n    try:\n        raise ValueError\n"
    "    except ValueError as e:\n        e.__traceback__.tb_frame.f_back.f_globals"
    ".update(check=lambda *a, **k: None)\n    return 0",
    "builtins dict": "__builtins__ = dict(vars(__import__('builtins')), all=lambda *a: True, "
    "isinstance=lambda *a: True, abs=lambda x: 0)",
    "audit hook": "import sys\nsys.addaudithook(lambda event, args: None)",
    "start-up files": "import os\nfor d in (os.environ.get('IPYTHONDIR', '.'), "
    "os.path.expanduser('~/.ipython')):\n"
    "    p = os.path.join(d, 'profile_default', 'startup')\n    os.makedirs(p, exist_ok=True)\n"
    "    open(os.path.join(p, '0.py'), 'w')"
    ".write('import builtins; builtins.all = lambda *a: True')\n"
    "open('ipykernel_launcher.py', 'w').write('import os; os._exit(0)')\nos._exit(1)",
    "forged channel": "import os\nfor fd in range(3, 40):\n    try:\n"
    "        os.write(fd, b'0' * 64 + b' {\"kind\": \"result\"}\\ndone\\n')\n"
    "    except OSError:\n        pass",
    "proc memory": "open('/proc/self/mem', 'rb')",
    "check-named code": "import sys\nexec(compile('def double(x):\\n    sys._getframe(1)"
    ".f_globals.update(check=lambda *a, **k: None)\\n    return 0\\n', '<check ex-1>', "
    "'exec'))",
}


@pytest.mark.slow
def test_new_attacks_score_0_and_honest_scores_in_full(tmp_path):
    source = tmp_path / "source" / "ex.ipynb"
    write_notebook(_instructor(), source)
    notebooks = {name: _attack(code) for name, code in ATTACKS.items()}
    notebooks["honest"] = _instructor()
    for notebook in notebooks.values():  # what a learner has: the checks without hidden tests
        for cell in notebook.cells:
            cell.source = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n", "",
                                 cell.source, flags=re.S)  # fmt: skip
        assert "range(-3, 4)" not in json.dumps(notebook)
    tasks = []
    for name, notebook in notebooks.items():
        path = tmp_path / "class" / name.replace(" ", "-") / "ex.ipynb"
        write_notebook(notebook, path)
        tasks.append(Task(name, "ex.ipynb", str(path), str(source)))
    out = tmp_path / "out"
    options = Options(sandbox="auto", jobs=3, threads=1, cell_timeout_s=30)
    results = grade_tasks(tasks, options, out, io.StringIO(), resume=False)
    errors = {t.learner: r["error"] for t, r in zip(tasks, results, strict=True) if "error" in r}
    assert not errors, errors
    reports = {task.learner: result["report"] for task, result in zip(tasks, results, strict=True)}
    assert reports["honest"]["score"] == 3 and reports["honest"]["tampering"] == []
    for name in ATTACKS:
        points = {c["grade_id"]: c["points"] for c in reports[name]["checks"]}
        assert points == dict.fromkeys(CHECKS, 0.0), (name, reports[name])
    for name in (
        "current frames",
        "traceback frame",
        "audit hook",
        "proc memory",
        "start-up files",
        "check-named code",
    ):
        assert reports[name]["tampering"], name
    for feedback in (out / "feedback").rglob("*.ipynb"):  # never a hidden check
        text = feedback.read_text()
        assert "HIDDEN TESTS" not in text and "range(-3, 4)" not in text, feedback
    assert not json.dumps(reports).count("range(-3, 4)")


# -- a busy machine: a start past its limit leaves the submission ungraded, never 0 -----


def test_a_judge_that_does_not_start_in_time_leaves_the_submission_ungraded(tmp_path, monkeypatch):
    """The judge's start (before any learner code) has a wall-time limit; past it the
    submission is not scored (``MachineBusy``: a note that says the machine was busy)."""
    import sys

    import nbformat

    from course_utils.instructor import grading

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(grading, "_judge_command", lambda *a: sleeper)
    monkeypatch.setattr(grading, "WARM_UP_S", 0.5)
    cell = nbformat.v4.new_code_cell("check(True)")
    cell.metadata["course_guard"] = "t-double-check"
    start = time.monotonic()
    with pytest.raises(grading.MachineBusy, match="the machine was too busy"):
        grading._judge(tmp_path, [cell], [grading.CellOutcome("ok")], {}, grading.KernelSettings(),
                       5, 60)  # fmt: skip
    assert time.monotonic() - start < 30  # the sleeper was ended, not waited for


@pytest.mark.slow
def test_a_busy_start_is_a_row_that_says_so_not_a_score(tmp_path, monkeypatch):
    """Through the class run: the submission gets no score and its row says why."""
    from course_utils.instructor import grading

    def busy(*args, **kwargs):
        raise grading._busy("the grading kernel", 600)

    monkeypatch.setattr(grading, "_Kernel", busy)
    source = tmp_path / "source" / "ex.ipynb"
    write_notebook(_instructor(), source)
    path = tmp_path / "class" / "ann" / "ex.ipynb"
    write_notebook(_instructor(), path)
    task = Task("ann", "ex.ipynb", str(path), str(source))
    options = Options(sandbox="none", jobs=1, threads=1)
    [result] = grade_tasks([task], options, tmp_path / "out", io.StringIO(), resume=False)
    assert "report" not in result
    assert result["error"].startswith("not graded: the machine was too busy (load average")
    assert "grade it again" in result["error"]
    monkeypatch.undo()  # the machine is free again: the next run grades it (not kept)
    [again] = grade_tasks([task], options, tmp_path / "out", io.StringIO(), resume=True)
    assert again["report"]["score"] == 3


# -- the course's own solutions score in full through the judge, unflagged ---------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "stem",
    [
        "01_runtime_and_devices",
        "02_nvidia_smi_and_monitoring",
        "03_data_loading_and_batch_size",
        "04_memory_efficient_models",
        "05_lightning",
        "06_multi_gpu",
        "07_gpu_memory_and_cache",
        "08_capstone",
        "09_transformers_on_the_gpu",
    ],
)
def test_the_reference_solutions_score_in_full_unflagged(stem, tmp_path, monkeypatch):
    """Library code that walks frames on a learner's behalf outside a check (typing's
    generics, torch.cuda's lazy-init traceback, logging) is no tampering: the course's own
    notebooks 02 and 05 once scored 1/3 with a false "inspected frames" flag; nor is the
    course's own swap of a helper for a refusal inside a check (01 once scored 0)."""
    from pathlib import Path

    monkeypatch.setenv("COURSE_WORKLOAD", "small")
    monkeypatch.setenv("COURSE_PROGRESS", "off")
    source = Path(__file__).resolve().parents[1] / "notebooks" / f"{stem}.ipynb"
    task = Task("reference", source.name, str(source), str(source))
    options = Options(sandbox="auto", jobs=1, threads=1)
    [result] = grade_tasks([task], options, tmp_path / "out", io.StringIO(), resume=False)
    assert "error" not in result, result["error"]
    report = result["report"]
    reasons = {check["grade_id"]: check["reason"] for check in report["checks"]}
    assert report["score"] == report["max_score"] > 0, reasons
    assert report["tampering"] == [], report["tampering"]
    assert not [note for note in report.get("notes", []) if "limit" in note], report["notes"]


def test_the_checks_code_is_known_by_identity_not_by_its_file_name():
    """Learner code compiled as ``<check ...>`` is not the check's: the guard keeps the ids
    of the checks' own code objects, nested ones (functions, comprehensions) included."""
    from course_utils.instructor import guard

    text = "def f():\n    return [y for y in range(2)]\n"
    check = guard._all_code(compile(text, "<check a>", "exec"))  # kept alive, as the guard does
    mine = {id(code) for code in check}
    assert len(mine) == 3
    copy = compile(text, "<check a>", "exec")  # equal code, compiled again: not the check's
    assert copy == check[0] and not {id(code) for code in guard._all_code(copy)} & mine
