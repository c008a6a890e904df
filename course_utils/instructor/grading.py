"""Grade one submitted notebook against the instructor's checks (nbgrader ``grade: true``
cells, hidden checks included; a deleted check scores 0; cells that lost their
``grade_id`` are found by content, :mod:`course_utils.instructor.matching`).

The learner's cells run in order in a fresh CPU kernel (``COURSE_WORKLOAD=small``) in a
scratch folder, sandboxed when bubblewrap works (:mod:`course_utils.instructor.sandbox`). A cell
past its limit or that kills the kernel gets a fresh kernel replaying the cells that had
succeeded; when the whole run's time is up, the checks not yet run score 0. The checks do
not run as cells, nor in any process that runs learner code: the cells run again in the
judge (:mod:`course_utils.instructor.judge`, the learner's runtime, guarded), and each check
is decided by the checker (:mod:`course_utils.instructor.checker`) from plain data, evidence
observed with the answer included (:mod:`course_utils.checks`); a check scores its
``points`` when the checker's verdict says it ran to its end without an exception and
nothing it observed with was tampered with. Tampering is reported in
:attr:`GradeReport.tampering` (docs/instructor-guide.md, "Threat model").
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import dataclasses
import html
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import zmq
import zmq.asyncio
from jupyter_client import AsyncKernelManager  # nbclient needs the async client
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from course_utils.instructor import cgroups
from course_utils.instructor import checker as checkers
from course_utils.instructor import sandbox as sandboxes
from course_utils.instructor.matching import Match, defined_names, grade_id, match_cells
from course_utils.instructor.student import InputError, nbgrader_role, read_notebook
from course_utils.language import ENGLISH, LANGUAGE_VAR, LANGUAGES, Messages

CELL_TIMEOUT_S = 120  # seconds per cell
TOTAL_TIMEOUT_S = 900  # seconds for the whole run
#: Seconds of wall time a fresh kernel or judge may take to start and import torch and the
#: checks, before any learner code: not counted in any cell's or the run's limit. Generous:
#: on a busy machine a start can take minutes; a start past it leaves the submission
#: ungraded, with a note that the machine was too busy (:class:`MachineBusy`), never 0.
WARM_UP_S = 600
#: Changes whenever the same submission could score differently (class runs regrade).
GRADER_VERSION = "3"
FEEDBACK_OUTPUT_CHARS = 20_000  # characters of one output kept in a feedback notebook
#: The most of one cell's outputs the grading process keeps (characters); what is past
#: it is dropped as it arrives, and the cell gets a note.
CELL_OUTPUT_CHARS = 1 << 20
#: The largest message the grading process accepts from a learner's kernel: a larger one
#: (one print of 200 MiB) is dropped by ZeroMQ before it is read into memory.
KERNEL_MESSAGE_BYTES = 8 << 20
#: The most messages from a learner's kernel that wait, received, in the grading process
#: (ZeroMQ's receive high-water mark; its default is 1000). A cell that prints faster than
#: the grader reads (1 MiB pieces, a busy machine) would otherwise queue up to its whole
#: output here; past the mark ZeroMQ stops reading and the kernel's side drops messages.
KERNEL_QUEUED_MESSAGES = 8
#: What a feedback notebook keeps of a rich output: never HTML or script (inert pages).
_INERT_MIME = ("text/plain", "image/png", "image/jpeg")

_COURSE_ROOT = Path(__file__).resolve().parents[2]


class MachineBusy(RuntimeError):
    """A kernel or judge did not start in :data:`WARM_UP_S`, before any learner code ran:
    the grading machine's fault, not the submission's; it is left ungraded and said."""


def _busy(what: str, limit_s: float) -> MachineBusy:
    try:
        load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count() or 1} core(s)"
    except OSError:
        load = "load unknown"
    return MachineBusy(
        f"not graded: the machine was too busy ({load}): {what} did not start within "
        f"{limit_s:g} s, before any of the submission's code ran; grade it again"
    )


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
    #: For a failed check with separable parts: the share of its points earned
    #: (:func:`course_utils.checks.core.check_parts`).
    earned: float = 0.0


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
    dotted: set[str] = set()  # ``import a.b`` binds ``a``, and ``a.b`` must be imported too
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
        dotted |= {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
            if "." in alias.name
        }
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
    modules = sorted({module for targets in imports.values() for module, _ in targets} | dotted)
    return {"checks": spec, "modules": modules}


@dataclass(frozen=True)
class KernelSettings:
    """Where and how grading kernels run: the sandbox (None: none), CPU threads, and the
    language of the checks' feedback (the instructor's notebook's ``metadata.language``)."""

    sandbox: sandboxes.Sandbox | None = None
    threads: int | None = None
    language: str = ENGLISH


