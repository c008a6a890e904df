"""mkdocs hooks of the course website (website/mkdocs.yml).

- The "Open in Colab" badge image is served from colab.research.google.com in the
  notebooks and the README; the site shows its own copy (assets/colab-badge.svg), so that
  no page loads anything from another host. The badge's link still opens Colab.
- Every notebook page starts with a link that downloads the executed notebook; its "Open
  in Colab" badge is the notebook's own (``python -m course_utils badges`` points it at
  the course's repository).
- No page loads a script from another host (see MERMAID_FROM_CDN, WIDGETS_FROM_CDN).
- A notebook page's table of contents keeps the inline code of its headings: mkdocs-jupyter's
  drops it ("2.1 Mixed precision: and" for "... `torch.autocast` and `GradScaler`", with
  an anchor that matches no heading); each entry takes the id and text of its heading.
- The language switcher (Material's ``extra.alternate``) opens the same page in each of
  the course's languages (one site each: English at the top, ``bn/``, ``ar/``, ``ne/``;
  ``course_utils.tooling.site.build_site`` passes them in ``extra.course_sites``), or that
  language's home page where the page is English only; every link relative.
- A page in a language whose interface is Material's English (Nepali) still says its
  content's language: ``<html lang="ne">``.
"""

from __future__ import annotations

import html
import posixpath
import re

from mkdocs.utils import get_relative_url

BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
LOCAL_BADGE = "assets/colab-badge.svg"
# mkdocs-jupyter's script that imports mermaid from cdnjs when a page has a diagram (the
# course's have none): removed, so that no page can load anything from another host.
MERMAID_FROM_CDN = re.compile(
    r'<script type="module">(?:(?!</script>).)*?cdnjs\.cloudflare\.com'
    r"(?:(?!</script>).)*?</script>",
    re.DOTALL,
)


HEADING = re.compile(r'<h([1-6])[^>]*\bid="([^"]+)"[^>]*>(.*?)</h\1>', re.DOTALL)
TAG = re.compile(r"<[^>]+>")
PERMALINK = re.compile(r'<a class="anchor-link".*?</a>', re.DOTALL)


def _headings(content):
    """(level, id, text) of every heading with an id on the page, in order."""
    return [
        (int(level), anchor, " ".join(html.unescape(TAG.sub("", PERMALINK.sub("", inner))).split()))
        for level, anchor, inner in HEADING.findall(content)
    ]


def _flatten(items):
    for item in items:
        yield item
        yield from _flatten(item.children)


def _align_toc(toc, content):
    """Give each entry of the table of contents the id and text of its heading on the page
    (in order, level by level): mkdocs-jupyter's entries drop inline code, from the text
    and from the anchor, so their links missed the heading."""
    headings = iter(_headings(content))
    for item in _flatten(toc):
        for level, anchor, text in headings:
            if level == item.level:
                item.id, item.title = anchor, text
                break


def on_page_content(content, page, config, files):
    if not page.file.src_uri.endswith(".ipynb"):
        return content
    _align_toc(page.toc, content)
    # The "Open in Colab" badge is the notebook's own (its first cell, a test checks it).
    name = html.escape(posixpath.basename(page.file.src_uri))
    download = f'<a href="{name}" download>Download the notebook (.ipynb, as run)</a>'
    return f'<div class="course-actions">{download}</div>\n{content}'


# nbconvert's script that loads the Jupyter widget renderer from unpkg.com on pages whose
# notebook saved widget state (02's monitor, 05's Lightning): removed for the same reason;
# those outputs show their text form instead.
WIDGETS_FROM_CDN = re.compile(
    r"<script>(?:(?!</script>).)*?unpkg\.com/@jupyter(?:(?!</script>).)*?</script>",
    re.DOTALL,
)


# Material's `url` filter would make a link into another language's site (above this
# one) relative to this site's root: the switcher's links go through it with this prefix
# (an absolute URL, kept as is), taken off again in on_post_page.
ALTERNATE = "https://course-alternate.invalid/"


def _html_path(source):
    return posixpath.splitext(source)[0] + ".html"


def on_page_context(context, page, config, nav):
    sites = config.extra.get("course_sites")
    if not sites:
        return context
    here = posixpath.dirname(sites[config.extra["course_language"]]["folder"] + page.url)
    alternate = []
    for language, site in sites.items():
        source = page.file.src_uri if page.file.src_uri in site["pages"] else "index.md"
        target = site["folder"] + _html_path(source)
        link = posixpath.relpath(target, here or ".")
        alternate.append({"name": site["name"], "link": ALTERNATE + link, "lang": language})
    config.extra["alternate"] = alternate
    return context


def on_post_page(output, page, config):
    output = WIDGETS_FROM_CDN.sub("", MERMAID_FROM_CDN.sub("", output))
    output = output.replace(ALTERNATE, "")
    language = config.extra.get("course_language")
    if language and config.theme["language"] != language:
        output = output.replace(
            f'<html lang="{config.theme["language"]}"', f'<html lang="{language}"', 1
        )
    return output.replace(BADGE_IMAGE, get_relative_url(LOCAL_BADGE, page.url))
