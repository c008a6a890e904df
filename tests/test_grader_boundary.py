"""The grader's boundary (issue 43): a verdict only from a trusted ``completed`` result, and
feedback only from the instructor's messages; a checker that trusts nothing it is told
(no name resolved to its own function, no ``torch.load`` of what it is sent, its own
user, PID namespace and limits); control lines on the judge's pipe that a learner cannot
forge. Attempts are graded for real, as a learner who edits only their notebook would
make them."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import sys
import threading

import pytest
import torch
from test_grader import _meta, _notebook
from test_tampering import CHECKS, _attack, _instructor

from course_utils.checks import data_format
from course_utils.instructor import checker
from course_utils.instructor.gradebook import Options, Task, grade_tasks
from course_utils.instructor.student import write_notebook


class _Runtime:
    """The learner's end of a channel: the test writes what a hostile runtime would."""

    def __init__(self) -> None:
        self.requests_read, requests_write = os.pipe()
        replies_read, self.replies_write = os.pipe()
        self.channel = checker.Channel(requests_write, replies_read, {"torch", "course_utils"})

    def reply(self, header: dict, blob: bytes | None = None) -> None:
        checker.write_frame(self.replies_write, json.dumps(header).encode())
        if blob is not None:
            checker.write_frame(self.replies_write, blob)


# -- the checker trusts nothing it is told ------------------------------------------------


def test_a_callable_the_runtime_names_is_never_the_checkers_own():
    """The runtime says ``double`` is ``os.kill``: the checker must not call its own
    ``os.kill`` with the check's arguments; the call goes to the learner's runtime."""
    runtime = _Runtime()
    runtime.reply({"kind": "callable", "type": "function", "module": "os", "qualname": "kill"})
    got = runtime.channel.value("double")
    assert got is not os.kill and type(got) is checker.Answer
    runtime.reply({"kind": "module", "name": "os"})  # a module the instructor never imports
    with pytest.raises(data_format.AnswerError):
        runtime.channel.value("np").kill  # noqa: B018
    runtime.reply({"kind": "module", "name": "torch"})
    assert runtime.channel.value("torch") is torch


def test_what_the_runtime_sends_is_never_unpickled_nor_torch_loaded():
    runtime = _Runtime()
    buffer = io.BytesIO()
    torch.save(torch.ones(2), buffer)  # harmless, but read by torch.load (a pickle) before
    runtime.reply({"kind": "data", "type": "Tensor"}, buffer.getvalue())
    with pytest.raises(data_format.AnswerError, match="not plain data"):
        runtime.channel.call("double", (3,), {})
    runtime.reply(*checker.describe_value(torch.arange(6.0).reshape(2, 3), object()))
    assert torch.equal(runtime.channel.call("double", (3,), {}), torch.arange(6.0).reshape(2, 3))


def _claims(description: object, tail: bytes) -> bytes:
    text = json.dumps(description).encode()
    return len(text).to_bytes(8, "big") + text + tail


@pytest.mark.parametrize(
    "description",
    [{"T": ["float32", [2**40], False, False]},  # 4 TiB of floats in 2 MiB
     {"l": [{"T": ["uint8", [2**21], False, False]}] * 1000},  # the same bytes, 1000 times
     {"b": 2**40}, {"T": ["float32", [-1, -2**20], False, False]},
     {"dc": ["os", "system", {}]}, {"T": ["object", [1], False, False]}],
    ids=["huge shape", "bytes read twice", "huge bytes", "negative shape", "not a dataclass",
         "dtype"],
)  # fmt: skip
def test_a_reply_is_checked_against_its_own_size_before_it_is_decoded(description):
    """A 2 MiB reply that describes more than 2 MiB is refused before anything is made."""
    runtime = _Runtime()
    blob = _claims(description, bytes(2 * 2**20))  # more than a pipe holds: sent meanwhile
    writer = threading.Thread(target=runtime.reply, args=({"kind": "data"}, blob))
    writer.start()
    with pytest.raises(data_format.AnswerError, match="not plain data"):
        runtime.channel.call("double", (3,), {})
    writer.join()


