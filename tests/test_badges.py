"""Pointing Colab badges and setup cells at a repository (python -m course_utils badges)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import nbformat
import pytest

from course_utils import colab
from course_utils.cli import main

OLD_REPO, OLD_REF = "somebody/course", "main"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SCRIPT = "#!/usr/bin/env bash\necho set up\n"
SCRIPT_SHA = hashlib.sha256(SCRIPT.encode()).hexdigest()
STALE_SHA = "f" * 64


def make_course(root, names=("01_a.ipynb", "02_b.ipynb")):
    (root / "notebooks").mkdir(parents=True)
    for name in names:
        notebook = nbformat.v4.new_notebook()
        badge = badge_markdown(f"notebooks/{name}")
        setup = nbformat.v4.new_code_cell(colab.setup_cell_source(OLD_REPO, OLD_REF, STALE_SHA))
        setup.metadata["tags"] = [colab.SETUP_TAG]
        notebook.cells = [
            nbformat.v4.new_markdown_cell(f"# {name}\n{badge}\nSome text."),
            setup,
            nbformat.v4.new_code_cell("x = 'https://colab.research.google.com/ is text here'"),
        ]
        nbformat.write(notebook, root / "notebooks" / name)
    readme_badge = badge_markdown("notebooks/01_a.ipynb")
    (root / "README.md").write_text(f"# Course\n{readme_badge}\n")
    (root / "colab_setup.sh").write_text(SCRIPT)


def badge_markdown(notebook):
    url = colab.badge_url(OLD_REPO, OLD_REF, notebook)
    return f"[![Open In Colab]({colab.BADGE_IMAGE})]({url})"


def cells(root, name):
    return nbformat.read(root / "notebooks" / name, as_version=4).cells


def test_badges_setup_cells_and_hash_point_at_the_fork(tmp_path):
    make_course(tmp_path)
    changes = colab.retarget_course(tmp_path, "teacher/gpu-class", "spring-2027")
    assert changes.badges == 3 and changes.setup_cells == 2
    assert changes.sha256 == SCRIPT_SHA
    assert sorted(changes.files) == ["README.md", "notebooks/01_a.ipynb", "notebooks/02_b.ipynb"]
    for name in ("01_a.ipynb", "02_b.ipynb"):
        badge, setup, other = cells(tmp_path, name)
        assert colab.badge_url("teacher/gpu-class", "spring-2027", f"notebooks/{name}") in (
            badge.source
        )
        assert OLD_REPO not in badge.source
        expected = colab.setup_cell_source("teacher/gpu-class", "spring-2027", SCRIPT_SHA)
        assert setup.source == expected
        assert colab.setup_cell_settings(setup.source) == (
            "teacher/gpu-class", "spring-2027", SCRIPT_SHA
        )
        assert other.source.startswith("x = 'https://colab")  # untouched
    assert "github/teacher/gpu-class/blob/spring-2027/notebooks/01_a.ipynb" in (
        (tmp_path / "README.md").read_text()
    )
    assert (tmp_path / "colab_setup.sh").read_text() == SCRIPT  # the same in every fork


def test_a_commit_pins_the_setup_cells_and_the_badges_open_a_branch(tmp_path):
    make_course(tmp_path, names=("01_a.ipynb",))
    colab.retarget_course(tmp_path, "teacher/gpu-class", COMMIT)
    badge, setup, _ = cells(tmp_path, "01_a.ipynb")
    assert colab.setup_cell_settings(setup.source) == ("teacher/gpu-class", COMMIT, SCRIPT_SHA)
    assert "github/teacher/gpu-class/blob/main/notebooks/01_a.ipynb" in badge.source
    colab.retarget_course(tmp_path, "teacher/gpu-class", COMMIT, badge_ref="spring")
    assert "/blob/spring/notebooks/01_a.ipynb" in cells(tmp_path, "01_a.ipynb")[0].source


def test_without_a_repo_the_cells_keep_theirs_and_get_the_new_hash(tmp_path):
    make_course(tmp_path)
    changes = colab.retarget_course(tmp_path, None)
    assert changes.settings == {(OLD_REPO, OLD_REF)} and changes.badges == 0
    for name in ("01_a.ipynb", "02_b.ipynb"):
        setup = cells(tmp_path, name)[1].source
        assert colab.setup_cell_settings(setup) == (OLD_REPO, OLD_REF, SCRIPT_SHA)
    assert OLD_REPO in (tmp_path / "README.md").read_text()


def test_no_repo_leaves_the_cells_unconfigured_and_the_badges_alone(tmp_path):
    make_course(tmp_path)
    readme = (tmp_path / "README.md").read_text()
    changes = colab.retarget_course(tmp_path, "")
    assert changes.settings == {("", "")}
    setup = cells(tmp_path, "01_a.ipynb")[1].source
    assert colab.setup_cell_settings(setup) == ("", "", SCRIPT_SHA)
    assert (tmp_path / "README.md").read_text() == readme


def test_running_twice_changes_nothing_the_second_time(tmp_path):
    make_course(tmp_path)
    colab.retarget_course(tmp_path, "teacher/gpu-class", "main")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert colab.retarget_course(tmp_path, "teacher/gpu-class", "main").files == []
    assert colab.retarget_course(tmp_path, None).files == []
    assert before == {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}


def test_a_renamed_notebook_gets_a_badge_for_its_own_path(tmp_path):
    make_course(tmp_path, names=("01_a.ipynb",))
    (tmp_path / "notebooks" / "01_a.ipynb").rename(tmp_path / "notebooks" / "01_new.ipynb")
    colab.retarget_course(tmp_path, "me/course", "main")
    text = (tmp_path / "notebooks" / "01_new.ipynb").read_text()
    assert "github/me/course/blob/main/notebooks/01_new.ipynb" in text


@pytest.mark.parametrize(
    ("repo", "ref"),
    [("no-slash", "main"), ("a/b/c", "main"), ("a b/c", "main"), ("me/x", "-rf"),
     ("me/x", "a..b"), ("me/x", "bad ref"), ("me/x\"; rm", "main"), ("me/x", ""), ("", "v1")],
)
def test_invalid_repo_or_ref_is_refused_before_any_change(tmp_path, repo, ref):
    make_course(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ValueError):
        colab.retarget_course(tmp_path, repo, ref)
    assert before == {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}


def test_a_setup_cell_needs_a_real_hash_and_both_or_neither_setting():
    with pytest.raises(ValueError, match="SHA-256"):
        colab.setup_cell_source("me/x", "main", "abc")
    with pytest.raises(ValueError, match="both"):
        colab.setup_cell_source("me/x", "", SCRIPT_SHA)


def copy_course(root, target):
    for part in ("notebooks", "README.md", "colab_setup.sh"):
        source = root / part
        if source.is_dir():
            shutil.copytree(source, target / part)
        elif source.exists():
            shutil.copy(source, target / part)
    return sorted((target / "notebooks").glob("*.ipynb"))


def test_cli_on_a_copy_of_this_course_recommends_a_commit(tmp_path, root, capsys):
    notebooks = copy_course(root, tmp_path)
    assert notebooks, "the course has no notebooks"
    assert main(["badges", "--repo", "teacher/fork", "--ref", "v2", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "setup cell(s) now install from teacher/fork@v2;" in out
    assert "badge(s) open the notebooks at teacher/fork@v2" in out
    assert "note: v2 is not a commit" in out and "git rev-parse HEAD" in out
    sha = hashlib.sha256((root / "colab_setup.sh").read_bytes()).hexdigest()
    assert sha in out
    for path in notebooks:
        notebook = json.loads(path.read_text())
        own = f"github/teacher/fork/blob/v2/notebooks/{path.name}"
        assert own in "".join(notebook["cells"][0]["source"]), path.name
        setup = [c for c in notebook["cells"] if colab.SETUP_TAG in c["metadata"].get("tags", [])]
        assert len(setup) == 1
        assert colab.setup_cell_settings("".join(setup[0]["source"])) == ("teacher/fork", "v2", sha)
    assert main(["badges", "--repo", "teacher/fork", "--ref", COMMIT, "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "not a commit" not in out and "open the notebooks at teacher/fork@main" in out


@pytest.mark.parametrize(
    "argv",
    [["--repo", "teacher/fork"], ["--ref", COMMIT], ["--no-repo", "--ref", "v1"],
     ["--repo", "bad", "--ref", "v1"]],
)
def test_cli_refuses_incomplete_settings_in_one_line(tmp_path, root, capsys, argv):
    copy_course(root, tmp_path)
    assert main(["badges", *argv, "--root", str(tmp_path)]) == 2  # bad input: exit 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_cli_without_a_checkout_says_so(tmp_path, capsys):
    assert main(["badges", "--no-repo", "--root", str(tmp_path)]) == 2
    assert "colab_setup.sh" in capsys.readouterr().err


def git(root, *args):
    done = subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        capture_output=True, text=True, check=True,
    )
    return done.stdout.strip()


def test_cli_checks_colab_setup_sh_at_the_commit(tmp_path, capsys):
    if shutil.which("git") is None:
        pytest.fail("git is needed (the course is a git repository)")
    make_course(tmp_path)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "course")
    commit = git(tmp_path, "rev-parse", "HEAD")
    argv = ["badges", "--repo", "teacher/fork", "--ref", commit, "--root", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "warning:" not in out and "note:" not in out, out
    (tmp_path / "colab_setup.sh").write_text(SCRIPT + "echo changed, not committed\n")
    assert main(argv) == 0
    assert f"warning: colab_setup.sh at {commit} is not this checkout's" in capsys.readouterr().out
