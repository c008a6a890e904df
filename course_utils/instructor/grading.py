"""Grade one submitted notebook against the instructor's checks (nbgrader ``grade: true``
cells, hidden checks included; a deleted check scores 0; cells that lost their
``grade_id`` are found by content, :mod:`course_utils.instructor.matching`).

The learner's cells run in order in a fresh CPU kernel (``COURSE_WORKLOAD=small``) in a
scratch folder, sandboxed when bubblewrap works (:mod:`course_utils.instructor.sandbox`). A cell
past its limit or that kills the kernel gets a fresh kernel replaying the cells that had
succeeded; when the whole run's time is up, the checks not yet run score 0. The checks do
not run as cells: :mod:`course_utils.instructor.guard`, armed before any learner code, runs each one
out of reach of what the learner's cells changed, and sends its signed verdict back; a
check scores its ``points`` when that verdict says it ran to its end without an exception
and nothing it depends on was tampered with. Tampering is reported in
:attr:`GradeReport.tampering` (docs/instructor-guide.md, "Threat model").
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import json
import os
import re
import secrets
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client import AsyncKernelManager  # nbclient needs the async client
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from course_utils.instructor import guard as guards
from course_utils.instructor import sandbox as sandboxes
from course_utils.instructor.matching import Match, defined_names, grade_id, match_cells
from course_utils.instructor.student import InputError, nbgrader_role, read_notebook

CELL_TIMEOUT_S = 120  # seconds per cell
TOTAL_TIMEOUT_S = 900  # seconds for the whole run
#: Seconds a fresh kernel may take to import torch and the checks (not counted per cell).
WARM_UP_S = 120
#: Changes whenever the same submission could score differently (class runs regrade).
GRADER_VERSION = "3"
FEEDBACK_OUTPUT_CHARS = 20_000  # characters of one output kept in a feedback notebook

_COURSE_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CellOutcome:
    """What happened when one cell ran: ``ok``, ``error``, ``timeout``, ``dead`` or
    ``not-run``; for an error, the exception's name and message."""

    status: str
    ename: str = ""
    evalue: str = ""
    seconds: float = 0.0
    #: For a check: what its guard found tampered with (the check then scores 0).
    tampering: list[str] = field(default_factory=list)


@dataclass
class CheckResult:
    """The score of one check cell."""

    grade_id: str
    points: float
    max_points: float
    passed: bool
    reason: str
    #: How the check cell was found when its grade_id was missing ("" when it was not).
    matched: str = ""

    @property
    def points_text(self) -> str:
        return f"{self.points:g}/{self.max_points:g}"

    @property
    def result(self) -> str:
        return "passed" if self.passed else f"failed: {self.reason}"


@dataclass
class GradeReport:
    """The scores of one submission."""

    submission: str
    source: str
    checks: list[CheckResult]
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: "bwrap" or "none"
    sandbox: str = "none"
    #: Exercise cells found by content, not by grade_id: "grade_id: cell N, how".
    matched: list[str] = field(default_factory=list)
    #: What the submission's code changed to score without solving (empty: nothing seen).
    tampering: list[str] = field(default_factory=list)
    score: float = field(init=False)
    max_score: float = field(init=False)

    def __post_init__(self) -> None:
        self.score = sum(check.points for check in self.checks)
        self.max_score = sum(check.max_points for check in self.checks)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GradeReport:
        """The report ``dataclasses.asdict`` made."""
        kept = {k: v for k, v in data.items() if k not in ("score", "max_score")}
        return cls(**{**kept, "checks": [CheckResult(**check) for check in data["checks"]]})

    def format(self) -> str:
        """A table: one line per check, then the total."""
        width = max([len(check.grade_id) for check in self.checks] + [len("total")])
        lines = [f"Grading {self.submission} (checks from {self.source})"]
        for check in self.checks:
            lines.append(f"  {check.grade_id:<{width}}  {check.points_text}  {check.result}")
        total = f"{self.score:g}/{self.max_score:g}  ({self.seconds:.1f} s)"
        lines.append(f"  {'total':<{width}}  {total}")
        lines += [f"  found without grade_id: {match}" for match in self.matched]
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"  TAMPERING: {what}" for what in self.tampering]
        if self.sandbox == "none":
            lines.append("  note: the submission ran unsandboxed")
        return "\n".join(lines)


