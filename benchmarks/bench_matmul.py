"""NumPy vs torch (CPU, and GPU when present): float32 square matmul time and GFLOP/s.

The numbers behind notebook 01's "Is PyTorch NumPy on the GPU?". Also measures why
compare_matmul pauses between libraries: timed right after NumPy, a small torch matmul
can wait for cores that NumPy's BLAS threads still spin on. Writes matmul.json.
"""

from __future__ import annotations

from common import parse_out, write_figures

from course_utils.device import cuda_gpu_count
from course_utils.env import measured_on
from course_utils.timing import compare_matmul

SIZES = [256, 512, 1024, 2048]
TRIALS = 6  # the contention is intermittent: repeat it


def main() -> None:
    out = parse_out(__doc__ or "")
    devices = ["cpu"] + (["cuda"] if cuda_gpu_count() else [])
    rows = compare_matmul(SIZES, devices, warmup=2, repeats=7)
    for row in rows:
        print(
            f"{row['library']:>5} {row['device']:>6} n={row['n']:>5}: "
            f"{row['median_ms']:9.3f} ms  {row['gflops']:8.1f} GFLOP/s"
        )
    contention = {
        f"torch_256_after_numpy_ms_settle_{settle}_trials": [
            compare_matmul([256], ["cpu"], warmup=2, repeats=7, settle_s=settle)[1]["median_ms"]
            for _ in range(TRIALS)
        ]
        for settle in (0.0, 0.2)
    }
    print(contention)
    labels = {device: measured_on(device) for device in devices}
    write_figures(out, "matmul", {"labels": labels, "rows": rows, "contention": contention})


if __name__ == "__main__":
    main()
