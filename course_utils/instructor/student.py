"""Student versions of the course's notebooks (``python -m course_utils student``).

Made with nbgrader's own preprocessors, as an nbgrader set-up would release them: each
``### BEGIN SOLUTION`` region becomes ``raise NotImplementedError()``, hidden check regions
go, outputs are cleared; everything else, nbgrader metadata included, is kept. Exercise
cells are tagged ``raises-exception`` so that "Run all", nbclient and nbval go on past an
unanswered exercise; the grader ignores tags and scores every check cell itself.
"""

from __future__ import annotations

import copy
import json
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat

#: The tag that lets a cell fail without stopping "Run all", nbclient or nbval.
RAISES_TAG = "raises-exception"


class InputError(ValueError):
    """A file or folder the user named cannot be used (the CLI exits 2 with one line)."""


def read_notebook(path: Path) -> Any:
    """Read a notebook (converted to nbformat 4), or raise :class:`InputError` with one
    line that says what is wrong: no such file, broken JSON, JSON that is no notebook."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except RecursionError:
        raise InputError(f"{path} is not a notebook: its JSON is nested too deep") from None
    except FileNotFoundError:
        raise InputError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a folder, not a notebook") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{path} is not a notebook: broken JSON ({error})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path} cannot be read: {error}") from None
    if not isinstance(data, dict):
        kind = type(data).__name__.replace("NoneType", "null")
        raise InputError(f"{path} is not a notebook: its JSON is a {kind}, not an object")
    cells = data.get("cells", data.get("worksheets"))
    if not isinstance(cells, list):
        raise InputError(f"{path} is not a notebook: it has no list of cells")
    logger = logging.getLogger("NotebookApp")  # nbformat logs validation errors there
    level = logger.level
    try:
        logger.setLevel(logging.CRITICAL)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            notebook = nbformat.reads(text, as_version=4)
    except Exception as error:  # nbformat raises many kinds on malformed notebooks
        message = " ".join(str(error).split())[:200]
        raise InputError(f"{path} is not a readable notebook: {message}") from None
    finally:
        logger.setLevel(level)
    for number, cell in enumerate(notebook.cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            raise InputError(f"{path} is not a notebook: cell {number} is not a cell")
        if not isinstance(cell.get("source"), str):
            raise InputError(f"{path} is not a notebook: cell {number} has no source")
        metadata = cell.get("metadata", {})
        if not isinstance(metadata, dict) or not isinstance(metadata.get("nbgrader", {}), dict):
            raise InputError(f"{path} is not a notebook: cell {number}'s metadata is not an object")
    return notebook


def nbgrader_role(cell: Any) -> str | None:
    """``"solution"``, ``"check"`` or ``None`` for a cell, from its nbgrader metadata."""
    meta = cell.get("metadata", {})
    meta = meta.get("nbgrader", {}) if isinstance(meta, dict) else {}
    if not isinstance(meta, dict):
        return None
    return "solution" if meta.get("solution") else "check" if meta.get("grade") else None


def student_version(notebook: Any) -> Any:
    """A student copy of an instructor notebook. ``ValueError``: a cell with solution or
    hidden-check markers but no nbgrader metadata (nbgrader would refuse it too)."""
    # lazy: optional (classroom extra); grading imports this module without it
    from nbgrader.preprocessors import ClearHiddenTests, ClearOutput, ClearSolutions

    student = copy.deepcopy(notebook)
    resources: dict[str, Any] = {}
    try:
        for preprocessor in (ClearSolutions(), ClearHiddenTests(), ClearOutput()):
            student, resources = preprocessor.preprocess(student, resources)
    except RuntimeError as error:  # nbgrader's complaint about missing metadata
        raise ValueError(f"cannot make a student version: {error}") from error
    for cell in student.cells:
        if cell.cell_type == "code" and nbgrader_role(cell) is not None:
            tags = cell.metadata.setdefault("tags", [])
            if RAISES_TAG not in tags:
                tags.append(RAISES_TAG)
    return student


def executed_student_version(notebook: Any) -> Any:
    """An executed notebook without its answers, for the course website: solutions and
    hidden checks go as in :func:`student_version`, and the exercise and check cells lose
    their outputs (what the answer printed, "all checks passed"); every other cell keeps
    what it showed when it ran."""
    # lazy: optional (classroom extra)
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    student = copy.deepcopy(notebook)
    resources: dict[str, Any] = {}
    try:
        for preprocessor in (ClearSolutions(), ClearHiddenTests()):
            student, resources = preprocessor.preprocess(student, resources)
    except RuntimeError as error:
        raise ValueError(f"cannot make a student version: {error}") from error
    for cell in student.cells:
        if cell.cell_type == "code" and nbgrader_role(cell) is not None:
            cell.outputs, cell.execution_count = [], None
    return student


def write_notebook(notebook: Any, path: Path) -> None:
    """Write a notebook the way the course stores them (sorted keys, one-space indent)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")


def make_student_versions(
    paths: Sequence[Path], out_dir: Path, *, keep: bool = False
) -> list[Path]:
    """Write the student version of every notebook named or found in ``paths`` into
    ``out_dir``; return the written files. ``keep``: leave a notebook already there as it
    is (a learner's work, ``make lab``)."""
    written = []
    for path in find_notebooks(paths):
        target = out_dir / path.name
        if keep and target.exists():
            continue
        notebook = read_notebook(path)
        if target.resolve() == path.resolve():
            raise ValueError(f"the student version would overwrite the instructor's {path}")
        write_notebook(student_version(notebook), target)
        written.append(target)
    return written


def find_notebooks(paths: Sequence[Path]) -> list[Path]:
    """Notebooks named directly or found (not recursively) in the given folders, sorted;
    ``FileNotFoundError`` when there is none."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.glob("*.ipynb") if p.is_file())
        elif path.suffix == ".ipynb" and path.is_file():
            found.append(path)
        else:
            why = "" if path.exists() else " (no such file or folder)"
            raise FileNotFoundError(f"not a notebook or a folder of notebooks: {path}{why}")
    if not found:
        raise FileNotFoundError("no notebooks found in " + ", ".join(map(str, paths)))
    return found
