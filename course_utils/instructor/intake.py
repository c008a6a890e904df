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
import hashlib
import re
import shutil
import stat
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from course_utils.instructor import validation
from course_utils.instructor.paths import inside
from course_utils.instructor.student import InputError

#: Canvas's name for a file of a submission (an attachment): ``name[_late]_USER_FILE_NAME``.
CANVAS_NAME = re.compile(
    r"^(?P<name>[^_/\\]+?)(?P<late>_late)?_(?P<user>\d+)_(?P<file>\d+)_(?P<filename>.+)$",
    re.IGNORECASE,
)
#: Canvas's name for a file of an anonymously graded assignment: ``anon_ANONYMOUSID_FILE_NAME``
#: (the submission's ``anonymous_id`` instead of the learner's name and user id).
CANVAS_ANONYMOUS_NAME = re.compile(
    r"^anon_(?P<anonymous>[A-Za-z0-9]+)(?P<late>_late)?_(?P<file>\d+)_(?P<filename>.+)$",
    re.IGNORECASE,
)
#: What copies add after a file's name: Canvas's ``-1``, a browser's `` (1)``.
_COPY_SUFFIX = re.compile(r"(?:\s*\(\d+\)|\s*-\s*\d+)+$")
#: What Colab or Drive add before it.
_COPY_PREFIX = re.compile(r"^(?:copy\s+of\s+)+", re.IGNORECASE)

