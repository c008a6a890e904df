"""``python -m course_utils``: see :mod:`course_utils.cli`."""

import sys

from course_utils.cli import main

sys.exit(main())
