"""The gradebook as ``canvas.csv``, in the format Canvas's gradebook import reads.

Columns, as in a gradebook that Canvas exports (Grades → Export): ``Student``, ``ID``,
``SIS User ID``, ``SIS Login ID``, ``Section``, then one column per Canvas assignment with
the learner's points (:func:`assignment_columns`: ``--column NOTEBOOK=COLUMN``, several
notebooks into one assignment, else a roster column ``STEM (ID)``, else the stem). The
second row, ``Points Possible``, gives each column's maximum, which Canvas uses for an
assignment the import creates. Canvas matches rows to students by ``ID``, ``SIS User ID``
or ``SIS Login ID``: without a roster the learner's name goes into ``SIS Login ID``; with
``--roster`` (a gradebook exported from the course) each row takes the student's name, IDs
and section from the roster. A cell whose notebook was handed in but not scored is left
empty (the import keeps what Canvas has), never 0. With a roster every student of it has a
row, those who handed in nothing too (:func:`absent_students`); a notebook not handed in
counts 0, or with ``--missing blank`` leaves its cell empty (Canvas: missing). The file is
written whole or not at all, and a roster that lacks a learner leaves none
(:func:`check_roster`).
"""

from __future__ import annotations

import csv
from collections.abc import Collection, Mapping, Sequence
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


def assignment_columns(
    notebooks: Sequence[str], roster_columns: Sequence[str], mapping: Mapping[str, str]
) -> dict[str, str]:
    """The Canvas column each notebook's points go to. ``mapping`` (``--column``) gives a
    notebook (file name or stem) a column: a roster column's full name, its assignment id
    alone (``5501`` for ``Lab 1 (5501)``), or a new name; several notebooks may share one
    (their points are added). Otherwise a roster column ``STEM (ID)`` if there is one,
    else the stem. :class:`InputError` for a notebook not in the assignment or an id the
    roster lacks."""
    by_stem = {Path(notebook).stem: notebook for notebook in notebooks}
    chosen: dict[str, str] = {}
    for name, column in mapping.items():
        notebook = name if name in notebooks else by_stem.get(name)
        if notebook is None:
            raise InputError(f"--column {name}=...: {name} is not a notebook of the assignment")
        if column.isdigit():
            found = [c for c in roster_columns if c.endswith(f" ({column})")]
            if not found:
                raise InputError(f"--column {name}={column}: the roster has no assignment {column}")
            column = found[0]
        chosen[notebook] = column
    for notebook in notebooks:
        if notebook not in chosen:
            stem = Path(notebook).stem
            existing = [c for c in roster_columns if c.startswith(f"{stem} (") and c.endswith(")")]
            chosen[notebook] = existing[0] if existing else stem
    return chosen


def parse_columns(specs: Sequence[str]) -> dict[str, str]:
    """``--column NOTEBOOK=COLUMN`` options as a mapping (:class:`InputError` if malformed)."""
    mapping: dict[str, str] = {}
    for spec in specs:
        notebook, _, column = spec.partition("=")
        if not notebook.strip() or not column.strip():
            example = '01_x="Lab 1 (5501)"'
            raise InputError(f"--column takes NOTEBOOK=COLUMN, such as {example}, not {spec!r}")
        mapping[notebook.strip()] = column.strip()
    return mapping


def check_roster(out: Path, roster: Path, learners: Sequence[str]) -> dict[str, dict[str, str]]:
    """The roster's students; :class:`InputError` naming the learners it lacks, after
    removing a ``canvas.csv`` left in ``out`` by an earlier run (it would be stale)."""
    students, _ = read_roster(roster)
    unknown = [learner for learner in learners if learner not in students]
    if unknown:
        (out / "canvas.csv").unlink(missing_ok=True)
        raise InputError(
            f"the roster {roster} has no student named {', '.join(unknown)} (no canvas.csv written)"
        )
    return students


def absent_students(roster: Path, learners: Sequence[str]) -> list[str]:
    """The roster's students that none of ``learners`` is (they handed in nothing), each
    named as a submission of theirs would be: by ``SIS Login ID``, else ``ID``, else
    ``Student``."""
    students, _ = read_roster(roster)
    present = {id(students[name]) for name in learners if name in students}
    absent: dict[int, str] = {}
    for row in students.values():
        if id(row) not in present and id(row) not in absent:
            absent[id(row)] = row.get("SIS Login ID") or row.get("ID") or row["Student"]
    return sorted(absent.values())


def write_canvas(
    out: Path,
    learners: Sequence[str],
    notebooks: Sequence[str],
    scores: Mapping[tuple[str, str], float],
    maxima: Mapping[str, float],
    roster: Path | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    pending: Collection[tuple[str, str]] = (),
    handed: Collection[tuple[str, str]] | None = None,
) -> Path:
    """Write ``out/canvas.csv`` (whole, or not at all) and return its path. A learner's
    cell is the sum of the points of the notebooks that go to its column; a notebook not
    handed in counts 0, but with ``handed`` (the learner and notebook of each one handed
    in) a cell none of whose notebooks was handed in is left empty (Canvas: missing); a
    cell with a notebook in ``pending`` (handed in but not scored: not matched, or not
    graded) is left empty, so the import keeps what Canvas has. :class:`InputError`, and
    no ``canvas.csv``, when the roster lacks a learner."""
    students = check_roster(out, roster, learners) if roster else {}
    roster_columns = read_roster(roster)[1] if roster else []
    chosen = assignment_columns(notebooks, roster_columns, columns or {})
    headers = list(dict.fromkeys(chosen[notebook] for notebook in notebooks))
    groups = {header: [nb for nb in notebooks if chosen[nb] == header] for header in headers}
    rows = [IDENTITY + headers, [POINTS_POSSIBLE, "", "", "", ""]]
    rows[1] += [f"{sum(maxima.get(nb, 0) for nb in groups[h]):g}" for h in headers]
    for learner in learners:
        student = students.get(learner)
        identity = (
            [student.get(key, "") for key in IDENTITY]
            if student
            else [learner, "", "", learner, ""]
        )
        cells = []
        for header in headers:
            group = groups[header]
            unscored = any((learner, notebook) in pending for notebook in group)
            absent = handed is not None and not any((learner, nb) in handed for nb in group)
            if unscored or absent:
                cells.append("")
            else:
                cells.append(f"{sum(scores.get((learner, nb), 0) for nb in group):g}")
        rows.append(identity + cells)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "canvas.csv.partial"
    with partial.open("w", newline="", encoding="utf-8") as file:
        numeric = set(range(len(IDENTITY), len(IDENTITY) + len(headers)))
        csv.writer(file).writerows(validation.row(r, numeric) for r in rows)
    return partial.replace(out / "canvas.csv")
