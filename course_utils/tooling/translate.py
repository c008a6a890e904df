"""Translations of the notebooks' markdown: one gettext catalog per notebook and language.

``translations/LANG/NOTEBOOK.po`` (for example ``translations/bn/01_runtime_and_devices.po``)
holds one entry per markdown cell of the English notebook: the cell's id as the context
(``msgctxt``), its English text as ``msgid``, the translation as ``msgstr``. The catalogs are
read and written with Babel (:mod:`babel.messages.pofile`), so any gettext tool (Poedit,
Weblate, Lokalize, ``msgfmt --check``) opens them. Of a code cell only the explanations it
prints are translated (context ``<cell id>:print:<k>``, :func:`printed_texts`).

- :func:`update_catalogs` brings the catalogs in step with the English notebooks: a new
  cell is added untranslated, a changed cell keeps its old translation marked *fuzzy* (with
  the old English as ``#| msgid``), a removed cell becomes obsolete (``#~``).
- :func:`coverage` counts, per language, the cells translated and not fuzzy.
- :func:`translated_notebook` builds a notebook in a language: code cells as in English but
  for the texts they print (:func:`translated_code`), each markdown cell translated, or the
  English with a one-line marker where the translation is missing or fuzzy.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from babel.messages.catalog import Catalog, Message
from babel.messages.pofile import normalize, read_po, unescape, write_po

from course_utils.language import (
    _FIELD,
    LANGUAGE_VAR,
    LANGUAGES,
    MESSAGES_FILE,
    RIGHT_TO_LEFT,
    Messages,
    template_fields,
)
from course_utils.tooling.colab import SETUP_TAG, translated_badge_line

ROOT = Path(__file__).resolve().parents[2]
TRANSLATIONS = ROOT / "translations"
NOTEBOOKS = ROOT / "notebooks"


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


def read_english_notebook(path: Path) -> dict[str, Any]:
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
            catalog = read_po(file, locale=language, abort_invalid=True)
    except FileNotFoundError:
        raise
    except Exception as failure:  # Babel raises PoFileError and others on garbled files
        reason = " ".join(str(failure).split())[:200]
        raise TranslationError(f"cannot read catalog {path}: {reason}") from None
    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.startswith("#") and not _PO_LINE.match(line):
            raise TranslationError(
                f"cannot read catalog {path}: line {number} is not PO: {line[:60]!r}"
            )
    previous = _previous_ids(text)
    for message in catalog:
        if message.context in previous:
            message.previous_id = [previous[message.context]]
    return catalog


# A PO file's lines other than comments: a keyword and a quoted string, or a string alone
# (Babel's reader accepts an unterminated string; msgfmt --check does not).
_PO_LINE = re.compile(
    r'^(?:(?:msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?)\s+)?"(?:[^"\\]|\\.)*"\s*$'
)


def _previous_ids(text: str) -> dict[str, str]:
    """``#| msgid`` (the English a fuzzy entry was translated from) by context: Babel
    writes these but does not read them back."""
    found: dict[str, str] = {}
    pieces: list[str] = []
    for line in text.splitlines():
        if line.startswith('#| msgid "') or (pieces and line.startswith('#| "')):
            pieces.append(line[line.index('"') :])
        elif line.startswith('msgctxt "') and pieces:
            found[unescape(line[len("msgctxt ") :])] = "".join(unescape(p) for p in pieces)
            pieces = []
        elif not line.startswith("#"):
            pieces = []
    return found


def write_catalog(catalog: Catalog, path: Path) -> None:
    # Babel flags an entry whose English has a "%" (for example "100% GPU-Util") as
    # python-format; markdown is not a format string, and with that flag msgfmt --check
    # refuses a translation that writes "100 %" or "٪100".
    for message in [*catalog, *catalog.obsolete.values()]:
        message.flags.discard("python-format")
    buffer = io.BytesIO()
    # Babel prefixes only the first line of a multi-line previous msgid with "#|", which
    # leaves the rest as bare strings (msgfmt: "end-of-line within string"): written here
    write_po(buffer, catalog, width=0, sort_output=False, include_previous=False)
    lines = buffer.getvalue().decode("utf-8").split("\n")
    previous = {
        f"msgctxt {normalize(message.context, width=0)}": message.previous_id[0]
        for message in catalog
        if message.context and message.previous_id and message.fuzzy
    }
    written = []
    for line in lines:
        if line in previous:
            body = normalize(previous[line], width=0).split("\n")
            written += ["#| msgid " + body[0]] + ["#| " + rest for rest in body[1:]]
        written.append(line)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("\n".join(written).encode("utf-8"))


def new_catalog(language: str, domain: str) -> Catalog:
    return Catalog(
        locale=language,
        domain=domain,
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
    entries = english_entries(read_english_notebook(notebook))
    return _update(language, catalog_path(language, notebook, root), notebook.stem, entries)


def _update(language: str, path: Path, domain: str, entries: list[tuple[str, str]]) -> UpdateResult:
    """Bring the catalog at ``path`` in step with ``entries`` (context, English)."""
    old = read_catalog(path, language) if path.exists() else new_catalog(language, domain)
    by_context = {message.context: message for message in old if message.id and message.context}
    fresh = new_catalog(language, domain)
    if path.exists():  # keep the header's dates and translator: no churn without a change
        fresh.creation_date, fresh.revision_date = old.creation_date, old.revision_date
        fresh.last_translator, fresh.language_team = old.last_translator, old.language_team
    result = UpdateResult(path)
    seen = set()
    for cell_id, text in entries:
        seen.add(cell_id)
        before = by_context.get(cell_id)
        message = Message(text, context=cell_id)
        if templated(cell_id):
            message.auto_comments = [PRINTED_NOTE]
        elif domain == MESSAGES_DOMAIN:
            message.auto_comments = [MESSAGE_NOTE]
        if before is None:
            result.added += 1
        elif before.id == text:
            message.string = before.string
            message.flags |= set(before.flags)  # and the format flags Babel gives it
            message.previous_id = before.previous_id
        else:
            result.changed += 1
            message.string = before.string
            message.flags |= {"fuzzy"} if before.string else set()
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


# --- The course's messages --------------------------------------------------------------
# What the package says to a learner (exercise feedback, claim verdicts) is kept in
# course_utils.language.Messages tables in these modules; their catalog is
# translations/LANG/messages.po, its contexts "<table>:<name>".
MESSAGES_DOMAIN = "messages"
MESSAGE_MODULES = (
    "course_utils.claims",
    "course_utils.feedback",
    "course_utils.checks.core",
    *(f"course_utils.checks.nb{number:02d}" for number in range(1, 10)),
    "course_utils.instructor.grading",
    "course_utils.timing",
)
MESSAGE_NOTE = (
    "said by the course to a learner: keep each {field} as it is; {{ and }} print one brace"
)


def message_entries() -> list[tuple[str, str]]:
    """``(context, English template)`` of every message of the course's Messages tables."""
    import importlib  # lazy: the modules import torch, wanted only for the messages

    entries: list[tuple[str, str]] = []
    for name in MESSAGE_MODULES:
        for table in vars(importlib.import_module(name)).values():
            if isinstance(table, Messages):
                entries += [(table.context(key), text) for key, text in table.english.items()]
    return list(dict.fromkeys(entries))  # a table one module imports from another: once


