"""The exercise checks whose evidence needs the learner's own objects (spies on
``Tensor.to``, a fake clock, a fake NVML, a Trainer fitting the learner's class, ranks
started from the learner's function), split along the grader's boundary:

- :mod:`course_utils.checks.evidence` (``evidence/nbNN.py``): what runs *with* the answer,
  in the learner's sandboxed runtime. Each function there is :func:`~course_utils.checks.
  boundary.observed`: it calls the answer with the course's instruments around it and
  returns plain data only (numbers, strings, shapes, dtypes, call records, tensors).
- ``nbNN.py`` (one module per notebook): what *decides*, from that data. When a submission
  is graded it runs in the grader's checker, a separate process no learner code shares.

A notebook's check cell calls the deciding side; run in the learner's own notebook, both
halves run there (the evidence still crosses as plain data, so a check behaves the same in
the notebook and in the grader). docs/instructor-guide.md, "Threat model", draws the
boundary.
"""


def said_by_your_code(*texts: str) -> None:
    """Mark ``texts`` (what the learner's code said, carried in the evidence: an
    exception's message, a class name of the notebook's) as the learner's: in the grader's
    checker the verdict shows "(your code's message)" in their place, as it does for what
    the answer raised when the checker called it. In the learner's notebook nothing changes:
    the learner reads them in the feedback."""
    from course_utils.checks import boundary  # lazy: the boundary imports this package

    channel = boundary._CHANNEL[0]
    if channel is not None:
        channel.learner_texts.extend(text for text in texts if type(text) is str and text)
