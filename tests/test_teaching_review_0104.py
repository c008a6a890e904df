"""The 2026-12-06 teaching review of notebooks 01-04: each claim measures what it names.
The GPU is faked as the real one behaves (a loader-bound training run, cuDNN's plan cache
keyed per shape without the benchmark flag), so each check runs on a CPU."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from notebook_cells import code_cells

from course_utils.flops import PeakFlops
from course_utils.models import build_model
from course_utils.training import TrainStep

ROOT = Path(__file__).resolve().parent.parent
NB02 = next((ROOT / "notebooks").glob("02_*.ipynb"))
NB03 = next((ROOT / "notebooks").glob("03_*.ipynb"))


class Claims:
    """Records ``gpu_claim`` calls instead of judging them: ``values[name] = value``."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def __call__(self, name: str, value: float, **kwargs: object) -> None:
        self.values[name] = value


def test_02_the_mfu_gap_is_measured_on_a_batch_already_on_the_gpu():
    # review 02-M1: the monitored run's step time included the 0-worker DataLoader that
    # builds each sample on the CPU; a loader-bound run made any MFU gap "hold".
    cells = code_cells(NB02)
    namespace: dict = {}
    exec(cells["nb02-03"], namespace)
    exec(cells["nb02-03b"], namespace)
    torch.manual_seed(0)
    batch = (torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    loader_bound_s = 1000.0  # per step: the run waited on its input pipeline
    claims, peak = Claims(), PeakFlops(1e12, "a fake GPU's datasheet")
    namespace.update(
        device=torch.device("cpu"), HAS_GPU=True, loader=[batch], large={"mfu": 0.5},
        step=TrainStep(build_model("small_cnn", width=8), "cpu"), gpu_claim=claims,
        result=SimpleNamespace(seconds=10 * loader_bound_s, steps=10),
        device_peak_flops=lambda *args, **kwargs: peak,
    )
    for cell_id in ("nb02-22a", "nb02-22"):
        if cell_id in cells:
            exec(cells[cell_id], namespace)
    (claimed,) = claims.values.values()
    step_s_claimed = namespace["flops_per_step"] / (claimed * 0.5 * peak.flops_per_s)
    assert step_s_claimed < loader_bound_s / 10, "the claim timed the input pipeline"