def update_catalogs(
    languages: list[str], notebooks: list[Path], root: Path = TRANSLATIONS
) -> list[UpdateResult]:
    return [update_catalog(lang, nb, root) for lang in languages for nb in notebooks]


# --- The README's course part -----------------------------------------------------------
# The language sites' home pages show what a learner reads of the README (the introduction
# before its first "## " heading and the sections named here) translated: one entry per
# block (paragraph, list, table, heading), context "README:<section>:<k>".
README_DOMAIN = "README"
README_COURSE_SECTIONS = ("Google Colab", "On your own machine", "Notebooks", "Languages")
_SLUG = re.compile(r"[^a-z0-9]+")


def _blocks(text: str) -> Iterator[str]:
    """A markdown text's blocks: runs of lines between blank lines (a fenced code block,
    blank lines and all, is one)."""
    block: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not line.strip() and not fenced:
            if block:
                yield "\n".join(block)
            block = []
        else:
            block.append(line)
    if block:
        yield "\n".join(block)


def readme_entries(text: str) -> list[tuple[str, str]]:
    """``(context, block)`` of each block of the README's course part (not its Colab line:
    each site page has its own badge)."""
    from course_utils.tooling.colab import is_badge_line  # lazy: as in _badge_line_index

    entries: list[tuple[str, str]] = []
    section, kept, count = "intro", True, 0
    for block in _blocks(text):
        if block.startswith("## "):
            title = block.split("\n")[0][3:].strip()
            section = _SLUG.sub("-", title.lower()).strip("-")
            kept, count = title in README_COURSE_SECTIONS, 0
        if kept and not is_badge_line(block):
            count += 1
            entries.append((f"{README_DOMAIN}:{section}:{count}", block))
    return entries


# --- Catalogs of documents other than notebooks ------------------------------------------
#: The catalogs beside the notebooks' in translations/LANG/: the course's messages and the
#: README's course part (the README's is left out where the checkout has no README).
DOCUMENTS = (MESSAGES_DOMAIN, README_DOMAIN)


def document_entries(domain: str, root: Path = TRANSLATIONS) -> list[tuple[str, str]] | None:
    """The English entries of a document's catalog (``root``: the translations folder of a
    checkout); None where the checkout has no such document."""
    if domain == MESSAGES_DOMAIN:
        return message_entries()
    readme = root.parent / "README.md"
    return readme_entries(readme.read_text(encoding="utf-8")) if readme.is_file() else None


def document_path(language: str, domain: str, root: Path = TRANSLATIONS) -> Path:
    return root / language / f"{domain}.po"


