"""What an instructor runs: student versions, the grader and its sandbox and guard, a
class's gradebook and its exports (``python -m course_utils student``, ``grade``,
``grade-class``, ``grade-merge``). What a learner's notebook imports stays one level up
(``course_utils.checks`` holds the checks an exercise calls)."""

from course_utils.instructor.fast_import import skip_iri_format_check

skip_iri_format_check()  # before any of this package imports nbformat: 2.3 s less
