"""The 2026-12-06 teaching review of notebooks 01-04: each claim measures what it names.
The GPU is faked as the real one behaves (a loader-bound training run, cuDNN's plan cache
keyed per shape without the benchmark flag), so each check runs on a CPU."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from notebook_cells import code_cells

from course_utils.flops import PeakFlops
from course_utils.models import build_model
from course_utils.training import TrainStep

ROOT = Path(__file__).resolve().parent.parent
NB02 = next((ROOT / "notebooks").glob("02_*.ipynb"))
NB03 = next((ROOT / "notebooks").glob("03_*.ipynb"))
NB04 = next((ROOT / "notebooks").glob("04_*.ipynb"))


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
        device=torch.device("cpu"),
        HAS_GPU=True,
        loader=[batch],
        large={"mfu": 0.5},
        step=TrainStep(build_model("small_cnn", width=8), "cpu"),
        gpu_claim=claims,
        result=SimpleNamespace(seconds=10 * loader_bound_s, steps=10),
        device_peak_flops=lambda *args, **kwargs: peak,
    )
    for cell_id in ("nb02-22a", "nb02-22"):
        if cell_id in cells:
            exec(cells[cell_id], namespace)
    (claimed,) = claims.values.values()
    step_s_claimed = namespace["flops_per_step"] / (claimed * 0.5 * peak.flops_per_s)
    assert step_s_claimed < loader_bound_s / 10, "the claim timed the input pipeline"


class CachedPlans:
    """A training trial whose convolutions run the way PyTorch's cuDNN path does
    (``run_single_conv`` in ``aten/src/ATen/native/cudnn/Conv_v8.cpp``): one plan per
    shape, looked up before anything else and chosen at the shape's first call, by
    autotuning if ``torch.backends.cudnn.benchmark`` is set then, else by heuristics. The
    cache key (``ConvolutionParams``) has no benchmark flag. ``calls`` logs ``(batch size,
    flag at the call, plan run)``."""

    def __init__(self, sizes_run_before: list[int]) -> None:
        self.plans = dict.fromkeys(sizes_run_before, "heuristics")
        self.calls: list[tuple[int, bool, str]] = []

    def __call__(self, size: int) -> None:
        flag = torch.backends.cudnn.benchmark
        plan = self.plans.setdefault(size, "autotuned" if flag else "heuristics")
        self.calls.append((size, flag, plan))


def test_03_cudnn_benchmark_is_compared_on_shapes_nothing_ran_before(monkeypatch):
    # review 03-M1: the sweep had cached heuristics plans for batch 256, so the benchmark
    # arm at 256 ran them too, and "no gain" was measured whatever autotuning would do.
    from course_utils import timing

    cells = code_cells(NB03)
    namespace: dict = {}
    exec(cells["nb03-04"], namespace)
    exec(cells["nb03-04b"], namespace)
    t4 = SimpleNamespace(total_memory=15 * 2**30)  # the sweep's sizes follow the GPU's memory
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: t4)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    for workload in ("small", "full"):
        monkeypatch.setenv("COURSE_WORKLOAD", workload)
        namespace["device"] = torch.device("cuda")
        exec(cells["nb03-07"], namespace)
        trial = CachedPlans(namespace["SWEEP_SIZES"])  # the sweep ran first, flag off
        namespace.update(
            trial=trial,
            label="a fake T4",
            time_in_turns=lambda functions, **kwargs: timing.time_in_turns(
                functions, **{**kwargs, "device": "cpu"}
            ),
        )
        exec(cells["nb03-tuning"], namespace)
        assert {flag for _, flag, _ in trial.calls} == {False, True}, "both settings ran"
        for size, flag, plan in trial.calls:
            assert plan == ("autotuned" if flag else "heuristics"), (
                f"batch {size} with cudnn.benchmark={flag} ran a {plan} plan cached before"
            )
        assert torch.backends.cudnn.benchmark is False, "the default is restored"


def test_03_lightnings_edge_above_the_courses_is_a_claim_not_a_stop():
    # review 03-W3: Lightning's binsearch returns int(0.95 x its own edge); its edge may sit
    # 8% above the course's (the cell itself lets the edge move by 10%): 102 > 100 stopped
    # Run All on a GPU through a bare assert.
    cells = code_cells(NB03)
    namespace: dict = {}
    exec(cells["nb03-04"], namespace)
    claims = Claims()
    found = {"ours": 100, "power": 64, "binsearch": int(0.95 * 108)}
    namespace.update(
        {name: SimpleNamespace(batch_size=size) for name, size in found.items()},
        device=torch.device("cuda"),
        label="a fake T4",
        FINDER_CAP_MIB=2048,
        gpu_claim=claims,
        runs_out=lambda size: size > found["ours"],  # the course's edge holds again
    )
    exec(cells["nb03-29b"], namespace)
    assert claims.values["Lightning's answer / the course's"] == 1.02


class ProxyTorch:
    """``torch`` as a notebook cell sees it on a fake Ampere GPU: tensors and modules stay
    on the CPU (``device=`` and ``.to`` are dropped), everything else is torch's."""

    def __getattr__(self, name: str) -> object:
        if name == "randn":
            return lambda *shape, device=None, **kwargs: torch.randn(*shape, **kwargs)
        return getattr(torch, name)


class ProxyNn:
    def __getattr__(self, name: str) -> object:
        if name == "Conv2d":

            def conv(*args: object, **kwargs: object) -> object:
                module = torch.nn.Conv2d(*args, **kwargs)
                module.to = lambda *args, **kwargs: module  # type: ignore[method-assign]
                return module

            return conv
        return getattr(torch.nn, name)