def update_documents(language: str, root: Path = TRANSLATIONS) -> list[UpdateResult]:
    """Bring ``language``'s catalogs of the messages and the README in step with the English."""
    results = []
    for domain in DOCUMENTS:
        entries = document_entries(domain, root)
        if entries is not None:
            path = document_path(language, domain, root)
            results.append(_update(language, path, domain, entries))
    return results


# --- The title cell's badge line -------------------------------------------------------
# Cell 0's third line is written by ``python -m course_utils badges`` (course_utils.tooling.colab),
# not by an author: it changes when the course is published. Catalogs hold it in its
# committed form (TITLE_BADGE_LINE), so publishing never makes a catalog stale; a built
# notebook gets its own language's badge line.
TITLE_BADGE_LINE = (
    "*Open in Colab:* open this notebook from the course's `colab` branch, where its "
    '"Open in Colab" badge and setup cell are filled in (the exercises without their '
    "answers; the `solutions` branch has them)."
)


def _badge_line_index(text: str) -> int | None:
    from course_utils.tooling.colab import is_badge_line  # lazy: colab imports nothing heavy

    lines = text.split("\n")
    for index in range(min(3, len(lines))):
        if is_badge_line(lines[index]):
            return index
    return None


def source_text(cell_index: int, text: str) -> str:
    """The English text a catalog holds for a markdown cell: its own, except that the
    title cell's badge line is in its committed form (see TITLE_BADGE_LINE)."""
    if cell_index != 0:
        return text
    at = _badge_line_index(text)
    if at is None:
        return text
    lines = text.split("\n")
    lines[at] = TITLE_BADGE_LINE
    return "\n".join(lines)


def english_entries(notebook: dict[str, Any]) -> list[tuple[str, str]]:
    """``(context, msgid)`` of each markdown cell (its cell id) and of each text a code cell
    prints (:func:`printed_texts`), as the catalogs hold them."""
    index_of = {cell.get("id"): index for index, cell in enumerate(notebook.get("cells", []))}
    entries = [(cid, source_text(index_of[cid], text)) for cid, text in markdown_cells(notebook)]
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code" and isinstance(cell.get("id"), str):
            entries += [(p.context, p.template) for p in printed_texts(cell["id"], cell_text(cell))]
    return entries


# --- Texts that code cells print -------------------------------------------------------------
# A code cell's explanations ("No GPU here: on a GPU this cell would ...") are string
# literals passed to print(): each is an entry of the notebook's catalog, its context
# "<cell id>:print:<k>" (the k-th such text of the cell), its msgid the text as a template:
# an f-string's fields written {expression!conversion:format}, literal braces doubled. A
# built notebook prints the translation: the literal is replaced, the code around it kept.
PRINTED = ":print:"
PRINTED_NOTE = "printed by a code cell: keep each {field} as it is; {{ and }} print one brace"
# A check cell's own feedback (the text given to check(...) or to a check_... function) is
# translated the same way, context "<cell id>:check:<k>", numbered apart from the prints.
CHECKED = ":check:"


def templated(context: str) -> bool:
    """Whether a notebook catalog's entry is a code cell's text (fields must all be kept)."""
    return PRINTED in context or CHECKED in context


#: A printed literal is an explanation to translate when it has this many words or more.
_PRINT_WORDS = 3
_WORD = re.compile(r"[^\W\d_]{2,}[,:;.!?)]*")  # a whole token: not `torch.cuda.is_available()`


@dataclass(frozen=True)
class PrintedText:
    """A string a code cell passes to ``print``: where it is, and its text as a template."""

    context: str
    template: str
    start: int  # character offsets of the literal in the cell's source
    end: int


def _masked(source: str) -> str:
    """The cell's source with IPython's ``!`` and ``%`` lines as ``pass`` (same line count)."""
    lines = source.split("\n")
    for number, line in enumerate(lines):
        if line.lstrip().startswith(("!", "%")):
            lines[number] = line[: len(line) - len(line.lstrip())] + "pass"
    return "\n".join(lines)


def _expression(node: ast.expr, source: str) -> str:
    """A field's expression as its cell writes it (``1e9``, not ``1000000000.0``) where the
    parser's position for it is right, else as :func:`ast.unparse` writes it."""
    written = ast.get_source_segment(source, node)
    try:
        if written and ast.dump(ast.parse(written.strip(), mode="eval").body) == ast.dump(node):
            return written.strip()
    except SyntaxError:
        pass
    return ast.unparse(node)


