"""The website's GPU comparison page: every recorded GPU side by side, lesson by lesson.

One table per lesson: a row per recorded figure, a column per GPU record. The figures a
learner compares first (step time, MFU, largest batch, memory, tokens/s, throughput)
lead each table; the others follow in the order the notebook recorded them. Then the GPU
probes (:mod:`course_utils.tooling.gpu_probes`), a small table each, and every GPU claim's
verdict. Built from the records in the package (:func:`load_records`).
"""

from __future__ import annotations

import json
from typing import Any

from course_utils.records import Record, format_value, gpu_title, notebook_key, record_label

# Parts of measurement names that come first in a lesson's table, in this order.
KEY_FIGURES = (
    "step",
    "mfu",
    "largest batch",
    "maximum batch",
    "memory",
    "tokens per second",
    "throughput",
    "samples/s",
    "speed-up",
)


def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _rank(name: str) -> int:
    lowered = name.lower()
    return next((i for i, part in enumerate(KEY_FIGURES) if part in lowered), len(KEY_FIGURES))


def lessons(records: list[Record]) -> dict[str, dict[str, list[Any]]]:
    """``{lesson: {figure name: [value or None per record]}}``, lessons in order."""
    table: dict[str, dict[str, list[Any]]] = {}
    for column, record in enumerate(records):
        for entry in record["notebooks"]:
            rows = table.setdefault(notebook_key(entry["notebook"]), {})
            for measurement in entry["measurements"]:
                row = rows.setdefault(measurement["name"], [None] * len(records))
                row[column] = format_value(measurement["value"], measurement["unit"])
    for key, rows in table.items():
        order = sorted(enumerate(rows), key=lambda item: (_rank(item[1]), item[0]))
        table[key] = {name: rows[name] for _, name in order}
    return dict(sorted(table.items()))


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A probe's result as ``{"dtypes.float16.default": "...", ...}``; lists as text."""
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, inner in value.items():
            found |= _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
        return found
    if isinstance(value, list):
        if value and all(isinstance(inner, dict) for inner in value):  # rows: one per GPU
            found = {}
            for index, inner in enumerate(value):
                found |= _flatten(inner, f"{prefix}[{index}]")
            return found
        text = json.dumps(value, default=str)
        return {prefix: text if len(text) <= 60 else text[:57] + "..."}
    return {prefix: format_value(value)}


def probe_tables(records: list[Record]) -> dict[str, dict[str, list[Any]]]:
    """``{probe: {row: [cell or None per record]}}``: each probe's status and verdict,
    then its figures (nested ones flattened), probes in the order first recorded."""
    tables: dict[str, dict[str, list[Any]]] = {}
    for column, record in enumerate(records):
        for probe in record.get("probes", []):
            rows = tables.setdefault(probe["name"], {})
            cells = {"status": probe["status"], "verdict": probe["verdict"]}
            if probe["status"] != "ok":
                cells["verdict"] = probe["error"]
            cells |= _flatten(probe["result"] or {})
            for name, value in cells.items():
                if value is not None:
                    rows.setdefault(name, [None] * len(records))[column] = value
    return tables


def comparison_page(records: list[Record]) -> str:
    """The page, as Markdown."""
    lines = ["# GPUs compared", ""]
    if not records:
        lines += [
            "No GPU record ships with the course yet: every GPU figure in the lessons is "
            "cited from its source or estimated. Anyone with an NVIDIA GPU can add one: run "
            "`python -m course_utils gpu-record --out DIR` and open a pull request that adds "
            "the file to `course_utils/records/` ([the GPU record](docs/gpu-record.md)).",
            "",
        ]
        return "\n".join(lines)
    lines += [
        "The course run on real GPUs by `python -m course_utils gpu-record` (the records in "
        "`course_utils/records/`), lesson by lesson. Each column is one run, labelled with "
        "where and when it was measured; an empty cell: that run did not record the figure.",
        "",
        "| | GPU | measured | outcome | notebooks ran | course |",
        "|---|---|---|---|---|---|",
    ]
    for number, record in enumerate(records, start=1):
        ran = sum(entry["status"] == "ok" for entry in record["notebooks"])
        commit = record["course"].get("commit") or record["course"]["version"]
        lines.append(
            f"| {number} | {_cell(gpu_title(record))} | {_cell(record_label(record))} | "
            f"{record['outcome']} | {ran} of {len(record['notebooks'])} | `{str(commit)[:10]}` |"
        )
    header = "| figure | " + " | ".join(f"({n})" for n in range(1, len(records) + 1)) + " |"
    rule = "|---|" + "---|" * len(records)
    for lesson, rows in lessons(records).items():
        if not rows:  # no run recorded a figure of this lesson (not run, or none)
            continue
        lines += ["", f"## Lesson {lesson}", "", header, rule]
        for name, values in rows.items():
            shown = " | ".join("" if value is None else _cell(value) for value in values)
            lines.append(f"| {_cell(name)} | {shown} |")
    probes = probe_tables(records)
    if probes:
        lines += [
            "",
            "## GPU probes",
            "",
            "Short checks of the GPU-only mechanisms behind the course's findings "
            "(`course_utils.tooling.gpu_probes`), run before the notebooks; a probe's docstring "
            "says which finding it checks.",
        ]
    for name, rows in probes.items():
        lines += ["", f"### {name}", "", header, rule]
        for row, values in rows.items():
            shown = " | ".join("" if value is None else _cell(value) for value in values)
            lines.append(f"| {_cell(row)} | {shown} |")
    lines += ["", "## GPU claims", "", "| run | lesson | claim | measured | expected | held |"]
    lines.append("|---|---|---|---|---|---|")
    for number, record in enumerate(records, start=1):
        for entry in record["notebooks"]:
            for claim in entry["claims"]:
                lines.append(
                    f"| ({number}) | {notebook_key(entry['notebook'])} | {_cell(claim['name'])} | "
                    f"{_cell(format_value(claim['measured'], claim['unit']))} | "
                    f"{_cell(claim['expected'])} | {'yes' if claim['held'] else '**no**'} |"
                )
    return "\n".join(lines) + "\n"