def _kernel_environment(work: Path, control: Path, settings: KernelSettings) -> dict[str, str]:
    """Small sizes, no GPU, the kernel's share of the CPU threads, the course importable;
    every start-up folder (IPython, Jupyter, matplotlib) fresh in ``control``, which the
    grader made for this process alone; in a sandbox, nothing else of the grader's."""
    env = {"COURSE_WORKLOAD": "small", "CUDA_VISIBLE_DEVICES": "", "COURSE_DEVICE": "cpu"}
    env["MPLBACKEND"] = "Agg"
    env[LANGUAGE_VAR] = settings.language
    if settings.threads:
        env.update(OMP_NUM_THREADS=str(settings.threads), MKL_NUM_THREADS=str(settings.threads))
    fresh = {
        "IPYTHONDIR": control / "ipython",
        "JUPYTER_CONFIG_DIR": control / "jupyter",
        "JUPYTER_DATA_DIR": control / "jupyter-data",
        "JUPYTER_RUNTIME_DIR": control / "jupyter-runtime",
        "MPLCONFIGDIR": control / "matplotlib",
    }
    env.update({name: str(path) for name, path in fresh.items()})
    env.update(JUPYTER_CONFIG_PATH="", JUPYTER_PATH="", PYTHONNOUSERSITE="1")
    env.update(JUPYTER_PLATFORM_DIRS="1", PYTHONSTARTUP="", HOME=str(work), TMPDIR=str(work))
    if settings.sandbox is not None:
        return {**settings.sandbox.environment(work, {}), **env}
    path = [str(_COURSE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, **env, "PYTHONPATH": os.pathsep.join(path)}


def _kernel_manager(control: Path, work: Path, sandbox: sandboxes.Sandbox | None) -> Any:
    """A kernel manager whose connection file and sockets are in ``control`` (fresh for
    this kernel, the grader's); with a sandbox, one that starts the kernel inside
    bubblewrap and talks to it through Unix sockets there (the kernel has no network)."""
    if sandbox is None:
        return AsyncKernelManager(
            kernel_name="python3", connection_file=str(control / "kernel.json")
        )

    class SandboxedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            command: list[str] = super().format_kernel_cmd(extra_arguments)
            assert sandbox is not None
            sandbox.prepare(control, Path(self.connection_file))
            return sandbox.command(command, work, control)

    return SandboxedKernelManager(
        kernel_name="python3",
        transport="ipc",
        ip=str(control / "kernel"),
        connection_file=str(control / "kernel.json"),
    )


def _control_folder(run: Path, kind: str) -> Path:
    """A fresh folder the grader owns, for one kernel or judge process's start-up."""
    folder = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=run))
    for name in ("ipython", "jupyter", "jupyter-data", "jupyter-runtime", "matplotlib"):
        (folder / name).mkdir()
    return folder


class _BoundedClient(NotebookClient):
    """nbclient's client, keeping at most :data:`CELL_OUTPUT_CHARS` of a cell's outputs:
    what comes past it is dropped as it arrives (``cut`` says so)."""

    kept = 0
    cut = False

    def output(
        self, outs: list[Any], msg: dict[str, Any], display_id: str | None, cell_index: int
    ) -> Any:
        content = msg.get("content", {})
        size = len(str(content.get("text", ""))) + sum(
            len(str(value)) for value in dict(content.get("data", {}) or {}).values()
        )
        if self.kept + size > CELL_OUTPUT_CHARS:
            self.cut = True
            return None
        self.kept += size
        return super().output(outs, msg, display_id, cell_index)


