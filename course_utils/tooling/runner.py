"""Run the course's notebooks headlessly and write the report (``make course``).

Each notebook runs in a fresh kernel on whatever hardware is present; the executed copies
go to ``<out>/notebooks/`` with an HTML rendering beside each, and ``<out>/report.html``
(:mod:`course_utils.tooling.report`) sums them up. A failing notebook does not stop the others.
With ``reuse`` (``run-notebooks --reuse``, the website's workflow), a notebook whose
executed copy ran without error from the same inputs (the notebook's file, every file of
the package, the workload) is not run again: the copy records their SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO
from unittest import mock

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from course_utils import workload
from course_utils.instructor.student import find_notebooks
from course_utils.progress import ENV_VAR as PROGRESS_VAR
from course_utils.records import load_records
from course_utils.tooling.report import (
    NotebookResult,
    measurements_in_notebook,
    plots_in_notebook,
    write_report,
)


def run_notebook(
    path: Path,
    out_dir: Path,
    *,
    cell_timeout_s: int,
    progress: TextIO,
    deadline: float | None = None,
    kernel_name: str = "python3",
    render: bool = True,
) -> NotebookResult:
    """Execute one notebook in its own folder and save the executed copy in ``out_dir``.
    ``deadline`` (``time.monotonic()``): no cell runs past it (the notebook's time limit);
    ``kernel_name``: the Jupyter kernel to run it in; ``render``: write an HTML copy."""
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as failure:  # not JSON, not a notebook, an unknown format version
        reason = " ".join(str(failure).split())[:300] or type(failure).__name__
        why = f"not a valid notebook ({type(failure).__name__}: {reason})"
        return NotebookResult(str(path), "failed", 0.0, why, [])
    code_cells = sum(cell.cell_type == "code" for cell in notebook.cells)
    done, live = 0, progress.isatty()  # a live count on a terminal; quiet in logs

    def on_cell_executed(**_: Any) -> None:
        nonlocal done
        done += 1
        if live:
            progress.write(f"\r  {path.name}: cell {done}/{code_cells} ")
            progress.flush()

    def cell_timeout(_: Any) -> int:  # what is left of the notebook's time, at most
        if deadline is None:
            return cell_timeout_s
        return max(1, min(cell_timeout_s, math.ceil(deadline - time.monotonic())))

    client = NotebookClient(
        notebook,
        timeout=cell_timeout_s,
        timeout_func=cell_timeout,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(path.parent.resolve())}},
        on_cell_executed=on_cell_executed,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    start, error = time.perf_counter(), None
    try:
        # The kernel process's own messages (start-up warnings) go to a log file, not
        # the terminal; everything a cell prints is in the executed notebook.
        with (out_dir / f"{path.stem}.kernel.log").open("w") as log:
            client.execute(stdout=log, stderr=log)
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as failure:
        lines = [line for line in str(failure).strip().splitlines() if line.strip()]
        error = "\n".join(lines[-12:]) or type(failure).__name__
    except Exception as failure:  # kernel failed to start, and the like
        error = f"{type(failure).__name__}: {failure}"
    seconds = time.perf_counter() - start
    nbformat.write(notebook, out_dir / path.name)
    if live:
        progress.write("\r")
    rendering = None
    if render:
        rendering = render_html(notebook, out_dir / f"{path.stem}.html", out_dir.parent)
    measurements, plots = measurements_in_notebook(notebook), plots_in_notebook(notebook)
    status = "failed" if error else "ok"
    return NotebookResult(str(path), status, seconds, error, measurements, plots, rendering)


def render_html(notebook: Any, target: Path, relative_to: Path) -> str | None:
    """Write ``notebook`` as a web page (nbconvert's lab template, images embedded);
    return its path relative to ``relative_to``, or None if nbconvert failed."""
    try:
        from nbconvert import HTMLExporter  # lazy: optional (jupyterlab or the classroom extra)
    except ImportError:  # a bare runner (the GPU record needs no web pages)
        return None
    try:
        exporter = HTMLExporter(template_name="lab")  # no such template: no rendering
    except Exception:
        return None
    level = exporter.log.level
    exporter.log.setLevel(logging.ERROR)  # not "alternative text is missing" for every plot
    try:
        body, _ = exporter.from_notebook_node(notebook)
        target.write_text(body, encoding="utf-8")
    except Exception:  # a rendering problem must not hide the run's results
        return None
    finally:
        exporter.log.setLevel(level)
    return target.relative_to(relative_to).as_posix()


#: Where an executed copy records what it was run from (its notebook metadata).
RUN_METADATA = "course_run"
_PACKAGE = Path(__file__).resolve().parents[1]


def inputs_sha256(path: Path, size: str) -> str:
    """The SHA-256 of what an executed copy of ``path`` depends on: the notebook's file,
    every file of the ``course_utils`` package and the workload ``size``."""
    digest = hashlib.sha256(f"workload={size}\n".encode())
    digest.update(path.read_bytes())
    for file in sorted(_PACKAGE.rglob("*")):
        if file.is_file() and "__pycache__" not in file.parts:
            digest.update(file.relative_to(_PACKAGE).as_posix().encode() + b"\0")
            digest.update(file.read_bytes())
    return digest.hexdigest()


def _stamp(executed: Path, key: str, seconds: float) -> None:
    """Record in the executed copy that it ran without error from inputs ``key``."""
    data = json.loads(executed.read_text(encoding="utf-8"))
    data.setdefault("metadata", {})[RUN_METADATA] = {
        "inputs_sha256": key,
        "seconds": round(seconds, 1),
    }
    executed.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def reusable(path: Path, out_dir: Path, key: str) -> NotebookResult | None:
    """The result of the executed copy of ``path`` in ``out_dir`` if it ran without error
    from the inputs ``key`` (and its web page is there), else None."""
    executed, page = out_dir / path.name, out_dir / f"{path.stem}.html"
    try:
        data = json.loads(executed.read_text(encoding="utf-8"))
        stamp = data["metadata"][RUN_METADATA]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(stamp, dict) or stamp.get("inputs_sha256") != key or not page.is_file():
        return None
    rendering = page.relative_to(out_dir.parent).as_posix()
    measurements, plots = measurements_in_notebook(data), plots_in_notebook(data)
    seconds = float(stamp.get("seconds", 0.0))
    return NotebookResult(str(path), "ok", seconds, None, measurements, plots, rendering)


def run_course(
    paths: Sequence[Path],
    out_dir: Path,
    workload_name: str | None = None,
    cell_timeout_s: int = 1800,
    progress: TextIO = sys.stdout,
    reuse: bool = False,
) -> int:
    """Execute every notebook, write the report, and return how many notebooks failed.
    ``reuse``: keep the executed copies whose inputs did not change (see the module doc)."""
    from course_utils.env import doctor  # lazy: imports torch (student imports this module)

    notebooks = find_notebooks(paths)
    updates = {workload.ENV_VAR: workload_name} if workload_name else {}
    updates[PROGRESS_VAR] = os.environ.get(PROGRESS_VAR) or "line"  # no widgets in copies
    results = []
    with mock.patch.dict(os.environ, updates):
        size = workload.workload()
        progress.write(f"Running {len(notebooks)} notebook(s), workload '{size}'\n")
        for number, path in enumerate(notebooks, start=1):
            key = inputs_sha256(path, size) if reuse else ""
            kept = reusable(path, out_dir / "notebooks", key) if reuse else None
            if kept is not None:
                progress.write(
                    f"[{number}/{len(notebooks)}] {path.name}: reused (its inputs did not "
                    f"change since it ran without error in {kept.seconds:.1f} s)\n"
                )
                results.append(kept)
                continue
            progress.write(f"[{number}/{len(notebooks)}] {path.name} ...\n")
            progress.flush()
            result = run_notebook(
                path, out_dir / "notebooks", cell_timeout_s=cell_timeout_s, progress=progress
            )
            if reuse and result.status == "ok":
                _stamp(out_dir / "notebooks" / path.name, key, result.seconds)
            tail = f" -- {result.error.splitlines()[-1]}" if result.error else ""
            progress.write(
                f"[{number}/{len(notebooks)}] {path.name}: {result.status} in "
                f"{result.seconds:.1f} s, {len(result.measurements)} measurement(s){tail}\n"
            )
            results.append(result)
        environment = doctor()
        environment["workload"] = size
    report = write_report(results, environment, out_dir, load_records())
    failed = sum(result.status != "ok" for result in results)
    progress.write(f"Report: {report} ({failed} notebook(s) failed)\n")
    return failed
