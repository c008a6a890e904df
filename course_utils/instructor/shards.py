"""A class graded on several machines: ``grade-class --shard K/N`` and ``grade-merge``.

Shard K of N grades the learners at positions K-1, K-1+N, K-1+2N, ... of the class's
learners in name order (the order of ``gradebook.csv``): the same share on every machine,
whatever order the scheduler starts the shards in. Each output folder holds ``run.json``,
the record of its share (learners, the assignment and its points, notes, the answer cells
for the similarity report), beside ``results/`` and ``feedback/``. ``grade-merge`` copies
the shards' results and feedback into one folder and writes the class's files from their
records, so that its gradebook equals one run's over the whole class.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from course_utils.instructor.paths import under
from course_utils.instructor.student import InputError

RECORD = "run.json"


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` as ``(K, N)`` with 1 <= K <= N; :class:`ValueError` with one line else."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard takes K/N, such as 2/4, not {text!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"--shard {text}: K must be between 1 and N")
    return k, n


def share(learners: Sequence[str], shard: tuple[int, int]) -> list[str]:
    """The learners of shard K/N (see the module's documentation).

    >>> share(["ann", "bob", "cat", "dan", "eve"], (2, 2))
    ['bob', 'dan']
    """
    k, n = shard
    return [learner for position, learner in enumerate(sorted(learners)) if position % n == k - 1]


@dataclass
class ClassRun:
    """What a class run graded and everything its output files are written from, but
    the results (in ``results/``)."""

    learners: list[str]
    assignment: list[str]
    maxima: dict[str, float]
    notes: dict[str, list[str]] = field(default_factory=dict)
    #: (learner, notebook) of each graded submission
    tasks: list[tuple[str, str]] = field(default_factory=list)
    #: answers[learner][notebook][grade_id]: the learner's answer cells
    answers: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    #: given[notebook][grade_id]: the instructor's code for each exercise
    given: dict[str, dict[str, str]] = field(default_factory=dict)
    shard: tuple[int, int] = (1, 1)
    #: handed[learner][notebook]: the file graded as it (intake.handed_record: name, how, late)
    handed: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    #: unmatched[learner]: notebooks handed in that matched no instructor notebook
    unmatched: dict[str, list[str]] = field(default_factory=dict)

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / RECORD).write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, out: Path) -> ClassRun:
        try:
            data = json.loads((out / RECORD).read_text(encoding="utf-8"))
            data["tasks"] = [tuple(task) for task in data["tasks"]]
            data["shard"] = tuple(data["shard"])
            return cls(**data)
        except FileNotFoundError:
            raise InputError(f"{out} has no {RECORD}: is it a grade-class output folder?") from None
        except (ValueError, TypeError, KeyError) as error:
            raise InputError(f"{out / RECORD} is not a grade-class record ({error})") from None


def read_results(out: Path, tasks: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """The stored result of each task (a missing or broken file: not graded)."""
    results = []
    for learner, notebook in tasks:
        try:
            path = under(out, "results", learner, f"{Path(notebook).stem}.json")
            results.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):  # OutsideOutput is a ValueError too
            error = f"no result in {out} (the shard did not finish: grade it again)"
            results.append({"learner": learner, "notebook": notebook, "error": error})
    return results


def merge(folders: Sequence[Path], out: Path) -> tuple[ClassRun, list[dict[str, Any]]]:
    """The shards' runs as one, their results and feedback copied into ``out``.
    :class:`InputError` when the folders are not the N different shards of one class."""
    runs = [ClassRun.load(folder) for folder in folders]
    counts = {run.shard[1] for run in runs}
    if len(counts) != 1:
        raise InputError(f"the folders come from different splits: N = {sorted(counts)}")
    (n,) = counts
    have = sorted(run.shard[0] for run in runs)
    if have != list(range(1, n + 1)):
        lacking = sorted(set(range(1, n + 1)) - set(have))
        twice = sorted({k for k in have if have.count(k) > 1})
        what = f"missing shard(s) {lacking}" if lacking else f"shard(s) {twice} given twice"
        raise InputError(f"grade-merge needs each of the {n} shards once: {what}")
    if len({json.dumps(run.maxima, sort_keys=True) for run in runs}) != 1:
        raise InputError("the shards were graded against different instructor notebooks")
    merged = ClassRun(
        sorted(learner for run in runs for learner in run.learners),
        runs[0].assignment,
        runs[0].maxima,
        given=runs[0].given,
    )
    results: list[dict[str, Any]] = []
    for folder, run in zip(folders, runs, strict=True):
        merged.notes.update(run.notes)
        merged.answers.update(run.answers)
        merged.handed.update(run.handed)
        merged.unmatched.update(run.unmatched)
        merged.tasks += run.tasks
        results += read_results(folder, run.tasks)
        for part in ("results", "feedback"):
            if (folder / part).is_dir() and folder.resolve() != out.resolve():
                shutil.copytree(folder / part, out / part, dirs_exist_ok=True)
    return merged, results
