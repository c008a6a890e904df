"""What an instructor runs: student versions, the grader and its sandbox and guard, a
class's gradebook and its exports (``python -m course_utils student``, ``grade``,
``grade-class``, ``grade-merge``). What a learner's notebook imports stays one level up
(``course_utils.classroom`` holds the checks an exercise calls)."""
