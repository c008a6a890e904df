"""Command line: ``python -m course_utils COMMAND`` (``--help`` lists the commands).

The contract of every command:

* bad arguments or input (an unknown option, a malformed value, a file or folder that
  does not exist, a file that cannot be parsed, ``COURSE_DEVICE`` naming no device):
  one line on stderr starting with ``error:``, exit status 2;
* a failure while running (a notebook or check failed, a package is missing, the
  machine refused): one line starting with ``error:``, exit status 1;
* success: exit status 0. No command prints a traceback;
* ``grade-class`` only: exit status 3 when it graded the class but some notebooks handed
  in were matched to no instructor notebook (listed as ``NOT MATCHED``, not scored).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

# These import the standard library only: the quick commands start fast.
from course_utils import smi, workload
from course_utils.instructor.sandbox import Limits
from course_utils.tooling.colab import is_commit, retarget_course, script_at_ref
from course_utils.tooling.site import build_site
from course_utils.units import GIB

PROG = "python -m course_utils"
BAD_INPUT, FAILED, UNMATCHED = 2, 1, 3  # exit statuses (see the module doc)

# Optional packages a command may import, and the extra of course-utils that brings each.
EXTRAS = {
    **dict.fromkeys(["nbformat", "nbclient", "ipykernel", "jupyter_client"], "notebooks"),
    **dict.fromkeys(["nbconvert", "nbgrader", "copydetect"], "classroom"),
    **dict.fromkeys(["mkdocs", "material", "mkdocs_jupyter"], "site"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a wrong argument gives one line (with where to find help), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Helpers for the course 'Make PyTorch use the GPU'.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    json_option: dict[str, Any] = {"action": "store_true", "help": "print JSON"}

    def command(name: str, summary: str, out: str | None = "", **more: Any) -> Any:
        """A command's parser, with ``--out`` (default: ``out``) unless ``out`` is ""."""
        parser = commands.add_parser(name, help=summary, **more)
        if out != "":
            parser.add_argument("--out", type=Path, default=out and Path(out), help="output folder")
        return parser

    doctor = command("doctor", "describe this machine for the course")
    doctor.add_argument("--json", **json_option)
    doctor.add_argument(
        "--require-gpu",
        action="store_true",
        help="fail (exit 1, one line) unless this torch can use a GPU here (make gpu-lane)",
    )
    badges = command(
        "badges",
        "point Colab badges and setup cells at a repository",
        description="Write every notebook's badge line (cell 0's third line) and Colab setup "
        "cell (cell 1) and the README's badge line: the repository and ref to install from "
        "and the SHA-256 of colab_setup.sh (a script that does not match never runs). "
        "Without --repo: the committed form (no repository; on Colab the cell asks for one).",
    )
    where = badges.add_mutually_exclusive_group()
    where.add_argument("--repo", help="the repository, as OWNER/NAME")
    where.add_argument("--no-repo", action="store_true", help="the committed form (the default)")
    badges.add_argument("--ref", help="best a commit (git checks it by its hash); or a branch/tag")
    badges.add_argument("--branch", help="where badges open notebooks (default: --ref, or main)")
    badges.add_argument("--root", type=Path, default=Path("."), help="the course checkout")

    publish = command(
        "publish",
        "write the learners' branch (colab: student versions) and push it",
        None,
        description="Write a branch holding only the notebooks (student versions: no "
        "solution, no hidden test; with --answers the full notebooks), colab_setup.sh and "
        "README.md, their setup cells installing the course from --repo at --ref, and push "
        "it to the remote. The branch never holds a workflow file (GitHub refuses a workflow "
        "token's push that changes one). .github/workflows/publish.yml runs this.",
    )
    publish.add_argument("--repo", required=True, help="the repository, as OWNER/NAME")
    publish.add_argument("--ref", required=True, help="the commit the setup cells install")
    publish.add_argument("--branch", default="colab", help="the branch to write (colab)")
    publish.add_argument(
        "--answers", action="store_true", help="the full notebooks (a solutions branch)"
    )
    publish.add_argument("--remote", default="origin", help="where to push (origin)")
    publish.add_argument(
        "--answers-branch",
        default="auto",
        help="the remote's branch with the answers, which the README names (default: "
        "solutions if the remote has it; none: the answers are not published there)",
    )
    publish.add_argument("--root", type=Path, default=Path("."), help="the course checkout")

    run = command("run-notebooks", "execute notebooks and write a report", "build")
    run.add_argument("paths", nargs="*", type=Path, default=[Path("notebooks")])
    run.add_argument("--workload", choices=workload.CHOICES, help=f"(default: ${workload.ENV_VAR})")
    run.add_argument("--cell-timeout", type=int, default=1800, help="seconds per cell")
    run.add_argument(
        "--reuse",
        action="store_true",
        help="keep executed copies in --out whose notebook, package and workload are unchanged",
    )

    record = command(
        "gpu-record",
        "run the course on this GPU and write the GPU record (JSON)",
        "build/gpu-record",
        description="Run the doctor's --require-gpu check, the GPU probes, the gpu/multigpu "
        "tests and every notebook (full sizes on a GPU of 12 GiB or more) on the torch and GPU "
        "that are here "
        "(nothing installed, no network), most informative notebooks first, and write the "
        "record after each step. Exit 1 if anything failed or a GPU claim did not hold.",
    )
    record.add_argument("paths", nargs="*", type=Path, default=[Path("notebooks")])
    record.add_argument("--budget-s", type=float, default=3600, help="the whole run (3600)")
    record.add_argument("--notebook-timeout-s", type=float, default=900, help="each notebook (900)")
    record.add_argument("--tests", type=Path, default=Path("tests"), help="the tests folder")
    record.add_argument("--no-tests", action="store_true", help="run no tests")
    record.add_argument("--tests-timeout-s", type=float, default=300, help="the tests (300)")
    record.add_argument("--no-probes", action="store_true", help="run no GPU probes")
    record.add_argument(
        "--probes-timeout-s", type=float, default=240, help="the GPU probes, all (240)"
    )
    record.add_argument(
        "--workload", choices=workload.CHOICES, default="auto",
        help="the notebooks' sizes (auto: full only on a GPU of 12 GiB or more)",
    )  # fmt: skip
    record.add_argument(
        "--rehearse", action="store_true",
        help="the whole run without a GPU, GPU-only steps skipped (a record marked sample; "
        "workload small unless --workload)",
    )  # fmt: skip
    record.add_argument(
        "--copy-to", type=Path, metavar="DIR", help="copy the record there after every step"
    )
    record.add_argument("--commit", help="the course's commit, for a copy without .git")
    record.add_argument(
        "--check", action="store_true", help="only check what the run needs (exit 0: ready)"
    )
    record.add_argument(
        "--validate", type=Path, metavar="FILE", help="only check that FILE is a valid record"
    )

    smi = command("smi", "parse or explain nvidia-smi output")
    smi.add_argument("action", choices=("parse", "explain"))
    smi.add_argument("file", help="a file of nvidia-smi output, or - for standard input")
    smi.add_argument("--fields", help="queried fields, comma-separated (for csv,noheader)")
    smi.add_argument("--query", choices=("gpu", "compute-apps"), help="(default: by the fields)")
    smi.add_argument("--json", **json_option)
    ddp = command("ddp-check", "DDP on N processes == one process, W*B batch")
    ddp.add_argument("--nproc", type=int, default=2, help="processes (default: 2)")
    ddp.add_argument("--steps", type=int, default=4, help="optimizer steps (default: 4)")
    ddp.add_argument("--batch-size", type=int, default=8, help="per process (default: 8)")
    ddp.add_argument("--model", choices=("mlp", "small_cnn"), default="mlp")
    student = command("student", "write student versions of notebooks", "build/student")
    student.add_argument("paths", nargs="*", type=Path, default=[Path("notebooks")])
    student.add_argument(
        "--keep", action="store_true", help="leave notebooks already in --out as they are"
    )

    site = command("site", "build the course website from make course's notebooks", "build/site")
    site.add_argument("notebooks", nargs="?", type=Path, default=Path("build/notebooks"))
    site.add_argument("--report", type=Path, default=Path("build/report.html"))
    site.add_argument("--root", type=Path, default=Path("."), help="the course checkout")
    site.add_argument(
        "--answers",
        action="store_true",
        help="keep the exercises' answers (default: student versions, for learners)",
    )

    translate = command(
        "translate",
        "the notebooks in Bengali, Arabic and Nepali: catalogs, coverage, build, check",
        None,
        description="Translations (translations/LANG/NOTEBOOK.po, one entry per markdown "
        "cell): update the catalogs from the English notebooks, report coverage, build the "
        "translated notebooks, check the translations (exit 1 on a problem).",
    )
    translate.add_argument("action", choices=("update", "coverage", "build", "check"))
    translate.add_argument("--lang", help="bn, ar or ne (default: every language; build: one)")
    translate.add_argument("--json", **json_option)
    translate.add_argument("--root", type=Path, default=Path("."), help="the course checkout")

    grade = command("grade", "score a submitted notebook's exercise checks", None)
    grade.add_argument("submission", type=Path, nargs="+", help="the learner's .ipynb (or more)")
    grade.add_argument("--json", **json_option)
    klass = command("grade-class", "grade a folder of submissions in parallel", "grades")
    klass.add_argument(
        "submissions",
        type=Path,
        help="one folder per learner, nbgrader's course folder, or Canvas's submissions "
        "download (the zip, or the folder it unpacks to; needs --roster)",
    )
    klass.add_argument("--regrade", action="store_true", help="regrade unchanged submissions")
    klass.add_argument(
        "--student",
        action="append",
        default=[],
        metavar="LEARNER",
        help="regrade only this learner (repeatable); the others' results are kept",
    )
    klass.add_argument(
        "--submitted-at",
        action="append",
        default=[],
        metavar="[NOTEBOOK=]FILE",
        help="submission times for --due (repeatable): Canvas's submissions API JSON, or a "
        "CSV (learner or ID, submitted_at); NOTEBOOK= for one notebook's assignment",
    )
    klass.add_argument("--shard", help="grade share K of N of the class (K/N), for grade-merge")
    merge = command("grade-merge", "merge grade-class --shard output folders into one", None)
    merge.add_argument("folders", type=Path, nargs="+", help="the shards' --out folders")
    for parser_ in (klass, merge):
        parser_.add_argument(
            "--similarity", type=float, default=0.7, help="report answers alike beyond (0.7)"
        )
        parser_.add_argument("--roster", type=Path, help="a Canvas gradebook export (canvas.csv)")
        parser_.add_argument(
            "--column",
            action="append",
            default=[],
            metavar="NOTEBOOK=COLUMN",
            help="the Canvas column (or assignment id) for a notebook's points; repeatable, "
            "several notebooks may share a column",
        )
        parser_.add_argument(
            "--overrides", type=Path, help="CSV of learner,check,points,comment to apply"
        )
        parser_.add_argument("--late-penalty", help="e.g. 10%%/day (or 10%% once) of the points")
        parser_.add_argument("--late-cap", help="the most a late notebook loses (default 100%%)")
        parser_.add_argument("--due", help="the deadline, ISO 8601 (for --submitted-at times)")
        parser_.add_argument(
            "--missing",
            choices=("0", "blank"),
            default="0",
            help="a notebook not handed in: scores 0 (default), or an empty cell (Canvas: "
            "missing); with --roster every student of it has a row",
        )
    for parser_ in (grade, klass):  # no defaults: the grader's own (Options, Limits)
        parser_.add_argument("--source", type=Path, help="instructor notebook(s) (the course's)")
        parser_.add_argument("--cell-timeout", type=float, help="seconds per cell (default: 120)")
        parser_.add_argument("--timeout", type=float, help="seconds for a run (default: 900)")
        parser_.add_argument("--jobs", type=int, help="submissions at once (default: cores + 1)")
        parser_.add_argument("--sandbox", choices=("auto", "bwrap", "none"), default="auto")
        parser_.add_argument("--memory", type=float, help="GiB per sandboxed process (default: 4)")
        parser_.add_argument("--processes", type=int, help="processes, threads (default: 512)")
    return parser


