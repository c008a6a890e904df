"""Colab badges and setup cells, pointed at the repository that hosts the course.

Every notebook opens with a title cell whose third line is its "Open in Colab" badge and a
setup cell (tagged ``colab-setup``, collapsed to a Colab form). On Colab only, the setup
cell downloads ``colab_setup.sh`` from the repository and ref in its form fields and runs
it only if its SHA-256 is the one written beside them. ``python -m course_utils badges``
writes both cells of every notebook from :func:`badge_line` and :func:`setup_cell_source`:
with ``--repo`` and ``--ref`` the form is filled in and the badges open that repository;
without, the committed form: the fields empty (on Colab the cell says in one line what to
type) and, instead of a badge, a line saying how to open the notebook in Colab. The script
takes the repository and ref from the cell, so its hash is the same in every fork.
Everything else in a notebook is kept byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SETUP_TAG = "colab-setup"
SETUP_SCRIPT = "colab_setup.sh"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
DEFAULT_REF = "main"
# Colab shows the cell as a form (its code hidden), JupyterLab collapses its source.
SETUP_CELL_METADATA: dict[str, Any] = {
    "cellView": "form",
    "jupyter": {"source_hidden": True},
    "tags": [SETUP_TAG],
}
# The third line of every title cell until a repository is named (the README's says the
# same with links that GitHub resolves in any fork: README_BADGE_LINE).
UNPUBLISHED_BADGE_LINE = (
    "*Open in Colab:* open this notebook from the course's `colab` branch, where its "
    '"Open in Colab" badge and setup cell are filled in (the exercises without their '
    "answers; the `solutions` branch has them). In Bengali, Arabic and Nepali: "
    "`notebooks/bn/`, `notebooks/ar/` and `notebooks/ne/` on that branch."
)
# The languages the course is translated into (course_utils.tooling.translate.LANGUAGES), in the
# order of the badge line's links.
TRANSLATIONS = {"bn": "বাংলা", "ar": "العربية", "ne": "नेपाली"}
README_BADGE_LINE = (
    "*Open in Colab:* [the notebooks, ready for Colab](../../tree/colab/notebooks) (the "
    "exercises without their answers; [with the answers](../../tree/solutions/notebooks)); "
    "in [বাংলা](../../tree/colab/notebooks/bn), [العربية](../../tree/colab/notebooks/ar) and "
    "[नेपाली](../../tree/colab/notebooks/ne)."
)
# Badge lines of earlier versions, recognised (and replaced) by the badges command.
_OLD_BADGE_LINES = (
    "*Open in Colab:* [the notebooks, ready for Colab](../../tree/colab/notebooks) (the "
    "exercises without their answers; [with the answers](../../tree/solutions/notebooks)).",
    "*Open in Colab:* open this notebook from the course's `colab` branch, where its "
    '"Open in Colab" badge and setup cell are filled in (the exercises without their '
    "answers; the `solutions` branch has them).",
    "*Open in Colab:* the published copy of the course (the `colab` branch that "
    "`.github/workflows/publish.yml` writes) has a one-click badge here; from any copy on "
    "GitHub, open a notebook in Colab with File → Open notebook → GitHub and its address.",
)

_REPO_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_REF_PATTERN = re.compile(r"^[A-Za-z0-9_./-]+$")
_BADGE_URL = re.compile(
    r"https://colab\.research\.google\.com/github/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/blob/"
    r"[A-Za-z0-9_./-]+?/(notebooks/[A-Za-z0-9_.-]+\.ipynb)"
)
_SETTINGS = re.compile(
    r'^COURSE_REPO = "([^"\n]*)"  # @param .*\nCOURSE_REF = "([^"\n]*)"  # @param .*\n'
    r'(?:#.*\n)*SETUP_SHA256 = "([0-9a-f]*)"',
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


def badge_line(repo: str, ref: str, notebook: str, *, readme: bool = False) -> str:
    """The third line of a title cell: the badge that opens ``notebook`` at ``repo``/``ref``
    in Colab, or without a repository :data:`UNPUBLISHED_BADGE_LINE` (the README's:
    :data:`README_BADGE_LINE`, links to the published branches of the fork it is in)."""
    if not repo:
        return README_BADGE_LINE if readme else UNPUBLISHED_BADGE_LINE
    badge = f"[![Open In Colab]({BADGE_IMAGE})]({badge_url(repo, ref, notebook)})"
    if readme:
        return badge
    return badge + "".join(
        f" · [{name}]({badge_url(repo, ref, translated_path(notebook, code))})"
        for code, name in TRANSLATIONS.items()
    )


def translated_path(notebook: str, language: str) -> str:
    """Where the published branch holds ``notebook`` (``notebooks/NAME.ipynb``) in
    ``language``: ``notebooks/LANG/NAME.ipynb``."""
    folder, _, name = notebook.rpartition("/")
    return f"{folder}/{language}/{name}" if folder else f"{language}/{name}"


def translated_badge_line(line: str, language: str, name: str) -> str | None:
    """The badge line of ``name`` in ``language``, from the English notebook's badge line
    ``line``: its badge opens the translated notebook, with links to the English and the
    other languages. None when ``line`` has no badge (the course is not published)."""
    match = _BADGE_URL.search(line)
    if match is None:
        return None
    english = match.group(1)
    prefix = match.group(0)[: -len(english)]
    links = [f"[English]({prefix}{english})"] + [
        f"[{title}]({prefix}{translated_path(english, code)})"
        for code, title in TRANSLATIONS.items()
        if code != language
    ]
    own = f"{prefix}{translated_path(english, language)}"
    return f"[![Open In Colab]({BADGE_IMAGE})]({own}) · " + " · ".join(links)


def is_badge_line(line: str) -> bool:
    """A title cell's (or the README's) badge line, in any form ``badges`` wrote."""
    return _is_badge_line(line)


def setup_cell_source(repo: str, ref: str, sha256: str) -> str:
    """The setup cell of every notebook: a Colab form with the repository (``repo``,
    "" for none: the learner types it) and ``ref`` to install from; on Colab it fetches
    ``colab_setup.sh`` from there and runs it if its SHA-256 is ``sha256``."""
    if repo:
        _check_repo_and_ref(repo, ref)
    elif not _REF_PATTERN.match(ref) or ref.startswith("-") or ".." in ref:
        raise ValueError(f"--ref must be a branch, tag or commit, got {ref!r}")
    if not _is_hex(sha256, 64):
        raise ValueError(f"not a SHA-256 in hex: {sha256!r}")
    return (
        "# @title Course setup: run this cell first (on Colab it installs the course; "
        "elsewhere it does nothing)\n"
        "# @markdown Opened from the course's `colab` branch, the fields are filled in: just run "
        "this cell. Otherwise paste into COURSE_REPO the GitHub repository this notebook comes "
        "from (`OWNER/NAME`, its GitHub address or this page's Colab address; it must be "
        "public) and leave COURSE_REF as it is.\n"
        f'COURSE_REPO = "{repo}"  # @param {{type:"string"}}\n'
        f'COURSE_REF = "{ref}"  # @param {{type:"string"}}\n'
        "# The script at COURSE_REPO/COURSE_REF runs only if its SHA-256 is this one.\n"
        f'SETUP_SHA256 = "{sha256}"\n'
        "import hashlib, os, re, sys, tempfile, urllib.error, urllib.request\n"
        "class CourseSetupError(RuntimeError):  # shown as one line, without a traceback\n"
        "    def _render_traceback_(self):\n"
        "        return [str(self)]\n"
        "# COURSE_SETUP=skip: the course is already here (its GPU record runs the notebooks)\n"
        'if os.environ.get("COURSE_SETUP") != "skip" and (\n'
        '        "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ):\n'
        '    found = re.fullmatch(r"(?:https?://)?(?:www\\.)?(?:github\\.com/|colab\\.research'
        "\\.google\\.com/github/)?([\\w.-]+)/([\\w.-]+?)(?:\\.git)?(?:/(?:blob|tree)/([\\w.-]+)"
        '(?:/[^?#]*)?)?/?(?:[?#].*)?", COURSE_REPO.strip())\n'
        '    COURSE_REF = COURSE_REF.strip() or (found and found[3]) or "main"\n'
        '    if not found or not re.fullmatch(r"[\\w./-]+", COURSE_REF):\n'
        '        raise CourseSetupError("Colab setup: type the GitHub repository this notebook '
        "comes from into COURSE_REPO above (OWNER/NAME, or paste its GitHub or Colab "
        'address), then run this cell again")\n'
        '    COURSE_REPO = f"{found[1]}/{found[2]}"\n'
        '    url = f"https://raw.githubusercontent.com/{COURSE_REPO}/{COURSE_REF}/colab_setup.sh"\n'
        "    try:\n"
        "        script = urllib.request.urlopen(url, timeout=60).read()\n"
        "    except urllib.error.HTTPError as error:\n"
        '        raise CourseSetupError(f"Colab setup: no colab_setup.sh at {url} '
        "(HTTP {error.code}): check "
        "COURSE_REPO (OWNER/NAME: a wrong name?) and COURSE_REF (a branch, tag or commit of it); "
        'a private repository also answers 404: the course must be public") from None\n'
        "    except (urllib.error.URLError, OSError) as error:\n"
        '        raise CourseSetupError(f"Colab setup: could not download {url} ({error}): '
        "is the runtime "
        'connected to the internet? Run this cell again") from None\n'
        "    if hashlib.sha256(script).hexdigest() != SETUP_SHA256:\n"
        '        raise CourseSetupError(f"Colab setup: refused to run {url}: its SHA-256 is '
        "not SETUP_SHA256 "
        "(COURSE_REF must be the commit this notebook was published for: open the notebook "
        "from the course's colab branch, whose fields are filled in)\")\n"
        '    with tempfile.NamedTemporaryFile(suffix="_colab_setup.sh", delete=False) as file:\n'
        "        file.write(script)\n"
        "    !COURSE_REPO={COURSE_REPO} COURSE_REF={COURSE_REF} bash {file.name}\n"
        "    if _exit_code != 0:  # noqa: F821 (IPython sets it after each ! command)\n"
        '        raise CourseSetupError("Colab setup failed: read the messages above")'
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


# --- editing a notebook's JSON text in place: everything else stays byte for byte ----------

_DECODER = json.JSONDecoder()


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _members(text: str, start: int) -> list[tuple[str, int, int]]:
    """(key, start, end) of each value of the JSON object opening at ``text[start]``."""
    found, position = [], _skip_space(text, start + 1)
    while text[position] != "}":
        key, position = _DECODER.raw_decode(text, position)
        position = _skip_space(text, _skip_space(text, position) + 1)  # past the colon
        _, end = _DECODER.raw_decode(text, position)
        found.append((key, position, end))
        position = _skip_space(text, end)
        position = _skip_space(text, position + 1) if text[position] == "," else position
    return found


def _elements(text: str, start: int) -> list[tuple[int, int]]:
    """(start, end) of each element of the JSON array opening at ``text[start]``."""
    found, position = [], _skip_space(text, start + 1)
    while text[position] != "]":
        _, end = _DECODER.raw_decode(text, position)
        found.append((position, end))
        position = _skip_space(text, end)
        position = _skip_space(text, position + 1) if text[position] == "," else position
    return found


def _indent_of(text: str, position: int) -> str:
    """The leading white space of the line holding ``text[position]``."""
    line_start = text.rfind("\n", 0, position) + 1
    line = text[line_start:position]
    return line[: len(line) - len(line.lstrip(" \t"))]


def _dump(value: Any, indent: str) -> str:
    """``value`` as JSON in nbformat's layout (one space per level), nested at ``indent``."""
    text = json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False)
    return text.replace("\n", "\n" + indent)


