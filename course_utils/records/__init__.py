"""GPU records: the course run on real GPUs, kept in the package and shown beside CPU runs.

A GPU record is one JSON file written by ``python -m course_utils gpu-record`` (see
:mod:`course_utils.tooling.gpu_record`): the machine (GPU, driver, CUDA, torch...), each notebook's
status and time, every figure it recorded with :func:`course_utils.measurements.record_measurement`
and every GPU claim's verdict. Records shipped with the course live in this folder
(``course_utils/records/*.json``; its README says how to add one); :func:`load_records`
reads them, :func:`validate_record` checks one against ``schema.json``, and
:func:`recorded_gpu_figures` prints a lesson's recorded GPU figures in a notebook's CPU
branch, labelled with where and when they were measured.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

RECORDS_DIR = Path(__file__).resolve().parent
SCHEMA_PATH = RECORDS_DIR / "schema.json"
SCHEMA_ID = "course-utils/gpu-record/1"

Record = dict[str, Any]


class RecordError(ValueError):
    """A file that is not a valid GPU record (one line: which file and what is wrong)."""


@cache
def schema() -> dict[str, Any]:
    """The record's JSON schema (``schema.json`` beside this module)."""
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return loaded


def validate_record(record: Any, source: str = "the record") -> None:
    """Raise :class:`RecordError` (one line) unless ``record`` matches the schema."""
    import jsonschema  # lazy: it comes with nbformat (the notebook runner, every Jupyter)

    validator = jsonschema.Draft202012Validator(schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(record))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "the top level"
        message = " ".join(error.message.split())
        raise RecordError(f"{source} is not a valid GPU record: at {where}: {message[:200]}")


def load_record(path: Path) -> Record:
    """Read and validate one record; :class:`RecordError` (one line) if it is not one."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise RecordError(f"cannot read {path}: {error.strerror or error}") from error
    except ValueError as error:  # not JSON (or not UTF-8)
        raise RecordError(f"{path} is not a valid GPU record: not JSON ({error})") from error
    validate_record(record, str(path))
    return dict(record)


def load_records(folder: Path | None = None) -> list[Record]:
    """Every record in ``folder`` (default: the records shipped in the package), oldest
    first; a file that is not a valid record raises :class:`RecordError`."""
    folder = RECORDS_DIR if folder is None else Path(folder)
    records = [load_record(path) for path in sorted(folder.glob("*.json")) if path != SCHEMA_PATH]
    return sorted(records, key=lambda record: str(record["started"]))


def gpu_title(record: Record) -> str:
    """``NVIDIA H200`` or ``2x Tesla T4`` (with ``(MIG)`` for a slice)."""
    machine = record["machine"]
    name = str(machine["gpu_name"])
    name = name if name.lower().startswith(("nvidia", "tesla")) else f"NVIDIA {name}"
    count = int(machine["gpu_count"])
    mig = any(gpu.get("mig") for gpu in machine["gpus"])
    title = f"{count}x {name}" if count > 1 else name
    return f"{title} (MIG)" if mig else title


def record_label(record: Record) -> str:
    """Where and when a record's figures were measured, e.g. ``measured on an NVIDIA H200,
    driver 580.65, torch 2.11.0, CUDA 13.0, 2026-12-03``; a sample says so first."""
    machine = record["machine"]
    title = gpu_title(record)
    if int(machine["gpu_count"]) > 1:
        parts = [f"measured on {title}"]
    else:
        article = "an" if title[0].lower() in "aeiou" or title.startswith("NVIDIA") else "a"
        parts = [f"measured on {article} {title}"]
    if machine.get("driver"):
        parts.append(f"driver {machine['driver']}")
    parts.append(f"torch {machine['torch']}")
    if machine.get("cuda"):
        parts.append(f"CUDA {machine['cuda']}")
    parts.append(str(record["started"])[:10])
    label = ", ".join(parts)
    return f"SAMPLE record, not a measurement: {label}" if record.get("sample") else label


def notebook_key(name: str) -> str:
    """A notebook's number: ``"03"`` for ``03_data_loading.ipynb``, ``"3"`` or ``"03"``."""
    stem = Path(str(name)).name
    match = re.match(r"(\d+)", stem)
    return f"{int(match.group(1)):02d}" if match else stem.removesuffix(".ipynb")


def figures_for(
    record: Record, notebook: str, names: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """The measurements a record holds for one notebook (its number or file name); with
    ``names``, those whose name contains one of them (case-insensitive), in record order."""
    wanted = [name.lower() for name in names] if names is not None else None
    key = notebook_key(notebook)
    found = []
    for entry in record["notebooks"]:
        if notebook_key(entry["notebook"]) != key:
            continue
        for measurement in entry["measurements"]:
            name = str(measurement["name"]).lower()
            if wanted is None or any(part in name for part in wanted):
                found.append(measurement)
    return found


def format_value(value: Any, unit: str = "") -> str:
    """A recorded value as a learner reads it: ``12.3 ms``, ``512,000 tokens/s``, ``flash``.

    >>> format_value(0.41234), format_value(512000.0, "tokens/s"), format_value(4096, "samples")
    ('0.4123', '512,000 tokens/s', '4096 samples')
    """
    if isinstance(value, float):
        shown = f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    else:
        shown = str(value)
    return f"{shown} {unit}".strip()


def recorded_gpu_figures(
    notebook: str,
    names: Iterable[str] | None = None,
    records: list[Record] | None = None,
    *,
    show: bool = True,
) -> list[tuple[str, list[dict[str, Any]]]]:
    """Print the GPU figures recorded for ``notebook`` (``"03"``), one block per recorded
    GPU, each labelled with where and when it was measured; or say that no GPU record
    holds them yet. ``names``: parts of the measurement names to show (default: all).
    Returns ``[(label, measurements), ...]``."""
    records = load_records() if records is None else records
    wanted = list(names) if names is not None else None
    blocks = [(record_label(r), figures_for(r, notebook, wanted)) for r in records]
    blocks = [(label, figures) for label, figures in blocks if figures]
    if show:
        _print_blocks(notebook_key(notebook), blocks)
    return blocks


def _print_blocks(key: str, blocks: list[tuple[str, list[dict[str, Any]]]]) -> None:
    if not blocks:
        # the call for a record is the contributors' (README, the run report), not a learner's
        print(
            f"No GPU record holds notebook {key}'s figures yet: the figures cited in this "
            "lesson are from their sources."
        )
        return
    print(f"Recorded on GPUs by `python -m course_utils gpu-record` (notebook {key}):")
    for label, figures in blocks:
        print(f"  {label}:")
        for figure in figures:
            print(f"    {figure['name']}: {format_value(figure['value'], figure['unit'])}")
