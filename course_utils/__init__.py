"""course_utils: the companion package of the course "Make PyTorch use the GPU".

One module per concept, named after it (``device``, ``timing``, ``memory``, ``grading``...),
so a learner finds the code of a lesson in one place; docs/development.md's "Layout" lists them.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("course-utils")
except PackageNotFoundError:  # running from a checkout that was not installed
    __version__ = "0+unknown"

from course_utils.nvml import align_cuda_device_order

# CUDA numbers GPUs fastest-first, NVML in PCI order: make them agree before CUDA starts.
align_cuda_device_order()
