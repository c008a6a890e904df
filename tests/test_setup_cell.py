"""The notebooks' first cell: on Colab it fetches colab_setup.sh and runs it; elsewhere nothing.

Runs the cell in a real IPython shell (the `!` lines are IPython syntax) with a fake
`curl` on PATH, so no network is needed.
"""

from __future__ import annotations

import os
import stat

import pytest
from IPython.core.interactiveshell import InteractiveShell

from course_utils.colab import setup_cell_source

FAKE_CURL = """#!/usr/bin/env bash
# Records its arguments, then writes the script body given in FAKE_SCRIPT to the -o path.
echo "$@" > "$CURL_LOG"
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then printf '%s\\n' "$FAKE_SCRIPT" > "$2"; fi
  shift
done
"""


@pytest.fixture
def shell(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    curl = bin_dir / "curl"
    curl.write_text(FAKE_CURL)
    curl.chmod(curl.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CURL_LOG", str(tmp_path / "curl.log"))
    monkeypatch.setenv("RAN_LOG", str(tmp_path / "ran.log"))
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    shell = InteractiveShell.instance()
    yield shell
    InteractiveShell.clear_instance()


def run_setup_cell(shell, repo="teacher/fork", ref="v2"):
    return shell.run_cell(setup_cell_source(repo, ref), silent=True)


def test_off_colab_the_cell_does_nothing(shell, tmp_path):
    result = run_setup_cell(shell)
    assert result.success
    assert not (tmp_path / "curl.log").exists()


def test_on_colab_the_cell_fetches_and_runs_the_script_of_the_configured_repo(
    shell, tmp_path, monkeypatch
):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-test")
    monkeypatch.setenv("FAKE_SCRIPT", 'echo "$COURSE_REPO@$COURSE_REF" > "$RAN_LOG"')
    result = run_setup_cell(shell)
    assert result.success, result.error_in_exec
    url = "https://raw.githubusercontent.com/teacher/fork/v2/colab_setup.sh"
    assert url in (tmp_path / "curl.log").read_text()
    assert (tmp_path / "ran.log").read_text().strip() == "teacher/fork@v2"


def test_on_colab_a_failing_setup_stops_the_notebook(shell, monkeypatch):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-test")
    monkeypatch.setenv("FAKE_SCRIPT", "echo 'colab_setup.sh: error: boom' >&2; exit 3")
    result = run_setup_cell(shell)
    assert not result.success
    assert isinstance(result.error_in_exec, RuntimeError)
    assert "Colab setup failed" in str(result.error_in_exec)
