"""What a class handed in, whatever its layout, each file matched to an instructor notebook.

Three layouts are read (``grade-class SUBMISSIONS``):

* one folder per learner, ``SUBMISSIONS/LEARNER/*.ipynb`` (also one folder deeper);
* an nbgrader course folder, ``submitted/STUDENT/ASSIGNMENT/*.ipynb``;
* Canvas's submissions download (Assignment → Download Submissions), as the zip itself or
  unpacked: a flat folder of files named ``name[_late]_USERID_FILEID_FILE[-N].ipynb``.
  The user id is looked up in the roster (a Canvas gradebook export, ``--roster``); the
  learner is named by the roster's ``SIS Login ID`` (its ``ID`` when that is empty), as a
  folder per learner would be; ``_late`` is Canvas's own lateness marker.

A handed-in file is matched to an instructor notebook by its name, loosely
(:func:`match_notebook`): Canvas's ``-1``, a browser's `` (1)``, Colab's ``Copy of``, case,
spaces and the learner's own name around the notebook's do not matter. A notebook that
matches nothing (or two notebooks equally) is *unmatched*: reported, never scored 0.

A zip is read as hostile input (:func:`unpack_zip`): only ``.ipynb`` members are written,
under names checked part by part (no absolute path, no ``..``), links are refused, and
the bytes written are counted against caps, whatever the zip's headers say.
"""

from __future__ import annotations

import csv
import re
import shutil
import stat
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from course_utils.instructor import validation
from course_utils.instructor.student import InputError

#: Canvas's name for a file of a submission (an attachment): ``name[_late]_USER_FILE_NAME``.
CANVAS_NAME = re.compile(
    r"^(?P<name>[^_/\\]+?)(?P<late>_late)?_(?P<user>\d+)_(?P<file>\d+)_(?P<filename>.+)$",
    re.IGNORECASE,
)
#: What copies add after a file's name: Canvas's ``-1``, a browser's `` (1)``.
_COPY_SUFFIX = re.compile(r"(?:\s*\(\d+\)|\s*-\s*\d+)+$")
#: What Colab or Drive add before it.
_COPY_PREFIX = re.compile(r"^(?:copy\s+of\s+)+", re.IGNORECASE)

#: Caps on a zip (whatever its headers claim): members, bytes of one file, bytes in all.
MAX_MEMBERS = 50_000
MAX_FILE_BYTES = 256 * 2**20
MAX_TOTAL_BYTES = 8 * 2**30


@dataclass(frozen=True)
class Handed:
    """One notebook a learner handed in, as the instructor notebook it is graded as."""

    learner: str
    notebook: str
    path: Path
    #: The file's name as handed in (a Canvas name keeps its prefix).
    original: str
    #: "" when the name equals the notebook's, else how it was matched.
    how: str = ""
    #: Canvas's ``_late`` marker: True or False; None where there is no marker (folders).
    late: bool | None = None
    #: When it was handed in (from ``--submitted-at``), or None.
    submitted_at: datetime | None = None


@dataclass
class Intake:
    """A class's submissions: what is graded, and what was handed in but is not."""

    layout: str
    #: learner -> instructor notebook -> what is graded as it
    handed: dict[str, dict[str, Handed]] = field(default_factory=dict)
    #: learner -> notebook files handed in that match no instructor notebook (or two)
    unmatched: dict[str, list[str]] = field(default_factory=dict)
    #: learner -> notes on what else was there (a second copy, a file that is no notebook)
    notes: dict[str, list[str]] = field(default_factory=dict)
    #: what was refused or ignored outside any learner (a link, a file Canvas did not name)
    ignored: list[str] = field(default_factory=list)

    def note(self, learner: str, text: str) -> None:
        self.notes.setdefault(learner, []).append(text)


def _words(stem: str) -> list[str]:
    """A name's words, lower case, numbers without leading zeros: ``01_Data Loading`` →
    ``['1', 'data', 'loading']``."""
    words = re.sub(r"[^0-9a-z]+", " ", stem.lower()).split()
    return [str(int(word)) if word.isdigit() else word for word in words]


