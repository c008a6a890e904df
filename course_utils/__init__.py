"""course_utils: the companion package of the course "Make PyTorch use the GPU".

One module per concept, so a learner finds the code of a lesson in one place:

* :mod:`course_utils.env`: where am I running, versions, the doctor report.
* :mod:`course_utils.device`: pick a device, a GPU and a precision; move batches.
* :mod:`course_utils.nvml`: what the NVIDIA driver reports (the only NVML user).
* :mod:`course_utils.timing`: timing GPU work correctly.
* :mod:`course_utils.workload`: experiment sizes (``COURSE_WORKLOAD``).
* :mod:`course_utils.progress`: progress bars for long helpers (quiet under tests).
* :mod:`course_utils.report`: measurements and plots notebooks make, and the course report.
* :mod:`course_utils.colab`: Colab badges and setup cells (verified by SHA-256).
* :mod:`course_utils.runner`: run all notebooks headlessly (``make course``).
* :mod:`course_utils.smi`: run and parse ``nvidia-smi``, and explain its output.
* :mod:`course_utils.monitor`: a background sampler of GPU (or CPU) utilization.
* :mod:`course_utils.flops`: FLOPs, datasheet peaks, model FLOP utilization (MFU).
* :mod:`course_utils.data`: picklable datasets and DataLoader advice.
* :mod:`course_utils.profiling`: where a training step's time goes.
* :mod:`course_utils.batch`: batch-size sweeps and the largest batch that fits.
* :mod:`course_utils.models`: the course's models, with checkpointing.
* :mod:`course_utils.training`: the reference training step, every technique a toggle.
* :mod:`course_utils.memory`: GPU memory reports, freeing memory, OOM recovery.
* :mod:`course_utils.lightning`: the same training in PyTorch Lightning.
* :mod:`course_utils.distributed`: DDP with torchrun, and the equivalence check.
* :mod:`course_utils.classroom`: exercise checks, student versions, the grader.
* :mod:`course_utils.sandbox`: the bubblewrap sandbox that graded submissions run in.
* :mod:`course_utils.matching`: exercise cells found by content when metadata is lost.
* :mod:`course_utils.gradebook`: grade a class in parallel into a gradebook.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("course-utils")
except PackageNotFoundError:  # running from a checkout that was not installed
    __version__ = "0+unknown"

from course_utils.nvml import align_cuda_device_order

# CUDA numbers GPUs fastest-first, NVML in PCI order: make them agree before CUDA starts.
align_cuda_device_order()