def _template(node: ast.expr, source: str = "") -> str | None:
    """A str literal or f-string as a template (None: neither)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}")
    if not isinstance(node, ast.JoinedStr):
        return None
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value).replace("{", "{{").replace("}", "}}"))
        elif isinstance(value, ast.FormattedValue):
            field = _expression(value.value, source)
            if value.conversion != -1:
                field += "!" + chr(value.conversion)
            if value.format_spec is not None:
                field += ":" + (_template(value.format_spec, source) or "")
            parts.append("{" + field + "}")
    return "".join(parts)


def _words(template: str) -> int:
    tokens = _FIELD.sub(" ", template).split()
    return sum(bool(_WORD.fullmatch(token.lstrip("(\"'"))) for token in tokens)


def _said_by(call: ast.Call) -> str | None:
    """:data:`PRINTED` for ``print(...)``, :data:`CHECKED` for ``check(...)`` and the
    course's ``check_...(...)`` functions (their text arguments are feedback), else None."""
    name = call.func.id if isinstance(call.func, ast.Name) else None
    if isinstance(call.func, ast.Attribute):
        name = call.func.attr
    if name == "print":
        return PRINTED
    if name is not None and (name == "check" or name.startswith("check_")):
        return CHECKED
    return None


def printed_texts(cell_id: str, source: str) -> list[PrintedText]:
    """The explanations a code cell prints, in the order they appear (none if the cell is
    not Python, for example a ``%%writefile`` cell)."""
    if source.lstrip().startswith("%%"):
        return []
    masked = _masked(source)
    try:
        tree = ast.parse(masked)
    except SyntaxError:
        return []
    line_start = [0]
    for line in source.split("\n"):
        line_start.append(line_start[-1] + len(line) + 1)

    def offset(line: int, column: int) -> int:  # ast columns count UTF-8 bytes
        text = source[line_start[line - 1] : line_start[line]]
        return line_start[line - 1] + len(text.encode("utf-8")[:column].decode("utf-8"))

    found: list[PrintedText] = []
    counts = {PRINTED: 0, CHECKED: 0}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    for call in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        kind = _said_by(call)
        if kind is None:
            continue
        for argument in call.args:
            template = _template(argument, masked)
            if template is None or _words(template) < _PRINT_WORDS:
                continue
            assert argument.end_lineno is not None and argument.end_col_offset is not None
            start = offset(argument.lineno, argument.col_offset)
            end = offset(argument.end_lineno, argument.end_col_offset)
            counts[kind] += 1
            found.append(PrintedText(f"{cell_id}{kind}{counts[kind]}", template, start, end))
    return found


def _escape(text: str) -> str:
    """Literal text inside a double-quoted f-string."""
    escaped = repr(text.replace("{", "{{").replace("}", "}}"))[1:-1]
    return escaped.replace('"', '\\"') if repr(text).startswith("'") else escaped


def python_literal(template: str) -> str:
    """Python source that makes this template's text: an f-string when it has fields."""
    pieces = _FIELD.split(template)
    fields = _FIELD.findall(template)
    if not template_fields(template):
        return repr(template.replace("{{", "{").replace("}}", "}"))
    body = _escape(pieces[0])
    for field, piece in zip(fields, pieces[1:], strict=True):
        body += (_escape(field[0]) if field in ("{{", "}}") else field) + _escape(piece)
    return f'f"{body}"'


def translated_code(cell_id: str, source: str, catalog: Catalog | None) -> str:
    """A code cell's source with each printed text whose translation is usable (not fuzzy,
    the same fields) replaced; the English source where the result would not parse."""
    if catalog is None:
        return source
    result = source
    for printed in reversed(printed_texts(cell_id, source)):
        message = catalog.get(printed.template, context=printed.context)
        if message is None or not message.string or message.fuzzy:
            continue
        translation = str(message.string)
        if template_fields(translation) != template_fields(printed.template):
            continue
        result = result[: printed.start] + python_literal(translation) + result[printed.end :]
    try:
        ast.parse(_masked(result))
    except SyntaxError:
        return source
    return result


# --- Checks ------------------------------------------------------------------------------
_FENCE = re.compile(r"```.*?```", re.S)
_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_URL = re.compile(r"https?://[^\s)>\]]+")
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.S)
# A number not part of a Latin identifier ("x2", "sm_80"): Arabic writes "و8.0" (and 8.0)
# with the letter attached, so only ASCII letters, digits, "_" and "." before it count.
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d+(?:[.,]\d+)*")
KINDS = ("fenced code", "code spans", "formulas", "link targets", "numbers")
#: Kept at least as often as the English has them, and nothing the English lacks: a gloss
#: may repeat the numbers and code of the quote it glosses ("~25 %", "50257 → 50304").
REPEATABLE = ("code spans", "numbers")


def protected_parts(text: str) -> dict[str, Counter[str]]:
    """What a translation keeps exactly as the English has it, as multisets: fenced code,
    code spans, formulas (``$…$``), link targets and URLs, numbers (ASCII digits).

    >>> parts = protected_parts("Use `x.to(device)` on 2 GPUs, see [docs](https://a.b/c).")
    >>> dict(parts["code spans"]), dict(parts["numbers"]), dict(parts["link targets"])
    ({'x.to(device)': 1}, {'2': 1}, {'https://a.b/c': 1})
    """
    fences = _FENCE.findall(text)
    text = _FENCE.sub(" ", text)
    codes = [match.group(2) for match in _CODE.finditer(text)]
    text = _CODE.sub(" ", text)
    formulas = _MATH.findall(text)
    text = _MATH.sub(" ", text)
    links = _LINK.findall(text)  # a link's target once, then the bare URLs left
    text = _LINK.sub("] ", text)
    links += _URL.findall(text)
    text = _URL.sub(" ", text)
    return {
        "fenced code": Counter(fences),
        "code spans": Counter(codes),
        "formulas": Counter(formulas),
        "link targets": Counter(links),
        "numbers": Counter(_NUMBER.findall(text)),
    }


