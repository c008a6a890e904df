"""Grade several submissions, in parallel, into a gradebook (``grade`` and ``grade-class``).

``grade-class`` grades each learner's notebooks (``LEARNER/*.ipynb`` or nbgrader's
``submitted/STUDENT/ASSIGNMENT/``) against the instructor notebook of the same name, each
in its own process, into ``gradebook.csv``, ``checks.csv``, ``feedback/`` and ``results/``.
A result is kept while its key (a SHA-256 of submission, instructor notebook, grader
version and options) is unchanged. docs/instructor-guide.md has the rest.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Any, TextIO

from course_utils.instructor import cgroups, validation
from course_utils.instructor import sandbox as sandboxes
from course_utils.instructor.canvas import write_canvas
from course_utils.instructor.grading import (
    CELL_TIMEOUT_S,
    GRADER_VERSION,
    TOTAL_TIMEOUT_S,
    GradeReport,
    KernelSettings,
    MachineBusy,
    check_cells,
    grade_submission,
)
from course_utils.instructor.shards import ClassRun, merge, share
from course_utils.instructor.similarity import (
    THRESHOLD,
    answer_cells,
    boilerplate,
    own_code,
    similar_pairs,
    write_similarity,
)
from course_utils.instructor.student import InputError, read_notebook, write_notebook
from course_utils.runner import find_notebooks

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
    if (root / "nbgrader_config.py").is_file() and (root / "submitted").is_dir():
        root = root / "submitted"  # an nbgrader course folder
    said = notes if notes is not None else {}
    learners: dict[str, list[Path]] = {}
    for folder in sorted(p for p in root.iterdir() if p.name[0] != "."):
        if folder.is_symlink():
            said.setdefault(folder.name, []).append("refused: the learner's folder is a link")
            continue
        if not folder.is_dir():
            continue
        found = [*folder.glob("*.ipynb"), *folder.glob("[!.]*/*.ipynb")]  # ASSIGNMENT/ too
        kept: dict[str, list[Path]] = {}
        for path in sorted(found):
            why = validation.problem(path, folder)
            if why is not None and "refused" in why:
                said.setdefault(folder.name, []).append(why)
            else:  # graded, or a row that says why it could not be
                kept.setdefault(path.name, []).append(path)
        notebooks = []
        for name, paths in kept.items():
            if len(paths) > 1:
                where = ", ".join(str(p.relative_to(folder)) for p in paths)
                said.setdefault(folder.name, []).append(
                    f"{name}: refused: handed in {len(paths)} times ({where}); hand in one"
                )
            else:
                notebooks += paths
        if notebooks:
            learners[folder.name] = sorted(notebooks)
    if not learners:
        raise InputError(
            f"no submissions in {root}: expected LEARNER/NOTEBOOK.ipynb folders "
            "(or an nbgrader course folder: nbgrader_config.py, submitted/STUDENT/ASSIGNMENT/)"
        )
    return learners


def result_key(task: Task, options: Options) -> str:
    """What a result depends on: submission, instructor notebook, grader and options."""
    digest = hashlib.sha256()
    digest.update(GRADER_VERSION.encode())
    settings = {k: v for k, v in asdict(options).items() if k != "hidden"}
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for path in (task.path, task.source):
        digest.update(b"\0")
        try:
            digest.update(Path(path).read_bytes())
        except OSError as error:
            digest.update(str(error).encode())
    return digest.hexdigest()


def _result_path(out: Path, task: Task) -> Path:
    return out / "results" / task.learner / f"{Path(task.notebook).stem}.json"


def _feedback_path(out: Path, task: Task) -> Path:
    return out / "feedback" / task.learner / task.notebook


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
            partial = _feedback_path(out, task).with_suffix(".partial")
            write_notebook(feedback, partial)
            partial.replace(_feedback_path(out, task))
    result["seconds"] = round(time.perf_counter() - start, 2)
    if out is not None:  # written last: a result on disk means the feedback is too
        partial = _result_path(out, task).with_suffix(".partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        partial.replace(_result_path(out, task))
    return result


def _worker_start() -> None:
    """Ctrl-C ends a worker at once, quietly: its kernel dies with it and results are
    written atomically, so the next run resumes cleanly."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _context() -> Any:
    """How workers start: forked from a fresh server process that has imported the grader
    once (``forkserver``: a worker starts in milliseconds, without importing it again), else
    spawned. Never forked from this process (it may hold threads and sockets)."""
    if "forkserver" not in get_all_start_methods():
        return get_context("spawn")
    context = get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


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
    if "report" in result and not _feedback_path(out, task).is_file():
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

    if jobs <= 1 or len(todo) <= 1:
        for number in todo:
            report(number, grade_task(tasks[number], options, out))
    else:
        with ProcessPoolExecutor(jobs, mp_context=_context(), initializer=_worker_start) as pool:
            futures = {pool.submit(grade_task, tasks[n], options, out): n for n in todo}
            try:
                for future in as_completed(futures):
                    report(futures[future], future.result())
            except BrokenProcessPool:
                raise RuntimeError(
                    f"a grading process was stopped (interrupted, or killed for memory) after "
                    f"{done} of {len(tasks)}: run the same command again to resume"
                ) from None
            except BaseException:  # Ctrl-C, or an error: stop the workers now
                workers = list(getattr(pool, "_processes", {}).values())
                pool.shutdown(wait=False, cancel_futures=True)
                for worker in workers:
                    worker.terminate()
                raise
    return [results[number] for number in range(len(tasks))]


