"""Plain PyTorch loop vs Lightning: time per epoch and peak memory, from one run.

Both train the same small CNN (GroupNorm) from the same weights on the same
SyntheticImages loader with the same optimizer and precision
(course_utils.lightning.compare_with_plain_loop). Overhead is reported as a ratio and as
seconds per epoch; Lightning's own parity test allows at most 0.05 s per epoch and 0.1%
peak memory (tests/parity_pytorch in pytorch-lightning; docs/facts.md). On the CPU peak
memory is the process's RSS above the start (approximate); on a GPU, the allocator peak.
It runs ROUNDS rounds (plain, then Lightning) and reports the median ratio, so that each
ratio compares runs adjacent in time. Timings on a shared machine are still noisy (busy
cores stall multi-threaded CPU kernels): run it alone; fastest_epoch_ratio (fastest epoch
vs fastest epoch) is the least disturbed figure.
Writes lightning_overhead.json.
"""

from __future__ import annotations

import statistics

import torch
from common import parse_out, write_figures
from torch.utils.data import DataLoader

from course_utils.data import SyntheticImages
from course_utils.device import cuda_gpu_count, pick_device
from course_utils.env import measured_on
from course_utils.lightning import compare_with_plain_loop
from course_utils.models import build_model
from course_utils.training import TrainConfig

PARITY_ALLOWANCE_S = 0.05  # Lightning's parity test (facts.md)


ROUNDS = 3  # plain then Lightning, repeated: each ratio compares runs adjacent in time


def main() -> None:
    out = parse_out(__doc__ or "")
    device = pick_device()
    gpu = cuda_gpu_count() > 0
    samples, batch, epochs = (8192, 256, 6) if gpu else (1024, 64, 3)
    loader = DataLoader(SyntheticImages(size=samples, seed=0), batch_size=batch, shuffle=False)
    results = []
    for _ in range(ROUNDS):
        result = compare_with_plain_loop(
            lambda: build_model("small_cnn", norm="group"),
            loader,
            epochs=epochs,
            config=TrainConfig(precision="auto"),
            device=device,
        )
        print(result)
        results.append(result)
    ratio = statistics.median(r.overhead_ratio for r in results)
    extra_s = statistics.median(r.overhead_s_per_epoch for r in results)
    fastest = min(min(r.lightning_epoch_s) for r in results) / min(
        min(r.plain_epoch_s) for r in results
    )
    print(
        f"median over {ROUNDS} rounds: Lightning / plain {ratio:.3f}x per epoch, "
        f"{extra_s:+.3f} s per epoch (parity allowance {PARITY_ALLOWANCE_S} s/epoch); "
        f"fastest epoch vs fastest epoch {fastest:.3f}x"
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
            "precision": results[0].precision,
            "overhead_ratio_median": ratio,
            "overhead_s_per_epoch_median": extra_s,
            "fastest_epoch_ratio": fastest,
            "parity_allowance_s_per_epoch": PARITY_ALLOWANCE_S,
            "rounds_detail": [
                {
                    "plain_epoch_s": r.plain_epoch_s,
                    "lightning_epoch_s": r.lightning_epoch_s,
                    "overhead_ratio": r.overhead_ratio,
                    "overhead_s_per_epoch": r.overhead_s_per_epoch,
                    "plain_total_s": r.plain_total_s,
                    "lightning_total_s": r.lightning_total_s,
                    "plain_peak_mib": r.plain_peak.peak_mib if r.plain_peak else None,
                    "lightning_peak_mib": r.lightning_peak.peak_mib if r.lightning_peak else None,
                    "peak_method": r.plain_peak.method if r.plain_peak else None,
                }
                for r in results
            ],
        },
    )


if __name__ == "__main__":
    main()