@dataclass(frozen=True)
class GlossaryTerm:
    """One concept's one rendering: ``must_match`` where the English has the term,
    ``must_not_match`` (the other words for it) in no entry of the language."""

    english: str
    translation: str
    must_match: re.Pattern[str]
    note: str = ""
    must_not_match: re.Pattern[str] | None = None

    def applies_to(self, english_text: str, longer: tuple[str, ...] = ()) -> bool:
        """Whether the English names the term outside code, not only as part of one of the
        ``longer`` terms ("tensor" in "tensor core"), nor only in a quoted title."""
        plain = prose(english_text)
        for other in longer:
            plain = re.sub(_word(other), " ", plain, flags=re.IGNORECASE)
        return re.search(_word(self.english), plain, re.IGNORECASE) is not None


def _word(english: str) -> str:
    words = r"\s+".join(re.escape(word) for word in english.split())  # over a line break
    return r"(?<![\w-])" + words + r"(?:e?s)?(?![\w-])"  # and its plural


# Quoted English in a translation: an italic title or quote (*"…"*, *Performance Tuning
# Guide*) and a double-quoted string; not ** (bold).
_QUOTED = re.compile(r'(?<!\*)\*(?![*\s])(?:[^*]|\*\*)+?(?<![*\s])\*(?!\*)|"[^"]*"', re.S)
_WHOLE_LINK = re.compile(r"\[[^\]]*\]\([^)]*\)")  # its text too: often a title


def prose(text: str) -> str:
    """``text`` without what the checker keeps exactly (fenced code, code spans, link
    targets, URLs), links and quoted English (italics, "…"): where the glossary's other
    words for a concept are looked for."""
    for pattern in (_FENCE, _CODE, _WHOLE_LINK, _URL, _QUOTED):
        text = pattern.sub(" ", text)
    return text


def read_glossary(language: str, root: Path = TRANSLATIONS) -> list[GlossaryTerm]:
    """``translations/LANG/glossary.tsv``: english, translation, must_match (a regex), note,
    and optionally must_not_match (a regex: the other words for the concept, found in no
    entry, so that all nine notebooks use one word)."""
    path = root / language / "glossary.tsv"
    try:
        rows = list(csv.DictReader(path.open(encoding="utf-8"), delimiter="\t"))
    except OSError as failure:
        raise TranslationError(f"cannot read glossary {path}: {failure.strerror}") from None
    terms = []
    for line, row in enumerate(rows, start=2):
        try:
            english, translation = row["english"].strip(), row["translation"].strip()
            avoid = (row.get("must_not_match") or "").strip()
            terms.append(
                GlossaryTerm(
                    english,
                    translation,
                    re.compile(row["must_match"]),
                    row.get("note") or "",
                    re.compile(avoid) if avoid else None,
                )
            )
        except (KeyError, AttributeError, re.error) as failure:
            raise TranslationError(f"{path}:{line}: not a glossary row ({failure})") from None
    return terms


def entry_problems(
    english: str, translation: str, glossary: list[GlossaryTerm], printed: bool = False
) -> list[str]:
    """What is wrong with one translated entry (empty: nothing); ``printed``: a text a code
    cell prints, whose fields must all be there (a translation without them is not used)."""
    problems = []
    if printed and template_fields(english) != template_fields(translation):
        missing = dict(template_fields(english) - template_fields(translation))
        extra = dict(template_fields(translation) - template_fields(english))
        what = [f"missing {missing}" if missing else "", f"extra {extra}" if extra else ""]
        problems.append(f"fields differ: {' '.join(w for w in what if w)}")
    source, target = protected_parts(english), protected_parts(translation)
    for kind in KINDS:
        missing, extra = dict(source[kind] - target[kind]), dict(target[kind] - source[kind])
        if kind in REPEATABLE:  # repeated in a gloss: fine
            extra = {part: count for part, count in extra.items() if part not in source[kind]}
        if missing or extra:
            what = [f"missing {missing}" if missing else "", f"extra {extra}" if extra else ""]
            problems.append(f"{kind} differ: {' '.join(w for w in what if w)}")
    words = prose(translation)
    for term in glossary:
        longer = tuple(
            other.english
            for other in glossary
            if len(other.english) > len(term.english)
            and re.search(_word(term.english), other.english, re.IGNORECASE)
        )
        if term.applies_to(english, longer) and not term.must_match.search(translation):
            problems.append(f"glossary: '{term.english}' should be rendered as {term.translation}")
        found = term.must_not_match.search(words) if term.must_not_match else None
        if found:
            problems.append(
                f"glossary: '{term.english}' is {term.translation} in every notebook, "
                f"not {found.group(0)!r}"
            )
    return problems


