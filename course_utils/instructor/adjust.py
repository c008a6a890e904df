"""The instructor's word on the grader's scores: overrides and late penalties.

Both are applied when a class run's files are written (``grade-class`` and
``grade-merge``), to copies of the stored results, so that changing the overrides file or
the late policy and running the command again rewrites every output without grading
anything again (the results on disk stay the grader's own).

* **Overrides** (``--overrides FILE``): a CSV with the columns ``learner``, ``check`` (a
  check cell's grade_id), ``points`` and ``comment`` (and, optionally, ``notebook``). The
  check scores ``points`` instead of the grader's; ``checks.csv`` shows the comment and
  what the grader gave, the feedback shows the comment to the learner.
* **Lateness** (``--late-penalty 10%/day``, ``--late-cap 50%``, ``--due``): a notebook
  handed in late loses that share of its points possible for each day or part of a day
  (or once, for ``10%``), at most the cap, never below 0, as Canvas's own late policy
  does. Whether it is late: Canvas's ``_late`` marker in the download's file names (Canvas
  knows each learner's extensions), else a submission time (``--submitted-at``) after
  ``--due``. How many days: from the submission time and ``--due`` when both are known,
  else 1.
"""

from __future__ import annotations

import copy
import csv
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from course_utils.instructor.intake import parse_time
from course_utils.instructor.student import InputError

_PENALTY = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*%\s*(?P<per>/\s*day)?\s*$", re.I)
DAY_S = 86_400


@dataclass(frozen=True)
class Override:
    """The instructor's points for one learner's check, and why."""

    learner: str
    notebook: str
    check: str
    points: float
    comment: str


@dataclass(frozen=True)
class LatePolicy:
    """How late work loses points: ``rate`` of its points possible per day (or once when
    not ``per_day``), at most ``cap``; ``due``: the deadline, for submission times."""

    rate: float = 0.0
    per_day: bool = True
    cap: float = 1.0
    due: datetime | None = None

    def penalty(self, days: int) -> float:
        """The share of the points possible lost for ``days`` late (0: on time)."""
        if days <= 0:
            return 0.0
        return min(self.cap, self.rate * (days if self.per_day else 1))


def parse_share(text: str, option: str) -> tuple[float, bool]:
    """``"10%/day"`` → ``(0.1, True)``; ``"10%"`` → ``(0.1, False)``.

    >>> parse_share("10%/day", "--late-penalty")
    (0.1, True)
    """
    found = _PENALTY.match(text)
    if found is None or float(found["number"]) > 100:
        raise InputError(f"{option} takes a percentage such as 10% or 10%/day, not {text!r}")
    return float(found["number"]) / 100, bool(found["per"])


def late_policy(penalty: str | None, cap: str | None, due: str | None) -> LatePolicy | None:
    """The policy the command line gives, or None when it gives no penalty."""
    if penalty is None:
        if cap is not None or due is not None:
            raise InputError("--late-cap and --due go with --late-penalty")
        return None
    rate, per_day = parse_share(penalty, "--late-penalty")
    most = parse_share(cap, "--late-cap")[0] if cap is not None else 1.0
    if cap is not None and "/" in cap:
        raise InputError(f"--late-cap takes a percentage such as 50%, not {cap!r}")
    return LatePolicy(rate, per_day, most, parse_time(due, "--due") if due else None)


def days_late(handed: Mapping[str, Any], policy: LatePolicy) -> int:
    """Days (or parts of a day) a notebook was late: 0 when on time (see the module)."""
    submitted = handed.get("submitted_at")
    when = parse_time(submitted, "run.json") if submitted else None
    late = handed.get("late")
    if late is None:  # no marker: a folder layout; the time alone says
        late = bool(when and policy.due and when > policy.due)
    if not late:
        return 0
    if when and policy.due:
        return max(1, math.ceil((when - policy.due).total_seconds() / DAY_S))
    return 1


