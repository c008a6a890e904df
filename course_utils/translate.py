"""Translations of the notebooks' markdown: one gettext catalog per notebook and language.

``translations/LANG/NOTEBOOK.po`` (for example ``translations/bn/01_runtime_and_devices.po``)
holds one entry per markdown cell of the English notebook: the cell's id as the context
(``msgctxt``), its English text as ``msgid``, the translation as ``msgstr``. The catalogs are
read and written with Babel (:mod:`babel.messages.pofile`), so any gettext tool (Poedit,
Weblate, Lokalize, ``msgfmt --check``) opens them. Code cells are never translated.

- :func:`update_catalogs` brings the catalogs in step with the English notebooks: a new
  cell is added untranslated, a changed cell keeps its old translation marked *fuzzy* (with
  the old English as ``#| msgid``), a removed cell becomes obsolete (``#~``).
- :func:`coverage` counts, per language, the cells translated and not fuzzy.
- :func:`translated_notebook` builds a notebook in a language: code cells byte-identical,
  each markdown cell translated, or the English with a one-line marker where the
  translation is missing or fuzzy.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from babel.messages.catalog import Catalog, Message
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parent.parent
TRANSLATIONS = ROOT / "translations"
NOTEBOOKS = ROOT / "notebooks"
# The languages of the course's source material (see the README): Bengali, Arabic, Nepali.
LANGUAGES = {"bn": "বাংলা", "ar": "العربية", "ne": "नेपाली"}
RIGHT_TO_LEFT = {"ar"}


class TranslationError(ValueError):
    """A catalog or notebook that cannot be used; the message is one line."""


def markdown_cells(notebook: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(cell id, text)`` of each markdown cell of a parsed ``.ipynb``, in order."""
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "markdown":
            continue
        cell_id = cell.get("id")
        if not isinstance(cell_id, str) or not cell_id:
            raise TranslationError(f"markdown cell {index} has no id (nbformat 4.5 cell ids)")
        yield cell_id, cell_text(cell)


def cell_text(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def read_notebook(path: Path) -> dict[str, Any]:
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as failure:
        raise TranslationError(f"cannot read notebook {path}: {failure}") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise TranslationError(f"not a notebook: {path}")
    return notebook


def catalog_path(language: str, notebook: Path, root: Path = TRANSLATIONS) -> Path:
    return root / language / f"{notebook.stem}.po"


def read_catalog(path: Path, language: str) -> Catalog:
    try:
        with path.open("rb") as file:
            return read_po(file, locale=language, abort_invalid=True)
    except FileNotFoundError:
        raise
    except Exception as failure:  # Babel raises PoFileError and others on garbled files
        reason = " ".join(str(failure).split())[:200]
        raise TranslationError(f"cannot read catalog {path}: {reason}") from None


def write_catalog(catalog: Catalog, path: Path) -> None:
    buffer = io.BytesIO()
    write_po(buffer, catalog, width=0, sort_output=False, include_previous=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())


def new_catalog(language: str, notebook: Path) -> Catalog:
    return Catalog(
        locale=language,
        domain=notebook.stem,
        project="Make PyTorch use the GPU",
        version="",
        copyright_holder="the course's authors",
        msgid_bugs_address="",
        fuzzy=False,
    )


@dataclass
class UpdateResult:
    """What :func:`update_catalog` changed in one catalog."""

    path: Path
    added: int = 0
    changed: int = 0  # now fuzzy
    removed: int = 0  # now obsolete


def update_catalog(language: str, notebook: Path, root: Path = TRANSLATIONS) -> UpdateResult:
    """Bring ``language``'s catalog of ``notebook`` in step with its English markdown."""
    path = catalog_path(language, notebook, root)
    old = read_catalog(path, language) if path.exists() else new_catalog(language, notebook)
    by_context = {message.context: message for message in old if message.id and message.context}
    fresh = new_catalog(language, notebook)
    if path.exists():  # keep the header's dates and translator: no churn without a change
        fresh.creation_date, fresh.revision_date = old.creation_date, old.revision_date
        fresh.last_translator, fresh.language_team = old.last_translator, old.language_team
    result = UpdateResult(path)
    seen = set()
    for cell_id, text in markdown_cells(read_notebook(notebook)):
        seen.add(cell_id)
        before = by_context.get(cell_id)
        message = Message(text, context=cell_id)
        if before is None:
            result.added += 1
        elif before.id == text:
            message.string = before.string
            message.flags = set(before.flags)
            message.previous_id = before.previous_id
        else:
            result.changed += 1
            message.string = before.string
            message.flags = {"fuzzy"} if before.string else set()
            message.previous_id = [str(before.id)] if before.string else []
        fresh[text] = message
    for context, message in by_context.items():
        if context not in seen and message.string:
            result.removed += 1
            fresh.obsolete[(str(message.id), context)] = message
    for key, message in old.obsolete.items():
        if message.context not in seen:
            fresh.obsolete[key] = message
    write_catalog(fresh, path)
    return result


def update_catalogs(
    languages: list[str], notebooks: list[Path], root: Path = TRANSLATIONS
) -> list[UpdateResult]:
    return [update_catalog(lang, nb, root) for lang in languages for nb in notebooks]
