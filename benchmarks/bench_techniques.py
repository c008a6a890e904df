"""Notebook 04's technique table at realistic sizes: ResNet-18 against MobileNetV3-small.

Every row of :func:`course_utils.techniques.standard_techniques`: peak memory of a step,
the largest batch that fits (on a CPU: under a budget of the baseline's static memory
plus 128 samples of its activations; on a GPU: the real memory, capped), throughput,
FLOPs per sample and MFU. Run it on an otherwise idle machine. Writes techniques.json.
"""

from __future__ import annotations

import dataclasses

import torch
from common import parse_out, write_figures

from course_utils.device import pick_device
from course_utils.env import measured_on
from course_utils.footprint import memory_breakdown
from course_utils.models import build_model
from course_utils.techniques import (
    compare_techniques,
    format_table,
    random_batch,
    standard_techniques,
)
from course_utils.training import TrainStep

MODEL, SMALLER = "resnet18", "mobilenet_v3_small"
BUDGET_SAMPLES = 128


def main() -> None:
    out = parse_out(__doc__ or "")
    device = pick_device()
    on_gpu = device.type == "cuda"
    batch, image_size, high = (256, 128, 8192) if on_gpu else (32, 32, 1024)
    techniques = standard_techniques(device, SMALLER)
    budget = None
    if not on_gpu:
        step = TrainStep(build_model(MODEL), device, techniques[0].config)
        base = memory_breakdown(step, random_batch(batch, device, image_size), estimate=False)
        budget = int(base.static + BUDGET_SAMPLES * base.activations / batch)
    torch.manual_seed(0)
    results = compare_techniques(
        techniques,
        device,
        model=MODEL,
        batch_size=batch,
        image_size=image_size,
        budget_bytes=budget,
        high=high,
        repeats=10,
    )
    print(format_table(results))
    write_figures(
        out,
        "techniques",
        {
            "label": measured_on(device),
            "model": MODEL,
            "batch_size": batch,
            "image_size": image_size,
            "cpu_budget_bytes": budget,
            "rows": [dataclasses.asdict(r) for r in results],
        },
    )


if __name__ == "__main__":
    main()
