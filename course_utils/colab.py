"""Colab badges and setup cells, pointed at the repository that hosts the course.

Each notebook's setup cell, on Colab only, downloads ``colab_setup.sh`` from the
repository and ref written in it by ``python -m course_utils badges`` and runs it only if
its SHA-256 matches the one written beside them. The script takes the repository and ref
from the cell, so its hash is the same in every fork. A copy pointed at no repository
(``COURSE_REPO`` empty: how the course is committed) says so on Colab in one line.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SETUP_TAG = "colab-setup"
SETUP_SCRIPT = "colab_setup.sh"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"

_REPO_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_REF_PATTERN = re.compile(r"^[A-Za-z0-9_./-]+$")
_BADGE_URL = re.compile(
    r"https://colab\.research\.google\.com/github/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/blob/"
    r"[A-Za-z0-9_./-]+?/(notebooks/[A-Za-z0-9_.-]+\.ipynb)"
)
_SETTINGS = re.compile(
    r'^COURSE_REPO, COURSE_REF = "([^"\n]*)", "([^"\n]*)"\nSETUP_SHA256 = "([0-9a-f]*)"$',
    re.MULTILINE,
)


def _check_repo_and_ref(repo: str, ref: str) -> None:
    if not _REPO_PATTERN.match(repo):
        raise ValueError(f"--repo must look like OWNER/NAME, got {repo!r}")
    if not _REF_PATTERN.match(ref) or ref.startswith("-") or ".." in ref:
        raise ValueError(f"--ref must be a branch, tag or commit, got {ref!r}")


def is_commit(ref: str) -> bool:
    """Whether ``ref`` is a full commit hash (git checks a commit's content by it).

    >>> is_commit("main"), is_commit("3f2a" * 10)
    (False, True)
    """
    return _is_hex(ref, 40, 64)


def _is_hex(text: str, *lengths: int) -> bool:
    return len(text) in lengths and all(c in "0123456789abcdef" for c in text)


def script_sha256(root: Path) -> str:
    """The SHA-256 of ``colab_setup.sh`` in the course checkout ``root``."""
    script = root / SETUP_SCRIPT
    if not script.is_file():
        raise FileNotFoundError(f"no {SETUP_SCRIPT} in {root}: is --root a checkout?")
    return hashlib.sha256(script.read_bytes()).hexdigest()


def script_at_ref(root: Path, ref: str) -> bytes | None:
    """``colab_setup.sh`` as committed at ``ref`` in the git checkout ``root``, or None."""
    command = ["git", "-C", str(root), "show", f"{ref}:{SETUP_SCRIPT}"]
    try:
        done = subprocess.run(command, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def badge_url(repo: str, ref: str, notebook: str) -> str:
    """The Colab URL that opens ``notebook`` (a path inside the repository)."""
    return f"https://colab.research.google.com/github/{repo}/blob/{ref}/{notebook}"


def setup_cell_source(repo: str, ref: str, sha256: str) -> str:
    """The first code cell of every notebook: on Colab, fetch ``colab_setup.sh`` from
    ``repo`` at ``ref`` and run it if its SHA-256 is ``sha256`` (no repo and ref: say so)."""
    if bool(repo) != bool(ref):
        raise ValueError("give both a repository and a ref, or neither")
    if repo:
        _check_repo_and_ref(repo, ref)
    if not _is_hex(sha256, 64):
        raise ValueError(f"not a SHA-256 in hex: {sha256!r}")
    return (
        "# Colab only: install the course package without touching Colab's torch.\n"
        "# Elsewhere this cell does nothing (use `make lab` or environment.yml locally).\n"
        "# `python -m course_utils badges` writes the repository and commit to install from\n"
        "# and the SHA-256 of their colab_setup.sh: a script that does not match never runs.\n"
        "import hashlib, os, sys, tempfile, urllib.request\n"
        "\n"
        f'COURSE_REPO, COURSE_REF = "{repo}", "{ref}"\n'
        f'SETUP_SHA256 = "{sha256}"\n'
        'if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:\n'
        "    if not COURSE_REPO:\n"
        '        raise RuntimeError("Colab setup: this copy of the course names no repository'
        ' to install from (see docs/instructor-guide.md)")\n'
        '    url = f"https://raw.githubusercontent.com/{COURSE_REPO}/{COURSE_REF}/colab_setup.sh"\n'
        "    script = urllib.request.urlopen(url, timeout=60).read()\n"
        "    if hashlib.sha256(script).hexdigest() != SETUP_SHA256:\n"
        '        raise RuntimeError(f"Colab setup: refused to run {url}:'
        ' its SHA-256 is not SETUP_SHA256")\n'
        '    with tempfile.NamedTemporaryFile(suffix="_colab_setup.sh", delete=False) as file:\n'
        "        file.write(script)\n"
        "    !COURSE_REPO={COURSE_REPO} COURSE_REF={COURSE_REF} bash {file.name}\n"
        "    if _exit_code != 0:  # noqa: F821 (IPython sets it after each ! command)\n"
        '        raise RuntimeError("Colab setup failed: read the messages above")'
    )


def setup_cell_settings(source: str) -> tuple[str, str, str] | None:
    """(repository, ref, SHA-256) written in a setup cell's source; None if absent."""
    found = _SETTINGS.search(source)
    return (found.group(1), found.group(2), found.group(3)) if found else None


@dataclass
class BadgeChanges:
    """What :func:`retarget_course` changed."""

    files: list[str]
    badges: int
    setup_cells: int
    sha256: str = ""
    settings: set[tuple[str, str]] = field(default_factory=set)  # (repo, ref) in the cells
    badge_ref: str | None = None  # where the badges open the notebooks


def _retarget_notebook(
    path: Path, target: tuple[str, str] | None, root: Path, changes: BadgeChanges
) -> None:
    """Rewrite one notebook's setup cell, and its badges for a repository, counting into
    ``changes``. ``target``: (repository, ref), ("", "") for none, None: the cell's own."""
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    own_path = path.resolve().relative_to(root.resolve()).as_posix()
    for cell in notebook.get("cells", []):
        source = "".join(cell.get("source", []))
        if cell.get("cell_type") == "markdown":
            if not (target and target[0] and changes.badge_ref):
                continue
            url = badge_url(target[0], changes.badge_ref, own_path)
            new, count = _BADGE_URL.subn(url, source)
            changes.badges += count
        elif SETUP_TAG in cell.get("metadata", {}).get("tags", []):
            old = setup_cell_settings(source)
            repo, ref = target if target is not None else (old[:2] if old else ("", ""))
            new = setup_cell_source(repo, ref, changes.sha256)
            changes.settings.add((repo, ref))
            changes.setup_cells += 1
        else:
            continue
        cell["source"] = new.splitlines(keepends=True)
    new_text = json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if new_text != text:
        path.write_text(new_text, encoding="utf-8")
        changes.files.append(str(path.relative_to(root)))


def retarget_course(
    root: Path, repo: str | None, ref: str | None = None, *, badge_ref: str | None = None
) -> BadgeChanges:
    """Write every notebook's setup cell under the checkout ``root`` with the SHA-256 of
    its ``colab_setup.sh``, pointed at ``repo``/``ref`` (``repo`` None: each cell's own;
    "": none). For a repository, the notebooks' and README's badges open the notebooks at
    ``badge_ref`` (default: ``ref``, or ``main`` for a commit, whose notebooks predate the
    new cells)."""
    target: tuple[str, str] | None = None
    if repo is not None:
        target = (repo, ref or "")
        if repo or ref:
            _check_repo_and_ref(repo, ref or "")
            badge_ref = badge_ref or ("main" if is_commit(ref or "") else ref)
            _check_repo_and_ref(repo, badge_ref or "")
    sha256 = script_sha256(root)
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no notebooks in {root / 'notebooks'}: is --root a checkout?")
    changes = BadgeChanges([], 0, 0, sha256, badge_ref=badge_ref)
    for path in notebooks:
        _retarget_notebook(path, target, root, changes)
    readme = root / "README.md"
    if repo and badge_ref and readme.exists():
        text = readme.read_text(encoding="utf-8")
        new, count = _BADGE_URL.subn(lambda m: badge_url(repo, badge_ref, m.group(1)), text)
        changes.badges += count
        if new != text:
            readme.write_text(new, encoding="utf-8")
            changes.files.append(str(readme.relative_to(root)))
    return changes