def _doctor(args: argparse.Namespace) -> int:
    from course_utils.env import doctor, format_doctor  # lazy: imports torch

    if args.require_gpu:
        from course_utils.tooling.gpu_record import require_gpu  # lazy: imports torch

        require_gpu()
    report = doctor()
    print(json.dumps(report, indent=2, default=str) if args.json else format_doctor(report))
    return 0


def _badges(args: argparse.Namespace) -> int:
    if args.repo and not args.ref:
        raise ValueError("--repo needs --ref: a commit, e.g. --ref $(git rev-parse HEAD)")
    if not args.repo and (args.ref or args.branch):
        raise ValueError("--ref and --branch go with --repo")
    changes = retarget_course(args.root, args.repo or "", args.ref, badge_ref=args.branch)
    cells = f"{changes.setup_cells} notebook(s)"
    if not args.repo:
        print(
            f"{cells}: setup cells with an empty COURSE_REPO field (on Colab they say what to "
            "type) and no badge (the committed form; --repo and --ref fill them in)"
        )
    else:
        print(
            f"{cells}: setup cells install from {args.repo}@{args.ref}; {changes.badges} "
            f"badge(s) open the notebooks at {args.repo}@{changes.badge_ref}"
        )
        committed = script_at_ref(args.root, args.ref)
        if committed is None:
            print(
                f"note: {args.ref} is not in this checkout: make sure colab_setup.sh there "
                "has the SHA-256 below, or the cells will refuse it"
            )
        elif hashlib.sha256(committed).hexdigest() != changes.sha256:
            print(
                f"warning: colab_setup.sh at {args.ref} is not this checkout's: the cells "
                "will refuse it; commit and push it, then use that commit as --ref"
            )
        if not is_commit(args.ref):
            print(
                f"note: {args.ref} is not a commit: the cells check colab_setup.sh by its "
                f"SHA-256, but pip installs whatever {args.ref} holds when a learner runs "
                "them; for a class, use a commit: --ref $(git rev-parse HEAD)"
            )
    print(
        f"colab_setup.sh SHA-256 {changes.sha256}; files changed: "
        f"{', '.join(changes.files) or 'none'}"
    )
    return 0


