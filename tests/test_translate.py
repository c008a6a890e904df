"""The translations (issue 36): catalogs kept in step with the English, the checker, the
translated notebooks (code byte-identical, fallback marker, right to left for Arabic),
their nbval run and grading, and the coverage that says the translators are done."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
from babel.messages.catalog import Catalog

from course_utils.tooling import translate
from course_utils.tooling.cli import main
from course_utils.tooling.translate import (
    LANGUAGES,
    TRANSLATIONS,
    catalog_path,
    read_catalog,
    read_glossary,
    write_catalog,
)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NB01 = ROOT / "notebooks" / "01_runtime_and_devices.ipynb"


@pytest.fixture
def catalogs(tmp_path: Path) -> Path:
    """A copy of translations/ to write made-up translations into."""
    shutil.copytree(TRANSLATIONS, tmp_path / "translations")
    return tmp_path / "translations"


def _catalog(root: Path, language: str, notebook: Path = NB01) -> Catalog:
    return read_catalog(catalog_path(language, notebook, root), language)


def _translate(root: Path, language: str, notebook: Path, fill) -> Catalog:
    """Fill each entry of the catalog (``fill(message) -> str | None``) and write it."""
    catalog = _catalog(root, language, notebook)
    for message in catalog:
        if message.id:
            text = fill(message)
            if text is not None:
                message.string = text
    write_catalog(catalog, catalog_path(language, notebook, root))
    return catalog


def _glossed(language: str):
    """A made-up translation that passes the checker: the English, with the glossary's
    renderings of the terms it uses added (tests only: the real ones are the translators')."""
    glossary = read_glossary(language)

    def fill(message) -> str:
        english = str(message.id)
        terms = [t.translation for t in glossary if t.applies_to(english)]
        return f"{english}\n\n<!-- {LANGUAGES[language]}: {' '.join(terms)} -->"

    return fill


def _notebook(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# --- update --------------------------------------------------------------------------------
def _tiny(tmp_path: Path, cells: list[tuple[str, str, str]]) -> Path:
    notebook = {
        "cells": [
            {"cell_type": kind, "id": cid, "metadata": {}, "source": text}
            | ({"outputs": [], "execution_count": None} if kind == "code" else {})
            for kind, cid, text in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = tmp_path / "notebooks" / "01_tiny.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(notebook), encoding="utf-8")
    return path


def test_update_adds_marks_changed_fuzzy_removed_obsolete_and_does_not_churn(tmp_path):
    root = tmp_path / "translations"
    nb = _tiny(
        tmp_path, [("markdown", "a", "One `x`."), ("code", "c", "x = 1"), ("markdown", "b", "Two.")]
    )
    first = translate.update_catalog("bn", nb, root)
    assert (first.added, first.changed, first.removed) == (2, 0, 0)
    path = catalog_path("bn", nb, root)
    catalog = read_catalog(path, "bn")
    assert [m.context for m in catalog if m.id] == ["a", "b"]  # code cells: no entry
    for message in catalog:
        if message.id:
            message.string = "অনুবাদ `x`।" if message.context == "a" else "দুই।"
    write_catalog(catalog, path)
    written = path.read_bytes()
    again = translate.update_catalog("bn", nb, root)
    assert (again.added, again.changed, again.removed) == (0, 0, 0)
    assert path.read_bytes() == written  # no churn, the header's dates kept

    _tiny(tmp_path, [("markdown", "a", "One `x`, changed."), ("markdown", "n", "New.")])
    result = translate.update_catalog("bn", nb, root)
    assert (result.added, result.changed, result.removed) == (1, 1, 1)
    catalog = read_catalog(path, "bn")
    a = catalog.get("One `x`, changed.", context="a")
    assert a.fuzzy and a.string == "অনুবাদ `x`।" and a.previous_id == ["One `x`."]
    assert catalog.get("New.", context="n").string == ""
    assert [m.string for m in catalog.obsolete.values()] == ["দুই।"]
    header = read_catalog(path, "bn").creation_date
    translate.update_catalog("bn", nb, root)
    assert read_catalog(path, "bn").creation_date == header


def _msgfmt() -> str:
    """gettext's msgfmt: .ci/run installs it, so in CI (CI=true) its absence fails."""
    found = shutil.which("msgfmt")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("no msgfmt: install gettext (.ci/run does)")
        pytest.skip("no msgfmt (gettext) here")
    return found


def test_catalogs_pass_msgfmt_check_with_a_percent_sign_translated(tmp_path):
    msgfmt = _msgfmt()
    nb = _tiny(tmp_path, [("markdown", "a", "At 100% GPU-Util (`%timeit`).")])
    translate.update_catalog("ar", nb, tmp_path / "translations")
    path = catalog_path("ar", nb, tmp_path / "translations")
    catalog = read_catalog(path, "ar")
    for message in catalog:
        if message.id:
            message.string = "عند ٪100 من GPU-Util (`%timeit`)."
    write_catalog(catalog, path)
    assert "python-format" not in path.read_text(encoding="utf-8")
    result = subprocess.run(
        [msgfmt, "--check", "-o", "/dev/null", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_publishing_the_badges_does_not_make_a_catalog_stale(tmp_path, catalogs):
    from course_utils.tooling.colab import badge_line

    notebook = _notebook(NB01)
    lines = "".join(notebook["cells"][0]["source"]).split("\n")
    lines[2] = badge_line("someone/course", "colab", "notebooks/" + NB01.name)
    notebook["cells"][0]["source"] = "\n".join(lines)
    assert translate.stale_problems(_catalog(catalogs, "bn"), notebook) == []
    notebook["cells"][0]["source"] = "# 01 — Another title\n"
    assert translate.stale_problems(_catalog(catalogs, "bn"), notebook)


# --- the checker ----------------------------------------------------------------------------
GLOSSARY = [translate.GlossaryTerm("batch", "ব্যাচ", re.compile("ব্যাচ"))]
ENGLISH = (
    "A batch of 64 on `cuda:0` is $2^{6}$ samples; see [the docs](https://pytorch.org/x).\n\n"
    "```python\nx.to(device)\n```"
)
GOOD = (
    "`cuda:0`-এ 64-এর একটি ব্যাচ মানে $2^{6}$টি নমুনা; দেখুন [ডকুমেন্টেশন](https://pytorch.org/x)।\n\n"
    "```python\nx.to(device)\n```"
)


@pytest.mark.parametrize(
    ("bad", "kind"),
    [
        (GOOD.replace("`cuda:0`", "`cuda:1`"), "code spans differ"),
        (GOOD.replace("`cuda:0`", "cuda:0"), "code spans differ"),
        (GOOD.replace("x.to(device)", "x.cuda()"), "fenced code differ"),
        (GOOD.replace("https://pytorch.org/x", "https://pytorch.org/y"), "link targets differ"),
        (GOOD.replace("64", "৬৪"), "numbers differ"),  # Bengali digits: not the English's
        (GOOD.replace("$2^{6}$", "$2^6$"), "formulas differ"),
        (GOOD.replace("ব্যাচ", "গুচ্ছ"), "glossary: 'batch'"),
    ],
)
def test_the_checker_catches_each_kind_of_difference(bad, kind):
    assert translate.entry_problems(ENGLISH, GOOD, GLOSSARY) == []
    problems = translate.entry_problems(ENGLISH, bad, GLOSSARY)
    assert problems and problems[0].startswith(kind), problems


QUOTE = '*"Dramatic optimization: ~25 % faster from 50257 → 50304, a multiple of 64."*'


def test_a_gloss_may_repeat_the_numbers_and_code_of_the_quote_it_glosses():
    english = f"{QUOTE} Check it with `pad_vocab`."
    gloss = "(أي: تسريع بنحو 25 % برفع 50257 إلى 50304، أقرب مضاعف لـ 64 عبر `pad_vocab`.)"
    arabic = f"{QUOTE} {gloss} تحقق منه بـ `pad_vocab`."
    assert translate.entry_problems(english, arabic, []) == []
    # still refused: a number the English lacks, and code it has left out
    changed = translate.entry_problems(english, arabic.replace("إلى 50304", "إلى 50305"), [])
    assert changed == ["numbers differ: extra {'50305': 1}"]
    dropped = translate.entry_problems(english, arabic.replace("`pad_vocab`", "pad_vocab"), [])
    assert dropped == ["code spans differ: missing {'pad_vocab': 1}"]


def test_an_arabic_number_with_its_prefix_letter_attached_is_the_number():
    english = "7.5 for a T4, 8.0 for an A100"
    assert translate.entry_problems(english, "7.5 لـ T4، و8.0 لـ A100", []) == []
    assert translate.entry_problems(english, "7.5 لـ T4، و8.1 لـ A100", [])
    # a Latin identifier's digits are still not a number
    assert translate.protected_parts("sm_80 and x2 and 3")["numbers"] == {"3": 1}


def test_the_glossary_says_one_word_per_concept_in_every_entry(tmp_path):
    (tmp_path / "ar").mkdir()
    (tmp_path / "ar" / "glossary.tsv").write_text(
        "english\ttranslation\tmust_match\tnote\tmust_not_match\n"
        "course\tالمقرر\tالمقرر\t\tالدورة\n"
        "batch\tدفعة\tدفعة|دفعات\t\t\n",
        encoding="utf-8",
    )
    glossary = read_glossary("ar", tmp_path)
    assert glossary[1].must_not_match is None
    # the other word is refused even where the English does not name the concept
    problems = translate.entry_problems("Run it.", "شغّله كما في الدورة.", glossary)
    assert problems == ["glossary: 'course' is المقرر in every notebook, not 'الدورة'"]
    assert translate.entry_problems("Run it.", "شغّله كما في المقرر.", glossary) == []
    # inside code (a name, not prose) it is not looked for
    assert translate.entry_problems("Run `الدورة`.", "شغّل `الدورة`.", glossary) == []
    # nor in quoted English (a claim, a title) or a link's text; nor, in the English, is a
    # term only inside a quoted title one the translation must render
    loss = translate.GlossaryTerm(
        "loss", "লস", re.compile("লস"), "", re.compile(r"(?i)(?<![A-Za-z])loss(?![A-Za-z])")
    )
    english = '*"Compute the loss before backprop."* See [Loss functions](https://x.y/loss).'
    bengali = (
        '*"Compute the loss before backprop."* (লস হিসাব করুন।) দেখুন '
        "[Loss functions](https://x.y/loss)।"
    )
    assert translate.entry_problems(english, bengali, [loss]) == []
    assert translate.entry_problems(english, bengali.replace("লস হিসাব", "loss হিসাব"), [loss])
    title = translate.entry_problems("Read *Loss Landscapes*.", "পড়ুন *Loss Landscapes*।", [loss])
    assert title == []


def test_the_check_finds_an_earlier_english_left_as_a_translator_comment(tmp_path, catalogs):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    notebook = tmp_path / "notebooks" / NB01.name
    assert translate.check_catalogs(["ne"], [notebook], catalogs) == []
    path = catalog_path("ne", NB01, catalogs)
    text = path.read_text(encoding="utf-8")
    stale = '# | msgid ""\n# | "An older English sentence.\n'
    path.write_text(text.replace('msgctxt "nb01-10"', stale + 'msgctxt "nb01-10"'), "utf-8")
    problems = translate.check_catalogs(["ne"], [notebook], catalogs)
    assert problems == [
        "ne/01_runtime_and_devices.po nb01-10: a translator comment copies an earlier English "
        "(# | msgid ...): delete it"
    ]


def test_a_term_inside_a_longer_glossary_term_is_the_longer_ones():
    glossary = [
        translate.GlossaryTerm("tensor", "موتر", re.compile("موتر")),
        translate.GlossaryTerm("tensor core", "أنوية Tensor", re.compile("أنوية Tensor")),
    ]
    # "tensor cores", plural and over a line break, is the longer term alone
    plural = translate.entry_problems("fp16 on tensor\ncores.", "fp16 على أنوية Tensor.", glossary)
    assert plural == []
    problems = translate.entry_problems("A tensor on tensor cores.", "على أنوية Tensor.", glossary)
    assert problems == ["glossary: 'tensor' should be rendered as موتر"]


@pytest.mark.slow
def test_check_command_reports_problems_and_stale_catalogs_one_line_each(
    tmp_path, catalogs, capsys
):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    assert main(["translate", "check", "--root", str(tmp_path)]) == 0
    _translate(catalogs, "ar", NB01, lambda m: "ترجمة" if m.context == "nb01-01" else None)
    stale_nb = tmp_path / "notebooks" / "02_nvidia_smi_and_monitoring.ipynb"
    notebook = _notebook(stale_nb)
    prose = [c for c in notebook["cells"][1:] if c["cell_type"] == "markdown"]
    first_md = prose[0]
    first_md["source"] = "".join(first_md["source"]) + "\nA new English sentence."
    stale_nb.write_text(json.dumps(notebook), encoding="utf-8")
    capsys.readouterr()
    assert main(["translate", "check", "--root", str(tmp_path), "--lang", "ar"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(
        line.startswith("ar/01_runtime_and_devices.po nb01-01: code spans differ") for line in out
    )
    stale = [line for line in out if "stale" in line]
    assert stale and all("02_nvidia" in line and "translate update" in line for line in stale)
    # bad input: one line, exit 2
    assert main(["translate", "coverage", "--lang", "xx"]) == 2
    catalog_path("bn", NB01, catalogs).write_text('msgid "x\nmsgstr garbled', encoding="utf-8")
    assert main(["translate", "check", "--root", str(tmp_path), "--lang", "bn"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "cannot read catalog" in err


# --- build ----------------------------------------------------------------------------------
def test_build_keeps_code_and_grading_metadata_and_marks_what_is_not_translated(catalogs):
    title = "# ০১ — রানটাইম\n\nঅনুবাদ।"
    _translate(catalogs, "bn", NB01, lambda m: title if m.context == "nb01-01" else "")
    out = catalogs.parent / "built"
    (built_path,) = translate.build("bn", [NB01], out, catalogs)
    english, built = _notebook(NB01), _notebook(built_path)
    language = built["cells"].pop(2)  # after the title and setup cells (test_language.py)
    assert language["id"] == translate.LANGUAGE_CELL_ID
    assert len(english["cells"]) == len(built["cells"])
    marker = translate.fallback_marker("bn")
    for old, new in zip(english["cells"], built["cells"], strict=True):
        assert old["id"] == new["id"] and old["metadata"] == new["metadata"]  # grade_ids, nbgrader
        if old["cell_type"] == "code":
            assert old == new  # byte-identical: source, outputs, everything
        elif old["id"] == "nb01-01":
            assert "".join(new["source"]).startswith("# ০১ — রানটাইম")
        else:
            text = "".join(new["source"])
            assert text == f"{marker}\n\n" + "".join(old["source"])
    assert built["metadata"]["course_translation"]["dir"] == "ltr"
    assert built["metadata"]["kernelspec"] == english["metadata"]["kernelspec"]


def test_arabic_cells_render_right_to_left_with_code_and_formulas_left_to_right():
    english = "Text `x.to(device)`.\n\n| a | `b` |\n|---|---|\n| 1 | 2 |\n\n```python\nx = 1\n```"
    text = translate.right_to_left(english.replace("Text", "نص"))
    assert text.startswith('<div dir="rtl">\n\n') and text.endswith("\n\n</div>")
    assert "<bdi>`x.to(device)`</bdi>" in text
    assert text.count('<div dir="ltr">\n\n') == 1  # the fenced code; the table reads rtl
    assert "| a | <bdi>`b`</bdi> |\n|---|---|\n| 1 | 2 |" in text
    assert f"{translate.ALIGN_RIGHT}نص <bdi>`x.to(device)`</bdi>.</span>" in text
    # a claim quoted in English keeps its question mark at its end (review B3)
    quoted = translate.right_to_left('الادعاء: *"Is PyTorch like NumPy\non the GPU?"* لا.')
    assert '<bdi>*"Is PyTorch like NumPy\non the GPU?"*</bdi> لا.' in quoted
    # what the checker compares is untouched by the wrapping
    spans = translate.protected_parts(text)["code spans"]
    assert spans == translate.protected_parts(english)["code spans"]


class _Reading(HTMLParser):
    """The text a reader sees of rendered HTML, and its inline code spans."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.codes: list[str] = []
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.open.append(tag)
        if tag == "code" and "pre" not in self.open:
            self.codes.append("")

    def handle_endtag(self, tag):
        while self.open and self.open.pop() != tag:
            pass

    def handle_data(self, data):
        self.text.append(data)
        if "code" in self.open and "pre" not in self.open:
            self.codes[-1] += data


def _read(markdown: str) -> _Reading:
    """``markdown`` rendered as CommonMark with tables (raw HTML kept as HTML), read."""
    mistune = pytest.importorskip("mistune")
    reading = _Reading()
    reading.feed(mistune.create_markdown(escape=False, plugins=["table"])(markdown))
    return reading


def _spans(codes) -> Counter:
    return Counter(" ".join(code.split()) for code in codes)


def test_a_code_span_going_on_over_a_line_break_stays_one_span_right_to_left():
    english = 'See `torch.device("cuda" if ok else\n"cpu")`. And `choose_device()` too.'
    arabic = 'انظر `torch.device("cuda" if ok else\n"cpu")`. أما `choose_device()` فأيضًا.'
    reading = _read(translate.right_to_left(arabic))
    spans = translate.protected_parts(english)["code spans"].elements()
    assert _spans(reading.codes) == _spans(spans)
    assert "<bdi>" not in "".join(reading.text) and "</bdi>" not in "".join(reading.text)


@pytest.mark.slow
@pytest.mark.parametrize("language", LANGUAGES)
def test_no_built_notebook_shows_markup_as_text_and_its_code_spans_stay_whole(tmp_path, language):
    for built in translate.build(language, NOTEBOOKS, tmp_path):
        for cell_id, text in translate.markdown_cells(_notebook(built)):
            reading = _read(text)
            shown = "".join(reading.text)
            for tag in ("<bdi", "</bdi", "<span", "</span", "<div", "</div"):
                assert tag not in shown, f"{built.name} {cell_id}: {tag} shown as text"
            # each code span of the cell's markdown is one code element, whole
            spans = _spans(translate.protected_parts(text)["code spans"].elements())
            assert _spans(reading.codes) == spans, f"{built.name} {cell_id}"


def test_a_published_title_cell_gets_its_own_language_badge(catalogs):
    from course_utils.tooling.colab import badge_line

    notebook = _notebook(NB01)
    lines = "".join(notebook["cells"][0]["source"]).split("\n")
    lines[2] = badge_line("someone/course", "colab", "notebooks/" + NB01.name)
    notebook["cells"][0]["source"] = "\n".join(lines)
    catalog = _translate(
        catalogs,
        "ne",
        NB01,
        lambda m: m.id.replace("Runtime", "रनटाइम") if m.context == "nb01-01" else None,
    )
    built = translate.translated_notebook(notebook, catalog, "ne", NB01.name)
    title = "".join(built["cells"][0]["source"]).split("\n")
    assert "रनटाइम" in title[0]
    assert f"blob/colab/notebooks/ne/{NB01.name})" in title[2].split(" · ")[0]
    english = "https://colab.research.google.com/github/someone/course/blob/colab/notebooks/"
    assert f"[English]({english}{NB01.name})" in title[2]


def test_a_published_arabic_title_cell_keeps_its_title_and_gets_its_badge(catalogs):
    # the right to left wrapping adds lines above the title: the badge must still replace
    # the translator's badge line, not the title
    from course_utils.tooling.colab import badge_line

    notebook = _notebook(NB01)
    lines = "".join(notebook["cells"][0]["source"]).split("\n")
    lines[2] = badge_line("someone/course", "colab", "notebooks/" + NB01.name)
    notebook["cells"][0]["source"] = "\n".join(lines)
    catalog = _translate(
        catalogs,
        "ar",
        NB01,
        lambda m: m.id.replace("Runtime", "وقت التشغيل") if m.context == "nb01-01" else None,
    )
    built = translate.translated_notebook(notebook, catalog, "ar", NB01.name)
    title = "".join(built["cells"][0]["source"]).split("\n")
    assert title[0] == '<div dir="rtl">' and title[-1] == "</div>"
    assert title[2].startswith("# ") and "وقت التشغيل" in title[2]
    badges = [line for line in title if "colab-badge.svg" in line]
    assert len(badges) == 1 and f"blob/colab/notebooks/ar/{NB01.name})" in badges[0]
    assert title.index(badges[0]) == 4
    assert not any(line.startswith("*Open in Colab:*") for line in title)


# --- the real catalogs ----------------------------------------------------------------------
@pytest.mark.slow
def test_the_real_catalogs_are_in_step_and_pass_the_checker():
    problems = translate.check_catalogs(list(LANGUAGES), NOTEBOOKS)
    assert problems == [], "\n".join(problems[:20])


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_glossary_is_well_formed_and_covers_the_course_terms(language):
    glossary = read_glossary(language)
    english = {term.english.lower() for term in glossary}
    assert {"gpu", "batch", "kernel", "throughput", "mixed precision"} <= english
    for term in glossary:  # each rendering matches its own rule
        assert term.must_match.search(term.translation), (term.english, term.translation)


@pytest.mark.parametrize("language", LANGUAGES)
def test_coverage_is_complete(language):
    """Issue 36's "Done when": every markdown cell of 01-09 translated, none fuzzy. Fails
    until the translators' catalogs are merged."""
    rows = translate.coverage([language], NOTEBOOKS)[language]
    missing = [f"{r.notebook} {r.translated}/{r.total}" for r in rows if r.translated < r.total]
    assert not missing, f"{language}: not yet translated: {', '.join(missing)}"


# --- translated notebooks run, grade and strip like the English ones ----------------------
RUN = {
    "bn": "01_runtime_and_devices",
    "ar": "02_nvidia_smi_and_monitoring",
    "ne": "07_gpu_memory_and_cache",
}


@pytest.mark.slow
@pytest.mark.parametrize(("language", "stem"), RUN.items())
def test_a_translated_notebook_runs_under_nbval(tmp_path, catalogs, language, stem):
    source = ROOT / "notebooks" / f"{stem}.ipynb"
    _translate(catalogs, language, source, _glossed(language))
    (built,) = translate.build(language, [source], tmp_path / "built", catalogs)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval-lax", str(built)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "COURSE_WORKLOAD": "small", "COURSE_PROGRESS": "off"},
    )
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.slow
def test_a_translated_submission_grades_like_the_english_one(tmp_path, catalogs):
    from course_utils.instructor.grading import grade_submission

    _translate(catalogs, "ar", NB01, _glossed("ar"))
    (built,) = translate.build("ar", [NB01], tmp_path / "ar", catalogs)
    translated = grade_submission(built, NB01)[0]
    # The English reference scores every check in full (tests/test_judge.py grades it,
    # sandboxed): the same checks, each scoring the same, is each scoring in full. Its
    # checks and points are read from the notebook, not graded a second time here.
    english = [
        (cell["metadata"]["nbgrader"]["grade_id"], float(cell["metadata"]["nbgrader"]["points"]))
        for cell in _notebook(NB01)["cells"]
        if cell["metadata"].get("nbgrader", {}).get("grade")
    ]
    assert translated.max_score == sum(points for _, points in english) > 0
    points = [(check.grade_id, check.points) for check in translated.checks]
    assert points == english, translated.format()
    assert translated.score == translated.max_score


@pytest.mark.slow
def test_the_student_version_of_a_translated_notebook_strips_the_answers(tmp_path, catalogs):
    import nbformat

    from course_utils.instructor.student import student_version
    from course_utils.tooling.publish import answers_left

    _translate(catalogs, "ne", NB01, _glossed("ne"))
    (built,) = translate.build("ne", [NB01], tmp_path / "ne", catalogs)
    assert answers_left(_notebook(built))  # the instructor's version has them
    student = student_version(nbformat.read(built, as_version=4))
    assert answers_left(student) == []
    assert any("नेपाली" in c.source for c in student.cells if c.cell_type == "markdown")


def test_a_multi_line_previous_english_is_kept_and_msgfmt_reads_it(tmp_path):
    msgfmt = _msgfmt()
    root, old = tmp_path / "translations", '### Exercise (c)\n\nWrite `f(x)`:\na "quoted" line.'
    nb = _tiny(tmp_path, [("markdown", "a", old)])
    translate.update_catalog("ne", nb, root)
    path = catalog_path("ne", nb, root)
    _translate(root, "ne", nb, lambda m: "### अभ्यास (c)\n\n`f(x)` लेख्नुहोस्।")
    _tiny(tmp_path, [("markdown", "a", old.replace("(c)", "(d)"))])
    assert translate.update_catalog("ne", nb, root).changed == 1
    text = path.read_text(encoding="utf-8")
    previous = [line for line in text.splitlines() if line.startswith("#|")]
    assert len(previous) == len(old.split("\n")) + 1  # msgid "" and one line each
    result = subprocess.run(
        [msgfmt, "--check", "-o", "/dev/null", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    (entry,) = [m for m in read_catalog(path, "ne") if m.id]
    assert entry.fuzzy and entry.previous_id == [old]
    translate.update_catalog("ne", nb, root)  # and again: the old English survives intact
    (entry,) = [m for m in read_catalog(path, "ne") if m.id]
    assert entry.previous_id == [old]
