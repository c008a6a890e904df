"""The course's own tooling, which no notebook imports: running the notebooks and their report
(``make course``), the website and publishing, the translations, and the GPU record.
``python -m course_utils <command>`` (:mod:`course_utils.tooling.cli`) runs each."""
