"""The HTML report of a course run (``make course``): every notebook's measurements
(:func:`course_utils.measurements.record_measurement`) and plots, read back from the executed
copies into ``build/report.html``.
"""

from __future__ import annotations

import contextlib
import html
import json
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from course_utils.measurements import MEASUREMENT_MIME, Measurement, output_data
from course_utils.records import format_value, recorded_gpu_figures

PLOT_MIMES = ("image/png", "image/jpeg", "image/svg+xml")


def measurements_in_notebook(notebook: dict[str, Any]) -> list[Measurement]:
    """The measurements recorded in an executed notebook, in order."""
    found = []
    for data in output_data(notebook):
        with contextlib.suppress(KeyError, TypeError):  # none, or malformed
            found.append(Measurement(**data[MEASUREMENT_MIME]))
    return found


@dataclass(frozen=True)
class Plot:
    """An image a notebook cell displayed: its MIME type and data (base64 for PNG and
    JPEG, the markup for SVG), as stored in the ``.ipynb``."""

    mime: str
    data: str

    def data_uri(self) -> str:
        if self.mime == "image/svg+xml":
            return "data:image/svg+xml;charset=utf-8," + urllib.parse.quote(self.data)
        return f"data:{self.mime};base64,{''.join(self.data.split())}"


def plots_in_notebook(notebook: dict[str, Any]) -> list[Plot]:
    """The images (plots) in an executed notebook's outputs, in order; one per output."""
    plots = []
    for data in output_data(notebook):
        for mime in PLOT_MIMES:
            value = data.get(mime)
            if isinstance(value, list):  # a multi-line string as a list of lines
                value = "".join(value)
            if isinstance(value, str) and value.strip():
                plots.append(Plot(mime, value))
                break
    return plots


@dataclass(frozen=True)
class NotebookResult:
    """How one notebook fared in a course run. ``rendering``: the executed notebook as
    HTML, relative to the report (None if it could not be written)."""

    path: str
    status: str  # "ok" or "failed"
    seconds: float
    error: str | None
    measurements: list[Measurement]
    plots: list[Plot] = field(default_factory=list)
    rendering: str | None = None


def write_report(
    results: list[NotebookResult],
    environment: dict[str, Any],
    out_dir: Path,
    records: list[dict[str, Any]] | None = None,
) -> Path:
    """Write ``report.html`` and ``report.json`` into ``out_dir``; return the HTML path.
    ``records``: GPU records (:mod:`course_utils.records`) whose figures each notebook's
    row shows beside this run's, labelled with where and when they were measured."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # The images themselves are in report.html.
    notebooks = [{**asdict(result), "plots": len(result.plots)} for result in results]
    as_json = {"environment": environment, "notebooks": notebooks}
    (out_dir / "report.json").write_text(json.dumps(as_json, indent=2, default=str))
    path = out_dir / "report.html"
    path.write_text(_html(results, environment, records or []), encoding="utf-8")
    return path


def _recorded_html(notebook: str, records: list[dict[str, Any]]) -> str:
    """A notebook's figures from the GPU records, each record's label once."""
    blocks = recorded_gpu_figures(notebook, records=records, show=False)
    if not blocks:
        return (
            "<small>none recorded yet: run <code>python -m course_utils gpu-record</code> on "
            "an NVIDIA GPU and send the record (docs/gpu-record.md)</small>"
        )
    return "".join(
        f"<p class='label'>{html.escape(label)}</p><ul>"
        + "".join(
            f"<li>{html.escape(m['name'])}: {html.escape(format_value(m['value'], m['unit']))}</li>"
            for m in figures
        )
        + "</ul>"
        for label, figures in blocks
    )


def _html(
    results: list[NotebookResult], environment: dict[str, Any], records: list[dict[str, Any]]
) -> str:
    esc = html.escape
    env_rows = "".join(
        f"<tr><th>{esc(str(key))}</th><td>{_show(value)}</td></tr>"
        for key, value in environment.items()
    )
    nb_rows = []
    for result in results:
        name, title = esc(Path(result.path).name), esc(result.path)
        if result.rendering:
            title = f"<a href='{esc(result.rendering)}'>{title}</a>"
        error = f"<pre>{esc(result.error)}</pre>" if result.error else ""
        plots = "".join(
            f"<img src='{esc(plot.data_uri())}' alt='plot {number} of {name}'>"
            for number, plot in enumerate(result.plots, start=1)
        )
        nb_rows.append(  # .ipynb: the executed copy beside this report
            f"<tr class='{esc(result.status)}'>"
            f"<td class='name'>{title}<br><small><a href='notebooks/{name}'>.ipynb</a></small></td>"
            f"<td>{esc(result.status)}</td><td>{result.seconds:.1f} s</td>"
            f"<td>{_measurements_html(result.measurements)}{error}</td>"
            f"<td>{_recorded_html(result.path, records)}</td>"
            f"<td class='plots'>{plots or '<small>none</small>'}</td></tr>"
        )
    failed = sum(result.status != "ok" for result in results)
    summary = f"{len(results) - failed} of {len(results)} notebooks ran without error"
    if "workload" in environment:
        summary += f", workload '{environment['workload']}'"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Course run report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-bottom: 2em; width: 100%; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
tr.failed td {{ background: #fdd; }} tr.ok td:nth-child(2) {{ color: #070; }}
td.name {{ white-space: nowrap; }}
td ul {{ margin: 0.2em 0 0.6em; padding-left: 1.2em; }}
p.label {{ margin: 0; font-style: italic; color: #555; }}
td.plots img {{ width: 400px; margin: 0 4px 4px 0; border: 1px solid #eee; }}
pre {{ white-space: pre-wrap; max-width: 60em; }}
</style></head><body>
<h1>Course run report</h1>
<p>{esc(summary)}. Each notebook's name opens its executed copy as a web page.</p>
<h2>Notebooks</h2>
<table><tr><th>notebook</th><th>status</th><th>run time</th><th>measurements</th>
<th>recorded on GPUs (<code>course_utils/records</code>)</th><th>plots</th></tr>
{"".join(nb_rows)}
</table>
<h2>Environment (from <code>python -m course_utils doctor</code>)</h2>
<table>{env_rows}</table>
</body></html>
"""


def _measurements_html(measurements: list[Measurement]) -> str:
    """Measurements grouped by where they were taken: each label once, then its own."""
    groups: dict[str, list[Measurement]] = {}
    for measurement in measurements:
        groups.setdefault(measurement.label, []).append(measurement)
    return "".join(
        f"<p class='label'>{html.escape(label)}</p><ul>"
        + "".join(f"<li>{html.escape(m.without_label())}</li>" for m in group)
        + "</ul>"
        for label, group in groups.items()
    )


def _show(value: Any) -> str:
    """A doctor value as HTML: lists as bullet lists, dicts as key=value pairs."""
    if isinstance(value, list):
        if not value:
            return "none"
        return "<ul>" + "".join(f"<li>{_show(item)}</li>" for item in value) + "</ul>"
    if isinstance(value, dict):
        return ", ".join(f"{html.escape(str(k))}={_show(v)}" for k, v in value.items())
    return "not available" if value is None else html.escape(str(value))