@pytest.mark.slow
def test_a_decompression_bomb_reply_stays_small(tmp_path):
    """The reply torch.load inflated (a deflated zip member): now, whatever its form, the
    checker's peak memory stays near the reply's own size."""
    program = (
        "import io, json, os, re, zipfile, torch\nfrom pathlib import Path\n"
        "from course_utils.instructor import checker\n"
        "buffer = io.BytesIO()\n"
        "torch.save(torch.zeros(1), buffer)\n"
        "bomb = io.BytesIO()\n"
        "with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as old, "
        "zipfile.ZipFile(bomb, 'w', zipfile.ZIP_DEFLATED) as new:\n"
        "    for info in old.infolist():\n"
        "        data = old.read(info)\n"
        "        if info.filename.endswith('/data/0'):\n"
        "            data = bytes(2**30)\n"
        "        if info.filename.endswith('data.pkl'):\n"
        "            data = data.replace(b'K\\x01\\x85', b'J\\x00\\x00\\x00\\x10\\x85')\n"
        "        new.writestr(info.filename, data)\n"
        "blob = bomb.getvalue()\n"
        "assert len(blob) < 4 * 2**20, len(blob)\n"
        "def hwm():  # this process's own peak RSS in kB (ru_maxrss keeps the parent's)\n"
        "    status = Path('/proc/self/status').read_text()\n"
        "    return int(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1))\n"
        "before = hwm()\n"
        "rin, win = os.pipe(); rout, wout = os.pipe()\n"
        "channel = checker.Channel(win, rout, {'torch'})\n"
        "import threading\n"
        "def send():\n"
        "    checker.write_frame(wout, json.dumps({'kind': 'data'}).encode())\n"
        "    checker.write_frame(wout, blob)\n"
        "threading.Thread(target=send).start()\n"
        "try:\n    channel.call('double', (3,), {})\nexcept checker.AnswerError:\n    pass\n"
        "after = hwm()\n"
        "print((after - before) // 1024)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) < 256, done.stdout  # MiB more than before the reply


def _serve_missing(requests: int, replies: int, grade_id: str) -> None:
    """A runtime that starts one check and knows no name (every name the check reads is
    pinned or built in)."""
    checker.write_frame(replies, json.dumps({"kind": "begin", "grade_id": grade_id}).encode())
    while True:
        try:
            request = pickle.loads(checker.read_frame(requests, 1 << 20))
        except checker.ChannelBroken:
            return
        if request[0] == "end":
            return
        checker.write_frame(replies, json.dumps({"kind": "missing"}).encode())


def _unprivileged_namespaces() -> bool:
    if os.geteuid() == 0:
        return True
    return (
        subprocess.run(["unshare", "-Urp", "true"], capture_output=True, check=False).returncode
        == 0
    )


@pytest.mark.skipif(not _unprivileged_namespaces(), reason="no PID namespace can be made here")
def test_the_checker_runs_as_its_own_user_in_its_own_pid_namespace(tmp_path):
    """Whatever it is made to call, the checker reaches no process of the grader's: it is
    process 1 of its own PID namespace, and (as root) runs as a user id of its own."""
    source = (
        "import os\nfrom course_utils.checks.core import check\n"
        "try:\n    os.kill(GRADER, 0)\n    reached = 'yes'\n"
        "except OSError:\n    reached = 'no'\n"
        "check(False, f'pid={os.getpid()} uid={os.getuid()} reached={reached}')"
    ).replace("GRADER", str(os.getpid()))
    pinned = {"os": ["os", None], "check": ["course_utils.checks.core", "check"]}
    check = {"grade_id": "g", "nonce": "n", "source": source, "builtins": ["OSError"],
             "pinned": pinned}  # fmt: skip
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    pid, verdicts = checker.start([check], ["course_utils.checks.core"], str(tmp_path), 1,
                                  (requests_write, replies_read))  # fmt: skip
    os.close(requests_write)
    os.close(replies_read)
    server = threading.Thread(target=_serve_missing, args=(requests_read, replies_write, "g"))
    server.start()
    with os.fdopen(verdicts) as lines:
        verdict = json.loads(lines.readline())
    server.join(timeout=60)
    os.waitpid(pid, 0)
    for fd in (requests_read, replies_write):
        os.close(fd)
    found = dict(re.findall(r"(\w+)=(\w+)", verdict["evalue"]))
    assert found["pid"] == "1" and found["reached"] == "no", verdict
    assert verdict["status"] == "failed" and verdict["ename"] == "CheckFailed", verdict
    if os.geteuid() == 0:
        assert found["uid"] != "0", verdict


def test_a_verdict_passes_only_when_it_says_completed():
    from course_utils.instructor.grading import _verdict

    assert _verdict({"status": "completed", "ename": "", "tampering": []}).status == "ok"
    for message in ({"ename": ""}, {"status": "Completed"}, {},
                    {"status": "completed", "ename": "x"}, {"status": ["completed"]}):  # fmt: skip
        assert _verdict(message).status == "error", message
    lying = _verdict({"status": "failed", "ename": "<script>", "evalue": "x"})
    assert lying.ename == "Error"


# -- graded for real ------------------------------------------------------------------------

BESIDE_CHECK = (  # a check whose evidence is gathered with the answer, decided apart
    "# evidence beside your answer, verdict apart: (it runs the answer where it lives)\n"
    "from course_utils.checks.evidence.common import results_of\n"
    "[seen] = results_of(double, [((3,), {})])\n"
    "check(seen['returned'] == 6, 'double(3) should be 6')\n"
    "### BEGIN HIDDEN TESTS\n[seen] = results_of(double, [((17,), {})])\n"
    "check(seen['returned'] == 34, 'double(17) should be 34')\n"
    "### END HIDDEN TESTS"
)


def _beside(answer: str) -> object:
    return _notebook([
        ("code", "from course_utils.checks.core import check", {}),
        ("code", answer, _meta("b-double", solution=True)),
        ("code", BESIDE_CHECK, _meta("b-check", solution=False)),
    ])  # fmt: skip


ERRORS = {  # answers that raise what would read as a pass, or leak the hidden test's input
    "empty name": "class E(Exception):\n    pass\nE.__name__ = E.__qualname__ = ''\n"
    "def double(x):\n    raise E('LEAK %r' % x)",
    "empty name, str raises": "class E(Exception):\n    def __str__(self):\n"
    "        raise RuntimeError('no')\nE.__name__ = ''\ndef double(x):\n    raise E()",
    "named like a pass": "class CheckFailed(Exception):\n    pass\n"
    "def double(x):\n    raise CheckFailed('LEAK %r' % x)",
    "the course's class": "from course_utils.checks.core import CheckFailed\n"
    "def double(x):\n    raise CheckFailed('LEAK %r' % x)",
    "base exception": "class Quiet(BaseException):\n    pass\nQuiet.__name__ = ''\n"
    "def double(x):\n    raise Quiet('LEAK %r' % x)",
}
FORGED_DONE = (  # in the judge only (the kernel has no --fd): a forged "done", then an end
    "import os, sys\nif '--fd' in sys.argv:\n"
    "    os.write(int(sys.argv[sys.argv.index('--fd') + 1]), b'done\\n')\n    os._exit(0)"
)


@pytest.mark.slow
def test_errors_with_lying_names_fail_and_no_learner_text_reaches_feedback(tmp_path):
    source = tmp_path / "source" / "b.ipynb"
    write_notebook(_beside("def double(x):\n    return 2 * x"), source)
    apart_source = tmp_path / "source" / "ex.ipynb"
    write_notebook(_instructor(), apart_source)
    notebooks = {name: (_beside(code), source) for name, code in ERRORS.items()}
    notebooks["honest"] = (_beside("def double(x):\n    return 2 * x"), source)
    raising = "def double(x):\n    raise ValueError('LEAK %r' % x)"
    notebooks["apart"] = (_attack(raising), apart_source)
    notebooks["forged done"] = (_attack(FORGED_DONE, where=1), apart_source)
    tasks = []
    for name, (notebook, reference) in notebooks.items():
        path = tmp_path / "class" / name.replace(" ", "-").replace(",", "") / reference.name
        write_notebook(notebook, path)
        tasks.append(Task(name, reference.name, str(path), str(reference)))
    out = tmp_path / "out"
    options = Options(sandbox="auto", jobs=2, threads=1, cell_timeout_s=60)
    results = grade_tasks(tasks, options, out, io.StringIO(), resume=False)
    errors = {t.learner: r["error"] for t, r in zip(tasks, results, strict=True) if "error" in r}
    assert not errors, errors
    reports = {task.learner: result["report"] for task, result in zip(tasks, results, strict=True)}
    assert reports["honest"]["score"] == 1 and reports["honest"]["tampering"] == []
    for name in ERRORS:
        [result] = reports[name]["checks"]
        assert result["points"] == 0.0, (name, reports[name])
        assert "LEAK" not in result["reason"] and "17" not in result["reason"], (name, result)
    for check in reports["apart"]["checks"]:
        assert check["points"] == 0.0 and "LEAK" not in check["reason"], check
    forged = reports["forged done"]
    assert {c["grade_id"]: c["points"] for c in forged["checks"]} == dict.fromkeys(CHECKS, 0.0)
    assert any("forged" in flag for flag in forged["tampering"]), forged
    for feedback in (out / "feedback").rglob("*.ipynb"):
        text = feedback.read_text()
        assert "LEAK" not in text.replace("'LEAK %r'", ""), feedback
        assert "double(17)" not in text, feedback  # the hidden test


_PIECES = (
    "import sys  # pieces\nfor _ in range(200):\n    sys.stdout.write('y' * 2**20)\n"
    "    sys.stdout.flush()"
)
_LOUD = {  # printed at once (one message), and in many pieces: (cell, a slow grader)
    "at once": ("print('x' * (200 * 2**20))", False),
    "in pieces": (_PIECES, False),
    # a grader that reads slower than the kernel prints (a busy machine: 103 MiB grew under
    # load before ZeroMQ's receive queue was bounded; made certain here by a sleep)
    "in pieces, read slowly": (_PIECES, True),
}
_SLOW_READER = (
    "import time\nfrom course_utils.instructor import grading\n"
    "_output = grading._BoundedClient.output\n"
    "def _slow(self, *args):\n    time.sleep(0.05)\n    return _output(self, *args)\n"
    "grading._BoundedClient.output = _slow\n"
)


@pytest.mark.slow
@pytest.mark.parametrize(("cell", "slow"), _LOUD.values(), ids=_LOUD.keys())
def test_a_cell_printing_200_mib_leaves_the_grading_process_small(cell, slow, tmp_path):
    """The grading process keeps a bounded part of a cell's outputs (and says so); it
    never holds the 200 MiB, let alone several copies of it, however slowly it reads."""
    notebook = _beside("def double(x):\n    return 2 * x")
    notebook.cells.insert(1, _notebook([("code", cell, {})]).cells[0])
    write_notebook(notebook, tmp_path / "loud.ipynb")
    write_notebook(_beside("def double(x):\n    return 2 * x"), tmp_path / "source.ipynb")
    program = (
        # VmHWM: this process's own peak (ru_maxrss keeps the parent's across exec)
        "import json, re, sys, torch\nfrom pathlib import Path\n"
        "from course_utils.instructor.grading import grade_submission\n"
        "def hwm():\n"
        "    status = Path('/proc/self/status').read_text()\n"
        "    return int(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1)) // 1024\n"
        # a quiet grading first: what grading imports and caches is not the outputs' cost
        "grade_submission(Path(sys.argv[2]), Path(sys.argv[2]))\n"
        + (_SLOW_READER if slow else "")
        + "before = hwm()\n"
        "report, feedback = grade_submission(Path(sys.argv[1]), Path(sys.argv[2]))\n"
        "peak = hwm()\n"
        "print(json.dumps({'peak': peak, 'grew': peak - before, 'score': report.score,\n"
        "                  'notes': report.notes}))\n"
    )
    paths = [str(tmp_path / "loud.ipynb"), str(tmp_path / "source.ipynb")]
    done = subprocess.run(
        [sys.executable, "-c", program, *paths],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["peak"] < 1024 and result["grew"] < 100, result  # MiB (200 MiB printed)
    assert result["score"] == 1, result
    if "pieces" in cell:
        assert any("printed more than the grader keeps" in n for n in result["notes"]), result


def test_a_file_name_that_is_not_utf8_is_a_note_for_its_learner(tmp_path):
    from course_utils.instructor.intake import learner_folders

    class_folder = tmp_path / "class"
    for learner in ("ann", "bob"):
        write_notebook(
            _beside("def double(x):\n    return 2 * x"), class_folder / learner / "b.ipynb"
        )
    bad = os.path.join(os.fsencode(class_folder / "bob"), b"caf\xe9.ipynb")
    with open(bad, "wb") as file:
        file.write((class_folder / "bob" / "b.ipynb").read_bytes())
    notes: dict[str, list[str]] = {}
    learners = learner_folders(class_folder, notes)
    assert [p.name for p in learners["ann"]] == ["b.ipynb"]
    assert [p.name for p in learners["bob"]] == ["b.ipynb"]
    assert notes["bob"] == ["caf?.ipynb: refused: its name is not UTF-8 text "
                            "(rename it and hand it in again)"]  # fmt: skip
    "\n".join(notes["bob"]).encode("utf-8")  # printable, writable


def test_a_failure_is_named_only_by_an_exact_trusted_class():
    from course_utils.checks import core as classroom

    liar = type("NameError", (Exception,), {})
    assert checker.verdict_of(liar("LEAK"), classroom, True) == {
        "status": "failed", "ename": "Error", "evalue": ""}  # fmt: skip
    said = checker.verdict_of(NameError("name 'double' is not defined"), classroom, True)
    assert said["ename"] == "NameError" and "double" in said["evalue"]
    assert checker.verdict_of(ValueError("LEAK"), classroom, True)["evalue"] == ""
    from course_utils.instructor.grading import _verdict

    assert _verdict({"status": "failed", "ename": "__import__"}).ename == "Error"


def test_the_feedback_notebook_renders_learner_content_inert():
    """What the grader writes into a feedback notebook is text: the summary's learner
    texts escaped, a learner's HTML, SVG or script outputs dropped (text kept)."""
    import nbformat

    from course_utils.instructor.grading import CheckResult, GradeReport, _feedback

    script = "<script>alert(1)</script>"
    report = GradeReport("s", "r", [CheckResult("b-check", 0.0, 1.0, False, script)], 1.0,
                         notes=[f"cell {script}"], tampering=[script])  # fmt: skip
    learner = _beside("def double(x):\n    return 2 * x")
    ran = [nbformat.v4.new_code_cell(c.source) for c in learner.cells if c.cell_type == "code"]
    rich = {"text/html": script, "application/javascript": "alert(1)",
            "image/svg+xml": f"<svg>{script}</svg>", "text/plain": "shown"}  # fmt: skip
    ran[0].outputs = [nbformat.v4.new_output("display_data", data=rich)]
    notebook = _feedback(learner, ran, [0, 1, 2], {2: "b-check"}, report)
    summary = notebook.cells[0].source  # Markdown: raw HTML in it would be live
    assert "<script>" not in summary and "&lt;script&gt;" in summary
    [output] = notebook.cells[1].outputs  # stream outputs are rendered as escaped text
    assert output["data"] == {"text/plain": "shown"}


# -- evidence observed in a child forked from the learner's runtime -------------------------

_RIGHT = "def double(x):\n    return 2 * x\n"
OBSERVED_ATTACKS = {  # (the answer cell, the points it should get, what the reason says)
    # an instrument replaced before the check: the observation refuses to run on it
    "instrument replaced": (
        "import course_utils.checks.evidence.common as common\n"
        "common.results_of = lambda answer, calls: [{'returned': 2 * c[0][0]} for c in calls]\n"
        "def double(x):\n    return 0",
        0.0,
        "tampering",
    ),
    # a torch function mode left on would see (and could change) the observer's torch calls
    "function mode": (
        "from torch.overrides import TorchFunctionMode\nTorchFunctionMode().__enter__()\n"
        "def double(x):\n    return 2 * x",
        0.0,
        "tampering",
    ),
    # a thread that keeps forging what it can reach does not survive the fork
    "thread": (
        "import threading, time, course_utils.checks.evidence.common as common\n"
        "def forge():\n    while True:\n        time.sleep(0.001)\n"
        "threading.Thread(target=forge, daemon=True).start()\n" + _RIGHT,
        1.0,
        "",
    ),
    # a timer and a signal handler of the learner's do not fire in the observing child
    "timer": (  # its handler ends only a process forked from where it was set
        "import signal, os\nMINE = os.getpid()\n"
        "signal.signal(signal.SIGALRM, lambda *a: os.getpid() != MINE and os._exit(0))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)\n" + _RIGHT,
        1.0,
        "",
    ),
    # the answer ends the observing child: no evidence, a neutral reason
    "exit in the child": (
        "import os\ndef double(x):\n    os._exit(0)",
        0.0,
        "ended before it gave its result",
    ),
    # a decompression bomb as evidence: a huge tensor made of one repeated value
    "huge evidence": (
        "import torch\ndef double(x):\n    return torch.zeros(2**28).expand(4, -1)",
        0.0,
        "",
    ),
}


@pytest.mark.slow
def test_evidence_is_gathered_in_a_clean_child_and_decided_apart(tmp_path):
    """An observing half runs in a child forked from the learner's runtime: an instrument
    replaced or a torch mode left on fails the check (flagged), a learner's thread or timer
    does not reach it, an answer that ends it scores 0 with a neutral reason, and a right
    answer scores in full with no flag."""
    source = tmp_path / "source" / "b.ipynb"
    write_notebook(_beside(_RIGHT), source)
    cases = {"honest": (_RIGHT, 1.0, ""), **OBSERVED_ATTACKS}
    tasks = []
    for name, (answer, _, _) in cases.items():
        path = tmp_path / "class" / name.replace(" ", "-") / "b.ipynb"
        write_notebook(_beside(answer), path)
        tasks.append(Task(name, "b.ipynb", str(path), str(source)))
    options = Options(sandbox="auto", jobs=2, threads=1, cell_timeout_s=60)
    results = grade_tasks(tasks, options, tmp_path / "out", io.StringIO(), resume=False)
    for task, result in zip(tasks, results, strict=True):
        assert "error" not in result, (task.learner, result)
        report = result["report"]
        _, points, said = cases[task.learner]
        [check] = report["checks"]
        assert check["points"] == points, (task.learner, report)
        assert said in check["reason"], (task.learner, check)
        assert bool(report["tampering"]) == (said == "tampering"), (task.learner, report)
