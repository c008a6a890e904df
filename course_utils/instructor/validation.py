"""What a class run accepts from a learner's folder, and how learner text reaches a CSV.

A submission is a regular file inside its learner's folder (no symbolic link, no path that
leaves the folder), at most :data:`MAX_BYTES`, JSON nested at most :data:`MAX_DEPTH`
deep, whose cells' ``metadata`` and ``nbgrader`` metadata are objects: anything else gets
one line saying why and is not graded, and the rest of the class is. :func:`cell` makes
text safe for a spreadsheet: a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
carriage return is a formula in Excel, LibreOffice or Google Sheets (formula injection),
so it gets a leading apostrophe, except a plain number in a numeric column.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

MAX_BYTES = 50 * 2**20  # a notebook's size
MAX_DEPTH = 64  # JSON nesting (the course's notebooks use about 8)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def cell(value: Any, numeric: bool = False) -> Any:
    """``value`` for a CSV cell: text that a spreadsheet would read as a formula gets a
    leading ``'``; a number (or, in a ``numeric`` column, text that is a plain number,
    ``-2.5``) stays as it is.

    >>> cell("=HYPERLINK(1)"), cell("-2.5", numeric=True), cell("-2.5"), cell(-1), cell("ok")
    ("'=HYPERLINK(1)", '-2.5', "'-2.5", -1, 'ok')
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    text = "" if value is None else readable(str(value))  # a name that is not UTF-8 too
    if numeric and _NUMBER.match(text):
        return text
    return "'" + text if text.startswith(_FORMULA_START) else text


def row(values: list[Any], numeric: set[int] = frozenset()) -> list[Any]:  # type: ignore[assignment]
    """A CSV row made safe (:func:`cell`); ``numeric``: the positions of numeric columns."""
    return [cell(value, index in numeric) for index, value in enumerate(values)]


def _depth(text: str) -> int:
    """The deepest nesting of JSON arrays and objects in ``text`` (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def problem(path: Path, folder: Path) -> str | None:
    """Why the file at ``path`` (in the learner's ``folder``) is not graded, or None. A
    name that is not UTF-8 is refused (its line shows it with ``?`` for the bad bytes)."""
    inside = path.relative_to(folder) if _inside(path, folder) else Path(path.name)
    if not _utf8(str(inside)):
        shown = readable(str(inside))
        return f"{shown}: refused: its name is not UTF-8 text (rename it and hand it in again)"
    if path.is_symlink() or any(p.is_symlink() for p in path.parents if _inside(p, folder)):
        return f"{path.name}: refused: a symbolic link (only the learner's own files are graded)"
    real, home = os.path.realpath(path), os.path.realpath(folder)
    if not real.startswith(home.rstrip("/") + "/"):
        return f"{path.name}: refused: it lies outside the learner's folder"
    try:
        size = path.stat().st_size
    except OSError as error:
        return f"{path.name}: cannot be read: {error.strerror}"
    if not path.is_file():
        return f"{path.name}: refused: not a regular file"
    if size > MAX_BYTES:
        return f"{path.name}: refused: {size / 2**20:.0f} MiB, more than {MAX_BYTES // 2**20} MiB"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        return f"{path.name}: cannot be read: {error}"
    if _depth(text) > MAX_DEPTH:
        return f"{path.name}: refused: its JSON is nested more than {MAX_DEPTH} deep"
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        return f"{path.name}: is not a notebook: broken JSON ({error})"
    cells = data.get("cells") if isinstance(data, dict) else None
    for number, item in enumerate(cells if isinstance(cells, list) else [], 1):
        metadata = item.get("metadata", {}) if isinstance(item, dict) else None
        if not isinstance(metadata, dict):
            return f"{path.name}: is not a notebook: cell {number}'s metadata is not an object"
        if not isinstance(metadata.get("nbgrader", {}), dict):
            what = f"cell {number}'s nbgrader metadata is not an object"
            return f"{path.name}: is not a notebook: {what}"
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a name's undecodable bytes, kept as surrogates
        return False
    return True


def readable(text: str) -> str:
    """``text`` (a file name) with the bytes that were not UTF-8 shown as ``?``: safe to
    print or write to a UTF-8 file.

    >>> readable(b"caf\\xe9.ipynb".decode("utf-8", "surrogateescape"))
    'caf?.ipynb'
    """
    raw = text.encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "replace").replace("\ufffd", "?")


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
