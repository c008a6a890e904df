"""Grade a submitted notebook (``python -m course_utils grade SUBMISSION.ipynb``).

How a submission is graded:

1. **The checks come from the instructor's notebook** (``source``), never from the
   submission: each check cell (nbgrader metadata ``grade: true``) is matched by its
   ``grade_id`` and its code replaced by the instructor's, hidden checks included, so a
   learner cannot edit a check away. A check cell deleted from the submission scores 0
   with the reason ``cell missing: deleted from the submission``.
2. **The learner's cells run in order**, one by one, in a fresh kernel on the CPU
   (``COURSE_WORKLOAD=small``, ``CUDA_VISIBLE_DEVICES=""``, ``COURSE_DEVICE=cpu``) in a
   scratch folder. A cell that raises does not stop the run (nbclient's ``allow_errors``):
   later cells, and later checks, still run.
3. **Nothing can hang the grader.** Every cell has a time limit, and so has the whole run.
   When a cell runs past its limit or kills the kernel (``os._exit``, ``os.kill``, a crash),
   the kernel is replaced by a fresh one, the cells that had run without error before it
   are replayed, and grading goes on with the next cell. ``sys.exit()`` in a cell is only
   an exception (IPython catches ``SystemExit``). When the whole run's time is up, the
   checks not yet run score 0 with that reason.
4. **Each check cell scores** its ``points`` if it runs without an exception, else 0 with
   the reason: the :class:`~course_utils.classroom.CheckFailed` message, the exception,
   ``timed out``, ``kernel died`` or ``not run``.

This stops accidents and casual tampering, not a determined attacker: the learner's code
runs in the same Python process as the checks (as it does with nbgrader), so it could
replace the check functions. Read a suspicious submission.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from course_utils.student import nbgrader_role

#: Defaults of the CLI: seconds per cell and for the whole run.
CELL_TIMEOUT_S = 120
TOTAL_TIMEOUT_S = 900
#: Seconds a fresh kernel may take to import torch and the checks (not counted per cell).
WARM_UP_S = 120

_COURSE_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class CellOutcome:
    """What happened when one cell ran: ``ok``, ``error``, ``timeout``, ``dead`` or
    ``not-run``; for an error, the exception's name and message."""

    status: str
    ename: str = ""
    evalue: str = ""
    seconds: float = 0.0


@dataclass
class CheckResult:
    """The score of one check cell."""

    grade_id: str
    points: float
    max_points: float
    passed: bool
    reason: str


@dataclass
class GradeReport:
    """The scores of one submission."""

    submission: str
    source: str
    checks: list[CheckResult]
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        return sum(check.points for check in self.checks)

    @property
    def max_score(self) -> float:
        return sum(check.max_points for check in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "submission": self.submission,
            "source": self.source,
            "score": self.score,
            "max_score": self.max_score,
            "seconds": round(self.seconds, 2),
            "checks": [asdict(check) for check in self.checks],
            "notes": self.notes,
        }

    def format(self) -> str:
        """A table: one line per check, then the total."""
        width = max([len(check.grade_id) for check in self.checks] + [len("total")])
        lines = [f"Grading {self.submission} (checks from {self.source})"]
        for check in self.checks:
            mark = "passed" if check.passed else f"failed: {check.reason}"
            lines.append(
                f"  {check.grade_id:<{width}}  {_points(check.points)}/"
                f"{_points(check.max_points)}  {mark}"
            )
        lines.append(
            f"  {'total':<{width}}  {_points(self.score)}/{_points(self.max_score)}"
            f"  ({self.seconds:.1f} s)"
        )
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _points(value: float) -> str:
    return f"{value:g}"


def _grade_id(cell: Any) -> str | None:
    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    return str(grade_id) if grade_id else None


def check_cells(notebook: Any) -> dict[str, Any]:
    """The check cells (nbgrader ``grade: true``) of a notebook, by ``grade_id``, in order."""
    checks: dict[str, Any] = {}
    for cell in notebook.cells:
        grade_id = _grade_id(cell)
        if cell.cell_type == "code" and nbgrader_role(cell) == "check" and grade_id:
            checks.setdefault(grade_id, cell)
    return checks


def assemble(submission: Any, source: Any) -> tuple[list[Any], dict[int, str]]:
    """The code cells to run: the submission's, with each check replaced by the source's.

    Returns the cells and, for the position of each check cell among them, its grade_id.
    A cell that claims a check's grade_id a second time is left out; a check the source
    does not have is run as an ordinary cell and not scored.
    """
    reference = check_cells(source)
    cells: list[Any] = []
    checks_at: dict[int, str] = {}
    for cell in submission.cells:
        if cell.cell_type != "code":
            continue
        grade_id = _grade_id(cell)
        if grade_id in reference and nbgrader_role(cell) == "check":
            if grade_id in checks_at.values():
                continue
            checks_at[len(cells)] = grade_id
            cell = nbformat.v4.new_code_cell(reference[grade_id].source)
        else:
            cell = nbformat.v4.new_code_cell(cell.source, metadata=dict(cell.metadata))
        cells.append(cell)
    return cells, checks_at