class _Kernel:
    """The learner's kernel: it runs the learner's cells for the feedback notebook's outputs
    (never a check, never the grader's key); replaced when it hangs or dies."""

    def __init__(self, run: Path, work: Path, warm_up_s: float, settings: KernelSettings) -> None:
        self._scratch = nbformat.v4.new_notebook()
        self.cut = False  # whether a cell's outputs were cut (its note is the caller's)
        options: Any = dict(allow_errors=True, shutdown_kernel="immediate", record_timing=False)
        self._client = _BoundedClient(
            self._scratch, kernel_name="python3", iopub_timeout=4, **options
        )
        self._client.startup_timeout = max(1, int(warm_up_s))  # nbclient's default: 60 s
        sandbox = settings.sandbox
        self.control = _control_folder(run, "kernel")
        self._client.km = _kernel_manager(self.control, work, sandbox)
        # The client's sockets refuse a message past the limit before it reaches memory.
        self._context = zmq.asyncio.Context()
        self._context.setsockopt(zmq.MAXMSGSIZE, KERNEL_MESSAGE_BYTES)
        self._context.setsockopt(zmq.RCVHWM, KERNEL_QUEUED_MESSAGES)
        make_client = self._client.km.client
        self._client.km.client = lambda **kw: make_client(context=self._context, **kw)  # type: ignore[method-assign]
        env = _kernel_environment(work, self.control, settings)
        # The kernel's own start-up warnings are noise here; cell output is captured.
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        # It starts in the grader's folder (nothing of the learner's on sys.path or read as
        # configuration), then moves to the learner's working folder.
        self._client.start_new_kernel(env=env, cwd=str(self.control), **quiet)
        try:
            self._client.start_new_kernel_client()
        except RuntimeError as error:
            self.close()
            if "Kernel didn't respond" in str(error) or "timed out" in str(error).lower():
                raise _busy("the grading kernel", warm_up_s) from error
            where = " in its sandbox (--sandbox none tells whether the sandbox is why)"
            raise RuntimeError(
                f"the grading kernel did not start{where if sandbox else ''}: {error}"
            ) from error
        setup = (
            f"import os as _os, sys as _sys\n_os.chdir({str(work)!r})\n"
            f"_sys.path[:] = [_p for _p in _sys.path if _p not in ('', {str(self.control)!r})]"
            "\n_sys.path.append('')\ndel _os, _sys"
        )
        # Import torch before the first timed cell: a cell's time limit is for the
        # learner's code, not for the kernel's start-up.
        outcome = self._execute(
            nbformat.v4.new_code_cell(setup + "\nimport torch"), warm_up_s, store_history=False
        )
        if outcome.status == "timeout":
            self.close()
            raise _busy("the grading kernel", warm_up_s)
        if outcome.status != "ok":
            self.close()
            raise RuntimeError(f"the grading kernel did not start ({outcome.status})")

    def run(self, cell: Any, timeout_s: float) -> CellOutcome:
        """Run a cell; a check cell (marked by :func:`_assemble`) is the judge's, not run."""
        if cell.metadata.get(_GUARDED) is not None:
            return CellOutcome("ok")
        return self._execute(cell, timeout_s)

    def _execute(self, cell: Any, timeout_s: float, store_history: bool = True) -> CellOutcome:
        self._client.timeout = max(1, int(timeout_s))
        self._scratch.cells = [cell]
        self._client.kept, self._client.cut = 0, False
        start = time.perf_counter()
        try:
            self._client.execute_cell(cell, 0, store_history=store_history)
        except (CellTimeoutError, DeadKernelError) as error:
            status = "timeout" if isinstance(error, CellTimeoutError) else "dead"
            return CellOutcome(status, seconds=time.perf_counter() - start)
        except Exception as error:  # replies the cell's code broke (a patched json.dumps)
            what = f"{type(error).__name__}: {error}"[:200]
            return CellOutcome("dead", "BrokenKernel", what, time.perf_counter() - start)
        if self._client.cut:
            self.cut = True
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                seconds = time.perf_counter() - start
                return CellOutcome("error", output.get("ename", ""), output.get("evalue", ""),
                                   seconds)  # fmt: skip
        return CellOutcome("ok", seconds=time.perf_counter() - start)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the kernel may already be gone
            self._client._cleanup_kernel()
        with contextlib.suppress(Exception):
            self._context.destroy(linger=0)
        shutil.rmtree(self.control, ignore_errors=True)