def stale_problems(catalog: Catalog, notebook: dict[str, Any]) -> list[str]:
    """How ``catalog`` differs from the notebook's markdown (empty: in step)."""
    return _stale(catalog, english_entries(notebook))


def _stale(catalog: Catalog, entries_now: list[tuple[str, str]]) -> list[str]:
    english = dict(entries_now)
    entries = {message.context: message for message in catalog if message.id}
    problems = []
    for cell_id, text in english.items():
        message = entries.get(cell_id)
        if message is None:
            problems.append(f"{cell_id}: no entry for this text")
        elif message.id != text:
            problems.append(f"{cell_id}: its English (msgid) is not the notebook's")
    problems += [
        f"{cid}: an entry for no text of the notebook" for cid in entries if cid not in english
    ]
    return problems


UPDATE_HINT = "run `python -m course_utils translate update`"
# "# | msgid ..." (a space after "#"): a previous English kept as a translator comment, not
# as the "#| msgid" of a fuzzy entry; it misleads the next translator
_STALE_COMMENT = re.compile(r'\|\s*(?:msgid\b|")')


def check_catalogs(
    languages: list[str], notebooks: list[Path], root: Path = TRANSLATIONS
) -> list[str]:
    """Every problem of the notebooks' catalogs of ``languages``, one line each (empty: none)."""
    lines = []
    for language in languages:
        glossary = read_glossary(language, root)
        for notebook_path in notebooks:
            path = catalog_path(language, notebook_path, root)
            entries = english_entries(read_english_notebook(notebook_path))
            lines += _catalog_problems(language, path, entries, glossary)
    return lines


def check_documents(languages: list[str], root: Path = TRANSLATIONS) -> list[str]:
    """Every problem of the catalogs of the course's messages and README, one line each."""
    lines = []
    for domain in DOCUMENTS:
        entries = document_entries(domain, root)
        for language in languages if entries is not None else []:
            glossary = read_glossary(language, root)
            path = document_path(language, domain, root)
            lines += _catalog_problems(language, path, entries or [], glossary)
    return lines


def _catalog_problems(
    language: str, path: Path, entries: list[tuple[str, str]], glossary: list[GlossaryTerm]
) -> list[str]:
    name = f"{language}/{path.name}"
    if not path.is_file():
        return [f"{name}: no catalog: {UPDATE_HINT}"]
    catalog = read_catalog(path, language)
    lines = [f"{name} {problem}: stale, {UPDATE_HINT}" for problem in _stale(catalog, entries)]
    messages = path.name == MESSAGES_FILE  # templates: their fields must all be kept
    for message in catalog:
        if not message.fuzzy and any(  # a fuzzy entry's #| msgid is the old English
            _STALE_COMMENT.match(comment) for comment in message.user_comments
        ):
            lines.append(
                f"{name} {message.context}: a translator comment copies an earlier "
                "English (# | msgid ...): delete it"
            )
        if message.id and message.string and not message.fuzzy:
            fields = messages or templated(str(message.context))
            english, translation = str(message.id), str(message.string)
            for problem in entry_problems(english, translation, glossary, fields):
                lines.append(f"{name} {message.context}: {problem}")
    return lines


# --- Coverage -----------------------------------------------------------------------------
@dataclass
class Coverage:
    """Cells translated and not fuzzy, of ``total``, in one catalog."""

    notebook: str
    translated: int
    total: int
    fuzzy: int = 0

    @property
    def percent(self) -> float:
        return 100.0 * self.translated / self.total if self.total else 100.0


def coverage(
    languages: list[str], notebooks: list[Path], root: Path = TRANSLATIONS
) -> dict[str, list[Coverage]]:
    """Per language, per notebook: the entries whose translation is usable."""
    result: dict[str, list[Coverage]] = {}
    for language in languages:
        rows = result.setdefault(language, [])
        for notebook_path in notebooks:
            english = english_entries(read_english_notebook(notebook_path))
            path = catalog_path(language, notebook_path, root)
            rows.append(_coverage(notebook_path.stem, language, path, english))
    return result


def documents_coverage(
    languages: list[str], root: Path = TRANSLATIONS
) -> dict[str, list[Coverage]]:
    """Per language: the messages and README entries whose translation is usable."""
    result: dict[str, list[Coverage]] = {language: [] for language in languages}
    for domain in DOCUMENTS:
        english = document_entries(domain, root)
        for language in languages if english is not None else []:
            path = document_path(language, domain, root)
            result[language].append(_coverage(domain, language, path, english or []))
    return result


def _coverage(name: str, language: str, path: Path, english: list[tuple[str, str]]) -> Coverage:
    catalog = read_catalog(path, language) if path.is_file() else None
    done = fuzzy = 0
    for context, text in english:
        message = catalog.get(text, context=context) if catalog is not None else None
        if message is not None and message.string:
            fuzzy += bool(message.fuzzy)
            done += not message.fuzzy
    return Coverage(name, done, len(english), fuzzy)