def _contains(words: list[str], part: list[str]) -> bool:
    return any(words[i : i + len(part)] == part for i in range(len(words) - len(part) + 1))


def match_notebook(filename: str, notebooks: list[str]) -> tuple[str | None, str]:
    """The instructor notebook a handed-in file is, and how it was recognised ("" when
    its name is the notebook's); ``(None, why)`` when none is, or two are equally.

    >>> match_notebook("03_Data_Loading (1).ipynb", ["03_data_loading.ipynb"])
    ('03_data_loading.ipynb', 'name matched loosely')
    >>> match_notebook("Untitled.ipynb", ["03_data_loading.ipynb"])
    (None, 'no instructor notebook has a name like it')
    """
    if filename in notebooks:
        return filename, ""
    stem = _COPY_PREFIX.sub("", _COPY_SUFFIX.sub("", Path(filename).stem.strip())).strip()
    words = _words(stem)
    names = {notebook: _words(Path(notebook).stem) for notebook in notebooks}
    same = [notebook for notebook, name in names.items() if name == words]
    if len(same) == 1:
        return same[0], "name matched loosely"
    inside = [notebook for notebook, name in names.items() if name and _contains(words, name)]
    longest = max((len(names[notebook]) for notebook in inside), default=0)
    best = [notebook for notebook in inside if len(names[notebook]) == longest]
    if len(best) == 1:
        return best[0], "name found inside the file's name"
    if best:
        return None, f"its name is like several instructor notebooks ({', '.join(best)})"
    return None, "no instructor notebook has a name like it"


def _safe_member(name: str) -> PurePosixPath | None:
    """A zip member's path, if it is a relative path that stays inside the folder."""
    path = PurePosixPath(name.replace("\\", "/"))
    parts = [part for part in path.parts if part not in ("", ".")]
    if not parts or path.is_absolute() or any(part == ".." or ":" in part for part in parts):
        return None
    return PurePosixPath(*parts)


def unpack_zip(
    archive: Path,
    dest: Path,
    *,
    max_members: int = MAX_MEMBERS,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
) -> list[str]:
    """Write the zip's notebooks into ``dest`` (emptied first); return notes on what was
    left out. :class:`InputError` for a file that is not a zip, too many members, or more
    bytes than the caps (a zip bomb)."""
    try:
        with zipfile.ZipFile(archive) as zipped:
            members = zipped.infolist()
            if len(members) > max_members:
                raise InputError(f"{archive} has {len(members)} files, more than {max_members}")
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            notes: list[str] = []
            total = 0
            written: set[str] = set()
            for member in members:
                if member.is_dir():
                    continue
                path = _safe_member(member.filename)
                mode = member.external_attr >> 16
                if path is None:
                    notes.append(f"{member.filename}: refused (a path outside the folder)")
                elif stat.S_ISLNK(mode):
                    notes.append(f"{member.filename}: refused (a symbolic link)")
                elif path.suffix.lower() != ".ipynb" or path.name.startswith("."):
                    notes.append(f"{member.filename}: ignored (not a notebook)")
                elif member.flag_bits & 0x1:
                    notes.append(f"{member.filename}: ignored (encrypted)")
                elif str(path).lower() in written:
                    notes.append(f"{member.filename}: ignored (a second file of that name)")
                else:
                    written.add(str(path).lower())
                    total += _copy_member(zipped, member, dest / path, max_file_bytes,
                                          max_total_bytes - total)  # fmt: skip
    except zipfile.BadZipFile as error:
        raise InputError(f"{archive} is not a zip file Canvas wrote ({error})") from None
    except (OSError, RuntimeError, NotImplementedError) as error:  # unsupported compression
        raise InputError(f"cannot read {archive}: {error}") from None
    return notes


