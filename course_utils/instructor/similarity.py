"""Answer cells that are alike across a class: ``similarity.csv`` and ``similarity.html``.

For each exercise (an nbgrader solution cell, by ``grade_id``), every pair of learners'
answers is fingerprinted and compared with copydetect (winnowed k-grams of the code after
its names, strings and comments are normalized away, so renaming variables and
reformatting change nothing). What the instructor gave (the starter code of the student
version and the instructor's own solution) is boilerplate: sharing it proves nothing. A
pair is reported when the shared code covers at least ``threshold`` of either answer and
is at least ``min_shared`` normalized characters long, so that two independent one-line
answers to a small exercise are not reported. The report is evidence to look at, not a
verdict (docs/instructor-guide.md).
"""

from __future__ import annotations

import csv
import html
import io
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_utils.instructor import validation

#: copydetect's defaults: k-grams of 25 normalized characters, every k-gram of a 30
#: character stretch of shared code is found (window 30 - 25 + 1).
NOISE = 25
GUARANTEE = 30
THRESHOLD = 0.7
MIN_SHARED = 60

#: answers[learner][notebook][grade_id] = the learner's answer cell
Answers = Mapping[str, Mapping[str, Mapping[str, str]]]


@dataclass(frozen=True)
class SimilarPair:
    """Two learners' answers to one exercise that share code beyond the boilerplate."""

    notebook: str
    exercise: str
    learner_a: str
    learner_b: str
    #: the share of each answer's code that the other also has
    share_a: float
    share_b: float
    shared_lines: str

    @property
    def similarity(self) -> float:
        return max(self.share_a, self.share_b)


def answer_cells(submission: Any, reference: Any) -> dict[str, str]:
    """The learner's answer to each exercise of ``reference`` (found by grade_id or, when
    the learner lost it, by content), by grade_id."""
    from course_utils.instructor.matching import match_cells  # lazy: imports the notebooks extra

    matches = match_cells(submission, reference)
    return {
        gid: submission.cells[match.index].source
        for gid, match in matches.items()
        if match.role == "solution"
    }


_STARTER = "\n# -- the student version's starter code --\n"
#: The pseudo-exercise under which all of a learner's own code in a notebook is compared.
OWN_CODE = "(all own code)"
#: learner_b of a row whose answer is the instructor's published solution.
SOLUTION = "(published solution)"


def given_cells(reference: Any) -> frozenset[str]:
    """The code cells the instructor gave (of the instructor notebook ``reference`` and of
    its student version), their form fields blanked (:func:`_blank_fields`)."""
    from course_utils.instructor.student import student_version  # lazy: nbgrader

    return frozenset(
        _blank_fields(cell.source)
        for notebook in (reference, student_version(reference))
        for cell in notebook.cells
        if cell.cell_type == "code"
    )


def own_code(
    submission: Any, reference: Any, given: frozenset[str] | None = None
) -> dict[str, str]:
    """All the learner's own code in a notebook, helper cells included, as one text under
    :data:`OWN_CODE`: every code cell but checks and what the instructor gave (``given``,
    by default :func:`given_cells` of ``reference``: a cell of the instructor notebook or
    of its student version, the same once the setup cell's form fields are blanked), and
    any cell tagged ``colab-setup``, which ``publish`` fills in."""
    from course_utils.instructor.student import nbgrader_role  # lazy: nbgrader

    given = given_cells(reference) if given is None else given
    mine = [
        cell.source
        for cell in submission.cells
        if cell.cell_type == "code"
        and _blank_fields(cell.source) not in given
        and nbgrader_role(cell) != "check"
        and SETUP_TAG not in (cell.get("metadata", {}).get("tags") or [])
    ]
    return {OWN_CODE: _CELL_BREAK.join(mine)} if "".join(mine).strip() else {}


#: Between two cells of :data:`OWN_CODE`'s text: longer than a k-gram once normalized, and
#: the same in the instructor's text, so no k-gram spans two cells (two learners who kept
#: the same two given cells next to each other share nothing there).
_CELL_BREAK = "\n" + "(" * 16 + ")" * 16 + "  # -- next cell --\n"
#: The tag of the setup cell (:mod:`course_utils.tooling.colab`): publish fills in its fields.
SETUP_TAG = "colab-setup"
#: A form field's value (``NAME = "..."``, as the setup cell writes them).
_FIELD = re.compile(r'^([A-Z][A-Z0-9_]*) = "[^"\n]*"', re.MULTILINE)


def _blank_fields(source: str) -> str:
    r"""``source`` stripped, with every ``NAME = "value"`` line's value emptied: the setup
    cell as committed and as ``publish`` filled it in are then the same.

    >>> _blank_fields('COURSE_REPO = "org/course"  # @param\nx = "kept"\n')
    'COURSE_REPO = ""  # @param\nx = "kept"'
    """
    return _FIELD.sub(r'\1 = ""', source.strip())


