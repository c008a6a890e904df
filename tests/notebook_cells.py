"""The cells of a course notebook, for tests that run an exercise's check cell the way the
grader does: after the notebook's own set-up cells, with the learner's answer in place."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest


def code_cells(path: Path) -> dict[str, str]:
    """Each code cell's source, by cell id."""
    notebook = nbformat.read(path, as_version=4)
    return {cell.get("id"): cell.source for cell in notebook.cells if cell.cell_type == "code"}


def grade_cell(path: Path, grade_id: str) -> str:
    """The source of the cell with this nbgrader grade_id (KeyError if none)."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return cell.source
    raise KeyError(grade_id)


def run_cells(path: Path, cell_ids: tuple[str, ...], **environment: str) -> dict:
    """The namespace after running these code cells in order, as the small workload runs
    them, with ``environment`` set while they run (a check's set-up cells)."""
    cells = code_cells(path)
    namespace: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"COURSE_WORKLOAD": "small", **environment}.items():
            patch.setenv(name, value)
        for cell_id in cell_ids:
            exec(cells[cell_id], namespace)
    return namespace


def messages_matching(text: str, messages: dict[str, str]) -> list[str]:
    """The names of the check messages (templates with ``{placeholders}``) that ``text``
    reads as: a test asserts that a wrong answer's feedback names its mistake and no other."""
    import re

    found = []
    for name, template in messages.items():
        parts = re.split(r"\{[^{}]*\}", template)
        if re.fullmatch(".+?".join(map(re.escape, parts)), text, flags=re.DOTALL):
            found.append(name)
    return found


def grade_apart(path: Path, grade_id: str, namespace: dict) -> dict:
    """The verdict of the check cell ``grade_id`` of ``path`` as the grader's checker reaches
    it: the check's code runs in this process (the checker's side, with the instructor's
    imports pinned as the grader pins them) and every name of the notebook is asked of a
    process forked from this one that holds ``namespace`` (the learner's runtime: it serves
    values, calls of the answer and observations, :func:`course_utils.instructor.judge._serve`).
    ``{"status": "completed", ...}`` when the check passed, else ``failed`` with the name
    and message the learner would read (and ``tampering`` when the instruments were
    changed). No sandbox, kernel or guard: the grader's tests cover those."""
    import contextlib
    import importlib
    import os

    import torch

    from course_utils.instructor import checker, grading, judge

    reference = nbformat.read(path, as_version=4)
    spec = grading.guard_spec(reference)
    for module in spec["modules"]:  # as the grader does before it forks its checker
        with contextlib.suppress(Exception):  # google.colab, absent here: the checker's too
            importlib.import_module(module)
    check = {**spec["checks"][grade_id], "grade_id": grade_id}
    requests_read, requests_write = checker.pipe()
    replies_read, replies_write = checker.pipe()
    torch.set_num_threads(1)  # a forked child's OpenMP pool would not start
    pid = os.fork()
    if pid == 0:  # the learner's runtime
        try:
            os.close(requests_write)
            os.close(replies_read)
            judge._serve(namespace, requests_read, replies_write, grade_id)
        finally:
            os._exit(0)
    os.close(requests_read)
    os.close(replies_write)
    modules = set(spec["modules"]) | {"course_utils", "torch"}
    channel = checker.Channel(requests_write, replies_read, modules)
    checker.CHANNEL[0] = channel
    try:
        channel.begin()
        verdict = checker.run_check(channel, check)
        channel.end()
    finally:
        checker.CHANNEL[0] = None
        os.close(requests_write)
        os.close(replies_read)
        os.waitpid(pid, 0)
    return verdict
