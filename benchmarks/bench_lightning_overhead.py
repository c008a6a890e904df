"""Plain PyTorch loop vs Lightning: time per epoch and peak memory, from one run.

Both train the same small CNN (GroupNorm) from the same weights on the same
SyntheticImages loader with the same optimizer and precision
(course_utils.lightning.compare_with_plain_loop). Overhead is reported as a ratio and as
seconds per epoch; Lightning's own parity test allows 0.05 s per epoch for its small RNN case
only (ParityModuleRNN; its MNIST case allows 0.3 s), and 0.1% peak memory
(tests/parity_pytorch/test_basic_parity.py in Lightning-AI/pytorch-lightning). On the CPU peak
memory is the process's RSS above the start (approximate); on a GPU, the allocator peak.
It runs ROUNDS rounds, the two ways taking turns (plain, Lightning, Lightning, plain, ...;
compare_with_plain_loop's rounds=), and sums each way up by its fastest epoch (warm-up
epochs left out), the least disturbed figure on a shared machine; "noise" is how far the
median epoch was above the fastest (over 25 %: the machine was busy, run it again).
Writes lightning_overhead.json.
"""

from __future__ import annotations

import torch
from common import parse_out, write_figures
from torch.utils.data import DataLoader

from course_utils.data import SyntheticImages
from course_utils.device import cuda_gpu_count, pick_device
from course_utils.env import measured_on
from course_utils.lightning import compare_with_plain_loop
from course_utils.models import build_model
from course_utils.training import TrainConfig

PARITY_ALLOWANCE_S = 0.05  # Lightning's parity test, its small RNN case only


ROUNDS = 3  # the two ways take turns: each ratio compares runs adjacent in time


def main() -> None:
    out = parse_out(__doc__ or "")
    device = pick_device()
    gpu = cuda_gpu_count() > 0
    samples, batch, epochs = (8192, 256, 6) if gpu else (1024, 64, 3)
    loader = DataLoader(SyntheticImages(size=samples, seed=0), batch_size=batch, shuffle=False)
    result = compare_with_plain_loop(
        lambda: build_model("small_cnn", norm="group"),
        loader,
        epochs=epochs,
        config=TrainConfig(precision="auto"),
        device=device,
        rounds=ROUNDS,
    )
    print(result)
    ratio = result.overhead_ratio
    extra_s = result.overhead_s_per_epoch
    print(
        f"fastest epochs over {ROUNDS} rounds: Lightning / plain {ratio:.3f}x, "
        f"{extra_s:+.3f} s per epoch (parity allowance {PARITY_ALLOWANCE_S} s/epoch)"
        + ("; the machine was busy: run it again" if result.busy else "")
    )
    write_figures(
        out,
        "lightning_overhead",
        {
            "label": measured_on(device),
            "samples": samples,
            "batch_size": batch,
            "epochs": epochs,
            "rounds": ROUNDS,
            "torch_threads": torch.get_num_threads(),
            "precision": result.precision,
            "order": result.order,
            "overhead_ratio_fastest_epochs": ratio,
            "overhead_s_per_epoch_fastest_epochs": extra_s,
            "overhead_s_per_step_fastest_epochs": result.overhead_s_per_step,
            "noise_median_over_fastest": result.noise,
            "busy": result.busy,
            "parity_allowance_s_per_epoch": PARITY_ALLOWANCE_S,
            "plain_runs_epoch_s": result.plain_runs,
            "lightning_runs_epoch_s": result.lightning_runs,
            "plain_total_s_median": result.plain_total_s,
            "lightning_total_s_median": result.lightning_total_s,
            "plain_peak_mib": result.plain_peak.peak_mib if result.plain_peak else None,
            "lightning_peak_mib": result.lightning_peak.peak_mib if result.lightning_peak else None,
            "peak_method": result.plain_peak.method if result.plain_peak else None,
        },
    )


if __name__ == "__main__":
    main()
