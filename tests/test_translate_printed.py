"""What code cells print, in the notebook's language (issue 44): each explanation a code
cell passes to ``print`` is an entry of the notebook's catalog, and a built notebook prints
its translation with the code around it unchanged."""

from __future__ import annotations

import ast
import contextlib
import io
import json
from pathlib import Path

import pytest
from babel.messages.catalog import Catalog, Message

from course_utils.tooling import translate
from course_utils.tooling.translate import printed_texts, python_literal, translated_code

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

CELL = """\
name, times = "T4", 3  # নাম: a comment that is not ASCII before the literal
!echo a shell line that is not Python
print("torch.cuda.is_available():", name == "T4")
if times:
    print(f"No GPU here: a {name} would run this {times * 2:d} times "
          "({{braces}} stay) and say \\"done\\"\\n")
print("ok")
"""


def _catalog(translations: dict[str, str], fuzzy: bool = False) -> Catalog:
    catalog = Catalog(locale="bn")
    for template, text in translations.items():
        (printed,) = [p for p in printed_texts("c1", CELL) if p.template == template]
        flags = {"fuzzy"} if fuzzy else set()
        catalog[template] = Message(template, string=text, context=printed.context, flags=flags)
    return catalog


def _run(source: str) -> str:
    """What a cell prints (its ``!`` lines skipped, as IPython would run them elsewhere)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(translate._masked(source), {})
    return out.getvalue()


def test_a_cell_s_explanations_are_found_and_its_code_like_strings_are_not():
    (printed,) = printed_texts("c1", CELL)
    assert printed.context == "c1:print:1"
    assert printed.template == (
        "No GPU here: a {name} would run this {times * 2:d} times ({{{{braces}}}} stay) "
        'and say "done"\n'
    )
    literal = CELL[printed.start : printed.end]  # offsets in characters, after the Bengali
    assert literal.startswith('f"No GPU here') and literal.endswith('\\n"')
    assert printed_texts("c2", "%%writefile x.py\nprint('a sentence of four words')") == []
    assert printed_texts("c3", "print('a sentence of' ") == []  # not Python: nothing


def test_every_printed_text_of_the_notebooks_round_trips_to_the_same_code():
    """The literal a built notebook writes from an entry's English is the code the cell has
    (the same syntax tree): an untranslated explanation prints exactly what it did."""
    found = 0
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = translate.cell_text(cell)
            for printed in printed_texts(cell["id"], source):
                found += 1
                written = ast.parse(f"({source[printed.start : printed.end]})", mode="eval")
                rebuilt = ast.parse(python_literal(printed.template), mode="eval")
                assert ast.dump(written) == ast.dump(rebuilt), printed.context
    assert found >= 150  # every notebook explains its CPU branches in print()


def test_a_built_cell_prints_the_translation_with_its_fields_filled():
    (printed,) = printed_texts("c1", CELL)
    bengali = 'GPU নেই: একটি {name} এটি {times * 2:d} বার চালাত ({{{{braces}}}}) আর বলত "done"\n'
    built = translated_code("c1", CELL, _catalog({printed.template: bengali}))
    assert _run(built) == (
        "torch.cuda.is_available(): True\n"
        'GPU নেই: একটি T4 এটি 6 বার চালাত ({{braces}}) আর বলত "done"\n\nok\n'
    )
    assert built.splitlines()[0] == CELL.splitlines()[0]  # the code around it as it was
    assert _run(translated_code("c1", CELL, None)) == _run(CELL)


@pytest.mark.parametrize(
    "problem",
    ["fields", "fuzzy", "quote"],
)
def test_a_translation_that_cannot_be_used_leaves_the_english(problem):
    (printed,) = printed_texts("c1", CELL)
    text = {
        "fields": "GPU নেই: {name} এটি চালাত",  # {times * 2:d} lost: never used
        "fuzzy": "GPU নেই: {name} {times * 2:d}",
        "quote": "GPU নেই: {name} {times * 2:d} \"'\\",  # quotes and a backslash: still parses
    }[problem]
    built = translated_code("c1", CELL, _catalog({printed.template: text}, problem == "fuzzy"))
    if problem == "quote":
        assert _run(built).splitlines()[1] == "GPU নেই: T4 6 \"'\\"
    else:
        assert built == CELL


def test_the_checker_names_a_printed_text_whose_fields_differ():
    english = "No GPU here: a {name} would run this {times * 2:d} times"
    problems = translate.entry_problems(english, "GPU নেই: {name} এটি চালাত", [], printed=True)
    assert any(p.startswith("fields differ: missing {'{times * 2:d}': 1}") for p in problems)
    assert translate.entry_problems(english, "GPU নেই: {name} {times * 2:d} বার", [], True) == []
    assert translate.entry_problems("a {name} here", "এখানে", []) == []  # markdown: no fields


def test_update_adds_a_code_cell_s_explanations_to_the_catalog(tmp_path):
    notebook = {
        "cells": [
            {"cell_type": "markdown", "id": "a", "metadata": {}, "source": "One."},
            {"cell_type": "code", "id": "c1", "metadata": {}, "source": CELL,
             "outputs": [], "execution_count": None},
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }  # fmt: skip
    path = tmp_path / "notebooks" / "01_tiny.ipynb"
    path.parent.mkdir()
    path.write_text(json.dumps(notebook), encoding="utf-8")
    result = translate.update_catalog("bn", path, tmp_path / "translations")
    assert result.added == 2
    catalog = translate.read_catalog(result.path, "bn")
    assert [m.context for m in catalog if m.id] == ["a", "c1:print:1"]


def test_a_changed_text_keeps_its_format_flag_beside_fuzzy(tmp_path):
    """msgfmt --check compares a translation's {fields} only where the entry says
    python-brace-format: an English edit marks the entry fuzzy without dropping that."""

    def write(text: str) -> Path:
        cell = {"cell_type": "code", "id": "c1", "metadata": {}, "outputs": [],
                "execution_count": None, "source": f'print(f"{text}")'}  # fmt: skip
        notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        path = tmp_path / "notebooks" / "01_tiny.ipynb"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(notebook), encoding="utf-8")
        return path

    root = tmp_path / "translations"
    first = translate.update_catalog("bn", write("the batch took {ms} ms here"), root)
    catalog = translate.read_catalog(first.path, "bn")
    entry = catalog.get("the batch took {ms} ms here", context="c1:print:1")
    entry.string = "ব্যাচে {ms} ms লেগেছে"
    translate.write_catalog(catalog, first.path)
    again = translate.update_catalog("bn", write("each batch took {ms} ms here"), root)
    assert again.changed == 1
    text = again.path.read_text(encoding="utf-8")  # as msgfmt reads it (Babel adds the flag)
    assert "#, fuzzy, python-brace-format\n" in text