def total(rows: list[Coverage]) -> Coverage:
    return Coverage(
        "all",
        sum(r.translated for r in rows),
        sum(r.total for r in rows),
        sum(r.fuzzy for r in rows),
    )


# --- Building translated notebooks ----------------------------------------------------------
#: The one-line marker on a cell shown in English, in each language.
NOT_YET = {
    "bn": "এখনও বাংলায় অনুবাদ হয়নি: নিচে ইংরেজি",
    "ar": "لم تُترجم بعد إلى العربية: النص الإنجليزي أدناه",
    "ne": "अझै नेपालीमा अनुवाद भएको छैन: तल अंग्रेजी",
}
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")


def fallback_marker(language: str) -> str:
    return f"> *({NOT_YET[language]})*"


#: A code span, an inline formula or a quote kept in English (*"..."*): isolated
#: (``<bdi>``) inside right to left text, so that its punctuation stays where it is.
_INLINE_LEFT_TO_RIGHT = re.compile(r'(`+).+?\1|\$[^$\n]+\$|\*"[^"]+"\*', re.S)
#: What opens a line before its text: indentation, block quote marks, a list item's marker.
_LINE_PREFIX = re.compile(r"[ \t]*(?:>[ \t]?)*[ \t]*(?:(?:[-*+]|\d{1,9}[.)])(?:[ \t]+|$))?")
#: A line (after its prefix) that is not a paragraph's text: a heading, HTML, a rule.
_NOT_TEXT = re.compile(r"#{1,6}(?:\s|$)|<|(?:[-*_][ \t]*){3,}$")
#: Around each paragraph of a right to left cell: JupyterLab's stylesheet (and the site's,
#: nbconvert's) sets ``p { text-align: left }``, which the cell's ``dir`` cannot change;
#: an inline style on a block inside the paragraph can (JupyterLab's sanitizer keeps it).
ALIGN_RIGHT = '<span style="display: block; text-align: right">'


def _isolated(text: str) -> str:
    """``text`` with its code spans, inline formulas and English quotes in ``<bdi>``,
    matched over the whole paragraph: a code span going on over a line break stays one."""
    return _INLINE_LEFT_TO_RIGHT.sub(lambda m: f"<bdi>{m.group(0)}</bdi>", text)


def _paragraphs(lines: list[str]) -> Iterator[tuple[bool, list[str]]]:
    """The lines of ordinary markdown in groups: ``(True, lines)`` for a paragraph (or a
    list item's, or a block quote's), ``(False, [line])`` for anything else."""
    group: list[str] = []
    for line in lines:
        prefix = _LINE_PREFIX.match(line).group(0)  # type: ignore[union-attr]
        rest = line[len(prefix) :]
        new_item = bool(prefix.strip().lstrip(">").strip())  # a list item's marker
        if group and rest.strip() and not new_item and not _NOT_TEXT.match(rest):
            group.append(line)  # the paragraph goes on
            continue
        if group:
            yield True, group
            group = []
        if rest.strip() and not _NOT_TEXT.match(rest):
            group = [line]
        else:
            yield False, [line]
    if group:
        yield True, group


def _right_to_left_text(lines: list[str]) -> list[str]:
    """Ordinary markdown lines of a right to left cell: each paragraph aligned right, its
    code spans and formulas isolated left to right."""
    out: list[str] = []
    for paragraph, group in _paragraphs(lines):
        isolated = _isolated("\n".join(group)).split("\n")
        if paragraph:
            prefix = _LINE_PREFIX.match(isolated[0]).group(0)  # type: ignore[union-attr]
            isolated[0] = prefix + ALIGN_RIGHT + isolated[0][len(prefix) :]
            isolated[-1] += "</span>"
        out += isolated
    return out


def _left_to_right_blocks(text: str) -> str:
    """Fenced code and display formulas in ``<div dir="ltr">`` (inside a right to left
    cell); tables stay right to left (their columns and Arabic sentences read in order),
    with their code spans and formulas isolated (``<bdi>``), as in paragraphs, which are
    aligned right."""
    out: list[str] = []
    text_lines: list[str] = []
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        line = lines[index]
        block: list[str] = []
        if line.lstrip().startswith("```"):
            block.append(line)
            index += 1
            while index < len(lines):
                block.append(lines[index])
                index += 1
                if lines[index - 1].lstrip().startswith("```"):
                    break
        elif line.strip().startswith("$$"):
            block.append(line)
            index += 1
            closed = len(line.strip()) > 2 and line.rstrip().endswith("$$")
            while not closed and index < len(lines):
                block.append(lines[index])
                index += 1
                closed = lines[index - 1].rstrip().endswith("$$")
        elif _TABLE_ROW.match(line):
            out += _right_to_left_text(text_lines)
            text_lines = []
            while index < len(lines) and _TABLE_ROW.match(lines[index]):
                out.append(_isolated(lines[index]))
                index += 1
            continue
        else:
            text_lines.append(line)
            index += 1
            continue
        out += _right_to_left_text(text_lines)
        text_lines = []
        out += ['<div dir="ltr">', "", *block, "", "</div>"]
    out += _right_to_left_text(text_lines)
    return "\n".join(out)


