"""The course website (``make site``): the executed notebooks, searchable, in a browser.

The README (landing page), the notebooks as ``make course`` executed them, every page
of ``docs/`` (:func:`docs_pages`), the run report and the GPU comparison (the GPU records
shipped in ``course_utils/records/``, :mod:`course_utils.tooling.record_compare`) are staged
in a temporary folder and built by mkdocs (``website/mkdocs.yml``). Nothing is executed; the
site loads nothing from another host and works from disk or under any sub-path. The site is for
learners: its notebooks are student versions (no solution, no hidden check, no exercise
output), unless built with ``answers=True`` (``--answers``).

The course in each of its other languages (:data:`course_utils.tooling.translate.LANGUAGES`) is a
site of its own in ``LANG/`` beside the English one (``bn/``, ``ar/``, ``ne/``): the same
executed notebooks, their markdown translated
(:func:`course_utils.tooling.translate.translated_notebook`: outputs kept), in Material's
interface in that language (English for Nepali, which Material lacks; the pages still say
``lang="ne"``), Arabic right to left. Every page's
language switcher (Material's ``extra.alternate``) opens the same page in each language
where it has one, else that language's home page. (One mkdocs build per language:
mkdocs-static-i18n renders notebooks as raw JSON, ultrabug/mkdocs-static-i18n#198.)
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from course_utils.records import Record, load_records
from course_utils.tooling.colab import README_BADGE_LINE
from course_utils.tooling.record_compare import comparison_page

WEBSITE = Path(__file__).resolve().parents[2] / "website"
# Shipped with every site (website/): styles, the Colab badge, the search shim for file://
ASSETS = ("course.css", "colab-badge.svg", "iframe-worker/shim.js", "iframe-worker/LICENSE")

NavItem = dict[str, Any]


def notebook_title(path: Path) -> str:
    """The first ``# `` heading of a notebook's markdown cells, else its file name.

    >>> import tempfile, json; from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> cell = {"cell_type": "markdown", "metadata": {}, "source": ["# 01 — Devices\\n", "text"]}
    >>> _ = (folder / "01_x.ipynb").write_text(json.dumps({"cells": [cell]}))
    >>> notebook_title(folder / "01_x.ipynb"), notebook_title(folder / "missing.ipynb")
    ('01 — Devices', 'missing')
    """
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return path.stem
    for cell in cells:
        source = cell.get("source", "") if cell.get("cell_type") == "markdown" else ""
        text = "".join(source) if isinstance(source, list) else str(source)
        headings = [line[2:].strip() for line in text.splitlines() if line.startswith("# ")]
        if headings:
            return headings[0]
    return path.stem


def stage(
    root: Path,
    notebooks: Path,
    report: Path | None,
    docs: Path,
    records: list[Record] | None = None,
    *,
    answers: bool = True,
) -> list[NavItem]:
    """Lay out the site's pages under ``docs``; return mkdocs's ``nav`` for them.
    ``records``: the GPU records to compare (default: those shipped in the package);
    ``answers`` False: the notebooks as student versions.

    Raises ``FileNotFoundError`` when ``notebooks`` holds no executed notebook, and
    ``RecordError`` (a ``ValueError``) when a GPU record is not valid.
    """
    executed = sorted(notebooks.glob("*.ipynb")) if notebooks.is_dir() else []
    if not executed:
        raise FileNotFoundError(f"no executed notebooks in {notebooks}: run make course first")
    (docs / "notebooks").mkdir(parents=True)
    _write_landing_page(root / "README.md", docs / "index.md")
    nav: list[NavItem] = [{"Home": "index.md"}]
    pages: list[NavItem] = []
    for notebook in executed:
        if answers:
            shutil.copy2(notebook, docs / "notebooks" / notebook.name)
        else:
            _write_without_answers(notebook, docs / "notebooks" / notebook.name)
        pages.append({notebook_title(notebook): f"notebooks/{notebook.name}"})
    nav.append({"Notebooks": pages})
    documentation = _stage_docs(root, docs)
    if documentation:
        nav.append({"Documentation": documentation})
    if report is not None and report.is_file():
        # At the top, as in build/: its links to notebooks/NAME.html and NAME.ipynb are
        # the site's own notebook pages and downloads.
        shutil.copy2(report, docs / "report.html")
        (docs / "run-report.md").write_text(
            "# Run report\n\n"
            "The report of `make course` that executed the notebooks on this site: each "
            "notebook's status, run time, measurements (labelled with the hardware they were "
            "measured on) and plots. [Open it on its own page](report.html).\n\n"
            '<iframe src="report.html" title="Run report" '
            'style="width:100%;height:80vh;border:1px solid #ccc"></iframe>\n',
            encoding="utf-8",
        )
        nav.append({"Run report": "run-report.md"})
    records = load_records() if records is None else records
    (docs / "gpu-comparison.md").write_text(comparison_page(records), encoding="utf-8")
    nav.append({"GPUs compared": "gpu-comparison.md"})
    for asset in ASSETS:
        (docs / "assets" / asset).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(WEBSITE / asset, docs / "assets" / asset)
    _unlink_missing(docs / "index.md")
    _unlink_missing(docs / "gpu-comparison.md")
    return nav


def docs_pages(root: Path) -> list[Path]:
    """Every page of the checkout's ``docs/`` (``docs/*.md``): those the README links to
    first, in the order it links them, then the others by name.

    >>> import tempfile; from pathlib import Path
    >>> root = Path(tempfile.mkdtemp()); (root / "docs").mkdir()
    >>> for name in ("a.md", "b.md", "c.md"): _ = (root / "docs" / name).write_text("# x")
    >>> _ = (root / "README.md").write_text("[C](docs/c.md#top) and [B](docs/b.md)")
    >>> [page.name for page in docs_pages(root)]
    ['c.md', 'b.md', 'a.md']
    """
    pages = sorted((root / "docs").glob("*.md"))
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    linked = _README_DOCS_LINK.findall(text)
    order = {name: at for at, name in reversed(list(enumerate(linked)))}
    return sorted(pages, key=lambda page: (order.get(page.name, len(order)), page.name))


_README_DOCS_LINK = re.compile(r"\]\(docs/([^)#\s/]+\.md)")


def _stage_docs(root: Path, docs: Path) -> list[NavItem]:
    """Every ``docs/*.md`` page of the checkout under ``docs/docs/``, as in the checkout,
    so that the README's links (``docs/NAME.md``) and the pages' links to each other
    (``NAME.md#anchor``) work on the site as on GitHub; their links to the README open the
    landing page, links to files the site does not have are their text. Returns the nav."""
    nav: list[NavItem] = []
    for page in docs_pages(root):
        (docs / "docs").mkdir(exist_ok=True)
        text = _TO_README.sub(r"](../index.md\1)", page.read_text(encoding="utf-8"))
        (docs / "docs" / page.name).write_text(text, encoding="utf-8")
        nav.append({_page_title(text, page.stem): f"docs/{page.name}"})
    for page in docs_pages(root):  # once every page is there
        _unlink_missing(docs / "docs" / page.name, parents=True)
    return nav


_TO_README = re.compile(r"\]\(\.\./README\.md(#[^)\s]*)?\)")


def _page_title(text: str, default: str) -> str:
    """A markdown page's first ``# `` heading, else ``default``."""
    titles = [line[2:].strip() for line in text.splitlines() if line.startswith("# ")]
    return titles[0] if titles else default


_LOCAL_LINK = re.compile(r"\[([^\]]+)\]\((?![a-z]+:|#|\.\./)([^)\s#]+)(#[^)\s]*)?\)")
# the same, with links up the tree too (``../translations/README.md``)
_RELATIVE_LINK = re.compile(r"\[([^\]]+)\]\((?![a-z]+:|#)([^)\s#]+)(#[^)\s]*)?\)")


def _unlink_missing(page: Path, *, parents: bool = False) -> None:
    """The page's links to files of the checkout that the site does not have
    (``translations/README.md``) as their text: the site breaks no link. ``parents``:
    links that go up (``../``) too (the README's badge line has GitHub's, kept)."""
    folder = page.parent
    pattern = _RELATIVE_LINK if parents else _LOCAL_LINK

    def keep(match: re.Match[str]) -> str:
        return match.group(0) if (folder / match.group(2)).exists() else match.group(1)

    page.write_text(pattern.sub(keep, page.read_text(encoding="utf-8")), encoding="utf-8")


#: What the README's Colab line says on the site (the README's links to the published
#: branches are relative to GitHub's pages of the repository, not to the site's).
SITE_BADGE_LINE = (
    '*Open in Colab:* every notebook\'s page has its "Open in Colab" badge, which opens the '
    "notebook from the course's `colab` branch."
)


def _write_landing_page(readme: Path, target: Path) -> None:
    """The README as the landing page, its unpublished Colab line (line 3) made the site's."""
    lines = readme.read_text(encoding="utf-8").splitlines(keepends=True)
    if len(lines) >= 3 and lines[2].rstrip("\n") == README_BADGE_LINE:
        lines[2] = SITE_BADGE_LINE + "\n"
    target.write_text("".join(lines), encoding="utf-8")


def _write_without_answers(executed: Path, target: Path) -> None:
    # lazy: nbgrader (classroom extra)
    from course_utils.instructor.student import (
        executed_student_version,
        read_notebook,
        write_notebook,
    )

    write_notebook(executed_student_version(read_notebook(executed)), target)


#: Material has no interface strings for these languages: its English, ``lang`` kept.
INTERFACE_LANGUAGE = {"ne": "en"}


def stage_language(
    root: Path, notebooks: Path, docs: Path, language: str, *, answers: bool = True
) -> list[NavItem]:
    """Lay out the pages of the site in ``language`` under ``docs``: each executed notebook
    in ``notebooks`` with its markdown translated (outputs kept; student versions unless
    ``answers``) and a home page listing them; return mkdocs's ``nav``."""
    from course_utils.tooling import translate  # lazy: Babel

    executed = sorted(notebooks.glob("*.ipynb")) if notebooks.is_dir() else []
    if not executed:
        raise FileNotFoundError(f"no executed notebooks in {notebooks}: run make course first")
    (docs / "notebooks").mkdir(parents=True)
    pages: list[NavItem] = []
    for notebook in executed:
        catalog_file = translate.catalog_path(language, notebook, root / "translations")
        catalog = translate.read_catalog(catalog_file, language) if catalog_file.is_file() else None
        english = translate.read_english_notebook(notebook)
        built = translate.translated_notebook(english, catalog, language, notebook.name)
        target = docs / "notebooks" / notebook.name
        target.write_text(json.dumps(built, indent=1, ensure_ascii=False) + "\n", "utf-8")
        if not answers:
            _write_without_answers(target, target)
        pages.append({notebook_title(target): f"notebooks/{notebook.name}"})
    name = translate.LANGUAGES[language]
    listing = "\n".join(f"- [{title}]({link})" for page in pages for title, link in page.items())
    listing = f"## {name}\n\n{listing}"
    if language in translate.RIGHT_TO_LEFT:
        listing = translate.right_to_left(listing)
    home = "\n\n".join([*_readme_in(language, root), listing]) + "\n"
    (docs / "index.md").write_text(home, encoding="utf-8")
    _unlink_missing(docs / "index.md")
    for asset in ASSETS:
        (docs / "assets" / asset).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(WEBSITE / asset, docs / "assets" / asset)
    return [{name: "index.md"}, {"Notebooks": pages}]


def _readme_in(language: str, root: Path) -> list[str]:
    """The README's course part in ``language`` (translate.readme_entries), block by block:
    the translation, or the English under the "not yet translated" marker."""
    from course_utils.tooling import translate  # lazy: Babel

    readme = root / "README.md"
    if not readme.is_file():
        return []
    path = translate.document_path(language, translate.README_DOMAIN, root / "translations")
    catalog = translate.read_catalog(path, language) if path.is_file() else None
    blocks = []
    for context, english in translate.readme_entries(readme.read_text(encoding="utf-8")):
        message = catalog.get(english, context=context) if catalog is not None else None
        blocks.append(translate.translated_text(language, english, message))
    return blocks


def _pages(nav: list[NavItem]) -> list[str]:
    """The source paths of a nav's pages (``notebooks/01_x.ipynb``, ``index.md``)."""
    found: list[str] = []
    for item in nav:
        for value in item.values():
            found += _pages(value) if isinstance(value, list) else [str(value)]
    return found


def _build(docs: Path, out: Path, nav: list[NavItem], language: str, sites: dict[str, Any]) -> None:
    from mkdocs.commands.build import build  # lazy: optional (site extra)
    from mkdocs.config import load_config

    from course_utils.tooling.translate import (
        RIGHT_TO_LEFT,  # lazy: Babel, only when a site is built
    )

    config = load_config(
        str(WEBSITE / "mkdocs.yml"), docs_dir=str(docs), site_dir=str(out.resolve()), nav=nav
    )
    config.theme["language"] = INTERFACE_LANGUAGE.get(language, language)
    config.theme["direction"] = "rtl" if language in RIGHT_TO_LEFT else "ltr"
    # the switcher's links, per page (website/hooks.py: on_page_context)
    config.extra["course_language"] = language
    config.extra["course_sites"] = sites
    build(config)
    # mkdocs's 404 page links from the server's root ("/assets/..."): broken opened from
    # disk or under a sub-path, so the site has none (a server shows its own).
    (out / "404.html").unlink(missing_ok=True)


def build_site(
    root: Path,
    notebooks: Path,
    out: Path,
    report: Path | None = None,
    records: list[Record] | None = None,
    *,
    answers: bool = True,
) -> Path:
    """Build the website of ``notebooks`` (executed copies) into ``out``; return the
    landing page. ``root`` is the course checkout (README, docs); ``records``: the GPU
    records to compare (default: those shipped in the package); ``answers`` False: a
    site for learners (see the module doc)."""
    from course_utils.tooling.translate import LANGUAGES  # lazy: Babel

    with tempfile.TemporaryDirectory(prefix="course-site-") as staging:
        english = stage(root, notebooks, report, Path(staging) / "en", records, answers=answers)
        navs = {"en": english}
        for language in LANGUAGES:
            docs = Path(staging) / language
            navs[language] = stage_language(root, notebooks, docs, language, answers=answers)
        # each site: its folder under out, its name in the switcher, its pages
        sites = {
            language: {
                "folder": "" if language == "en" else f"{language}/",
                "name": LANGUAGES.get(language, "English"),
                "pages": _pages(nav),
            }
            for language, nav in navs.items()
        }
        for language, nav in navs.items():
            target = out / ("" if language == "en" else language)
            _build(Path(staging) / language, target, nav, language, sites)
    return out / "index.html"
