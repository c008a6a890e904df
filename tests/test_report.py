"""Figures recorded by notebooks, collected from executed notebooks, and the HTML report."""

from __future__ import annotations

import json
import math

import pytest

from course_utils.report import (
    FIGURE_MIME,
    Figure,
    NotebookResult,
    figures_in_notebook,
    record_figure,
    write_report,
)


def test_record_figure_prints_outside_ipython(capsys):
    figure = record_figure("speed-up", 12.3456, "x", label="measured on this machine (CPU)")
    assert capsys.readouterr().out.strip() == (
        "speed-up: 12.35 x [measured on this machine (CPU)]"
    )
    assert figure.value == 12.3456


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_record_figure_refuses_non_finite_numbers(value):
    with pytest.raises(ValueError, match="not a finite number"):
        record_figure("broken", value, label="x")


def test_figures_are_found_in_executed_notebook_outputs():
    good = {"name": "a", "value": 1.5, "unit": "ms", "label": "CPU"}
    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": "text"},
            {"cell_type": "code", "outputs": [
                {"output_type": "stream", "text": "hello"},
                {"output_type": "display_data", "data": {FIGURE_MIME: good}},
            ]},
            {"cell_type": "code", "outputs": [
                {"output_type": "display_data", "data": {FIGURE_MIME: {"name": "bad"}}},
                {"output_type": "display_data", "data": {"text/plain": "x"}},
            ]},
        ]
    }
    assert figures_in_notebook(notebook) == [Figure("a", 1.5, "ms", "CPU")]


def test_report_lists_notebooks_figures_and_environment(tmp_path):
    results = [
        NotebookResult("notebooks/01.ipynb", "ok", 12.0, None, [Figure("f", 2.0, "x", "CPU")]),
        NotebookResult("notebooks/02.ipynb", "failed", 3.0, "ZeroDivisionError: <boom>", []),
    ]
    environment = {"torch": "2.14.1", "gpus": [], "advice": ["use a <GPU>"], "driver": None}
    path = write_report(results, environment, tmp_path / "build")
    page = path.read_text()
    assert "1 of 2 notebooks ran without error" in page
    assert "notebooks/01.ipynb" in page and "f: 2 x [CPU]" in page
    assert "ZeroDivisionError: &lt;boom&gt;" in page  # escaped, not raw HTML
    assert "<th>torch</th><td>2.14.1</td>" in page
    assert "<th>gpus</th><td>none</td>" in page and "<td>not available</td>" in page
    assert "<ul><li>use a &lt;GPU&gt;</li></ul>" in page
    assert "<a href='notebooks/01.ipynb'>" in page  # links to the executed copy
    data = json.loads((tmp_path / "build" / "report.json").read_text())
    assert data["notebooks"][0]["figures"][0]["name"] == "f"
    assert data["notebooks"][1]["status"] == "failed"