def kernel_environment() -> dict[str, str]:
    """The grading kernel's environment: small sizes, no GPU, the course importable."""
    env = dict(os.environ)
    env.update(
        {
            "COURSE_WORKLOAD": "small",
            "CUDA_VISIBLE_DEVICES": "",
            "COURSE_DEVICE": "cpu",
            "MPLBACKEND": "Agg",
            "PYTHONPATH": os.pathsep.join(
                [str(_COURSE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
    )
    return env


class _Kernel:
    """One kernel running cells for the grader; replaced when it hangs or dies."""

    def __init__(self, cwd: str, warm_up_s: float = WARM_UP_S) -> None:
        from nbclient import NotebookClient

        self._scratch = nbformat.v4.new_notebook()
        self._client = NotebookClient(
            self._scratch,
            kernel_name="python3",
            allow_errors=True,
            shutdown_kernel="immediate",
            record_timing=False,
            iopub_timeout=4,
        )
        self._cwd = cwd
        self._client.km = self._client.create_kernel_manager()
        # The kernel's own start-up warnings are noise here; cell output is captured.
        self._client.start_new_kernel(
            env=kernel_environment(), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._client.start_new_kernel_client()
        # Import torch and the checks before the first timed cell: a cell's time limit is
        # for the learner's code, not for the kernel's start-up.
        self.run(nbformat.v4.new_code_cell("import course_utils.classroom"), warm_up_s)

    def run(self, cell: Any, timeout_s: float) -> CellOutcome:
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        self._client.timeout = max(1, int(timeout_s))
        self._scratch.cells = [cell]
        start = time.perf_counter()
        try:
            self._client.execute_cell(cell, 0)
        except CellTimeoutError:
            return CellOutcome("timeout", seconds=time.perf_counter() - start)
        except DeadKernelError:
            return CellOutcome("dead", seconds=time.perf_counter() - start)
        seconds = time.perf_counter() - start
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                return CellOutcome("error", output.get("ename", ""), output.get("evalue", ""))
        return CellOutcome("ok", seconds=seconds)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the kernel may already be gone
            self._client._cleanup_kernel()


def run_cells(
    cells: list[Any], *, cell_timeout_s: float, total_timeout_s: float
) -> tuple[list[CellOutcome], list[str]]:
    """Run the cells in order in a fresh kernel; one outcome per cell, and notes.

    A cell that times out or kills the kernel gets that outcome; a new kernel then replays
    the cells that had succeeded and the run goes on. Cells left when the whole run's time
    is up are ``not-run``.
    """
    deadline = time.monotonic() + total_timeout_s
    outcomes: list[CellOutcome] = []
    notes: list[str] = []

    def remaining() -> float:
        return deadline - time.monotonic()

    with tempfile.TemporaryDirectory(prefix="course-grade-") as cwd:
        kernel: _Kernel | None = _Kernel(cwd, min(WARM_UP_S, total_timeout_s))
        try:
            for index, cell in enumerate(cells):
                if kernel is None or remaining() < 1:
                    outcomes.append(CellOutcome("not-run"))
                    continue
                outcome = kernel.run(cell, min(cell_timeout_s, remaining()))
                outcomes.append(outcome)
                if outcome.status in ("timeout", "dead"):
                    kernel.close()
                    kernel = None  # closed: not closed again if restoring fails
                    kernel = _restore(cells[:index], outcomes, cwd, remaining, cell_timeout_s)
                    what = "timed out" if outcome.status == "timeout" else "killed the kernel"
                    then = (
                        "a fresh kernel replayed the cells that had run without error"
                        if kernel
                        else "the kernel could not be restored: later cells did not run"
                    )
                    notes.append(f"code cell {index + 1} {what}; {then}")
        finally:
            if kernel is not None:
                kernel.close()
    if any(outcome.status == "not-run" for outcome in outcomes) and remaining() < 1:
        notes.append(f"the whole run's time limit ({total_timeout_s:g} s) was reached")
    return outcomes, notes


def _restore(
    done: list[Any],
    outcomes: list[CellOutcome],
    cwd: str,
    remaining: Any,
    cell_timeout_s: float,
) -> _Kernel | None:
    """A fresh kernel in the state the cells that succeeded left, or None if that fails."""
    if remaining() < 1:
        return None
    kernel = _Kernel(cwd, min(WARM_UP_S, remaining()))
    for cell, outcome in zip(done, outcomes, strict=False):
        if outcome.status != "ok":
            continue
        # A replayed cell gets more than its first run took: a fresh kernel is slower.
        limit = min(max(cell_timeout_s, 2 * outcome.seconds + 5), remaining())
        if limit < 1 or kernel.run(cell, limit).status in ("timeout", "dead"):
            kernel.close()
            return None
    return kernel


def _reason(outcome: CellOutcome, cell_timeout_s: float) -> str:
    if outcome.status == "timeout":
        return f"timed out (each cell may run {cell_timeout_s:g} s; the whole run has a limit)"
    if outcome.status == "dead":
        return "kernel died: the code before or in this check ended the Python process"
    if outcome.status == "not-run":
        return "not run: the time limit was reached or the kernel could not be restored"
    if outcome.ename == "CheckFailed":
        return outcome.evalue
    if outcome.ename == "NotImplementedError":
        return "not answered yet: the solution still raises NotImplementedError"
    if outcome.ename == "AssertionError":
        return outcome.evalue or "an assert in the check failed"
    return f"{outcome.ename}: {outcome.evalue}".strip(": ") or "the check raised an error"


def _solution_before(
    cells: list[Any], outcomes: list[CellOutcome], checks_at: dict[int, str], grade_id: str
) -> CellOutcome | None:
    """The outcome of the last solution cell before a check cell, if any."""
    position = next(index for index, found in checks_at.items() if found == grade_id)
    for index in range(position - 1, -1, -1):
        if nbgrader_role(cells[index]) == "solution":
            return outcomes[index]
    return None


def _what(outcome: CellOutcome) -> str:
    if outcome.status == "error":
        return f"{outcome.ename}: {outcome.evalue}".strip(": ")
    return {"timeout": "it timed out", "dead": "it killed the kernel"}.get(
        outcome.status, "it did not run"
    )


def grade_notebook(
    submission: Path,
    source: Path | None = None,
    *,
    cell_timeout_s: float = CELL_TIMEOUT_S,
    total_timeout_s: float = TOTAL_TIMEOUT_S,
) -> GradeReport:
    """Grade ``submission`` against the checks of ``source`` (default: the instructor's
    notebook of the same name in the course's ``notebooks/`` folder)."""
    source = source or _COURSE_ROOT / "notebooks" / submission.name
    if not source.is_file():
        raise FileNotFoundError(f"no instructor notebook {source}: pass --source")
    try:
        learner = nbformat.read(submission, as_version=4)
    except (ValueError, KeyError, TypeError) as error:  # not JSON, not a notebook
        raise ValueError(f"{submission} is not a readable notebook ({error})") from error
    reference = nbformat.read(source, as_version=4)
    expected = check_cells(reference)
    if not expected:
        raise ValueError(f"{source} has no check cells (nbgrader grade: true)")
    cells, checks_at = assemble(learner, reference)
    start = time.perf_counter()
    outcomes, notes = run_cells(
        cells, cell_timeout_s=cell_timeout_s, total_timeout_s=total_timeout_s
    )
    seconds = time.perf_counter() - start
    found = {grade_id: outcomes[index] for index, grade_id in checks_at.items()}
    results = []
    for grade_id, cell in expected.items():
        max_points = float(cell.metadata["nbgrader"].get("points", 0) or 0)
        outcome = found.get(grade_id)
        if outcome is None:
            results.append(
                CheckResult(
                    grade_id, 0.0, max_points, False, "cell missing: deleted from the submission"
                )
            )
        elif outcome.status == "ok":
            results.append(CheckResult(grade_id, max_points, max_points, True, ""))
        else:
            reason = _reason(outcome, cell_timeout_s)
            solution = _solution_before(cells, outcomes, checks_at, grade_id)
            if solution is not None and solution.status != "ok":
                reason += f" (your solution cell above failed first: {_what(solution)})"
            results.append(CheckResult(grade_id, 0.0, max_points, False, reason))
    return GradeReport(str(submission), str(source), results, seconds, notes)


def main_grade(
    submission: Path,
    source: Path | None,
    *,
    as_json: bool,
    cell_timeout_s: float,
    total_timeout_s: float,
) -> int:
    """The ``grade`` command: print the scores (a table, or JSON); 0 once a score exists."""
    import json

    report = grade_notebook(
        submission, source, cell_timeout_s=cell_timeout_s, total_timeout_s=total_timeout_s
    )
    text = json.dumps(report.to_dict(), indent=2) if as_json else report.format()
    sys.stdout.write(text + "\n")
    return 0
