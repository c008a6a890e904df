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
