"""Where a class run writes a learner's files: identifiers made into safe file names.

A learner's identifier (a roster's ``SIS Login ID``, a folder's or a Canvas file's name)
is text somebody else chose: ``../../x``, ``/abs``, ``a/b``, ``..``, an empty name or one
with control characters must never name a path outside the run's ``--out``. Every
per-learner path a class run writes goes through :func:`under`: each part becomes a
:func:`safe_name`, and the resolved path is checked to stay inside the folder.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from course_utils.instructor.student import InputError

#: What a safe name keeps: letters and digits of any script, ``_``, ``-`` and ``.``.
_UNSAFE = re.compile(r"[^\w.-]+")
#: Longest kept part of a changed name (file systems allow 255 bytes; room for the hash).
_LONGEST = 80


class OutsideOutput(InputError):
    """A path that would leave the output folder (a link planted in it, say)."""


def safe_name(identifier: str) -> str:
    """``identifier`` as one file name: itself when it is only letters, digits, ``_``,
    ``-`` and ``.`` (not starting with ``.`` or ``-``); otherwise those characters kept
    (others as ``_``) and a short hash of the whole identifier added, so two learners
    never share a name. Never empty, ``.`` or ``..``.

    >>> safe_name("alice"), safe_name("José"), safe_name("01_ex.json")
    ('alice', 'José', '01_ex.json')
    >>> safe_name("../../x")
    'x-9cdf6a50'
    >>> safe_name("a/b") != safe_name("a_b") and safe_name("") != safe_name("..")
    True
    """
    text = str(identifier)
    core = _UNSAFE.sub("_", text).lstrip(".-_").rstrip(".")[:_LONGEST]
    if core == text and text:
        return text
    raw = text.encode("utf-8", "surrogateescape")
    digest = hashlib.sha256(raw).hexdigest()[:8]
    return f"{core}-{digest}" if core else f"_{digest}"


def under(out: Path, *parts: str) -> Path:
    """``out/PART/...`` with every part a :func:`safe_name` (a part ``.``, the learner of
    ``grade FILE`` in the current folder, is left out, as it always was); :class:`OutsideOutput`
    when the resolved path (links followed) is not inside ``out``."""
    path = out.joinpath(*(safe_name(part) for part in parts if part != "."))
    return inside(out, path)


def inside(out: Path, path: Path) -> Path:
    """``path``, after checking that it resolves (links followed) to a place inside
    ``out``; :class:`OutsideOutput` otherwise."""
    home = os.path.realpath(out)
    real = os.path.realpath(path)
    if not real.startswith(home.rstrip(os.sep) + os.sep):
        raise OutsideOutput(f"refused to write {path}: it resolves outside {out}")
    return path