def check_cells(notebook: Any) -> dict[str, Any]:
    """The check cells (nbgrader ``grade: true``) of a notebook, by ``grade_id``, in order."""
    checks: dict[str, Any] = {}
    for cell in notebook.cells:
        found = grade_id(cell)
        if cell.cell_type == "code" and nbgrader_role(cell) == "check" and found:
            checks.setdefault(found, cell)
    return checks


def _assemble(
    submission: Any, source: Any, matches: dict[str, Match]
) -> tuple[list[Any], dict[int, str], list[int]]:
    """The code cells to run: the submission's, each matched check replaced by the
    source's; the grade_id of the check at each position; and each cell's index in the
    submission. A second cell claiming a check's grade_id is left out; a check the source
    does not have runs as an ordinary cell, unscored."""
    reference = {grade_id(cell): cell for cell in source.cells if grade_id(cell)}
    at = {match.index: match for match in matches.values()}
    checks = set(check_cells(source))
    cells: list[Any] = []
    checks_at: dict[int, str] = {}
    origin: list[int] = []
    for index, cell in enumerate(submission.cells):
        if cell.cell_type != "code":
            continue
        match = at.get(index)
        if match is None and grade_id(cell) in checks and nbgrader_role(cell) == "check":
            continue  # a second cell claiming a check's grade_id
        if match is not None and match.role == "check":
            checks_at[len(cells)] = match.grade_id
            cell = nbformat.v4.new_code_cell(reference[match.grade_id].source)
            cell.metadata[_GUARDED] = match.grade_id  # run by the kernel's guard
        else:
            metadata = dict(cell.metadata)
            if match is not None:  # a solution found by content is a solution again
                metadata["nbgrader"] = dict(reference[match.grade_id].metadata["nbgrader"])
            cell = nbformat.v4.new_code_cell(cell.source, metadata=metadata)
        cells.append(cell)
        origin.append(index)
    return cells, checks_at, origin


_GUARDED = "course_guard"
_MAGIC = re.compile(r"^\s*[%!].*$", re.MULTILINE)


def _tree(source: str) -> ast.Module | None:
    """A cell's syntax tree, its IPython magics left out; None for a cell magic or bad syntax."""
    if source.lstrip().startswith("%%"):
        return None
    try:
        return ast.parse(_MAGIC.sub("", source))
    except SyntaxError:
        return None


