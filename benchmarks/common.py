"""What every benchmark shares: the --out argument and writing figures as JSON."""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

from course_utils.env import doctor


def parse_out(description: str) -> Path:
    """Parse the command line (``--out DIR``) and return the output folder."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=Path("build/bench"), help="output folder")
    return parser.parse_args().out


def write_figures(out: Path, name: str, figures: dict[str, Any]) -> Path:
    """Write ``figures`` with the machine's description to ``out/name.json``."""
    report = doctor()
    machine = {key: report[key] for key in ("platform", "cpu_cores", "torch", "device", "gpus")}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    payload = {
        "benchmark": name,
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        **figures,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return path
