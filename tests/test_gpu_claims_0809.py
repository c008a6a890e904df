"""Notebooks 08 and 09 on a GPU nobody here has: their GPU cells run on a CPU with the
GPU's figures faked. A speed or memory figure that misses is a GPU claim (said and
recorded in a learner's run, strict in tests and the GPU lane); a correctness check
(the same update from two optimizers) stays strict everywhere."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from notebook_cells import code_cells

from course_utils import claims
from course_utils.claims import ClaimNotHeld, gpu_claim
from course_utils.workload import not_at_this_size

ROOT = Path(__file__).resolve().parent.parent
NB08 = ROOT / "notebooks" / "08_capstone.ipynb"
NB09 = ROOT / "notebooks" / "09_transformers_on_the_gpu.ipynb"
LABEL = "measured on this machine (GPU: Tesla T4, faked)"


def _run(source: str, names: dict) -> dict:
    exec(source, names)
    return names


def _loop_run(rate: float, steps_rate: float, data_wait: float = 0.1):
    return SimpleNamespace(
        rate=lambda: rate,
        steps_rate=lambda: steps_rate,
        profile=SimpleNamespace(data_wait_fraction=data_wait),
    )


def _capstone_table(gains_after_row_1):
    """Rows as nb08-13 builds them: a baseline, decoding once, then rows of given gains."""
    runs = [("baseline", _loop_run(10, 10, 0.9)), ("once", _loop_run(30, 30, 0.5))]
    for number, gain in enumerate(gains_after_row_1, start=2):
        runs.append(
            (f"row {number}", _loop_run(runs[-1][1].rate() * gain, runs[-1][1].steps_rate() * gain))
        )
    return runs, [1.0, 3.0, *gains_after_row_1]


@pytest.fixture
def on_a_t4(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    return {
        "torch": torch,
        "device": torch.device("cuda", 0),
        "gpu_claim": gpu_claim,
        "measured_on": lambda device: LABEL,
        "GPU_SIZES": True,
        "not_at_this_size": not_at_this_size,
    }


def test_08_row_6_that_cannot_win_is_said_not_raised_for_a_learner(monkeypatch, capsys, on_a_t4):
    # 08-N1: on a GPU "no .item()" gained nothing while other syncs remained; the notebook
    # stopped there. Now it says so and goes on; strict runs (tests, GPU lane) still fail.
    runs, gains = _capstone_table([2.0, 1.2, 1.0, 1.02, 0.95, 1.5])  # row 6: 0.95x
    monkeypatch.setenv(claims.MODE_VAR, "report")
    names = _run(code_cells(NB08)["nb08-14"], {**on_a_t4, "runs": runs, "gains": gains})
    said = capsys.readouterr().out
    assert "This GPU claim did not hold here: row 6, no .item() per step" in said
    assert "Claim held: row 7, mixed precision" in said and names["speedup"] > 1
    monkeypatch.setenv(claims.MODE_VAR, "strict")
    with pytest.raises(ClaimNotHeld, match="row 6"):
        _run(code_cells(NB08)["nb08-14"], {**on_a_t4, "runs": runs, "gains": gains})


def test_08_a_broken_decoding_fix_still_stops_every_run(monkeypatch, on_a_t4):
    runs, gains = _capstone_table([2.0, 1.2, 1.0, 1.02, 1.1, 1.5])
    gains[1] = 0.8  # decoding once lost end to end: the lesson is wrong, not the GPU
    monkeypatch.setenv(claims.MODE_VAR, "report")
    with pytest.raises(AssertionError, match="decoding once"):
        _run(code_cells(NB08)["nb08-14"], {**on_a_t4, "runs": runs, "gains": gains})


def test_08_rows_are_ordered_so_that_item_is_the_last_wait():
    source = code_cells(NB08)["nb08-13"]
    order = [
        source.index(knob)
        for knob in (
            "empty_cache_every_step=False",
            "pin_memory=True",
            "item_every_step=False",
            'precision="auto"',
        )
    ]
    assert order == sorted(order), "remove empty_cache() and pageable copies before .item()"


class _Noisy(torch.nn.Module):
    """A GPU's non-deterministic backward, in miniature: the gradients of a second copy
    of the model differ at the noise floor (1e-9), also where the first copy's are 0."""

    def __init__(self, model, noisy):
        super().__init__()
        self.model, self.noisy = model, noisy
        self.checkpointing = False
        if noisy:
            for p in model.parameters():
                p.register_hook(lambda grad: grad + 1e-9 * torch.randn_like(grad))

    def forward(self, x):
        return self.model(x)


