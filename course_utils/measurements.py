"""A measured number in a notebook: shown with the hardware it was measured on, and marked
so that ``make course`` collects it into the course report (:mod:`course_utils.tooling.report`).

:func:`record_measurement` shows a measured number in the notebook and also carries it in the
cell output under its own MIME type (:data:`MEASUREMENT_MIME`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from IPython import get_ipython
from IPython.display import display

MEASUREMENT_MIME = "application/vnd.course-utils.measurement+json"


@dataclass(frozen=True)
class Measurement:
    """One measured number with its unit and the hardware it was measured on."""

    name: str
    value: float | int | str
    unit: str
    label: str  # e.g. "measured on this machine (CPU)"

    def __str__(self) -> str:
        return f"{self.without_label()} [{self.label}]"

    def without_label(self) -> str:
        """``name: value unit``, for a list that states the label once."""
        value = self.value
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.name}: {shown}{unit}"


def record_measurement(name: str, value: float | int | str, unit: str = "", *, label: str) -> None:
    """Show a measured number in the notebook and mark it for the course report (outside
    IPython: print it). ``label``: where it was measured (:func:`course_utils.env.measured_on`).
    Returns None, so that a cell ending with this call shows the line once (no echo of a
    ``Measurement(...)``); :func:`measurements_in_notebook` reads them back."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"measurement {name!r} is not a finite number: {value}")
    measurement = Measurement(name, value, unit, label)
    if get_ipython() is not None:
        bundle = {"text/plain": str(measurement), MEASUREMENT_MIME: measurement.__dict__}
        display(bundle, raw=True)
    else:
        print(measurement)


def output_data(notebook: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The ``data`` of each output of an executed notebook (a parsed ``.ipynb``), in order."""
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) or []:
            if isinstance(output, dict):
                yield output.get("data", {})
