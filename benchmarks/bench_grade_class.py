"""How long grade-class takes for a class of generated submissions, sequentially
(``--jobs 1``) and in parallel (the default ``--jobs``: one more than the CPU cores), in
one run, with the grader's protections on (every check decided by the grader's checker;
the third observes the answer in a child forked from the learner's runtime).

The class: CLASS_SIZE learners, one notebook each, against a generated instructor notebook
with three exercises that use torch (as the course's do): solved, unsolved, half solved,
and one in five re-saved without its nbgrader metadata (found by content). Every
submission runs in its own kernel, sandboxed with bubblewrap when it works here. The runs
alternate (sequential, parallel, sequential, parallel) and the figures are medians; the
load average before and after is recorded, and the share of the machine's CPU time left
idle during each run: other work on the machine (none idle during a sequential run) caps
what a parallel run can gain. Ideal speed-up: the number of cores; what this machine's
cores give at most is measured too (``cpu_scaling_ceiling``: a pure-Python loop in one
process per core at once against one process alone; on a virtual machine whose cores
share a physical core or a busy host it is well under the number of cores), and the
speed-up is also reported as a share of it. Writes grade_class.json.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

import nbformat
from common import parse_out, write_figures

from course_utils.env import measured_on
from course_utils.instructor.gradebook import Options, cpu_count, default_jobs, grade_class
from course_utils.instructor.sandbox import unavailable_reason
from course_utils.instructor.student import student_version, write_notebook

# BENCH_CLASS_SIZE and BENCH_ROUNDS make a shorter run (the figures say which was run)
CLASS_SIZE = int(os.environ.get("BENCH_CLASS_SIZE", "20"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))  # pairs of (sequential, parallel)

EXERCISES = [
    (
        "def scale(x, k):\n    ### BEGIN SOLUTION\n    return x * k\n    ### END SOLUTION",
        "import torch\nfrom course_utils.checks.core import check_close, passed\n"
        "check_close(scale(torch.ones(3), 2.0), torch.full((3,), 2.0), 'scale')\n"
        "### BEGIN HIDDEN TESTS\ncheck_close(scale(torch.arange(4.0), -1), -torch.arange(4.0),"
        " 'scale')\n### END HIDDEN TESTS\npassed('scale')",
    ),
    (
        "def matmul_sum(a, b):\n    ### BEGIN SOLUTION\n    return (a @ b).sum()\n"
        "    ### END SOLUTION",
        "import torch\nfrom course_utils.checks.core import check_close, passed\n"
        "a = torch.randn(64, 64)\ncheck_close(matmul_sum(a, a.T), (a @ a.T).sum(), 'the sum',"
        " rtol=1e-4)\npassed('matmul_sum')",
    ),
    (
        "def count_params(model):\n    ### BEGIN SOLUTION\n"
        "    return sum(p.numel() for p in model.parameters())\n    ### END SOLUTION",
        # evidence observed with the answer (a child forked from the learner's runtime)
        "import torch\nfrom course_utils.checks.core import check, passed\n"
        "from course_utils.checks.evidence.common import results_of\n"
        "[seen] = results_of(count_params, [((torch.nn.Linear(10, 5),), {})])\n"
        "check(seen['returned'] == 55, 'Linear(10, 5) has 55')\npassed('count_params')",
    ),
]


def instructor() -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    notebook.cells.append(nbformat.v4.new_markdown_cell("# Generated exercises"))
    for number, (solution, check) in enumerate(EXERCISES, 1):
        notebook.cells.append(nbformat.v4.new_markdown_cell(f"## Exercise {number}"))
        base = {"schema_version": 3, "task": False, "grade_id": f"b-{number}"}
        notebook.cells.append(
            nbformat.v4.new_code_cell(
                solution,
                metadata={"nbgrader": {**base, "solution": True, "grade": False, "locked": False}},
            )
        )
        notebook.cells.append(
            nbformat.v4.new_code_cell(
                check,
                metadata={
                    "nbgrader": {
                        **base,
                        "grade_id": f"b-{number}-check",
                        "solution": False,
                        "grade": True,
                        "locked": True,
                        "points": 1,
                    }
                },
            )
        )
    return notebook


def expected_score() -> float:
    """The class's total score when every submission is graded right (:func:`make_class`:
    solved, unsolved, half solved (the first exercise left), solved, re-saved solved)."""
    per_kind = {0: 3, 1: 0, 2: 2, 3: 3, 4: 3}
    return float(sum(per_kind[number % 5] for number in range(CLASS_SIZE)))


def make_class(root: Path) -> tuple[Path, Path]:
    source = root / "source" / "ex.ipynb"
    write_notebook(instructor(), source)
    solved, unsolved = instructor(), student_version(instructor())
    for number in range(CLASS_SIZE):
        kind = number % 5
        notebook = unsolved if kind == 1 else nbformat.from_dict(solved)
        if kind == 2:  # half solved
            notebook = nbformat.from_dict(solved)
            notebook.cells[2].source = unsolved.cells[2].source
        if kind == 4:  # re-saved without metadata
            notebook = nbformat.from_dict(solved)
            for cell in notebook.cells:
                cell.metadata.pop("nbgrader", None)
        write_notebook(notebook, root / "class" / f"learner{number:02d}" / "ex.ipynb")
    return root / "class", source.parent


def run(klass: Path, source: Path, out: Path, jobs: int) -> tuple[float, float | None, float]:
    """Wall seconds, the share of the machine's CPU time left idle meanwhile, and the
    class's total score."""
    before = _idle_and_total()
    start = time.perf_counter()
    options = Options(jobs=jobs)
    graded = grade_class(klass, source, out, options, resume=False, progress=io.StringIO())
    results = graded.results
    seconds = time.perf_counter() - start
    after = _idle_and_total()
    assert all("report" in result for result in results), results
    idle = None
    if before and after and after[1] > before[1]:
        idle = (after[0] - before[0]) / (after[1] - before[1])
    return seconds, idle, sum(r["report"]["score"] for r in results)


