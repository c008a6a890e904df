"""Publishing the course for learners (``python -m course_utils publish``).

``.github/workflows/publish.yml`` runs this on every push to ``main``; a test runs the same
steps against a local "origin". It writes one branch of the course's repository, by
default ``colab``, holding only what a learner needs:

* ``notebooks/``: the **student versions** (:mod:`course_utils.instructor.student`: no
  solution, no hidden test; checked again here before anything is committed), or with
  ``--answers`` the full notebooks (the ``solutions`` branch, for self-learners); their
  "Open in Colab" badges open that branch and their setup cells install the course from
  the commit being published (:mod:`course_utils.tooling.colab`); notebooks 02 onwards ask
  Colab for a GPU runtime (01 teaches the menu);
* ``notebooks/{bn,ar,ne}/``: the same notebooks in each language of ``translations/``
  (:mod:`course_utils.tooling.translate`'s build, from the retargeted English notebooks, so each
  one's badge opens its own path on the branch and links the English and the other
  languages), student versions or full like the English ones;
* ``colab_setup.sh`` (the setup cells download it from the commit, but learners read it
  here too), ``README.md``, the pages of ``docs/`` it links to, and the licence, if any.

No file under ``.github/``: GitHub refuses a push made with the workflow's own token
(``GITHUB_TOKEN``) that creates or changes a workflow file, so a branch that copied
``main`` would stop updating at the first workflow change. Each publication is one commit
whose parent is the branch's previous commit (or none, when that one held a ``.github``
folder or the branch is new), so the branch's history never holds a workflow file.
Nothing is pushed when nothing changed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_utils.tooling.colab import retarget_course
from course_utils.tooling.translate import LANGUAGES, build

#: Files of the checkout's top level that a published branch carries (when present).
TOP_FILES = ("README.md", "colab_setup.sh", "LICENSE", "LICENSE.md", "LICENSE.txt")
#: What Colab reads to open a notebook on a GPU runtime (as d2l's Colab export writes it).
COLAB_GPU_METADATA: dict[str, Any] = {"accelerator": "GPU", "colab": {"gpuType": "T4"}}
#: Notebooks numbered below this one open on Colab's default runtime (01 teaches the menu).
FIRST_GPU_NOTEBOOK = 2
#: Text that must not survive in a student version (nbgrader's markers).
ANSWER_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
_BRANCH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]*$")
#: Where the workflow publishes the full notebooks (``--answers``), which the README names.
ANSWERS_BRANCH = "solutions"
#: ``publish(answers_branch=AUTO)``: the answers branch if the remote has one (see there).
AUTO = "auto"


class PublishError(RuntimeError):
    """Publishing failed while running (a refused push, an answer left in a notebook)."""


@dataclass
class Published:
    """What :func:`publish` did."""

    branch: str
    commit: str  # the branch's commit after publishing
    notebooks: int
    pushed: bool  # False: the branch already held exactly these files
    orphan: bool  # True: a new history (new branch, or the old one held .github/)


def asks_for_gpu(name: str) -> bool:
    """Whether the published notebook ``name`` opens on a Colab GPU runtime.

    >>> asks_for_gpu("01_runtime_and_devices.ipynb"), asks_for_gpu("09_transformers.ipynb")
    (False, True)
    """
    number = name.split("_", 1)[0]
    return not number.isdigit() or int(number) >= FIRST_GPU_NOTEBOOK


def answers_left(notebook: dict[str, Any]) -> list[str]:
    """``"cell N: MARKER"`` for every nbgrader answer marker left in ``notebook`` (a parsed
    .ipynb): a student version has none."""
    found = []
    for number, cell in enumerate(notebook.get("cells", []), 1):
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        found += [f"cell {number}: {marker}" for marker in ANSWER_MARKERS if marker in text]
    return found


def stage_branch(
    root: Path,
    out: Path,
    *,
    repo: str,
    ref: str,
    branch: str,
    answers: bool = False,
    answers_branch: str | None = ANSWERS_BRANCH,
) -> list[Path]:
    """Write into the empty folder ``out`` the files of the published branch ``branch``
    (see the module doc), with setup cells pointed at ``repo``/``ref``; return the
    notebooks (the English ones, then each language's). ``answers_branch``: where the
    same repository publishes the answers, or None (the README then says they are not
    published there). ``PublishError`` if a student version still holds an answer marker."""
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no notebooks in {root / 'notebooks'}: is --root a checkout?")
    (out / "notebooks").mkdir(parents=True)
    for name in TOP_FILES:
        if (root / name).is_file():
            shutil.copy2(root / name, out / name)
    if (root / "docs").is_dir():  # the README's links to its pages work on the branch too
        shutil.copytree(root / "docs", out / "docs")
    for path in notebooks:
        shutil.copy2(path, out / "notebooks" / path.name)
    retarget_course(out, repo, ref, badge_ref=branch)
    english = sorted((out / "notebooks").glob("*.ipynb"))
    written = list(english)
    for language in LANGUAGES:  # from the retargeted full notebooks: they carry the badges
        folder = out / "notebooks" / language
        written += sorted(build(language, english, folder, root / "translations"))
    for path in written:
        shown = path.relative_to(out / "notebooks").as_posix()
        if answers:
            notebook = json.loads(path.read_text(encoding="utf-8"))
        else:
            # lazy: nbgrader (classroom extra); the answers branch needs none
            from course_utils.instructor.student import read_notebook, student_version

            notebook = student_version(read_notebook(path))
            left = answers_left(notebook)
            if left:
                raise PublishError(f"{shown}: the student version kept {', '.join(left)}")
        if asks_for_gpu(path.name):
            notebook["metadata"].update(json.loads(json.dumps(COLAB_GPU_METADATA)))
        text = json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        path.write_text(text, encoding="utf-8")
    _add_branch_note(out / "README.md", branch, answers, answers_branch)
    return written


def _add_branch_note(
    readme: Path, branch: str, answers: bool, answers_branch: str | None = ANSWERS_BRANCH
) -> None:
    """A line under the README's badge line saying what this branch is, and for a student
    branch where the answers are (or that they are not published in this repository)."""
    if not readme.is_file():
        return
    lines = readme.read_text(encoding="utf-8").splitlines(keepends=True)
    what = (
        "the notebooks **with** the exercises' answers, for learning on your own"
        if answers
        else "the notebooks ready for Colab, the exercises without their answers"
    )
    where = ""
    if not answers:
        where = (
            f" The `{answers_branch}` branch has them with their answers."
            if answers_branch
            else f" The answers are not published in this repository (the exercises are "
            f"graded): where this README names a `{ANSWERS_BRANCH}` branch, it does not "
            "apply here."
        )
    note = (
        f"\n> This is the `{branch}` branch of the course: {what}. It is written by the "
        "course's publish workflow; the course's source (its package and tests) is on "
        f"`main`.{where}\n"
    )
    at = 3 if len(lines) >= 3 else len(lines)
    readme.write_text("".join([*lines[:at], note, *lines[at:]]), encoding="utf-8")


def _git(root: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    if check and done.returncode != 0:
        message = " ".join((done.stderr or done.stdout).split())[:400]
        raise PublishError(f"git {args[0]} failed: {message}")
    return done.stdout.strip()


def _has_branch(root: Path, remote: str, branch: str) -> bool:
    """Whether ``remote`` has ``branch`` (nothing fetched)."""
    return bool(_git(root, "ls-remote", "--heads", remote, f"refs/heads/{branch}"))


def _previous(root: Path, remote: str, branch: str) -> str | None:
    """The commit the remote's ``branch`` points at (fetched), or None if it has none."""
    listed = _git(root, "ls-remote", "--heads", remote, f"refs/heads/{branch}")
    if not listed:
        return None
    shallow = _git(root, "rev-parse", "--is-shallow-repository") == "true"
    depth = ["--depth=1"] if shallow else []  # actions/checkout's clone is shallow
    _git(root, "fetch", "--quiet", *depth, remote, f"refs/heads/{branch}")
    return _git(root, "rev-parse", "FETCH_HEAD")


def commit_and_push(
    root: Path, files: Path, *, branch: str, message: str, remote: str = "origin"
) -> tuple[str, bool, bool]:
    """Commit the folder ``files`` as the next commit of ``remote``'s ``branch`` (using the
    git repository ``root``) and push it; return (commit, pushed, orphan)."""
    parent = _previous(root, remote, branch)
    orphan = parent is None or bool(_git(root, "ls-tree", "--name-only", parent, ".github"))
    git_dir = _git(root, "rev-parse", "--absolute-git-dir")
    with tempfile.TemporaryDirectory(prefix="course-publish-") as scratch:
        index = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        staging = ("--git-dir", git_dir, "--work-tree", str(files.resolve()))
        _git(files, *staging, "add", "--all", "--force", ".", env=index)
        tree = _git(files, *staging, "write-tree", env=index)
    if parent is not None and not orphan and _git(root, "rev-parse", f"{parent}^{{tree}}") == tree:
        return parent, False, False
    identity = {}
    if not _git(root, "config", "user.email", check=False):
        identity = {
            "GIT_AUTHOR_NAME": "course publisher",
            "GIT_AUTHOR_EMAIL": "course-publisher@users.noreply.github.com",
        }
        identity |= {
            "GIT_COMMITTER_NAME": identity["GIT_AUTHOR_NAME"],
            "GIT_COMMITTER_EMAIL": identity["GIT_AUTHOR_EMAIL"],
        }
    parents = [] if orphan or parent is None else ["-p", parent]
    commit = _git(root, "commit-tree", tree, *parents, "-m", message, env=identity)
    target = f"{commit}:refs/heads/{branch}"
    push = subprocess.run(
        ["git", "-C", str(root), "push", "--quiet", "--force", remote, target],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if push.returncode != 0:
        why = " ".join((push.stderr or push.stdout).split())[:300]
        old = (
            f"; a {branch} branch that an older version of the course wrote holds "
            f".github/workflows: delete it once (git push {remote} --delete {branch})"
            if orphan and parent is not None
            else ""
        )
        raise PublishError(
            f"the push of {branch} to {remote} was refused ({why}); on GitHub: Settings → "
            f"Actions → General → Workflow permissions: Read and write permissions{old}"
        )
    return commit, True, orphan


def publish(
    root: Path,
    *,
    repo: str,
    ref: str,
    branch: str = "colab",
    answers: bool = False,
    remote: str = "origin",
    answers_branch: str | None = AUTO,
) -> Published:
    """Write ``branch`` (see the module doc) from the checkout ``root`` and push it to
    ``remote``: its setup cells install the course from ``repo`` at ``ref`` (best the
    commit being published). ``answers_branch``: where ``remote`` holds the answers, for
    a student branch's README (None: nowhere; :data:`AUTO`: :data:`ANSWERS_BRANCH` if
    ``remote`` has it, as the workflow publishes it; in a two-repository set-up the public
    one has none)."""
    if not _BRANCH.match(branch) or ".." in branch:
        raise ValueError(f"--branch must be a branch name, got {branch!r}")
    if branch in ("main", "master"):
        raise ValueError(f"--branch {branch} would replace the course's source")
    with tempfile.TemporaryDirectory(prefix="course-published-") as scratch:
        files = Path(scratch) / "files"
        if answers_branch == AUTO:
            found = not answers and _has_branch(root, remote, ANSWERS_BRANCH)
            answers_branch = ANSWERS_BRANCH if found else None
        notebooks = stage_branch(root, files, repo=repo, ref=ref, branch=branch,
                                 answers=answers, answers_branch=answers_branch)  # fmt: skip
        kind = "with their answers" if answers else "student versions"
        message = f"The course's notebooks for Colab ({kind}), from {repo}@{ref}"
        commit, pushed, orphan = commit_and_push(
            root, files, branch=branch, message=message, remote=remote
        )
    return Published(branch, commit, len(notebooks), pushed, orphan)