def _tokens(code: str) -> tuple[str, ...] | None:
    """The code's tokens without comments, layout or the solution markers; None if it
    does not tokenize."""
    import tokenize  # lazy: only for this comparison

    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    try:
        found = tokenize.generate_tokens(io.StringIO(code).readline)
        return tuple(t.string for t in found if t.type not in skip and t.string)
    except (tokenize.TokenError, SyntaxError):
        return None


def boilerplate(reference: Any) -> dict[str, str]:
    """What the instructor gave for each exercise (the solution and its starter code) and,
    under :data:`OWN_CODE`, for the whole notebook (every code cell of the instructor
    notebook and of its student version: setup cell, helpers, solutions, starter code,
    checks)."""
    from course_utils.instructor.student import nbgrader_role, student_version  # lazy: nbgrader

    starter = student_version(reference)
    given: dict[str, str] = {}
    everything: list[str] = []
    for mine, theirs in zip(reference.cells, starter.cells, strict=True):
        if mine.cell_type == "code":
            everything += [mine.source, theirs.source]
        gid = mine.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid and nbgrader_role(mine) == "solution":
            given[str(gid)] = mine.source + _STARTER + theirs.source
    given[OWN_CODE] = _CELL_BREAK.join(everything)
    return given


def _fingerprint(code: str, boilerplate_hashes: Any = None, window: int = 0) -> Any:
    from copydetect import CodeFingerprint  # lazy: classroom extra

    win = window or GUARANTEE - NOISE + 1
    return CodeFingerprint("answer.py", NOISE, win, boilerplate_hashes, fp=io.StringIO(code))


def _shared_lines(code: str, slices: Any) -> str:
    """The lines of ``code`` that the copied character slices touch."""
    starts = [0]
    for line in code.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    lines = code.splitlines()
    keep: set[int] = set()
    for begin, end in zip(*slices, strict=True):
        keep.update(n for n in range(len(lines)) if starts[n] < end and starts[n + 1] > begin)
    return "\n".join(lines[n] for n in sorted(keep) if lines[n] != _CELL_BREAK.strip())


#: learner_b of a row whose answer runs text as code (``exec(base64...)`` hides code
#: from the comparison): read that answer.
RUNS_TEXT = "(needs review: runs text as code)"
#: Built-ins that run or build code from text, called by their bare name.
_RUNNERS = frozenset({"exec", "eval", "compile", "__import__"})
#: Modules that decode or load code (or reach the built-ins another way).
_DECODERS = frozenset({"base64", "marshal", "codecs", "importlib", "builtins", "__builtins__"})


#: The same, by words, for a cell that does not tokenize.
_WORDS = re.compile(
    r"(?<![.\w])(?:exec|eval|compile|__import__)\b|"
    r"\b(?:base64|marshal|codecs|importlib|builtins|__builtins__)\b"
)


def runs_text(code: str) -> list[str]:
    r"""The lines of ``code`` that run text as code or decode it: a bare ``exec``,
    ``eval``, ``compile`` or ``__import__`` (not ``torch.compile``), or a use of
    ``base64``, ``marshal``, ``codecs``, ``importlib``, ``builtins``.

    >>> runs_text("import base64\nexec(base64.b64decode(s))\nm = torch.compile(m)")
    ['import base64', 'exec(base64.b64decode(s))']
    """
    import tokenize  # lazy: only for this check

    found: set[int] = set()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        tokens = []
    before = ""
    for token in tokens:
        if token.type == tokenize.NAME:
            bare = before != "."
            if (token.string in _RUNNERS and bare) or token.string in _DECODERS:
                found.add(token.start[0])
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            before = token.string
    if not tokens:  # not Python (a magic, a broken cell): by words
        found = {n for n, line in enumerate(code.splitlines(), 1) if _WORDS.search(line)}
    lines = code.splitlines()
    return [lines[n - 1].strip() for n in sorted(found) if n <= len(lines)]


def _runs_text_rows(answers: Answers, given: Mapping[str, Mapping[str, str]]) -> list[SimilarPair]:
    """One row per learner and exercise whose answer runs text as code (what the
    instructor's own code for it does not), under :data:`RUNS_TEXT`; a notebook's
    :data:`OWN_CODE` only when none of its exercises was flagged already."""
    rows: list[SimilarPair] = []
    for learner in sorted(answers):
        for notebook, cells in sorted(answers[learner].items()):
            flagged = False
            for gid in sorted(cells, key=lambda g: g == OWN_CODE):
                if gid == OWN_CODE and flagged:
                    continue
                theirs = set(runs_text(given.get(notebook, {}).get(gid, "")))
                lines = [line for line in runs_text(cells[gid]) if line not in theirs]
                if lines:
                    flagged = True
                    rows.append(SimilarPair(notebook, gid, learner, RUNS_TEXT, 0.0, 0.0,
                                            "\n".join(lines)))  # fmt: skip
    return rows


