"""Progress on long helpers: a bar in Jupyter and at a terminal, one line in logs, nothing
under the tests."""

from __future__ import annotations

import io
import os
import sys

import nbformat
import pytest
import torch

from course_utils import progress
from course_utils.batch import batch_size_sweep, find_max_batch_size, predict_max_batch_size


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def outside_tests(monkeypatch):
    """What progress sees outside pytest, at the full workload; returns a setter for
    stderr (a terminal or a log file)."""

    def stderr(tty: bool) -> Stream:
        # pytest sets PYTEST_CURRENT_TEST again before the test's body: unset it here
        monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
        monkeypatch.delenv(progress.ENV_VAR, raising=False)
        monkeypatch.setenv("COURSE_WORKLOAD", "full")
        monkeypatch.delitem(sys.modules, "pytest", raising=False)
        stream = Stream(tty)
        monkeypatch.setattr(sys, "stderr", stream)
        return stream

    return stderr


def oom_above(limit):
    def trial(n):
        if n > limit:
            raise RuntimeError("CUDA out of memory (simulated)")

    return trial


def test_mode_follows_where_the_code_runs(outside_tests, monkeypatch):
    outside_tests(tty=True)
    assert progress.mode() == "bar"
    outside_tests(tty=False)
    assert progress.mode() == "line"
    monkeypatch.setenv("COURSE_WORKLOAD", "small")
    assert progress.mode() == "off"
    monkeypatch.setenv(progress.ENV_VAR, "bar")
    assert progress.mode() == "bar"
    monkeypatch.setenv(progress.ENV_VAR, "loud")
    with pytest.raises(ValueError, match="COURSE_PROGRESS='loud'"):
        progress.mode()


def test_under_pytest_long_helpers_are_silent(monkeypatch, capsys):
    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    monkeypatch.setenv("COURSE_WORKLOAD", "full")
    assert progress.mode() == "off"
    assert find_max_batch_size(oom_above(12)).batch_size == 12
    batch_size_sweep(lambda n: torch.ones(n, 4).sum(), [1, 2], repeats=1)
    assert capsys.readouterr() == ("", "")


def test_in_a_log_each_helper_writes_one_line_at_the_end(outside_tests):
    log = outside_tests(tty=False)
    found = find_max_batch_size(oom_above(12))
    sweep = batch_size_sweep(lambda n: torch.ones(n, 4).sum(), [1, 2, 4], repeats=1)
    lines = log.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"largest batch size: {found.trials} trials in ")
    assert lines[1].startswith(f"batch-size sweep: {len(sweep.rows)} sizes in ")


def memory_of(n):
    oom_above(2)(n)
    return n


def test_nested_work_adds_no_line_and_an_early_stop_says_how_far(outside_tests):
    log = outside_tests(tty=False)
    # the probes do not fit: predict falls back to the finder, inside its own task
    found = predict_max_batch_size(oom_above(2), memory_of, 10**6)
    assert found.batch_size == 2
    for number in progress.track(range(10), "counting", unit="number"):
        if number == 3:
            break
    lines = log.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"largest batch size: {found.trials} trials in ")
    assert lines[1].startswith("counting: 3 of 10 numbers in ")


def test_at_a_terminal_a_bar_counts_the_steps(outside_tests):
    terminal = outside_tests(tty=True)
    sweep = batch_size_sweep(lambda n: torch.ones(n, 4).sum(), [1, 2, 4], repeats=1)
    assert len(sweep.rows) == 3
    drawn = terminal.getvalue()
    assert "\r" in drawn and "batch-size sweep" in drawn and "3/3" in drawn


@pytest.mark.slow
def test_in_jupyter_a_long_helper_shows_a_widget(root):
    """A real kernel (as in JupyterLab or Colab) at the cpu workload, outside pytest."""
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "import torch\nfrom course_utils.batch import batch_size_sweep\n"
            "sweep = batch_size_sweep(lambda n: torch.ones(n, 4).sum(), [1, 2], repeats=1)"
        )
    ]
    unset = ("PYTEST_CURRENT_TEST", progress.ENV_VAR)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(COURSE_WORKLOAD="cpu", PYTHONPATH=str(root))
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute(env=env)
    outputs = notebook.cells[0].outputs
    widget = "application/vnd.jupyter.widget-view+json"
    widgets = [o for o in outputs if widget in o.get("data", {})]
    assert widgets, outputs
    assert "batch-size sweep" in str(widgets[0]["data"].get("text/plain", ""))