def run_cells(
    cells: list[Any],
    *,
    cell_timeout_s: float,
    total_timeout_s: float,
    settings: KernelSettings = KernelSettings(),
    guard: dict[str, Any] | None = None,
) -> tuple[list[CellOutcome], list[str], list[str]]:
    """Run the cells in order: the learner's in their kernel (for the feedback's outputs),
    then, in the judge (:mod:`course_utils.instructor.judge`), the learner's cells that did
    not hang or kill the kernel and, at their places, the checks (``guard``: what
    :func:`guard_spec` says; check cells are marked by :func:`_assemble`). One outcome per
    cell, notes, and flags (what the submission did to its kernel or the judge). After a
    timeout or a dead kernel, a new kernel replays the cells that had succeeded; cells left
    when the whole run's time is up are ``not-run``."""
    deadline = time.monotonic() + total_timeout_s + WARM_UP_S  # set again once warm
    outcomes: list[CellOutcome] = []
    notes: list[str] = []
    flags: list[str] = []
    guard = guard or {}

    def remaining() -> float:
        return deadline - time.monotonic()

    with tempfile.TemporaryDirectory(prefix="course-grade-", ignore_cleanup_errors=True) as folder:
        run = Path(folder)
        work = run / "work"  # the learner's working folder (in a sandbox: a capped tmpfs)
        work.mkdir()

        def start(warm_up_s: float) -> _Kernel:
            return _Kernel(run, work, warm_up_s, settings)

        def restore(done: list[Any]) -> _Kernel | None:
            """A fresh kernel in the state the cells that succeeded left, or None."""
            if remaining() < 1:
                return None
            try:
                kernel = start(WARM_UP_S)  # a start does not count in the run's time
            except RuntimeError:
                return None
            for cell, outcome in zip(done, outcomes, strict=False):
                # A replayed cell gets more than its first run took: a fresh kernel is slower.
                limit = min(max(cell_timeout_s, 2 * outcome.seconds + 5), remaining())
                if outcome.status == "ok" and (
                    limit < 1
                    or kernel.run(copy.deepcopy(cell), limit).status in ("timeout", "dead")
                ):
                    kernel.close()
                    return None
            return kernel

        try:
            kernel: _Kernel | None = start(WARM_UP_S)
        except BaseException:
            if settings.sandbox is not None:
                cgroups.collect_hits()  # the group made for the kernel that did not start
            raise
        deadline = time.monotonic() + total_timeout_s  # the learner's code's time
        try:
            for index, cell in enumerate(cells):
                if kernel is None or remaining() < 1:
                    outcomes.append(CellOutcome("not-run"))
                    continue
                outcome = kernel.run(cell, min(cell_timeout_s, remaining()))
                outcomes.append(outcome)
                if kernel.cut:
                    kernel.cut = False
                    notes.append(
                        f"code cell {index + 1} printed more than the grader keeps "
                        f"({CELL_OUTPUT_CHARS // 2**20} MiB of text in all, "
                        f"{KERNEL_MESSAGE_BYTES // 2**20} MiB at once): the rest was dropped"
                    )
                if outcome.status in ("timeout", "dead"):
                    kernel.close()
                    kernel = None  # closed: not closed again if restoring fails
                    kernel = restore(cells[:index])
                    what = "timed out" if outcome.status == "timeout" else "killed the kernel"
                    then = "a fresh kernel replayed the cells that had run without error"
                    if kernel is None:
                        then = "the kernel could not be restored: later cells did not run"
                    notes.append(f"code cell {index + 1} {what}; {then}")
                    if outcome.status == "dead":
                        flags.append(
                            f"code cell {index + 1} ended its kernel or broke its replies "
                            "(os._exit, a signal, a restart, a crash, a patched json)"
                        )
        finally:
            if kernel is not None:
                kernel.close()
        # Every process the kernels left is ended (and their limits read) before the judge
        # starts: a fork bomb's sleepers must not hold the judge's process limit.
        hits = cgroups.collect_hits() if settings.sandbox is not None else []
        try:
            verdicts, judged_flags, judged_notes = _judge(
                run, cells, outcomes, guard, settings, cell_timeout_s, total_timeout_s
            )
        finally:
            hits += [hit for hit in _limits_hit(outcomes, settings) if hit not in hits]
    for index, verdict in verdicts.items():
        outcomes[index] = verdict
    notes += [f"the submission hit a limit: {hit}" for hit in hits]
    flags += [flag for flag in judged_flags if flag not in flags]
    notes += judged_notes
    if any(outcome.status == "not-run" for outcome in outcomes) and remaining() < 1:
        notes.append(f"the whole run's time limit ({total_timeout_s:g} s) was reached")
    return outcomes, notes, flags


#: What an error says when a limit was hit: Python's own ``MemoryError`` by its exact name
#: (not ``torch.cuda.OutOfMemoryError``, which a lesson may raise on purpose), the others by
#: the system's message.
_MEMORY_ERROR = "it ran out of memory (the sandbox's memory limit)"
_LIMIT_SIGNS = {
    "No space left on device": "it filled its working folder (the sandbox's disk limit)",
    "File too large": "it wrote a file larger than the sandbox allows",
    "Resource temporarily unavailable": "it could not start a process or thread (the limit)",
}


def _limits_hit(outcomes: list[CellOutcome], settings: KernelSettings) -> list[str]:
    """The sandbox limits the submission ran into, from its cgroups and its errors."""
    found = cgroups.collect_hits() if settings.sandbox is not None else []
    for outcome in outcomes:
        if outcome.ename == "MemoryError" and _MEMORY_ERROR not in found:
            found.append(_MEMORY_ERROR)
        text = f"{outcome.ename}: {outcome.evalue}"
        found += [why for sign, why in _LIMIT_SIGNS.items() if sign in text and why not in found]
    return found


