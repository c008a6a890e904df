"""A committed notebook's setup cell, run as Colab runs it.

``google.colab`` is in ``sys.modules`` (faked), the cell runs in a real IPython shell
(its ``!`` line is IPython syntax), the learner's typing goes where Colab's form puts it
(the ``# @param`` line's value), ``raw.githubusercontent.com`` is served from this working
tree, and ``https://github.com/<typed repository>.git`` is a git repository made from
this working tree (git's ``url.<base>.insteadOf``), so pip really installs the course
from the repository typed in the form, into a fresh environment that has torch but not
the course (as Colab has), and nothing goes to the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from test_colab_setup import PROJECT_SITE, _make_venv, _make_view, _offline_build_env

from course_utils.tooling import colab

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "01_runtime_and_devices.ipynb"
TYPED_REPO = "a-learner/their-copy"

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("bash") is None, reason="needs git and bash"
)


def committed_setup_cell() -> dict:
    cell = json.loads(NOTEBOOK.read_text())["cells"][1]
    assert colab.SETUP_TAG in cell["metadata"]["tags"]
    return cell


def typed(source: str, field: str, value: str) -> str:
    """What Colab's form does when the learner types ``value`` into ``field``: it
    rewrites the value of the ``# @param`` line in the cell's source."""
    pattern = re.compile(rf'^{field} = "[^"\n]*"(  # @param .*)$', re.MULTILINE)
    assert pattern.search(source), f"no form field {field}"
    return pattern.sub(lambda m: f'{field} = "{value}"{m.group(1)}', source)


def git(cwd: Path, *args: str) -> str:
    command = ["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    done = subprocess.run([*command, *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """This working tree as a commit of a git repository: (repository path, commit)."""
    repo = tmp_path_factory.mktemp("published") / "repo"
    files = git(ROOT, "ls-files", "-co", "--exclude-standard").splitlines()
    for name in files:
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, repo / name)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the course")
    return repo, git(repo, "rev-parse", "HEAD")


@pytest.fixture
def colab_runtime(tmp_path, monkeypatch, published):
    """Colab, faked: google.colab imported, a fresh Python with torch and no course
    package, the downloads served from this working tree. Returns a namespace with
    ``run(source)``, ``python``, ``urls`` and ``served`` (what the download returns)."""
    repo, _commit = published
    view = _make_view(tmp_path / "view", PROJECT_SITE)
    python, site = _make_venv(tmp_path / "venv", view)
    state = types.SimpleNamespace(python=python, site=site, urls=[], served=None)
    script = (ROOT / "colab_setup.sh").read_bytes()

    class Response:
        def __init__(self, data):
            self.data = data

        def read(self):
            return self.data

    def urlopen(url, timeout=None):
        state.urls.append(url)
        if re.fullmatch(
            rf"https://raw\.githubusercontent\.com/{TYPED_REPO}/[\w./-]+/colab_setup\.sh", url
        ):
            return Response(script if state.served is None else state.served)
        raise urllib.error.HTTPError(url, 404, "Not Found", None, None)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    for name in list(os.environ):  # nothing that points the child at the project venv
        if name.startswith(("PYTHON", "COURSE_", "PIP_", "VIRTUAL_ENV", "CONDA_PREFIX")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    for name, value in {
        "PYTHON": str(python),  # colab_setup.sh installs into this interpreter
        "PYTHONNOUSERSITE": "1",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "GIT_CONFIG_COUNT": "1",  # github.com/<typed>.git is the published repository
        "GIT_CONFIG_KEY_0": f"url.{repo}.insteadOf",
        "GIT_CONFIG_VALUE_0": f"https://github.com/{TYPED_REPO}.git",
        **_offline_build_env(),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    shell = InteractiveShell.instance()
    state.run = lambda source: shell.run_cell(source, silent=True)
    yield state
    InteractiveShell.clear_instance()


def course_in(python: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import course_utils, importlib.metadata as m, json\n"
        "print(course_utils.__file__)\n"
        "print(m.distribution('course-utils').read_text('direct_url.json'))"
    )
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=cwd)


def one_line_error(result) -> str:
    assert not result.success and isinstance(result.error_in_exec, RuntimeError)
    message = str(result.error_in_exec)
    assert "\n" not in message
    return message


def test_the_setup_cell_is_a_collapsed_form():
    cell = committed_setup_cell()
    source = "".join(cell["source"])
    assert source.startswith("# @title ")  # Colab: a form, its code hidden
    assert cell["metadata"]["cellView"] == "form"
    assert cell["metadata"]["jupyter"]["source_hidden"] is True  # JupyterLab: collapsed
    assert '# @param {type:"string"}' in source


@pytest.mark.slow
def test_on_colab_it_installs_the_course_from_the_repository_typed_in_the_form(
    colab_runtime, published, tmp_path
):
    _repo, commit = published
    source = "".join(committed_setup_cell()["source"])
    source = typed(typed(source, "COURSE_REPO", TYPED_REPO), "COURSE_REF", commit)
    assert course_in(colab_runtime.python, tmp_path).returncode != 0  # not installed yet
    result = colab_runtime.run(source)
    assert result.success, result.error_in_exec
    assert colab_runtime.urls == [
        f"https://raw.githubusercontent.com/{TYPED_REPO}/{commit}/colab_setup.sh"
    ]
    installed = course_in(colab_runtime.python, tmp_path)
    assert installed.returncode == 0, installed.stderr
    where, direct_url = installed.stdout.split("\n", 1)
    assert Path(where).resolve().is_relative_to(colab_runtime.site.resolve())
    origin = json.loads(direct_url)
    assert origin["url"] == f"https://github.com/{TYPED_REPO}.git"
    assert origin["vcs_info"]["commit_id"] == commit


def test_on_colab_a_script_with_another_sha256_is_refused_and_never_runs(colab_runtime, tmp_path):
    marker = tmp_path / "ran"
    colab_runtime.served = f"touch {marker}\n".encode()
    source = typed("".join(committed_setup_cell()["source"]), "COURSE_REPO", TYPED_REPO)
    message = one_line_error(colab_runtime.run(source))
    url = f"https://raw.githubusercontent.com/{TYPED_REPO}/main/colab_setup.sh"
    assert message.startswith(f"Colab setup: refused to run {url}: its SHA-256 is not")
    assert not marker.exists() and course_in(colab_runtime.python, tmp_path).returncode != 0
    assert hashlib.sha256(colab_runtime.served).hexdigest() not in message


@pytest.mark.parametrize("repo", ["", "  ", "not a repository"])
def test_on_colab_an_empty_field_says_what_to_type(colab_runtime, repo):
    source = typed("".join(committed_setup_cell()["source"]), "COURSE_REPO", repo)
    message = one_line_error(colab_runtime.run(source))
    assert message.startswith("Colab setup: type the GitHub repository")
    assert "OWNER/NAME" in message and "COURSE_REPO" in message
    assert colab_runtime.urls == []  # nothing downloaded


def test_off_colab_the_cell_does_nothing(colab_runtime, monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab")
    assert colab_runtime.run("".join(committed_setup_cell()["source"])).success
    assert colab_runtime.urls == []
