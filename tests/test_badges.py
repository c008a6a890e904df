"""Rewriting Colab badges and setup cells for a fork (python -m course_utils badges)."""

from __future__ import annotations

import json
import shutil

import nbformat
import pytest

from course_utils import colab
from course_utils.cli import main

OLD_REPO, OLD_REF = colab.DEFAULT_REPO, colab.DEFAULT_REF


def make_course(root, names=("01_a.ipynb", "02_b.ipynb")):
    (root / "notebooks").mkdir(parents=True)
    for name in names:
        notebook = nbformat.v4.new_notebook()
        badge = colab.badge_markdown(OLD_REPO, OLD_REF, f"notebooks/{name}")
        setup = nbformat.v4.new_code_cell(colab.setup_cell_source(OLD_REPO, OLD_REF))
        setup.metadata["tags"] = [colab.SETUP_TAG]
        notebook.cells = [
            nbformat.v4.new_markdown_cell(f"# {name}\n{badge}\nSome text."),
            setup,
            nbformat.v4.new_code_cell("x = 'https://colab.research.google.com/ is text here'"),
        ]
        nbformat.write(notebook, root / "notebooks" / name)
    readme_badge = colab.badge_markdown(OLD_REPO, OLD_REF, "notebooks/01_a.ipynb")
    (root / "README.md").write_text(f"# Course\n{readme_badge}\n")
    (root / "colab_setup.sh").write_text(
        f'#!/usr/bin/env bash\nDEFAULT_REPO="{OLD_REPO}"\nDEFAULT_REF="{OLD_REF}"\n'
    )


def test_badges_and_setup_cells_point_at_the_fork(tmp_path):
    make_course(tmp_path)
    changes = colab.retarget_course(tmp_path, "teacher/gpu-class", "spring-2027")
    assert changes.badges == 3 and changes.setup_cells == 2
    assert sorted(changes.files) == [
        "README.md", "colab_setup.sh", "notebooks/01_a.ipynb", "notebooks/02_b.ipynb"
    ]
    for name in ("01_a.ipynb", "02_b.ipynb"):
        notebook = nbformat.read(tmp_path / "notebooks" / name, as_version=4)
        assert colab.badge_url("teacher/gpu-class", "spring-2027", f"notebooks/{name}") in (
            notebook.cells[0].source
        )
        assert OLD_REPO not in notebook.cells[0].source
        setup = notebook.cells[1].source
        assert setup == colab.setup_cell_source("teacher/gpu-class", "spring-2027")
        assert notebook.cells[2].source.startswith("x = 'https://colab")  # untouched
    assert "github/teacher/gpu-class/blob/spring-2027/notebooks/01_a.ipynb" in (
        (tmp_path / "README.md").read_text()
    )
    script = (tmp_path / "colab_setup.sh").read_text()
    assert 'DEFAULT_REPO="teacher/gpu-class"' in script and 'DEFAULT_REF="spring-2027"' in script


def test_running_twice_changes_nothing_the_second_time(tmp_path):
    make_course(tmp_path)
    colab.retarget_course(tmp_path, "teacher/gpu-class", "main")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert colab.retarget_course(tmp_path, "teacher/gpu-class", "main").files == []
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
     ("me/x", "a..b"), ("me/x", "bad ref"), ("me/x\"; rm", "main")],
)
def test_invalid_repo_or_ref_is_refused_before_any_change(tmp_path, repo, ref):
    make_course(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ValueError):
        colab.retarget_course(tmp_path, repo, ref)
    assert before == {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}


def test_cli_on_a_copy_of_this_course(tmp_path, root, capsys):
    for part in ("notebooks", "README.md", "colab_setup.sh"):
        source = root / part
        if source.is_dir():
            shutil.copytree(source, tmp_path / part)
        elif source.exists():
            shutil.copy(source, tmp_path / part)
    notebooks = sorted((tmp_path / "notebooks").glob("*.ipynb"))
    if not notebooks:
        pytest.skip("the course has no notebooks yet")
    assert main(["badges", "--repo", "teacher/fork", "--ref", "v2", "--root", str(tmp_path)]) == 0
    assert "now point at teacher/fork@v2" in capsys.readouterr().out
    for path in notebooks:
        notebook = json.loads(path.read_text())
        own = f"github/teacher/fork/blob/v2/notebooks/{path.name}"
        assert own in "".join(notebook["cells"][0]["source"]), path.name
        setup = [c for c in notebook["cells"] if colab.SETUP_TAG in c["metadata"].get("tags", [])]
        assert len(setup) == 1 and '"teacher/fork", "v2"' in "".join(setup[0]["source"])
