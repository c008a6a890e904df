"""Grade several submissions, in parallel, into a gradebook (``grade`` and ``grade-class``).

``grade-class`` grades each learner's notebooks (``LEARNER/*.ipynb``, nbgrader's
``submitted/STUDENT/ASSIGNMENT/`` or Canvas's download, :mod:`~course_utils.instructor.intake`)
against the instructor notebook it matches, each in its own process, into ``gradebook.csv``,
``checks.csv``, ``canvas.csv``, ``feedback/`` and ``results/``, with the instructor's
overrides and late penalties applied (:mod:`~course_utils.instructor.adjust`). A result is
kept while its key (a SHA-256 of submission, instructor notebook, grader version and the
options that can change a score) is unchanged. docs/instructor-guide.md has the rest.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import html
import io
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import forkserver, get_all_start_methods, get_context, resource_tracker
from pathlib import Path
from typing import Any, TextIO

from course_utils.instructor import cgroups, validation
from course_utils.instructor import sandbox as sandboxes
from course_utils.instructor.adjust import LatePolicy, adjust, late_text, read_overrides
from course_utils.instructor.canvas import (
    absent_students,
    check_roster,
    read_roster,
    write_canvas,
)
from course_utils.instructor.grading import (
    CELL_TIMEOUT_S,
    GRADER_VERSION,
    TOTAL_TIMEOUT_S,
    GradeReport,
    KernelSettings,
    MachineBusy,
    check_cells,
    feedback_summary,
    grade_submission,
    guard_spec,
)
from course_utils.instructor.intake import collect, handed_record, learner_folders, read_times
from course_utils.instructor.paths import under
from course_utils.instructor.shards import ClassRun, merge, share
from course_utils.instructor.similarity import (
    THRESHOLD,
    SimilarPair,
    answer_cells,
    boilerplate,
    given_cells,
    own_code,
    similar_pairs,
    write_similarity,
)
from course_utils.instructor.student import (
    InputError,
    find_notebooks,
    read_notebook,
    write_notebook,
)

#: The instructor notebooks a submission is graded against unless told otherwise.
COURSE_NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@dataclass(frozen=True)
class Task:
    """One submission to grade: a learner's notebook and the instructor's."""

    learner: str
    notebook: str
    path: str
    source: str


@dataclass(frozen=True)
class Options:
    """How every submission of a run is graded (all but ``hidden`` in each result's key).
    ``sandbox``: ``auto``, ``bwrap`` or ``none``; ``jobs``: submissions at once (None:
    :func:`default_jobs`). A run resolves ``auto`` once and shares the CPU threads among
    jobs."""

    cell_timeout_s: float = CELL_TIMEOUT_S
    total_timeout_s: float = TOTAL_TIMEOUT_S
    sandbox: str = "auto"
    limits: sandboxes.Limits = field(default_factory=sandboxes.Limits)
    jobs: int | None = None
    threads: int | None = None
    hidden: tuple[str, ...] = ()


def cpu_count() -> int:
    """The CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_jobs() -> int:
    """Submissions graded at once by default: one more than the CPU cores. Each job spends
    part of every submission waiting for its kernel (start-up, replies): the extra job
    uses those waits."""
    return cpu_count() + 1


_warned_unsandboxed = False


def find_sandbox(
    mode: str = "auto", hidden: tuple[str, ...] = (), limits: sandboxes.Limits | None = None
) -> sandboxes.Sandbox | None:
    """:func:`course_utils.instructor.sandbox.find`; without a sandbox, say so once per process."""
    global _warned_unsandboxed
    box = sandboxes.find(mode, hidden, limits or sandboxes.Limits())
    if box is None and not _warned_unsandboxed:
        _warned_unsandboxed = True
        print(sandboxes.unsandboxed_warning(), file=sys.stderr)
    return box


def instructor_notebooks(source: Path) -> dict[str, Path]:
    """The instructor notebooks with checks in ``source`` (a notebook or a folder), by
    file name. Raises :class:`InputError` when there is none."""
    found = {
        path.name: path for path in find_notebooks([source]) if check_cells(read_notebook(path))
    }
    if not found:
        raise InputError(f"no instructor notebook with check cells in {source}")
    return found


def find_submissions(
    root: Path, notes: dict[str, list[str]] | None = None
) -> dict[str, list[Path]]:
    """Each learner's notebooks: ``root/LEARNER/*.ipynb``, also one folder deeper
    (``LEARNER/ASSIGNMENT/``). An nbgrader course folder is recognised by its
    ``nbgrader_config.py`` (a file of the instructor's, never by a folder name a learner
    could choose): its ``submitted/STUDENT/ASSIGNMENT/`` is read. Symbolic links, files
    that leave the learner's folder and a notebook handed in twice are refused and said in
    ``notes`` (by learner). Raises :class:`InputError` for a missing folder or one without
    any learner's notebook."""
    if not root.is_dir():
        raise InputError(f"no such folder: {root}")
    learners = learner_folders(root, notes)
    if not learners:
        raise InputError(
            f"no submissions in {root}: expected LEARNER/NOTEBOOK.ipynb folders "
            "(or an nbgrader course folder: nbgrader_config.py, submitted/STUDENT/ASSIGNMENT/)"
        )
    return learners


def result_key(task: Task, options: Options) -> str:
    """What a result depends on: submission, instructor notebook, grader and the options
    that can change a score (not ``jobs``, ``threads`` or ``hidden``: a run with another
    ``--jobs``, or a shard on a node with other cores, keeps the results)."""
    digest = hashlib.sha256()
    digest.update(GRADER_VERSION.encode())
    ignored = ("hidden", "jobs", "threads")
    settings = {k: v for k, v in asdict(options).items() if k not in ignored}
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for path in (task.path, task.source):
        digest.update(b"\0")
        try:
            digest.update(Path(path).read_bytes())
        except OSError as error:
            digest.update(str(error).encode())
    return digest.hexdigest()


def _result_path(out: Path, task: Task) -> Path:
    """``results/LEARNER/NOTEBOOK.json``, the learner's name made safe (:mod:`.paths`)."""
    return under(out, "results", task.learner, f"{Path(task.notebook).stem}.json")


def _graded_path(out: Path, task: Task) -> Path:
    """The grader's own feedback notebook (``feedback/`` gets it with the adjustments)."""
    return under(out, "results", task.learner, f"{Path(task.notebook).stem}.ipynb")


def grade_task(task: Task, options: Options, out: Path | None) -> dict[str, Any]:
    """Grade one submission (in a worker process); write its result and feedback."""
    start = time.perf_counter()
    result: dict[str, Any] = {"key": result_key(task, options), **asdict(task)}
    try:
        why = validation.problem(Path(task.path), Path(task.path).parent)
        if why is not None and "refused" not in why:  # too big, too deep, bad metadata
            raise InputError(why)
        box = sandboxes.find(options.sandbox, options.hidden, options.limits)
        report, feedback = grade_submission(
            Path(task.path),
            Path(task.source),
            cell_timeout_s=options.cell_timeout_s,
            total_timeout_s=options.total_timeout_s,
            settings=KernelSettings(box, options.threads),
        )
    except Exception as error:  # any submission's failure is its own row, never the run's
        message = " ".join(str(error).split())[:500]
        if not isinstance(error, InputError | RuntimeError | OSError):
            message = f"the grader failed on it ({type(error).__name__}: {message})"
        result["error"] = message
        if isinstance(error, MachineBusy):  # the machine's fault: graded again next run
            result["retry"] = True
    else:
        result["report"] = asdict(report)
        if out is not None:
            partial = _graded_path(out, task).with_suffix(".partial")
            write_notebook(feedback, partial)
            partial.replace(_graded_path(out, task))
            _render_page(out, task, result["report"])
    result["seconds"] = round(time.perf_counter() - start, 2)
    if out is not None:  # written last: a result on disk means the feedback is too
        partial = _result_path(out, task).with_suffix(".partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        partial.replace(_result_path(out, task))
    return result


def _worker_start(scratch: str | None = None) -> None:
    """Ctrl-C or SIGTERM ends a worker at once, quietly: its kernel dies with it
    (:func:`_end_worker`) and results are written atomically, so the next run resumes
    cleanly. Its scratch folders go in the run's ``scratch`` folder, which the main process
    removes (:func:`_scratch`)."""
    signal.signal(signal.SIGINT, _end_worker)
    signal.signal(signal.SIGTERM, _end_worker)
    if scratch is not None:
        tempfile.tempdir = scratch
    # started with Ctrl-C held back (:func:`_ctrl_c_held_for_new_workers`): one that came
    # meanwhile ends the worker now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _end_worker(signum: int, frame: Any) -> None:
    """A worker stopped by a signal first ends what it started (its kernel, judge and
    checker run in sessions of their own, so the signal did not reach them) and waits for
    them, so nothing writes into the scratch folder after the main process removes it;
    then it dies of the same signal."""
    children = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                status = Path("/proc", entry, "stat").read_text()
                if int(status.rsplit(")", 1)[1].split()[1]) == os.getpid():
                    children.append(int(entry))
    for child in children:
        with contextlib.suppress(OSError):
            if os.getpgid(child) == child:  # its own group: end what it started too
                os.killpg(child, signal.SIGKILL)
            else:
                os.kill(child, signal.SIGKILL)
    for child in children:
        with contextlib.suppress(OSError):
            os.waitpid(child, 0)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class Stopped(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler's time limit) stopped a run: handled as Ctrl-C."""


@contextmanager
def _scratch() -> Iterator[str]:
    """A folder for the run's scratch folders (each submission's working folder, the
    guard's instructions), removed when the run ends, is interrupted (SIGINT) or is
    terminated (SIGTERM, turned into :class:`Stopped` meanwhile)."""
    folder = tempfile.mkdtemp(prefix="course-grade-run-")
    os.chmod(folder, 0o711)  # a sandboxed kernel's user passes through to its own folder
    previous = previous_int = None
    SIGNALLED.clear()

    def stop(signum: int, frame: Any) -> None:
        raise Stopped(f"stopped by signal {signum}")

    def interrupt(signum: int, frame: Any) -> None:
        SIGNALLED.append(signum)  # Ctrl-C to the process group also ends the workers
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not the main thread: SIGTERM stays as it was
        previous = signal.signal(signal.SIGTERM, stop)
        previous_int = signal.signal(signal.SIGINT, interrupt)
    try:
        yield folder
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _ctrl_c_held_for_new_workers() -> Iterator[None]:
    """Start worker processes with Ctrl-C held back until :func:`_worker_start` has set
    their handler: a Ctrl-C sent to the whole process group then never stops a worker
    halfway through start-up (importing, unpickling) with a traceback on the instructor's
    terminal; it ends the worker quietly once it has started.

    A new process inherits the blocked signal and its ignored action; Linux keeps a
    blocked signal pending even while it is ignored, so this process receives a Ctrl-C
    that came meanwhile when the block ends, and so does the worker. The resource tracker
    starts first: starting it unblocks SIGINT (CPython's ``resource_tracker``)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a handler
        return
    resource_tracker.ensure_running()
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)


#: Signals the main process received during a run: a worker pool broken by the same
#: Ctrl-C (sent to the whole process group) is an interruption, not a lost worker.
SIGNALLED: list[int] = []


def _context(preload: Sequence[str] = ()) -> Any:
    """How workers start: forked from a fresh server process that has imported the grader
    and ``preload`` once (``forkserver``: a worker starts in milliseconds, without importing
    them again), else spawned. Never forked from this process (it may hold threads and
    sockets)."""
    if "forkserver" not in get_all_start_methods() or len(tempfile.gettempdir()) > 60:
        # the fork server listens on a socket under TMPDIR, whose path may be at most 107
        # bytes (AF_UNIX): a long TMPDIR gets workers that start by importing the grader
        return get_context("spawn")
    context = get_context("forkserver")
    context.set_forkserver_preload([__name__, *preload])
    return context


#: torch.utils.cpp_extension (which torch.utils.benchmark imports, and the notebooks import
#: that) warns "No CUDA runtime is found, using CUDA_HOME=..." on a machine without a GPU
#: but with a CUDA toolkit: on the grader's terminal at every start (the workers' server
#: imports the checks' modules), about nothing the instructor has to do. Not said here.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

#: The packages whose modules the checks import that the workers' server imports too:
#: the course's own, whose import cannot fail with anything but ImportError (anything else
#: would stop the server); a worker imports the checks' other modules itself, once.
_COURSE_MODULES = ("torch", "course_utils")


def server_preload(sources: dict[str, Path]) -> list[str]:
    """What the workers' server imports besides the grader: torch, the course's modules
    the instructor notebooks ``sources`` import (for the checkers), and nbconvert (for the
    feedback pages)."""
    modules = {
        name
        for path in sources.values()
        for name in guard_spec(read_notebook(path))["modules"]
        if name.split(".")[0] in _COURSE_MODULES
    }
    return ["torch", *sorted(modules - {"torch"}), "nbconvert"]


def _start_workers_server(sources: dict[str, Path]) -> None:
    """Start the server the workers fork from now (it imports :func:`server_preload`'s
    modules, ~7 s), so that it is ready when the first submission is handed out: once for
    every worker, not in each."""
    if _context(server_preload(sources)).get_start_method() == "forkserver":
        with _ctrl_c_held_for_new_workers():  # the workers it forks inherit it
            forkserver.ensure_running()


def _kept(out: Path, task: Task, options: Options) -> dict[str, Any] | None:
    """The stored result of an unchanged submission, or None."""
    try:
        result = json.loads(_result_path(out, task).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or result.get("key") != result_key(task, options):
        return None
    if result.get("retry"):  # not graded because the machine was too busy
        return None
    if "report" in result and not _graded_path(out, task).is_file():
        return None
    return result


def grade_tasks(
    tasks: Sequence[Task], options: Options, out: Path | None, progress: TextIO, resume: bool
) -> list[dict[str, Any]]:
    """Grade the tasks, ``options.jobs`` at a time, keeping unchanged results found in
    ``out``; one progress line per submission. Returns the results in the order of tasks."""
    jobs = options.jobs or 1
    kept = [_kept(out, task, options) if out and resume else None for task in tasks]
    results = {number: result for number, result in enumerate(kept) if result is not None}
    todo = [number for number in range(len(tasks)) if number not in results]
    say = functools.partial(print, file=progress, flush=True)
    say(
        f"{len(tasks)} submission(s): {len(results)} unchanged since the last run (kept), "
        f"{len(todo)} to grade, {min(jobs, max(1, len(todo)))} at a time"
    )
    done = len(results)

    def report(number: int, result: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        results[number], task, graded = result, tasks[number], result.get("report")
        score = f"{graded['score']:g}/{graded['max_score']:g}" if graded else "not graded: "
        score += "" if graded else result.get("error", "?")
        if graded and graded.get("tampering"):
            score += f"  TAMPERING flagged ({len(graded['tampering'])})"
        seconds = result.get("seconds", 0)
        say(f"[{done}/{len(tasks)}] {task.learner}  {task.notebook}  {score}  ({seconds:.1f} s)")

    with _scratch() as scratch:
        if jobs <= 1 or len(todo) <= 1:
            before, tempfile.tempdir = tempfile.tempdir, scratch  # graded in this process
            try:
                for number in todo:
                    report(number, grade_task(tasks[number], options, out))
            finally:
                tempfile.tempdir = before
        else:
            _in_pool(tasks, todo, options, out, scratch, report)
    return [results[number] for number in range(len(tasks))]


def _in_pool(
    tasks: Sequence[Task],
    todo: Sequence[int],
    options: Options,
    out: Path | None,
    scratch: str,
    report: Callable[[int, dict[str, Any]], None],
) -> None:
    """Grade ``todo`` in ``options.jobs`` worker processes; on Ctrl-C, SIGTERM or an error,
    stop the workers (and wait for them) before the scratch folder is removed."""
    pool = ProcessPoolExecutor(
        options.jobs, mp_context=_context(), initializer=_worker_start, initargs=(scratch,)
    )
    futures: dict[Future[dict[str, Any]], int] = {}
    try:
        with _ctrl_c_held_for_new_workers():  # workers start as tasks are submitted
            futures.update({pool.submit(grade_task, tasks[n], options, out): n for n in todo})
        for future in as_completed(futures):
            report(futures[future], future.result())
    except BrokenProcessPool:
        _stop(pool)
        time.sleep(0.5)  # a Ctrl-C to the process group may reach this process last
        if SIGNALLED:
            raise KeyboardInterrupt from None
        raise RuntimeError(
            f"a grading process was stopped (interrupted, or killed for memory) after "
            f"{sum(f.done() for f in futures)} of {len(futures)} graded in this run: run the "
            "same command again to resume"
        ) from None
    except BaseException:  # Ctrl-C, SIGTERM, or an error: stop the workers now
        _stop(pool)
        raise
    pool.shutdown()


def _stop(pool: ProcessPoolExecutor) -> None:
    workers = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join(10)


def notebook_maxima(sources: dict[str, Path]) -> dict[str, float]:
    """Each instructor notebook's points: the sum over its check cells."""
    return {name: sum(points.values()) for name, points in check_points(sources).items()}


def check_points(sources: Mapping[str, Path]) -> dict[str, dict[str, float]]:
    """Each instructor notebook's checks: grade_id → points possible."""
    return {
        name: {
            gid: float(cell.metadata["nbgrader"].get("points", 0) or 0)
            for gid, cell in check_cells(read_notebook(path)).items()
        }
        for name, path in sources.items()
    }


def write_gradebook(
    out: Path,
    learners: Sequence[str],
    notebooks: Sequence[str],
    results: Sequence[dict[str, Any]],
    notes: dict[str, list[str]],
    maxima: dict[str, float] | None = None,
    unmatched: Mapping[str, Sequence[str]] | None = None,
    missing_blank: bool = False,
) -> tuple[Path, Path]:
    """Write ``gradebook.csv`` and ``checks.csv``; return their paths. A notebook of the
    assignment that a learner did not hand in scores 0 of its points (``maxima``; an
    empty cell with ``missing_blank``) and is named in the ``missing`` column, unless the
    learner handed in a notebook that matched none (``unmatched``): then its cell is empty
    and the file is named in ``unmatched``. A late penalty (``report["late"]``) gets a
    ``late-penalty`` row in ``checks.csv``."""
    by_cell = {(r["learner"], r["notebook"]): r for r in results}
    header = ["learner", *notebooks, "total", "max", "missing", "notes", "tampering"]
    header += ["unmatched", "late"]
    book: list[list[Any]] = [header]
    checks: list[list[Any]] = [
        ["learner", "notebook", "check", "points", "max_points", "reason", "matched"]
    ]
    for learner in learners:
        row, total, most, said = [], 0.0, 0.0, list(notes.get(learner, []))
        missing: list[str] = []
        tampering: list[str] = []
        late: list[str] = []
        lost = list((unmatched or {}).get(learner, []))
        for notebook in notebooks:
            result = by_cell.get((learner, notebook))
            if result is None:
                missing.append(notebook)
                result = {"error": "not submitted"}
            report = result.get("report")
            if report is None:
                blank = notebook in missing and (lost or missing_blank)
                row.append("" if blank else "0")
                most += (maxima or {}).get(notebook, 0.0)
                if notebook not in missing:
                    said.append(f"{notebook}: {result.get('error', '?')}")
                checks.append([learner, notebook, "", 0, "", result.get("error"), ""])
                continue
            row.append(f"{report['score']:g}")
            total, most = total + report["score"], most + report["max_score"]
            said += [f"{notebook}: {m} (found by content)" for m in report["matched"]]
            tampering += [f"{notebook}: {what}" for what in report.get("tampering", [])]
            for check in report["checks"]:
                points = f"{check['points']:g}", f"{check['max_points']:g}"
                why = check["reason"], check.get("matched", "")
                checks.append([learner, notebook, check["grade_id"], *points, *why])
            if report.get("late"):
                text = late_text(report["late"])
                late.append(f"{notebook}: {text}")
                penalty = f"-{report['late']['penalty']:g}"
                checks.append([learner, notebook, "late-penalty", penalty, "", text, ""])
        if lost:
            missing = []  # one of them may be what the unmatched file is
        totals = [f"{total:g}", f"{most:g}", " ".join(missing)]
        book.append([learner, *row, *totals, "; ".join(said), "; ".join(tampering),
                     " ".join(lost), "; ".join(late)])  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    numeric = {
        "gradebook.csv": {1 + i for i in range(len(notebooks) + 2)},
        "checks.csv": {3, 4},
    }
    for name, rows in (("gradebook.csv", book), ("checks.csv", checks)):
        partial = out / f"{name}.partial"
        with partial.open("w", newline="", encoding="utf-8") as file:
            csv.writer(file).writerows(validation.row(r, numeric[name]) for r in rows)
        partial.replace(out / name)
    return out / "gradebook.csv", out / "checks.csv"


@functools.cache
def _html_exporter() -> Any:
    """nbconvert's HTML exporter (its templates found also from a virtual environment that
    reuses another's packages), sanitizing: a learner's Markdown, raw or HTML output
    (``<script>``, ``onerror=``, ``javascript:`` links) is escaped or stripped, so nothing
    of theirs runs in a feedback page."""
    import nbconvert  # lazy: slow to import, and only the class's feedback needs it
    from nbconvert import HTMLExporter  # lazy: as above
    from nbconvert.preprocessors.sanitize import SanitizeHTML  # lazy: as above

    shared = Path(nbconvert.__file__).resolve().parents[4] / "share" / "jupyter"
    templates = shared / "nbconvert" / "templates"
    extra = [str(templates)] if templates.is_dir() else []
    exporter = HTMLExporter(
        extra_template_basedirs=extra, extra_template_paths=extra, sanitize_html=True
    )
    # and the notebook itself cleaned before any template sees it: the templates' own
    # sanitizing is a second line (a template found elsewhere may not have it)
    exporter.register_preprocessor(SanitizeHTML(), enabled=True)
    return exporter


def _feedback_text(graded: Path, report: Mapping[str, Any]) -> tuple[Any, str]:
    """The feedback notebook for ``report`` (from the grader's own ``graded`` notebook) and
    its text as ``feedback/`` holds it."""
    notebook = read_notebook(graded)
    apply_report(notebook, report)
    return notebook, json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _page_path(out: Path, task: Task) -> Path:
    """The HTML page a worker rendered for the report as graded (``feedback/`` reuses it
    when no override or late penalty changed the report)."""
    return _graded_path(out, task).with_suffix(".html")


def _render_page(out: Path, task: Task, report: Mapping[str, Any]) -> None:
    """Render the feedback page in the worker that graded the submission: the class's
    pages are made in parallel, not one after another at the end of the run. The first
    line is the hash of the notebook text the page shows."""
    notebook, text = _feedback_text(_graded_path(out, task), report)
    page = _page(_html_exporter(), notebook)
    partial = _page_path(out, task).with_suffix(".partial")
    partial.write_text(_digest(text) + "\n" + page, encoding="utf-8")
    partial.replace(_page_path(out, task))


def _page(exporter: Any, notebook: Any) -> str:
    """The feedback page; a notebook nbconvert cannot render (whatever a learner put in
    it) gets a plain page saying so, never an error for the run."""
    try:
        page, _ = exporter.from_notebook_node(notebook)
    except Exception as error:  # one learner's page, not the class run
        why = html.escape(f"{type(error).__name__}: {' '.join(str(error).split())[:300]}")
        return (
            "<!doctype html>\n<html lang=en><meta charset=utf-8><title>Feedback</title>\n"
            f"<p>This feedback could not be shown as a page ({why}): open the notebook "
            "beside it (.ipynb).</p>\n"
        )
    return _SCRIPT_URL.sub(r"\1#blocked:", str(page))


#: A link or source that would run script when followed (``[x](javascript:...)`` in a
#: learner's Markdown becomes one after sanitizing, which cleans HTML, not Markdown): the
#: last line of defence, whatever template rendered the page.
_SCRIPT_URL = re.compile(
    r"""(\b(?:href|src|action|formaction|xlink:href)\s*=\s*["']?)\s*"""
    r"(?:javascript|vbscript|data:text/html)(?=[:;,])",
    re.IGNORECASE,
)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _rendered(out: Path, task: Task, text: str) -> str | None:
    """The page a worker rendered for exactly ``text``, or None."""
    try:
        digest, page = _page_path(out, task).read_text(encoding="utf-8").split("\n", 1)
    except (OSError, ValueError):
        return None
    return page if digest == _digest(text) else None


def write_feedback(out: Path, results: Sequence[dict[str, Any]]) -> int:
    """``feedback/LEARNER/NOTEBOOK.ipynb`` and ``.html``: the grader's feedback notebook
    with the (adjusted) report's summary and check lines; only what changed is written.
    Returns how many notebooks were written."""
    exporter = None
    written = 0
    for result in results:
        report = result.get("report")
        task = Task(result["learner"], result["notebook"], result["path"], result["source"])
        graded = _graded_path(out, task)
        if report is None or not graded.is_file():
            continue
        notebook, text = _feedback_text(graded, report)
        target = under(out, "feedback", task.learner, task.notebook)
        shown = target.with_suffix(".html")
        if target.is_file() and shown.is_file() and target.read_text(encoding="utf-8") == text:
            continue
        page = _rendered(out, task, text)
        if page is None:  # an override or a late penalty changed the report
            exporter = exporter or _html_exporter()
            page = _page(exporter, notebook)
        target.parent.mkdir(parents=True, exist_ok=True)
        for path, content in ((shown, page), (target, text)):  # the notebook last
            partial = path.with_suffix(".partial")
            partial.write_text(content, encoding="utf-8")
            partial.replace(path)
        written += 1
    return written


def apply_report(notebook: Any, report: Mapping[str, Any]) -> None:
    """Put a (possibly adjusted) report into a feedback notebook: the summary at the top
    and each check cell's line (an override's comment, a late penalty)."""
    lines = {}
    for check in report["checks"]:
        points = f"{check['points']:g}/{check['max_points']:g}"
        result = "passed" if check["passed"] else f"failed: {check['reason']}"
        lines[check["grade_id"]] = (f"{check['grade_id']}: {points} {result}\n", check["passed"])
    for cell in notebook.cells[1:]:
        for output in cell.get("outputs", []):
            gid = str(output.get("text", "")).split(":", 1)[0]
            if output.get("output_type") == "stream" and gid in lines:
                output["text"], passed = lines[gid]
                output["name"] = "stdout" if passed else "stderr"
    headline = None
    if report.get("late"):
        late = report["late"]
        headline = (
            f"**Grade: {report['score']:g}/{report['max_score']:g}** "
            f"({late_text(late)} of {late['before']:g})"
        )
    fields = {k: v for k, v in report.items() if k in GradeReport.__dataclass_fields__}
    fields = {k: v for k, v in fields.items() if k not in ("score", "max_score")}
    checks = [{k: v for k, v in c.items() if k != "override"} for c in report["checks"]]
    summary = feedback_summary(GradeReport.from_dict({**fields, "checks": checks}), headline)
    notebook.cells[0].source = summary


def _resolved(options: Options, paths: Sequence[Path]) -> Options:
    """The run's options: the sandbox found once here (said once if there is none), the
    jobs, each kernel's share of the CPU threads, and the paths its sandbox hides."""
    hidden = tuple(str(path) for path in paths)
    mode = "bwrap" if find_sandbox(options.sandbox, hidden, options.limits) else "none"
    if mode == "bwrap":
        cgroups.sweep()  # empty groups an earlier run that was killed left behind
    jobs = options.jobs or default_jobs()
    return replace(
        options, sandbox=mode, jobs=jobs, threads=max(1, cpu_count() // jobs), hidden=hidden
    )


def _answers(tasks: Sequence[Task]) -> dict[str, dict[str, dict[str, str]]]:
    """Each submission's answer cells (for the similarity report); unreadable ones: none."""
    answers: dict[str, dict[str, dict[str, str]]] = {}
    references: dict[str, tuple[Any, frozenset[str]]] = {}
    for task in tasks:
        try:
            if task.source not in references:
                reference = read_notebook(Path(task.source))
                references[task.source] = (reference, given_cells(reference))
            reference, given = references[task.source]
            submission = read_notebook(Path(task.path))
            cells = answer_cells(submission, reference)
            cells.update(own_code(submission, reference, given))
        except Exception:
            continue
        answers.setdefault(task.learner, {})[task.notebook] = cells
    return answers


@dataclass(frozen=True)
class ClassOutputs:
    """How a class run's files are written (``grade-class`` and ``grade-merge`` alike):
    the similarity threshold, the Canvas roster and columns (``--column``), the overrides
    file and the late policy."""

    threshold: float = THRESHOLD
    roster: Path | None = None
    columns: Mapping[str, str] = field(default_factory=dict)
    overrides: Path | None = None
    late: LatePolicy | None = None
    #: a notebook not handed in: "0" (scores 0) or "blank" (an empty cell; Canvas: missing)
    missing: str = "0"


def write_class(
    out: Path,
    run: ClassRun,
    results: Sequence[dict[str, Any]],
    outputs: ClassOutputs = ClassOutputs(),
    sources: Mapping[str, Mapping[str, float]] | None = None,
    pairs: list[SimilarPair] | None = None,
) -> list[Path]:
    """Write a class run's files into ``out`` (gradebook, checks, canvas, similarity,
    submissions, feedback and the run's record), the overrides and late penalties
    applied; return their paths. ``sources``: each notebook's checks and points (for the
    overrides; else read from the results); ``pairs``: the similar answers if already
    found. :class:`InputError`, and no ``canvas.csv``, when the roster lacks a learner."""
    if outputs.roster is not None:
        check_roster(out, outputs.roster, run.learners)
    checks = dict(sources or _checks_of(results))
    overrides = read_overrides(outputs.overrides, checks, run.learners) if outputs.overrides else []
    adjusted, unused = adjust(results, overrides, outputs.late, run.handed)
    notes = {learner: list(said) for learner, said in run.notes.items()}
    for line in unused:
        notes.setdefault(line.split("'")[0].removeprefix("override for "), []).append(line)
    unmatched = run.unmatched
    learners = list(run.learners)
    if outputs.roster is not None and run.shard[1] == 1:  # the whole class: all the roster
        learners = sorted([*learners, *absent_students(outputs.roster, learners)])
    blank = outputs.missing == "blank"
    book, checks_csv = write_gradebook(
        out, learners, run.assignment, adjusted, notes, run.maxima, unmatched, blank
    )
    scores = {
        (r["learner"], r["notebook"]): r["report"]["score"] for r in adjusted if "report" in r
    }
    pending = {
        (learner, notebook)
        for learner in run.learners
        for notebook in run.assignment
        if (learner, notebook) not in scores
        and (unmatched.get(learner) or notebook in run.handed.get(learner, {}))
    }
    handed_in = {(learner, nb) for learner, notebooks in run.handed.items() for nb in notebooks}
    canvas = write_canvas(
        out, learners, run.assignment, scores, run.maxima, outputs.roster,
        columns=outputs.columns, pending=pending, handed=handed_in if blank else None,
    )  # fmt: skip
    if pairs is None:
        pairs = similar_pairs(run.answers, run.given, outputs.threshold)
    similar = write_similarity(out, pairs, outputs.threshold)
    handed = _write_handed(out, run)
    write_feedback(out, adjusted)
    run.save(out)
    return [book, checks_csv, canvas, *similar, handed]


def _checks_of(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each notebook's checks and points, as the graded reports have them."""
    checks: dict[str, dict[str, float]] = {}
    for result in results:
        for check in result.get("report", {}).get("checks", []):
            checks.setdefault(result["notebook"], {})[check["grade_id"]] = check["max_points"]
    return checks


def _write_handed(out: Path, run: ClassRun) -> Path:
    """``submissions.csv``: each file handed in, what it was graded as and how it was
    recognised, Canvas's late marker and the submission time; the unmatched ones too."""
    rows = [["learner", "notebook", "file", "how", "late", "submitted_at"]]
    for learner in run.learners:
        for notebook, about in sorted(run.handed.get(learner, {}).items()):
            late = {True: "late", False: "", None: ""}[about.get("late")]
            rows.append([learner, notebook, about["file"], about["how"] or "same name", late,
                         about.get("submitted_at") or ""])  # fmt: skip
        for name in run.unmatched.get(learner, []):
            rows.append([learner, "", name, "NOT MATCHED: not graded", "", ""])
    partial = out / "submissions.csv.partial"
    with partial.open("w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows(rows)
    return partial.replace(out / "submissions.csv")


@dataclass
class ClassGrades:
    """What ``grade-class`` graded: the results, and the learners with notebooks handed in
    but matched to no instructor notebook (not scored: their Canvas cells are empty)."""

    results: list[dict[str, Any]]
    unmatched: dict[str, list[str]]


RED, PLAIN = "\033[31m", "\033[0m"


def _red(line: str, stream: TextIO) -> str:
    """A line in red where the stream is a terminal."""
    return f"{RED}{line}{PLAIN}" if getattr(stream, "isatty", lambda: False)() else line


def grade_class(
    submissions: Path,
    source: Path,
    out: Path,
    options: Options = Options(),
    *,
    resume: bool = True,
    progress: TextIO | None = None,
    warn: Callable[[str], None] | None = None,
    shard: tuple[int, int] = (1, 1),
    whole_source: bool = True,
    outputs: ClassOutputs = ClassOutputs(),
    students: Sequence[str] = (),
    submitted_at: Sequence[str] = (),
) -> ClassGrades:
    """Grade every learner's notebooks in ``submissions`` (a folder per learner, nbgrader's
    layout, or Canvas's download: :mod:`~course_utils.instructor.intake`), or shard K/N's
    share of them (:mod:`~course_utils.instructor.shards`), into ``out`` (see the module's
    documentation). The assignment is every instructor notebook in ``source``, or with
    ``whole_source=False`` those that somebody in the class handed in; a notebook of it
    that a learner lacks scores 0 of its points. ``students``: grade only these learners
    again (``--student``; the others' stored results are kept). Raises
    :class:`InputError` for bad input (before grading anything)."""
    progress = progress or sys.stdout
    say = functools.partial(print, file=progress, flush=True)
    parallel = (options.jobs or default_jobs()) > 1
    sources = instructor_notebooks(source)
    if parallel:  # the workers' server imports the grader while the submissions are read
        _start_workers_server(sources)
    roster = read_roster(outputs.roster)[0] if outputs.roster else None
    times = read_times(list(submitted_at), list(sources)) if submitted_at else None
    intake = collect(submissions, list(sources), out / "download", roster, times)
    handed_in = {nb for notebooks in intake.handed.values() for nb in notebooks}
    if not handed_in:
        raise InputError(f"no submitted notebook has an instructor notebook in {source}")
    assignment = [name for name in sources if whole_source or name in handed_in]
    everyone = sorted({*intake.handed, *intake.unmatched, *intake.notes})  # refusals too
    unknown = [name for name in students if name not in everyone]
    if unknown:
        raise InputError(f"--student {unknown[0]}: no such learner in {submissions}")
    mine = share(everyone, shard)
    if outputs.roster is not None:
        check_roster(out, outputs.roster, mine)
    options = _resolved(options, [submissions, out, source, *sources.values()])
    tasks: list[Task] = []
    notes: dict[str, list[str]] = {}
    for learner in mine:
        notes[learner] = list(intake.notes.get(learner, []))
        for notebook, item in sorted(intake.handed.get(learner, {}).items()):
            if notebook in assignment:
                tasks.append(Task(learner, notebook, str(item.path), str(sources[notebook])))
            else:
                notes[learner].append(f"{item.original}: not graded ({notebook} is not "
                                      "in the assignment)")  # fmt: skip
        if not notes[learner]:
            del notes[learner]
    for line in intake.ignored:
        say(f"note: {line}")
    unmatched = {  # files that may be a notebook the learner lacks: not scored 0
        name: intake.unmatched[name]
        for name in mine
        if name in intake.unmatched
        and any(nb not in intake.handed.get(name, {}) for nb in assignment)
    }
    for learner, files in unmatched.items():
        for name in files:
            say(_red(f"NOT MATCHED: {learner}  {name}: handed in, matched to no instructor "
                     "notebook: not graded, its Canvas cell left empty", progress))  # fmt: skip
    maxima = notebook_maxima({name: sources[name] for name in assignment})
    given = {name: boilerplate(read_notebook(sources[name])) for name in assignment}
    answers = _answers(tasks)
    threshold = outputs.threshold
    with ThreadPoolExecutor(1) as beside:
        # with --jobs > 1 the similarity report is computed while the workers grade
        similar = beside.submit(similar_pairs, answers, given, threshold) if parallel else None
        if students:
            results = _regrade_some(tasks, set(students), options, out, progress)
        else:
            results = grade_tasks(tasks, options, out, progress, resume)
        pairs = similar.result() if similar is not None else None
    handed = {
        learner: {
            nb: handed_record(h) for nb, h in intake.handed[learner].items() if nb in assignment
        }
        for learner in mine
        if learner in intake.handed
    }
    run = ClassRun(
        mine, assignment, maxima, notes, [(t.learner, t.notebook) for t in tasks],
        answers, given, shard, handed, unmatched,
    )  # fmt: skip
    points = check_points({name: sources[name] for name in assignment})
    written = write_class(out, run, results, outputs, points, pairs)
    failed = sum("report" not in result for result in results)
    part = f" (shard {shard[0]}/{shard[1]})" if shard[1] > 1 else ""
    names = ", ".join(path.name for path in written)
    say(f"wrote {names} and feedback/ for {len(mine)} learner(s){part} in {out}")
    if failed and warn is not None:
        warn(f"{failed} submission(s) could not be graded: see the notes in {written[0]}")
    if unmatched and warn is not None:
        count = sum(len(files) for files in unmatched.values())
        warn(f"{count} notebook(s) handed in were matched to no instructor notebook and not "
             f"graded (NOT MATCHED above, {written[-1].name}): rename them, run again")  # fmt: skip
    return ClassGrades(results, unmatched)


def _regrade_some(
    tasks: Sequence[Task], students: set[str], options: Options, out: Path, progress: TextIO
) -> list[dict[str, Any]]:
    """``--student``: grade those learners' notebooks again; keep everyone else's stored
    results (one not stored, or stale, says so and is left ungraded)."""
    again = [task for task in tasks if task.learner in students]
    graded = iter(grade_tasks(again, options, out, progress, resume=False))
    results = []
    for task in tasks:
        if task.learner in students:
            results.append(next(graded))
            continue
        kept = _kept(out, task, options)
        error = "no result stored for the options of this run: run grade-class without --student"
        results.append(kept or {**asdict(task), "error": error})
    return results


def grade_merge(
    folders: Sequence[Path],
    out: Path,
    *,
    outputs: ClassOutputs = ClassOutputs(),
    progress: TextIO | None = None,
) -> list[Path]:
    """``grade-merge``: the shards' output folders as one, as if graded in one run."""
    run, results = merge(folders, out)
    written = write_class(out, run, results, outputs)
    names = ", ".join(path.name for path in written)
    print(
        f"merged {len(folders)} shard(s), {len(run.learners)} learner(s): wrote {names} in {out}",
        file=progress or sys.stdout,
    )
    return written


def grade_notebooks(
    paths: Sequence[Path],
    source: Path,
    out: Path | None,
    options: Options = Options(),
    *,
    as_json: bool = False,
) -> int:
    """The ``grade`` command: grade the notebooks against ``source`` (a notebook, or a
    folder of them by name), print each report (a table, or JSON), write the gradebook
    and feedback into ``out`` if given; 1 if a submission could not be graded, else 0."""
    tasks = []
    for path in paths:
        read_notebook(path)
        instructor = source / path.name if source.is_dir() else source
        instructor_notebooks(instructor)  # a readable notebook with checks
        tasks.append(Task(path.parent.name or ".", path.name, str(path), str(instructor)))
    folders = {Path(path).parent for task in tasks for path in (task.path, task.source)}
    options = _resolved(options, [*folders, *([out] if out else [])])
    progress = sys.stderr if len(tasks) > 1 else io.StringIO()  # one: no progress lines
    results = grade_tasks(tasks, options, out, progress, resume=False)
    if out is not None:
        learners = list(dict.fromkeys(task.learner for task in tasks))
        notebooks = list(dict.fromkeys(task.notebook for task in tasks))
        write_gradebook(out, learners, notebooks, results, {})
        write_feedback(out, results)
    failure = ("error", "learner", "notebook", "path", "source")
    reports = [result.get("report") or {k: result[k] for k in failure} for result in results]
    if as_json:
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    for result in results:
        if "report" not in result:
            print(f"error: {result['path']}: {result['error']}", file=sys.stderr)
        elif not as_json:
            print(GradeReport.from_dict(result["report"]).format())
    return 1 if any("report" not in result for result in results) else 0
