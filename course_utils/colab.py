"""Colab badges and setup cells, and rewriting them for a fork of the course.

Every notebook starts with an "Open in Colab" badge and a setup cell that, on Colab
only, downloads ``colab_setup.sh`` from the course repository and runs it. Instructors
who fork the course run ``python -m course_utils badges --repo OWNER/NAME [--ref REF]``
to point every badge, every setup cell, the README badge and the defaults in
``colab_setup.sh`` at their fork.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_REPO = "pytorch-gpu-course/course"
DEFAULT_REF = "main"
SETUP_TAG = "colab-setup"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"

_REPO_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_REF_PATTERN = re.compile(r"^[A-Za-z0-9_./-]+$")
_BADGE_URL = re.compile(
    r"https://colab\.research\.google\.com/github/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/blob/"
    r"[A-Za-z0-9_./-]+?/(notebooks/[A-Za-z0-9_.-]+\.ipynb)"
)


def check_repo_and_ref(repo: str, ref: str) -> None:
    """Raise ``ValueError`` unless ``repo`` looks like ``OWNER/NAME`` and ``ref`` like a
    branch, tag or commit."""
    if not _REPO_PATTERN.match(repo):
        raise ValueError(f"--repo must look like OWNER/NAME, got {repo!r}")
    if not _REF_PATTERN.match(ref) or ref.startswith("-") or ".." in ref:
        raise ValueError(f"--ref must be a branch, tag or commit, got {ref!r}")


def badge_url(repo: str, ref: str, notebook: str) -> str:
    """The Colab URL that opens ``notebook`` (a path inside the repository).

    >>> badge_url("me/course", "main", "notebooks/01_x.ipynb")
    'https://colab.research.google.com/github/me/course/blob/main/notebooks/01_x.ipynb'
    """
    return f"https://colab.research.google.com/github/{repo}/blob/{ref}/{notebook}"


def badge_markdown(repo: str, ref: str, notebook: str) -> str:
    """The Markdown of an "Open in Colab" badge."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({badge_url(repo, ref, notebook)})"


def setup_cell_source(repo: str, ref: str) -> str:
    """The first code cell of every notebook: Colab setup on Colab, nothing elsewhere."""
    return (
        "# Colab only: install the course package without touching Colab's torch.\n"
        "# Elsewhere this cell does nothing (use `make lab` or environment.yml locally).\n"
        "# COURSE_REPO and COURSE_REF are set by: python -m course_utils badges\n"
        "import os\n"
        "import sys\n"
        "\n"
        f'COURSE_REPO, COURSE_REF = "{repo}", "{ref}"\n'
        'SETUP_URL = f"https://raw.githubusercontent.com/{COURSE_REPO}/{COURSE_REF}/colab_setup.sh"\n'
        'if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:\n'
        "    !curl -fsSL {SETUP_URL} -o /tmp/colab_setup.sh\n"
        "    !COURSE_REPO={COURSE_REPO} COURSE_REF={COURSE_REF} bash /tmp/colab_setup.sh\n"
        "    if _exit_code != 0:  # noqa: F821 (IPython sets it after each ! command)\n"
        '        raise RuntimeError("Colab setup failed: read the messages above")'
    )


@dataclass
class BadgeChanges:
    """What :func:`retarget_course` changed."""

    files: list[str]
    badges: int
    setup_cells: int


def retarget_notebook(path: Path, repo: str, ref: str, root: Path) -> tuple[int, int]:
    """Point one notebook's badges and setup cell at ``repo``/``ref``; save if changed.

    Returns (badges rewritten, setup cells rewritten). The notebook's own path inside
    the repository is used for its badge, so a renamed notebook gets a right badge.
    """
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    own_path = path.resolve().relative_to(root.resolve()).as_posix()
    badges = setups = 0
    for cell in notebook.get("cells", []):
        source = "".join(cell.get("source", []))
        if cell.get("cell_type") == "markdown":
            new, count = _BADGE_URL.subn(badge_url(repo, ref, own_path), source)
            badges += count
        elif SETUP_TAG in cell.get("metadata", {}).get("tags", []):
            new = setup_cell_source(repo, ref)
            setups += 1
        else:
            continue
        cell["source"] = new.splitlines(keepends=True)
    new_text = json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if new_text != text:
        path.write_text(new_text, encoding="utf-8")
    return badges, setups


def retarget_course(root: Path, repo: str, ref: str) -> BadgeChanges:
    """Rewrite badges and setup cells of every notebook, the README badges and the
    repository defaults in ``colab_setup.sh`` under ``root`` (a checkout of the course).
    """
    check_repo_and_ref(repo, ref)
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no notebooks in {root / 'notebooks'}: is --root a checkout?")
    changes = BadgeChanges([], 0, 0)
    for path in notebooks:
        before = path.read_bytes()
        badges, setups = retarget_notebook(path, repo, ref, root)
        changes.badges += badges
        changes.setup_cells += setups
        if path.read_bytes() != before:
            changes.files.append(str(path.relative_to(root)))
    readme = root / "README.md"
    if readme.exists():
        text = readme.read_text(encoding="utf-8")
        new, count = _BADGE_URL.subn(lambda m: badge_url(repo, ref, m.group(1)), text)
        changes.badges += count
        _save_if_changed(readme, text, new, root, changes)
    script = root / "colab_setup.sh"
    if script.exists():
        text = script.read_text(encoding="utf-8")
        new = re.sub(r'(?m)^DEFAULT_REPO="[^"]*"', f'DEFAULT_REPO="{repo}"', text)
        new = re.sub(r'(?m)^DEFAULT_REF="[^"]*"', f'DEFAULT_REF="{ref}"', new)
        _save_if_changed(script, text, new, root, changes)
    return changes


def _save_if_changed(path: Path, old: str, new: str, root: Path, changes: BadgeChanges) -> None:
    if new != old:
        path.write_text(new, encoding="utf-8")
        changes.files.append(str(path.relative_to(root)))