T = TypeVar("T")

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
                    target = inside(dest, dest / path)
                    try:
                        total += _copy_member(zipped, member, target, max_file_bytes,
                                              max_total_bytes - total)  # fmt: skip
                    except _MemberError as error:  # this member only: a note, not the run
                        target.unlink(missing_ok=True)
                        notes.append(f"{member.filename}{UNPACK_FAILED}{error})")
    except zipfile.BadZipFile as error:
        raise InputError(f"{archive} is not a zip file Canvas wrote ({error})") from None
    except (OSError, RuntimeError, NotImplementedError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {archive}: {error}") from None
    return notes


#: What a note on a member that could not be unpacked says after its name.
UNPACK_FAILED = ": not graded: not unpacked ("


class _MemberError(Exception):
    """One member of a zip cannot be unpacked (too big, broken, lying header)."""


def _copy_member(
    zipped: zipfile.ZipFile, member: zipfile.ZipInfo, target: Path, most: int, left: int
) -> int:
    """Copy one member, counting the bytes it really inflates to (never trusting the
    header's sizes); return that count. :class:`_MemberError` when it inflates past
    ``most`` (one file's cap) or cannot be read (a bad CRC, a header that lies about its
    size, an unsupported compression); :class:`InputError` past ``left`` (the whole
    download's cap)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    try:
        with zipped.open(member) as source, target.open("wb") as sink:
            while chunk := source.read(1 << 20):
                count += len(chunk)
                if count > most:
                    raise _MemberError(
                        f"it inflates past {most / 2**20:.3g} MiB, the cap for one file: a zip "
                        "bomb, or not a notebook"
                    )
                if count > left:
                    sink.close()
                    target.unlink()
                    raise InputError(
                        f"{member.filename} inflates past the cap for the whole download: a "
                        "zip bomb, or not a download of notebooks"
                    )
                sink.write(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as error:
        raise _MemberError(f"it cannot be read from the zip: {error}") from None
    return count


def is_canvas_download(folder: Path) -> bool:
    """Whether a folder is Canvas's flat download: notebooks at its top, named by Canvas
    (anonymous grading's ``anon_`` names too)."""
    files = [p for p in folder.iterdir() if p.suffix.lower() == ".ipynb"]
    names = (CANVAS_NAME, CANVAS_ANONYMOUS_NAME)
    return any(name.match(path.name) for path in files for name in names)


@dataclass
class Times:
    """``--submitted-at``: when each learner handed in, per notebook."""

    #: notebook ("" for every notebook) -> learner identifier -> when
    by_notebook: dict[str, dict[str, datetime]] = field(default_factory=dict)
    #: notebook ("" for every notebook) -> learner identifier -> Canvas's ``late`` (the API's)
    late: dict[str, dict[str, bool]] = field(default_factory=dict)
    #: a submission's ``anonymous_id`` -> its learner's Canvas user id (the API's data)
    anonymous: dict[str, str] = field(default_factory=dict)

    def of(self, notebook: str, keys: list[str]) -> datetime | None:
        """When the learner known by any of ``keys`` handed ``notebook`` in, or None."""
        return _lookup(self.by_notebook, notebook, keys)

    def late_of(self, notebook: str, keys: list[str]) -> bool | None:
        """Whether Canvas's API says that learner's ``notebook`` was late, or None."""
        return _lookup(self.late, notebook, keys)


def _lookup(tables: Mapping[str, Mapping[str, T]], notebook: str, keys: list[str]) -> T | None:
    """The value for ``notebook``'s learner known by any of ``keys`` (else for "")."""
    for table in (tables.get(notebook, {}), tables.get("", {})):
        found = next((table[key] for key in keys if key and key in table), None)
        if found is not None:
            return found
    return None


#: The columns of a CSV of times that name the learner.
_TIME_KEYS = ("learner", "ID", "user_id", "SIS Login ID")


def read_times(specs: list[str], notebooks: list[str]) -> Times:
    """``--submitted-at [NOTEBOOK=]FILE`` (repeatable): when each learner handed in, for
    ``NOTEBOOK`` or, without it, for every notebook. ``FILE`` is the JSON that Canvas's
    submissions API returns for an assignment (``GET /api/v1/courses/:course_id/
    assignments/:assignment_id/submissions``: a list of submission objects with
    ``user_id``, ``submitted_at`` and, for anonymous grading, ``anonymous_id``), or a CSV
    with ``submitted_at`` (ISO 8601; no time zone: UTC), a learner column (``learner``,
    ``ID``, ``user_id`` or ``SIS Login ID``) and optionally ``notebook``."""
    times = Times()
    for spec in specs:
        notebook, path = _time_spec(spec, notebooks)
        try:
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as error:
            raise InputError(f"--submitted-at: cannot read {path}: {error}") from None
        if text.lstrip()[:1] in ("[", "{"):
            rows = _api_rows(text, path, times)
        else:
            rows = _csv_rows(text, path)
        for where, row in rows:
            when = parse_time(row["submitted_at"], where)
            named = row.get("notebook", "").strip()
            target = notebook or (match_notebook(named, notebooks)[0] if named else "")
            if named and target is None:
                raise InputError(f"{where}: {named!r} is no notebook of the assignment")
            table = times.by_notebook.setdefault(target or "", {})
            lates = times.late.setdefault(target or "", {})
            for key in _TIME_KEYS:
                if row.get(key):
                    table[str(row[key]).strip()] = when
                    if isinstance(row.get("late"), bool):
                        lates[str(row[key]).strip()] = bool(row["late"])
    return times


def _time_spec(spec: str, notebooks: list[str]) -> tuple[str, Path]:
    """``[NOTEBOOK=]FILE`` as (the notebook, or "" for every notebook; the file)."""
    if Path(spec).is_file() or "=" not in spec:
        return "", Path(spec)
    name, _, file = spec.partition("=")
    notebook, _ = match_notebook(name.strip() + ".ipynb" * (not name.endswith(".ipynb")),
                                 notebooks)  # fmt: skip
    if notebook is None:
        raise InputError(f"--submitted-at {spec}: {name} is no notebook of the assignment")
    return notebook, Path(file)


def _api_rows(text: str, path: Path, times: Times) -> list[tuple[str, dict[str, Any]]]:
    """The submission objects of Canvas's API (a list, or ``{"submissions": [...]}``) as
    rows; their ``anonymous_id`` → ``user_id`` into ``times``."""
    import json  # lazy: only for this file

    try:
        data = json.loads(text)
    except ValueError as error:
        raise InputError(f"--submitted-at: {path} is not JSON ({error})") from None
    if isinstance(data, dict):
        data = data.get("submissions")
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise InputError(
            f"--submitted-at: {path} is not the submissions API's answer (a list of "
            "submission objects with user_id and submitted_at)"
        )
    rows = []
    for number, item in enumerate(data, 1):
        user = item.get("user_id")
        if user is None:
            raise InputError(f"--submitted-at: {path}, submission {number} has no user_id")
        if item.get("anonymous_id"):
            times.anonymous[str(item["anonymous_id"])] = str(user)
        if item.get("submitted_at"):
            row = {"user_id": str(user), "submitted_at": str(item["submitted_at"])}
            if isinstance(item.get("late"), bool):  # Canvas's own, extensions included
                row["late"] = item["late"]
            rows.append((f"{path}, submission {number}", row))
    return rows


def _csv_rows(text: str, path: Path) -> list[tuple[str, dict[str, Any]]]:
    try:
        rows = list(csv.DictReader(text.splitlines()))
    except csv.Error as error:
        raise InputError(f"--submitted-at: cannot read {path}: {error}") from None
    if not rows or "submitted_at" not in rows[0] or not set(_TIME_KEYS) & set(rows[0]):
        raise InputError(f"{path} needs a submitted_at column and one of {', '.join(_TIME_KEYS)}")
    return [
        (f"{path}, line {number}", row)
        for number, row in enumerate(rows, 2)
        if (row.get("submitted_at") or "").strip()
    ]


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
    folders = sorted(p for p in root.iterdir() if p.name[0] != ".")
    names = _learner_names([folder.name for folder in folders])
    for folder in folders:
        learner = names[folder.name]
        if folder.is_symlink():
            said.setdefault(learner, []).append("refused: the learner's folder is a link")
            continue
        if not folder.is_dir():
            continue
        if learner != folder.name:
            said.setdefault(learner, []).append(
                f"its folder's name is not UTF-8 text: graded as {learner!r} (rename the "
                "folder to match the roster)"
            )
        found = [*folder.glob("*.ipynb"), *folder.glob("[!.]*/*.ipynb")]  # ASSIGNMENT/ too
        kept: dict[str, list[Path]] = {}
        for path in sorted(found):
            why = validation.problem(path, folder)
            if why is not None and "refused" in why:
                said.setdefault(learner, []).append(why)
            else:  # graded, or a row that says why it could not be
                kept.setdefault(path.name, []).append(path)
        notebooks = []
        for name, paths in kept.items():
            if len(paths) > 1:
                where = ", ".join(str(p.relative_to(folder)) for p in paths)
                said.setdefault(learner, []).append(
                    f"{name}: refused: handed in {len(paths)} times ({where}); hand in one"
                )
            else:
                notebooks += paths
        if notebooks:
            learners[learner] = sorted(notebooks)
    return learners


def _learner_names(names: list[str]) -> dict[str, str]:
    """Each folder's name as a learner's: itself, or for a name that is not UTF-8 the name
    with ``?`` for its bad bytes (:func:`validation.readable`), a short hash added if that
    is another folder's name (so the learner's rows can be written as text)."""
    taken = set(names)
    chosen: dict[str, str] = {}
    for name in names:
        shown = validation.readable(name)
        if shown != name and (shown in taken or shown in chosen.values()):
            raw = name.encode("utf-8", "surrogateescape")
            shown = f"{shown}-{hashlib.sha256(raw).hexdigest()[:8]}"
        chosen[name] = shown
    return chosen


def _canvas_files(
    folder: Path, students: dict[str, dict[str, str]], intake: Intake, anonymous: dict[str, str]
) -> dict[str, list[tuple[Path, str, bool]]]:
    """The Canvas download's notebooks by learner: (path, file name, late). An anonymous
    download's ``anon_ID`` is the learner's user id through ``anonymous`` (the submissions
    API's data); without it, the learner is named ``anon_ID``."""
    by_id = {row["ID"]: row for row in students.values() if row.get("ID")}
    learners: dict[str, list[tuple[Path, str, bool]]] = {}
    unknown: list[tuple[int, str]] = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix.lower() != ".ipynb":
            if path.name[:1] != ".":
                intake.ignored.append(f"{validation.readable(path.name)}: ignored (not a notebook)")
            continue
        shown = validation.readable(path.name)
        if shown != path.name:  # not UTF-8: a note for its learner, if the name says who
            why = f"{shown}: refused: its name is not UTF-8 text (rename it, hand it in again)"
            found = CANVAS_NAME.match(shown)
            row = by_id.get(found["user"]) if found else None
            if row is None:
                intake.ignored.append(why)
            else:
                intake.note(row.get("SIS Login ID") or row["ID"], why)
            continue
        name = CANVAS_NAME.match(path.name)
        anon = CANVAS_ANONYMOUS_NAME.match(path.name) if name is None else None
        if anon is not None and anon["anonymous"] not in anonymous:
            learner = f"anon_{anon['anonymous']}"
            learners.setdefault(learner, []).append((path, anon["filename"], bool(anon["late"])))
            continue
        if anon is not None:
            user = anonymous[anon["anonymous"]]
            name = CANVAS_NAME.match(f"{anon['anonymous']}{anon['late'] or ''}_{user}_"
                                     f"{anon['file']}_{anon['filename']}")  # fmt: skip
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


def _notes_to_learners(intake: Intake, canvas: bool, students: dict[str, dict[str, str]]) -> None:
    """A zip member that could not be unpacked is its learner's note (by Canvas's user id
    in its name, or its learner's folder), so that learner gets a row; other notes stay
    the run's."""
    by_id = {row["ID"]: row for row in students.values() if row.get("ID")}
    kept = []
    for line in intake.ignored:
        name = line.split(UNPACK_FAILED)[0] if UNPACK_FAILED in line else None
        learner = None
        if name is not None and canvas:
            found = CANVAS_NAME.match(PurePosixPath(name).name)
            row = by_id.get(found["user"]) if found else None
            learner = (row.get("SIS Login ID") or row["ID"]) if row else None
        elif name is not None and len(PurePosixPath(name).parts) > 1:
            learner = PurePosixPath(name).parts[0]
        if learner:
            intake.note(learner, line)
        else:
            kept.append(line)
    intake.ignored = kept


def _keys_of(learner: str, students: dict[str, dict[str, str]]) -> list[str]:
    """Every identifier of a learner (their name, and the roster's IDs)."""
    row = students.get(learner, {})
    return [learner, *(row.get(key, "") for key in ("ID", "SIS User ID", "SIS Login ID"))]


def collect(
    submissions: Path,
    notebooks: list[str],
    unpacked: Path,
    students: dict[str, dict[str, str]] | None = None,
    times: Times | None = None,
) -> Intake:
    """Read what the class handed in (see the module's documentation), a zip unpacked into
    ``unpacked``; ``students``: the roster by identifier (needed for a Canvas download);
    ``times``: when each learner handed in each notebook (and an anonymous download's
    learners). :class:`InputError` for a missing folder, a bad zip, a Canvas download
    without a roster (or anonymous, with a roster but not the API's data), or nothing to
    grade."""
    times = times or Times()
    if submissions.is_file() and zipfile.is_zipfile(submissions):
        notes = unpack_zip(submissions, unpacked)
        folder = unpacked
    elif submissions.is_dir():
        notes, folder = [], submissions
    else:
        raise InputError(f"no such folder or zip: {submissions}")
    canvas = is_canvas_download(folder)
    intake = Intake("canvas" if canvas else "folders", ignored=notes)
    _notes_to_learners(intake, canvas, students or {})
    files: dict[str, list[tuple[Path, str, bool | None]]] = {}
    if canvas:
        if not students:
            raise InputError(
                "a Canvas download names learners by their Canvas user id: pass --roster "
                "(the course's gradebook, Grades → Export)"
            )
        by_canvas = _canvas_files(folder, students, intake, times.anonymous)
        files.update(by_canvas)  # type: ignore[arg-type]
        hidden = sorted(learner for learner in by_canvas if learner.startswith("anon_"))
        if hidden:
            raise InputError(
                f"an anonymous download ({hidden[0]}...): Canvas's submissions API maps its "
                "anonymous ids to user ids: pass its JSON, --submitted-at submissions.json "
                "(docs/instructor-guide.md, Canvas)"
            )
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
            keys = _keys_of(learner, students or {})
            when = times.of(notebook, keys)
            said = times.late_of(notebook, keys)  # the API's word over the file name's
            handed = Handed(learner, notebook, path, path.name, how,
                            late if said is None else said, when)  # fmt: skip
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