def read_overrides(
    path: Path, checks: Mapping[str, Mapping[str, float]], learners: Sequence[str]
) -> list[Override]:
    """The overrides file; ``checks``: notebook → grade_id → points possible.
    :class:`InputError` naming the line for an unknown learner or check, or points that
    are not a number between 0 and the check's points."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as file:
            rows = list(csv.DictReader(file))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise InputError(f"cannot read the overrides {path}: {error}") from None
    needed = {"learner", "check", "points", "comment"}
    if (rows and not needed <= set(rows[0])) or (not rows and path.stat().st_size):
        raise InputError(f"{path} needs the columns learner, check, points, comment")
    overrides = []
    for number, row in enumerate(rows, 2):
        where = f"{path}, line {number}"
        learner, check = (row.get("learner") or "").strip(), (row.get("check") or "").strip()
        if learner not in learners:
            raise InputError(f"{where}: no learner {learner!r} in this class")
        places = [nb for nb, ids in checks.items() if check in ids]
        notebook = (row.get("notebook") or "").strip()
        if notebook:
            places = [nb for nb in places if notebook in (nb, Path(nb).stem)]
        if len(places) != 1:
            what = "is in several notebooks: add a notebook column" if places else "is no check"
            raise InputError(f"{where}: {check!r} {what} of the assignment")
        most = checks[places[0]][check]
        try:
            points = float(row.get("points") or "")
        except ValueError:
            points = math.nan
        if not 0 <= points <= most:
            raise InputError(f"{where}: points must be a number from 0 to {most:g}")
        comment = " ".join((row.get("comment") or "").split())
        overrides.append(Override(learner, places[0], check, points, comment))
    return overrides


def adjust(
    results: Sequence[dict[str, Any]],
    overrides: Sequence[Override] = (),
    policy: LatePolicy | None = None,
    handed: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Copies of the results with the overrides and late penalties applied (each report
    then has ``override`` notes and, when late, ``late`` = {days, penalty, before}); and
    notes on overrides that found no graded notebook."""
    by_cell = {(o.learner, o.notebook): [] for o in overrides}  # type: dict[Any, list[Override]]
    for override in overrides:
        by_cell[(override.learner, override.notebook)].append(override)
    unused = set(by_cell)
    adjusted = []
    for result in results:
        result = copy.deepcopy(result)
        report = result.get("report")
        cell = (result.get("learner"), result.get("notebook"))
        if report is not None:
            unused.discard(cell)
            for override in by_cell.get(cell, []):
                for check in report["checks"]:
                    if check["grade_id"] != override.check:
                        continue
                    was = f"{check['points']:g}/{check['max_points']:g}"
                    graded = "passed" if check["passed"] else f"failed: {check['reason']}"
                    check["reason"] = f"instructor: {override.comment or 'points set'} " \
                                      f"(the grader gave {was}, {graded})"  # fmt: skip
                    check["points"] = override.points
                    check["passed"] = override.points >= check["max_points"]
                    check["override"] = override.comment
            report["score"] = sum(check["points"] for check in report["checks"])
            about = (handed or {}).get(str(cell[0]), {}).get(str(cell[1]))
            if policy is not None and about is not None:
                days = days_late(about, policy)
                lost = round(min(report["score"], policy.penalty(days) * report["max_score"]), 4)
                if days:
                    report["late"] = {"days": days, "penalty": lost, "before": report["score"]}
                    report["score"] = round(report["score"] - lost, 4)
        adjusted.append(result)
    notes = [
        f"override for {learner}'s {notebook} not applied: it was not graded"
        for learner, notebook in sorted(unused)
    ]
    return adjusted, notes


def late_text(late: Mapping[str, Any]) -> str:
    """``2 days late: -0.6``"""
    days = late["days"]
    return f"{days} day{'s' if days != 1 else ''} late: -{late['penalty']:g}"