def test_04_a_conv_whose_tf32_setting_changes_nothing_is_reported_not_a_stop(monkeypatch):
    # review 04-W2: "fp32_precision = 'tf32'" allows TF32 engines; cuDNN may pick one
    # without tensor cores for a shape, and the outputs are then equal. Here (a CPU conv
    # standing for such an engine) they are: Run All must go on and report it.
    cells = code_cells(NB04)
    claims = Claims()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    namespace: dict = {}
    exec(cells["nb04-03b"], namespace)
    namespace.update(
        torch=ProxyTorch(),
        nn=ProxyNn(),
        device=SimpleNamespace(type="cuda"),
        gpu_claim=claims,
        base=SimpleNamespace(mfu=0.3, peak_source="a fake A100's TF32 column"),
        measured_on=lambda device: "a fake A100",
    )
    exec(cells["nb04-59"], namespace)
    assert claims.values["TF32 / IEEE convolution: largest difference"] == 0.0


def _pipeline_table(shares_fraction: float, row5_cpu_s: float) -> dict:
    """nb03-25's namespace on a CPU: the baseline decodes PNGs (starved 95 %); row 5
    augments "on the device", which on a CPU is this CPU, inside the compute phase."""
    from course_utils.timing import CpuShare

    def row(samples_per_s: float, starved: float, cpu_s: float) -> SimpleNamespace:
        return SimpleNamespace(
            samples_per_s=samples_per_s, starved_fraction=starved, cpu_per_step_s=cpu_s
        )

    names = [
        "0 baseline: decode+augment per sample, 0 workers",
        "1 workers alone: num_workers=2",
        "5 + augmentation on the device, 0 workers",
    ]
    results = dict(
        zip(
            names,
            [row(100, 0.95, 0.050), row(90, 0.5, 0.010), row(120, 0.14, row5_cpu_s)],
            strict=True,
        )
    )
    shares = {name: CpuShare(wall_s=1.0, cpu_s=shares_fraction) for name in names}
    return {
        "results": results,
        "shares": shares,
        "baseline": results[names[0]],
        "device": torch.device("cpu"),
        "label": "CPU",
    }


def test_03_on_a_cpu_the_pipeline_check_weighs_cpu_seconds_not_the_starved_share():
    # review 03-W1: on a CPU "augmentation on the device" moves the work into "compute", so
    # the starved share fell by bookkeeping and its assert could not fail.
    namespace = _pipeline_table(shares_fraction=1.0, row5_cpu_s=0.080)  # row 5 costs more
    with pytest.raises(AssertionError, match="row 5 should cost less"):
        exec(code_cells(NB03)["nb03-25"], namespace)


def test_03_the_pipeline_table_says_when_the_machine_was_too_busy_to_rank(capsys):
    # review 03-W2: the rows are measured one after another; on a busy CPU they rank load.
    namespace = _pipeline_table(shares_fraction=0.3, row5_cpu_s=0.020)
    exec(code_cells(NB03)["nb03-25"], namespace)
    assert "The machine was busy" in capsys.readouterr().out


def test_04_the_technique_table_says_when_the_machine_was_too_busy_to_rank(capsys):
    # review 04-W1: on a busy CPU the table ranked load ("plain SGD 3.0 samples/s" against
    # "momentum 43.3"). A process that waits for a core runs a fraction of the wall time,
    # as this fake table does (it sleeps: wall time without CPU time).
    import time

    cells = code_cells(NB04)
    namespace: dict = {}
    exec(cells["nb04-03"], namespace)
    exec(cells["nb04-03b"], namespace)

    def waited_for_a_core(*args: object, **kwargs: object) -> list:
        time.sleep(0.3)
        return []

    namespace.update(
        device=torch.device("cpu"),
        SMALLER="small_cnn",
        SMALLER_KWARGS={"width": 8},
        MODEL="small_cnn",
        MODEL_KWARGS={},
        BATCH=4,
        IMAGE_SIZE=16,
        budget=1,
        HIGH=8,
        REPEATS=1,
        GPU_CAP_MIB=0,
        compare_techniques=waited_for_a_core,
        format_table=lambda results: "(the table)",
    )
    exec(cells["nb04-17"], namespace)
    assert "The machine was busy" in capsys.readouterr().out


def test_03_the_new_gpu_claims_run_on_a_gpu_branch(monkeypatch):
    # the checks that were bare asserts (review X-W1) now report on a GPU: each runs there
    cells = code_cells(NB03)
    namespace: dict = {}
    exec(cells["nb03-04"], namespace)
    exec(cells["nb03-04b"], namespace)
    monkeypatch.setenv("COURSE_WORKLOAD", "full")
    rows = [
        SimpleNamespace(
            batch_size=size,
            peak_bytes=2**20 * (40 + size // 2),
            samples_per_s=1000 * size / (8 + size),
            cpu_samples_per_s=0.0,
        )
        for size in (8, 64, 512, 4096)
    ]
    sweep = SimpleNamespace(knee=lambda: rows[1], best=rows[-1], fitted=rows)
    claims = Claims()
    namespace.update(
        device=torch.device("cuda"),
        label="a fake T4",
        sweep=sweep,
        model_name="resnet18",
        gpu_claim=claims,
    )
    exec(cells["nb03-10"], namespace)
    exec(cells["nb03-10b"], namespace)
    table = _pipeline_table(shares_fraction=1.0, row5_cpu_s=0.020)
    namespace.update(table, device=torch.device("cuda"))
    exec(cells["nb03-25"], namespace)
    assert claims.values["peak memory, batch 4096 / batch 8"] > 2
    assert {
        "throughput gain, batch 8 -> 64",
        "augmentation on the device / baseline samples/s",
        "augmentation on the device / baseline starved share",
    } <= set(claims.values)
