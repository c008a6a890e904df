"""The gradebook as ``canvas.csv``, in the format Canvas's gradebook import reads.

Columns, as in a gradebook that Canvas exports (Grades → Export): ``Student``, ``ID``,
``SIS User ID``, ``SIS Login ID``, ``Section``, then one column per notebook of the
assignment with the learner's points. The second row, ``Points Possible``, gives each
column's maximum, which Canvas uses for an assignment the import creates. Canvas matches
rows to students by ``ID``, ``SIS User ID`` or ``SIS Login ID``: without a roster the
learner's folder name goes into ``SIS Login ID`` (name the folders by login); with
``--roster`` (a gradebook exported from the course) each learner's row takes the
student's name, IDs and section from the roster row whose ``SIS Login ID``,
``SIS User ID``, ``ID`` or ``Student`` equals the folder name, and a notebook whose
stem begins a roster column ``NAME (ASSIGNMENT_ID)`` updates that assignment.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

from course_utils.instructor import validation
from course_utils.instructor.student import InputError

IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
#: How Canvas's own export writes the row of maxima (leading spaces included).
POINTS_POSSIBLE = "    Points Possible"


def read_roster(path: Path) -> tuple[dict[str, dict[str, str]], list[str]]:
    """The roster's students by every identifier a folder may be named by, and its
    column names. :class:`InputError` for a file that is not a Canvas gradebook."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as file:
            rows = list(csv.DictReader(file))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise InputError(f"cannot read the roster {path}: {error}") from None
    columns = list(rows[0]) if rows else []
    if "Student" not in columns or not {"ID", "SIS User ID", "SIS Login ID"} & set(columns):
        raise InputError(
            f"{path} is not a Canvas gradebook export: it needs a Student column and ID, "
            "SIS User ID or SIS Login ID"
        )
    students: dict[str, dict[str, str]] = {}
    for row in rows:
        if (row.get("Student") or "").strip() in ("Points Possible", "Student, Test"):
            continue
        for key in ("SIS Login ID", "SIS User ID", "ID", "Student"):
            if row.get(key):
                students.setdefault(row[key], row)
    return students, columns


def write_canvas(
    out: Path,
    learners: Sequence[str],
    notebooks: Sequence[str],
    scores: Mapping[tuple[str, str], float],
    maxima: Mapping[str, float],
    roster: Path | None = None,
) -> tuple[Path, list[str]]:
    """Write ``out/canvas.csv``; return its path and the learners the roster lacks."""
    students, columns = read_roster(roster) if roster else ({}, [])
    headers = []
    for notebook in notebooks:
        stem = Path(notebook).stem
        existing = [c for c in columns if c.startswith(f"{stem} (") and c.endswith(")")]
        headers.append(existing[0] if existing else stem)
    rows = [IDENTITY + headers, [POINTS_POSSIBLE, "", "", "", ""]]
    rows[1] += [f"{maxima.get(notebook, 0):g}" for notebook in notebooks]
    unknown = []
    for learner in learners:
        student = students.get(learner)
        if roster and student is None:
            unknown.append(learner)
        identity = (
            [student.get(key, "") for key in IDENTITY]
            if student
            else [learner, "", "", learner, ""]
        )
        points = [f"{scores.get((learner, notebook), 0):g}" for notebook in notebooks]
        rows.append(identity + points)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "canvas.csv").open("w", newline="", encoding="utf-8") as file:
        numeric = set(range(len(IDENTITY), len(IDENTITY) + len(notebooks)))
        csv.writer(file).writerows(validation.row(r, numeric) for r in rows)
    return out / "canvas.csv", unknown
