"""make lab: JupyterLab as a learner gets it, without nbgrader's instructor tools (its
menu, "Validate" button and "Create Assignment" panel), which the lock installs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "jupyter-config"


def nbgrader_labextension() -> str:
    nbgrader = pytest.importorskip("nbgrader")
    return nbgrader._jupyter_labextension_paths()[0]["dest"]


def _lab_commands(*args: str) -> list[str]:
    """What ``make lab`` (or another target) runs, without running it (``make -n``)."""
    done = subprocess.run(["make", "-n", *args, f"PY={sys.executable}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return [line for line in done.stdout.splitlines() if "course_utils" in line or "lab " in line]


def test_make_lab_reads_the_course_config_that_turns_nbgrader_off():
    lab = next(line for line in _lab_commands("lab") if "jupyter lab" in line)
    assert f'JUPYTER_CONFIG_PATH="{ROOT}/jupyter-config' in lab
    page = json.loads((CONFIG / "labconfig" / "page_config.json").read_text())
    assert page["disabledExtensions"] == {nbgrader_labextension(): True}


@pytest.mark.slow
def test_make_lab_opens_the_student_versions_and_keeps_a_learners_work(tmp_path):
    from course_utils.tooling.publish import answers_left

    folder = tmp_path / "mine"
    commands = _lab_commands("lab", f"LAB_DIR={folder}")
    lab = next(line for line in commands if "jupyter lab" in line)
    assert lab.split()[-1].rstrip("/") == str(folder)  # the folder JupyterLab opens
    for line in commands:
        if "jupyter lab" not in line:  # what make lab writes there first
            subprocess.run(line, shell=True, cwd=ROOT, check=True, timeout=300)
    written = sorted(path.name for path in folder.glob("*.ipynb"))
    assert written == sorted(path.name for path in (ROOT / "notebooks").glob("*.ipynb"))
    for path in folder.glob("*.ipynb"):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        assert answers_left(notebook) == [], path.name  # no solution, no hidden test
        assert "raise NotImplementedError" in path.read_text(encoding="utf-8")
    mine = folder / written[0]
    mine.write_text(mine.read_text(encoding="utf-8").replace("NotImplementedError", "MyWork"))
    for line in commands:  # make lab again: the learner's work stays
        if "jupyter lab" not in line:
            subprocess.run(line, shell=True, cwd=ROOT, check=True, timeout=300)
    assert "MyWork" in mine.read_text(encoding="utf-8")
    answers = next(line for line in _lab_commands("lab-answers") if "jupyter lab" in line)
    assert answers.split()[-1].rstrip("/") == "notebooks"  # the answers, one command away


def test_make_lab_turns_off_the_jupyter_news_toast():
    from jupyterlab_server.settings_utils import get_settings

    lab = next(line for line in _lab_commands("lab") if "jupyter lab" in line)
    settings_dir = re.search(r'--LabApp\.app_settings_dir="?([^" ]+)', lab).group(1)
    schemas = Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas"
    if not schemas.is_dir():
        pytest.skip(f"no JupyterLab schemas in {schemas}")
    found, _ = get_settings(settings_dir, str(schemas), str(schemas), overrides=None)
    plugin = next(s for s in found["settings"] if s["id"].endswith(":notification"))
    assert plugin["schema"]["properties"]["fetchNews"]["default"] == "false"


@pytest.mark.slow
def test_jupyterlab_lists_nbgrader_disabled_with_the_course_config(tmp_path):
    import nbgrader

    name = nbgrader_labextension()
    # nbgrader's lab extension where JupyterLab looks for extensions
    target = tmp_path / "share" / "labextensions" / name
    target.parent.mkdir(parents=True)
    target.symlink_to(Path(nbgrader.__file__).parent / "labextension")
    env = {
        **os.environ,
        "JUPYTER_PATH": str(tmp_path / "share"),
        "HOME": str(tmp_path),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "user-config"),
        "NO_COLOR": "1",
    }
    listing = [sys.executable, "-c", "from jupyterlab.labextensions import main; main()", "list"]

    def state(config_path: str | None) -> str:
        run_env = {k: v for k, v in env.items() if k != "JUPYTER_CONFIG_PATH"}
        if config_path:
            run_env["JUPYTER_CONFIG_PATH"] = config_path
        done = subprocess.run(listing, capture_output=True, text=True, env=run_env, timeout=120)
        line = next(x for x in (done.stdout + done.stderr).splitlines() if name + " v" in x)
        return "disabled" if "disabled" in line else "enabled"

    assert state(None) == "enabled"  # what a plain `jupyter lab` shows an instructor
    assert state(str(CONFIG)) == "disabled"  # make lab
