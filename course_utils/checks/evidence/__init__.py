"""What runs with the learner's answer: each check's observing half, one module per
notebook. Every public function is :func:`course_utils.checks.boundary.observed`; it takes
the answer (and the notebook's objects it needs) and plain data, and returns plain data.
In the grader it runs in a process forked from the learner's runtime at the check's place
(no learner thread or timer survives the fork), with the runtime's guard verifying the
course's instruments first; its result is all that leaves that process."""
