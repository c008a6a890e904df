"""Find a submission's exercise cells, also when their nbgrader metadata went missing
(a cell deleted and typed again, a notebook re-saved by another editor: nbgrader issues
424 and 1398).

Each exercise cell of the instructor's notebook is found by its ``grade_id``, else among
the submission's cells without a known ``grade_id``: a check by its visible source (at
least :data:`CHECK_ALIKE` alike between the same lesson cells as the instructor's,
:data:`CHECK_ALIKE_ELSEWHERE` elsewhere); a solution by the names it defines, or as the
only code cell left between the same lesson cells. :attr:`Match.how` says how.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass
from typing import Any

from course_utils.instructor.student import nbgrader_role

#: How alike (0 to 1, difflib's ratio) a cell must be to the instructor's check.
CHECK_ALIKE = 0.6
CHECK_ALIKE_ELSEWHERE = 0.85
_HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.DOTALL)
_SOLUTION = re.compile(r"### BEGIN SOLUTION.*?### END SOLUTION", re.DOTALL)


@dataclass(frozen=True)
class Match:
    """Where an instructor's exercise cell is in the submission (``cells`` index)."""

    grade_id: str
    role: str  # "solution" or "check"
    index: int
    how: str = ""  # empty when found by grade_id


def grade_id(cell: Any) -> str | None:
    """A cell's nbgrader ``grade_id``, or None."""
    meta = cell.get("metadata", {})
    meta = meta.get("nbgrader", {}) if isinstance(meta, dict) else {}
    value = meta.get("grade_id") if isinstance(meta, dict) else None
    return str(value) if value else None


def _normal(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def _alike(a: str, b: str, at_least: float = 0.0) -> float:
    """difflib's ratio of two sources (0 when a quick upper bound is below ``at_least``)."""
    matcher = difflib.SequenceMatcher(None, _normal(a), _normal(b), autojunk=False)
    if matcher.real_quick_ratio() < at_least or matcher.quick_ratio() < at_least:
        return 0.0
    return matcher.ratio()


def defined_names(source: str, *, imports: bool = True) -> set[str]:
    """Top-level names a cell defines: functions, classes, assigned (and imported) names.

    >>> sorted(defined_names("import torch\\ndef f(x):\\n    y = 1\\nK, n = 2, 3"))
    ['K', 'f', 'n', 'torch']
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:  # half-typed cells: the def and class lines still tell
        return set(re.findall(r"^(?:def|class)\s+(\w+)", source, re.MULTILINE))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif imports and isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def _anchors(source_cells: list[Any], cells: list[Any]) -> dict[int, int]:
    """Lesson cells (no nbgrader role) found unchanged in the submission: index → index."""
    lesson = [i for i, cell in enumerate(source_cells) if nbgrader_role(cell) is None]
    keys = [(source_cells[i].cell_type, _normal(source_cells[i].source)) for i in lesson]
    theirs = [(cell.cell_type, _normal(cell.source)) for cell in cells]
    matcher = difflib.SequenceMatcher(None, keys, theirs, autojunk=False)
    anchors: dict[int, int] = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            if keys[block.a + k][1]:  # an empty cell anchors nothing
                anchors[lesson[block.a + k]] = block.b + k
    return anchors


def match_cells(submission: Any, source: Any) -> dict[str, Match]:
    """Every exercise cell of ``source`` found in ``submission``, by grade_id."""
    cells = submission.cells
    exercises = [
        (i, cell)
        for i, cell in enumerate(source.cells)
        if cell.cell_type == "code" and nbgrader_role(cell) and grade_id(cell)
    ]
    roles = {grade_id(cell): nbgrader_role(cell) for _, cell in exercises}
    matches: dict[str, Match] = {}
    for index, cell in enumerate(cells):
        found, role = grade_id(cell), nbgrader_role(cell)
        known_here = cell.cell_type == "code" and found in roles and roles[found] == role
        if known_here and found not in matches:
            matches[str(found)] = Match(str(found), str(role), index)
    missing = [(i, cell) for i, cell in exercises if grade_id(cell) not in matches]
    if not missing:
        return matches
    anchors = _anchors(source.cells, cells)
    for position, cell in exercises:  # exercise cells found by grade_id anchor too
        if grade_id(cell) in matches:
            anchors[position] = matches[str(grade_id(cell))].index
    free = {
        index
        for index, cell in enumerate(cells)
        if cell.cell_type == "code" and grade_id(cell) not in roles and cell.source.strip()
    }
    # Checks first (their text is the strongest evidence), then solutions.
    for role in ("check", "solution"):
        pairs: list[tuple[float, int, str, str]] = []
        gaps: dict[str, set[int]] = {}
        for position, cell in missing:
            if nbgrader_role(cell) != role:
                continue
            gid = str(grade_id(cell))
            gaps[gid] = gap = _gap(position, anchors, len(cells))
            for index in free:
                scored = _score(cell, cells[index].source, role, index in gap)
                if scored is not None:
                    pairs.append((scored[0], index, gid, scored[1]))
        for _, index, gid, how in sorted(pairs, key=lambda p: -p[0]):
            if gid in matches or index not in free:
                continue
            matches[gid] = Match(gid, role, index, how)
            free.discard(index)
        if role == "check":  # a check is found by its text only: its place says nothing
            continue
        for gid, gap in gaps.items():  # the only code cell left where it should be
            left = sorted(gap & free)
            alone = [g for g, other in gaps.items() if g not in matches and other == gap]
            if gid not in matches and len(left) == 1 and alone == [gid]:
                matches[gid] = Match(gid, role, left[0], "by its place between the lesson cells")
                free.discard(left[0])
    return matches


def _gap(position: int, anchors: dict[int, int], count: int) -> set[int]:
    """Submission indices between the anchors around an instructor cell's position."""
    low = max((at for i, at in anchors.items() if i < position), default=-1)
    high = min((at for i, at in anchors.items() if i > position), default=count)
    return set(range(low + 1, high))


def _score(cell: Any, theirs: str, role: str, in_gap: bool) -> tuple[float, str] | None:
    """How well a submission cell (source ``theirs``) matches an instructor cell."""
    if role == "check":
        visible = _HIDDEN.sub("", cell.source)
        needed = CHECK_ALIKE if in_gap else CHECK_ALIKE_ELSEWHERE
        alike = max(_alike(visible, theirs, needed), _alike(cell.source, theirs, needed))
        if alike >= needed:
            return alike + (1 if in_gap else 0), f"by its source ({alike:.0%} like the check)"
        return None
    if "passed(" in theirs:  # a check pasted as a cell of its own is no solution
        return None
    # The names the learner was given (outside the solution markers) must all be there;
    # without any, at least half of those the instructor's answer defines.
    given = defined_names(_SOLUTION.sub("pass", cell.source), imports=False)
    names = given or defined_names(cell.source, imports=False)
    common = names & defined_names(theirs, imports=False)
    if not common or (common != given if given else 2 * len(common) < len(names)):
        return None
    listed = ", ".join(sorted(common))
    return len(common) / len(names) + (1 if in_gap else 0), f"by the names it defines ({listed})"
