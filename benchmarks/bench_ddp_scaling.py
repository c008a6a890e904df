"""DDP scaling: global training throughput on 1..N processes and the scaling efficiency.

With 2+ GPUs: one process per GPU (nccl), N = 1..number of GPUs. Without: CPU processes
(gloo, one thread each), N = 1..number of cores (at least 2), labelled as such. On a
2-core machine shared with other work, expect the CPU numbers to be noisy; rerun alone.
Each count is its own torchrun job (course_utils.distributed.measure_scaling).
Writes ddp_scaling.json.
"""

from __future__ import annotations

import os

from common import parse_out, write_figures

from course_utils.device import cuda_gpu_count
from course_utils.distributed import RunConfig, measure_scaling
from course_utils.env import measured_on


def main() -> None:
    out = parse_out(__doc__ or "")
    gpus = cuda_gpu_count()
    if gpus >= 2:
        counts = list(range(1, gpus + 1))
        config = RunConfig(model="small_cnn", steps=30, warmup_steps=5, batch_size=256,
                           dataset_size=256 * gpus * 30)  # fmt: skip
        label = f"{measured_on('cuda:0')}, one process per GPU, nccl"
    else:
        counts = list(range(1, max(2, os.cpu_count() or 1) + 1))
        config = RunConfig(model="small_cnn", steps=10, warmup_steps=2, batch_size=32,
                           dataset_size=32 * counts[-1] * 12)  # fmt: skip
        label = f"{measured_on('cpu')}, CPU processes (gloo, 1 thread each)"
    rows = measure_scaling(counts, config, device="cuda" if gpus >= 2 else "cpu")
    for row in rows:
        print(
            f"{row['processes']} process(es): {row['samples_per_s']:9.1f} samples/s, "
            f"efficiency {row['efficiency']:.0%}"
        )
    write_figures(
        out,
        "ddp_scaling",
        {"label": label, "per_process_batch": config.batch_size, "model": config.model,
         "rows": rows},
    )  # fmt: skip


if __name__ == "__main__":
    main()
