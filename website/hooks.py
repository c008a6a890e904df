"""mkdocs hooks of the course website (website/mkdocs.yml).

- The "Open in Colab" badge image is served from colab.research.google.com in the
  notebooks and the README; the site shows its own copy (assets/colab-badge.svg), so that
  no page loads anything from another host. The badge's link still opens Colab.
- Every notebook page starts with its "Open in Colab" link (the one in the notebook's
  badge, which ``python -m course_utils badges`` points at the course's repository) and a
  link that downloads the executed notebook.
- No page loads a script from another host (see MERMAID_FROM_CDN).
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
    r'<script type="module">(?:(?!</script>).)*?cdnjs\.cloudflare\.com(?:(?!</script>).)*?</script>',
    re.DOTALL,
)
COLAB_URL = re.compile(r"https://colab\.research\.google\.com/github/[^\s\"'<>)]+?\.ipynb")


def on_page_content(content, page, config, files):
    if not page.file.src_uri.endswith(".ipynb"):
        return content
    name = posixpath.basename(page.file.src_uri)
    links = []
    colab = [url for url in COLAB_URL.findall(content) if url.endswith("/" + name)]
    if colab:
        badge = get_relative_url(LOCAL_BADGE, page.url)
        links.append(
            f'<a href="{html.escape(colab[0])}"><img src="{badge}" alt="Open in Colab"></a>'
        )
    links.append(f'<a href="{html.escape(name)}" download>Download the notebook (.ipynb, as run)</a>')
    return f'<div class="course-actions">{" ".join(links)}</div>\n{content}'


def on_post_page(output, page, config):
    output = MERMAID_FROM_CDN.sub("", output)
    return output.replace(BADGE_IMAGE, get_relative_url(LOCAL_BADGE, page.url))
