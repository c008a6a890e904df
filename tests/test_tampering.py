"""The grader against a learner who edits the notebook to score without solving: every
class of the threat model (docs/instructor-guide.md, "Threat model") scores 0 or is
flagged, in several forms each (obfuscated ones included); honest submissions score as
before and are not flagged.

Each attack is a wrong answer plus the attack, so any point it scores is a faked one. The
submissions of one class are graded together, two at a time (one kernel each).
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import nbformat
import pytest
from test_grader import _meta, _notebook

from course_utils.instructor.gradebook import Options, Task, grade_tasks
from course_utils.instructor.grading import guard_spec
from course_utils.instructor.student import write_notebook

IMPORTS = (
    "import math\nimport torch\nfrom course_utils.checks.core import check, check_close, passed"
)
DOUBLE = "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"
DOUBLE_CHECK = (
    "check(double(3) == 6, 'double(3) should be 6')\n"
    "check(isinstance(double(2), int), 'double of an int should be an int')\n"
    "### BEGIN HIDDEN TESTS\n"
    "check(all(double(v) == 2 * v for v in range(-3, 4)), 'double(v) should be 2 * v')\n"
    "### END HIDDEN TESTS\npassed('double')"
)
HALVE = "def halve(t):\n    ### BEGIN SOLUTION\n    return t / 2\n    ### END SOLUTION"
HALVE_CHECK = (
    "check_close(halve(torch.ones(3)), torch.full((3,), 0.5), 'halve of a tensor')\n"
    "check_close(halve(1.0), 0.5, 'halve of a float')\npassed('halve')"
)
AREA = "def area(r):\n    ### BEGIN SOLUTION\n    return math.pi * r * r\n    ### END SOLUTION"
AREA_CHECK = (  # plain asserts, on math and torch
    "assert math.isclose(area(1.0), math.pi), 'area(1) should be pi'\n"
    "assert torch.allclose(torch.tensor(area(2.0)), torch.tensor(4 * math.pi)), 'area(2)'"
)
WRONG = {  # the answers of a learner who did not solve anything
    2: "def double(x):\n    return 0",
    4: "def halve(t):\n    return t",
    6: "def area(r):\n    return 0.0",
}
CHECKS = ["t-double-check", "t-halve-check", "t-area-check"]


def _instructor() -> nbformat.NotebookNode:
    return _notebook(
        [
            ("markdown", "# Exercises an attacker would rather not solve", {}),
            ("code", IMPORTS, {}),
            ("code", DOUBLE, _meta("t-double", solution=True)),
            ("code", DOUBLE_CHECK, _meta("t-double-check", solution=False)),
            ("code", HALVE, _meta("t-halve", solution=True)),
            ("code", HALVE_CHECK, _meta("t-halve-check", solution=False)),
            ("code", AREA, _meta("t-area", solution=True)),
            ("code", AREA_CHECK, _meta("t-area-check", solution=False)),
        ]
    )


def _attack(code: str, *, where: int = 2, new_cell: bool = False) -> nbformat.NotebookNode:
    """Wrong answers, and ``code`` added to the answer cell at ``where`` (or as a new cell
    after it)."""
    notebook = _instructor()
    for index, source in WRONG.items():
        notebook.cells[index].source = source
    if new_cell:
        notebook.cells.insert(where + 1, nbformat.v4.new_code_cell(code))
    else:
        notebook.cells[where].source += "\n" + code
    return notebook


def _grade(tmp_path: Path, notebooks: dict[str, nbformat.NotebookNode], **limits: float):
    source = tmp_path / "source" / "ex.ipynb"
    write_notebook(_instructor(), source)
    tasks = []
    for name, notebook in notebooks.items():
        path = tmp_path / "class" / name / "ex.ipynb"
        write_notebook(notebook, path)
        tasks.append(Task(name, "ex.ipynb", str(path), str(source)))
    options = Options(sandbox="none", jobs=2, threads=1, **limits)
    results = grade_tasks(tasks, options, None, io.StringIO(), resume=False)
    pairs = list(zip(tasks, results, strict=True))
    ungraded = {
        task.learner: result.get("error") for task, result in pairs if "report" not in result
    }
    assert not ungraded, ungraded  # the grader's own error for each submission it did not grade
    return {task.learner: result["report"] for task, result in zip(tasks, results, strict=True)}


def _assert_nothing_faked(reports: dict, *, flagged: bool = True) -> None:
    for name, report in reports.items():
        points = {check["grade_id"]: check["points"] for check in report["checks"]}
        assert points == dict.fromkeys(CHECKS, 0.0), (name, report)
        if flagged:
            assert report["tampering"], (name, report)


def _encoded(code: str) -> str:
    """``code`` run from a base64 string: no name of the attack appears in the cell."""
    text = base64.b64encode(code.encode()).decode()
    return f"exec(__import__('base64').b64decode('{text}').decode())"


# -- the spec the grader gives the guard ----------------------------------------------


def test_guard_spec_pins_instructor_imports_and_builtins_not_the_learners_names():
    notebook = _instructor()
    notebook.cells[1].source += "\nfrom course_utils.checks.core import check as verify\ndouble = 1"
    spec = guard_spec(notebook)
    double = spec["checks"]["t-double-check"]
    assert double["pinned"] == {
        "check": ("course_utils.checks.core", "check"),
        "passed": ("course_utils.checks.core", "passed"),
    }
    assert double["builtins"] == ["all", "int", "isinstance", "range"]
    assert "double" not in double["pinned"]  # the solution's name is the learner's
    area = spec["checks"]["t-area-check"]
    assert set(area["pinned"]) == {"math", "torch"} and area["builtins"] == []
    assert "course_utils.checks.core" in spec["modules"] and "math" in spec["modules"]
    assert "BEGIN HIDDEN TESTS" in double["source"]  # the guard runs the whole check


# -- honest submissions -----------------------------------------------------------------


@pytest.mark.slow
def test_honest_submissions_score_in_full_and_are_not_flagged(tmp_path):
    helpers = _instructor()  # honest, unusual: helper cells, re-imports, gc, a namedtuple
    helpers.cells.insert(
        2,
        nbformat.v4.new_code_cell(
            "import gc, collections\nfrom course_utils.checks.core import check\n"
            "Point = collections.namedtuple('Point', 'x y', defaults=(0,))\ngc.collect()\n"
            "def twice(x):\n    return x + x"
        ),
    )
    helpers.cells[3].source = "def double(x):\n    return twice(x)"
    helpers.cells[5].source = (
        "def halve(t):\n    sum = 0  # a local that shadows a built-in\n    return t * 0.5"
    )
    # one class run for the three (the wrong one is the control: graded, scores 0)
    reports = _grade(tmp_path, {"plain": _instructor(), "helpers": helpers,
                                "wrong": _attack("pass")})  # fmt: skip
    wrong = reports.pop("wrong")
    for name, report in reports.items():
        assert (report["score"], report["max_score"]) == (3, 3), (name, report)
        assert report["tampering"] == [], (name, report["tampering"])
    _assert_nothing_faked({"wrong": wrong}, flagged=False)
    assert wrong["tampering"] == []


# -- 1. rebinding the names the checks call ----------------------------------------------


@pytest.mark.slow
def test_rebinding_the_names_a_check_calls_scores_0(tmp_path):
    fake_math = "math = type('m', (), {'isclose': staticmethod(lambda *a, **k: True), 'pi': 3})"
    reports = _grade(
        tmp_path,
        {
            "lambda": _attack("check = check_close = passed = lambda *a, **k: None\n" + fake_math),
            "globals": _attack(
                "g = globals()\ng['check'] = g['check_close'] = lambda *a, **k: None\n"
                "g['torch'] = type('t', (), {'allclose': staticmethod(lambda *a: True), "
                "'tensor': staticmethod(lambda x: x), 'ones': staticmethod(lambda n: 1.0), "
                "'full': staticmethod(lambda *a: 1.0)})",
                new_cell=True,
            ),
            "encoded": _attack(
                _encoded("check = check_close = lambda *a, **k: None\n" + fake_math)
            ),
            "frames": _attack(  # the answer, while the check runs, rebinds the check's names
                "import sys\ndef double(x):\n"
                "    sys._getframe(1).f_globals.update(check=lambda *a, **k: None)\n    return 0"
            ),
            "builtins": _attack(
                "all = isinstance = lambda *a, **k: True\n"
                "import course_utils.checks.core as c\ncheck = c.check_close\n" + fake_math
            ),
        },
    )
    _assert_nothing_faked(reports)
    said = " ".join(reports["lambda"]["tampering"])
    assert "the name check no longer refers to course_utils.checks.core.check" in said
    assert "the name math no longer refers to math" in said
    assert "Python's built-in all" in " ".join(reports["builtins"]["tampering"])
    assert "inspected the running check's frames" in " ".join(reports["frames"]["tampering"])


# -- 2. patching the check module or its functions' code ------------------------------------


@pytest.mark.slow
def test_patching_the_check_module_or_its_code_scores_0(tmp_path):
    reports = _grade(
        tmp_path,
        {
            "code": _attack(
                "import course_utils.checks.core as c\n"
                "c.check.__code__ = (lambda *a, **k: None).__code__\nmath.isclose = c.check"
            ),
            "module": _attack(
                "import importlib\nm = importlib.import_module('course_utils.checks.' + 'core')\n"
                "setattr(m, 'check', lambda *a, **k: None)\nsetattr(math, 'isclose', m.check)",
                new_cell=True,
            ),
            "defaults": _attack(
                "check_close.__kwdefaults__ = {'rtol': 1e9, 'atol': 1e9}\n"
                "import sys\nsys.modules['course_utils.checks.core'].CheckFailed = Warning"
            ),
            "referrers": _attack(
                "import gc\nfake = lambda *a, **k: None\n"
                "for d in gc.get_referrers(check):\n"
                "    if isinstance(d, dict) and d.get('check') is check:\n"
                "        d['check'] = fake"
            ),
            "swapped back": _attack(  # replaced and restored before any check: flagged
                "import course_utils.checks.core as c\nold = c.check.__code__\n"
                "c.check.__code__ = (lambda *a, **k: None).__code__\nc.check.__code__ = old"
            ),
        },
    )
    _assert_nothing_faked(reports)
    assert any(
        "__code__ of course_utils.checks.core.check" in t
        for t in reports["swapped back"]["tampering"]
    )
    assert any("gc.get_referrers" in t for t in reports["referrers"]["tampering"])


# -- 3. changing how later cells run ----------------------------------------------------------


@pytest.mark.slow
def test_changing_how_later_cells_run_scores_0(tmp_path):
    shell = "get_ipython()"
    reports = _grade(
        tmp_path,
        {
            "input transformer": _attack(
                f"{shell}.input_transformers_post.append("
                "lambda lines: [l for l in lines if 'check' not in l and 'assert' not in l])"
            ),
            "ast transformer": _attack(
                "import ast\nclass Drop(ast.NodeTransformer):\n"
                "    def visit_Expr(self, node):\n        return None\n"
                f"    def visit_Assert(self, node):\n        return None\n"
                f"{shell}.ast_transformers.append(Drop())",
                new_cell=True,
            ),
            "exception handler": _attack(
                f"{shell}.set_custom_exc((BaseException,), lambda *a, **k: None)\n"
                f"{shell}.showtraceback = lambda *a, **k: None"
            ),
            "event hook": _attack(
                "def fake(*a, **k):\n"
                "    get_ipython().user_ns.update(check=lambda *a, **k: None, "
                "check_close=lambda *a, **k: None)\n"
                f"{shell}.events.register('pre_run_cell', fake)"
            ),
            "tracers": _attack(
                "import sys, threading\ndef tracer(frame, event, arg):\n"
                "    return tracer\n"
                "sys.settrace(tracer)\nsys.setprofile(tracer)\nthreading.settrace(tracer)\n"
                "sys.excepthook = lambda *a: None"
            ),
        },
    )
    # The learner's kernel runs no check and the judge runs no cell through IPython: these
    # change nothing the grader runs (flagging them is not needed to score them 0).
    _assert_nothing_faked(reports, flagged=False)
    said = {name: " ".join(report["tampering"]) for name, report in reports.items()}
    assert "sys.settrace" in said["tracers"] and "threading.settrace" in said["tracers"]


# -- 4. patching the library functions a check relies on -------------------------------------


@pytest.mark.slow
def test_patching_library_functions_scores_0(tmp_path):
    reports = _grade(
        tmp_path,
        {
            "math and torch": _attack(
                "math.isclose = lambda *a, **k: True\ntorch.allclose = lambda *a, **k: True\n"
                "torch.testing.assert_close = lambda *a, **k: None"
            ),
            "tensor method": _attack(
                "setattr(getattr(__import__('tor' + 'ch'), 'Tensor'), 'double', "
                "lambda self: __import__('torch').zeros(self.shape, dtype=__import__('torch')"
                ".float64))",
                new_cell=True,
            ),
            "module dict": _attack(
                _encoded(
                    "vars(__import__('math'))['isclose'] = lambda *a, **k: True\n"
                    "import builtins\nvars(builtins)['all'] = lambda *a: True"
                )
            ),
            "builtins": _attack(
                "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.all = lambda x: True"
            ),
        },
    )
    _assert_nothing_faked(reports)
    said = {name: " ".join(report["tampering"]) for name, report in reports.items()}
    assert "math.isclose was replaced" in said["math and torch"]
    assert "torch.Tensor.double was added over the inherited one" in said["tensor method"]
    assert "math.isclose" in said["module dict"]


# -- 5. exiting or killing the kernel at the right moment -------------------------------------


@pytest.mark.slow
def test_exiting_or_killing_the_kernel_scores_0(tmp_path):
    def during(code: str) -> nbformat.NotebookNode:  # the answer ends the process when called
        notebook = _attack("pass")
        for index, name in ((2, "double(x)"), (4, "halve(t)"), (6, "area(r)")):
            notebook.cells[index].source = f"import os, sys\ndef {name}:\n    {code}"
        return notebook

    reports = _grade(
        tmp_path,
        {
            "os._exit": during("os._exit(0)"),
            "sys.exit": during("sys.exit(0)"),
            "kill": during("os.kill(os.getpid(), 9)"),
            "interrupt": during("raise KeyboardInterrupt"),
            "system exit": during("raise SystemExit(0)"),
            "loop": during("while True: pass"),
            "rebind then exit": _attack(
                "check = check_close = passed = lambda *a, **k: None\nimport os\nos._exit(0)"
            ),
        },
        cell_timeout_s=5,
    )
    _assert_nothing_faked(reports, flagged=False)
    assert all(check["reason"] for r in reports.values() for check in r["checks"])
