"""Command line: ``python -m course_utils COMMAND``.

Commands:
  doctor         describe this machine for the course (``--json`` for JSON)
  badges         point the Colab badges and setup cells at a fork
  run-notebooks  execute notebooks headlessly and write build/report.html (``make course``)
  student        write student versions of the notebooks (``make student``)
  grade          run a submitted notebook on the CPU and score its exercise checks

Wrong arguments print the usage and exit 2; other problems print one line starting with
``error:`` and exit 1. No command prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from course_utils import workload


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils",
        description="Helpers for the course 'Make PyTorch use the GPU'.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    doctor = commands.add_parser("doctor", help="describe this machine for the course")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")

    badges = commands.add_parser("badges", help="point Colab badges and setup cells at a fork")
    badges.add_argument("--repo", required=True, help="the fork, as OWNER/NAME")
    badges.add_argument("--ref", default="main", help="branch, tag or commit (default: main)")
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

    student = commands.add_parser("student", help="write student versions of notebooks")
    student.add_argument("paths", nargs="*", type=Path, default=[Path("notebooks")])
    student.add_argument("--out", type=Path, default=Path("build/student"), help="output folder")

    grade = commands.add_parser("grade", help="score a submitted notebook's exercise checks")
    grade.add_argument("submission", type=Path, help="the learner's .ipynb")
    grade.add_argument("--source", type=Path, help="instructor notebook (default: same name)")
    grade.add_argument("--json", action="store_true", help="print the scores as JSON")
    grade.add_argument("--cell-timeout", type=float, default=120, help="seconds per cell")
    grade.add_argument("--timeout", type=float, default=900, help="seconds for the whole run")
    return parser


def _doctor(args: argparse.Namespace) -> int:
    from course_utils.env import doctor, format_doctor

    report = doctor()
    print(json.dumps(report, indent=2, default=str) if args.json else format_doctor(report))
    return 0


def _badges(args: argparse.Namespace) -> int:
    from course_utils.colab import retarget_course

    changes = retarget_course(args.root, args.repo, args.ref)
    print(
        f"{changes.badges} badge(s) and {changes.setup_cells} setup cell(s) now point at "
        f"{args.repo}@{args.ref}; files changed: {', '.join(changes.files) or 'none'}"
    )
    return 0


def _run_notebooks(args: argparse.Namespace) -> int:
    from course_utils.runner import run_course

    failed = run_course(
        args.paths, args.out, workload_name=args.workload, cell_timeout_s=args.cell_timeout
    )
    return 1 if failed else 0


def _student(args: argparse.Namespace) -> int:
    from course_utils.student import make_student_versions

    written = make_student_versions(args.paths, args.out)
    print(f"{len(written)} student notebook(s) written to {args.out}")
    return 0


def _grade(args: argparse.Namespace) -> int:
    from course_utils.grading import main_grade

    return main_grade(
        args.submission,
        args.source,
        as_json=args.json,
        cell_timeout_s=args.cell_timeout,
        total_timeout_s=args.timeout,
    )


HANDLERS = {
    "doctor": _doctor,
    "badges": _badges,
    "run-notebooks": _run_notebooks,
    "student": _student,
    "grade": _grade,
}


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)  # exits 2 with the usage on wrong arguments
    try:
        return HANDLERS[args.command](args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"error: {message}", file=sys.stderr)
        return 1
