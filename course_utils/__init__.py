"""course_utils: the companion package of the course "Make PyTorch use the GPU".

One module per concept, so a learner finds the code of a lesson in one place:

* :mod:`course_utils.env`: where am I running, versions, the doctor report.
* :mod:`course_utils.device`: pick a device, a GPU and a precision; move batches.
* :mod:`course_utils.nvml`: what the NVIDIA driver reports (the only NVML user).
* :mod:`course_utils.timing`: timing GPU work correctly.
* :mod:`course_utils.workload`: experiment sizes (``COURSE_WORKLOAD``).
* :mod:`course_utils.report`: figures notebooks measure, and the course report.
* :mod:`course_utils.colab`: Colab badges and setup cells.
* :mod:`course_utils.runner`: run all notebooks headlessly (``make course``).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("course-utils")
except PackageNotFoundError:  # running from a checkout that was not installed
    __version__ = "0+unknown"