def similar_pairs(
    answers: Answers,
    given: Mapping[str, Mapping[str, str]],
    threshold: float = THRESHOLD,
    min_shared: int = MIN_SHARED,
) -> list[SimilarPair]:
    """The pairs of answers alike beyond ``threshold`` (see the module's documentation),
    per notebook and exercise, most alike first. ``given[notebook][grade_id]`` is the
    instructor's code for that exercise. Then one row per answer that runs text as code
    (:func:`runs_text`, learner_b :data:`RUNS_TEXT`): such an answer can hide its code
    from the comparison, so it is flagged for review whatever its similarity."""
    import numpy as np  # lazy: with copydetect
    from copydetect import compare_files

    exercises = sorted(
        {
            (nb, gid)
            for notebooks in answers.values()
            for nb, cells in notebooks.items()
            for gid in cells
        }
    )
    pairs: list[SimilarPair] = []
    for notebook, gid in exercises:
        mine = given.get(notebook, {}).get(gid, "")
        solution = _tokens(_solution_part(mine)) if mine and gid != OWN_CODE else None
        for learner in sorted(answers):
            code = answers[learner].get(notebook, {}).get(gid, "")
            if solution and code.strip() and _tokens(code) == solution:
                pairs.append(SimilarPair(notebook, gid, learner, SOLUTION, 1.0, 1.0, code))
        hashes = np.unique(np.array(list(_fingerprint(mine, window=1).hashes))) if mine else None
        prints = {
            learner: _fingerprint(code, hashes)
            for learner in sorted(answers)
            if (code := answers[learner].get(notebook, {}).get(gid, "")).strip()
        }
        for a, b in itertools.combinations(sorted(prints), 2):
            shared, (share_a, share_b), (slices_a, _) = compare_files(prints[a], prints[b])
            if shared < min_shared or max(share_a, share_b) < threshold:
                continue
            lines = _shared_lines(prints[a].raw_code, slices_a)
            pairs.append(SimilarPair(notebook, gid, a, b, float(share_a), float(share_b), lines))
    pairs.sort(key=lambda p: (-p.similarity, p.notebook, p.exercise, p.learner_a, p.learner_b))
    return pairs + _runs_text_rows(answers, given)  # evidence of another kind: last


def _solution_part(given: str) -> str:
    """The instructor's solution cell out of :func:`boilerplate`'s text (solution, then
    the starter code), without the solution markers."""
    solution = given.split(_STARTER)[0]
    lines = [line for line in solution.split("\n") if "### BEGIN SOLUTION" not in line
             and "### END SOLUTION" not in line]  # fmt: skip
    return "\n".join(lines)


def write_similarity(out: Path, pairs: list[SimilarPair], threshold: float) -> tuple[Path, Path]:
    """Write ``similarity.csv`` and its readable page ``similarity.html``."""
    out.mkdir(parents=True, exist_ok=True)
    header = ["notebook", "exercise", "learner_a", "learner_b", "similarity", "share_a",
              "share_b", "shared_lines"]  # fmt: skip
    with (out / "similarity.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        for p in pairs:
            shares = (f"{p.similarity:.2f}", f"{p.share_a:.2f}", f"{p.share_b:.2f}")
            writer.writerow(validation.row([p.notebook, p.exercise, p.learner_a, p.learner_b,
                                            *shares, p.shared_lines], {4, 5, 6}))  # fmt: skip
    rows = "".join(
        f"<tr><td>{html.escape(p.notebook)}</td><td>{html.escape(p.exercise)}</td>"
        f"<td>{html.escape(p.learner_a)}</td><td>{html.escape(p.learner_b)}</td>"
        f"<td>{p.similarity:.0%}</td><td><pre>{html.escape(p.shared_lines)}</pre></td></tr>\n"
        for p in pairs
    )
    page = (
        "<!doctype html>\n<html lang=en><meta charset=utf-8><title>Similar answers</title>\n"
        "<style>body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;"
        "padding:4px;vertical-align:top}table{border-collapse:collapse}pre{margin:0}</style>\n"
        f"<h1>Similar answers</h1>\n<p>{len(pairs)} pair(s) of answers share at least "
        f"{threshold:.0%} of one answer's code beyond what the instructor gave (names, "
        "strings, comments and layout ignored). This is evidence to look at, not a verdict: "
        "read both notebooks before you conclude anything. Rows whose second learner is "
        f"{html.escape(RUNS_TEXT)} are answers that build code from text (exec, eval, "
        "compile, base64, marshal...): what they run is hidden from this comparison, so "
        "read them.</p>\n"
        "<table><tr><th>notebook</th><th>exercise</th><th>learner</th><th>learner</th>"
        f"<th>similarity</th><th>shared lines ({'first learner'})</th></tr>\n{rows}</table>\n"
    )
    (out / "similarity.html").write_text(page, encoding="utf-8")
    return out / "similarity.csv", out / "similarity.html"
