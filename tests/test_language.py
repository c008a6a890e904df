"""The course's messages in the learner's language (course_utils/language.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from babel.messages.pofile import read_po

from course_utils import language
from course_utils.checks.nb01 import MESSAGES_01, check_time_it_median
from course_utils.feedback import CheckFailed
from course_utils.language import LANGUAGE_VAR, LANGUAGES, Messages, translated
from course_utils.tooling import translate

ROOT = Path(__file__).resolve().parent.parent
CATALOGS = sorted((ROOT / "translations").glob("*/*.po"))


@pytest.mark.parametrize("path", CATALOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_runtime_reader_reads_every_catalog_as_babel_does(path):
    """language.py reads the catalogs without Babel (Colab has none): the same entries."""
    with path.open("rb") as file:
        catalog = read_po(file)
    babel = {
        (m.context or "", str(m.id), str(m.string), m.fuzzy)
        for m in catalog
        if m.id and isinstance(m.id, str)
    }
    ours = {entry for entry in language._entries(path.read_text(encoding="utf-8")) if entry[1]}
    assert ours == babel


def _catalog(folder: Path, code: str, entries: list[tuple[str, str, str, bool]]) -> None:
    lines = ['msgid ""', 'msgstr ""', '"Content-Type: text/plain; charset=UTF-8\\n"', ""]
    for context, english, text, fuzzy in entries:
        lines += ["#, fuzzy"] if fuzzy else []
        lines += [f"msgctxt {json.dumps(context)}", f"msgid {json.dumps(english)}"]
        lines += [f"msgstr {json.dumps(text, ensure_ascii=False)}", ""]
    target = folder / code / language.MESSAGES_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines), encoding="utf-8")


@pytest.fixture
def fake_catalogs(tmp_path, monkeypatch):
    monkeypatch.setattr(language, "_PACKAGED", tmp_path)
    return tmp_path


def test_a_translation_is_used_only_where_it_is_usable(fake_catalogs, monkeypatch):
    table = Messages("test-usable", {"ok": "{n} late", "fuzzy": "{n} early", "fields": "{n} x"})
    _catalog(
        fake_catalogs,
        "bn",
        [
            ("test-usable:ok", "{n} late", "{n} দেরি", False),
            ("test-usable:fuzzy", "{n} early", "{n} আগে", True),  # fuzzy: English
            ("test-usable:fields", "{n} x", "{m} x", False),  # other fields: English
        ],
    )
    monkeypatch.delenv(LANGUAGE_VAR, raising=False)
    assert table["ok"].format(n=3) == "3 late"  # no language set: English
    monkeypatch.setenv(LANGUAGE_VAR, "bn")
    assert table["ok"].format(n=3) == "3 দেরি"
    assert table["fuzzy"] == "{n} early"
    assert table["fields"] == "{n} x"
    monkeypatch.setenv(LANGUAGE_VAR, "xx")  # not a language of the course: English
    assert table["ok"] == "{n} late"
    monkeypatch.setenv(LANGUAGE_VAR, "ne")  # no catalog: English
    assert table["ok"] == "{n} late"


def test_use_language_sets_it_for_this_process_and_refuses_others(monkeypatch):
    monkeypatch.delenv(LANGUAGE_VAR, raising=False)
    language.use_language("AR ")
    assert language.course_language() == "ar" == os.environ[LANGUAGE_VAR]
    with pytest.raises(ValueError, match="unknown language 'fr'"):
        language.use_language("fr")
    language.use_language("en")
    assert language.course_language() == "en"


def test_a_garbled_catalog_is_english_not_an_error(fake_catalogs, monkeypatch):
    (fake_catalogs / "ar").mkdir()
    (fake_catalogs / "ar" / language.MESSAGES_FILE).write_bytes(b"\xff\xfe msgid")
    monkeypatch.setenv(LANGUAGE_VAR, "ar")
    assert translated("01:time_it mean", "median please") == "median please"
    bad_escape = 'msgctxt "01:time_it mean"\nmsgid "median please"\nmsgstr "\\x"\n'
    (fake_catalogs / "ar" / language.MESSAGES_FILE).write_text(bad_escape, encoding="utf-8")
    assert translated("01:time_it mean", "median please") == "median please"


def test_a_check_says_its_feedback_in_the_learners_language(fake_catalogs, monkeypatch):
    """A wrong answer to 01 (c) (the mean of the repeats) told in Nepali from the catalog,
    with the figures of its case filled in."""
    english = MESSAGES_01.english["time_it mean"]
    nepali = "दोहोराइहरू {shown} ले {got} दियो: औसत होइन, मध्यक फर्काउनुहोस्"
    _catalog(fake_catalogs, "ne", [("01:time_it mean", english, nepali, False)])

    def mean(fn, device, warmup=2, repeats=5):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            start = __import__("time").perf_counter()
            fn()
            times.append(__import__("time").perf_counter() - start)
        return sum(times) / len(times)

    monkeypatch.setenv(LANGUAGE_VAR, "ne")
    with pytest.raises(CheckFailed) as told:
        check_time_it_median(mean)
    assert str(told.value).startswith("दोहोराइहरू 10 ms, 30 ms") and "मध्यक" in str(told.value)
    monkeypatch.setenv(LANGUAGE_VAR, "en")
    with pytest.raises(CheckFailed, match="the mean of the repeats"):
        check_time_it_median(mean)


def test_every_message_table_is_extracted_and_named_once():
    entries = translate.message_entries()
    contexts = [context for context, _ in entries]
    assert len(contexts) == len(set(contexts))
    tables = {context.split(":")[0] for context in contexts}
    assert {"01", "02", "04", "05", "06", "07", "08", "claims", "timing"} <= tables


def test_a_built_notebook_sets_its_language_first(tmp_path):
    """The language cell follows the title and the Colab setup cell (which publishing
    keeps as cell 1); run, it makes the package speak the language."""
    notebook = json.loads((ROOT / "notebooks" / "01_runtime_and_devices.ipynb").read_text())
    built = translate.translated_notebook(notebook, None, "bn", "01_runtime_and_devices.ipynb")
    cell = built["cells"][2]
    assert cell["cell_type"] == "code" and cell["id"] == translate.LANGUAGE_CELL_ID
    assert "colab-setup" in str(built["cells"][1]["metadata"])  # the setup cell, still cell 1
    assert built["cells"][3]["id"] == notebook["cells"][2]["id"]
    assert built["metadata"]["language"] == "bn"
    code = "".join(cell["source"]) + "\nfrom course_utils.language import course_language\n"
    code += "print(course_language())"
    env = {k: v for k, v in os.environ.items() if k != LANGUAGE_VAR}
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert ran.stdout.strip() == "bn", ran.stderr


@pytest.mark.slow
@pytest.mark.parametrize("code", LANGUAGES)
def test_the_real_messages_and_readme_catalogs_are_in_step_and_pass_the_checker(code):
    problems = translate.check_documents([code])
    assert problems == [], "\n".join(problems[:20])


@pytest.mark.parametrize("code", LANGUAGES)
def test_every_message_is_translated(code):
    """Every message a check or the package can say, and every block of the README's
    course part, has a usable translation."""
    rows = translate.documents_coverage([code])[code]
    assert [row.notebook for row in rows] == ["messages", "README"]
    for row in rows:
        assert row.translated == row.total, f"{code}: {row.notebook} {row.translated}/{row.total}"


def test_a_language_sites_home_page_is_the_readmes_course_part_translated(tmp_path):
    """The README's introduction and its Colab and Notebooks sections, block by block: the
    translation where there is one, the English under the marker where not; not the rest."""
    from course_utils.tooling import site
    from course_utils.tooling.colab import README_BADGE_LINE

    readme = (
        f"# Course\n\n{README_BADGE_LINE}\n\n"
        "Intro text.\n\n## Quick start\n\nmake course\n\n## Google Colab\n\n1. Open it.\n"
    )
    (tmp_path / "README.md").write_text(readme, encoding="utf-8")
    entries = translate.readme_entries(readme)
    assert [text for _, text in entries] == ["# Course", "Intro text.", "## Google Colab",
                                             "1. Open it."]  # fmt: skip
    catalogs = tmp_path / "translations"
    (catalogs / "bn").mkdir(parents=True)
    translate.update_documents("bn", catalogs)
    path = translate.document_path("bn", translate.README_DOMAIN, catalogs)
    catalog = translate.read_catalog(path, "bn")
    catalog.get("# Course", context="README:intro:1").string = "# কোর্স"
    catalog.get("1. Open it.", context="README:google-colab:2").string = "1. এটি খুলুন।"
    translate.write_catalog(catalog, path)
    blocks = site._readme_in("bn", tmp_path)
    assert blocks[0] == "# কোর্স" and blocks[3] == "1. এটি খুলুন।"
    assert blocks[1] == f"{translate.fallback_marker('bn')}\n\nIntro text."
    assert not any("make course" in block for block in blocks)