def _judge_command(control: Path, work: Path, settings: KernelSettings, fd: int) -> list[str]:
    argv = [sys.executable, "-I", "-c", _JUDGE_START, "--fd", str(fd)]
    if settings.sandbox is None:
        return argv
    return settings.sandbox.command(argv, work, control)


@contextlib.contextmanager
def _variable(name: str, value: str) -> Any:
    """The environment variable ``name`` set to ``value`` inside the block only (a process
    forked inside inherits it; the grader's own environment is left as it was)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _judge_settings(settings: KernelSettings) -> KernelSettings:
    """The judge's sandbox: the kernel's, under a user id of its own (as root), so that
    nothing the kernel left running counts against the judge's process limit."""
    if settings.sandbox is None:
        return settings
    return dataclasses.replace(settings, sandbox=dataclasses.replace(settings.sandbox, role=1))


#: ``python -I`` leaves out PYTHONPATH; the course's package is found where this one is.
_JUDGE_START = (
    f"import sys; sys.path.append({str(_COURSE_ROOT)!r}); "
    "from course_utils.instructor import judge; judge.run_judge(sys.argv[1:])"
)


def _judge(
    run: Path,
    cells: list[Any],
    outcomes: list[CellOutcome],
    guard: dict[str, Any],
    settings: KernelSettings,
    cell_timeout_s: float,
    total_timeout_s: float,
) -> tuple[dict[int, CellOutcome], list[str], list[str]]:
    """The checks' verdicts, from a fresh judge process: the cell index of each check and
    its outcome, flags, notes. A check whose checker's verdict did not arrive scores 0. The
    judge has its own time: ``total_timeout_s`` from when it is armed, and for each cell
    as long as the cell's run in the kernel was allowed (more for one that was slow there:
    a busy machine). :class:`MachineBusy` when the judge did not start."""
    checks = {i: cell.metadata[_GUARDED] for i, cell in enumerate(cells)
              if cell.metadata.get(_GUARDED) is not None}  # fmt: skip
    verdicts = {i: CellOutcome("not-run") for i in checks}
    if not checks or all(outcomes[index].status == "not-run" for index in checks):
        return verdicts, [], []
    program: list[dict[str, Any]] = []
    nonces: dict[str, int] = {}
    positions: list[int] = []
    limits: list[float] = []
    specs: dict[str, Any] = guard.get("checks", {})
    apart: list[dict[str, Any]] = []  # the checks the checker runs, in order: all of them
    for index, (cell, outcome) in enumerate(zip(cells, outcomes, strict=True)):
        if outcome.status == "not-run":  # the learner's run never got here: nor does the judge
            break
        if index in checks:
            nonce = secrets.token_hex(8)
            nonces[nonce] = index
            gid = checks[index]
            apart.append({**specs.get(gid, {"source": ""}), "grade_id": gid, "nonce": nonce})
            program.append({"kind": "apart", "grade_id": gid})
        elif outcome.status in ("ok", "error"):  # never a cell that hung or killed its kernel
            program.append({"kind": "code", "source": cell.source})
        else:
            continue
        positions.append(index)
        limits.append(max(cell_timeout_s, 2 * outcome.seconds + 5))
    # The learner's runtime gets what its guard needs to say what was tampered with at each
    # check's place (never a check's source: hidden tests stay in the checker).
    seen = {gid: {k: v for k, v in check.items() if k != "source"} for gid, check in specs.items()}
    spec = {**guard, "checks": seen, "cells": program}
    settings = _judge_settings(settings)
    control = _control_folder(run, "judge")
    work = run / "judge-work"
    work.mkdir(exist_ok=True)
    env = _kernel_environment(work, control, settings)
    read_end, write_end = checkers.pipe()
    requests_read, requests_write = checkers.pipe()  # the checker's requests to the runtime
    replies_read, replies_write = checkers.pipe()  # the runtime's replies
    if settings.sandbox is not None:
        settings.sandbox.prepare(control)
    flags: list[str] = []
    notes: list[str] = []
    checker_pid, verdicts_fd = -1, -1
    ends = [requests_read, requests_write, replies_read, replies_write]
    try:
        if apart:
            folder = tempfile.mkdtemp(prefix="checker-", dir=run)
            with _variable(LANGUAGE_VAR, settings.language):  # the checker is forked here
                checker_pid, verdicts_fd = checkers.start(
                    apart, list(guard.get("modules", [])), folder, settings.threads,
                    (requests_write, replies_read),
                    settings.sandbox.limits if settings.sandbox is not None else None,
                )  # fmt: skip
        os.close(requests_write)
        os.close(replies_read)
        ends = [requests_read, replies_write]
        command = _judge_command(control, work, settings, write_end)
        if apart:
            command += ["--requests", str(requests_read), "--replies", str(replies_write)]
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd=str(control), env=env, pass_fds=(write_end, requests_read, replies_write),
            start_new_session=True,
        )  # fmt: skip
    except BaseException:
        if checker_pid > 0:
            _end_checker(checker_pid, verdicts_fd)
        os.close(read_end)
        raise
    finally:
        for fd in (write_end, *ends):
            with contextlib.suppress(OSError):
                os.close(fd)
    try:
        assert process.stdin is not None
        with contextlib.suppress(OSError):
            process.stdin.write((json.dumps(spec) + "\n").encode())
            process.stdin.close()
        del spec
        apart_nonces = {check["nonce"] for check in apart}
        state = _read_judge(read_end, limits, total_timeout_s, verdicts_fd, apart_nonces)
    finally:
        os.close(read_end)
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if checker_pid > 0:
            _end_checker(checker_pid, verdicts_fd)
        shutil.rmtree(control, ignore_errors=True)
    for nonce, message in state.results.items():
        verdicts[nonces[nonce]] = _verdict(message)
    flags += state.flags
    unanswered = [check["grade_id"] for check in apart if check["nonce"] not in state.results]
    if state.done and unanswered and not state.timed_out:
        flags.append(
            "the grader's judge said it was done before the checks "
            f"{', '.join(unanswered[:5])} ran (a forged line): they score 0"
        )
    if not state.armed and state.timed_out:
        raise _busy("the grader's judge process", WARM_UP_S)
    if not state.armed:
        raise RuntimeError("the grader's judge process ended before it started grading")
    if not state.done:
        at = positions[state.at] if 0 <= state.at < len(positions) else -1
        why = "ran past its time limit" if state.timed_out else "ended the grader's judge process"
        where = f"code cell {at + 1}" if at >= 0 else "the submission"
        notes.append(f"in the grader's run, {where} {why}: the checks after it score 0")
        if not state.timed_out:
            flags.append(f"{where} ended the grader's judge process (it did not in the kernel)")
        for index in checks:
            if verdicts[index].status == "not-run" and at >= 0 and index >= at:
                verdicts[index] = CellOutcome("timeout" if state.timed_out else "dead")
    return verdicts, flags, notes