def _setup_cell(old: dict[str, Any], source: str, cell_id: str) -> dict[str, Any]:
    metadata = {key: value for key, value in old.get("metadata", {}).items() if key != "tags"}
    metadata |= SETUP_CELL_METADATA | {
        "jupyter": {**metadata.get("jupyter", {}), "source_hidden": True}
    }
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": old.get("id", cell_id),
        "metadata": metadata,
        "outputs": [],
        "source": source.splitlines(keepends=True),
    }


def _is_badge_line(line: str) -> bool:
    known = (UNPUBLISHED_BADGE_LINE, README_BADGE_LINE, *_OLD_BADGE_LINES)
    return line.rstrip("\n") in known or bool(_BADGE_URL.search(line))


def _title_lines(path: Path, lines: list[str], badge: str) -> list[str]:
    """The first three lines of the title cell: its title, a blank line, ``badge``."""
    head = [line.rstrip("\n") for line in lines[:3]]
    titles = [line for line in head if line.startswith("# ")]
    badges = [line for line in head if _is_badge_line(line)]
    if len(lines) < 3 or len(titles) != 1 or len(badges) != 1 or "" not in head:
        raise ValueError(
            f"{path.name}: cell 0 must start with its title ('# NN — title'), a blank line "
            f"and the badge line, in any order; found {head!r}"
        )
    return [titles[0] + "\n", "\n", badge + ("\n" if len(lines) > 3 else "")]