def notebook_maxima(sources: dict[str, Path]) -> dict[str, float]:
    """Each instructor notebook's points: the sum over its check cells."""
    return {
        name: sum(
            float(cell.metadata["nbgrader"].get("points", 0) or 0)
            for cell in check_cells(read_notebook(path)).values()
        )
        for name, path in sources.items()
    }


def write_gradebook(
    out: Path,
    learners: Sequence[str],
    notebooks: Sequence[str],
    results: Sequence[dict[str, Any]],
    notes: dict[str, list[str]],
    maxima: dict[str, float] | None = None,
) -> tuple[Path, Path]:
    """Write ``gradebook.csv`` and ``checks.csv``; return their paths. A notebook of the
    assignment that a learner did not hand in scores 0 of its points (``maxima``) and is
    named in the ``missing`` column."""
    by_cell = {(r["learner"], r["notebook"]): r for r in results}
    header = ["learner", *notebooks, "total", "max", "missing", "notes", "tampering"]
    book: list[list[Any]] = [header]
    checks: list[list[Any]] = [
        ["learner", "notebook", "check", "points", "max_points", "reason", "matched"]
    ]
    for learner in learners:
        row, total, most, said = [], 0.0, 0.0, list(notes.get(learner, []))
        missing: list[str] = []
        tampering: list[str] = []
        for notebook in notebooks:
            result = by_cell.get((learner, notebook))
            if result is None:
                missing.append(notebook)
                result = {"error": "not submitted"}
            report = result.get("report")
            if report is None:
                row.append("0")
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
        totals = [f"{total:g}", f"{most:g}", " ".join(missing)]
        book.append([learner, *row, *totals, "; ".join(said), "; ".join(tampering)])
    out.mkdir(parents=True, exist_ok=True)
    numeric = {
        "gradebook.csv": {1 + i for i in range(len(notebooks) + 2)},
        "checks.csv": {3, 4},
    }
    for name, rows in (("gradebook.csv", book), ("checks.csv", checks)):
        with (out / name).open("w", newline="", encoding="utf-8") as file:
            csv.writer(file).writerows(validation.row(r, numeric[name]) for r in rows)
    return out / "gradebook.csv", out / "checks.csv"


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
    references: dict[str, Any] = {}
    for task in tasks:
        try:
            reference = references.get(task.source) or read_notebook(Path(task.source))
            references[task.source] = reference
            cells = answer_cells(read_notebook(Path(task.path)), reference)
            cells.update(own_code(read_notebook(Path(task.path)), reference))
        except Exception:
            continue
        answers.setdefault(task.learner, {})[task.notebook] = cells
    return answers


