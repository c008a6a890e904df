"""Reading notebooks without jsonschema's slow IRI checker (course_utils.instructor.fast_import)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import sys
import course_utils.instructor.gradebook
import nbformat
assert "rfc3987_syntax" not in sys.modules, "the slow module was imported"
notebook = nbformat.v4.new_notebook()
nbformat.validate(notebook)  # a valid notebook still validates
notebook["cells"] = [{"cell_type": "code"}]  # no source, no outputs: invalid
try:
    nbformat.validate(notebook)
except nbformat.ValidationError:
    print("invalid refused")
import rfc3987_syntax  # hidden only while jsonschema's checkers were imported
print(rfc3987_syntax.is_valid_syntax("iri", "https://example.org/a"))
"""


@pytest.mark.slow
def test_the_grader_reads_notebooks_without_the_iri_checker_and_still_validates():
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["invalid", "refused", "True"]


def test_nothing_is_hidden_when_jsonschema_was_imported_first(monkeypatch):
    from course_utils.instructor.fast_import import skip_iri_format_check

    monkeypatch.setitem(sys.modules, "jsonschema._format", object())
    monkeypatch.delitem(sys.modules, "rfc3987_syntax", raising=False)
    skip_iri_format_check()
    assert "rfc3987_syntax" not in sys.modules
