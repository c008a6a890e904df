"""Project hygiene: pins agree, torch is not pinned by the package, notebooks are clean."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import tomllib
import yaml

from course_utils.tooling import colab

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def lock_pins() -> list[str]:
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_lock_pins_every_package_exactly():
    for pin in lock_pins():
        assert re.match(r"^[A-Za-z0-9_.\-\[\]]+==[^=\s;]+( ; .+)?$", pin), pin
    names = {pin.split("==")[0].lower() for pin in lock_pins()}
    assert "pynvml" not in names  # the deprecated wrapper; nvidia-ml-py is the binding


def test_environment_yml_installs_the_same_pins():
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    dependencies = environment["dependencies"]
    pip_section = next(item["pip"] for item in dependencies if isinstance(item, dict))
    assert "-e ." in pip_section
    assert sorted(p for p in pip_section if p != "-e .") == sorted(lock_pins())


def test_package_does_not_pin_torch_hard():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies = {re.split(r"[<>=!~ ;\[]", dep)[0]: dep for dep in project["dependencies"]}
    assert "pynvml" not in dependencies
    for name in ("torch", "torchvision"):
        assert "==" not in dependencies[name] and "<" not in dependencies[name]


def test_the_course_has_notebooks():
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean(path):
    notebook = json.loads(path.read_text())
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"cell {index} has outputs: clear them"
            assert cell.get("execution_count") is None, f"cell {index} has an execution count"
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    # what the kernel reports on start: kept, so that JupyterLab opens the notebook
    # unmodified (it changes the metadata, and marks the notebook unsaved, only when it differs)
    assert notebook["metadata"]["language_info"]["name"] == "python"
    assert {"version", "mimetype", "codemirror_mode"} <= set(notebook["metadata"]["language_info"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_opens_with_the_badge_line_and_the_canonical_setup_cell(path, tmp_path):
    """Cell 0's third line and cell 1 are exactly what `python -m course_utils badges`
    writes (the committed form: no repository), with colab_setup.sh's SHA-256."""
    (tmp_path / "notebooks").mkdir()
    shutil.copy(path, tmp_path / "notebooks" / path.name)
    shutil.copy(ROOT / "colab_setup.sh", tmp_path / "colab_setup.sh")
    changes = colab.retarget_course(tmp_path, None)
    assert changes.files == [], (
        f"{path.name}'s badge line or setup cell is not the canonical one: "
        "run python -m course_utils badges"
    )
    cells = json.loads(path.read_text())["cells"]
    assert "".join(cells[0]["source"]).splitlines()[2] == colab.UNPUBLISHED_BADGE_LINE
    source = "".join(cells[1]["source"])
    assert source == colab.setup_cell_source("", colab.DEFAULT_REF, colab.script_sha256(ROOT))


def test_the_committed_readme_has_no_dead_colab_link():
    readme = (ROOT / "README.md").read_text()
    assert readme.splitlines()[2] == colab.README_BADGE_LINE
    assert "https://colab.research.google.com/github/" not in readme  # no link to a notebook


def test_readme_documents_the_two_commands_and_the_workload_variable():
    readme = (ROOT / "README.md").read_text()
    for needed in ("make course", "make test", "COURSE_WORKLOAD", "colab.research.google.com"):
        assert needed in readme, needed


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
