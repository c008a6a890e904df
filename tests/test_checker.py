"""Every check is graded apart (issues 33 and 43): the verdict is computed by the grader's
checker, a process no learner code runs in; the learner's runtime sends it plain data only.
Attempts of our own against such checks score 0; honest submissions score in full; a check
that needs the answer's own objects gets them observed where the answer runs (an observing
half of course_utils.checks.evidence, in a child forked from the runtime) and still decides
in the checker."""

from __future__ import annotations

import io
import json
import os
import pickle

import nbformat
import pytest
import torch
from test_grader import _meta, _notebook
from test_tampering import CHECKS, _instructor

from course_utils.checks import data_format
from course_utils.instructor import checker
from course_utils.instructor.gradebook import Options, Task, grade_tasks
from course_utils.instructor.student import write_notebook

# -- the checker's end of the channel, against crafted replies (no grader needed) --------


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

    def data(self, value: object) -> None:
        self.reply(*checker.describe_value(value, object()))


class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # what would run on unpickling, if anything unpickled it freely
        return (os.system, (f"touch {self.marker}",))


class _AlwaysEqual(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class _Lying(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return True


def test_plain_data_crosses_by_value_with_its_exact_type():
    runtime = _Runtime()
    sent = {"n": 3, "x": 2.5, "s": "a", "t": torch.ones(2), "size": torch.Size([2]),
            "nested": [(1, None, True)], "dtype": torch.float16}  # fmt: skip
    runtime.data(sent)
    got = runtime.channel.value("answer")
    assert got.keys() == sent.keys() and torch.equal(got["t"], sent["t"])
    assert type(got["nested"][0][2]) is bool and got["dtype"] is torch.float16
    assert data_format.plain(got)


@pytest.mark.parametrize(
    "value",
    [_AlwaysEqual(0), [_AlwaysEqual(1)], torch.zeros(2).as_subclass(_Lying),
     type("S", (str,), {"__eq__": lambda s, o: True, "__hash__": str.__hash__})("x"),
     type("L", (list,), {"__eq__": lambda s, o: True})([1]),
     type("D", (dict,), {"__eq__": lambda s, o: True})(a=1),
     type("Tup", (tuple,), {"__eq__": lambda s, o: True})((1,))],
    ids=["int", "in a list", "tensor subclass", "str", "list", "dict", "tuple"],
)  # fmt: skip
def test_a_learner_class_never_crosses(value):
    runtime = _Runtime()
    runtime.data(value)
    got = runtime.channel.value("answer")
    with pytest.raises(data_format.AnswerError, match=r"not plain data|cannot cross"):
        got == 0  # noqa: B015  (any use of the refused value says why)
    runtime.data(value)
    with pytest.raises(data_format.AnswerError, match="not plain data"):
        runtime.channel.call("double", (3,), {})


def test_a_bool_or_exact_type_survives_and_a_numpy_scalar_does_not():
    numpy = pytest.importorskip("numpy")
    runtime = _Runtime()
    for value in (True, numpy.bool_(True), numpy.float64(1.0)):
        runtime.data(value)
    assert runtime.channel.value("a") is True
    for name in ("b", "c"):  # numpy's bool_ and float64 (a float subclass) are refused
        with pytest.raises(data_format.AnswerError):
            bool(runtime.channel.value(name))


def test_a_crafted_pickle_never_runs_in_the_checker(tmp_path):
    runtime = _Runtime()
    markers = [tmp_path / f"ran-{n}" for n in range(3)]
    buffer = io.BytesIO()
    torch.save(_Boom(str(markers[0])), buffer)  # the zip format torch.save writes
    runtime.reply({"kind": "data", "type": "int"}, buffer.getvalue())
    runtime.reply({"kind": "data", "type": "int"}, pickle.dumps(_Boom(str(markers[1]))))
    runtime.data(_Boom(str(markers[2])))  # the learner's __reduce__, through describe_value
    for _ in markers:
        with pytest.raises(data_format.AnswerError, match="not plain data"):
            runtime.channel.call("double", (3,), {})
    assert not any(marker.exists() for marker in markers)


def test_a_broken_channel_stops_the_check():
    runtime = _Runtime()
    os.write(runtime.replies_write, b"0" * 64 + b' {"kind": "result"}\n')  # a forged line
    with pytest.raises(checker.ChannelBroken, match="a frame of"):
        runtime.channel.value("double")
    runtime = _Runtime()
    checker.write_frame(runtime.replies_write, b"[" * 60_000)  # not JSON a check can use
    with pytest.raises(checker.ChannelBroken):
        runtime.channel.value("double")
    assert not issubclass(checker.ChannelBroken, Exception)  # a check cannot swallow it


def test_what_the_answer_raised_comes_back_as_a_builtin_or_a_neutral_error():
    runtime = _Runtime()
    runtime.reply(checker.raised(ValueError("bad value")))
    with pytest.raises(ValueError, match="bad value"):
        runtime.channel.call("double", (3,), {})
    liar = type("ValueError", (Exception,), {})  # a notebook's class that borrows the name
    liar.__module__ = "__main__"
    for error in (liar("x"), SystemExit(0), data_format.AnswerError("y")):
        runtime.reply(checker.raised(error))
        with pytest.raises(data_format.AnswerError, match="double raised"):
            runtime.channel.call("double", (3,), {})


def test_the_names_a_check_reads_include_nested_code():
    code = compile("def f():\n    return [g(y) for y in z]\nlambda: h", "<c>", "exec")
    assert {"f", "g", "z", "h"} <= set(checker.names_read(code))


def test_the_checks_modules_are_imported_once_in_the_grading_process(monkeypatch, tmp_path):
    """A submission's checker is forked from the grading process, which imports the checks'
    modules first: the next submission's checker starts with them (no import per
    submission); a module that fails to import is left to the checker to report."""
    import sys

    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    pid, verdicts = checker.start(
        [], ["colorsys", "no_such_module_here"], str(tmp_path), 1, (requests_write, replies_read)
    )
    assert "colorsys" in sys.modules and "no_such_module_here" not in sys.modules
    assert os.waitpid(pid, 0)[1] == 0
    for fd in (requests_read, requests_write, replies_read, replies_write, verdicts):
        os.close(fd)


def test_the_workers_server_imports_the_course_modules_the_checks_need(tmp_path):
    from course_utils.instructor.gradebook import server_preload

    notebook = _instructor()
    notebook.cells[1].source += "\nimport numpy\nimport course_utils.timing"
    write_notebook(notebook, tmp_path / "a.ipynb")
    preload = server_preload({"a.ipynb": tmp_path / "a.ipynb"})
    # ``import course_utils.timing`` binds ``course_utils``; the submodule is imported too,
    # or a check reading course_utils.timing.x would fail in a checker that lacks it
    assert preload == [
        "torch",
        "course_utils",
        "course_utils.checks.core",
        "course_utils.timing",
        "nbconvert",
    ]


# -- through the grader ------------------------------------------------------------------

_LIES = (
    "class E(int):\n    def __eq__(s, o): return True\n    __ne__ = lambda s, o: False\n"
    "    __hash__ = int.__hash__\n"
    "class F(float):\n    def __eq__(s, o): return True\n    def __abs__(s): return 0.0\n"
    "    def __lt__(s, o): return True\n    def __sub__(s, o): return F(0.0)\n"
    "    __rsub__ = __sub__\n    __hash__ = float.__hash__\n"
    "class Anything:\n    def __eq__(s, o): return True\n    def __bool__(s): return True\n"
    "    def __abs__(s): return 0\n    def __lt__(s, o): return True\n"
    "    def __float__(s): return 3.141592653589793\n"
    "class Lie(torch.Tensor):\n    @classmethod\n"
    "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
    "        return torch.tensor(True) if 'close' in func.__name__ or 'eq' in func.__name__ "
    "else super().__torch_function__(func, types, args, kwargs or {})\n"
)
ANSWERS = {  # (double, halve, area) of a learner who solved nothing and lies instead
    "int subclass": ("E(0)", "t", "0.0"),
    "float subclass": ("0", "F(0.0)", "F(0.0)"),
    "objects": ("Anything()", "Anything()", "Anything()"),
    "tensor subclass": ("0", "torch.zeros(3).as_subclass(Lie)", "0.0"),
    "containers": ("type('L', (list,), {'__eq__': lambda s, o: True})([0])",
                   "type('T', (tuple,), {'__eq__': lambda s, o: True})((0,))",
                   "type('D', (dict,), {'__eq__': lambda s, o: True})()"),
}  # fmt: skip
ATTACKS = {
    "patched library": "import builtins, course_utils.checks.core as c\n"
    "torch.allclose = lambda *a, **k: True\nmath.isclose = lambda *a, **k: True\n"
    "c.check = c.check_close = lambda *a, **k: None\nbuiltins.all = lambda x: True\n"
    "builtins.abs = lambda x: 0\ncheck = check_close = lambda *a, **k: None",
    "frames": "import sys, signal, inspect\ndef fake(*a, **k): pass\n"
    "def handler(signum, frame):\n    while frame is not None:\n"
    "        frame.f_globals.update(check=fake, check_close=fake)\n        frame = frame.f_back\n"
    "signal.signal(signal.SIGALRM, handler)\nsignal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)\n"
    "def double(x):\n    for f in inspect.stack():\n"
    "        f.frame.f_globals.update(check=fake)\n    return 0",
    "numpy memory": "import numpy, struct\nclass At:\n    def __init__(s, address, n):\n"
    "        s.__array_interface__ = {'shape': (n,), 'typestr': '|u1', "
    "'data': (address, False), 'version': 3}\n"
    "pi = numpy.asarray(At(id(math.pi) + 16, 8))\n"  # the float's value, in place
    "pi[:] = numpy.frombuffer(struct.pack('d', 0.0), dtype=numpy.uint8)\n"
    "def area(r):\n    return 0.0",
    "crafted pickle": "import sys, io, os\nfrom course_utils.instructor import checker as ch\n"
    "class Boom:\n    def __reduce__(self):\n        return (os.system, ('touch MARKER',))\n"
    "def double(x):\n    buffer = io.BytesIO()\n    torch.save(Boom(), buffer)\n"
    "    fd = int(sys.argv[sys.argv.index('--replies') + 1])\n"
    '    ch.write_frame(fd, b\'{"kind": "data", "type": "int"}\')\n'
    "    ch.write_frame(fd, buffer.getvalue())\n    return Boom()",
}


def _lying(double: str, halve: str, area: str) -> nbformat.NotebookNode:
    notebook = _instructor()
    notebook.cells[2].source = _LIES + f"def double(x):\n    return {double}"
    notebook.cells[4].source = f"def halve(t):\n    return {halve}"
    notebook.cells[6].source = f"def area(r):\n    return {area}"
    return notebook


def _wrong(code: str) -> nbformat.NotebookNode:
    notebook = _lying("0", "t", "0.0")
    notebook.cells[6].source += "\n" + code  # after every answer: its definitions win
    return notebook


@pytest.mark.slow
def test_attempts_against_checks_graded_apart_score_0(tmp_path):
    marker = tmp_path / "ran-in-the-checker"
    source = tmp_path / "source" / "ex.ipynb"
    write_notebook(_instructor(), source)
    notebooks = {name: _lying(*answers) for name, answers in ANSWERS.items()}
    notebooks |= {name: _wrong(code.replace("MARKER", str(marker)))
                  for name, code in ATTACKS.items()}  # fmt: skip
    notebooks["honest"] = _instructor()
    tasks = []
    for name, notebook in notebooks.items():
        path = tmp_path / "class" / name.replace(" ", "-") / "ex.ipynb"
        write_notebook(notebook, path)
        tasks.append(Task(name, "ex.ipynb", str(path), str(source)))
    options = Options(sandbox="none", jobs=2, threads=1, cell_timeout_s=60)
    results = grade_tasks(tasks, options, None, io.StringIO(), resume=False)
    errors = {t.learner: r["error"] for t, r in zip(tasks, results, strict=True) if "error" in r}
    assert not errors, errors
    reports = {task.learner: result["report"] for task, result in zip(tasks, results, strict=True)}
    honest = reports.pop("honest")
    assert honest["score"] == 3 and honest["tampering"] == [], honest
    for name, report in reports.items():
        points = {check["grade_id"]: check["points"] for check in report["checks"]}
        assert points == dict.fromkeys(CHECKS, 0.0), (name, report)
    reasons = " ".join(c["reason"] for c in reports["int subclass"]["checks"])
    assert "double returned a value that is not plain data" in reasons
    assert " E" not in reasons  # the learner's class name is not feedback
    said = " ".join(reports["patched library"]["tampering"])
    assert "math.isclose was replaced" in said and "torch.allclose" in said
    assert not marker.exists()


def _mutating() -> nbformat.NotebookNode:
    observed = (
        "# evidence beside your answer, verdict apart: fill changes the dict passed in\n"
        "from course_utils.checks.evidence.common import results_of\n"
        "[seen] = results_of(fill, [(({},), {})])\n"
        "check(seen['arguments'] == [{'a': 1}], 'fill(d) should set d[\"a\"] = 1')"
    )
    check = "d = {}\nfill(d)\ncheck(d == {'a': 1}, 'fill(d) should set d[\"a\"] = 1')"
    return _notebook([
        ("code", "from course_utils.checks.core import check", {}),
        ("code", "def fill(d):\n    d['a'] = 1", _meta("m-fill", solution=True)),
        ("code", observed, _meta("m-observed", solution=False)),
        ("code", check, _meta("m-apart", solution=False)),
    ])  # fmt: skip


@pytest.mark.slow
def test_evidence_observed_with_the_answer_sees_its_change_and_a_plain_call_does_not(tmp_path):
    """An observing half runs the answer in the learner's runtime and brings back what it
    did to the dict it was given, as data: the change is seen. A plain call from the checker
    sends the dict by value: the change stays in the runtime, and the check fails."""
    source = tmp_path / "source" / "m.ipynb"
    write_notebook(_mutating(), source)
    task = Task("ann", "m.ipynb", str(source), str(source))
    options = Options(sandbox="none", jobs=1, threads=1)
    [result] = grade_tasks([task], options, None, io.StringIO(), resume=False)
    points = {c["grade_id"]: c["points"] for c in result["report"]["checks"]}
    assert points == {"m-observed": 1.0, "m-apart": 0.0}, result["report"]


def test_refusing_course_helpers_in_the_checker_says_to_observe_the_answer(monkeypatch):
    """In the checker the learner's function runs in another process: refusing the course's
    helpers there would refuse nothing (a shortcut through them would pass), so it stops the
    check with a line telling the instructor to call the answer from an observing half;
    elsewhere it refuses."""
    from course_utils.checks import core
    from course_utils.footprint import optimizer_state_bytes

    def shortcut(optimizer):
        return optimizer_state_bytes(optimizer)

    sgd = torch.optim.SGD([torch.ones(1, requires_grad=True)])
    with pytest.raises(core.CheckFailed, match="course's own"):
        core.without_course_helpers(shortcut, optimizer_state_bytes)(sgd)
    monkeypatch.setattr(core, "_IN_CHECKER", [True])
    with pytest.raises(core.NeedsBeside, match="observing half"):
        core.without_course_helpers(shortcut, optimizer_state_bytes)(sgd)


def test_course_checks_refuse_helpers_only_in_observing_halves():
    """The course's helpers are refused while the answer runs only where the answer runs:
    no check cell refuses them itself (in the checker that would refuse nothing), and the
    observing halves that do are recorded by the guard."""
    import pkgutil
    from pathlib import Path

    import course_utils.checks.evidence as evidence

    refusing = ("without_course_helpers", "course_helpers_refused")
    root = Path(__file__).resolve().parent.parent / "notebooks"
    for path in sorted(root.glob("0*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.metadata.get("nbgrader", {}).get("grade"):
                assert not any(name in cell.source for name in refusing), (path.name, cell.id)
    modules = [m.name for m in pkgutil.iter_modules(evidence.__path__)]
    observing = [m for m in modules if any(
        name in (Path(evidence.__path__[0]) / f"{m}.py").read_text() for name in refusing
    )]  # fmt: skip
    assert len(observing) >= 4, observing  # 01, 03, 04, 05, 09 refuse the course's helpers


@pytest.mark.slow
def test_a_check_apart_reads_a_submodule_its_dotted_import_names(tmp_path):
    """``import course_utils.text`` binds ``course_utils``; the checker imports the
    submodule too (nothing in the grader does), so the check finds ``course_utils.text``."""
    check = "check(course_utils.text.decode(encode_sum()) == '1+1=2', 'encode 1+1=2')"
    notebook = _notebook([
        ("code", "import course_utils.text\nfrom course_utils.checks.core import check", {}),
        ("code", "def encode_sum():\n    return course_utils.text.encode('1+1=2')",
         _meta("d-encode", solution=True)),
        ("code", check, _meta("d-check", solution=False)),
    ])  # fmt: skip
    source = tmp_path / "source" / "d.ipynb"
    write_notebook(notebook, source)
    task = Task("ann", "d.ipynb", str(source), str(source))
    options = Options(sandbox="none", jobs=1, threads=1)
    [result] = grade_tasks([task], options, None, io.StringIO(), resume=False)
    assert result["report"]["score"] == 1.0, result["report"]["checks"]