def _publish(args: argparse.Namespace) -> int:
    from course_utils.tooling.publish import publish  # lazy: nbgrader (student versions)

    done = publish(
        args.root,
        repo=args.repo,
        ref=args.ref,
        branch=args.branch,
        answers=args.answers,
        remote=args.remote,
        answers_branch=None if args.answers_branch == "none" else args.answers_branch,
    )
    kind = "with their answers" if args.answers else "student versions"
    if not done.pushed:
        print(f"{args.branch}: unchanged ({done.commit[:12]}), nothing pushed")
    else:
        history = "a new history" if done.orphan else "on top of the previous one"
        print(
            f"{args.branch}: {done.notebooks} notebook(s) ({kind}) installing from "
            f"{args.repo}@{args.ref}, pushed to {args.remote} as {done.commit[:12]} ({history})"
        )
    return 0


def _run_notebooks(args: argparse.Namespace) -> int:
    from course_utils.tooling.runner import run_course  # lazy: imports nbclient (notebooks extra)

    failed = run_course(args.paths, args.out, args.workload, args.cell_timeout, reuse=args.reuse)
    return min(1, failed)


def _gpu_record(args: argparse.Namespace) -> int:
    from course_utils.tooling import gpu_record  # lazy: keeps the other commands' start fast

    limits = {"--budget-s": args.budget_s, "--notebook-timeout-s": args.notebook_timeout_s}
    limits["--tests-timeout-s"] = args.tests_timeout_s
    limits["--probes-timeout-s"] = args.probes_timeout_s
    for name, value in limits.items():
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, not {value:g}")
    if args.validate:
        from course_utils.records import load_record, record_label  # lazy: only --validate

        print(f"a valid GPU record: {record_label(load_record(args.validate))}")
        return 0  # RecordError is a ValueError: one line, exit 2
    if args.check:
        gpu_record.check_ready(args.rehearse)
        print(
            f"gpu-record: ready (every package is here and torch can use a GPU: {sys.executable})"
        )
        return 0
    settings = gpu_record.Settings(
        out=args.out,
        notebooks=args.paths,
        tests=None if args.no_tests else args.tests,
        budget_s=args.budget_s,
        notebook_timeout_s=args.notebook_timeout_s,
        tests_timeout_s=args.tests_timeout_s,
        probes=not args.no_probes,
        probes_timeout_s=args.probes_timeout_s,
        workload="small" if args.rehearse and args.workload == "auto" else args.workload,
        rehearse=args.rehearse,
        copy_to=args.copy_to,
        commit=args.commit,
    )
    path, record = gpu_record.gpu_record(settings)
    print(gpu_record.summary(path, record))
    if record["failures"]:
        problems = record["failures"]
        shown = "; ".join(problems[:3]) + (
            f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        )
        raise RuntimeError(
            f"the GPU record's run failed ({shown}); the record keeps every figure: {path}"
        )
    return 0


