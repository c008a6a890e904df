"""Pointing Colab badges and setup cells at a repository (python -m course_utils badges)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import urllib.parse

import nbformat
import pytest

from course_utils.tooling import colab
from course_utils.tooling.cli import main

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
            nbformat.v4.new_markdown_cell(f"# {name}\n\n{badge}\n\nSome text."),
            setup,
            nbformat.v4.new_code_cell("x = 'https://colab.research.google.com/ is text here'"),
        ]
        nbformat.write(notebook, root / "notebooks" / name)
    readme_badge = badge_markdown("notebooks/01_a.ipynb")
    (root / "README.md").write_text(f"# Course\n\n{readme_badge}\n")
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
            "teacher/gpu-class",
            "spring-2027",
            SCRIPT_SHA,
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


def test_without_a_repo_the_course_gets_the_committed_form(tmp_path):
    make_course(tmp_path)
    changes = colab.retarget_course(tmp_path, None)
    assert changes.settings == {("", "main")} and changes.badges == 0
    for name in ("01_a.ipynb", "02_b.ipynb"):
        title, setup, _ = cells(tmp_path, name)
        assert colab.setup_cell_settings(setup.source) == ("", "main", SCRIPT_SHA)
        assert title.source.splitlines()[2] == colab.UNPUBLISHED_BADGE_LINE
        assert "colab.research.google.com/github" not in title.source  # no dead link
    readme = (tmp_path / "README.md").read_text()
    assert readme.splitlines()[2] == colab.README_BADGE_LINE and OLD_REPO not in readme
    assert colab.retarget_course(tmp_path, "").files == []  # "" is the same form


def test_the_committed_form_speaks_to_learners_and_links_the_published_branches(tmp_path):
    # the first thing a learner reads under a title: the course's branches, not a workflow
    for line in (colab.UNPUBLISHED_BADGE_LINE, colab.README_BADGE_LINE):
        assert "`colab`" in line or "tree/colab/" in line
        assert ".github" not in line and "workflow" not in line
    # the README's links resolve, from github.com/OWNER/NAME/blob/main/README.md, to the
    # published branches of whichever fork shows it
    links = re.findall(r"\]\(([^)]+)\)", colab.README_BADGE_LINE)
    base = "https://github.com/someone/fork/blob/main/README.md"
    assert [urllib.parse.urljoin(base, link) for link in links] == [
        "https://github.com/someone/fork/tree/colab/notebooks",
        "https://github.com/someone/fork/tree/solutions/notebooks",
        # the translations (issue 36), on the same branch
        "https://github.com/someone/fork/tree/colab/notebooks/bn",
        "https://github.com/someone/fork/tree/colab/notebooks/ar",
        "https://github.com/someone/fork/tree/colab/notebooks/ne",
    ]


def test_the_badge_line_of_an_earlier_version_is_replaced(tmp_path):
    make_course(tmp_path)
    old = colab._OLD_BADGE_LINES[0]
    for path in (tmp_path / "notebooks").glob("*.ipynb"):
        notebook = nbformat.read(path, as_version=4)
        notebook.cells[0].source = f"# {path.name}\n\n{old}\n\nSome text."
        nbformat.write(notebook, path)
    (tmp_path / "README.md").write_text(f"# Course\n\n{old}\n")
    colab.retarget_course(tmp_path, None)
    for name in ("01_a.ipynb", "02_b.ipynb"):
        assert cells(tmp_path, name)[0].source.splitlines()[2] == colab.UNPUBLISHED_BADGE_LINE
    assert (tmp_path / "README.md").read_text().splitlines()[2] == colab.README_BADGE_LINE


def test_the_setup_cell_is_cell_1_collapsed_and_everything_else_is_kept_byte_for_byte(tmp_path):
    make_course(tmp_path, names=("01_a.ipynb",))
    path = tmp_path / "notebooks" / "01_a.ipynb"
    notebook = json.loads(path.read_text())
    notebook["cells"][2]["metadata"]["custom"] = {"ü": 1}  # odd but legal content
    notebook["cells"][0]["source"] = "".join(notebook["cells"][0]["source"])  # one string
    text = json.dumps(notebook, indent=2, ensure_ascii=True)  # not nbformat's layout
    path.write_text(text)
    colab.retarget_course(tmp_path, "teacher/gpu-class", COMMIT)
    new = path.read_text()
    before, after = json.loads(text), json.loads(new)
    assert after["cells"][2:] == before["cells"][2:] and after["metadata"] == before["metadata"]
    tail = text[text.index('"x = ') - 200 :]  # the text after cell 1 is untouched
    assert new.endswith(tail)
    setup = after["cells"][1]
    assert setup["metadata"]["cellView"] == "form"
    assert setup["metadata"]["jupyter"] == {"source_hidden": True}
    assert setup["metadata"]["tags"] == [colab.SETUP_TAG]
    assert setup["id"] == before["cells"][1]["id"]
    old_rest = before["cells"][0]["source"].split("\n")[3:]
    assert after["cells"][0]["source"].split("\n")[3:] == old_rest


def test_a_notebook_without_a_setup_cell_gets_one_as_cell_1(tmp_path):
    make_course(tmp_path, names=("01_a.ipynb",))
    path = tmp_path / "notebooks" / "01_a.ipynb"
    notebook = nbformat.read(path, as_version=4)
    del notebook.cells[1]
    notebook.cells[0].source = "# 09 x\n\n" + colab.UNPUBLISHED_BADGE_LINE + "\n\nText."
    nbformat.write(notebook, path)
    colab.retarget_course(tmp_path, None)
    _title, setup, other = cells(tmp_path, "01_a.ipynb")
    assert setup.source == colab.setup_cell_source("", "main", SCRIPT_SHA)
    assert other.source.startswith("x = ")
    nbformat.validate(nbformat.read(path, as_version=4))  # ids and all


@pytest.mark.parametrize("title", ["# x\nno badge line\n\nText", "# x\n\n", "Text only"])
def test_a_title_cell_without_its_badge_line_is_refused_before_any_change(tmp_path, title):
    make_course(tmp_path)
    path = tmp_path / "notebooks" / "02_b.ipynb"
    notebook = nbformat.read(path, as_version=4)
    notebook.cells[0].source = title
    nbformat.write(notebook, path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=r"02_b\.ipynb: cell 0"):
        colab.retarget_course(tmp_path, None)
    assert before == {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}


def test_the_badge_line_may_come_first_and_is_moved_under_the_title(tmp_path):
    make_course(tmp_path, names=("01_a.ipynb",))
    path = tmp_path / "notebooks" / "01_a.ipynb"
    notebook = nbformat.read(path, as_version=4)
    notebook.cells[0].source = f"{badge_markdown('notebooks/01_a.ipynb')}\n\n# 01 a\n\nText."
    nbformat.write(notebook, path)
    colab.retarget_course(tmp_path, None)
    lines = cells(tmp_path, "01_a.ipynb")[0].source.splitlines()
    assert lines == ["# 01 a", "", colab.UNPUBLISHED_BADGE_LINE, "", "Text."]


def test_running_twice_changes_nothing_the_second_time(tmp_path):
    make_course(tmp_path)
    colab.retarget_course(tmp_path, "teacher/gpu-class", "main")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert colab.retarget_course(tmp_path, "teacher/gpu-class", "main").files == []
    assert before == {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    colab.retarget_course(tmp_path, None)
    unconfigured = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    colab.retarget_course(tmp_path, "teacher/gpu-class", "main")
    colab.retarget_course(tmp_path, None)  # there and back: byte for byte
    assert unconfigured == {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}


def test_a_renamed_notebook_gets_a_badge_for_its_own_path(tmp_path):
    make_course(tmp_path, names=("01_a.ipynb",))
    (tmp_path / "notebooks" / "01_a.ipynb").rename(tmp_path / "notebooks" / "01_new.ipynb")
    colab.retarget_course(tmp_path, "me/course", "main")
    text = (tmp_path / "notebooks" / "01_new.ipynb").read_text()
    assert "github/me/course/blob/main/notebooks/01_new.ipynb" in text


@pytest.mark.parametrize(
    ("repo", "ref"),
    [
        ("no-slash", "main"),
        ("a/b/c", "main"),
        ("a b/c", "main"),
        ("me/x", "-rf"),
        ("me/x", "a..b"),
        ("me/x", "bad ref"),
        ('me/x"; rm', "main"),
        ("me/x", ""),
        ("", "v1"),
    ],
)
def test_invalid_repo_or_ref_is_refused_before_any_change(tmp_path, repo, ref):
    make_course(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ValueError):
        colab.retarget_course(tmp_path, repo, ref)
    assert before == {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}


def test_a_setup_cell_needs_a_real_hash_and_a_ref():
    with pytest.raises(ValueError, match="SHA-256"):
        colab.setup_cell_source("me/x", "main", "abc")
    with pytest.raises(ValueError, match="--ref"):
        colab.setup_cell_source("me/x", "", SCRIPT_SHA)
    with pytest.raises(ValueError, match="--ref"):
        colab.setup_cell_source("", "", SCRIPT_SHA)


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
    assert "setup cells install from teacher/fork@v2;" in out
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
    [
        ["--repo", "teacher/fork"],
        ["--ref", COMMIT],
        ["--no-repo", "--ref", "v1"],
        ["--branch", "x"],
        ["--repo", "bad", "--ref", "v1"],
    ],
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
        capture_output=True,
        text=True,
        check=True,
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