def _spin(_: int = 0) -> float:
    """Seconds a fixed pure-Python loop takes in this process."""
    start, total = time.perf_counter(), 0
    for number in range(20_000_000):
        total += number
    return time.perf_counter() - start


def cpu_scaling_ceiling(cores: int, rounds: int = 3) -> float:
    """How much faster ``cores`` processes finish ``cores`` loops at once than one process
    finishes one (median of ``rounds``): the most any parallel run can gain here."""
    ratios = []
    with multiprocessing.get_context("spawn").Pool(cores) as pool:
        for _ in range(rounds):
            alone = pool.apply(_spin)
            together = max(pool.map(_spin, range(cores)))
            ratios.append(cores * alone / together)
    return statistics.median(ratios)


def _idle_and_total() -> tuple[int, int] | None:
    """Idle and total CPU ticks of the whole machine so far (Linux's /proc/stat)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + fields[4], sum(fields[:8])  # idle + iowait; all but guest time


def main() -> None:
    out = parse_out(__doc__ or "")
    cores, parallel_jobs = cpu_count(), default_jobs()
    load_before = os.getloadavg()
    times: dict[int, list[float]] = {1: [], parallel_jobs: []}
    idle_shares: dict[int, list[float | None]] = {1: [], parallel_jobs: []}
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
        klass, source = make_class(Path(tmp))
        scores = set()
        for round_ in range(ROUNDS):
            for jobs in (1, parallel_jobs):
                seconds, idle, score = run(klass, source, Path(tmp) / f"out{round_}-{jobs}", jobs)
                times[jobs].append(seconds)
                idle_shares[jobs].append(idle)
                scores.add(score)
                print(f"round {round_ + 1}: --jobs {jobs}: {seconds:.1f} s, machine idle {idle}")
    sequential, parallel = statistics.median(times[1]), statistics.median(times[parallel_jobs])
    ceiling = cpu_scaling_ceiling(cores)
    figures = {
        "label": measured_on("cpu"),
        "class_size": CLASS_SIZE,
        "rounds": ROUNDS,
        "cores": cores,
        "parallel_jobs": parallel_jobs,
        "sandbox": "bwrap" if unavailable_reason() is None else "none",
        "sequential_s": times[1],
        "parallel_s": times[parallel_jobs],
        "sequential_median_s": sequential,
        "parallel_median_s": parallel,
        "seconds_per_submission_sequential": sequential / CLASS_SIZE,
        # The machine's CPU time left idle during each run: near 0 during the sequential
        # runs means other work used the second core, so parallel could not gain much.
        "machine_idle_share_sequential": idle_shares[1],
        "machine_idle_share_parallel": idle_shares[parallel_jobs],
        "speed_up": sequential / parallel,
        "cpu_scaling_ceiling": ceiling,
        "speed_up_share_of_ceiling": sequential / parallel / ceiling,
        "parallel_efficiency": sequential / parallel / cores,
        "same_scores_every_run": len(scores) == 1,
        # every solved exercise counts, the observed one too: a class that scores less
        # than this was graded wrong, however fast
        "class_score": sorted(scores),
        "expected_class_score": expected_score(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    for key, value in figures.items():
        print(f"{key}: {value}")
    write_figures(out, "grade_class", figures)
    assert scores == {expected_score()}, f"the class scored {sorted(scores)}"


if __name__ == "__main__":
    main()