def _smi(args: argparse.Namespace) -> int:
    try:
        file = Path(args.file)
        text = sys.stdin.read() if args.file == "-" else file.read_text("utf-8", "replace")
    except OSError as error:  # no such file, a folder, no permission: bad input
        raise ValueError(f"cannot read {args.file}: {error.strerror or error}") from error
    fields = args.fields.split(",") if args.fields else None
    parsed = smi.parse(text, fields, args.query)  # SmiParseError is a ValueError: bad input
    json_out = args.json or args.action == "parse"
    print(json.dumps(parsed, indent=2) if json_out else smi.explain(parsed))
    return 0


def _ddp_check(args: argparse.Namespace) -> int:
    # lazy: imports torch
    from course_utils.distributed import TOLERANCE, RunConfig, equivalence_check

    if args.nproc < 1 or args.steps < 1 or args.batch_size < 1:
        raise ValueError("--nproc, --steps and --batch-size must be at least 1")
    size = args.nproc * args.batch_size * max(1, args.steps // 2)  # two epochs: set_epoch
    config = RunConfig(args.model, steps=args.steps, batch_size=args.batch_size, dataset_size=size)
    difference = equivalence_check(args.nproc, config)
    print(
        f"DDP: {args.nproc} processes x batch {args.batch_size}, one process: batch "
        f"{args.nproc * args.batch_size}; {args.steps} SGD steps of {args.model} (CPU, gloo)\n"
        f"{'equal' if difference <= TOLERANCE else 'DIFFERENT'} within {TOLERANCE:g}\n"
        f"largest parameter difference: {difference:.3g}"
    )
    return 0 if difference <= TOLERANCE else 1


def _student(args: argparse.Namespace) -> int:
    from course_utils.instructor.student import make_student_versions  # lazy: imports nbformat

    written = make_student_versions(args.paths, args.out, keep=args.keep)
    print(f"{len(written)} student notebook(s) written to {args.out}")
    return 0


def _class_outputs(args: argparse.Namespace) -> Any:
    """grade-class's and grade-merge's options for the class's files (bad: ValueError)."""
    from course_utils.instructor.adjust import late_policy  # lazy: imports nbformat
    from course_utils.instructor.canvas import parse_columns  # lazy: imports nbformat
    from course_utils.instructor.gradebook import ClassOutputs  # lazy: imports nbclient

    if not 0 < args.similarity <= 1:
        raise ValueError(f"--similarity must be in (0, 1], not {args.similarity:g}")
    for name in ("roster", "overrides"):
        path = getattr(args, name, None)
        if path is not None and not path.is_file():
            raise ValueError(f"no such {name.replace('_', '-')} file: {path}")
    return ClassOutputs(
        threshold=args.similarity,
        roster=args.roster,
        columns=parse_columns(args.column),
        overrides=args.overrides,
        late=late_policy(args.late_penalty, args.late_cap, args.due),
        missing=args.missing,
    )


def _grade(args: argparse.Namespace) -> int:
    """``grade`` and ``grade-class``."""
    # lazy: imports nbclient (notebooks extra)
    from course_utils.instructor.gradebook import (
        COURSE_NOTEBOOKS,
        Options,
        grade_class,
        grade_notebooks,
    )
    from course_utils.instructor.shards import parse_shard

    for name in ("cell_timeout", "timeout", "memory"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number, not {value:g}")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, not {args.jobs}")
    if args.processes is not None and args.processes < 16:
        raise ValueError(f"--processes must be at least 16 (for a kernel), not {args.processes}")
    limits = {"memory_bytes": args.memory and int(args.memory * GIB), "processes": args.processes}
    times = {"cell_timeout_s": args.cell_timeout, "total_timeout_s": args.timeout}
    options = Options(
        **{key: value for key, value in times.items() if value is not None},
        sandbox=args.sandbox,
        limits=Limits(**{key: value for key, value in limits.items() if value is not None}),
        jobs=args.jobs,
    )
    source = args.source or COURSE_NOTEBOOKS
    if args.command == "grade":
        return grade_notebooks(args.submission, source, args.out, options, as_json=args.json)

    outputs = _class_outputs(args)

    def warn(line: str) -> None:
        print(f"warning: {line}", file=sys.stderr)

    graded = grade_class(
        args.submissions,
        source,
        args.out,
        options,
        resume=not args.regrade,
        warn=warn,
        shard=parse_shard(args.shard) if args.shard else (1, 1),
        whole_source=args.source is not None,
        outputs=outputs,
        students=args.student,
        submitted_at=args.submitted_at,
    )
    return UNMATCHED if graded.unmatched else 0


def _grade_merge(args: argparse.Namespace) -> int:
    from course_utils.instructor.gradebook import grade_merge  # lazy: imports nbclient

    outputs = _class_outputs(args)
    if args.out is None:
        raise ValueError("grade-merge needs --out FOLDER, where the merged class goes")
    for folder in args.folders:
        if not folder.is_dir():
            raise ValueError(f"no such folder: {folder}")
    grade_merge(args.folders, args.out, outputs=outputs)
    return 0


def _translate(args: argparse.Namespace) -> int:
    from course_utils.tooling import translate  # lazy: Babel

    if args.lang is not None and args.lang not in translate.LANGUAGES:
        raise ValueError(f"unknown language {args.lang!r}: one of {', '.join(translate.LANGUAGES)}")
    languages = [args.lang] if args.lang else list(translate.LANGUAGES)
    notebooks = sorted((args.root / "notebooks").glob("*.ipynb"))
    if not notebooks:
        raise ValueError(f"no notebooks in {args.root / 'notebooks'}: is --root the checkout?")
    catalogs = args.root / "translations"
    if args.action == "update":
        updated = translate.update_catalogs(languages, notebooks, catalogs)
        updated += [r for lang in languages for r in translate.update_documents(lang, catalogs)]
        for result in updated:
            if result.added or result.changed or result.removed:
                print(
                    f"{result.path.parent.name}/{result.path.name}: {result.added} new, "
                    f"{result.changed} changed (fuzzy), {result.removed} removed (obsolete)"
                )
        print(f"{len(updated)} catalog(s) in step with the English")
        return 0
    if args.action == "coverage":
        table = translate.coverage(languages, notebooks, catalogs)
        for language, rows in translate.documents_coverage(languages, catalogs).items():
            table[language] += rows
        if args.json:
            print(json.dumps({lang: [vars(r) for r in rows] for lang, rows in table.items()}))
            return 0
        for language, rows in table.items():
            whole = translate.total(rows)
            print(
                f"{language} ({translate.LANGUAGES[language]}): {whole.translated}/"
                f"{whole.total} entries translated ({whole.percent:.0f} %)"
            )
            for row in rows:
                fuzzy = f", {row.fuzzy} fuzzy" if row.fuzzy else ""
                print(f"  {row.notebook}: {row.translated}/{row.total}{fuzzy}")
        return 0
    if args.action == "build":
        if args.lang is None:
            raise ValueError("translate build needs --lang (bn, ar or ne)")
        out = args.out or Path("build") / f"notebooks-{args.lang}"
        written = translate.build(args.lang, notebooks, out, catalogs)
        print(f"{len(written)} notebook(s) in {translate.LANGUAGES[args.lang]} written to {out}")
        return 0
    problems = translate.check_catalogs(languages, notebooks, catalogs)
    problems += translate.check_documents(languages, catalogs)
    for line in problems:
        print(line)
    print(f"{len(problems)} problem(s) in the {', '.join(languages)} catalogs")
    return 1 if problems else 0


def _site(args: argparse.Namespace) -> int:
    if not (args.root / "README.md").is_file():
        raise ValueError(f"no README.md in {args.root}: is --root the course checkout?")
    mkdocs_log = logging.getLogger("mkdocs")  # its warnings (a missing page, a bad link)
    mkdocs_log.addHandler(logging.StreamHandler())
    mkdocs_log.setLevel(logging.WARNING)
    started = time.perf_counter()
    page = build_site(args.root, args.notebooks, args.out, args.report, answers=args.answers)
    print(f"site built in {time.perf_counter() - started:.1f} s: open {page}")
    return 0


HANDLERS = {
    "doctor": _doctor,
    "badges": _badges,
    "publish": _publish,
    "run-notebooks": _run_notebooks,
    "gpu-record": _gpu_record,
    "smi": _smi,
    "ddp-check": _ddp_check,
    "student": _student,
    "grade": _grade,
    "grade-class": _grade,
    "grade-merge": _grade_merge,
    "site": _site,
    "translate": _translate,
}


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0, 1 or 2: see the module doc)."""
    args = _parser().parse_args(argv)  # wrong arguments: one line, exit 2
    command = args.command
    try:
        return HANDLERS[command](args)
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM while grading
        why = f" ({error})" if str(error) else ""
        print(f"error: interrupted{why}: run the same command again to resume", file=sys.stderr)
        return 130
    except ModuleNotFoundError as error:  # an optional package (nbformat, nbgrader...)
        name = (error.name or "").split(".")[0]
        extra = EXTRAS.get(name)
        hint = f": pip install 'course-utils[{extra}]'" if extra else f" ({_one_line(error)})"
        print(f"error: {command} needs the {name or 'a missing'} package{hint}", file=sys.stderr)
        return FAILED
    except (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as error:
        print(f"error: {_one_line(error)}", file=sys.stderr)  # bad arguments or input
        return BAD_INPUT
    except Exception as error:  # a failure while running, whatever it is: never a traceback
        text = _one_line(error)
        if not isinstance(error, OSError | RuntimeError):
            text = f"{type(error).__name__}: {text}"
        print(f"error: {text}", file=sys.stderr)
        return FAILED