def _verdict(message: dict[str, Any]) -> CellOutcome:
    """A check's outcome from its trusted verdict (the checker's):
    ``ok`` only for an explicit ``completed`` with nothing tampered with; a failure's name
    only among :data:`~course_utils.instructor.checker.TRUSTED_NAMES` (else ``Error``)."""
    tampering = message.get("tampering")
    if type(tampering) is list and tampering:
        return CellOutcome("error", "Tampering", tampering=[str(t) for t in tampering])
    if message.get("status") == "completed" and not message.get("ename"):
        return CellOutcome("ok")
    ename = message.get("ename")
    known = type(ename) is str and (
        ename in checkers.TRUSTED_NAMES or checkers.builtin_error(getattr(builtins, ename, object))
    )
    ename = str(ename) if known else "Error"
    evalue = message.get("evalue")
    earned = message.get("earned", 0.0)
    share = earned if type(earned) is float and 0.0 < earned < 1.0 else 0.0
    return CellOutcome("error", ename, evalue if type(evalue) is str else "", earned=share)


def _end_checker(pid: int, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        os.close(fd)


@dataclass
class _JudgeState:
    armed: bool = False
    done: bool = False
    timed_out: bool = False
    at: int = -1
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)


#: Seconds the checker may take to close its pipe once the judge is done (its verdicts
#: were written before the judge went on).
_CHECKER_DRAIN_S = 10.0


def _read_checker(fd: int, pending: bytes, apart: set[str], state: _JudgeState) -> bytes | None:
    """Read the checker's verdicts' pipe (None: it ended)."""
    data = os.read(fd, 1 << 16)
    if not data:
        return None
    pending += data
    *lines, pending = pending.split(b"\n")
    for raw in lines:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        if type(message) is not dict:
            continue
        if message.get("kind") == "result" and str(message.get("nonce")) in apart:
            state.results[str(message["nonce"])] = message
        elif message.get("kind") == "flag" and str(message.get("what")) not in state.flags:
            state.flags.append(str(message.get("what")))
    return pending


