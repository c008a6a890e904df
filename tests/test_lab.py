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


def test_make_lab_reads_the_course_config_that_turns_nbgrader_off():
    recipe = re.search(r"^lab:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert 'JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter-config' in recipe and "jupyter lab" in recipe
    page = json.loads((CONFIG / "labconfig" / "page_config.json").read_text())
    assert page["disabledExtensions"] == {nbgrader_labextension(): True}


@pytest.mark.slow
def test_jupyterlab_lists_nbgrader_disabled_with_the_course_config(tmp_path):
    import nbgrader

    name = nbgrader_labextension()
    # nbgrader's lab extension where JupyterLab looks for extensions
    target = tmp_path / "share" / "labextensions" / name
    target.parent.mkdir(parents=True)
    target.symlink_to(Path(nbgrader.__file__).parent / "labextension")
    env = {**os.environ, "JUPYTER_PATH": str(tmp_path / "share"), "HOME": str(tmp_path),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "user-config"), "NO_COLOR": "1"}
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