def _nb09_fused_cell(monkeypatch, rows, device="cpu", work="full"):
    made = []

    def fresh_model():
        torch.manual_seed(0)
        inner = torch.nn.Sequential(torch.nn.Embedding(13, 8), torch.nn.Linear(8, 13))
        model = _Noisy(inner, noisy=bool(made))
        made.append(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    x = torch.randint(0, 5, (4, 6))  # tokens 5-12 never occur: their gradients are 0
    names = {
        "torch": torch,
        "F": F,
        "fresh_model": fresh_model,
        "x": x,
        "y": x.roll(1, 1),
        "LR": 1e-3,
        "rows": rows,
        "device": torch.device(device),
        "gpu_claim": gpu_claim,
        "workload": lambda: work,
        "measured_on": lambda device: LABEL,
        "GPU_SIZES": work == "full",
        "not_at_this_size": not_at_this_size,
    }
    _run(code_cells(NB09)["nb09-37"], names)
    return _run(code_cells(NB09)["nb09-37a"], names)


def _row(name, seconds, memory_bytes):
    return SimpleNamespace(name=name, seconds=seconds, memory_bytes=memory_bytes)


def test_09_fused_and_foreach_adamw_are_compared_on_the_same_gradients(monkeypatch):
    # gpu-paths N3: two models' gradients that differ in the last bits move Adam's first
    # step by up to 2*lr; the optimizers must be compared on the same gradient tensors
    rows = [
        _row("fp32", 1.0, 100),
        _row("fp16", 0.5, 60),
        _row("fused", 0.9, 100),
        _row("checkpoint", 1.2, 40),
    ]
    _nb09_fused_cell(monkeypatch, rows)  # passes: same gradients, the same update


def test_09_precision_speed_is_a_claim_on_a_gpu(monkeypatch, capsys):
    # 09-N9: the autocast step's time is now checked on a GPU, as a claim
    rows = [
        _row("fp32", 1.0, 100),
        _row("fp16 autocast", 0.95, 60),
        _row("fused", 0.9, 100),
        _row("checkpoint", 1.2, 40),
    ]
    monkeypatch.setenv(claims.MODE_VAR, "report")
    _nb09_fused_cell(monkeypatch, rows, device="cuda")
    said = capsys.readouterr().out
    assert "did not hold here: fp16 autocast: time / fp32's" in said
    assert "Claim held: checkpoint: memory / fp32's" in said
    monkeypatch.setenv(claims.MODE_VAR, "strict")
    with pytest.raises(ClaimNotHeld, match="time / fp32"):
        _nb09_fused_cell(monkeypatch, rows, device="cuda")


def test_09_the_launch_overhead_fit_says_a_busy_machine_instead_of_an_impossible_share(capsys):
    # 09-N1: a two-point fit of noisy minimums printed "fixed cost 121 % of the step" and
    # failed its assert in 2 of 6 runs under load; on a CPU it is now printed, never asserted
    source = code_cells(NB09)["nb09-30"]
    assert "assert" not in source
    noisy = {1: 3.67e-3, 2: 21.5e-3, 4: 13.7e-3, 8: 14.7e-3}  # the review's loaded run

    def time_in_turns(steps, **options):
        return {b: SimpleNamespace(min_s=noisy[b]) for b in steps}

    names = {
        "torch": torch,
        "fresh_model": lambda: (None, None),
        "get_batch": lambda b, g: (torch.zeros(b, 4), torch.zeros(b, 4)),
        "generator": None,
        "LAUNCH_BATCHES": [1, 2, 4, 8],
        "LAUNCH_TOKENS": 4,
        "REPEATS": 1,
        "device": torch.device("cpu"),
        "train_step": None,
        "time_in_turns": time_in_turns,
        "format_seconds": lambda s: f"{s * 1e3:.2f} ms",
        "gpu_claim": gpu_claim,
        "measured_on": lambda device: "CPU",
    }
    names = _run(source, names)
    assert not 0 <= names["share"] <= 1
    assert "the machine was busy; run the cell again" in capsys.readouterr().out