def _read_judge(
    fd: int,
    limits: list[float],
    total_timeout_s: float,
    checker_fd: int = -1,
    apart: set[str] | None = None,
) -> _JudgeState:
    """Read the judge's pipe until it says it is done, it ends, or a cell (its limit:
    ``limits``), the start (:data:`WARM_UP_S`) or the whole run (``total_timeout_s`` from
    the start) runs past its limit; and the checker's (``checker_fd``), whose verdicts
    (for the checks' nonces ``apart``) are the only ones, until it ends. The judge's lines
    are advice on time and flags: learner code in the judge could write them too, so none
    of them gives a point, a cell's place only moves forward, and a line after ``done``
    is flagged as a forgery."""
    state = _JudgeState()
    apart = apart or set()
    pending, checked = b"", b""
    checker_open, judge_open = checker_fd >= 0, True
    limit = deadline = time.monotonic() + WARM_UP_S
    drain = 0.0
    while not state.done or checker_open or judge_open:
        if state.done:  # the checker's last lines, and any line the judge writes after
            drain = drain or time.monotonic() + _CHECKER_DRAIN_S
            wait = drain - time.monotonic()
            if wait <= 0:
                break
        else:
            wait = min(limit, deadline) - time.monotonic()
            if wait <= 0:
                state.timed_out = True
                break
        watched = [*([fd] if judge_open else []), *([checker_fd] if checker_open else [])]
        if not watched:
            break
        ready, _, _ = select.select(watched, [], [], wait)
        if checker_open and checker_fd in ready:
            left = _read_checker(checker_fd, checked, apart, state)
            checker_open, checked = left is not None, left or b""
        if fd not in ready:
            continue
        data = os.read(fd, 1 << 16)
        if not data:
            judge_open = False
            if not state.done:
                break  # the judge ended
            continue
        pending += data
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            message = _judge_line(raw)
            if message is None or state.done:
                what = "the notebook's code wrote forged messages to the grader's channel"
                if what not in state.flags:
                    state.flags.append(what)
            elif message.get("kind") == "at" and state.armed:
                with contextlib.suppress(ValueError):
                    at = int(str(message.get("cell")))
                    if at > state.at:  # a place only moves forward
                        state.at = at
                        cell_s = limits[state.at] if 0 <= state.at < len(limits) else 0
                        limit = time.monotonic() + cell_s
            elif message.get("kind") == "done" and state.armed:
                state.done = True
            elif message.get("kind") == "armed" and not state.armed:
                state.armed = True
                limit = deadline = time.monotonic() + total_timeout_s
            elif message.get("kind") == "flag" and str(message.get("what")) not in state.flags:
                state.flags.append(str(message.get("what"))[: checkers.MESSAGE_CHARS])
    return state


#: The judge's lines the grader reads (anything else on its pipe is a forgery).
_JUDGE_KINDS = frozenset({"armed", "at", "done", "flag"})


def _judge_line(raw: bytes) -> dict[str, Any] | None:
    """One line of the judge's as a message, or None when it is not one of its kinds."""
    try:
        message = json.loads(raw.decode(errors="replace"))
    except (ValueError, RecursionError):
        return None
    if type(message) is not dict or message.get("kind") not in _JUDGE_KINDS:
        return None
    return message


#: What the grader tells a learner about a check that did not pass (beside the check's own
#: message), in the notebook's language (course_utils.language).
MESSAGES_GRADING = Messages(
    "grading",
    {
        "timeout": "timed out (each cell may run {seconds:g} s; the whole run has a limit)",
        "dead": "kernel died: the code before or in this check ended the Python process",
        "not-run": "not run: the time limit was reached or the kernel could not be restored",
        "tampering": "scored 0, tampering: {what}",
        "guard missing": "scored 0: {what}",
        "not answered": "not answered yet: the solution still raises NotImplementedError",
        "assert": "an assert in the check failed",
        "name error": "NameError: {error}",
        # a failed check whose error the instructor's code did not raise (a learner's
        # exception, anything unknown): its text is never shown
        "generic": "the check raised an error (in your code or because of it)",
        "other error": "the check raised {name} (in your code or because of it)",
        "solution failed": "{reason} (your solution cell above failed first: {what})",
        "solution timed out": "it timed out",
        "solution killed": "it killed the kernel",
        "solution not run": "it did not run",
        "partial": "partial credit, {share:.0%} of the points: {reason}",
        "missing": "cell missing: deleted from the submission (no cell has its grade_id or is "
        "like it)",
    },
)


def _said(key: str, language: str, **fields: Any) -> str:
    """One of :data:`MESSAGES_GRADING` in ``language``, filled in."""
    return MESSAGES_GRADING.text(key, language).format(**fields)


