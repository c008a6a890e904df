"""``python -m course_utils``: see :mod:`course_utils.tooling.cli`."""

import sys

from course_utils.tooling.cli import main

sys.exit(main())