def _copy_member(
    zipped: zipfile.ZipFile, member: zipfile.ZipInfo, target: Path, most: int, left: int
) -> int:
    """Copy one member, counting the bytes it really inflates to; return that count."""
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with zipped.open(member) as source, target.open("wb") as sink:
        while chunk := source.read(1 << 20):
            count += len(chunk)
            if count > most or count > left:
                sink.close()
                target.unlink()
                what = "one file" if count > most else "the whole download"
                raise InputError(
                    f"{member.filename} inflates past the cap for {what}: a zip bomb, or "
                    "not a download of notebooks"
                )
            sink.write(chunk)
    return count


def is_canvas_download(folder: Path) -> bool:
    """Whether a folder is Canvas's flat download: notebooks at its top, named by Canvas."""
    files = [p for p in folder.iterdir() if p.suffix.lower() == ".ipynb"]
    return any(CANVAS_NAME.match(path.name) for path in files)


def read_times(path: Path) -> dict[str, datetime]:
    """``--submitted-at``: when each learner handed in, from a CSV with a learner column
    (``learner``, ``ID``, ``user_id`` or ``SIS Login ID``) and ``submitted_at`` (ISO 8601,
    as Canvas's API gives it; no time zone: UTC). By every identifier given."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as file:
            rows = list(csv.DictReader(file))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise InputError(f"cannot read {path}: {error}") from None
    keys = ("learner", "ID", "user_id", "SIS Login ID")
    if not rows or "submitted_at" not in rows[0] or not set(keys) & set(rows[0]):
        raise InputError(f"{path} needs a submitted_at column and one of {', '.join(keys)}")
    times: dict[str, datetime] = {}
    for number, row in enumerate(rows, 2):
        text = (row.get("submitted_at") or "").strip()
        if not text:
            continue
        when = parse_time(text, f"{path}, line {number}")
        for key in keys:
            if row.get(key):
                times[row[key].strip()] = when
    return times


def parse_time(text: str, where: str) -> datetime:
    """An ISO 8601 time (``Z`` allowed); without a time zone, UTC."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"{where}: {text!r} is not a time like 2026-12-01T23:59:00Z") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def learner_folders(root: Path, notes: dict[str, list[str]] | None = None) -> dict[str, list[Path]]:
    """Each learner's notebooks: ``root/LEARNER/*.ipynb``, also one folder deeper
    (``LEARNER/ASSIGNMENT/``). An nbgrader course folder is recognised by its
    ``nbgrader_config.py`` (a file of the instructor's, never by a folder name a learner
    could choose): its ``submitted/STUDENT/ASSIGNMENT/`` is read. Symbolic links, files
    that leave the learner's folder, files too big or too deeply nested to read, and a
    notebook handed in twice under one name are refused and said in ``notes`` (by
    learner); a file that is merely broken stays (its row says why)."""
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
    return learners


def _canvas_files(
    folder: Path, students: dict[str, dict[str, str]], intake: Intake
) -> dict[str, list[tuple[Path, str, bool]]]:
    """The Canvas download's notebooks by learner: (path, file name, late)."""
    by_id = {row["ID"]: row for row in students.values() if row.get("ID")}
    learners: dict[str, list[tuple[Path, str, bool]]] = {}
    unknown: list[tuple[int, str]] = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix.lower() != ".ipynb":
            if path.name[:1] != ".":
                intake.ignored.append(f"{path.name}: ignored (not a notebook)")
            continue
        name = CANVAS_NAME.match(path.name)
        if name is None:
            intake.ignored.append(f"{path.name}: not named as Canvas names a submission")
            continue
        row = by_id.get(name["user"])
        if row is None:
            unknown.append((int(name["user"]), f"{name['user']} ({name['name']})"))
            continue
        learner = row.get("SIS Login ID") or row["ID"]
        learners.setdefault(learner, []).append((path, name["filename"], bool(name["late"])))
    if unknown:
        raise InputError(
            "the roster has no student with the Canvas user id "
            f"{', '.join(text for _, text in sorted(set(unknown)))}: "
            "export the gradebook again (Grades → Export) after the last enrolment"
        )
    return learners