def _reason(outcome: CellOutcome, cell_timeout_s: float, language: str = ENGLISH) -> str:
    def say(key: str, **fields: Any) -> str:
        return _said(key, language, **fields)

    if outcome.status in ("timeout", "dead", "not-run"):
        return say(outcome.status, seconds=cell_timeout_s)
    generic = say("generic")
    told = {  # the instructor's own messages (the checks'), else a fixed sentence
        "AnswerError": outcome.evalue or generic,
        "NeedsBeside": outcome.evalue or generic,
        "AssertionError": outcome.evalue or say("assert"),
        "CheckFailed": outcome.evalue or generic,
        "PartialCredit": outcome.evalue or generic,
    }
    if outcome.ename in told:
        return told[outcome.ename]
    if outcome.ename == "Tampering":
        return say("tampering", what="; ".join(outcome.tampering))
    if outcome.ename == "GuardMissing":
        return say("guard missing", what="; ".join(outcome.tampering))
    if outcome.ename == "NotImplementedError":
        return say("not answered")
    if outcome.ename == "NameError":
        return say("name error", error=outcome.evalue) if outcome.evalue else generic
    if outcome.ename in ("Error", "Stopped"):
        return generic
    return say("other error", name=outcome.ename)


def _solution_failure(
    cells: list[Any], outcomes: list[CellOutcome], position: int, reason: str, language: str
) -> str:
    """``reason``, with how the last solution cell before the check cell at ``position``
    failed where it did."""
    solutions = [i for i in range(position) if nbgrader_role(cells[i]) == "solution"]
    outcome = outcomes[solutions[-1]] if solutions else CellOutcome("ok")
    if outcome.status == "ok":
        return reason
    keys = {"timeout": "solution timed out", "dead": "solution killed"}
    what = f"{outcome.ename}: {outcome.evalue}".strip(": ")
    if outcome.status != "error":
        what = _said(keys.get(outcome.status, "solution not run"), language)
    return _said("solution failed", language, reason=reason, what=what)


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
    # the feedback's language: the instructor notebook's (translate build writes it), else
    # the one the learner's notebook says (only the wording of the feedback depends on it)
    language = reference.metadata.get("language") or learner.metadata.get("language")
    if isinstance(language, str) and language in LANGUAGES:
        settings = dataclasses.replace(settings, language=language)
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

    def say(key: str, **fields: Any) -> str:
        return _said(key, settings.language, **fields)

    results = []
    for gid, cell in expected.items():
        most = float(cell.metadata["nbgrader"].get("points", 0) or 0)
        how = matches[gid].how if gid in matches else ""
        if gid not in position:
            reason = say("missing")
            results.append(CheckResult(gid, 0.0, most, False, reason))
        elif outcomes[position[gid]].status == "ok":
            results.append(CheckResult(gid, most, most, True, "", how))
        else:
            outcome = outcomes[position[gid]]
            reason = _reason(outcome, cell_timeout_s, settings.language)
            reason = _solution_failure(cells, outcomes, position[gid], reason, settings.language)
            points = round(most * outcome.earned, 2)
            if points:
                reason = say("partial", share=outcome.earned, reason=reason)
            results.append(CheckResult(gid, points, most, False, reason, how))
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


def inert(text: str) -> str:
    """``text`` for Markdown that renders it as text, never as HTML or a table's cell end.

    >>> inert("<script>x</script> | a")
    '&lt;script&gt;x&lt;/script&gt; \\\\| a'
    """
    return html.escape(str(text), quote=False).replace("|", "\\|")


def feedback_summary(report: GradeReport, headline: str | None = None) -> str:
    """The summary at the top of a feedback notebook: the grade (or ``headline``), a table
    of the checks, then notes; every text in it is :func:`inert`."""
    summary = [headline or f"**Grade: {report.score:g}/{report.max_score:g}**", ""]
    summary += ["| check | points | result |", "|---|---|---|"]
    for check in report.checks:
        summary.append(f"| {inert(check.grade_id)} | {check.points_text} | {inert(check.result)} |")
    summary += ["", *[f"- found without its grade_id: {inert(m)}" for m in report.matched]]
    summary += [f"- note: {inert(note)}" for note in report.notes]
    summary += [f"- tampering (reported to your instructor): {inert(w)}" for w in report.tampering]
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
            for output in cell.outputs:  # rich outputs inert: no HTML, SVG or script
                data = output.get("data")
                if isinstance(data, dict):
                    for mime in [m for m in data if m not in _INERT_MIME]:
                        del data[mime]
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