def _notebook_text(path: Path, badge: str, setup: str) -> str:
    """The notebook at ``path`` with ``badge`` as its title cell's third line (after the
    title and a blank line) and ``setup`` as cell 1 (inserted if it has none); the rest of
    the file byte for byte."""
    text = path.read_text(encoding="utf-8")
    cells = json.loads(text).get("cells") or []
    if not cells or cells[0].get("cell_type") != "markdown":
        raise ValueError(f"{path.name}: cell 0 must be the title (markdown)")
    stored = cells[0].get("source", "")
    lines = "".join(stored).splitlines(keepends=True)
    first = _title_lines(path, lines, badge)
    tagged = [i for i, c in enumerate(cells) if SETUP_TAG in c.get("metadata", {}).get("tags", [])]
    if tagged not in ([], [1]):
        raise ValueError(f"{path.name}: the {SETUP_TAG} cell must be cell 1 (found: {tagged})")

    cells_at = next(start for key, start, _ in _members(text, 0) if key == "cells")
    spans = _elements(text, cells_at)
    indent = _indent_of(text, spans[0][0])
    new_cell = _dump(_setup_cell(cells[1] if tagged else {}, setup, _new_id(path)), indent)
    edits: list[tuple[int, int, str]] = []  # (start, end, new text), applied back to front
    if tagged:
        edits.append((spans[1][0], spans[1][1], new_cell))
    else:
        edits.append((spans[0][1], spans[0][1], ",\n" + indent + new_cell))
    source_at, source_end = next(
        (start, end) for key, start, end in _members(text, spans[0][0]) if key == "source"
    )
    if isinstance(stored, list) and stored[:3] == lines[:3]:
        for (start, end), line in zip(_elements(text, source_at)[:3], first, strict=True):
            edits.append((start, end, json.dumps(line, ensure_ascii=False)))
    else:  # one string, or lines split otherwise: the source as one string
        whole = "".join(first + lines[3:])
        edits.append((source_at, source_end, json.dumps(whole, ensure_ascii=False)))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _new_id(path: Path) -> str:
    return f"nb{path.stem.split('_')[0]}-colab-setup"


