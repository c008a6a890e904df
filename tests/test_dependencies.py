"""`pip install course-utils` brings every module a notebook imports; the `dev` extra
brings what the tests import. Checked against the installed packages' metadata."""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Imports that need a package their parent module's distribution does not require.
SUBMODULE_NEEDS = {"torch.utils.tensorboard": "tensorboard"}
# IPython magics that load a package.
MAGIC_NEEDS = {r"%load_ext\s+tensorboard": "tensorboard"}
# Modules every Jupyter kernel has (the kernel itself brings them).
KERNEL = {"IPython", "ipykernel"}
# Modules that exist only on Colab; the notebooks import them only there.
COLAB_ONLY = {"google.colab"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ ;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` pull in, following installed metadata."""
    seen: set[str] = set()
    todo = [_name(r) for r in requirements]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(_name(requirement.name))
    return seen


def imports_of(source: str) -> set[str]:
    """Modules imported by Python source (IPython ``!`` and ``%`` lines dropped)."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("!", "%"))]
    found: set[str] = set()
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def needed_distributions(modules: set[str], sources: str) -> dict[str, str]:
    """``{module: distribution}`` for the non-standard-library modules (and magics)."""
    providers = md.packages_distributions()
    needed = {}
    for module in modules:
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top in KERNEL or top == "course_utils":
            continue
        if module in COLAB_ONLY:
            continue
        for prefix, distribution in SUBMODULE_NEEDS.items():
            if module == prefix or module.startswith(prefix + "."):
                needed[module] = distribution
        needed.setdefault(module, (providers.get(top) or [top])[0].lower().replace("_", "-"))
    for pattern, distribution in MAGIC_NEEDS.items():
        if re.search(pattern, sources):
            needed[pattern] = distribution
    return needed


def notebook_cells() -> list[str]:
    cells = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        notebook = json.loads(path.read_text())
        cells += ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    return cells


def test_the_notebooks_need_nothing_undeclared():
    cells = notebook_cells()
    modules = set().union(*(imports_of(cell) for cell in cells))
    sources = "\n".join(cells)
    provided = closure(PROJECT["dependencies"])
    missing = {m: d for m, d in needed_distributions(modules, sources).items() if d not in provided}
    assert not missing, f"add to pyproject dependencies (or guard the import): {missing}"


@pytest.mark.slow
def test_the_tests_need_nothing_outside_the_dev_extra():
    sources = "\n".join(p.read_text() for p in sorted((ROOT / "tests").glob("*.py")))
    local = {p.stem for p in (ROOT / "tests").glob("*.py")}  # the tests' own modules
    modules = imports_of(sources) - local
    extras = PROJECT["optional-dependencies"]
    provided = closure(PROJECT["dependencies"] + extras["dev"])
    missing = {m: d for m, d in needed_distributions(modules, "").items() if d not in provided}
    assert not missing, f"add to the dev extra: {missing}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from torch.utils.tensorboard import SummaryWriter", {"tensorboard"}),
        ("%load_ext tensorboard\nimport json", {"tensorboard"}),
        ("import yaml", {"pyyaml"}),
    ],
)
def test_the_check_sees_what_a_cell_needs(source, expected):
    found = set(needed_distributions(imports_of(source), source).values())
    assert expected <= found