def right_to_left(text: str) -> str:
    """Markdown that renders right to left in JupyterLab, Colab and the site: the cell in
    ``<div dir="rtl">`` (blank lines around, so its markdown still renders), its paragraphs
    aligned right, its code and formulas left to right (:func:`_left_to_right_blocks`)."""
    return f'<div dir="rtl">\n\n{_left_to_right_blocks(text)}\n\n</div>'


def translated_text(language: str, english: str, message: Message | None) -> str:
    """A markdown cell in ``language``: the translation, or the English with the marker."""
    if message is not None and message.string and not message.fuzzy:
        text = str(message.string)
        return right_to_left(text) if language in RIGHT_TO_LEFT else text
    marker = fallback_marker(language)
    if language in RIGHT_TO_LEFT:  # the marker is in the language: aligned right too
        marker = right_to_left(marker)
    return f"{marker}\n\n{english}"


def _title_badge(text: str, english: str, language: str, name: str) -> str:
    """The title cell of a built notebook: once the course is published (the English
    title cell has a Colab badge), its badge line opens the translated notebook."""
    at_english = _badge_line_index(english)
    if at_english is None:
        return text
    badge = translated_badge_line(english.split("\n")[at_english], language, name)
    if badge is None:  # not published: the translator's line says where to find it
        return text
    lines = text.split("\n")
    at = _badge_line_index(text)
    at = at if at is not None else min(at_english, len(lines))  # the translator's line
    lines[at : at + 1] = [badge]
    return "\n".join(lines)


def translated_notebook(
    notebook: dict[str, Any], catalog: Catalog | None, language: str, name: str = ""
) -> dict[str, Any]:
    """``notebook`` in ``language``: code cells unchanged, each markdown cell translated
    (or the English with :func:`fallback_marker`), ``metadata.course_translation``."""
    if language not in LANGUAGES:
        raise TranslationError(f"unknown language {language!r}: one of {', '.join(LANGUAGES)}")
    built = json.loads(json.dumps(notebook))
    for index, cell in enumerate(built["cells"]):
        if cell.get("cell_type") == "code" and isinstance(cell.get("id"), str):
            code = translated_code(cell["id"], cell_text(cell), catalog)
            if code != cell_text(cell):
                cell["source"] = code.splitlines(keepends=True)
        if cell.get("cell_type") != "markdown":
            continue
        english = cell_text(cell)
        key = source_text(index, english)
        message = catalog.get(key, context=cell.get("id")) if catalog is not None else None
        if index == 0 and message is not None and message.string and not message.fuzzy:
            # the badge goes in before the right to left wrapping shifts the lines
            title = _title_badge(str(message.string), english, language, name)
            text = right_to_left(title) if language in RIGHT_TO_LEFT else title
        else:
            text = translated_text(language, english, message)
        cell["source"] = text.splitlines(keepends=True)
    # after the title and the Colab setup cell (which must stay cell 1: course_utils.tooling.colab)
    cells = built["cells"]
    setup = len(cells) > 1 and SETUP_TAG in cells[1].get("metadata", {}).get("tags", [])
    cells.insert(2 if setup else 1, language_cell(language))
    built["metadata"]["language"] = language
    built["metadata"]["course_translation"] = {
        "language": language,
        "name": LANGUAGES[language],
        "dir": "rtl" if language in RIGHT_TO_LEFT else "ltr",
        "english": f"notebooks/{name}" if name else "",
    }
    return built


LANGUAGE_CELL_ID = "course-language"


def language_cell(language: str) -> dict[str, Any]:
    """The code cell a built notebook gets after its title and setup cell: the course's
    messages (exercise feedback, what the package prints) in its language from there on."""
    source = (
        f'# The course\'s messages in {LANGUAGES[language]} ("en": in English)\n'
        f'import os\n\nos.environ["{LANGUAGE_VAR}"] = "{language}"'
    )
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": LANGUAGE_CELL_ID,
        "metadata": {},
        "outputs": [],
        "source": source.splitlines(keepends=True),
    }


def build(language: str, notebooks: list[Path], out: Path, root: Path = TRANSLATIONS) -> list[Path]:
    """Write ``notebooks`` in ``language`` into ``out`` (same file names); return them."""
    if language not in LANGUAGES:
        raise TranslationError(f"unknown language {language!r}: one of {', '.join(LANGUAGES)}")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        catalog_file = catalog_path(language, path, root)
        catalog = read_catalog(catalog_file, language) if catalog_file.is_file() else None
        notebook = translated_notebook(read_english_notebook(path), catalog, language, path.name)
        target = out / path.name
        target.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", "utf-8")
        written.append(target)
    return written
