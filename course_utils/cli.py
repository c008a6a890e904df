"""Command line: ``python -m course_utils COMMAND`` (``--help`` lists the commands).

The contract of every command:

* bad arguments or input (an unknown option, a malformed value, a file or folder that
  does not exist, a file that cannot be parsed, ``COURSE_DEVICE`` naming no device):
  one line on stderr starting with ``error:``, exit status 2;
* a failure while running (a notebook or check failed, a package is missing, the
  machine refused): one line starting with ``error:``, exit status 1;
* success: exit status 0. No command prints a traceback.
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
from typing import NoReturn

# These import the standard library only: the quick commands start fast.
from course_utils import smi, workload
from course_utils.colab import is_commit, retarget_course, script_at_ref
from course_utils.sandbox import GIB, Limits
from course_utils.site import build_site

PROG = "python -m course_utils"
BAD_INPUT, FAILED = 2, 1  # exit statuses (see the module doc)

# Optional packages a command may import, and the extra of course-utils that brings each.
EXTRAS = {
    **dict.fromkeys(["nbformat", "nbclient", "ipykernel", "jupyter_client"], "notebooks"),
    **dict.fromkeys(["nbconvert", "nbgrader"], "classroom"),
    **dict.fromkeys(["mkdocs", "material", "mkdocs_jupyter"], "site"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a wrong argument gives one line (with where to find help), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Helpers for the course 'Make PyTorch use the GPU'.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    doctor = commands.add_parser("doctor", help="describe this machine for the course")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")

    badges = commands.add_parser(
        "badges",
        help="point Colab badges and setup cells at a repository",
        description="Write every notebook's Colab setup cell: the repository and ref to "
        "install from and the SHA-256 of colab_setup.sh (a script that does not match never "
        "runs). Without --repo or --no-repo, each cell keeps its repository and ref.",
    )
    where = badges.add_mutually_exclusive_group()
    where.add_argument("--repo", help="the repository, as OWNER/NAME")
    where.add_argument(
        "--no-repo", action="store_true", help="point the setup cells at no repository"
    )
    badges.add_argument("--ref", help="best a commit (git checks it by its hash); or a branch/tag")
    badges.add_argument(
        "--branch",
        help="where the badges open the notebooks (default: --ref, or main for a commit)",
    )
    badges.add_argument("--root", type=Path, default=Path("."), help="the course checkout")

    run = commands.add_parser("run-notebooks", help="execute notebooks and write a report")
    run.add_argument("paths", nargs="*", type=Path, default=[Path("notebooks")])
    run.add_argument("--out", type=Path, default=Path("build"), help="output folder")
    run.add_argument(
        "--workload",
        choices=workload.CHOICES,
        default=None,
        help=f"experiment size (default: ${workload.ENV_VAR} or auto)",
    )
    run.add_argument("--cell-timeout", type=int, default=1800, help="seconds per cell")

    smi = commands.add_parser("smi", help="parse or explain nvidia-smi output")
    smi.add_argument("action", choices=("parse", "explain"))
    smi.add_argument("file", help="a file of nvidia-smi output, or - for standard input")
    smi.add_argument("--fields", help="queried fields, comma-separated (for csv,noheader)")
    smi.add_argument(
        "--query",
        choices=("gpu", "compute-apps"),
        help="the query that made a CSV (default: told by its fields)",
    )
    smi.add_argument("--json", action="store_true", help="explain: print the parsed JSON instead")
    advice = commands.add_parser("loader-advice", help="DataLoader settings for this machine")
    advice.add_argument("--json", action="store_true", help="print the advice as JSON")
    ddp = commands.add_parser("ddp-check", help="DDP on N processes == one process, W*B batch")
    ddp.add_argument("--nproc", type=int, default=2, help="processes (default: 2)")
    ddp.add_argument("--steps", type=int, default=4, help="optimizer steps (default: 4)")
    ddp.add_argument("--batch-size", type=int, default=8, help="per process (default: 8)")
    ddp.add_argument("--model", choices=("mlp", "small_cnn"), default="mlp")
    student = commands.add_parser("student", help="write student versions of notebooks")
    student.add_argument("paths", nargs="*", type=Path, default=[Path("notebooks")])
    student.add_argument("--out", type=Path, default=Path("build/student"), help="output folder")

    grade = commands.add_parser("grade", help="score a submitted notebook's exercise checks")
    grade.add_argument("submission", type=Path, nargs="+", help="the learner's .ipynb (or several)")
    grade.add_argument("--source", type=Path, help="instructor notebook or folder (the course's)")
    grade.add_argument("--json", action="store_true", help="print the scores as JSON")
    grade.add_argument("--out", type=Path, help="also write gradebook, checks and feedback here")
    _grading_options(grade)

    site = commands.add_parser(
        "site", help="build the course website from the executed notebooks (make site)"
    )
    site.add_argument(
        "notebooks",
        nargs="?",
        type=Path,
        default=Path("build/notebooks"),
        help="executed notebooks (default: build/notebooks, from make course)",
    )
    site.add_argument("--out", type=Path, default=Path("build/site"), help="output folder")
    site.add_argument(
        "--report", type=Path, default=Path("build/report.html"), help="make course's report"
    )
    site.add_argument("--root", type=Path, default=Path("."), help="the course checkout")

    klass = commands.add_parser("grade-class", help="grade a folder of submissions in parallel")
    klass.add_argument("submissions", type=Path, help="one folder per learner (or nbgrader's)")
    klass.add_argument("--source", type=Path, help="instructor notebooks (the course's)")
    klass.add_argument("--out", type=Path, default=Path("grades"), help="output folder")
    klass.add_argument("--regrade", action="store_true", help="regrade unchanged submissions")
    _grading_options(klass)
    return parser


def _grading_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cell-timeout", type=float, default=120, help="seconds per cell")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for the whole run")
    parser.add_argument("--jobs", type=int, help="submissions at once (default: CPU cores)")
    parser.add_argument(
        "--sandbox",
        choices=("auto", "bwrap", "none"),
        default="auto",
        help="run each submission in bubblewrap (auto: when it works here)",
    )
    parser.add_argument("--memory", type=float, default=4, help="GiB per sandboxed process")
    parser.add_argument("--processes", type=int, default=512, help="processes and threads")


def _doctor(args: argparse.Namespace) -> int:
    from course_utils.env import doctor, format_doctor  # lazy: imports torch

    report = doctor()
    print(json.dumps(report, indent=2, default=str) if args.json else format_doctor(report))
    return 0


def _badges(args: argparse.Namespace) -> int:
    if args.repo and not args.ref:
        raise ValueError("--repo needs --ref: a commit, e.g. --ref $(git rev-parse HEAD)")
    if not args.repo and (args.ref or args.branch):
        raise ValueError("--ref and --branch go with --repo")
    repo = "" if args.no_repo else args.repo
    changes = retarget_course(args.root, repo, args.ref, badge_ref=args.branch)
    cells = f"{changes.setup_cells} setup cell(s)"
    if args.repo:
        print(
            f"{cells} now install from {args.repo}@{args.ref}; {changes.badges} badge(s) "
            f"open the notebooks at {args.repo}@{changes.badge_ref}"
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
    for repo_, ref in sorted(changes.settings):
        where = f"{repo_}@{ref}" if repo_ else "no repository (on Colab they say so)"
        if not args.repo:
            print(f"{cells}: {where}")
        if repo_ and not is_commit(ref):
            print(
                f"note: {ref} is not a commit: the cells check colab_setup.sh by its SHA-256, "
                f"but pip installs whatever {ref} holds when a learner runs them; for a class, "
                "use a commit: --ref $(git rev-parse HEAD)"
            )
    print(
        f"colab_setup.sh SHA-256 {changes.sha256}; files changed: "
        f"{', '.join(changes.files) or 'none'}"
    )
    return 0


def _run_notebooks(args: argparse.Namespace) -> int:
    from course_utils.runner import run_course  # lazy: imports nbclient (notebooks extra)

    failed = run_course(
        args.paths, args.out, workload_name=args.workload, cell_timeout_s=args.cell_timeout
    )
    return 1 if failed else 0


def _smi(args: argparse.Namespace) -> int:
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            text = Path(args.file).read_text(encoding="utf-8", errors="replace")
    except OSError as error:  # no such file, a folder, no permission: bad input
        raise ValueError(f"cannot read {args.file}: {error.strerror or error}") from error
    fields = args.fields.split(",") if args.fields else None
    parsed = smi.parse(text, fields, args.query)  # SmiParseError is a ValueError: bad input
    json_out = args.json or args.action == "parse"
    print(json.dumps(parsed, indent=2) if json_out else smi.explain(parsed))
    return 0


def _loader_advice(args: argparse.Namespace) -> int:
    from course_utils.data import suggest_loader_kwargs  # lazy: imports torch

    advice = suggest_loader_kwargs()
    if args.json:
        payload = {"kwargs": advice.kwargs, "reasons": advice.reasons, "facts": advice.facts}
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(advice)
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
        f"{args.nproc * args.batch_size}; {args.steps} SGD steps of {args.model} (CPU, gloo)"
    )
    print(f"{'equal' if difference <= TOLERANCE else 'DIFFERENT'} within {TOLERANCE:g}")
    print(f"largest parameter difference: {difference:.3g}")
    return 0 if difference <= TOLERANCE else 1


def _student(args: argparse.Namespace) -> int:
    # lazy: imports nbformat (notebooks extra)
    from course_utils.student import make_student_versions

    written = make_student_versions(args.paths, args.out)
    print(f"{len(written)} student notebook(s) written to {args.out}")
    return 0


def _grade(args: argparse.Namespace) -> int:
    """``grade`` and ``grade-class``."""
    # lazy: imports nbclient (notebooks extra)
    from course_utils.gradebook import COURSE_NOTEBOOKS, Options, grade_class, grade_notebooks

    for name in ("cell_timeout", "timeout", "memory"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number, not {value:g}")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, not {args.jobs}")
    if args.processes < 16:
        raise ValueError(
            f"--processes must be at least 16 (a kernel has threads), not {args.processes}"
        )
    limits = Limits(memory_bytes=int(args.memory * GIB), processes=args.processes)
    options = Options(args.cell_timeout, args.timeout, args.sandbox, limits, args.jobs)
    source = args.source or COURSE_NOTEBOOKS
    if args.command == "grade":
        return grade_notebooks(args.submission, source, args.out, options, as_json=args.json)
    grade_class(
        args.submissions,
        source,
        args.out,
        options,
        resume=not args.regrade,
        warn=lambda line: print(f"warning: {line}", file=sys.stderr),
    )
    return 0


def _site(args: argparse.Namespace) -> int:
    if not (args.root / "README.md").is_file():
        raise ValueError(f"no README.md in {args.root}: is --root the course checkout?")
    mkdocs_log = logging.getLogger("mkdocs")  # its warnings (a missing page, a bad link)
    mkdocs_log.addHandler(logging.StreamHandler())
    mkdocs_log.setLevel(logging.WARNING)
    started = time.perf_counter()
    page = build_site(args.root, args.notebooks, args.out, args.report)
    print(f"site built in {time.perf_counter() - started:.1f} s: open {page}")
    return 0


HANDLERS = {
    "doctor": _doctor,
    "badges": _badges,
    "run-notebooks": _run_notebooks,
    "smi": _smi,
    "loader-advice": _loader_advice,
    "ddp-check": _ddp_check,
    "student": _student,
    "grade": _grade,
    "grade-class": _grade,
    "site": _site,
}


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0, 1 or 2: see the module doc)."""
    parser = _parser()
    args = parser.parse_args(argv)  # wrong arguments: one line, exit 2
    command = args.command
    try:
        return HANDLERS[command](args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
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
