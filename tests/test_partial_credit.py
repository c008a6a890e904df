"""Partial credit inside a check (issue 34): an exercise with separable parts scores the
share of its parts that are right, when the check cell itself calls ``check_parts``; a
learner's code that raises ``PartialCredit`` itself earns nothing."""

from __future__ import annotations

import io

import pytest
from test_grader import _meta, _notebook

from course_utils.checks.core import PartialCredit, check, check_parts
from course_utils.feedback import CheckFailed
from course_utils.instructor.gradebook import Options, Task, grade_tasks
from course_utils.instructor.student import write_notebook

IMPORTS = "from course_utils.checks.core import check, check_parts, passed"
ANSWER = (
    "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n"
    "def square(x):\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION"
)
CHECK = (  # two separable parts, worth 4 points: 2 each
    "check_parts({\n"
    "    'double': lambda: check(double(3) == 6, 'double(3) should be 6'),\n"
    "    'square': lambda: check(square(3) == 9, 'square(3) should be 9'),\n"
    "})\npassed('two parts')"
)


def _instructor(answer: str = ANSWER):
    return _notebook([
        ("code", IMPORTS, {}),
        ("code", answer, _meta("p-answer", solution=True)),
        ("code", CHECK, _meta("p-check", solution=False, points=4)),
    ])  # fmt: skip


def test_check_parts_scores_the_share_of_parts_right():
    def right():
        check(True, "")

    def wrong():
        check(False, "square(3) should be 9")

    def broken():
        raise ZeroDivisionError("division by zero")

    check_parts({"a": right, "b": right})
    with pytest.raises(PartialCredit) as one_of_two:
        check_parts({"double": right, "square": wrong})
    assert one_of_two.value.earned == 0.5 and "square: square(3) should be 9" in str(
        one_of_two.value
    )
    with pytest.raises(PartialCredit) as two_of_three:
        check_parts({"a": right, "b": broken, "c": right})
    assert two_of_three.value.earned == pytest.approx(2 / 3)
    assert "b: your code raised ZeroDivisionError" in str(two_of_three.value)
    with pytest.raises(CheckFailed) as none_right:
        check_parts({"a": wrong, "b": broken})
    assert type(none_right.value) is CheckFailed  # no credit at all
    with pytest.raises(ValueError):
        check_parts({})


@pytest.mark.slow
def test_the_grader_scores_partial_credit_only_from_the_check_itself(tmp_path):
    source = tmp_path / "source" / "ex.ipynb"
    write_notebook(_instructor(), source)
    half = ANSWER.replace("return x * x", "return x + x")
    forged = (  # a learner's function that raises the course's own partial credit
        "from course_utils.checks.core import PartialCredit, check_parts\n"
        "def double(x):\n    check_parts({'a': lambda: None, 'b': lambda: 1 / 0})\n"
        "def square(x):\n    raise PartialCredit('all but nothing', 0.99)"
    )
    notebooks = {"right": _instructor(), "half": _instructor(half),
                 "forged": _instructor(forged)}  # fmt: skip
    tasks = []
    for name, notebook in notebooks.items():
        path = tmp_path / "class" / name / "ex.ipynb"
        write_notebook(notebook, path)
        tasks.append(Task(name, "ex.ipynb", str(path), str(source)))
    options = Options(sandbox="none", jobs=2, threads=1)
    results = grade_tasks(tasks, options, None, io.StringIO(), resume=False)
    reports = {t.learner: r["report"] for t, r in zip(tasks, results, strict=True)}
    points = {name: report["checks"][0]["points"] for name, report in reports.items()}
    assert points == {"right": 4.0, "half": 2.0, "forged": 0.0}, reports
    assert "partial credit, 50% of the points" in reports["half"]["checks"][0]["reason"]
    assert "square: square(3) should be 9" in reports["half"]["checks"][0]["reason"]
