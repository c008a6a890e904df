"""DDP with torchrun on 2 CPU processes (gloo): end to end, equivalence, failures, pickling.

Each torchrun launch costs several seconds on 2 cores, so one launch serves several
assertions where it can.
"""

from __future__ import annotations

import multiprocessing
import pickle
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from course_utils import distributed
from course_utils.data import SyntheticImages
from course_utils.distributed import (
    RunConfig,
    SplitModel,
    data_parallel_report,
    free_port,
    launch,
    max_parameter_difference,
    reference_model,
    split_batch_gradient_difference,
    split_model,
    torchrun_command,
    train_command,
)
from course_utils.models import build_model

SAFETY_NET_S = 120  # subprocess timeout: a hang fails the test instead of the suite


def test_two_node_agents_rendezvous_train_and_match_one_process(tmp_path):
    """Multi-node as 2 torchrun agents (one process each) on one machine, c10d rendezvous:
    rank 0 alone logs and saves, and the result equals one process on the 2x batch."""
    config = RunConfig(steps=4, batch_size=8, dataset_size=32, out=str(tmp_path))  # 2 epochs
    endpoint = f"localhost:{free_port()}"
    agents = [
        subprocess.Popen(
            torchrun_command(train_command(config, "cpu"), 1, nnodes=2, rdzv_endpoint=endpoint),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [agent.communicate(timeout=SAFETY_NET_S)[0] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs
    logs = "\n".join(outputs)
    assert logs.count("[rank 0] step") == 4 and "[rank 1]" not in logs  # rank 0 logs, once
    assert "2 process(es), backend gloo" in logs
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint.pt", "summary.json"]
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert not any(key.startswith("module.") for key in state)  # saved unwrapped
    difference = max_parameter_difference(state, reference_model(config, world_size=2))
    assert difference < 1e-5
    # and the check can fail: fewer steps in the reference give different parameters
    fewer = RunConfig(**{**config.__dict__, "steps": 3})
    assert max_parameter_difference(state, reference_model(fewer, world_size=2)) > 1e-4


def test_ddp_check_cli_runs_torchrun_and_prints_the_difference_last():
    done = subprocess.run(
        [sys.executable, "-m", "course_utils", "ddp-check", "--nproc", "2", "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=SAFETY_NET_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("largest parameter difference: ")
    assert float(last.split(": ")[1]) < 1e-5


@pytest.mark.parametrize(("mode", "timeout_s"), [("raise", 60), ("hang", 2)])
def test_a_failed_rank_stops_the_job_without_hanging(mode, timeout_s):
    """A rank that raises: torchrun stops the others. A rank that hangs: the others' collective
    times out after timeout_s, they exit, torchrun stops the hung one."""
    config = RunConfig(steps=4, fail_rank=1, fail_step=2, fail_mode=mode, timeout_s=timeout_s)
    start = time.perf_counter()
    done = launch(torchrun_command(train_command(config, "cpu"), 2), SAFETY_NET_S)
    took = time.perf_counter() - start
    assert done.returncode != 0
    assert f"rank 1 {'fails' if mode == 'raise' else 'hangs'} on purpose" in done.stdout
    if mode == "hang":
        assert "Timed out" in done.stdout or "timed out" in done.stdout.lower()
    assert took < SAFETY_NET_S / 2
    assert "[rank 0] 2 process(es)" not in done.stdout  # nobody finished training


def _sample_sum(dataset: SyntheticImages, index: int) -> float:
    return float(dataset[index][0].sum())


def test_dataset_and_config_are_picklable_under_spawn():
    data = SyntheticImages(size=16, seed=3)
    config = RunConfig(model="small_cnn", out="somewhere")
    assert pickle.loads(pickle.dumps(config)) == config
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        remote = pool.apply(_sample_sum, (data, 5))
    assert remote == pytest.approx(_sample_sum(data, 5))


def test_batchnorm_makes_the_split_batch_differ_and_groupnorm_does_not():
    """Why the equivalence check uses GroupNorm: BatchNorm normalizes each half-batch with
    its own statistics, so two half-batches do not give the full batch's gradient."""
    inputs, targets = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    for norm, should_match in (("group", True), ("batch", False)):
        torch.manual_seed(0)
        model = build_model("small_cnn", norm=norm, width=8)
        worst = split_batch_gradient_difference(model, inputs, targets, parts=2)
        assert (worst < 1e-5) is should_match, (norm, worst)


def test_run_config_round_trips_through_the_worker_command_line():
    config = RunConfig(model="small_cnn", steps=3, lr=0.1, fail_rank=1, out="x")
    args = train_command(config, "cpu")
    assert args[:3] == ["-m", "course_utils.distributed", "train"]
    parsed = vars(distributed._parser().parse_args(args[2:]))
    assert parsed.pop("command") == "train" and parsed.pop("device") == "cpu"
    assert RunConfig(**parsed) == config


def test_split_model_hands_activations_over_and_matches_the_whole_model():
    torch.manual_seed(0)
    model = build_model("small_cnn", norm="group", width=8)
    inputs = torch.randn(4, 3, 32, 32)
    expected = model(inputs)
    split = split_model(model, ("cpu", "cpu"))
    assert torch.allclose(split(inputs), expected)
    assert split.handoffs == []  # same device: nothing moves
    split.devices[1] = torch.device("meta")  # a second "device" that has no data
    split.stages[1].to("meta")
    output = split(inputs)
    assert output.device.type == "meta" and output.shape == expected.shape
    (source, target, shape, nbytes) = split.handoffs[0]
    assert (source, target) == ("cpu", "meta") and shape[0] == 4
    assert nbytes == torch.Size(shape).numel() * 4
    with pytest.raises(ValueError):
        SplitModel([nn.Identity()], ["cpu", "cpu"])


def test_data_parallel_on_cpu_runs_the_module_unchanged():
    report = data_parallel_report(build_model("mlp"))
    if report["gpus"] >= 2:
        pytest.skip("GPUs present: covered by the multigpu test")
    assert len(report["device_ids"]) == report["gpus"] and report["runs_module_unchanged"] is True
    if report["gpus"] == 0:
        assert report["device_ids"] == [] and "no GPU" in report["explanation"]
    assert "scatter" in report["explanation"] and "gather" in report["explanation"]


@pytest.mark.multigpu
def test_data_parallel_measures_every_gpu():
    report = data_parallel_report(build_model("small_cnn"), batch_size=128)
    peaks = report["measured"]["data_parallel"]["peak_mib_per_gpu"]
    assert len(peaks) == report["gpus"] >= 2 and all(peak > 0 for peak in peaks)
    assert peaks[0] >= max(peaks[1:])  # GPU 0 carries the gather and the loss


@pytest.mark.multigpu
def test_ddp_on_two_gpus_uses_nccl(tmp_path):
    config = RunConfig(model="small_cnn", steps=3, out=str(tmp_path))
    done = launch(torchrun_command(train_command(config, "auto"), 2), SAFETY_NET_S)
    assert done.returncode == 0, done.stdout
    assert "backend nccl" in done.stdout



def test_ddp_check_rejects_bad_input_with_one_error_line(capsys):
    from course_utils.cli import main

    assert main(["ddp-check", "--nproc", "0"]) == 2  # bad input
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1
    with pytest.raises(SystemExit) as exit_info:
        main(["ddp-check", "--nproc", "two"])
    assert exit_info.value.code == 2


def test_failure_summary_finds_the_cause_in_torchrun_output():
    output = "[rank1]: RuntimeError: rank 1 fails\nE1129 failed (exitcode: 1)\nChildFailedError: \n"
    assert distributed.failure_summary(output) == "[rank1]: RuntimeError: rank 1 fails"
