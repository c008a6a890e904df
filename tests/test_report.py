"""Figures recorded by notebooks, collected from executed notebooks, and the HTML report."""

from __future__ import annotations

import base64
import json
import math

import pytest

from course_utils.measurements import MEASUREMENT_MIME, Measurement, record_measurement
from course_utils.tooling.report import (
    NotebookResult,
    Plot,
    measurements_in_notebook,
    plots_in_notebook,
    write_report,
)


def test_record_measurement_prints_outside_ipython(capsys):
    figure = record_measurement("speed-up", 12.3456, "x", label="measured on this machine (CPU)")
    assert capsys.readouterr().out.strip() == ("speed-up: 12.35 x [measured on this machine (CPU)]")
    assert figure is None  # a cell ending with the call echoes nothing more


def test_a_cell_ending_with_record_measurement_shows_the_line_once():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shown: list = []
    try:
        shell.display_pub.publish = lambda data, **_: shown.append(data)
        result = shell.run_cell(
            "from course_utils.measurements import record_measurement\n"
            "record_measurement('speed-up', 2.5, 'x', label='CPU')",
            store_history=True,
        )
        assert result.success and result.result is None  # no Out[...] echo
        assert [d["text/plain"] for d in shown] == ["speed-up: 2.5 x [CPU]"]
    finally:
        InteractiveShell.clear_instance()


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_record_measurement_refuses_non_finite_numbers(value):
    with pytest.raises(ValueError, match="not a finite number"):
        record_measurement("broken", value, label="x")


def test_figures_are_found_in_executed_notebook_outputs():
    good = {"name": "a", "value": 1.5, "unit": "ms", "label": "CPU"}
    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": "text"},
            {
                "cell_type": "code",
                "outputs": [
                    {"output_type": "stream", "text": "hello"},
                    {"output_type": "display_data", "data": {MEASUREMENT_MIME: good}},
                ],
            },
            {
                "cell_type": "code",
                "outputs": [
                    {"output_type": "display_data", "data": {MEASUREMENT_MIME: {"name": "bad"}}},
                    {"output_type": "display_data", "data": {"text/plain": "x"}},
                ],
            },
        ]
    }
    assert measurements_in_notebook(notebook) == [Measurement("a", 1.5, "ms", "CPU")]


def test_report_lists_notebooks_figures_and_environment(tmp_path):
    results = [
        NotebookResult("notebooks/01.ipynb", "ok", 12.0, None, [Measurement("f", 2.0, "x", "CPU")]),
        NotebookResult("notebooks/02.ipynb", "failed", 3.0, "ZeroDivisionError: <boom>", []),
    ]
    environment = {"torch": "2.14.1", "gpus": [], "advice": ["use a <GPU>"], "driver": None}
    path = write_report(results, environment, tmp_path / "build")
    page = path.read_text()
    assert "1 of 2 notebooks ran without error" in page
    assert "notebooks/01.ipynb" in page and "<li>f: 2 x</li>" in page
    assert "ZeroDivisionError: &lt;boom&gt;" in page  # escaped, not raw HTML
    assert "<th>torch</th><td>2.14.1</td>" in page
    assert "<th>gpus</th><td>none</td>" in page and "<td>not available</td>" in page
    assert "<ul><li>use a &lt;GPU&gt;</li></ul>" in page
    assert "<a href='notebooks/01.ipynb'>" in page  # links to the executed copy
    data = json.loads((tmp_path / "build" / "report.json").read_text())
    assert data["notebooks"][0]["measurements"][0]["name"] == "f"
    assert data["notebooks"][1]["status"] == "failed"


def test_the_hardware_label_shows_once_per_notebook_and_per_place(tmp_path):
    cpu, t4 = "measured on this machine (CPU)", "published: NVIDIA T4 datasheet"
    figures = [
        Measurement("a", 1.0, "s", cpu),
        Measurement("b", 2, "", cpu),
        Measurement("c", 65, "TFLOPS", t4),
    ]
    results = [NotebookResult("notebooks/01.ipynb", "ok", 1.0, None, figures)]
    page = write_report(results, {}, tmp_path).read_text()
    assert page.count(cpu) == 1 and page.count(t4) == 1
    assert f"<p class='label'>{cpu}</p><ul><li>a: 1 s</li><li>b: 2</li></ul>" in page
    assert f"<p class='label'>{t4}</p><ul><li>c: 65 TFLOPS</li></ul>" in page


def test_plots_are_found_and_embedded_and_the_rendering_is_linked(tmp_path):
    png = base64.b64encode(b"\x89PNG not really").decode()
    svg = "<svg xmlns='http://www.w3.org/2000/svg'><rect width='1' height='1'/></svg>"
    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": "![x](data:image/png;base64,AAAA)"},
            {
                "cell_type": "code",
                "outputs": [
                    {
                        "output_type": "display_data",
                        "data": {"image/png": png + "\n", "text/plain": "<Figure>"},
                    },
                    {"output_type": "stream", "text": "hello"},
                ],
            },
            {
                "cell_type": "code",
                "outputs": [
                    {
                        "output_type": "execute_result",
                        "data": {"image/svg+xml": [svg[:20], svg[20:]]},
                    },
                    {"output_type": "display_data", "data": {"image/png": ""}},
                ],
            },
        ]
    }
    plots = plots_in_notebook(notebook)
    assert plots == [Plot("image/png", png + "\n"), Plot("image/svg+xml", svg)]
    assert plots[0].data_uri() == f"data:image/png;base64,{png}"
    results = [
        NotebookResult("notebooks/01_x.ipynb", "ok", 1.0, None, [], plots, "notebooks/01_x.html"),
        NotebookResult("notebooks/02_y.ipynb", "failed", 1.0, "boom", []),
    ]
    page = write_report(results, {}, tmp_path).read_text()
    assert "<a href='notebooks/01_x.html'>notebooks/01_x.ipynb</a>" in page
    assert f"<img src='data:image/png;base64,{png}' alt='plot 1 of 01_x.ipynb'>" in page
    assert "src='data:image/svg+xml;charset=utf-8,%3Csvg" in page
    assert page.count("<img ") == 2
    data = json.loads((tmp_path / "report.json").read_text())
    assert [nb["plots"] for nb in data["notebooks"]] == [2, 0]
