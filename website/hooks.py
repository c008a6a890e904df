"""mkdocs hooks of the course website (website/mkdocs.yml).

- The "Open in Colab" badge image is served from colab.research.google.com in the
  notebooks and the README; the site shows its own copy (assets/colab-badge.svg), so that
  no page loads anything from another host. The badge's link still opens Colab.
- Every notebook page starts with a link that downloads the executed notebook; its "Open
  in Colab" badge is the notebook's own (``python -m course_utils badges`` points it at
  the course's repository).
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
    r'<script type="module">(?:(?!</script>).)*?cdnjs\.cloudflare\.com'
    r"(?:(?!</script>).)*?</script>",
    re.DOTALL,
)


def on_page_content(content, page, config, files):
    if not page.file.src_uri.endswith(".ipynb"):
        return content
    # The "Open in Colab" badge is the notebook's own (its first cell, a test checks it).
    name = html.escape(posixpath.basename(page.file.src_uri))
    download = f'<a href="{name}" download>Download the notebook (.ipynb, as run)</a>'
    return f'<div class="course-actions">{download}</div>\n{content}'


def on_post_page(output, page, config):
    output = MERMAID_FROM_CDN.sub("", output)
    return output.replace(BADGE_IMAGE, get_relative_url(LOCAL_BADGE, page.url))
