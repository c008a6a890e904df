"""The learner's language: the course's messages (exercise feedback, claim verdicts, notes)
in the language the notebook is read in, English where a translation is missing.

A notebook built in a language (``python -m course_utils translate build``) sets it in the
cell after its setup cell, ``os.environ["COURSE_LANGUAGE"] = "bn"``; a learner can set it
the same way, or call :func:`use_language`. The messages of each part of the course are
kept in one place, a :class:`Messages` table (``MESSAGES_01 = Messages("01", {...})``):
each English template has a stable name, and ``MESSAGES_01["time_it mean"]`` is the
template in the learner's language, to be filled in with ``.format(...)`` as the English
one is.

The translations are gettext catalogs, ``translations/LANG/messages.po`` (the context is
``<table>:<name>``, the msgid the English template), written by ``python -m course_utils
translate update`` and checked by ``translate check`` like the notebooks' catalogs. A
translation is used only when it is not fuzzy and has exactly the English fields, so a
changed English message is shown in English until a translator updates it. This module
reads the catalogs itself (no Babel: Colab and GPU nodes do not have it).
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

#: The languages the course is translated into, with their own names.
LANGUAGES = {"bn": "বাংলা", "ar": "العربية", "ne": "नेपाली"}
RIGHT_TO_LEFT = {"ar"}
ENGLISH = "en"
LANGUAGE_VAR = "COURSE_LANGUAGE"
#: The catalog of the course's messages in each language's folder.
MESSAGES_FILE = "messages.po"
#: Where the catalogs are: inside the installed package (a wheel carries the messages'
#: catalogs there, see pyproject.toml), else the repository's ``translations/``.
_PACKAGED = Path(__file__).resolve().parent / "translations"
_REPOSITORY = Path(__file__).resolve().parent.parent / "translations"

_FIELD = re.compile(r"\{\{|\}\}|\{(?:[^{}]|\{[^{}]*\})*\}")


def template_fields(template: str) -> Counter[str]:
    """The fields (``{...}``) of a template, counted (``{{`` and ``}}`` are not fields).

    >>> sorted(template_fields("{got} of {want:.1f} {{literal}}"))
    ['{got}', '{want:.1f}']
    """
    return Counter(m for m in _FIELD.findall(template) if m not in ("{{", "}}"))


def course_language() -> str:
    """The language of the course's messages: ``COURSE_LANGUAGE`` when it names one of
    :data:`LANGUAGES`, else English (``"en"``)."""
    code = os.environ.get(LANGUAGE_VAR, "").strip().lower()
    return code if code in LANGUAGES else ENGLISH


def use_language(code: str) -> None:
    """Show the course's messages in ``code`` (one of :data:`LANGUAGES`, or ``"en"``) from
    now on, in this process and the processes it starts (the grader's checks)."""
    code = code.strip().lower()
    if code != ENGLISH and code not in LANGUAGES:
        raise ValueError(f"unknown language {code!r}: one of en, {', '.join(LANGUAGES)}")
    os.environ[LANGUAGE_VAR] = code


def catalog_file(language: str) -> Path:
    """The messages' catalog of ``language``: the package's copy, else the repository's."""
    packaged = _PACKAGED / language / MESSAGES_FILE
    return packaged if packaged.is_file() else _REPOSITORY / language / MESSAGES_FILE


def catalog_folders() -> list[Path]:
    """The folders the catalogs are read from that exist (the grader's sandbox shows them)."""
    return [folder for folder in (_PACKAGED, _REPOSITORY) if folder.is_dir()]


_QUOTED = re.compile(r'^(msgctxt|msgid|msgstr)\s+(".*")\s*$|^(".*")\s*$')


def _unquote(text: str) -> str:
    value = ast.literal_eval(text)  # a PO string is a C string: Python reads its escapes
    return value if isinstance(value, str) else ""


def _entries(text: str) -> Iterator[tuple[str, str, str, bool]]:
    """``(context, msgid, msgstr, fuzzy)`` of each active entry of a PO file's text."""
    fields: dict[str, str] = {}
    key, fuzzy = "", False

    def entry() -> Iterator[tuple[str, str, str, bool]]:
        if "msgid" in fields:
            yield fields.get("msgctxt", ""), fields["msgid"], fields.get("msgstr", ""), fuzzy

    for line in text.splitlines():
        if not line.strip():
            yield from entry()
            fields, key, fuzzy = {}, "", False
            continue
        if line.startswith("#,"):
            fuzzy = fuzzy or "fuzzy" in line[2:].replace(",", " ").split()
            continue
        if line.startswith("#"):
            continue  # comments and obsolete (#~) entries
        found = _QUOTED.match(line)
        if not found:
            continue
        if found[1]:
            if found[1] == "msgctxt" and "msgid" in fields:  # a new entry with no blank line
                yield from entry()
                fields, fuzzy = {}, False
            key = found[1]
            fields[key] = _unquote(found[2])
        elif key:
            fields[key] += _unquote(found[3])
    yield from entry()


@functools.lru_cache(maxsize=8)
def _translations(path: Path, modified: float) -> dict[tuple[str, str], str]:
    usable = {}
    try:
        for context, english, translation, fuzzy in _entries(path.read_text(encoding="utf-8")):
            same = template_fields(translation) == template_fields(english)
            if translation and not fuzzy and same:
                usable[context, english] = translation
    except (OSError, UnicodeDecodeError, ValueError, SyntaxError):  # garbled: English
        return {}
    return usable


def translated(context: str, english: str, language: str | None = None) -> str:
    """``english`` in ``language`` (default: :func:`course_language`) where its catalog has
    a usable translation for this context, else ``english``."""
    language = language or course_language()
    if language not in LANGUAGES:
        return english
    path = catalog_file(language)
    try:
        modified = path.stat().st_mtime
    except OSError:
        return english
    return _translations(path, modified).get((context, english), english)


class Messages(Mapping[str, str]):
    """One part of the course's messages: English templates by a stable name, looked up in
    the learner's language.

    >>> table = Messages("doctest", {"late": "{minutes} minutes late"})
    >>> table["late"].format(minutes=3)
    '3 minutes late'
    """

    def __init__(self, name: str, english: Mapping[str, str]) -> None:
        if ":" in name:
            raise ValueError(f"a message table's name has no colon: {name!r}")
        self.name = name
        self.english = dict(english)

    def context(self, key: str) -> str:
        """The catalogs' context of one message: ``<table>:<name>``."""
        return f"{self.name}:{key}"

    def __getitem__(self, key: str) -> str:
        return self.text(key)

    def text(self, key: str, language: str | None = None) -> str:
        """The template ``key`` in ``language`` (default: :func:`course_language`)."""
        return translated(self.context(key), self.english[key], language)

    def __iter__(self) -> Iterator[str]:
        return iter(self.english)

    def __len__(self) -> int:
        return len(self.english)