def _time_of(
    learner: str, times: dict[str, datetime], students: dict[str, dict[str, str]]
) -> datetime | None:
    """When a learner handed in, by any of their identifiers."""
    row = students.get(learner, {})
    keys = [learner, *(row.get(key, "") for key in ("ID", "SIS User ID", "SIS Login ID"))]
    return next((times[key] for key in keys if key and key in times), None)


def collect(
    submissions: Path,
    notebooks: list[str],
    unpacked: Path,
    students: dict[str, dict[str, str]] | None = None,
    times: dict[str, datetime] | None = None,
) -> Intake:
    """Read what the class handed in (see the module's documentation), a zip unpacked into
    ``unpacked``; ``students``: the roster by identifier (needed for a Canvas download);
    ``times``: when each learner handed in. :class:`InputError` for a missing folder, a
    bad zip, a Canvas download without a roster, or nothing to grade."""
    if submissions.is_file() and zipfile.is_zipfile(submissions):
        notes = unpack_zip(submissions, unpacked)
        folder = unpacked
    elif submissions.is_dir():
        notes, folder = [], submissions
    else:
        raise InputError(f"no such folder or zip: {submissions}")
    canvas = is_canvas_download(folder)
    intake = Intake("canvas" if canvas else "folders", ignored=notes)
    files: dict[str, list[tuple[Path, str, bool | None]]] = {}
    if canvas:
        if not students:
            raise InputError(
                "a Canvas download names learners by their Canvas user id: pass --roster "
                "(the course's gradebook, Grades → Export)"
            )
        files.update(_canvas_files(folder, students, intake))  # type: ignore[arg-type]
    else:
        for learner, paths in learner_folders(folder, intake.notes).items():
            files[learner] = [(path, path.name, None) for path in paths]
    for learner in sorted(files):
        candidates: dict[str, list[tuple[str, Handed]]] = {}
        for path, filename, late in files[learner]:
            if path.is_symlink():
                intake.note(learner, f"{filename}: refused (a symbolic link)")
                continue
            notebook, how = match_notebook(filename, notebooks)
            if notebook is None:
                intake.unmatched.setdefault(learner, []).append(filename)
                intake.note(learner, f"{filename}: skipped ({how})")
                continue
            when = _time_of(learner, times or {}, students or {})
            handed = Handed(learner, notebook, path, path.name, how, late, when)
            candidates.setdefault(notebook, []).append((how, handed))
        for notebook, found in candidates.items():
            found.sort(key=lambda pair: (pair[0] != "", pair[1].original))
            exact = [handed for how, handed in found if how == ""]
            if len(found) > 1 and len(exact) != 1:  # two copies, neither named exactly
                names = ", ".join(handed.original for _, handed in found)
                intake.unmatched.setdefault(learner, []).extend(h.original for _, h in found)
                intake.note(learner, f"{names}: not graded: several files could be {notebook}")
                continue
            chosen = found[0][1]
            intake.handed.setdefault(learner, {})[notebook] = chosen
            for _, other in found[1:]:
                intake.note(learner, f"{other.original}: not graded: {chosen.original} is "
                                     f"{notebook}")  # fmt: skip
    if not intake.handed and not intake.unmatched:
        raise InputError(
            f"no submissions in {submissions}: expected LEARNER/NOTEBOOK.ipynb folders, "
            "nbgrader's submitted/STUDENT/ASSIGNMENT/, or Canvas's submissions download"
        )
    return intake


def handed_record(handed: Handed) -> dict[str, Any]:
    """What ``run.json`` and ``submissions.csv`` keep of a handed-in notebook."""
    return {
        "file": handed.original,
        "how": handed.how,
        "late": handed.late,
        "submitted_at": handed.submitted_at.isoformat() if handed.submitted_at else None,
    }
