"""make course's runner on tiny notebooks: progress, executed copies, report, failures."""

from __future__ import annotations

import io
import json

import nbformat
import pytest

from course_utils.instructor.student import find_notebooks
from course_utils.tooling.runner import run_course


def write_notebook(path, *sources):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(notebook, path)


@pytest.mark.slow
def test_run_course_runs_all_notebooks_and_reports_failures(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_PROGRESS", raising=False)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    write_notebook(
        notebooks / "01_ok.ipynb",
        "from course_utils.measurements import record_measurement\nimport os",
        "record_measurement('answer', 42, 'units', label='measured here')",
        "assert os.environ['COURSE_WORKLOAD'] == 'small'",
        "assert os.environ['COURSE_PROGRESS'] == 'line'  # one line per long helper, no widget",
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
    )
    write_notebook(notebooks / "02_fails.ipynb", "1 / 0", "print('never')")
    write_notebook(notebooks / "03_after.ipynb", "x = 1")
    progress = io.StringIO()
    failed = run_course(
        [notebooks], tmp_path / "build", workload_name="small", cell_timeout_s=60, progress=progress
    )
    assert failed == 1
    text = progress.getvalue()
    assert "[1/3] 01_ok.ipynb: ok" in text
    assert "[2/3] 02_fails.ipynb: failed" in text and "ZeroDivisionError" in text
    assert "[3/3] 03_after.ipynb: ok" in text  # the failure did not stop the run
    executed = nbformat.read(tmp_path / "build" / "notebooks" / "01_ok.ipynb", as_version=4)
    assert executed.cells[0].execution_count == 1
    report = json.loads((tmp_path / "build" / "report.json").read_text())
    assert [nb["status"] for nb in report["notebooks"]] == ["ok", "failed", "ok"]
    assert report["notebooks"][0]["measurements"] == [
        {"name": "answer", "value": 42, "unit": "units", "label": "measured here"}
    ]
    assert report["environment"]["workload"] == "small"
    page = (tmp_path / "build" / "report.html").read_text()
    assert "02_fails.ipynb" in page
    # each executed notebook is rendered as a web page, linked from its row
    assert [nb["rendering"] for nb in report["notebooks"]] == [
        f"notebooks/{name}.html" for name in ("01_ok", "02_fails", "03_after")
    ]
    rendered = (tmp_path / "build" / "notebooks" / "01_ok.html").read_text()
    assert "record_measurement" in rendered and "data:image/png;base64," in rendered
    assert "<a href='notebooks/01_ok.html'>" in page
    # the plot is embedded in the report
    assert [nb["plots"] for nb in report["notebooks"]] == [1, 0, 0]
    assert page.count("<img src='data:image/png;base64,") == 1


def test_find_notebooks_refuses_a_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a notebook"):
        find_notebooks([tmp_path / "nope.ipynb"])
    with pytest.raises(FileNotFoundError, match="no notebooks found"):
        find_notebooks([tmp_path])


def test_reuse_keeps_a_copy_whose_inputs_did_not_change(tmp_path, monkeypatch):
    """run-notebooks --reuse (the website's workflow): a notebook runs again only when its
    file, the package or the workload changed, or when its last run failed."""
    import nbformat as nbf

    from course_utils.tooling import runner
    from course_utils.tooling.report import NotebookResult

    source = tmp_path / "notebooks"
    source.mkdir()
    notebook = source / "01_a.ipynb"
    nbf.write(nbf.v4.new_notebook(cells=[nbf.v4.new_code_cell("1 + 1")]), notebook)
    ran, fail = [], {"now": False}

    def fake_run(path, out_dir, **_):
        ran.append(path.name)
        out_dir.mkdir(parents=True, exist_ok=True)
        nbf.write(nbf.read(path, as_version=4), out_dir / path.name)
        (out_dir / f"{path.stem}.html").write_text("<html></html>")
        status = "failed" if fail["now"] else "ok"
        return NotebookResult(
            str(path),
            status,
            1.5,
            "boom" if fail["now"] else None,
            [],
            [],
            f"notebooks/{path.stem}.html",
        )

    monkeypatch.setattr(runner, "run_notebook", fake_run)
    monkeypatch.setattr("course_utils.env.doctor", lambda: {})
    out, quiet = tmp_path / "build", io.StringIO()

    def run(size="small"):
        return runner.run_course([source], out, size, reuse=True, progress=quiet)

    assert run() == 0 and ran == ["01_a.ipynb"]
    assert run() == 0 and ran == ["01_a.ipynb"]  # unchanged: reused
    assert "reused" in quiet.getvalue()
    assert run("cpu") == 0 and len(ran) == 2  # another workload
    assert run("cpu") == 0 and len(ran) == 2
    nbf.write(nbf.v4.new_notebook(cells=[nbf.v4.new_code_cell("2 + 2")]), notebook)
    assert run("cpu") == 0 and len(ran) == 3  # the notebook changed
    fail["now"] = True
    (source / "01_a.ipynb").write_text(notebook.read_text() + " ")
    assert run("cpu") == 1 and len(ran) == 4
    fail["now"] = False
    assert run("cpu") == 0 and len(ran) == 5  # a failed run is never reused
    monkeypatch.setattr(runner, "_PACKAGE", tmp_path / "other-package")
    (tmp_path / "other-package").mkdir()
    (tmp_path / "other-package" / "x.py").write_text("changed = True\n")
    assert run("cpu") == 0 and len(ran) == 6  # the package changed