def write_class(
    out: Path,
    run: ClassRun,
    results: Sequence[dict[str, Any]],
    threshold: float = THRESHOLD,
    roster: Path | None = None,
) -> list[Path]:
    """Write a class run's files into ``out`` (gradebook, checks, canvas, similarity and
    the run's record); return their paths and say which roster entries were missing."""
    book, checks = write_gradebook(
        out, run.learners, run.assignment, results, run.notes, run.maxima
    )
    scores = {(r["learner"], r["notebook"]): r["report"]["score"] for r in results if "report" in r}
    canvas, unknown = write_canvas(out, run.learners, run.assignment, scores, run.maxima, roster)
    if unknown:
        raise InputError(f"the roster {roster} has no student named {', '.join(unknown)}")
    pairs = similar_pairs(run.answers, run.given, threshold)
    similar = write_similarity(out, pairs, threshold)
    run.save(out)
    return [book, checks, canvas, *similar]


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
    threshold: float = THRESHOLD,
    roster: Path | None = None,
) -> list[dict[str, Any]]:
    """Grade every learner's notebooks in ``submissions`` (or shard K/N's share of them,
    :mod:`course_utils.instructor.shards`) into ``out`` (see the module's documentation); return the
    results. The assignment is every instructor notebook in ``source``, or with
    ``whole_source=False`` those that somebody in the class handed in; a notebook of it
    that a learner lacks scores 0 of its points. Raises :class:`InputError` for bad
    folders."""
    progress = progress or sys.stdout
    sources = instructor_notebooks(source)
    notes: dict[str, list[str]] = {}
    learners = find_submissions(submissions, notes)
    for learner in notes:
        learners.setdefault(learner, [])  # a row that says what was refused
    handed_in = {path.name for paths in learners.values() for path in paths}
    if not handed_in & set(sources):
        raise InputError(f"no submitted notebook has an instructor notebook in {source}")
    assignment = [name for name in sources if whole_source or name in handed_in]
    mine = share(list(learners), shard)
    options = _resolved(options, [submissions, out, source, *sources.values()])
    tasks: list[Task] = []
    for learner in mine:
        for path in learners[learner]:
            if path.name in assignment:
                tasks.append(Task(learner, path.name, str(path), str(sources[path.name])))
            else:
                skipped = f"{path.name}: skipped (no instructor notebook of that name)"
                notes.setdefault(learner, []).append(skipped)
    maxima = notebook_maxima({name: sources[name] for name in assignment})
    given = {name: boilerplate(read_notebook(sources[name])) for name in assignment}
    results = grade_tasks(tasks, options, out, progress, resume)
    run = ClassRun(
        mine, assignment, maxima, notes, [(t.learner, t.notebook) for t in tasks],
        _answers(tasks), given, shard,
    )  # fmt: skip
    written = write_class(out, run, results, threshold, roster)
    failed = sum("report" not in result for result in results)
    part = f" (shard {shard[0]}/{shard[1]})" if shard[1] > 1 else ""
    names = ", ".join(path.name for path in written)
    print(f"wrote {names} and feedback/ for {len(mine)} learner(s){part} in {out}", file=progress)
    if failed and warn is not None:
        warn(f"{failed} submission(s) could not be graded: see the notes in {written[0]}")
    return results


def grade_merge(
    folders: Sequence[Path],
    out: Path,
    *,
    threshold: float = THRESHOLD,
    roster: Path | None = None,
    progress: TextIO | None = None,
) -> list[Path]:
    """``grade-merge``: the shards' output folders as one, as if graded in one run."""
    run, results = merge(folders, out)
    written = write_class(out, run, results, threshold, roster)
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
    into ``out`` if given; 1 if a submission could not be graded, else 0."""
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
