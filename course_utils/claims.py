"""GPU claims: a lesson's conclusion about a GPU's speed or memory, checked where it runs.

No GPU has run most of this course's claims on every kind of GPU a learner meets. So a
claim about a GPU's speed or memory is checked with :func:`gpu_claim`, never with a bare
``assert``:

- in a learner's run (the default, ``COURSE_CLAIMS=report``) a claim that does not hold
  is said in plain words (the measured figure, the figure the lesson expected and why,
  what may differ on this machine, that it is worth reporting), recorded in the run's
  report, and the notebook goes on;
- in ``make test``, ``make gpu-lane`` and the GPU record (``COURSE_CLAIMS=strict``) a
  claim that does not hold raises :class:`ClaimNotHeld`, so the run fails.

Correctness checks (equal outputs, fork safety, an OOM that must be caught) are not
claims: they stay plain ``assert`` statements, strict everywhere.

Every verdict, held or not, is carried in the cell's output under its own MIME type, so
the course report and the GPU record collect them (:func:`claims_in_notebook`).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

from course_utils.language import Messages

CLAIM_MIME = "application/vnd.course-utils.claim+json"
MODE_VAR = "COURSE_CLAIMS"
MODES = ("report", "strict")
REPORT_URL = "the course's issue tracker"


#: What a claim's verdict says to a learner.
MESSAGES_CLAIMS = Messages(
    "claims",
    {
        "held": "Claim held: {name}: measured {figure}, expected {expected}{unit}.",
        "not held": "This GPU claim did not hold here: {name}.\n"
        "  measured: {figure} ({label})\n"
        "  expected: {expected}{unit}, because {why}\n"
        "  what may differ here: the GPU model, its clocks and power limit, other work on "
        "the GPU, the driver and PyTorch versions, or a shared (MIG or virtual) GPU.\n"
        "  The notebook goes on. This is worth reporting ({where}), with the figures above: "
        "no GPU of this kind may have checked the claim before.",
    },
)


class ClaimNotHeld(AssertionError):
    """A GPU claim did not hold in a strict run (``COURSE_CLAIMS=strict``)."""


@dataclass(frozen=True)
class ClaimVerdict:
    """One GPU claim's verdict: held or not, with the measured and expected figures."""

    name: str
    held: bool
    measured: float
    expected: str  # the lesson's bound, e.g. ">= 1.5"
    unit: str
    why: str  # why the lesson expects it (with its source)
    label: str  # where it was measured (course_utils.env.measured_on)

    def sentence(self) -> str:
        """The verdict in plain words, for a learner."""
        unit = f" {self.unit}" if self.unit else ""
        figure = f"{self.measured:.4g}{unit}"
        fields = {"name": self.name, "figure": figure, "expected": self.expected, "unit": unit}
        if self.held:
            return MESSAGES_CLAIMS["held"].format(**fields)
        return MESSAGES_CLAIMS["not held"].format(
            **fields, label=self.label, why=self.why, where=REPORT_URL
        )


def claims_mode() -> str:
    """``report`` (a learner's run: say and go on) or ``strict`` (tests, GPU lane, record)."""
    mode = os.environ.get(MODE_VAR, "").strip().lower() or "report"
    if mode not in MODES:
        raise ValueError(f"{MODE_VAR}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def gpu_claim(
    name: str,
    measured: float,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
    unit: str = "",
    why: str,
    label: str,
) -> bool:
    """Check a GPU speed or memory claim: ``at_least <= measured <= at_most``.

    Prints the verdict, records it for the report, and returns whether it held; in a
    strict run a claim that did not hold raises :class:`ClaimNotHeld` instead.

    >>> gpu_claim("AMP / fp32", 2.1, at_least=1.5, unit="x", why="tensor cores",
    ...           label="measured on this machine (GPU: T4)")
    Claim held: AMP / fp32: measured 2.1 x, expected >= 1.5 x.
    True
    """
    if at_least is None and at_most is None:
        raise ValueError("gpu_claim needs at_least, at_most or both")
    value = float(measured)
    if not math.isfinite(value):
        raise ValueError(f"claim {name!r}: the measured figure is not finite: {measured}")
    bounds = []
    if at_least is not None:
        bounds.append(f">= {at_least:g}")
    if at_most is not None:
        bounds.append(f"<= {at_most:g}")
    held = (at_least is None or value >= at_least) and (at_most is None or value <= at_most)
    verdict = ClaimVerdict(name, held, value, " and ".join(bounds), unit, why, label)
    _show(verdict)
    if not held and claims_mode() == "strict":
        raise ClaimNotHeld(verdict.sentence())
    return held


def _show(verdict: ClaimVerdict) -> None:
    try:  # lazy: a Python without Jupyter (a GPU node, the GPU record's checks) prints
        from IPython import get_ipython  # lazy: as above
        from IPython.display import display  # lazy: as above
    except ImportError:
        print(verdict.sentence())
        return
    if get_ipython() is not None:
        bundle = {"text/plain": verdict.sentence(), CLAIM_MIME: asdict(verdict)}
        display(bundle, raw=True)
    else:
        print(verdict.sentence())


def claims_in_notebook(notebook: dict[str, Any]) -> list[ClaimVerdict]:
    """The GPU claims' verdicts recorded in an executed notebook, in order."""
    from course_utils.measurements import output_data  # lazy: it imports IPython

    found = []
    for data in output_data(notebook):
        with contextlib.suppress(KeyError, TypeError):  # none, or malformed
            found.append(ClaimVerdict(**data[CLAIM_MIME]))
    return found