def retarget_course(
    root: Path, repo: str | None, ref: str | None = None, *, badge_ref: str | None = None
) -> BadgeChanges:
    """Write the badge line and the setup cell of every notebook under the checkout
    ``root`` (and the README's badge line), with the SHA-256 of its ``colab_setup.sh``,
    pointed at ``repo``/``ref`` (``repo`` None or "": the committed form, no repository).
    The badges open the notebooks at ``badge_ref`` (default: ``ref``, or ``main`` for a
    commit, whose notebooks predate the new cells)."""
    repo = repo or ""
    if repo or ref:
        _check_repo_and_ref(repo, ref or "")
        badge_ref = badge_ref or (DEFAULT_REF if is_commit(ref or "") else ref)
        _check_repo_and_ref(repo, badge_ref or "")
    ref = ref or DEFAULT_REF
    sha256 = script_sha256(root)
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no notebooks in {root / 'notebooks'}: is --root a checkout?")
    changes = BadgeChanges([], 0, 0, sha256, {(repo, ref)}, badge_ref=badge_ref)
    setup = setup_cell_source(repo, ref, sha256)
    written: dict[Path, str] = {}  # every file checked before any is written
    for path in notebooks:
        own_path = path.resolve().relative_to(root.resolve()).as_posix()
        written[path] = _notebook_text(path, badge_line(repo, badge_ref or "", own_path), setup)
        changes.setup_cells += 1
        changes.badges += bool(repo)
    readme = root / "README.md"
    if readme.exists():
        lines = readme.read_text(encoding="utf-8").splitlines(keepends=True)
        if len(lines) >= 3 and _is_badge_line(lines[2]):
            first = notebooks[0].resolve().relative_to(root.resolve()).as_posix()
            ending = "\n" if lines[2].endswith("\n") else ""
            lines[2] = badge_line(repo, badge_ref or "", first, readme=True) + ending
            written[readme] = "".join(lines)
            changes.badges += bool(repo)
    for path, text in written.items():
        if text != path.read_text(encoding="utf-8"):
            path.write_text(text, encoding="utf-8")
            changes.files.append(path.resolve().relative_to(root.resolve()).as_posix())
    return changes