def _imports(tree: ast.Module) -> dict[str, tuple[str, str | None]]:
    """Names a cell's top-level imports bind: name -> (module, attribute or None)."""
    bound: dict[str, tuple[str, str | None]] = {}
    statements = list(tree.body)
    while statements:
        node = statements.pop(0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = (alias.name, None)
                else:
                    bound[alias.name.split(".")[0]] = (alias.name.split(".")[0], None)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            bound.update({(a.asname or a.name): (node.module, a.name) for a in node.names})
        elif isinstance(node, ast.If | ast.Try | ast.With):
            statements += [
                *node.body,
                *getattr(node, "orelse", []),
                *getattr(node, "finalbody", []),
            ]
            statements += [s for handler in getattr(node, "handlers", []) for s in handler.body]
    return bound


def guard_spec(reference: Any) -> dict[str, Any]:
    """What the kernel's guard needs (:func:`~course_utils.instructor.guard.arm`): each
    check's source, the names it reads that the instructor's imports bind (``pinned``: they
    must still refer to those objects) or that are Python's built-ins, and the modules to record.
    A name a solution cell defines, or that the instructor's cells bind more than once or
    otherwise, is the learner's to bind: it is not pinned."""
    imports: dict[str, set[tuple[str, str | None]]] = {}
    bound: dict[str, int] = {}
    learners: set[str] = set()
    checks: dict[str, Any] = check_cells(reference)
    for cell in reference.cells:
        if cell.cell_type != "code":
            continue
        if nbgrader_role(cell) == "solution":
            learners |= defined_names(cell.source)
            continue
        tree = _tree(cell.source)
        if tree is None:
            continue
        for name, target in _imports(tree).items():
            imports.setdefault(name, set()).add(target)
        for name in defined_names(cell.source, imports=False):
            bound[name] = bound.get(name, 0) + 2  # bound otherwise than by an import
    pinned = {
        name: next(iter(targets))
        for name, targets in imports.items()
        if len(targets) == 1 and name not in bound and name not in learners
    }
    spec: dict[str, Any] = {}
    for gid, cell in checks.items():
        tree = _tree(cell.source)
        reads: set[str] = set()
        own = defined_names(cell.source)
        if tree is not None:
            for node in ast.walk(tree):
                if isinstance(node, ast.Name):
                    (reads if isinstance(node.ctx, ast.Load) else own).add(node.id)
        free = reads - own - learners
        spec[gid] = {
            "source": cell.source,
            "pinned": {name: pinned[name] for name in sorted(free & set(pinned))},
            "builtins": sorted(n for n in free - set(imports) - set(bound) if hasattr(builtins, n)),
        }
    modules = sorted({module for targets in imports.values() for module, _ in targets})
    return {"checks": spec, "modules": modules}


@dataclass(frozen=True)
class KernelSettings:
    """Where and how grading kernels run: the sandbox (None: none) and CPU threads."""

    sandbox: sandboxes.Sandbox | None = None
    threads: int | None = None


def _kernel_environment(cwd: Path, settings: KernelSettings) -> dict[str, str]:
    """Small sizes, no GPU, the kernel's share of the CPU threads, the course importable;
    in a sandbox, nothing else (none of the grader's variables)."""
    env = {"COURSE_WORKLOAD": "small", "CUDA_VISIBLE_DEVICES": "", "COURSE_DEVICE": "cpu"}
    env["MPLBACKEND"] = "Agg"
    if settings.threads:
        env.update(OMP_NUM_THREADS=str(settings.threads), MKL_NUM_THREADS=str(settings.threads))
    if settings.sandbox is not None:
        return settings.sandbox.environment(cwd, env)
    path = [str(_COURSE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, **env, "PYTHONPATH": os.pathsep.join(path)}


def _kernel_manager(cwd: Path, sandbox: sandboxes.Sandbox | None, files: tuple[Path, ...]) -> Any:
    """A kernel manager; with a sandbox, one that starts the kernel inside bubblewrap and
    talks to it through Unix sockets in the scratch folder (the kernel has no network);
    ``files``: what else the kernel must open (the guard's instructions and pipe)."""
    if sandbox is None:
        return AsyncKernelManager(kernel_name="python3")

    class SandboxedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            command: list[str] = super().format_kernel_cmd(extra_arguments)
            assert sandbox is not None
            sandbox.prepare(cwd, Path(self.connection_file), *files)
            return sandbox.command(command, cwd)

    return SandboxedKernelManager(
        kernel_name="python3",
        transport="ipc",
        ip=str(cwd / f".kernel{time.monotonic_ns() % 10**6}"),
        connection_file=str(cwd / ".kernel.json"),
    )


class _Channel:
    """The read end of the pipe the kernel's guard writes its signed messages to."""

    def __init__(self, folder: Path, guard: dict[str, Any]) -> None:
        self.key = secrets.token_bytes(32)
        name = f".guard-{secrets.token_hex(8)}"
        self.pipe, self.instructions = folder / f"{name}.pipe", folder / f"{name}.json"
        os.mkfifo(self.pipe, 0o600)
        self.fd = os.open(self.pipe, os.O_RDONLY | os.O_NONBLOCK)
        spec = {**guard, "key": self.key.hex(), "channel": str(self.pipe)}
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        with os.fdopen(os.open(self.instructions, flags, 0o600), "w", encoding="utf-8") as file:
            json.dump(spec, file)  # hidden checks and the key: readable by the kernel only
        self._pending = b""
        self.armed = self.closed = False
        self.results: dict[str, dict[str, Any]] = {}
        self.flags: list[str] = []

    def read(self) -> None:
        """Take in what the guard wrote since the last read."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                self.closed = self.armed  # no writer left: the kernel died, or its code
                break
            self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            message = guards.read_signed(self.key, line.decode(errors="replace"))
            if message is None:
                self._flag("the notebook's code wrote forged messages to the grader's channel")
            elif message.get("kind") == "armed":
                self.armed = True
            elif message.get("kind") == "result":
                self.results[str(message.get("nonce"))] = message
            elif message.get("kind") == "flag":
                self._flag(str(message.get("what")))

    def _flag(self, what: str) -> None:
        if what not in self.flags:
            self.flags.append(what)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        for path in (self.pipe, self.instructions):
            path.unlink(missing_ok=True)


class _Kernel:
    """One kernel running cells for the grader, its guard armed; replaced when it hangs or
    dies."""

    def __init__(
        self, cwd: str, warm_up_s: float, settings: KernelSettings, guard: dict[str, Any]
    ) -> None:
        self._scratch = nbformat.v4.new_notebook()
        options: Any = dict(allow_errors=True, shutdown_kernel="immediate", record_timing=False)
        self._client = NotebookClient(
            self._scratch, kernel_name="python3", iopub_timeout=4, **options
        )
        sandbox = settings.sandbox
        self.channel = _Channel(Path(cwd), guard)
        files = (self.channel.pipe, self.channel.instructions)
        self._client.km = _kernel_manager(Path(cwd), sandbox, files)
        env = _kernel_environment(Path(cwd), settings)
        # The kernel's own start-up warnings are noise here; cell output is captured.
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self._client.start_new_kernel(env=env, cwd=cwd, **quiet)
        try:
            self._client.start_new_kernel_client()
        except RuntimeError as error:
            self.close()
            where = " in its sandbox (--sandbox none tells whether the sandbox is why)"
            raise RuntimeError(
                f"the grading kernel did not start{where if sandbox else ''}: {error}"
            ) from error
        # Import torch and the checks, and arm the guard, before the first timed cell: a
        # cell's time limit is for the learner's code, not for the kernel's start-up.
        arm = (
            "import course_utils.classroom, course_utils.instructor.guard\n"
            f"course_utils.instructor.guard.arm({str(self.channel.instructions)!r})"
        )
        outcome = self._execute(nbformat.v4.new_code_cell(arm), warm_up_s, store_history=False)
        self.channel.read()
        if not self.channel.armed:
            self.close()
            why = f"{outcome.ename}: {outcome.evalue}" if outcome.ename else outcome.status
            raise RuntimeError(f"the grader's guard did not start in the kernel ({why})")

    def run(self, cell: Any, timeout_s: float) -> CellOutcome:
        """Run a cell; a check cell (marked by :func:`_assemble`) runs through the guard."""
        gid = cell.metadata.get(_GUARDED)
        if gid is None:
            outcome = self._execute(cell, timeout_s)
            self._read(outcome)
            return outcome
        nonce = secrets.token_hex(8)
        trigger = f"__import__('sys').audit({guards.EVENT!r}, 'check', {gid!r}, {nonce!r})"
        outcome = self._execute(nbformat.v4.new_code_cell(trigger), timeout_s)
        self._read(outcome)
        if outcome.status in ("timeout", "dead"):
            return outcome
        result = self.channel.results.pop(nonce, None)
        if result is None:
            what = "the check did not run as sent: the notebook's code changed how cells run"
            return replace(outcome, status="error", ename="GuardMissing", tampering=[what])
        if result.get("tampering"):
            problems = [str(problem) for problem in result["tampering"]]
            return replace(outcome, status="error", ename="Tampering", tampering=problems)
        if result.get("ename"):
            return replace(outcome, status="error", ename=result["ename"], evalue=result["evalue"])
        return replace(outcome, status="ok", ename="", evalue="")

    def _read(self, outcome: CellOutcome) -> None:
        self.channel.read()
        if self.channel.closed and outcome.status == "ok":  # the kernel lives on
            self.channel._flag("the notebook's code closed the grader's channel to its guard")

    def _execute(self, cell: Any, timeout_s: float, store_history: bool = True) -> CellOutcome:
        self._client.timeout = max(1, int(timeout_s))
        self._scratch.cells = [cell]
        start = time.perf_counter()
        try:
            self._client.execute_cell(cell, 0, store_history=store_history)
        except (CellTimeoutError, DeadKernelError) as error:
            status = "timeout" if isinstance(error, CellTimeoutError) else "dead"
            return CellOutcome(status, seconds=time.perf_counter() - start)
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                return CellOutcome("error", output.get("ename", ""), output.get("evalue", ""))
        return CellOutcome("ok", seconds=time.perf_counter() - start)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the kernel may already be gone
            self._client._cleanup_kernel()
        self.channel.close()


def run_cells(
    cells: list[Any],
    *,
    cell_timeout_s: float,
    total_timeout_s: float,
    settings: KernelSettings = KernelSettings(),
    guard: dict[str, Any] | None = None,
) -> tuple[list[CellOutcome], list[str], list[str]]:
    """Run the cells in order in a fresh kernel in a scratch folder; one outcome per cell,
    notes, and the tampering the kernel's guard saw outside the checks (``guard``: what
    :func:`guard_spec` says; check cells are marked by :func:`_assemble`). After a timeout
    or a dead kernel, a new kernel replays the cells that had succeeded; cells left when the
    whole run's time is up are ``not-run``."""
    deadline = time.monotonic() + total_timeout_s
    outcomes: list[CellOutcome] = []
    notes: list[str] = []
    flags: list[str] = []
    guard = guard or {}

    def start(warm_up_s: float) -> _Kernel:
        return _Kernel(cwd, warm_up_s, settings, guard)

    def close(kernel: _Kernel) -> None:
        kernel.close()
        flags.extend(flag for flag in kernel.channel.flags if flag not in flags)

    def remaining() -> float:
        return deadline - time.monotonic()

    def restore(done: list[Any]) -> _Kernel | None:
        """A fresh kernel in the state the cells that succeeded left, or None."""
        if remaining() < 1:
            return None
        try:
            kernel = start(min(WARM_UP_S, remaining()))
        except RuntimeError:
            return None
        for cell, outcome in zip(done, outcomes, strict=False):
            # A replayed cell gets more than its first run took: a fresh kernel is slower.
            limit = min(max(cell_timeout_s, 2 * outcome.seconds + 5), remaining())
            if outcome.status == "ok" and (
                limit < 1 or kernel.run(copy.deepcopy(cell), limit).status in ("timeout", "dead")
            ):
                close(kernel)
                return None
        return kernel

    with tempfile.TemporaryDirectory(prefix="course-grade-", ignore_cleanup_errors=True) as cwd:
        kernel: _Kernel | None = start(min(WARM_UP_S, total_timeout_s))
        try:
            for index, cell in enumerate(cells):
                if kernel is None or remaining() < 1:
                    outcomes.append(CellOutcome("not-run"))
                    continue
                outcome = kernel.run(cell, min(cell_timeout_s, remaining()))
                outcomes.append(outcome)
                if outcome.status in ("timeout", "dead"):
                    close(kernel)
                    kernel = None  # closed: not closed again if restoring fails
                    kernel = restore(cells[:index])
                    what = "timed out" if outcome.status == "timeout" else "killed the kernel"
                    then = "a fresh kernel replayed the cells that had run without error"
                    if kernel is None:
                        then = "the kernel could not be restored: later cells did not run"
                    notes.append(f"code cell {index + 1} {what}; {then}")
        finally:
            if kernel is not None:
                close(kernel)
    if any(outcome.status == "not-run" for outcome in outcomes) and remaining() < 1:
        notes.append(f"the whole run's time limit ({total_timeout_s:g} s) was reached")
    return outcomes, notes, flags


def _reason(outcome: CellOutcome, cell_timeout_s: float) -> str:
    error = f"{outcome.ename}: {outcome.evalue}".strip(": ")
    return {
        "timeout": f"timed out (each cell may run {cell_timeout_s:g} s; the whole run has a limit)",
        "dead": "kernel died: the code before or in this check ended the Python process",
        "not-run": "not run: the time limit was reached or the kernel could not be restored",
    }.get(outcome.status) or {
        "CheckFailed": outcome.evalue,
        "Tampering": "scored 0, tampering: " + "; ".join(outcome.tampering),
        "GuardMissing": "scored 0: " + "; ".join(outcome.tampering),
        "NotImplementedError": "not answered yet: the solution still raises NotImplementedError",
        "AssertionError": outcome.evalue or "an assert in the check failed",
    }.get(outcome.ename, error or "the check raised an error")


def _solution_failure(cells: list[Any], outcomes: list[CellOutcome], position: int) -> str:
    """How the last solution cell before the check cell at ``position`` failed, or ""."""
    solutions = [i for i in range(position) if nbgrader_role(cells[i]) == "solution"]
    outcome = outcomes[solutions[-1]] if solutions else CellOutcome("ok")
    if outcome.status == "ok":
        return ""
    error = f"{outcome.ename}: {outcome.evalue}".strip(": ")
    what = {"error": error, "timeout": "it timed out", "dead": "it killed the kernel"}
    return f" (your solution cell above failed first: {what.get(outcome.status, 'it did not run')})"


def grade_submission(
    submission: Path,
    source: Path,
    *,
    cell_timeout_s: float = CELL_TIMEOUT_S,
    total_timeout_s: float = TOTAL_TIMEOUT_S,
    settings: KernelSettings = KernelSettings(),
) -> tuple[GradeReport, Any]:
    """Grade a submission; return the report and the feedback notebook (the learner's,
    with the run's outputs and each check's result). :class:`InputError`: a file that is
    not a notebook, or an instructor notebook without checks."""
    learner = read_notebook(submission)
    if not source.is_file():
        raise InputError(f"no instructor notebook {source}: pass --source")
    reference = read_notebook(source)
    expected = check_cells(reference)
    if not expected:
        raise InputError(f"{source} has no check cells (nbgrader grade: true)")
    matches = match_cells(learner, reference)
    cells, checks_at, origin = _assemble(learner, reference, matches)
    start = time.perf_counter()
    outcomes, notes, tampering = run_cells(
        cells,
        cell_timeout_s=cell_timeout_s,
        total_timeout_s=total_timeout_s,
        settings=settings,
        guard=guard_spec(reference),
    )
    seconds = round(time.perf_counter() - start, 2)
    position = {gid: index for index, gid in checks_at.items()}
    results = []
    for gid, cell in expected.items():
        most = float(cell.metadata["nbgrader"].get("points", 0) or 0)
        how = matches[gid].how if gid in matches else ""
        if gid not in position:
            reason = (
                "cell missing: deleted from the submission (no cell has its grade_id or is like it)"
            )
            results.append(CheckResult(gid, 0.0, most, False, reason))
        elif outcomes[position[gid]].status == "ok":
            results.append(CheckResult(gid, most, most, True, "", how))
        else:
            reason = _reason(outcomes[position[gid]], cell_timeout_s)
            reason += _solution_failure(cells, outcomes, position[gid])
            results.append(CheckResult(gid, 0.0, most, False, reason, how))
    matched = [
        f"{match.grade_id}: cell {match.index + 1}, {match.how}"
        for match in sorted(matches.values(), key=lambda m: m.index)
        if match.how  # found by content
    ]
    for cell in reference.cells:
        solution_id = grade_id(cell)
        if nbgrader_role(cell) == "solution" and solution_id and solution_id not in matches:
            notes.append(f"solution cell {solution_id} not found (no grade_id, no cell like it)")
    for index, gid in checks_at.items():
        tampering += [f"{gid}: {what}" for what in outcomes[index].tampering]
    tampering = list(dict.fromkeys(tampering))
    sandbox = "bwrap" if settings.sandbox else "none"
    report = GradeReport(
        str(submission), str(source), results, seconds, notes, sandbox, matched, tampering
    )
    return report, _feedback(learner, cells, origin, checks_at, report)


def feedback_summary(report: GradeReport, headline: str | None = None) -> str:
    """The summary at the top of a feedback notebook: the grade (or ``headline``), a table
    of the checks, then notes."""
    summary = [headline or f"**Grade: {report.score:g}/{report.max_score:g}**", ""]
    summary += ["| check | points | result |", "|---|---|---|"]
    for check in report.checks:
        result = check.result.replace("|", "\\|")
        summary.append(f"| {check.grade_id} | {check.points_text} | {result} |")
    summary += ["", *[f"- found without its grade_id: {match}" for match in report.matched]]
    summary += [f"- note: {note}" for note in report.notes]
    summary += [f"- tampering (reported to your instructor): {what}" for what in report.tampering]
    return "\n".join(summary).strip()


def _feedback(
    learner: Any, cells: list[Any], origin: list[int], checks_at: dict[int, str], report: Any
) -> Any:
    """The learner's notebook, graded: outputs of the run, each check's result in its
    check cell (never the instructor's hidden code), and a summary at the top."""
    notebook = copy.deepcopy(learner)
    position = {index: at for at, index in enumerate(origin)}
    results = {check.grade_id: check for check in report.checks}
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        cell.execution_count = None
        at = position.get(index)
        if at is not None and at not in checks_at:
            cell.outputs = copy.deepcopy(cells[at].get("outputs", []))
            for output in cell.outputs:  # long texts cut to FEEDBACK_OUTPUT_CHARS
                text, keep = output.get("text"), FEEDBACK_OUTPUT_CHARS
                if isinstance(text, str) and len(text) > keep:
                    output["text"] = text[:keep] + f"\n[... {len(text) - keep} characters cut]\n"
            continue
        text, name = "not run: another cell already claims this check's grade_id", "stderr"
        if at is not None:
            check = results[checks_at[at]]
            text = f"{check.grade_id}: {check.points_text} {check.result}"
            name = "stdout" if check.passed else "stderr"
        cell.outputs = [nbformat.v4.new_output("stream", name=name, text=text + "\n")]
    cell = nbformat.v4.new_markdown_cell(feedback_summary(report))
    if (notebook.get("nbformat"), notebook.get("nbformat_minor", 0)) < (4, 5):
        cell.pop("id", None)
    notebook.cells.insert(0, cell)
    return notebook
