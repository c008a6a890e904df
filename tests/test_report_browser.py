"""The course report in a real browser: headless Chromium draws the page, and the plot
embedded from a notebook shows up in the screenshot.

Needs Chromium (Debian: ``apt-get install chromium``); ``.ci/run`` installs it when
missing and sets ``COURSE_REQUIRE_BROWSER=1``, so in CI a missing browser fails the test
instead of skipping it. A few seconds: two page loads.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess

import pytest

from course_utils.tooling.report import Measurement, NotebookResult, Plot, write_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MAGENTA = (1.0, 0.0, 1.0)  # a colour nothing else on the page uses


def browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    message = "needs headless Chromium: apt-get install chromium (.ci/run installs it)"
    if os.environ.get("COURSE_REQUIRE_BROWSER") == "1":
        pytest.fail(message)
    pytest.skip(message)


def magenta_plot() -> Plot:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(4, 3), dpi=80)
    axes.fill_between([0, 1], [0, 0], [1, 1], color=MAGENTA)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return Plot("image/png", base64.b64encode(buffer.getvalue()).decode())


def screenshot(page, out, tmp_path):
    """Load ``page`` in headless Chromium and return the screenshot as an RGB array."""
    import matplotlib.image

    done = subprocess.run(
        [
            browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={out}",
            "--window-size=1400,900",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and out.exists(), done.stderr[-2000:]
    return matplotlib.image.imread(out)[..., :3]


def magenta_pixels(image) -> int:
    import numpy as np

    return int(np.all(np.abs(image - np.array(MAGENTA)) < 0.05, axis=-1).sum())


@pytest.mark.slow
def test_the_report_shows_each_notebooks_plot_in_a_browser(tmp_path):
    label = "measured on this machine (CPU)"
    figures = [Measurement("speed-up", 3.5, "x", label)]
    with_plot = NotebookResult(
        "notebooks/01_a.ipynb", "ok", 2.0, None, figures, [magenta_plot()], "notebooks/01_a.html"
    )
    without = NotebookResult("notebooks/01_a.ipynb", "ok", 2.0, None, figures)
    shown = screenshot(write_report([with_plot], {}, tmp_path / "a"), tmp_path / "a.png", tmp_path)
    control = screenshot(write_report([without], {}, tmp_path / "b"), tmp_path / "b.png", tmp_path)
    assert magenta_pixels(control) == 0
    # the plot is drawn 400 px wide (300 px tall); its filled area is most of it
    assert magenta_pixels(shown) > 200 * 150, magenta_pixels(shown)
